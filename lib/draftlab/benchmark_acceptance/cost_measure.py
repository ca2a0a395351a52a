"""One cell of `draftlab bench cost` measured on a live SGLang server: output tok/s at one batch size.

A window sends `batch` requests at once, each of random token ids (no tokenizer) and a fixed
number of new tokens with `ignore_eos`, so the batch stays full until the window ends; tok/s is
all completion tokens over the window's wall time. With a prompt file (real prompts, tokenised)
a window sends every prompt of the file instead, `batch` of them in flight at a time, as a
benchmark of a real draft does on the same prompts. Unmeasured windows first (Triton compiles
kernels per new shape: a first server ran its first batch-1 windows a third slower), then
`windows` measured ones, each after /flush_cache: the cell is their median with the min and max
beside it, and the acceptance the server itself reports (sum completion_tokens / sum
spec_verify_ct), which must match the forced one.
"""

from __future__ import annotations

import asyncio
import os
import random
import statistics
import time

import httpx

from draftlab.benchmark_acceptance.live import flush_cache, parse_response
from draftlab.core.errors import RunFailure
from draftlab.core.process import ServerStartError
from draftlab.sglang.server import SGLangServer

SIMULATE_ENV = ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_SIMULATE_ACC_METHOD")
FIRST_ID = 200  # random prompt ids start above the special tokens of common vocabularies


def prompt_ids(count: int, length: int, vocab: int, seed: int = 0) -> list[list[int]]:
    """`count` prompts of `length` random token ids, the same for every server of a job."""
    rng = random.Random(seed)
    top = max(FIRST_ID + 1, vocab - 1)
    return [[rng.randrange(FIRST_ID, top) for _ in range(length)] for _ in range(count)]


def server_env(base: dict | None, acceptance: int | None) -> dict:
    """The server's environment: the forced acceptance for a speculative server, none for the plain one.

    SGLang reads SGLANG_SIMULATE_ACC_LEN once at import (speculative/spec_utils.py): the value is
    clamped to 1 .. S + 1 and, with METHOD match-expected, each verify accepts floor or ceil of it so
    the mean is the value (an integer is exact). A value <= 0 turns it off."""
    env = dict(os.environ if base is None else base)
    for key in SIMULATE_ENV:
        env.pop(key, None)
    if acceptance is not None:
        env["SGLANG_SIMULATE_ACC_LEN"] = str(acceptance)
        env["SGLANG_SIMULATE_ACC_METHOD"] = "match-expected"
    return env


def env_prefix(acceptance: int | None) -> str:
    """The environment part of a server's line in commands.txt."""
    if acceptance is None:
        return ""
    return f"SGLANG_SIMULATE_ACC_LEN={acceptance} SGLANG_SIMULATE_ACC_METHOD=match-expected "


async def _window(client: httpx.AsyncClient, url: str, prompts: list[list[int]], max_new_tokens: int, in_flight: int):
    """Every prompt, `in_flight` at a time; (completion tokens, verify steps or None, wall seconds)."""
    slots = asyncio.Semaphore(in_flight)

    async def one(ids):
        body = {
            "input_ids": ids,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        async with slots:
            r = await client.post(f"{url}/generate", json=body)
        r.raise_for_status()
        return parse_response(r.json(), f"{url}/generate")

    t0 = time.perf_counter()
    try:
        usages = await asyncio.gather(*(one(p) for p in prompts))
    except (httpx.HTTPError, ValueError) as exc:
        raise RunFailure(f"{url}/generate failed: {type(exc).__name__}: {' '.join(str(exc).split())[:300]}") from None
    wall = time.perf_counter() - t0
    verify = [u.spec_verify_ct for u in usages]
    return sum(u.completion_tokens for u in usages), (None if None in verify else sum(verify)), wall


def measure_cell(
    url: str,
    batch: int,
    prompts: list[list[int]],
    *,
    windows: int,
    max_new_tokens: int,
    warmup: int = 1,
    every_prompt: bool = False,
    transport=None,
) -> dict:
    """tok/s at `batch` on the server at `url`: median, min, max of `windows` windows, and the acceptance.

    every_prompt: a window sends all `prompts`, `batch` in flight (a prompt file); else the first `batch`."""
    if len(prompts) < batch:
        raise ValueError(f"{len(prompts)} prompts for batch {batch}")
    window = prompts if every_prompt else prompts[:batch]

    async def go():
        rates, tokens, verify = [], 0, 0
        limits = httpx.Limits(max_connections=batch + 4)
        async with httpx.AsyncClient(timeout=600.0, limits=limits, transport=transport) as c:
            for _ in range(warmup):
                await _window(c, url, window, max_new_tokens, batch)
            for _ in range(windows):
                await flush_cache(c, url)
                done, steps, wall = await _window(c, url, window, max_new_tokens, batch)
                rates.append(done / wall)
                tokens += done
                verify = None if steps is None or verify is None else verify + steps
        return rates, tokens, verify

    rates, tokens, verify = asyncio.run(go())
    return {
        "tok_s": round(statistics.median(rates), 3),
        "tok_s_min": round(min(rates), 3),
        "tok_s_max": round(max(rates), 3),
        "windows": len(rates),
        "window_tok_s": ";".join(f"{r:.1f}" for r in rates),
        "measured_acceptance": tokens / verify if verify else "",
        "completion_tokens": tokens,
    }


class CostServer:
    """A context that starts one SGLang server of the bench (others are stopped) and yields its URL."""

    def __init__(self, command: str, log_path, *, acceptance: int | None, env: dict | None, python=None, timeout=900.0):
        self.server = SGLangServer(
            command, log_path, python=python, env=server_env(env, acceptance), startup_timeout=timeout
        )

    def __enter__(self) -> str:
        try:
            self.server.start()
        except ServerStartError as exc:
            first = str(exc).splitlines()[0]
            raise RunFailure(f"{first} (the measured cells are kept; rerun to continue)") from None
        return self.server.base_url

    def __exit__(self, *exc) -> None:
        self.server.stop()
