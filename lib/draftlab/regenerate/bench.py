"""`draftlab bench client`: our regeneration client against a bare openai-SDK gather, same server."""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path

from draftlab.core.serve import require_reachable
from draftlab.regenerate.config import RegenConfig
from draftlab.regenerate.stage import regenerate, run_sync

# ------------------------------------------------------------------ client-overhead benchmark


def bench_prompts(n: int, seed: int = 0) -> list[dict]:
    """Short, varied chat prompts for throughput measurements (no dataset needed)."""
    rng = random.Random(seed)
    topics = [
        "rivers",
        "prime numbers",
        "bread",
        "volcanoes",
        "chess",
        "owls",
        "batteries",
        "tides",
        "jazz",
        "glaciers",
        "bicycles",
        "honey",
        "comets",
        "maps",
        "clocks",
    ]
    asks = [
        "Explain {} to a child.",
        "Write three facts about {}.",
        "Why do people like {}?",
        "Describe {} in one paragraph.",
        "What is the history of {}?",
    ]
    rows = []
    for i in range(n):
        text = rng.choice(asks).format(rng.choice(topics))
        rows.append(
            {"id": f"bench-{i:05d}", "source": "bench", "messages": [{"role": "user", "content": text}], "meta": {}}
        )
    return rows


async def _bench_openai(base_url: str, rows: list[dict], config: RegenConfig) -> dict:
    """The reference: bare asyncio.gather over the openai SDK, a semaphore for the concurrency."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(
        base_url=f"{base_url.rstrip('/')}/v1", api_key="not-needed", timeout=config.request_timeout, max_retries=0
    )
    sem = asyncio.Semaphore(config.concurrency)
    extra = {"stop": config.stop} if config.stop else {}

    async def one(row):
        async with sem:
            r = await client.chat.completions.create(
                model=config.model,
                messages=row["messages"],
                max_tokens=config.max_tokens,
                temperature=config.temperature,
                top_p=config.top_p,
                **extra,
            )
            return r.usage.completion_tokens

    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(r) for r in rows))
    wall = time.perf_counter() - t0
    await client.close()
    return {"tokens": sum(tokens), "wall_s": wall, "tok_s": sum(tokens) / wall}


def bench_client(
    base_url: str,
    model: str,
    *,
    n: int = 64,
    concurrency: int = 8,
    max_tokens: int = 32,
    rounds: int = 4,
    work: str | os.PathLike | None = None,
    seed: int = 0,
) -> dict:
    """Our client (full path: resume scan, records, shard writes) vs bare openai SDK gather.

    Same server, prompts, concurrency and sampling (greedy). Rounds alternate which client goes
    first (ABBA) so drift and neighbours' load hit both; reported: the ratio of total tokens/s
    and the median of the per-round paired ratios (ours / SDK; >= 1.0: no client overhead).
    At hundreds of requests in flight the SDK is itself client-bound (one httpx pool; dev/LOG.md
    dev/LOG.md), so a ratio says nothing about the feed there: measure that against a fake server
    (benchmarks/regen_feed.py)."""
    import statistics
    import tempfile

    require_reachable(base_url)  # both clients would otherwise fail deep inside a round
    config = RegenConfig(
        model=model, max_tokens=max_tokens, concurrency=concurrency, temperature=0.0, truncation="keep_flag"
    )
    rows = bench_prompts(n, seed)
    base = Path(work) if work else Path(tempfile.mkdtemp(prefix="draftlab-bench-"))

    def ours(k):
        t0 = time.perf_counter()
        s = regenerate(rows, base / f"round{k}", [base_url], config, progress=False)
        wall = time.perf_counter() - t0
        if s["rows_done"] != n:
            raise RuntimeError(f"our client finished {s['rows_done']} of {n} rows: {s}")
        return {"tokens": s["completion_tokens"], "wall_s": wall, "tok_s": s["completion_tokens"] / wall}

    run_sync(_bench_openai(base_url, rows[: min(8, n)], config))  # warm-up, not counted
    results = {"ours": [], "openai_sdk": []}
    for k in range(rounds):
        order = ("ours", "openai_sdk") if k % 2 else ("openai_sdk", "ours")
        for name in order:
            results[name].append(ours(k) if name == "ours" else run_sync(_bench_openai(base_url, rows, config)))
    if not work:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    tot = {k: sum(r["tokens"] for r in v) / sum(r["wall_s"] for r in v) for k, v in results.items()}
    paired = [a["tok_s"] / b["tok_s"] for a, b in zip(results["ours"], results["openai_sdk"])]
    return {
        "base_url": base_url,
        "n": n,
        "concurrency": concurrency,
        "max_tokens": max_tokens,
        "rounds": results,
        "ours_tok_s": tot["ours"],
        "openai_sdk_tok_s": tot["openai_sdk"],
        "ratio": tot["ours"] / tot["openai_sdk"],
        "ratio_median": statistics.median(paired),
        "paired_ratios": paired,
    }
