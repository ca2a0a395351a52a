"""The draft vocabulary: the Vd most frequent target tokens over loss-masked positions.

Sorted by id (so d2t offsets are non-negative and monotone), padded with the lowest unused ids
0, 1, 2, ... when fewer distinct tokens were seen (EAGLE-3 convention, contract section 3).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch


def token_counts(samples, vocab_size: int) -> torch.Tensor:
    """[V] int64 counts of tokens at loss-masked positions (the tokens the draft must predict).

    One bincount over all rows. A bincount and a V-wide add per row took 3.0 s for 21,612 rows on
    the 2-core VM, but ~345 s on the H200 machine with two trainings side by side (16 cores, 16
    OpenMP threads each): every small parallel region fought for the cores (dev/LOG.md)."""
    ids: list[int] = []
    for s in samples:
        ids.extend(t for t, m in zip(s["input_ids"], s["loss_mask"]) if m)
    sel = torch.tensor(ids, dtype=torch.int64)
    if sel.numel() and int(sel.max()) >= vocab_size:
        bad = next(s for s in samples if any(m and t >= vocab_size for t, m in zip(s["input_ids"], s["loss_mask"])))
        top = max(t for t, m in zip(bad["input_ids"], bad["loss_mask"]) if m)
        raise ValueError(f"sample {bad.get('id')}: token id {top} >= vocab_size {vocab_size}")
    return torch.bincount(sel, minlength=vocab_size)


def build_draft_vocab(counts: torch.Tensor, draft_vocab_size: int) -> torch.Tensor:
    """[Vd] sorted target ids: the most frequent seen tokens, padded with the lowest unseen ids."""
    v = counts.numel()
    if not 0 < draft_vocab_size <= v:
        raise ValueError(f"draft_vocab_size {draft_vocab_size} must be in 1..{v}")
    seen = int((counts > 0).sum())
    k = min(seen, draft_vocab_size)
    # stable tie-break by id: sort by (-count, id)
    order = torch.argsort(-counts * (v + 1) + torch.arange(v), stable=True)
    chosen = order[:k]
    if k < draft_vocab_size:
        free = torch.ones(v, dtype=torch.bool)
        free[chosen] = False
        chosen = torch.cat([chosen, torch.nonzero(free).flatten()[: draft_vocab_size - k]])
    return chosen.sort().values


def coverage(counts: torch.Tensor, draft_ids: torch.Tensor) -> float:
    """Fraction of loss-masked tokens whose id is in the draft vocabulary."""
    total = int(counts.sum())
    return float(counts[draft_ids].sum()) / total if total else 0.0


def save_vocab(path, draft_ids: torch.Tensor, counts: torch.Tensor) -> None:
    Path(path).write_text(
        json.dumps(
            {
                "draft_ids": draft_ids.tolist(),
                "coverage": coverage(counts, draft_ids),
                "distinct_seen": int((counts > 0).sum()),
                "tokens": int(counts.sum()),
            }
        )
    )
