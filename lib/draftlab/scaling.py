"""Data scaling: does acceptance length keep rising with more regenerated training data?

Drafts of both architectures (EAGLE-3 and the EAGLE-1-style variant) are trained through
`draftlab.train` on nested subsets of the regenerated training set (the first n rows of one fixed
shuffle, so every subset contains the smaller ones) with the same recipe and the same number of
epochs, i.e. the same training budget per sample. Each draft is measured on the same held-out
conversations (simulated acceptance length from the per-step accuracies, with a bootstrap
standard error over conversations) and, where asked, by real chain decoding at S steps in the
reference engine `draftlab.specdec`. A log-linear and a saturating curve are fitted with
`scipy.optimize.curve_fit`; their 95% bands come from the parameter covariance. The extrapolation
to `factor` x more data is priced with the regeneration throughput measured in notebook 03.

Layout under RUN_DIR/scaling/:
    train_shuffled.jsonl   the training rows in the study's fixed order (subsets are prefixes)
    results.jsonl          one row per finished (arch, n): written as soon as it is done
    <arch>/n<N>-<recipe>/train/   draftlab.train output (checkpoints: a killed run resumes there)
    <arch>/n<N>-<recipe>/draft/   the exported draft (SGLang format)
A rerun skips every (arch, n) already in results.jsonl with the same settings.
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from draftlab.records import RecordError, append_jsonl, read_jsonl

ARCHS = ("eagle3", "eagle1")
# TrainConfig fields that make up the recipe; two drafts are comparable only when these agree.
RECIPE_KEYS = ("epochs", "lr", "draft_vocab_size", "max_len", "overlong", "ttt_steps", "step_decay",
               "batch_tokens", "max_batch", "grad_accum", "warmup_ratio", "weight_decay", "grad_clip",
               "intermediate_size", "init_from_target", "capture_layers")


class ScalingError(RuntimeError):
    """The study cannot run as asked (missing stage output, too little data); the message says why."""


# ---------------------------------------------------------------------------------- the plan


@dataclass
class StudyPlan:
    """What the study trains on and measures with."""

    train_file: Path  # shuffled training rows; subset n = the first n usable rows
    val_file: Path  # held-out conversations (never in any subset)
    sizes: list  # the subset sizes actually used (capped at what the data holds)
    available: int  # training rows available
    notes: list = field(default_factory=list)  # what was changed from the request, and why


def prepare(run_dir, out_dir, sizes: list[int], seed: int = 0, val_samples: int = 256) -> StudyPlan:
    """Shuffle RUN_DIR/data/regen/train.jsonl once (seeded) into out_dir; cap sizes at the data.

    The held-out split is RUN_DIR/data/regen/val.jsonl when 03 wrote one; otherwise notebook 04's
    hold-out (RUN_DIR/train/holdout/) when it exists, else `val_samples` seeded rows held out here
    with the same function (`chat_data.split_holdout`). Held-out rows are never trained on.
    """
    regen = Path(run_dir) / "data" / "regen"
    source = regen / "train.jsonl"
    if not source.is_file():
        raise ScalingError(f"{source}: missing; run notebook 03_regenerate first (it writes data/regen/)")
    if not sizes or any(int(n) < 1 for n in sizes):
        raise ScalingError(f"SIZES = {sizes}: give one or more positive subset sizes")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    notes = []
    val_file, train_source = regen / "val.jsonl", source
    if not val_file.is_file():
        from draftlab.chat_data import split_holdout

        mine = Path(run_dir) / "train" / "holdout"  # notebook 04's split: its drafts never saw these rows
        if (mine / "val.jsonl").is_file() and (mine / "train.jsonl").is_file():
            train_source, val_file = mine / "train.jsonl", mine / "val.jsonl"
            notes.append(f"no {regen / 'val.jsonl'}: using notebook 04's hold-out split {mine}")
        else:
            train_source, val_file = split_holdout(source, val_samples, out / "holdout", seed)
            notes.append(f"no {regen / 'val.jsonl'}: held out {val_samples} rows (seeded) into {out / 'holdout'}")
    rows = list(read_jsonl(train_source))
    if not rows:
        raise ScalingError(f"{train_source}: no conversations")
    for k, row in enumerate(rows, 1):
        if not isinstance(row.get("messages"), list) or "id" not in row:
            raise RecordError(f"{train_source}: row {k}: fields 'id' and 'messages' (a list) are required")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    train_rows = [rows[i] for i in order]
    shuffled = out / "train_shuffled.jsonl"
    _write_if_changed(shuffled, train_rows)
    used = sorted({min(int(n), len(train_rows)) for n in sizes})
    if max(int(n) for n in sizes) > len(train_rows):
        notes.append(f"sizes above the {len(train_rows)} available training rows were capped to it")
    return StudyPlan(train_file=shuffled, val_file=val_file, sizes=used, available=len(train_rows), notes=notes)


def _write_if_changed(path: Path, rows: list[dict]) -> None:
    """Rewrite only when the content differs, so token caches keyed on the file's mtime stay valid."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


