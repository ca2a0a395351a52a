"""How each trained draft of the study is scored: simulated acceptance on held-out data, real chain acceptance."""

from __future__ import annotations

import numpy as np

from draftlab.core.acceptance import acceptance_length
from draftlab.core.progress import tqdm
from draftlab.core.records import prompt_messages, read_jsonl, validate_conversation
from draftlab.data_scaling.plan import ScalingError
from draftlab.engine import SpecConfig, encode_prompts, graphed_engine
from draftlab.engine import summarize as summarize_runs
from draftlab.model.chat_data import load_tokenized
from draftlab.model.draft import load_draft
from draftlab.model.hidden import draft_layers, final_feature, logits_from_last, target_states
from draftlab.model.target import autocast
from draftlab.train_draft import TTTObjective, collate, summarize, targets_at

# ---------------------------------------------------------------------------------- evaluation


def load_val(val_file, tokenizer, max_len: int, overlong: str, cache_dir, limit: int):
    """The held-out split tokenised with the target's template (datasets, cached)."""
    ds, stats = load_tokenized(val_file, tokenizer, max_len, overlong, cache_dir, limit or None)
    return ds, stats


class HeldOut:
    """The held-out conversations with the target's side computed once for the whole study.

    Per conversation: ids/valid/loss_mask [1,L], aux [1,L,3H] and last [1,L,H] (pre-norm), and the
    target's arg-max over the full vocabulary [1,L]. Every draft is then measured with its own
    layer only, instead of one target forward per draft and conversation.
    """

    def __init__(self, target, val_ds, layers, progress: bool = True):
        import torch

        self.layers = list(layers)
        self.items = []
        device = next(target.model.parameters()).device
        pad_id = target.tokenizer.pad_token_id or 0
        amp = autocast(device)
        with torch.no_grad():
            for k in tqdm(
                range(len(val_ds)), desc="held-out target states", unit="conv", disable=not progress, leave=False
            ):
                ids, valid, loss_mask = collate(val_ds, [k], pad_id)
                aux, last, _ = target_states(target, ids, valid.long(), self.layers)
                with amp:
                    top = logits_from_last(target, last[0]).argmax(-1)[None]  # [1,L]
                self.items.append((ids.to(device), valid.to(device), loss_mask.to(device), aux, last, top))

    def __len__(self):
        return len(self.items)


def simulated_acceptance(
    target,
    draft,
    held: HeldOut,
    ttt_steps: int,
    decay: float = 0.8,
    bootstrap: int = 1000,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Per-step accuracy and simulated acceptance length (1 + a0 + a0*a1 + ...) on held-out rows.

    Uses the training objective's own bookkeeping (`draftlab.train_draft.TTTObjective`, soft targets over
    the draft vocabulary as in `train_draft.targets_at`), one conversation at a time so that a
    bootstrap over conversations gives the standard error.
    """
    import torch
    import torch.nn.functional as F

    if draft.use_aux and draft_layers(target, draft) != held.layers:
        raise ScalingError(f"draft captures layers {draft_layers(target, draft)}, held-out states hold {held.layers}")
    device = next(draft.parameters()).device
    amp = autocast(device)
    objective = TTTObjective(draft, ttt_steps, decay)
    dids, t2d = draft.draft_ids(), draft.t2d
    per = []  # [n, steps, 4]
    was_training = draft.training
    draft.eval()
    with torch.no_grad():
        for ids, valid, loss_mask, aux, last, top in tqdm(
            held.items, desc="held-out eval", unit="conv", disable=not progress, leave=False
        ):
            with amp:
                pred_mask = F.pad((loss_mask & valid)[:, 1:], (0, 1))  # [1,L]: token p+1 is an assistant token
                feats = aux if draft.use_aux else final_feature(target, last)
                targets = targets_at(target, last, pred_mask, dids, t2d, top=top)
                per.append(objective(feats, ids, valid, targets)[1].float().cpu())
    draft.train(was_training)
    stats = torch.stack(per)  # [n, steps, 4]
    out = summarize(stats.sum(0), decay)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(bootstrap):
        pick = torch.from_numpy(rng.integers(0, len(per), len(per)))
        boots.append(summarize(stats[pick].sum(0), decay)["sim_accept_len"])
    out["sim_accept_len_se"] = float(np.std(boots, ddof=1)) if len(boots) > 1 else None
    out["conversations"] = len(per)
    out["scored_tokens"] = int(stats[:, 0, 3].sum())
    return out


def chain_acceptance(
    target,
    draft_dir,
    prompt_ids: list[list[int]],
    steps: int = 6,
    max_new_tokens: int = 128,
    bootstrap: int = 1000,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Real chain speculative decoding (topk 1, S steps) in the reference engine: acceptance length
    = completion tokens / verify steps (contract section 5), with a bootstrap SE over prompts."""
    draft = load_draft(draft_dir, target)
    cfg = SpecConfig(mode="EAGLE3", num_steps=steps, topk=1, max_new_tokens=max_new_tokens)
    need = max(len(p) for p in prompt_ids) + max_new_tokens + steps + 4
    engine = graphed_engine(target, draft, cfg, need, prompt_ids[0], [len(p) for p in prompt_ids])
    try:
        results = [
            engine.speculative(p) for p in tqdm(prompt_ids, desc=f"chain S={steps}", disable=not progress, leave=False)
        ]
    finally:
        engine.close()
    s = summarize_runs(results, steps)
    toks = np.array([len(r.tokens) for r in results], dtype=float)
    ver = np.array([max(r.verify_steps, 0) for r in results], dtype=float)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(bootstrap):
        k = rng.integers(0, len(results), len(results))
        if ver[k].sum() > 0:
            boots.append(acceptance_length(toks[k].sum(), ver[k].sum()))
    return {
        "acceptance_length": s["acceptance_length"],
        "acceptance_length_se": float(np.std(boots, ddof=1)) if len(boots) > 1 else None,
        "prompts": len(results),
        "completion_tokens": s["completion_tokens"],
        "verify_steps": s["verify_steps"],
        "position_acceptance": s["position_acceptance"],
        "tokens_per_s": s["tokens_per_s"],
        "steps": steps,  # S: a cycle accepts at most S + 1 (the logistic fit's ceiling)
    }


def heldout_prompts(target, val_file, limit: int) -> list[list[int]]:
    """Token ids of the prompts (core.records.prompt_messages) of the first `limit` held-out conversations."""
    prompts = []
    for i, row in enumerate(read_jsonl(val_file)):
        where = f"{val_file}: row {i + 1}"
        validate_conversation(row, where)
        if not any(m["role"] == "user" for m in row["messages"]):
            continue  # no user turn: nothing to answer
        prompts.append(prompt_messages(row, where))
        if len(prompts) >= limit:
            break
    if not prompts:
        raise ScalingError(f"{val_file}: no conversation with a user turn to answer")
    return encode_prompts(target, prompts)
