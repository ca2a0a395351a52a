"""`draftlab bench blend`: rows/s of the whole pipeline on synthetic conversations."""

from __future__ import annotations

import math
import os
import random
import time

from draftlab.blend.pipeline import run_pipeline
from draftlab.blend.spec import load_spec
from draftlab.blend.text import TokenCounter
from draftlab.core.process import usable_cpus
from draftlab.dataset_discovery import offline
from draftlab.dataset_discovery import sources as S
from draftlab.model.target import load_tokenizer

# ------------------------------------------------------------------------------- benchmark


def synthetic_raw_rows(n: int, seed: int = 0) -> dict[str, list]:
    """n raw rows in three schemas (Alpaca, ShareGPT, OpenAI messages) cut from the stdlib's source.

    Realistic text, with known fractions of exact duplicates (4%), near duplicates (3%),
    HumanEval-contaminated rows (0.3%) and bad rows (0.5%) so every stage has work to do.
    """
    rng = random.Random(seed)
    corpus = "".join(p.read_text(errors="replace") for _, p in sorted(offline.stdlib_files())[:400])
    he = offline.humaneval_texts()
    out: dict[str, list] = {"alpaca": [], "sharegpt": [], "openai_messages": []}
    made: list[tuple[str, str]] = []

    def window(median: int) -> str:
        size = int(min(8000, max(20, rng.lognormvariate(math.log(median), 0.8))))
        start = rng.randrange(0, len(corpus) - size)
        return corpus[start : start + size]

    for i in range(n):
        r = rng.random()
        if made and r < 0.04:
            user, answer = made[rng.randrange(len(made))]
        elif made and r < 0.07:
            user, answer = made[rng.randrange(len(made))]
            words = user.split(" ")
            if len(words) > 20:
                words[rng.randrange(len(words))] = "changed"
            user = " ".join(words)
        else:
            user = "Explain what this code does and suggest one improvement:\n\n" + window(250)
            answer = window(700)
            if r > 0.997:
                answer += "\n" + he[rng.randrange(len(he))]
        made.append((user, answer))
        bad = rng.random() < 0.005
        fam = ("alpaca", "sharegpt", "openai_messages")[i % 3]
        if fam == "alpaca":
            row = {"instruction": user, "input": "", "output": answer}
            if bad:
                row["output"] = None
        elif fam == "sharegpt":
            row = {"conversations": [{"from": "human", "value": user}, {"from": "gpt", "value": answer}]}
            if bad:
                row["conversations"][1]["from"] = "narrator"
        else:
            row = {"messages": [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]}
            if bad:
                row["messages"][0]["content"] = "   "
        out[fam].append(row)
    return out


def bench_blend(n: int = 100_000, tokenizer: str | None = "tiny", seed: int = 0, progress: bool = False) -> dict:
    """Time normalize + token filter + exact/near dedup + decontamination + split on n conversations."""
    raw = synthetic_raw_rows(n, seed)
    tok = None if tokenizer in (None, "none") else load_tokenizer(tokenizer)
    counter = TokenCounter(tok)
    spec = load_spec(
        {
            "name": "bench",
            "seed": seed,
            "tokenizer": tokenizer or "none",
            "sources": [{"name": k, "kind": "local", "path": f"<memory:{k}>"} for k in raw],
        }
    )
    t0, cpu0 = time.perf_counter(), time.process_time()
    conversations, rejects = [], []
    for fam, rows in raw.items():
        norm = S.normalize(rows, fam, S.ADAPTERS_BY_NAME[fam])
        conversations += norm.conversations
        rejects += norm.rejects
    t_norm = time.perf_counter() - t0
    result = run_pipeline(conversations, spec, counter, progress=progress)
    total, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    kept = sum(result.report["splits"].values())
    tokens = sum(r["meta"]["n_tokens"] for rows in result.splits.values() for r in rows)
    return {
        "rows": n,
        "seconds": round(total, 2),
        "rows_per_s": round(n / total, 1),
        "cpu_s": round(cpu, 2),  # CPU time of all threads: what the run costs whatever else the machine does
        "normalize_s": round(t_norm, 2),
        "stages_s": result.report["timings_s"],
        "rejected": len(rejects),
        "dropped": result.report["dropped"],
        "kept": kept,
        "kept_tokens_mean": round(tokens / max(kept, 1), 1),
        "tokenizer": counter.name,
        "cpus_usable": usable_cpus(),
        "load_average_1min": round(os.getloadavg()[0], 2),
    }