def recipe_from_04(run_dir, arch: str = "eagle3") -> dict | None:
    """The recipe notebook 04 trained with (RUN_DIR/train/<arch>/ latest checkpoint), or None."""
    from draftlab.train import find_checkpoint

    try:
        ck = find_checkpoint(Path(run_dir) / "train" / arch)
    except FileNotFoundError:
        return None
    cfg = json.loads((ck / "state.json").read_text())["train_config"]
    return {k: cfg[k] for k in RECIPE_KEYS if k in cfg}


NOT_IN_KEY = ("threads", "save_every", "log_every")  # how, not what: a rerun with others reuses results


def settings_key(arch: str, n: int, settings: dict, eval_settings: dict) -> str:
    """A short hash of everything that decides a result row (a rerun with other settings redoes it)."""
    settings = {k: v for k, v in settings.items() if k not in NOT_IN_KEY}
    blob = json.dumps([arch, int(n), settings, eval_settings], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------- results store


def load_results(path) -> list[dict]:
    path = Path(path)
    return list(read_jsonl(path)) if path.is_file() else []


def done_keys(path) -> set:
    return {r["key"] for r in load_results(path)}


# ---------------------------------------------------------------------------------- evaluation


def load_val(val_file, tokenizer, max_len: int, overlong: str, cache_dir, limit: int):
    """The held-out split tokenised with the target's template (datasets, cached)."""
    from draftlab.chat_data import load_tokenized

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
        from tqdm.auto import tqdm

        from draftlab.hidden import logits_from_last, target_states
        from draftlab.train import collate

        self.layers = list(layers)
        self.items = []
        device = next(target.model.parameters()).device
        pad_id = target.tokenizer.pad_token_id or 0
        amp = _amp(device)
        with torch.no_grad():
            for k in tqdm(range(len(val_ds)), desc="held-out target states", unit="conv", disable=not progress,
                          leave=False):
                ids, valid, loss_mask = collate(val_ds, [k], pad_id)
                aux, last, _ = target_states(target, ids, valid.long(), self.layers)
                with amp:
                    top = logits_from_last(target, last[0]).argmax(-1)[None]  # [1,L]
                self.items.append((ids.to(device), valid.to(device), loss_mask.to(device), aux, last, top))

    def __len__(self):
        return len(self.items)


def _amp(device):
    import torch

    device = torch.device(device)
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else torch.autocast("cpu", enabled=False)


def simulated_acceptance(target, draft, held: HeldOut, ttt_steps: int, decay: float = 0.8, bootstrap: int = 1000,
                         seed: int = 0, progress: bool = True) -> dict:
    """Per-step accuracy and simulated acceptance length (1 + a0 + a0*a1 + ...) on held-out rows.

    Uses the training objective's own bookkeeping (`draftlab.train.TTTObjective`, soft targets over
    the draft vocabulary as in `train.soft_targets`), one conversation at a time so that a
    bootstrap over conversations gives the standard error.
    """
    import torch
    import torch.nn.functional as F
    from tqdm.auto import tqdm

    from draftlab.hidden import draft_layers, final_feature, logits_from_last
    from draftlab.train import TTTObjective, summarize

    if draft.use_aux and draft_layers(target, draft) != held.layers:
        raise ScalingError(f"draft captures layers {draft_layers(target, draft)}, held-out states hold {held.layers}")
    device = next(draft.parameters()).device
    amp = _amp(device)
    objective = TTTObjective(draft, ttt_steps, decay)
    dids, t2d = draft.draft_ids(), draft.t2d
    per = []  # [n, steps, 4]
    was_training = draft.training
    draft.eval()
    with torch.no_grad():
        for ids, valid, loss_mask, aux, last, top in tqdm(held.items, desc="held-out eval", unit="conv",
                                                          disable=not progress, leave=False):
            with amp:
                target_d = logits_from_last(target, last, vocab_ids=dids)  # [1,L,Vd]
                pred_mask = F.pad((loss_mask & valid)[:, 1:], (0, 1))  # [1,L]: token p+1 is an assistant token
                feats = aux if draft.use_aux else final_feature(target, last)
                per.append(objective(feats, ids, valid, pred_mask, t2d[top], target_d, top)[1].float().cpu())
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


def chain_acceptance(target, draft_dir, prompt_ids: list[list[int]], steps: int = 6, max_new_tokens: int = 128,
                     bootstrap: int = 1000, seed: int = 0, progress: bool = True) -> dict:
    """Real chain speculative decoding (topk 1, S steps) in the reference engine: acceptance length
    = completion tokens / verify steps (contract section 5), with a bootstrap SE over prompts."""
    from draftlab.draft import load_draft
    from draftlab.specdec import SpecConfig, graphed_engine, summarize

    draft = load_draft(draft_dir, target)
    cfg = SpecConfig(mode="EAGLE3", num_steps=steps, topk=1, max_new_tokens=max_new_tokens)
    need = max(len(p) for p in prompt_ids) + max_new_tokens + steps + 4
    engine = graphed_engine(target, draft, cfg, need, prompt_ids[0], [len(p) for p in prompt_ids])
    try:
        from tqdm.auto import tqdm

        results = [engine.speculative(p) for p in tqdm(prompt_ids, desc=f"chain S={steps}", disable=not progress,
                                                       leave=False)]
    finally:
        engine.close()
    s = summarize(results, steps)
    toks = np.array([len(r.tokens) for r in results], dtype=float)
    ver = np.array([max(r.verify_steps, 0) for r in results], dtype=float)
    rng = np.random.default_rng(seed)
    boots = []
    for _ in range(bootstrap):
        k = rng.integers(0, len(results), len(results))
        if ver[k].sum() > 0:
            boots.append(toks[k].sum() / ver[k].sum())
    return {"acceptance_length": s["acceptance_length"], "acceptance_length_se": float(np.std(boots, ddof=1))
            if len(boots) > 1 else None, "prompts": len(results), "completion_tokens": s["completion_tokens"],
            "verify_steps": s["verify_steps"], "position_acceptance": s["position_acceptance"],
            "tokens_per_s": s["tokens_per_s"]}


def heldout_prompts(target, val_file, limit: int) -> list[list[int]]:
    """Token ids of the first `limit` held-out conversations cut before their first assistant turn."""
    from draftlab.specdec import encode_prompts

    prompts = []
    for row in read_jsonl(val_file):
        msgs = row["messages"]
        first = next((i for i, m in enumerate(msgs) if m["role"] == "assistant"), None)
        if first:  # at least one message before the reply
            prompts.append(msgs[:first])
        if len(prompts) >= limit:
            break
    if not prompts:
        raise ScalingError(f"{val_file}: no conversation with a prompt before an assistant turn")
    return encode_prompts(target, prompts)


# ---------------------------------------------------------------------------------- the study


@dataclass
class StudySettings:
    """Everything the study runs with besides the data (the notebook's parameters)."""

    archs: list = field(default_factory=lambda: list(ARCHS))
    train: dict = field(default_factory=dict)  # TrainConfig fields of the recipe (RECIPE_KEYS and more)
    hidden: str = "online"  # offline: each subset's target states computed once, shared by both archs
    val_samples: int = 256
    spec_prompts: int = 0  # 0: no real chain decoding
    spec_steps: int = 6
    spec_max_new_tokens: int = 128
    time_budget_s: float = 0.0  # 0: no limit; else stop before a subset that would not fit
    seed: int = 0
    side_by_side: bool = False  # train a subset's archs at once, one process each (hidden online)

    def eval_settings(self) -> dict:
        return {"val_samples": self.val_samples, "spec_prompts": self.spec_prompts, "spec_steps": self.spec_steps,
                "spec_max_new_tokens": self.spec_max_new_tokens}


def study_settings(run_dir, *, from_04: bool, archs, epochs, draft_vocab_size, max_len, ttt_steps, batch_tokens,
                   max_batch, lr, checkpoint_every, val_samples, spec_prompts, spec_steps, spec_max_new_tokens,
                   time_budget_s, seed, threads: int = 2, intermediate_size: int = 0,
                   hidden: str = "online", side_by_side: bool = False) -> tuple[StudySettings, list[str]]:
    """The notebook's parameters as StudySettings; with from_04 the recipe is notebook 04's own (its
    checkpoint's TrainConfig), so that 04's drafts are the study's largest points."""
    train = {"epochs": float(epochs), "draft_vocab_size": int(draft_vocab_size), "max_len": int(max_len),
             "ttt_steps": int(ttt_steps), "batch_tokens": int(batch_tokens), "max_batch": int(max_batch),
             "lr": float(lr), "save_every": int(checkpoint_every), "threads": int(threads),
             "intermediate_size": int(intermediate_size)}
    if hidden not in ("online", "offline"):
        raise ScalingError(f"HIDDEN = {hidden!r}: expected online or offline")
    notes = []
    if from_04:
        theirs = recipe_from_04(run_dir, "eagle3")
        if theirs is None:
            notes.append("RECIPE_FROM_04: no checkpoint under RUN_DIR/train/eagle3; using this notebook's recipe")
        else:
            changed = {k: v for k, v in theirs.items() if train.get(k) != v}
            train.update(theirs)
            notes.append(f"recipe taken from 04: {changed}")
    return StudySettings(archs=list(archs), train=train, hidden=hidden, val_samples=int(val_samples),
                         spec_prompts=int(spec_prompts),
                         spec_steps=int(spec_steps), spec_max_new_tokens=int(spec_max_new_tokens),
                         time_budget_s=float(time_budget_s), seed=int(seed),
                         side_by_side=bool(side_by_side) and hidden == "online"), notes


def work_items(plan: StudyPlan, settings: StudySettings) -> list[tuple[str, int]]:
    """(arch, n) in the order they run: smallest subsets first, architectures interleaved, so a
    time-boxed run still yields comparable points for both."""
    for a in settings.archs:
        if a not in ARCHS:
            raise ScalingError(f"ARCHS: {a!r} is not one of {ARCHS}")
    return [(a, n) for n in plan.sizes for a in settings.archs]


def run_study(target, target_spec: str, device: str, plan: StudyPlan, out_dir, settings: StudySettings,
              extra_points: list[dict] | None = None, progress: bool = True) -> dict:
    """Train + measure every (arch, n) not yet done; each result is appended to results.jsonl at once.

    extra_points: already-trained drafts to measure the same way (e.g. notebook 04's, trained on
    all the data with the same recipe): dicts with arch, n, draft_dir, source.
    Returns {"results": rows for this plan's settings, "deferred": items left for a rerun, ...}.
    """
    from draftlab.export import export_draft
    from draftlab.train import TrainConfig, train

    out = Path(out_dir)
    results_path = out / "results.jsonl"
    t_start = time.monotonic()
    if str(device).startswith("cpu"):
        import torch

        torch.set_num_threads(max(1, int(settings.train.get("threads", 2))))
    ev = settings.eval_settings()
    val_ds, val_stats = load_val(plan.val_file, target.tokenizer, settings.train.get("max_len", 2048),
                                 settings.train.get("overlong", "truncate"), out / "tokens", settings.val_samples)
    held = HeldOut(target, val_ds, settings.train.get("capture_layers") or target.capture_layers, progress)
    prompts = heldout_prompts(target, plan.val_file, settings.spec_prompts) if settings.spec_prompts else None
    have = done_keys(results_path)
    deferred, ran = [], []
    sec_per_sample: dict[str, float] = {}  # measured wall time per training sample (incl. eval)
    for r in load_results(results_path):
        if r.get("source") == "scaling" and r.get("wall_s"):
            sec_per_sample[r["arch"]] = r["wall_s"] / max(r["n"], 1)

    def measure(arch, n, draft_dir, source, extra):
        """Every point is measured from its exported folder (bf16 weights, as a server loads them)."""
        from draftlab.draft import load_draft

        t0 = time.monotonic()
        draft = load_draft(draft_dir, target)
        sim = simulated_acceptance(target, draft, held, settings.train.get("ttt_steps", 7),
                                   settings.train.get("step_decay", 0.8), seed=settings.seed, progress=progress)
        row = {"arch": arch, "n": n, "source": source, "sim_accept_len": sim["sim_accept_len"],
               "sim_accept_len_se": sim["sim_accept_len_se"],
               "acc": [sim[f"acc_{i}"] for i in range(settings.train.get("ttt_steps", 7))],
               "val_conversations": sim["conversations"], "val_scored_tokens": sim["scored_tokens"], **extra}
        if prompts:
            ch = chain_acceptance(target, draft_dir, prompts, settings.spec_steps, settings.spec_max_new_tokens,
                                  seed=settings.seed, progress=progress)
            row.update({f"chain_{k}": v for k, v in ch.items()})
        row["eval_s"] = round(time.monotonic() - t0, 2)
        del draft
        _free_cuda()
        return row

    recipe = {**settings.train, "train_file_rows": plan.available}

    def item_key(arch, n):
        """The result key of a subset trained with this study's recipe and evaluation."""
        return settings_key(arch, n, recipe, ev)

    def subset_config(arch, n):
        """(TrainConfig, folder) of one subset; one folder per recipe (train.py refuses to resume a
        checkpoint made with other settings)."""
        sub = out / arch / f"n{n}-{settings_key(arch, n, recipe, {})}"
        cfg = TrainConfig.from_dict({**settings.train, "train_file": str(plan.train_file), "val_file": "",
                                     "out_dir": str(sub / "train"), "target": target_spec, "arch": arch,
                                     "device": device, "max_train_samples": n, "hidden": settings.hidden,
                                     "hidden_dir": str(out / "hidden" / f"n{n}"), "seed": settings.seed})
        return cfg, sub

    items = work_items(plan, settings)
    trained_together: dict = {}  # (arch, n) -> result of a side-by-side training, not yet measured
    for arch, n in items:
        key = item_key(arch, n)
        if key in have:
            continue
        elapsed = time.monotonic() - t_start
        guess = sec_per_sample.get(arch, 0.0) * n
        # with no measurement yet (guess 0) a subset runs anyway: a killed one resumes from its checkpoints
        if ((arch, n) not in trained_together and settings.time_budget_s and (ran or guess)
                and elapsed + guess > settings.time_budget_s):
            deferred.append((arch, n))
            continue
        cfg, sub = subset_config(arch, n)
        t0 = time.monotonic()
        if settings.side_by_side and (arch, n) not in trained_together:
            group = [a for a, m in items if m == n and item_key(a, m) not in have]
            if len(group) > 1:
                from draftlab.train_parallel import train_side_by_side

                try:
                    together = train_side_by_side([subset_config(a, n)[0] for a in group], resume=True, target=target)
                    trained_together.update({(a, n): (together[a], time.monotonic() - t0) for a in group})
                except RuntimeError as exc:  # one after the other instead, resuming their checkpoints
                    print(f"side-by-side training failed; training one after the other: {str(exc)[:1500]}")
        together = (arch, n) in trained_together
        if together:
            res, train_s = trained_together.pop((arch, n))  # the group's wall time, shared
        else:
            res = train(cfg, resume=True, target=target)
            train_s = time.monotonic() - t0
        t_trained = time.monotonic()
        if not res["finished"]:
            deferred.append((arch, n))
            continue
        draft_dir = sub / "draft"
        export_draft(res["draft"], draft_dir, max_position_embeddings=target.max_position_embeddings)
        kept = res["train_stats"]["kept"]  # rows actually trained on (tokenisation may drop some)
        extra = {"key": key, "n_requested": n, "train_s": round(train_s, 2), "side_by_side": together,
                 "train_tokens": res["train_tokens"], "train_rows": kept, "steps": res["steps"],
                 "train_tokens_per_s": res["tokens_per_s"], "vocab_coverage": res["vocab_coverage"],
                 "draft_dir": str(draft_dir)}
        del res
        _free_cuda()
        row = measure(arch, kept, draft_dir, "scaling", extra)
        row["wall_s"] = round(train_s + time.monotonic() - t_trained, 2)
        append_jsonl(results_path, [row])
        sec_per_sample[arch] = row["wall_s"] / max(n, 1)
        ran.append((arch, n))

    for point in extra_points or []:
        key = settings_key(point["arch"], point["n"], {"draft_dir": str(point["draft_dir"]), "source": point["source"]},
                           ev)
        if key in done_keys(results_path):
            continue
        row = measure(point["arch"], point["n"], point["draft_dir"], point["source"],
                      {"key": key, "draft_dir": str(point["draft_dir"]), **point.get("meta", {})})
        append_jsonl(results_path, [row])

    keys = {item_key(a, n) for a, n in items}
    keys |= {settings_key(p["arch"], p["n"], {"draft_dir": str(p["draft_dir"]), "source": p["source"]}, ev)
             for p in extra_points or []}
    rows = [r for r in load_results(results_path) if r["key"] in keys]
    return {"results": rows, "deferred": deferred, "ran_now": ran, "val_stats": val_stats,
            "wall_s": round(time.monotonic() - t_start, 1)}


def _free_cuda() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def points_from_04(run_dir, recipe: dict) -> tuple[list[dict], list[str]]:
    """Notebook 04's exported drafts as extra points (n = the rows it trained on), when its recipe
    equals the study's; otherwise none, and a note saying which setting differs."""
    points, notes = [], []
    for arch in ARCHS:
        draft_dir = Path(run_dir) / "drafts" / arch
        summary = Path(run_dir) / "train" / arch / "summary.json"
        if not (draft_dir / "config.json").is_file() or not summary.is_file():
            notes.append(f"04 {arch}: no {draft_dir} or {summary}; not included")
            continue
        theirs = recipe_from_04(run_dir, arch) or {}
        differ = sorted(k for k in RECIPE_KEYS if k in theirs and k in recipe and theirs[k] != recipe[k])
        if differ:
            notes.append(f"04 {arch}: recipe differs in {differ}; not included in the curve")
            continue
        info = json.loads(summary.read_text())
        if not info.get("finished", True):
            notes.append(f"04 {arch}: training did not finish; not included")
            continue
        points.append({"arch": arch, "n": int(info["train_stats"]["kept"]), "draft_dir": draft_dir, "source": "04",
                       "meta": {"train_s": info.get("elapsed_s"), "train_tokens": info.get("train_tokens"),
                                "train_rows": info["train_stats"]["kept"]}})
    return points, notes


# ---------------------------------------------------------------------------------- curve fits


def loglinear(n, a, b):
    """y = a + b log10(n): keeps rising by b per decade (optimistic when extrapolated)."""
    return a + b * np.log10(n)


def saturating(n, y_inf, b, c):
    """y = y_inf - b (n / 1000)^(-c): approaches y_inf (conservative when extrapolated)."""
    return y_inf - b * np.power(np.asarray(n, dtype=float) / 1000.0, -c)


MODELS = {"loglinear": (loglinear, 2), "saturating": (saturating, 3)}


@dataclass
class Fit:
    model: str
    params: list
    cov: list
    dof: int
    scale: float  # factor applied to the covariance (reduced chi-square when > 1)
    ok: bool
    reason: str = ""

    def predict(self, n):
        return MODELS[self.model][0](np.asarray(n, dtype=float), *self.params)

    def band(self, n, level: float = 0.95, draws: int = 4000, seed: int = 0):
        """(low, high) of the prediction at n from parameter draws ~ N(params, cov)."""
        n = np.asarray(n, dtype=float)
        rng = np.random.default_rng(seed)
        samples = rng.multivariate_normal(self.params, np.asarray(self.cov), size=draws, check_valid="ignore")
        with np.errstate(all="ignore"):
            preds = np.stack([MODELS[self.model][0](n, *s) for s in samples])
        preds = preds[np.all(np.isfinite(preds), axis=1)]
        q = (1 - level) / 2
        return np.quantile(preds, q, axis=0), np.quantile(preds, 1 - q, axis=0)


def fit_curve(n, y, se=None, model: str = "loglinear") -> Fit:
    """Weighted least squares with scipy's curve_fit; covariance from the standard errors, scaled up
    by the reduced chi-square when the points scatter more than their errors say."""
    from scipy.optimize import curve_fit

    fn, k = MODELS[model]
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    if len(n) < k + 1 or len(set(n.tolist())) < k:
        return Fit(model, [], [], len(n) - k, 1.0, False, f"{len(n)} points: need at least {k + 1} for {model}")
    sigma = None
    if se is not None and all(s is not None and s > 0 for s in se):
        sigma = np.asarray(se, dtype=float)
    if model == "loglinear":
        p0, bounds = [float(y.mean()), 0.1], (-np.inf, np.inf)
    else:
        p0 = [float(y.max()) + 0.2, max(float(y.max() - y.min()), 0.05), 0.5]
        bounds = ([float(y.max()) - 1e-6, 0.0, 1e-3], [np.inf, np.inf, 5.0])
    try:
        params, cov = curve_fit(fn, n, y, p0=p0, sigma=sigma, absolute_sigma=sigma is not None, bounds=bounds,
                                maxfev=20000)
    except (RuntimeError, ValueError) as exc:
        return Fit(model, [], [], len(n) - k, 1.0, False, f"fit failed: {exc}")
    dof = len(n) - k
    resid = (y - fn(n, *params)) / (sigma if sigma is not None else 1.0)
    chi2 = float((resid**2).sum())
    scale = max(1.0, chi2 / dof) if (sigma is not None and dof > 0) else 1.0
    cov = np.asarray(cov) * scale
    ok = bool(np.all(np.isfinite(cov)))
    return Fit(model, params.tolist(), cov.tolist(), dof, scale, ok, "" if ok else "covariance not finite")


def fit_all(results: list[dict], metric: str = "sim_accept_len") -> dict:
    """{arch: {model: Fit}} over the result rows of each architecture."""
    fits = {}
    for arch in ARCHS:
        rows = sorted((r for r in results if r["arch"] == arch and r.get(metric) is not None), key=lambda r: r["n"])
        if not rows:
            continue
        n = [r["n"] for r in rows]
        y = [r[metric] for r in rows]
        se = [r.get(metric + "_se") for r in rows]
        fits[arch] = {m: fit_curve(n, y, se, m) for m in MODELS}
    return fits


# ---------------------------------------------------------------------------------- costs and extrapolation


def regen_throughput(run_dir) -> dict:
    """Completion tokens/s of regeneration and mean completion tokens per training conversation.

    The rate comes from 03's metrics (`splits.train.tok_s`, else any `tok_s` under "03_regenerate"); without
    it, from the rows' own token counts and finish times (meta.regen.t_done span), marked as such.
    """
    run_dir = Path(run_dir)
    rows = list(read_jsonl(run_dir / "data" / "regen" / "train.jsonl"))
    tokens = [sum(x or 0 for x in (r.get("meta", {}).get("regen", {}).get("completion_tokens") or [])) for r in rows]
    out = {"conversations": len(rows), "completion_tokens": int(sum(tokens)),
           "mean_completion_tokens": float(np.mean(tokens)) if tokens else None, "tok_s": None, "tok_s_source": None}
    metrics = run_dir / "metrics.json"
    if metrics.is_file():
        m03 = json.loads(metrics.read_text()).get("03_regenerate", {})
        found = ((m03.get("splits") or {}).get("train") or {}).get("tok_s") or _find_key(m03, "tok_s")
        if found:
            out["tok_s"], out["tok_s_source"] = float(found), "metrics.json 03_regenerate"
    if out["tok_s"] is None:
        done = [r["meta"]["regen"].get("t_done") for r in rows if r.get("meta", {}).get("regen", {}).get("t_done")]
        if len(done) > 1 and max(done) > min(done):
            out["tok_s"] = sum(tokens) / (max(done) - min(done))
            out["tok_s_source"] = "row timestamps (first to last finished row; a lower bound on the rate)"
    return out


def _find_key(obj, key):
    if isinstance(obj, dict):
        if isinstance(obj.get(key), (int, float)) and obj[key]:
            return obj[key]
        for v in obj.values():
            hit = _find_key(v, key)
            if hit:
                return hit
    return None


def extrapolate(fits: dict, results: list[dict], regen: dict, factor: float = 10.0, goal: float | None = None) -> dict:
    """Predicted acceptance at factor x the largest subset (95% band) per architecture and model,
    with the regeneration and training time the extra data would cost."""
    out = {}
    for arch, by_model in fits.items():
        rows = [r for r in results if r["arch"] == arch]
        n_max = max(r["n"] for r in rows)
        n_new = factor * n_max
        biggest = [r for r in rows if r["n"] == n_max and r.get("train_s")]
        sec_per_row = (biggest[0]["train_s"] / n_max) if biggest else None
        extra_rows = n_new - n_max
        regen_s = (extra_rows * regen["mean_completion_tokens"] / regen["tok_s"]
                   if regen.get("tok_s") and regen.get("mean_completion_tokens") else None)
        entry = {"n_now": n_max, "n_new": n_new, "measured_now": max((r["sim_accept_len"] for r in rows
                                                                       if r["n"] == n_max), default=None),
                 "extra_conversations": extra_rows,
                 "regeneration_hours": regen_s / 3600 if regen_s is not None else None,
                 "training_hours_at_new_size": sec_per_row * n_new / 3600 if sec_per_row else None}
        for model, fit in by_model.items():
            if not fit.ok:
                entry[model] = {"ok": False, "reason": fit.reason}
                continue
            lo, hi = fit.band([n_max, n_new])
            pred = fit.predict([n_max, n_new])
            e = {"ok": True, "params": fit.params, "pred_now": float(pred[0]), "pred_new": float(pred[1]),
                 "band_new": [float(lo[1]), float(hi[1])], "gain": float(pred[1] - pred[0]), "dof": fit.dof,
                 "cov_scale": fit.scale}
            if goal is not None:
                e["goal"] = goal
                e["reaches_goal"] = bool(lo[1] >= goal) if lo[1] >= goal else (False if hi[1] < goal else None)
            entry[model] = e
        out[arch] = entry
    return out


# ---------------------------------------------------------------------------------- figures


def plot_scaling(results: list[dict], fits: dict, factor: float = 10.0, goal: float | None = None,
                 metric: str = "sim_accept_len"):
    """Acceptance length vs training conversations (log x), both architectures, fits and 95% bands."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = {"eagle3": "tab:blue", "eagle1": "tab:orange"}
    labels = {"eagle3": "EAGLE-3 (3 layers + fc)", "eagle1": "EAGLE-1-style (final state)"}
    n_all = [r["n"] for r in results]
    if not n_all:
        ax.text(0.5, 0.5, "no finished subsets yet", ha="center", transform=ax.transAxes)
        return fig
    grid = np.geomspace(min(n_all), factor * max(n_all), 120)
    for arch in ARCHS:
        rows = sorted((r for r in results if r["arch"] == arch), key=lambda r: r["n"])
        if not rows:
            continue
        c = colors[arch]
        for src, marker in (("scaling", "o"), ("04", "s")):
            pts = [r for r in rows if r["source"] == src]
            if pts:
                ax.errorbar([r["n"] for r in pts], [r[metric] for r in pts],
                            yerr=[1.96 * (r.get(metric + "_se") or 0) for r in pts], fmt=marker, color=c,
                            capsize=3, label=f"{labels[arch]}" + (" (04 draft)" if src == "04" else ""))
        chain = [r for r in rows if r.get("chain_acceptance_length")]
        if chain:
            ax.plot([r["n"] for r in chain], [r["chain_acceptance_length"] for r in chain], "x", color=c, ms=8,
                    label=f"{labels[arch]}: real chain S={len(chain[0]['chain_position_acceptance'])}")
        for model, style in (("loglinear", "-"), ("saturating", "--")):
            fit = fits.get(arch, {}).get(model)
            if fit is None or not fit.ok:
                continue
            ax.plot(grid, fit.predict(grid), style, color=c, lw=1.2, alpha=0.9, label=f"{arch} {model} fit")
            lo, hi = fit.band(grid)
            ax.fill_between(grid, lo, hi, color=c, alpha=0.12 if model == "loglinear" else 0.06)
    ax.axvline(max(n_all), color="grey", lw=0.8, ls=":")
    ax.axvline(factor * max(n_all), color="grey", lw=0.8, ls=":")
    ax.text(factor * max(n_all), ax.get_ylim()[0], f" {factor:g}x", color="grey", va="bottom")
    top = max([r[metric] for r in results if r.get(metric) is not None] + [ax.get_ylim()[1]])
    if goal is not None and top >= 0.6 * goal:
        ax.axhline(goal, color="green", lw=0.8, ls="-.", label=f"goal {goal:g}")
    elif goal is not None:  # far above the data: say so instead of squashing the curves
        ax.text(0.01, 0.98, f"goal {goal:g} (above this scale)", transform=ax.transAxes, va="top", fontsize=8,
                color="green")
    ax.set_xscale("log")
    ax.set_xlabel("regenerated training conversations (same epochs per sample)")
    ax.set_ylabel("acceptance length (held-out)")
    ax.set_title("Acceptance length vs training data (bars and bands: 95%)")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3, which="both")
    return fig


def plot_extrapolation(extra: dict):
    """Predicted acceptance at 10x data (95% interval) per architecture and fit, with its cost."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    ticks, labels = [], []
    y = 0
    for arch, e in extra.items():
        for model in MODELS:
            m = e.get(model, {})
            if not m.get("ok"):
                continue
            ax.plot([m["pred_now"]], [y], "o", color="grey")
            ax.errorbar([m["pred_new"]], [y], xerr=[[max(0.0, m["pred_new"] - m["band_new"][0])],
                                                   [max(0.0, m["band_new"][1] - m["pred_new"])]],
                        fmt="D", color="tab:blue" if arch == "eagle3" else "tab:orange", capsize=3)
            ticks.append(y)
            cost = e.get("regeneration_hours")
            labels.append(f"{arch} {model}\n{e['n_now']:,} -> {e['n_new']:,.0f} conv"
                          + (f", +{cost:.2g} h regen" if cost is not None else ""))
            y += 1
    ax.set_yticks(ticks, labels, fontsize=7)
    ax.set_xlabel("acceptance length: fitted now (grey) and predicted with more data (95% band)")
    ax.grid(alpha=0.3)
    return fig


def summary_table(results: list[dict]):
    """A pandas table of the finished points (for the notebook)."""
    import pandas as pd

    cols = ["arch", "n", "source", "sim_accept_len", "sim_accept_len_se", "chain_acceptance_length",
            "chain_acceptance_length_se", "train_s", "eval_s", "train_tokens", "vocab_coverage"]
    df = pd.DataFrame(results)
    return df[[c for c in cols if c in df.columns]].sort_values(["arch", "n"]).reset_index(drop=True)


def fits_as_dict(fits: dict) -> dict:
    return {arch: {m: asdict(f) for m, f in by.items()} for arch, by in fits.items()}


def findings(results: list[dict], extra: dict, deferred: list, metric: str = "sim_accept_len") -> list[str]:
    """Plain sentences for the notebook's closing summary, from the measured rows and fits only."""
    lines = []
    for arch, e in extra.items():
        rows = sorted((r for r in results if r["arch"] == arch), key=lambda r: r["n"])
        pts = ", ".join(f"{r['n']:,}: {r[metric]:.3f}" for r in rows)
        lines.append(f"{arch}: measured {metric} by training conversations: {pts}")
        for model in MODELS:
            m = e.get(model, {})
            if m.get("ok"):
                lines.append(f"  {model} fit: {e['n_new']:,.0f} conversations -> {m['pred_new']:.3f} "
                             f"[95% {m['band_new'][0]:.3f}, {m['band_new'][1]:.3f}] (gain {m['gain']:+.3f})")
            else:
                lines.append(f"  {model} fit: none ({m.get('reason', 'not fitted')})")
        if e.get("regeneration_hours") is not None:
            lines.append(f"  the {e['extra_conversations']:,.0f} extra conversations cost about "
                         f"{e['regeneration_hours']:.2f} h of regeneration at the measured rate"
                         + (f" and {e['training_hours_at_new_size']:.2f} h of training" if e.get(
                             "training_hours_at_new_size") else ""))
    e3 = {r["n"]: r[metric] for r in results if r["arch"] == "eagle3"}
    e1 = {r["n"]: r[metric] for r in results if r["arch"] == "eagle1"}
    both = sorted(set(e3) & set(e1))
    if both:
        lines.append("EAGLE-3 / EAGLE-1 ratio by size: " + ", ".join(f"{n:,}: {e3[n] / e1[n]:.2f}x" for n in both))
    if deferred:
        lines.append(f"not run yet (time budget; rerun the notebook to continue): {deferred}")
    return lines
