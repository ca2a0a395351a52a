"""The recipe study's data-volume row: prompts of a larger blend that the reference run has not seen.

params/blend-offline-large.yaml draws every definition and template and is decontaminated against the
reference run's held-out split; its training split still holds the reference blend's own prompts. The
new ones (not in any reference split, by id or by user text) are the extra data, written compressed so
that a device session can regenerate them (the GPU machine has other packages, so it cannot blend them).
"""

from __future__ import annotations

import lzma
from pathlib import Path

from draftlab.blend import dedup_text
from draftlab.core.errors import InputError
from draftlab.core.files import atomic_path
from draftlab.core.records import jsonl_line, read_jsonl


def extra_prompts(blend_train: Path, seen: list[Path], n: int, out: Path) -> dict:
    """The first `n` rows of `blend_train` (the blend's shuffled order) whose id and user text are in none
    of the `seen` files, written to `out` (.jsonl.xz). Returns the counts."""
    ids, texts = set(), set()
    for path in seen:
        for row in read_jsonl(path):
            ids.add(row["id"])
            texts.add(dedup_text(row))
    candidates = list(read_jsonl(blend_train))
    new = [r for r in candidates if r["id"] not in ids and dedup_text(r) not in texts]
    if len(new) < n:
        raise InputError(f"{blend_train}: {len(new)} prompts the reference has not seen, fewer than {n}")
    with atomic_path(out) as tmp, lzma.open(tmp, "wb") as f:
        f.writelines(jsonl_line(row) for row in new[:n])
    return {"candidates": len(candidates), "seen_rows": len(ids), "new": len(new), "written": n, "out": str(out)}
