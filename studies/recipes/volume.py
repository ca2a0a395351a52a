"""The recipe study's data-volume row: prompts of a larger blend that the reference run has not seen.

params/blend-offline-large.yaml draws every definition and template and is decontaminated against the
reference run's held-out split; its training split still holds the reference blend's own prompts. The
new ones (not in any reference split, by id or by user text) are the extra data, written compressed so
that a device session can regenerate them (the GPU machine has other packages, so it cannot blend them).
Regenerated there (ops/gpu/recipes.sh PHASE=regen), they grow the data-volume rows' train files (grow_rows).
"""

from __future__ import annotations

import hashlib
import lzma
import random
from collections import deque
from pathlib import Path

from draftlab.blend import dedup_text
from draftlab.core.errors import InputError
from draftlab.core.files import atomic_path
from draftlab.core.records import jsonl_line, read_jsonl
from studies.recipes.rows import EXTRA_ROWS, row_train_file


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


# a coding user's follow-ups on the same item (multi-turn prompts); {name} is its qualified name
FOLLOW_UPS = (
    "Can you write a unit test for that example?",
    "What are common mistakes when using `{name}`, and how do I avoid them?",
    "Rewrite the example so that it handles invalid input gracefully.",
    "Explain the example line by line.",
    "How would I do the same without `{name}`?",
    "Make the example shorter, and tell me what you left out.",
)


def multi_turn_prompts(extra: Path, skip: int, n: int, out: Path, seed: int = 0) -> dict:
    """`n` two-turn prompts from the extra prompts after the first `skip` (those already regenerated), written
    to `out` (.jsonl.xz): a user turn, an empty assistant turn for the target to answer, then a second user
    turn: half a follow-up on the same item (FOLLOW_UPS), half the next unused prompt of the same package (the
    user moves on within the library they are working with). Every user turn is an extra prompt, so the
    decontamination of extra_prompts holds. Regenerating fills both assistant turns in order."""
    pool = list(read_jsonl(extra))[skip:]
    rng = random.Random(seed)
    by_package: dict[str, deque] = {}
    for row in pool:
        by_package.setdefault(row.get("meta", {}).get("package", ""), deque()).append(row)
    used, rows = set(), []
    for first in pool:
        if len(rows) == n:
            break
        if first["id"] in used:
            continue
        used.add(first["id"])
        meta = first.get("meta", {})
        name = ".".join(x for x in (meta.get("module"), meta.get("qualname")) if x) or "it"
        same = by_package.get(meta.get("package", ""), deque())
        while same and same[0]["id"] in used:
            same.popleft()
        if same and rng.random() < 0.5:
            second = same.popleft()
            used.add(second["id"])
            follow, parts = f"Thanks. Another one from `{meta.get('package')}`: {user_text(second)}", [second["id"]]
        else:
            follow, parts = rng.choice(FOLLOW_UPS).format(name=name), []
        turns = [
            {"role": "user", "content": user_text(first)},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": follow},
        ]
        ids = [first["id"], *parts]
        rows.append(
            {
                "id": "mt-" + hashlib.sha1("+".join(ids + [follow]).encode()).hexdigest()[:17],
                "source": "multi-turn",
                "messages": turns,
                "meta": {"turns": 2, "from": ids, "follow_up": "next prompt" if parts else "same item"},
            }
        )
    if len(rows) < n:
        raise InputError(f"{extra}: {len(pool)} prompts after the first {skip} make {len(rows)} two-turn ones, not {n}")
    with atomic_path(out) as tmp, lzma.open(tmp, "wb") as f:
        f.writelines(jsonl_line(row) for row in rows)
    follow_ups = sum(1 for r in rows if r["meta"]["follow_up"] == "same item")
    return {"pool": len(pool), "written": n, "same_item": follow_ups, "next_prompt": n - follow_ups, "out": str(out)}


def multi_turn_held_out(val: Path, skip: int, n: int, out: Path, seed: int = 1) -> dict:
    """`n` held-out multi-turn prompts for the SGLang measurement, written to `out` (.jsonl): a regenerated
    held-out conversation (the target's own answer) after its first `skip` rows (those the training validates
    on), then a follow-up (FOLLOW_UPS) for the server to answer. Why the target's answer: a server's second turn
    follows its own first one."""
    rng, rows = random.Random(seed), []
    for i, row in enumerate(read_jsonl(val)):
        if i < skip or not answered(row):
            continue
        meta = row.get("meta", {})
        name = ".".join(x for x in (meta.get("module"), meta.get("qualname")) if x)
        follow = rng.choice([f for f in FOLLOW_UPS if name or "{name}" not in f]).format(name=name)
        rows.append({**row, "messages": [*row["messages"], {"role": "user", "content": follow}]})
        if len(rows) == n:
            break
    if len(rows) < n:
        raise InputError(f"{val}: {len(rows)} answered conversations after the first {skip}, fewer than {n}")
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        f.writelines(jsonl_line(row) for row in rows)
    return {"written": n, "out": str(out)}


def user_text(row: dict) -> str:
    """The first user turn's text of a prompt row."""
    return next(m["content"] for m in row["messages"] if m["role"] == "user")


def answered(row: dict) -> bool:
    """A regenerated conversation that ends in an answer of the target, none of its answers empty."""
    messages = row.get("messages") or [{}]
    answers = [m for m in messages if m.get("role") == "assistant"]
    return messages[-1].get("role") == "assistant" and all(m.get("content") for m in answers)


def grow_train(train: Path, parts: list[tuple[Path, int]], out: Path) -> dict:
    """`train`'s conversations followed, for each (regenerated, n) of `parts` in turn, by the first `n`
    answered ones of that set (prompts regenerated by the target) in `out`: a data-volume row's train file.
    InputError when a set has fewer."""
    extra = []
    for regenerated, n in parts:
        taken = []
        for row in read_jsonl(regenerated):
            if len(taken) == n:
                break
            if answered(row):
                taken.append(row)
        if len(taken) < n:
            raise InputError(f"{regenerated}: {len(taken)} answered conversations, fewer than the {n} asked for")
        extra += taken
    rows = list(read_jsonl(train))
    with atomic_path(out) as tmp, open(tmp, "wb") as f:
        f.writelines(jsonl_line(row) for row in rows + extra)
    return {"train": len(rows), "extra": len(extra), "out": str(out)}


def grow_rows(rows: list[str], train_file: str, regenerated: dict[str, str]) -> dict[str, dict]:
    """The data-volume rows' own train files (EXTRA_ROWS) not written yet: the study's train file followed
    by the row's share of each of its regenerated sets ({set: file}). Returns {row: counts} of those written now,
    and {row: {"skipped": why}} for a row with a set not given (not regenerated yet: a later call grows it)."""
    written = {}
    for row in (r for r in rows if r in EXTRA_ROWS):
        own = Path(row_train_file(row, train_file))
        if own.is_file():
            continue
        missing = [name for name, _ in EXTRA_ROWS[row] if name not in regenerated]
        if missing:
            written[row] = {"skipped": f"its regenerated set {missing[0]!r} is not given"}
            continue
        parts = [(Path(regenerated[name]), n) for name, n in EXTRA_ROWS[row]]
        written[row] = grow_train(Path(train_file), parts, own)
    return written
