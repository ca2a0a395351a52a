"""What one training step computes: epoch plans and batches, the TTT objective, features and targets.

Training-time test (TTT) unrolls the draft `ttt_steps` times with loss weight `step_decay`^i
against the target's distribution restricted to the draft vocabulary (docs/eagle3-contract.md 3).
"""

from __future__ import annotations

import math
import os
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass

import torch
import torch.utils.checkpoint
from torch import nn

from draftlab.model.draft import Eagle3Draft
from draftlab.model.hidden import final_feature, logits_from_last, target_states
from draftlab.train_draft.config import TrainConfig


# ---- distributed helpers ---------------------------------------------------------------------
def dist_info():
    """(world, rank, local_rank) from torchrun's environment."""
    return int(os.environ.get("WORLD_SIZE", 1)), int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0))


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.all_reduce(t)
    return t


# ---- batches ---------------------------------------------------------------------------------
def plan_epoch(lengths: list[int], batch_tokens: int, max_batch: int, seed: int, epoch: int) -> list[list[int]]:
    """Deterministic batches for one epoch: shuffle, sort chunks by length (less padding), group
    under the token budget, shuffle batch order. Same (seed, epoch) -> same plan on every rank."""
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(len(lengths), generator=g).tolist()
    batches = []
    chunk = max(256, 16 * max_batch)
    for c in range(0, len(perm), chunk):
        cur, longest = [], 0
        for i in sorted(perm[c : c + chunk], key=lambda k: lengths[k]):
            if cur and (max(longest, lengths[i]) * (len(cur) + 1) > batch_tokens or len(cur) >= max_batch):
                batches.append(cur)
                cur, longest = [], 0
            cur.append(i)
            longest = max(longest, lengths[i])
        if cur:
            batches.append(cur)
    order = torch.randperm(len(batches), generator=g).tolist()
    return [batches[k] for k in order]


def epoch_plans(lengths, cfg: TrainConfig, per_step: int):
    """[(epoch, plan, steps in it)] covering cfg.epochs (a fractional last epoch is cut)."""
    plans, n_full = [], math.ceil(cfg.epochs)
    for e in range(n_full):
        plan = plan_epoch(lengths, cfg.batch_tokens, cfg.max_batch, cfg.seed, e)
        steps = len(plan) // per_step
        if e == n_full - 1 and cfg.epochs < n_full:
            steps = int(steps * (cfg.epochs - e))
        plans.append((e, plan, steps))
    return plans


def collate(dataset, indices, pad_id: int, multiple: int = 1):
    """-> input_ids [B,L], valid [B,L] bool, loss_mask [B,L] bool (right padding).

    L is the longest row rounded up to `multiple`: fewer distinct shapes, for kernels that plan per
    shape (cuDNN's attention: 1.8x faster with 64 on an H200; the default kernels need no rounding)."""
    rows = dataset[indices] if not isinstance(indices, int) else dataset[[indices]]
    longest = max(len(r) for r in rows["input_ids"])
    longest = -(-longest // multiple) * multiple
    b = len(indices)
    ids = torch.full((b, longest), pad_id, dtype=torch.int64)
    valid = torch.zeros(b, longest, dtype=torch.bool)
    loss = torch.zeros(b, longest, dtype=torch.bool)
    for r, (x, m) in enumerate(zip(rows["input_ids"], rows["loss_mask"])):
        ids[r, : len(x)] = torch.tensor(x)
        valid[r, : len(x)] = True
        loss[r, : len(x)] = torch.tensor(m, dtype=torch.bool)
    return ids, valid, loss


ATTENTION_KERNELS = ("auto", "cudnn", "efficient", "flash", "math")


def attention_kernel(name: str):
    """Pin scaled_dot_product_attention in a training step to one kernel ("auto": torch chooses)."""
    if name == "auto":
        return nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "cudnn": SDPBackend.CUDNN_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "flash": SDPBackend.FLASH_ATTENTION,
        "math": SDPBackend.MATH,
    }[name]
    return sdpa_kernel([backend])


# ---- the TTT objective -----------------------------------------------------------------------
LOSSES = ("soft", "hard")  # soft: CE against the target's softmax over the draft vocab; hard: against its arg-max
# name -> TrainConfig (and TTTObjective) settings: implementations of the same arithmetic, compared for speed
OBJECTIVE_VARIANTS = {"eager": {}, "keep_head": {"recompute_head": False}, "compiled": {"compile": True}}


