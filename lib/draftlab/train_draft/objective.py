"""What one training step computes: epoch plans and batches, the TTT objective, features and targets.

Training-time test (TTT) unrolls the draft `ttt_steps` times with loss weight `step_decay`^i
against the target's distribution restricted to the draft vocabulary (docs/eagle3-contract.md 3).
"""

from __future__ import annotations

import math
import os
from contextlib import nullcontext

import torch
import torch.nn.functional as F
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
        for i in sorted(perm[c:c + chunk], key=lambda k: lengths[k]):
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

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}[name]
    return sdpa_kernel([backend])


# ---- the TTT objective -----------------------------------------------------------------------
def _shift(x: torch.Tensor, k: int, length: int) -> torch.Tensor:
    """x[:, k:k+length] zero-padded on the right to `length` (dim 1)."""
    y = x[:, k:k + length]
    if y.shape[1] < length:
        pad = [0, 0] * (x.dim() - 2) + [0, length - y.shape[1]]
        y = F.pad(y, pad)
    return y


class TTTObjective(nn.Module):
    """Wraps the draft so that DDP sees one forward per micro-batch: returns (loss, stats).

    stats [steps, 4] = (sum of soft CE over trained slots, trained slots, correct, scored slots).
    """

    def __init__(self, draft: Eagle3Draft, steps: int, decay: float):
        super().__init__()
        self.draft = draft
        self.steps = steps
        self.decay = decay

    def _step_loss(self, hid, target_d, trained, scored, target_top):
        """One TTT step: (masked mean soft CE, stats row [4]) from the step's pre-norm output.

        The head and both softmaxes run on the scored slots only (assistant tokens; prompt and
        padding slots are a third or more of a batch and would only be masked out afterwards)."""
        keep = scored.nonzero(as_tuple=True)
        trained, top = trained[keep].float(), target_top[keep]  # [N]
        logits = self.draft.head(hid[keep])  # [N,Vd]
        logp = torch.log_softmax(logits.float(), -1)
        p = torch.softmax(target_d[keep].float(), -1)
        ce = -(p * logp).sum(-1)  # [N]
        n = trained.sum()
        loss = (ce * trained).sum() / n.clamp(min=1)
        with torch.no_grad():
            correct = (self.draft.to_target_ids(logits.argmax(-1)) == top).sum()
            st = torch.stack([(ce.detach() * trained).sum(), n, correct.float(),
                              torch.tensor(float(top.numel()), device=n.device)])
        return loss, st

    def forward(self, feats, input_ids, valid, pred_mask, in_vocab, target_d, target_top):
        # feats [B,L,F]; everything else [B,L(,Vd)] indexed by position p; slot t uses p = t+1+i.
        length = input_ids.shape[1] - 1
        hidden = self.draft.project(feats[:, :length])  # [B,T,H]
        pos = torch.arange(length, device=input_ids.device)[None].expand(input_ids.shape[0], -1)
        total = hidden.new_zeros((), dtype=torch.float32)
        stats = []
        for i, hid in self.draft.ttt_forward(input_ids[:, 1:], hidden, pos, valid[:, 1:], self.steps):
            scored = _shift(pred_mask, 1 + i, length)  # [B,T] assistant token to predict
            trained = scored & _shift(in_vocab, 1 + i, length)
            args = (hid, _shift(target_d, 1 + i, length), trained, scored, _shift(target_top, 1 + i, length))
            if torch.is_grad_enabled() and hid.is_cuda:
                # GPU memory: the [B,T,Vd] logits/softmaxes are recomputed in backward, not kept per step.
                loss_i, st = torch.utils.checkpoint.checkpoint(self._step_loss, *args, use_reentrant=False)
            else:
                loss_i, st = self._step_loss(*args)
            total = total + (self.decay ** i) * loss_i
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
            aux, last = self.offline.get(indices, ids.shape[1], want_aux=self.use_aux)
            aux = aux.to(device) if aux is not None else None
            last = last.to(device)
        else:
            aux, last, _ = target_states(self.target, ids, valid.long(), self.layers)
        return (aux if self.use_aux else final_feature(self.target, last)), last


@torch.no_grad()
def soft_targets(target, last, draft_ids, t2d, chunk: int = 8192):
    """From the pre-norm final state: (target logits over the draft vocab [B,L,Vd], full arg-max [B,L],
    arg-max in draft vocab [B,L]); computed in chunks of positions to bound memory."""
    b, l, h = last.shape
    flat = last.reshape(b * l, h)
    d_parts, top_parts = [], []
    for s in range(0, flat.shape[0], chunk):
        full = logits_from_last(target, flat[s:s + chunk])  # [n,V]
        top_parts.append(full.argmax(-1))
        d_parts.append(full[:, draft_ids])
    target_d = torch.cat(d_parts).reshape(b, l, -1)
    top = torch.cat(top_parts).reshape(b, l)
    return target_d, top, t2d[top]
