"""The recipe study's broad set: prompts of several kinds written by the target itself (Magpie), so that a
draft sees the target's answers on the kinds of traffic it will serve, not only docstring-derived coding
questions.

Summaries take passages of real prose first (draftlab.dataset_discovery.prose: installed READMEs and the
Python language reference, none in an evaluation set), as many as there are, and the target writes the rest.
Each kind starts its user turns with openings the target continues (a kept row holds the whole user turn;
a 135M target follows an opening such as "Write a Python function that" where it only paraphrases a system
prompt that describes the user) and takes a share of the set; chat is plain Magpie (no opening).
`draftlab prompts generate` screens, deduplicates and decontaminates every kind against the evaluation suite.
The kinds follow the suite's general sets: chat, math word problems, code, writing tasks with constraints,
summaries of a passage. Two-turn data is the study's multi-turn set. Made on the GPU machine against SGLang
servers of the target (ops/gpu/recipes.sh PHASE=regen REGEN_SET=broad), then answered like the other sets.
"""

from __future__ import annotations

import lzma
from pathlib import Path

from draftlab.blend import dedup_text
from draftlab.core.errors import InputError
from draftlab.core.files import atomic_path
from draftlab.core.overlap import EvalIndex
from draftlab.core.records import jsonl_line, read_jsonl
from draftlab.dataset_discovery.eval_sets import all_eval_texts
from draftlab.dataset_discovery.generated_prompts import GenConfig, generate
from draftlab.dataset_discovery.prose import prose_conversations

# kind -> (the openings its user turns start with, in turn, each without a trailing space: the target writes the
# next word's space itself; share of the set; longest user turn in tokens: a passage to summarise needs more)
KINDS = {
    "chat": ((), 0.30, 256),
    "math": (
        (
            "I have a math word problem.",
            "My homework has this word problem:",
            "Can you help me solve this problem step by step?",
            "A question about prices and change:",
            "How many",
        ),
        0.20,
        256,
    ),
    "code": (
        (
            "Write a Python function that",
            "How do I",
            "Can you explain what this Python code does?\n\n",
            "I get an error when I run my Python script:",
            "What is the difference between",
        ),
        0.15,
        256,
    ),
    "instructions": (
        (
            "Write a short",
            "Write a poem about",
            "Give me a list of",
            "Write an email to",
            "In exactly three sentences,",
        ),
        0.20,
        256,
    ),
    "summaries": (
        (
            "Summarize the following passage in three sentences.\n\n",
            "Summarize this article:\n\n",
            "Give me a short summary of this text:\n\n",
        ),
        0.15,
        512,
    ),
}


FROM_PROSE = ("summaries",)  # kinds that take real passages first (the target's own are thin)


def kind_counts(n: int) -> dict[str, int]:
    """Each kind's share of `n` prompts in whole prompts (largest remainders), summing to `n`."""
    exact = {kind: n * share for kind, (_, share, _) in KINDS.items()}
    counts = {kind: int(x) for kind, x in exact.items()}
    for kind in sorted(exact, key=lambda k: exact[k] - counts[k], reverse=True)[: n - sum(counts.values())]:
        counts[kind] += 1
    return counts


def broad_prompts(
    base_urls: list[str],
    model: str,
    n: int,
    work: Path,
    out: Path,
    tokenizer: str | None = None,
    concurrency: int = 64,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """`n` prompts over KINDS: for a kind of FROM_PROSE the prose passages that no evaluation set overlaps
    first, then `draftlab prompts generate` for the rest of each kind into WORK/<kind>.jsonl (each resumes);
    then every kind in turn into `out` (.jsonl.xz, meta.kind set), a text another kind already wrote left out.
    Returns {kind: generate's counts and the prose passages taken} and the rows written."""
    if n < len(KINDS):
        raise InputError(f"--n {n}: at least {len(KINDS)} (one prompt a kind)")
    work.mkdir(parents=True, exist_ok=True)
    summary, rows = {}, {}
    for kind, count in kind_counts(n).items():
        openings, _, max_tokens = KINDS[kind]
        taken = prose_rows(count) if kind in FROM_PROSE else []
        written = []
        summary[kind] = {"prose": len(taken)}
        if count > len(taken):
            cfg = GenConfig(
                base_urls=list(base_urls),
                model=model,
                n=count - len(taken),
                out=str(work / f"{kind}.jsonl"),
                tokenizer=tokenizer,
                openings=openings,
                max_tokens=max_tokens,
                seed=seed,
                concurrency=concurrency,
            )
            summary[kind] |= generate(cfg, progress=progress)
            written = list(read_jsonl(cfg.out))
        rows[kind] = [{**r, "meta": {**r.get("meta", {}), "kind": kind}} for r in taken + written]
    seen, count = set(), 0
    with atomic_path(out) as tmp, lzma.open(tmp, "wb") as f:
        for i in range(max(map(len, rows.values()))):
            for kind in KINDS:
                if i < len(rows[kind]) and dedup_text(rows[kind][i]) not in seen:
                    seen.add(dedup_text(rows[kind][i]))
                    f.write(jsonl_line(rows[kind][i]))
                    count += 1
    return {"kinds": summary, "written": count, "out": str(out)}


def prose_rows(limit: int) -> list[dict]:
    """Up to `limit` requests to summarise a prose passage that overlaps no evaluation set."""
    index = EvalIndex(all_eval_texts())
    clean = (r for r in prose_conversations() if not index.hits(r["messages"][0]["content"]))
    return [r for _, r in zip(range(limit), clean)]