CACHES = (("inductor", "fxgraph"), ("aot_autograd", "autograd"))  # torch's counter group, its key's prefix
EVENTS = ("hit", "miss")


def compile_report(top: int = 8) -> str:
    """torch's own account of its compile time in this process, the largest entries (nested: a phase includes
    its parts). Why: a compiled run's first step took 56-70 s on the H200 even with warm caches,
    and only the compiler can say whether that is tracing, AOT autograd or loading kernels. The CSV form: the
    string form is laid out by `tabulate` where it is installed (the H200's torch printed "none" so)."""
    try:
        from torch._dynamo.utils import compile_times, counters  # private, but what torch itself prints

        names, values = compile_times(repr="csv", aggregate=True)  # not "str": its layout depends on tabulate
    except (ImportError, AttributeError, TypeError, ValueError):
        return "compile times: not available from this torch"
    rows = sorted(((float(v), n) for n, v in zip(names, values)), reverse=True)
    # whether the carried caches served this run: Inductor's graphs and AOT autograd's, hits against misses
    hits = {f"{kind} {event}": counters[group][f"{kind}_cache_{event}"] for group, kind in CACHES for event in EVENTS}
    return (
        "compile times (s, nested): "
        + (", ".join(f"{n} {v:.1f}" for v, n in rows[:top]) or "none")
        + "; caches: "
        + ", ".join(f"{k} {v}" for k, v in hits.items())
    )


class TTTObjective(nn.Module):
    """Wraps the draft so that DDP sees one forward per micro-batch: returns (loss, stats).

    stats [steps, 4] = (sum of CE over trained slots, trained slots, correct, scored slots).
    Only the slots that predict an assistant token are gathered for the head (prompt and padding
    slots are a third or more of a batch); their indices come from `Targets.rows`, on the CPU, so a
    step needs no device-to-host sync. `recompute_head` trades the [N,Vd] logits' memory for a
    second head forward in backward (activation checkpointing, CUDA only). `compile`: torch.compile
    the draft's unroll step and the step loss (dynamic shapes); the same arithmetic, fused.
    """

    def __init__(
        self,
        draft: Eagle3Draft,
        steps: int,
        decay: float,
        loss: str = "soft",
        recompute_head: bool = True,
        compile: bool = False,
    ):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"loss = {loss!r}, expected one of {list(LOSSES)}")
        self.draft = draft
        self.steps = steps
        self.decay = decay
        self.loss = loss
        self.recompute_head = recompute_head
        self.step_loss = self._step_loss
        if compile:
            draft.compile_ttt()
            self.step_loss = torch.compile(self._step_loss, dynamic=True)

    @contextmanager
    def eager(self):
        """The objective without its compiled parts while inside: evaluation. Why: its no_grad graphs would
        compile again for a few batches of work; the step-0 evaluation took 47 s with `compile` on the H200
        (three rows at once), of the first 90 s before step 10."""
        compiled = self.draft.ttt_step_fn, self.step_loss
        self.draft.ttt_step_fn, self.step_loss = None, self._step_loss
        try:
            yield self
        finally:
            self.draft.ttt_step_fn, self.step_loss = compiled

    def _step_loss(self, hid_rows, target_rows, trained, top):
        """One TTT step on its N gathered slots: (masked mean CE, stats row [4]).

        hid_rows [N,H] pre-norm outputs; target_rows [N,Vd] target logits over the draft vocabulary
        (soft) or [N] draft ids of the target's arg-max (hard); trained [N] float (arg-max in the draft
        vocabulary); top [N] the target's full-vocabulary arg-max."""
        logits = self.draft.head(hid_rows)  # [N,Vd]
        logp = torch.log_softmax(logits.float(), -1)
        if self.loss == "soft":
            ce = -(torch.softmax(target_rows.float(), -1) * logp).sum(-1)  # [N]
        else:
            ce = -logp.gather(-1, target_rows[:, None]).squeeze(-1)  # [N]
        n = trained.sum()
        loss = (ce * trained).sum() / n.clamp(min=1)
        with torch.no_grad():
            correct = (self.draft.to_target_ids(logits.argmax(-1)) == top).sum()
            st = torch.stack(
                [(ce.detach() * trained).sum(), n, correct.float(), torch.tensor(float(top.numel()), device=n.device)]
            )
        return loss, st

    def forward(self, feats, input_ids, valid, targets: "Targets"):
        # feats [B,L,F], input_ids/valid [B,L]; slot t (of T = L-1) at step i predicts position p = t+1+i's next token.
        b, seq = input_ids.shape
        length = seq - 1
        hidden = self.draft.project(feats[:, :length])  # [B,T,H]
        pos = torch.arange(length, device=input_ids.device)[None].expand(b, -1)
        batch, p = targets.rows // seq, targets.rows % seq  # [P] on the CPU
        device = hidden.device
        total = hidden.new_zeros((), dtype=torch.float32)
        stats = []
        for i, hid in self.draft.ttt_forward(input_ids[:, 1:], hidden, pos, valid[:, 1:], self.steps):
            sel = (p >= 1 + i).nonzero(as_tuple=True)[0]  # [N] rows of `targets` with a slot at step i
            slots = (batch[sel] * length + p[sel] - 1 - i).to(device, non_blocking=True)
            sel = sel.to(device, non_blocking=True)
            top, draft_top = targets.top[sel], targets.draft_top[sel]
            labels = targets.logits[sel] if self.loss == "soft" else draft_top.clamp(min=0)
            args = (hid.reshape(b * length, -1)[slots], labels, (draft_top >= 0).float(), top)
            if torch.is_grad_enabled() and hid.is_cuda and self.recompute_head:
                # GPU memory: the [N,Vd] logits/softmaxes are recomputed in backward, not kept per step.
                loss_i, st = torch.utils.checkpoint.checkpoint(self.step_loss, *args, use_reentrant=False)
            else:
                loss_i, st = self.step_loss(*args)
            total = total + (self.decay**i) * loss_i
            stats.append(st)
        return total, torch.stack(stats)


