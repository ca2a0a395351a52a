"""How many requests `draftlab regenerate` keeps in flight: the real command against a fake server.

Why: through one SGLang server (issue 17.6) the client fed a median of 24 running requests at
--concurrency 1024. Here the server is tests/helpers_regen/fake_openai.py in its own process (an
ideal server: every answer after DELAY seconds, however many are in flight), so rows/s below
C / DELAY and a mean in flight below C are the client's doing.

  python benchmarks/regen_feed.py fixture --delay 2 --concurrency 1024 --n 8192
      the fixture alone, fed by a bare asyncio-streams client (not httpx): is it fast enough?
  python benchmarks/regen_feed.py pools --delay 2 --concurrency 1024 --n 4096 --pool-size 1024,64,16,8,4,1
      a bare httpx2 gather over pools of N connections each: what one pool of 1,024 costs
  python benchmarks/regen_feed.py client --delay 2 --concurrency 256,1024 --rows 4096 --repeats 3 \
      [--lib before=/work/main/lib --lib after=lib] [--profile OUT.prof]
      `python -m draftlab.cli regenerate ... --concurrency C` per run (each --lib side by side,
      alternating), reporting rows/s (the run's summary: rows / wall_s), requests in flight at the
      fixture (first request to last answer) and the client's CPU over that span.

Prints one JSON line per run, then the medians per (lib, concurrency).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "lib"), str(ROOT / "tests")]
from helpers_regen.fake_openai import FakeOpenAIProcess  # noqa: E402


class Fixture(FakeOpenAIProcess):
    """The fake server's process, with its CPU time."""

    def __init__(self, delay: float, jitter: float = 0.0):
        super().__init__(delay, jitter)
        self.url = self.base_url
        self.ps = psutil.Process(self.proc.pid)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system


def cpu_between(samples: list[tuple[float, float]], t0: float, t1: float) -> float:
    """CPU seconds a process used between wall times t0 and t1, from (time, cpu) samples."""

    def at(t):
        before = [s for s in samples if s[0] <= t] or samples[:1]
        after = [s for s in samples if s[0] >= t] or samples[-1:]
        (ta, ca), (tb, cb) = before[-1], after[0]
        return ca if tb == ta else ca + (cb - ca) * (t - ta) / (tb - ta)

    return at(t1) - at(t0)


# ------------------------------------------------------------------ the fixture alone


async def _bare_client(url: str, n: int, concurrency: int, max_tokens: int) -> float:
    """C keep-alive connections, each sending its next request when the last answer is read."""
    host, port = url.split("//")[1].split(":")
    body = json.dumps(
        {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    left = [n]

    async def conn():
        reader, writer = await asyncio.open_connection(host, int(port))
        while left[0] > 0:
            left[0] -= 1
            writer.write(head + body)
            resp = await reader.readuntil(b"\r\n\r\n")
            length = int(resp.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
        writer.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(conn() for _ in range(concurrency)))
    return time.perf_counter() - t0


def bench_fixture(args) -> None:
    fx = Fixture(args.delay, args.jitter)
    try:
        for c in args.concurrency:
            fx.reset()
            cpu0, t0 = fx.cpu(), time.process_time()
            wall = asyncio.run(_bare_client(fx.url, args.n, c, args.max_tokens))
            s = fx.stats()
            print(
                json.dumps(
                    {
                        "what": "fixture",
                        "concurrency": c,
                        "n": args.n,
                        "delay_s": args.delay,
                        "wall_s": round(wall, 2),
                        "answers_per_s": round(args.n / wall, 1),
                        "ideal_per_s": round(c / args.delay, 1),
                        "mean_in_flight": s["mean_in_flight"],
                        "median_in_flight": s["median_in_flight"],
                        "fixture_cpu_pct": round(100 * (fx.cpu() - cpu0) / wall, 1),
                        "bare_client_cpu_pct": round(100 * (time.process_time() - t0) / wall, 1),
                    }
                ),
                flush=True,
            )
    finally:
        fx.stop()


# ------------------------------------------------------------------ httpx pools alone


async def _httpx_gather(url: str, n: int, concurrency: int, size: int, max_tokens: int) -> float:
    """A bare httpx2 gather (no draftlab code) over ceil(C / size) pools, each request on the least loaded."""
    import math

    try:
        import httpx2 as httpx
    except ImportError:  # pragma: no cover - older openai releases
        import httpx
    tls = httpx.create_ssl_context()
    limits = httpx.Limits(max_connections=size, max_keepalive_connections=size)
    pools = [
        [0, httpx.AsyncClient(timeout=120, verify=tls, limits=limits)] for _ in range(math.ceil(concurrency / size))
    ]
    sem = asyncio.Semaphore(concurrency)
    body = {"model": "fake", "messages": [{"role": "user", "content": "hi"}], "max_tokens": max_tokens}

    async def one():
        async with sem:
            pool = min(pools, key=lambda p: p[0])
            pool[0] += 1
            try:
                (await pool[1].post(url + "/v1/chat/completions", json=body)).json()
            finally:
                pool[0] -= 1

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(n)))
    wall = time.perf_counter() - t0
    for _, client in pools:
        await client.aclose()
    return wall


def bench_pools(args) -> None:
    fx = Fixture(args.delay, args.jitter)
    try:
        for c in args.concurrency:
            for size in args.pool_size:
                fx.reset()
                cpu0 = time.process_time()
                wall = asyncio.run(_httpx_gather(fx.url, args.n, c, size, args.max_tokens))
                cpu = time.process_time() - cpu0
                s = fx.stats()
                row = {
                    "what": "httpx_pools",
                    "concurrency": c,
                    "pool_size": size,
                    "n": args.n,
                    "delay_s": args.delay,
                    "requests_per_s": round(args.n / wall, 1),
                    "mean_in_flight": s["mean_in_flight"],
                    "median_in_flight": s["median_in_flight"],
                    "client_cpu_pct": round(100 * cpu / wall, 1),
                    "cpu_ms_per_request": round(1e3 * cpu / args.n, 2),
                }
                print(json.dumps(row), flush=True)
    finally:
        fx.stop()


