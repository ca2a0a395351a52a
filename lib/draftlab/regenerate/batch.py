"""The batch backend of regeneration: static large-batch `model.generate`, no server.

On a GPU transformers is launch-bound (a decode step costs about the same at any batch), so a
server with continuous batching tops out far below plain `generate` at a batch of thousands
(figures in dev/LOG.md). This backend writes exactly the records of the server backend
(`draftlab.regenerate`: shards, dropped.jsonl, errors.jsonl, manifest.json, resume by id,
tqdm progress, `draftlab monitor`), with `meta.regen.backend == "batch"`.

Rows are sorted by prompt length and cut into chunks of `batch_size`; each chunk is replayed turn
by turn (turn k of every row in the chunk, then turn k+1), and its rows are written when the
chunk ends, so a crash loses at most one chunk of work.

GPU run (one H200, bf16):
    draftlab regenerate RUN/data/blend/train.jsonl RUN/data/regen/train.work \
        --backend batch --target embedded --device cuda --batch-size 4096 \
        --max-tokens 512 --output RUN/data/regen/train.jsonl
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from draftlab.model.target import load_target
from draftlab.regenerate.config import RegenConfig, plan_turns, slots
from draftlab.regenerate.outputs import (
    Outputs,
    Progress,
    RunStats,
    WorkLock,
    build_row,
    outcome,
    scan_work,
    write_manifest,
)


def _finish(ids: list[int], text: str, eos: set[int], max_new: int, stop: list[str] | None):
    """(text, finish_reason, completion_tokens) of one generated sequence (pad = eos here)."""
    n = len(ids)
    for j, tok in enumerate(ids):
        if tok in eos:
            n = j
            break
    reason = "stop" if n < len(ids) else ("length" if len(ids) >= max_new else "stop")
    if stop:
        cuts = [text.find(s) for s in stop if s and s in text]
        if cuts:
            text, reason = text[: min(cuts)], "stop"
    return text, reason, n


def plan_batches(lengths: list[int], batch_size: int, batch_tokens: int, max_new: int) -> list[list[int]]:
    """Cut rows, already sorted by prompt length, into the fewest equal runs of consecutive rows in
    which each run has at most `batch_size` rows and, if `batch_tokens`, at most that many padded
    tokens (rows x (longest prompt + max_new): the KV cache a generate call holds at its end).

    Equal runs rather than full ones and a remainder: a decode step costs about the same at any batch
    here, so a small last run costs as much as a full one."""
    n = len(lengths)
    if n == 0:
        return []
    for k in range(-(-n // batch_size), n + 1):
        base, extra = divmod(n, k)  # k runs of base or base + 1 rows, the larger ones first (shorter prompts)
        ends = [(j + 1) * base + min(j + 1, extra) for j in range(k)]
        runs = [list(range(a, b)) for a, b in zip([0] + ends[:-1], ends)]
        if not batch_tokens or all(len(r) * (lengths[r[-1]] + max_new) <= batch_tokens for r in runs):
            return runs
    raise ValueError(f"a prompt of {lengths[-1]} tokens + {max_new} new exceeds batch_tokens {batch_tokens}")


def generate_turns(
    target,
    prompts: list[list[dict]],
    config: RegenConfig,
    batch_size: int,
    cache: str = "dynamic",
    batch_tokens: int = 0,
) -> list[dict]:
    """One assistant turn for each prompt (a message list), in static batches of at most
    `batch_size` rows and `batch_tokens` padded tokens (0: no token limit), see `plan_batches`.

    cache "static" preallocates the KV cache, which lets transformers compile the decode step on
    CUDA (fewer kernel launches per step, the bottleneck there); "dynamic" is plain generate."""
    import torch

    tok = target.tokenizer
    tok.padding_side = "left"
    eos = set(target.eos_token_ids)
    texts = [target.render(p, add_generation_prompt=True) for p in prompts]
    results: list[dict | None] = [None] * len(texts)
    lengths = [len(tok(t, add_special_tokens=False).input_ids) for t in texts]
    order = sorted(range(len(texts)), key=lambda i: lengths[i])
    limit = target.max_position_embeddings
    gen_kw = dict(max_new_tokens=config.max_tokens, pad_token_id=tok.pad_token_id, eos_token_id=sorted(eos))
    if config.temperature > 0:
        gen_kw.update(do_sample=True, temperature=config.temperature, top_p=config.top_p)
    else:
        gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
    if config.stop:
        gen_kw.update(stop_strings=list(config.stop), tokenizer=tok)
    if cache == "static":
        gen_kw.update(cache_implementation="static")
    elif cache != "dynamic":
        raise ValueError(f"cache must be 'dynamic' or 'static', got {cache!r}")
    runnable = []
    for i in order:
        if lengths[i] + config.max_tokens > limit:
            results[i] = {
                "error": f"prompt of {lengths[i]} tokens + max_tokens {config.max_tokens} "
                f"exceeds the context of {limit}"
            }
        elif batch_tokens and lengths[i] + config.max_tokens > batch_tokens:
            results[i] = {
                "error": f"prompt of {lengths[i]} tokens + max_tokens {config.max_tokens} "
                f"exceeds batch_tokens {batch_tokens}"
            }
        else:
            runnable.append(i)
    for run in plan_batches([lengths[i] for i in runnable], batch_size, batch_tokens, config.max_tokens):
        idx = [runnable[j] for j in run]
        enc = tok([texts[i] for i in idx], return_tensors="pt", padding=True, add_special_tokens=False).to(
            target.device
        )
        with torch.inference_mode():
            out = target.model.generate(**enc, **gen_kw)  # [b, prompt_len + new]
        new = out[:, enc.input_ids.shape[1] :].tolist()
        for i, ids in zip(idx, new):
            n_end = next((j for j, t in enumerate(ids) if t in eos), len(ids))
            text = tok.decode(ids[:n_end], skip_special_tokens=True)
            text, reason, n = _finish(ids, text, eos, config.max_tokens, config.stop)
            results[i] = {"text": text, "finish_reason": reason, "prompt_tokens": lengths[i], "completion_tokens": n}
    return results


def regenerate_batch(
    rows: list[dict],
    work: str | os.PathLike,
    config: RegenConfig,
    *,
    target="embedded",
    device: str = "auto",
    dtype=None,
    batch_size: int = 1024,
    input_path: str = "",
    progress: bool = True,
    cache: str = "dynamic",
    batch_tokens: int = 0,
    desc: str = "regenerate[batch]",
) -> dict:
    """Regenerate the unfinished rows with `generate`; `target` is a spec or a loaded Target."""
    work = Path(work)
    with WorkLock(work):
        return _regenerate_batch_locked(
            rows,
            work,
            config,
            target=target,
            device=device,
            dtype=dtype,
            batch_size=batch_size,
            input_path=input_path,
            progress=progress,
            cache=cache,
            batch_tokens=batch_tokens,
            desc=desc,
        )


def _regenerate_batch_locked(
    rows, work, config, *, target, device, dtype, batch_size, input_path, progress, cache, batch_tokens, desc
) -> dict:
    import torch

    state = scan_work(work)
    finished = state.finished
    todo = [r for r in rows if r["id"] not in finished and (config.retry_errors or r["id"] not in state.errors)]
    stats = RunStats(total=len(rows), skipped=len(rows) - len(todo))
    if isinstance(target, str):
        target = load_target(target, device=device, dtype=dtype)
    config.model_name = config.model_name if config.model_name != config.model else target.name
    where = f"transformers.generate:{target.device}:{str(target.dtype).replace('torch.', '')}"
    write_manifest(work, input_path, len(rows), config, "batch", [where], rows, state)
    out = Outputs(work, config)
    out.written |= finished
    bar = Progress(stats, progress, desc)
    plans = {r["id"]: plan_turns(r["messages"], config) for r in todo}
    # chunk rows by first-prompt length so a chunk pads little
    todo.sort(key=lambda r: sum(len(m["content"]) for m in plans[r["id"]][: slots(plans[r["id"]])[0]]))
    try:
        for c in range(0, len(todo), batch_size):
            chunk = todo[c : c + batch_size]
            t0 = time.time()
            if config.seed is not None:
                torch.manual_seed(config.seed + c)
            turns = {r["id"]: [] for r in chunk}
            failed: dict[str, str] = {}
            k = 0
            while True:
                active = [r for r in chunk if r["id"] not in failed and len(slots(plans[r["id"]])) > k]
                if not active:
                    break
                positions = [slots(plans[r["id"]])[k] for r in active]
                prompts = [plans[r["id"]][:p] for r, p in zip(active, positions)]
                results = generate_turns(target, prompts, config, batch_size, cache, batch_tokens)
                for r, p, res in zip(active, positions, results):
                    stats.requests += 1
                    if "error" in res:
                        failed[r["id"]] = f"turn {k}: {res['error']}"
                        continue
                    if not res["text"].strip():  # nothing to train on: a failed row, not a kept one
                        failed[r["id"]] = f"turn {k}: empty answer (finish_reason {res['finish_reason']!r})"
                        continue
                    plans[r["id"]][p] = {"role": "assistant", "content": res.pop("text")}
                    res["server"] = where
                    turns[r["id"]].append(res)
                k += 1
            for r in chunk:
                if r["id"] in failed:
                    stats.errors += 1
                    stats.error_reasons["empty answer" if "empty answer" in failed[r["id"]] else "prompt too long"] += 1
                    out.write_error({"id": r["id"], "reason": failed[r["id"]], "t": time.time()})
                else:
                    outcome(
                        out,
                        stats,
                        build_row(r, plans[r["id"]], turns[r["id"]], config, "batch", len(turns[r["id"]]), t0),
                    )
            bar.step(len(chunk))
    finally:
        bar.close()
        out.close()
    summary = stats.summary()
    summary["servers"] = {where: {"batch_size": batch_size, "batch_tokens": batch_tokens, "cache": cache}}
    return summary


# ---- benchmark: output tokens/s of the batch backend by batch size --------------------------
def sweep_batch_sizes(
    target,
    prompts: list[list[dict]],
    batch_sizes: list[int],
    new_tokens: int = 64,
    cache: str = "dynamic",
    repeats: int = 1,
) -> list[dict]:
    """Tokens/s of `generate` at each batch size on the first user turns of real prompts.

    Every row is forced to `new_tokens` (min_new_tokens), so each batch size does the same work per
    row and the figure is decode throughput at that batch, prefill included. Each batch is the `b`
    prompts around the median length (cycled when there are fewer). The median of `repeats` runs
    is kept."""
    import statistics

    import torch

    tok = target.tokenizer
    tok.padding_side = "left"
    texts = [target.render(p[:1], add_generation_prompt=True) for p in prompts]
    # prompts of median length, as in a middle chunk of the real run (which sorts by length): an
    # unsorted slice pads every row to its longest prompt and measures padding, or runs out of memory
    texts.sort(key=lambda t: len(tok(t, add_special_tokens=False).input_ids))
    gen_kw = dict(
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        do_sample=False,
        temperature=None,
        top_p=None,
        top_k=None,
        pad_token_id=tok.pad_token_id,
    )
    if cache == "static":
        gen_kw["cache_implementation"] = "static"
    cuda = str(target.device).startswith("cuda")
    # one untimed call first: CUDA context, kernels and allocator pools would otherwise be charged to
    # the first size (dev/LOG.md, the reference run's batch-size sweep: batch 2,048, run first without it)
    warm = tok(
        texts[len(texts) // 2 : len(texts) // 2 + 8], return_tensors="pt", padding=True, add_special_tokens=False
    ).to(target.device)
    with torch.inference_mode():
        target.model.generate(**warm, **{**gen_kw, "max_new_tokens": 4, "min_new_tokens": 4})
    rows = []
    for b in batch_sizes:
        start = max(0, (len(texts) - b) // 2)
        batch = [texts[(start + i) % len(texts)] for i in range(b)]
        enc = tok(batch, return_tensors="pt", padding=True, add_special_tokens=False).to(target.device)
        times = []
        for _ in range(repeats):
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            with torch.inference_mode():
                out = target.model.generate(**enc, **gen_kw)  # [b, prompt + new_tokens]
            if out.shape[1] - enc.input_ids.shape[1] != new_tokens:
                raise RuntimeError(
                    f"batch {b}: generate made {out.shape[1] - enc.input_ids.shape[1]} tokens, not {new_tokens}"
                )
            if cuda:
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        wall = statistics.median(times)
        row = {
            "batch_size": b,
            "cache": cache,
            "new_tokens": new_tokens,
            "prompt_len_padded": enc.input_ids.shape[1],
            "seconds": round(wall, 4),
            "output_tok_s": round(b * new_tokens / wall, 1),
            "ms_per_step": round(1000 * wall / new_tokens, 2),
            "repeats": repeats,
        }
        if cuda:
            row["peak_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
            torch.cuda.reset_peak_memory_stats()
        print(json.dumps(row), flush=True)
        rows.append(row)
        del enc
    return rows