# ---- features and targets --------------------------------------------------------------------
class Features:
    """Target states for a batch: online (a target forward) or offline (precomputed shards)."""

    def __init__(self, target, layers, use_aux: bool, offline=None):
        self.target, self.layers, self.use_aux, self.offline = target, layers, use_aux, offline

    @torch.no_grad()
    def __call__(self, indices, ids, valid, device):
        if self.offline is not None:
            aux, last = self.offline.get(indices, ids.shape[1], want_aux=self.use_aux)  # pinned on CUDA
            aux = aux.to(device, non_blocking=True) if aux is not None else None
            last = last.to(device, non_blocking=True)
        else:
            aux, last, _ = target_states(self.target, ids, valid.long(), self.layers)
        return (aux if self.use_aux else final_feature(self.target, last)), last


@dataclass
class Targets:
    """The target's next-token distribution at the positions a micro-batch predicts (pred_mask true).

    rows [P] flat index b*L + p, on the CPU (int64); logits [P,Vd] target logits over the draft
    vocabulary; top [P] full-vocabulary arg-max; draft_top [P] its draft id, -1 outside the draft
    vocabulary (then the slot is scored but not trained)."""

    rows: torch.Tensor
    logits: torch.Tensor
    top: torch.Tensor
    draft_top: torch.Tensor


@torch.no_grad()
def targets_at(target, last, pred_mask, draft_ids, t2d, top=None, chunk: int = 8192) -> Targets:
    """From the pre-norm final state last [B,L,H] and pred_mask [B,L] (token p+1 is an assistant token):
    the Targets of the predicted positions only, in chunks of positions to bound memory. `top` [B,L]:
    the full-vocabulary arg-max when the caller has it already (then only the draft columns are computed)."""
    rows = pred_mask.cpu().reshape(-1).nonzero(as_tuple=True)[0]  # [P]
    at = rows.to(last.device)
    flat = last.reshape(-1, last.shape[-1])[at]  # [P,H]
    d_parts, top_parts = [], []
    for s in range(0, flat.shape[0], chunk):
        if top is None:
            full = logits_from_last(target, flat[s : s + chunk])  # [n,V]
            top_parts.append(full.argmax(-1))
            d_parts.append(full[:, draft_ids])
        else:
            d_parts.append(logits_from_last(target, flat[s : s + chunk], vocab_ids=draft_ids))  # [n,Vd]
    logits = torch.cat(d_parts) if d_parts else flat.new_zeros(0, len(draft_ids))
    if top is not None:
        top = top.reshape(-1)[at.to(top.device)].to(flat.device)
    else:
        top = torch.cat(top_parts) if top_parts else torch.zeros(0, dtype=torch.int64, device=flat.device)
    # the draft id of each arg-max: its rank among the sorted draft ids, where it is one
    draft_top = torch.where(t2d[top], torch.searchsorted(draft_ids, top), -1)
    return Targets(rows, logits, top, draft_top)