# ------------------------------------------------------------------ draftlab regenerate


def one_run(fx: Fixture, lib: str, rows_path: Path, c: int, args, profile: str | None) -> dict:
    work = Path(tempfile.mkdtemp(prefix="regen-feed-"))
    fx.reset()
    prof = ["-m", "cProfile", "-o", profile] if profile else []
    cmd = [
        sys.executable,
        *prof,
        "-m",
        "draftlab.cli",
        "regenerate",
        str(rows_path),
        str(work / "w"),
        "--base-url",
        fx.url,
        "--model",
        "fake",
        "--concurrency",
        str(c),
        "--max-tokens",
        str(args.max_tokens),
        "--truncation",
        "keep_flag",
        *([] if args.progress else ["--no-progress"]),
    ]
    env = {**os.environ, "PYTHONPATH": lib}
    t0 = time.time()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    ps, samples, out = psutil.Process(proc.pid), [], {}

    def read():
        out["stdout"], out["stderr"] = proc.communicate()

    reader = threading.Thread(target=read)
    reader.start()
    while proc.poll() is None:
        try:
            t = ps.cpu_times()
            samples.append((time.time(), t.user + t.system))
        except psutil.Error:
            break
        time.sleep(0.1)
    reader.join()
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"regenerate failed (rc {proc.returncode}): {out['stderr'][-2000:]}")
    summary = json.loads(out["stdout"][out["stdout"].index("{") :])
    s = fx.stats()
    busy = s["busy_s"]
    cpu = cpu_between(samples, s["t_first"], s["t_last"]) if len(samples) > 1 else float("nan")
    shutil.rmtree(work, ignore_errors=True)
    return {
        "what": "regenerate",
        "lib": lib,
        "concurrency": c,
        "rows": summary["rows_done"],
        "delay_s": args.delay,
        "jitter": args.jitter,
        "rows_per_s": round(summary["rows_done"] / summary["wall_s"], 1),  # the run's own clock
        "fixture_answers_per_s": round(summary["rows_done"] / busy, 1),  # first request to last answer
        "ideal_rows_per_s": round(min(c, summary["rows_done"]) / args.delay, 1),
        "mean_in_flight": s["mean_in_flight"],
        "median_in_flight": s["median_in_flight"],
        "peak_in_flight": s["peak_in_flight"],
        "busy_s": busy,
        "client_cpu_pct": round(100 * cpu / busy, 1),
        "process_wall_s": round(time.time() - t0, 1),
        "summary_wall_s": summary["wall_s"],
        "retries": summary["retries"],
        "errors": summary["rows_error"],
    }


def bench_client(args) -> None:
    from draftlab.core.records import write_jsonl
    from draftlab.regenerate.bench import bench_prompts

    rows_path = Path(tempfile.mkdtemp(prefix="regen-feed-rows-")) / "rows.jsonl"
    write_jsonl(rows_path, bench_prompts(args.rows))
    libs = args.lib or [f"lib={ROOT / 'lib'}"]
    fx = Fixture(args.delay, args.jitter)
    results: dict = {}
    try:
        for k in range(args.repeats):
            for c in args.concurrency:
                order = libs if k % 2 == 0 else libs[::-1]
                for spec in order:
                    name, lib = spec.split("=", 1)
                    r = one_run(fx, str(Path(lib).resolve()), rows_path, c, args, args.profile)
                    r["name"], r["repeat"] = name, k
                    print(json.dumps(r), flush=True)
                    results.setdefault((name, c), []).append(r)
    finally:
        fx.stop()
    for (name, c), rs in results.items():
        med = {
            key: statistics.median(r[key] for r in rs)
            for key in ("rows_per_s", "fixture_answers_per_s", "mean_in_flight", "median_in_flight", "client_cpu_pct")
        }
        print(
            json.dumps(
                {
                    "what": "median",
                    "name": name,
                    "concurrency": c,
                    "runs": len(rs),
                    "delay_s": args.delay,
                    "rows": args.rows,
                    **med,
                }
            ),
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("what", choices=("fixture", "pools", "client"))
    p.add_argument("--delay", type=float, default=2.0, help="the fixture's seconds per answer")
    p.add_argument("--jitter", type=float, default=0.0, help="delay x (1 +- jitter), uniform")
    p.add_argument("--concurrency", type=lambda s: [int(x) for x in s.split(",")], default=[256, 1024])
    p.add_argument("--n", type=int, default=8192, help="fixture, pools: requests")
    p.add_argument(
        "--pool-size",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[1024, 64, 16, 8, 4, 1],
        help="pools: connections per httpx pool (one run each)",
    )
    p.add_argument("--rows", type=int, default=4096, help="client: rows per run")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument(
        "--lib",
        action="append",
        default=None,
        metavar="NAME=PATH",
        help="a checkout's lib folder to measure (repeatable; runs alternate)",
    )
    p.add_argument("--progress", action="store_true", help="client: with the progress bar (to a pipe)")
    p.add_argument("--profile", default=None, help="client: cProfile output of each run (last one kept)")
    args = p.parse_args()
    {"fixture": bench_fixture, "pools": bench_pools, "client": bench_client}[args.what](args)


if __name__ == "__main__":
    main()
