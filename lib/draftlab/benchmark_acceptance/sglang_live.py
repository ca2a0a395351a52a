"""Measured in SGLang: servers started from a plan, the same token ids sent to each, one table.

Why: the speed that counts is SGLang's, against its own plain decoding on the same prompts and
the same `--max-running-requests`. Each plan entry (draftlab.bench.sweep_plan's launch commands)
becomes a real server; all start at once on the one GPU (start-up, mostly CUDA-graph capture, is
not measured: the first window waits for all of them) and are then measured in rounds, one server
at a time while the others idle, each round every server's turn. Requests go to
`/generate` with `input_ids` (the engine's own prompt ids, so engine and server see the same
tokens) at temperature 0. Per window: tokens/s, and acceptance = sum(completion_tokens) /
sum(spec_verify_ct) from meta_info (contract §5); after the windows `/server_info`'s lifetime
average is kept beside it as a cross-check. The first batch-1 window's output ids are compared
with the baseline's: identical-output rate and common-prefix length (bf16 is not bit-lossless
in SGLang either).

Resumable: each turn appends its windows to `OUT/windows.jsonl` (`repeat`: the round) and the
first round its outputs to `OUT/outputs/<label>.jsonl`; a rerun measures only the entries not yet there.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from draftlab.benchmark_acceptance.breakeven import curve, fit_costs
from draftlab.benchmark_acceptance.live import (
    Usage,
    Window,
    flush_cache,
    measured_window,
    parse_response,
    summarize_windows,
)
from draftlab.core.process import ServerStartError, stop_stale
from draftlab.core.records import append_jsonl, read_jsonl
from draftlab.core.stop import graceful_stop
from draftlab.sglang.server import SGLangServer

__all__ = [
    "Entry",
    "PER_STREAM",
    "read_windows",
    "Reply",
    "run_window",
    "measure",
    "agreement",
    "summarize",
    "slug",
    "cycle_rates",
    "fit_server_costs",
]


PER_STREAM = 4  # prompts per stream in a window at concurrency > 1


@dataclass
class Entry:
    """One server of a study: its label, launch command and what to measure on it."""

    label: str
    command: str
    concurrency: list[int] = field(default_factory=lambda: [1])
    steps: int | None = None
    topk: int | None = None
    draft_tokens: int | None = None
    algorithm: str | None = None  # None: the plain baseline
    variant: str | None = None  # a named set of extra server flags (bench sglang --variant); None: the study's


@dataclass
class Reply:
    index: int
    output_ids: list[int]
    usage: Usage


def slug(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label).strip("_")


def _generate_body(ids: list[int], max_new_tokens: int) -> dict:
    return {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens}}


def _output_ids(body: dict, where: str) -> list[int]:
    ids = body.get("output_ids")
    if not isinstance(ids, list):
        raise ValueError(f"{where}: no 'output_ids' list in the /generate answer (keys {sorted(body)})")
    return [int(t) for t in ids]


async def run_window(
    client: httpx.AsyncClient, url: str, prompt_ids: list[list[int]], concurrency: int, max_new_tokens: int
) -> tuple[list[Reply], list[str], float]:
    """All prompts through /generate with at most `concurrency` in flight; (replies, errors, wall s)."""
    sem = asyncio.Semaphore(concurrency)
    errors: list[str] = []

    async def one(i: int, ids: list[int]):
        async with sem:
            where = f"{url}/generate prompt {i}"
            try:
                r = await client.post(f"{url}/generate", json=_generate_body(ids, max_new_tokens))
                r.raise_for_status()
                body = r.json()
                return Reply(i, _output_ids(body, where), parse_response(body, where))
            except (httpx.HTTPError, ValueError) as exc:
                errors.append(f"prompt {i}: {type(exc).__name__}: {exc}")
                return None

    t0 = time.perf_counter()
    got = await asyncio.gather(*(one(i, p) for i, p in enumerate(prompt_ids)))
    return [g for g in got if g is not None], errors, time.perf_counter() - t0


def _server_accept_length(info: dict | None) -> float | None:
    """`internal_states[0].avg_spec_accept_length` of /server_info (a server-lifetime average)."""
    if not info:
        return None
    states = info.get("internal_states") or [{}]
    value = states[0].get("avg_spec_accept_length") if isinstance(states[0], dict) else None
    return float(value) if isinstance(value, (int, float)) else None


def measure_server(
    url: str,
    entry: Entry,
    prompt_ids: list[list[int]],
    *,
    warmup: int,
    max_new_tokens: int,
    samples: int | None = None,
    per_stream: int = PER_STREAM,
    timeout: float = 600.0,
    transport=None,
) -> tuple[list[Window], list[Reply]]:
    """One server's turn: per concurrency `warmup` unmeasured windows, then one flushed, measured one
    (measure() takes its repeats in rounds over all servers); the replies of the window at the entry's
    first concurrency (batch 1 in a study). (Measured on the H200: with 4
    warm-up prompts the first server measured ran its first three batch-1 windows at 490 tok/s and its
    fifth at 736: the kernels were still compiling.)

    Batch 1 sends the first `samples` prompts (all when None); concurrency c sends the first
    max(samples, per_stream * c), so that c streams stay busy for most of the window instead of
    draining a list shorter than c (the throughput figure would then be a smaller batch's)."""
    samples = len(prompt_ids) if samples is None else samples

    def window_prompts(c: int) -> list[list[int]]:
        return prompt_ids[: samples if c == 1 else max(samples, per_stream * c)]

    async def go():
        windows, first = [], None
        limits = httpx.Limits(max_connections=max(entry.concurrency) + 4)
        async with httpx.AsyncClient(timeout=timeout, limits=limits, transport=transport) as client:
            for c in entry.concurrency:
                for _ in range(warmup):  # unmeasured: triton compiles kernels per new shape on first use
                    await run_window(client, url, window_prompts(c), c, max_new_tokens)
                flushed = await flush_cache(client, url)
                replies, errors, wall = await run_window(client, url, window_prompts(c), c, max_new_tokens)
                if not replies:
                    raise RuntimeError(f"{entry.label}: every request failed; first: {errors[0]}")
                usages = [r.usage for r in replies]
                # repeat 0: measure() records the round as `repeat`
                windows.append(measured_window(entry.label, url, c, 0, usages, wall, flushed, len(errors), True))
                if first is None:
                    first = sorted(replies, key=lambda r: r.index)
        return windows, first or []

    return asyncio.run(go())


def agreement(baseline: list[list[int]], other: list[list[int]]) -> dict:
    """Identical outputs and the mean common prefix (tokens) of two runs over the same prompts."""
    if len(baseline) != len(other):
        raise ValueError(f"agreement: {len(baseline)} baseline outputs vs {len(other)}")

    def prefix(a, b):
        n = 0
        for x, y in zip(a, b):
            if x != y:
                break
            n += 1
        return n

    prefixes = [prefix(a, b) for a, b in zip(baseline, other)]
    return {
        "identical": sum(a == b for a, b in zip(baseline, other)),
        "prompts": len(baseline),
        "mean_common_prefix": sum(prefixes) / len(prefixes) if prefixes else None,
        "mean_baseline_tokens": sum(map(len, baseline)) / len(baseline) if baseline else None,
    }


def read_windows(out: str | Path) -> list[dict]:
    """OUT/windows.jsonl: one row per measured window, with what measure() records beside it."""
    return list(read_jsonl(Path(out) / "windows.jsonl", skip_torn_tail=False))  # a bad line is an error


def _done_labels(out: Path) -> set[str]:
    return {row["label"] for row in read_windows(out)} if (out / "windows.jsonl").is_file() else set()


def measure(
    entries: list[Entry],
    prompt_ids: list[list[int]],
    out: str | Path,
    *,
    repeats: int = 3,
    warmup: int = 1,
    max_new_tokens: int = 128,
    env: dict | None = None,
    python: str | None = None,
    startup_timeout: float = 900.0,
    samples: int | None = None,
    server=None,
) -> list[str]:
    """Start every server of `entries` not yet measured in `out`, all at once, then measure them in
    `repeats` rounds: each round one window per concurrency of every server in turn (the first round
    after `warmup` unmeasured windows each). Why rounds: windows of one server taken back to back drift
    together (measured one server after another: a draft with base's acceptance read 0.75x base's
    batch-1 tok/s), so each server's windows are spread over the same stretch of time as the others'.
    All servers stay up until the last round. Returns the labels measured now. A first SIGTERM/SIGINT
    lets the server's turn in progress finish (its windows are appended as they end), stops every server
    and raises core.stop.Stopped: an entry with a round done counts as measured (its windows so far),
    one with none is measured by the rerun. `server(entry, log_path)` builds the server process
    (default: an SGLangServer from the entry's launch command)."""
    with graceful_stop(f"rerun the same command to continue (windows so far: {Path(out) / 'windows.jsonl'})") as stop:
        return _measure(entries, prompt_ids, Path(out), repeats, warmup, max_new_tokens, env, python,
                        startup_timeout, samples, server, stop)  # fmt: skip


def _measure(entries, prompt_ids, out, repeats, warmup, max_new_tokens, env, python, startup_timeout, samples, server,
             stop) -> list[str]:  # fmt: skip
    stop_stale()
    todo = [e for e in entries if e.label not in _done_labels(out)]
    server = server or (
        lambda e, log: SGLangServer(e.command, log, python=python, startup_timeout=startup_timeout, env=env)
    )
    servers = {e.label: server(e, out / "servers" / f"{slug(e.label)}.log") for e in todo}
    measured = []
    try:
        for srv in servers.values():
            srv.launch()
        running = []
        for e in todo:  # all up before the first window: start-up (graph capture) would disturb it
            if stop:
                stop.stopped(f"SGLang measurement {out}: before {e.label} was ready")
            try:
                servers[e.label].wait_ready()
                running.append(e)
                print(f"{e.label}: ready after {servers[e.label].startup_s:.0f} s", flush=True)
            except ServerStartError as exc:
                append_jsonl(out / "failures.jsonl", [{"label": e.label, "error": str(exc)[-2000:]}])
                print(f"{e.label}: did not start: {str(exc).splitlines()[0]}", flush=True)
        for rnd in range(repeats):
            for e in list(running):
                if stop:
                    stop.stopped(f"SGLang measurement {out}: round {rnd + 1} of {repeats}, before {e.label}")
                if _measure_turn(
                    servers[e.label], e, rnd, prompt_ids, out, warmup if rnd == 0 else 0, max_new_tokens, samples
                ):
                    if rnd == 0:
                        measured.append(e.label)
                else:
                    running.remove(e)
    finally:
        for srv in servers.values():
            srv.stop()
    return measured


def _measure_turn(srv, e: Entry, rnd: int, prompt_ids, out: Path, warmup: int, max_new_tokens: int, samples) -> bool:
    """One server's turn in round `rnd`: its windows appended to OUT/windows.jsonl (the first round's
    replies to OUT/outputs/); False, with the server stopped and the failure recorded, if it broke."""
    t0 = time.perf_counter()
    try:
        windows, first = measure_server(
            srv.base_url, e, prompt_ids, warmup=warmup, max_new_tokens=max_new_tokens, samples=samples
        )
    except (RuntimeError, httpx.HTTPError) as exc:  # one broken server must not cost the others
        srv.stop()
        append_jsonl(out / "failures.jsonl", [{"label": e.label, "error": f"measuring: {exc}"[-2000:]}])
        print(f"{e.label}: failed while measured: {exc} (log {srv.log_path})", flush=True)
        return False
    info = srv.server_info()
    extra = {
        "server_avg_accept_length": _server_accept_length(info),  # the server's lifetime average so far
        "startup_s": srv.startup_s,
        "steps": e.steps,
        "topk": e.topk,
        "draft_tokens": e.draft_tokens,
        "algorithm": e.algorithm,
        "variant": e.variant,
        "command": e.command,
        # the host's load over the last minute, taken after the windows: idle servers that spin show here
        "load_1min": os.getloadavg()[0],
    }
    if rnd == 0:
        append_jsonl(
            out / "outputs" / f"{slug(e.label)}.jsonl",
            [{"index": r.index, "output_ids": r.output_ids, **asdict(r.usage)} for r in first],
        )
    append_jsonl(out / "windows.jsonl", [{**asdict(w), "repeat": rnd, **extra} for w in windows])
    line = ", ".join(
        f"c={w.concurrency} {w.tokens_per_s:.0f} tok/s"
        + (f" acc {w.acceptance_length:.3f}" if w.acceptance_length else "")
        for w in windows
    )
    print(f"{e.label} (round {rnd + 1}): {line} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return True


def summarize(out: str | Path, baseline: str = "baseline"):
    """The study's table: per (label, concurrency) tok/s ± CI, pooled acceptance, speedup against
    the baseline at the same concurrency, the server's own average, and agreement with the baseline."""
    out = Path(out)
    rows = read_windows(out)
    fields = Window.__dataclass_fields__
    # samples per (label, concurrency): batch 1 the oracle's prompts, more at higher concurrency
    # windows written before a field existed (server_s) take its default
    table = summarize_windows([Window(**{k: r[k] for k in fields if k in r}) for r in rows], baseline=baseline)
    extra = {r["label"]: r for r in rows}
    for key in ("algorithm", "steps", "topk", "draft_tokens", "server_avg_accept_length", "startup_s"):
        table[key] = [extra[label].get(key) for label in table["label"]]
    table["variant"] = [extra[label].get("variant") or "" for label in table["label"]]  # "": the study's flags

    def outputs(label):
        path = out / "outputs" / f"{slug(label)}.jsonl"
        if not path.is_file():
            return None
        return [row["output_ids"] for row in read_jsonl(path, skip_torn_tail=False)]

    base = outputs(baseline)
    agree = {
        label: agreement(base, o)
        if base is not None and (o := outputs(label)) is not None and len(o) == len(base)
        else {}
        for label in table["label"].unique()
    }
    table["identical"] = [agree[label].get("identical") for label in table["label"]]
    table["mean_common_prefix"] = [agree[label].get("mean_common_prefix") for label in table["label"]]
    return table


# ---------------------------------------------------------------------------- break-even from the server


def cycle_rates(out: str | Path, concurrency: int = 1, baseline: str = "baseline") -> list[dict]:
    """Per speculative entry at `concurrency`: SGLang's plain step time T1 (baseline wall x streams /
    tokens), its cycle time (wall x streams / verify steps) and tokens per cycle, pooled over the
    repeats. Both times include the same per-request overheads (HTTP, prefill), so the fitted
    costs are what a user of the server pays, not kernel times."""
    # a --variant server runs other flags: its cycle is not this study's cost model
    rows = [r for r in read_windows(out) if r["concurrency"] == concurrency and not r.get("variant")]
    base = [r for r in rows if r["label"] == baseline]
    if not base:
        raise ValueError(f"{out}: no {baseline!r} windows at concurrency {concurrency}")
    step_s = sum(r["wall_s"] for r in base) * concurrency / sum(r["completion_tokens"] for r in base)
    out_rows = []
    for label in dict.fromkeys(r["label"] for r in rows if r["verify_steps"]):
        g = [r for r in rows if r["label"] == label]
        verify, tokens, wall = (sum(r[k] for r in g) for k in ("verify_steps", "completion_tokens", "wall_s"))
        out_rows.append(
            {
                "label": label,
                "algorithm": g[0].get("algorithm"),
                "steps": g[0].get("steps"),
                "topk": g[0].get("topk"),
                "draft_tokens": g[0].get("draft_tokens"),
                "concurrency": concurrency,
                "step_s": step_s,
                "cycle_s": wall * concurrency / verify,
                "tokens_per_cycle": tokens / verify,
                "measured_speedup": (tokens / wall)
                / (sum(r["completion_tokens"] for r in base) / sum(r["wall_s"] for r in base)),
            }
        )
    return out_rows


def fit_server_costs(out: str | Path, concurrency: int = 1):
    """v and c of draftlab.breakeven's model fitted to SGLang's EAGLE3 chain entries (topk 1), and
    each entry's predicted vs measured speedup (trees and the wrong flag are checked, not fitted)."""
    rates = cycle_rates(out, concurrency)
    chain = [r for r in rates if r["topk"] == 1 and r["algorithm"] == "EAGLE3"]
    model = fit_costs(
        [r["steps"] for r in chain],
        [r["cycle_s"] for r in chain],
        rates[0]["step_s"],
        source=f"SGLang, {len(chain)} chain servers at concurrency {concurrency} ({out})",
    )
    for r in rates:
        r["predicted_speedup"] = model.speedup(r["tokens_per_cycle"], r["steps"])
        r["breakeven_acceptance"] = model.breakeven(r["steps"])
        r["acceptance_for_2x"] = model.breakeven(r["steps"], 2.0)
    return model, rates


def plot_breakeven_beside(
    engine_model, engine_checks: list, server_model, server_rates: list, steps: int, title: str = ""
):
    """One chain length S: the engine's and SGLang's break-even curves with each one's measured
    points, so a reader sees why the engine's speedup overstates the server's (its plain step is
    slower, so the same draft costs relatively less there)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for name, model, points, key in (
        ("engine", engine_model, engine_checks, "tokens_per_cycle"),
        ("SGLang", server_model, server_rates, "tokens_per_cycle"),
    ):
        if model is None:
            continue
        x, y = curve(model, steps)
        (line,) = ax.plot(
            x,
            y,
            label=f"{name}: v={model.verify_cost:.2f}, c={model.draft_cost:.3f} "
            f"(break-even L={model.breakeven(steps):.2f} at S={steps})",
        )
        pts = [r for r in points if r.get("measured_speedup")]
        ax.scatter(
            [r[key] for r in pts],
            [r["measured_speedup"] for r in pts],
            color=line.get_color(),
            zorder=3,
            label=f"{name}: measured runs (all S)",
        )
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("acceptance length L (tokens per verify step)")
    ax.set_ylabel("speedup over the same engine's plain decoding")
    ax.set_title(title or f"break-even, engine vs SGLang (S={steps}); v: verify, c: draft step, in plain steps")
    ax.legend(fontsize=7)
    return fig
