"""Regeneration through SGLang on the GPU machine, measured: the target server of
sglang.sh's regen phase and its side-by-side rows, one server fed by one and by two clients
(regen_feed.sh), K servers fed by one client over all their URLs (regen_servers.sh), and the batch
backend on the same rows.

Why here and not in bash: the servers (sglang.server: own process group, gone with this process,
a bounded health wait that says what it waits on) stay up across a measurement's client runs and
are stopped after it, whatever happens. Each client run is `draftlab regenerate` as a child process
(its summary JSON on stdout), timed from start to end and bounded by the call's deadline; results
are written after each run, so a cut call keeps what it measured.
"""

from __future__ import annotations

import json
import lzma
import os
import re
import shutil
import tarfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from draftlab.core.process import ServerStartError
from draftlab.sglang.commands import REGEN_RUNNING, regeneration_command
from draftlab.sglang.install import server_env
from draftlab.sglang.server import SGLangServer, TargetServers
from ops.gpu_call import Call, until

REGEN_ROWS = "results/reference/data/regen/train.jsonl.xz"  # the regenerated set, tracked
SAMPLING = ("--temperature", "0", "--truncation", "keep_flag", "--no-progress")  # greedy, as 03
SERVER_CLIENT = ("--timeout", "600")  # s per request
BATCH = ("--backend", "batch", "--device", "cuda", "--batch-size", "4096", "--batch-tokens", "3000000")
STARTUP_S = 300.0


def _env(name: str, default) -> str:
    return os.environ.get(name) or str(default)


# ---- servers -------------------------------------------------------------------------------------
def target_server(call: Call, log: Path, *, python: str | None = None, port: int = 30000) -> SGLangServer:
    """The one regeneration server of sglang.sh and regen_feed.sh, as they measured it (LOG.md):
    REGEN_MAX_RUNNING (1,024) running requests, past its CUDA graphs of REGEN_GRAPH_BS (512)."""
    command = regeneration_command(
        str(call.model_dir),
        port=port,
        max_running_requests=int(_env("REGEN_MAX_RUNNING", 1024)),
        cuda_graph_max_bs=int(_env("REGEN_GRAPH_BS", 512)),
    )
    return SGLangServer(command, log, python=python, env=server_env(call.sglang_prefix), startup_timeout=STARTUP_S)


def started(call: Call, servers) -> bool:
    """Start a server (or TargetServers; the caller stops it); False, said in one line and the log's
    tail, when one dies or never answers (the rest are stopped then)."""
    try:
        servers.start()
    except ServerStartError as exc:
        head, _, tail = str(exc).partition("\n")
        call.say(f"FAILED: the SGLang server did not start: {head}")
        print(tail, flush=True)
        return False
    urls = getattr(servers, "urls", None) or [servers.base_url]
    call.say(f"{len(urls)} SGLang server{'s' if len(urls) > 1 else ''} ready: {' '.join(urls)}")
    return True


def flush(url: str, quiet: bool = False) -> None:
    """An empty prefix cache before a measured run (SGLang's POST /flush_cache)."""
    status = httpx.post(f"{url}/flush_cache", timeout=60).status_code
    if not quiet:
        print("flush_cache", status, flush=True)


def running_requests(log: Path) -> dict:
    """The scheduler's `#running-req: N` samples in a server log: median, max, count."""
    found = sorted(int(n) for n in re.findall(r"#running-req: (\d+)", log.read_text(errors="replace")))
    return {
        "median": found[len(found) // 2] if found else None,
        "max": found[-1] if found else None,
        "samples": len(found),
    }


def running_line(name: str, log: Path) -> str:
    r = running_requests(log)
    return f"{name} running requests: median {r['median']} max {r['max']} samples {r['samples']}"


# ---- client runs ---------------------------------------------------------------------------------
def regenerate(call: Call, rows: Path, work: Path, summary: Path, *args) -> tuple[int, float]:
    """One `draftlab regenerate` (its summary JSON into `summary`): (exit code, wall s)."""
    t0 = time.time()
    with open(summary, "w") as out:
        rc = until(call.cli("regenerate", rows, work, *args), call.deadline, stdout=out)
    return rc, time.time() - t0


def over(urls, model: Path, concurrency: int) -> list[str]:
    """The client's arguments for servers at `urls`, `concurrency` requests in flight per server."""
    return [
        *(a for u in urls for a in ("--base-url", u)),
        "--model",
        str(model),
        "--concurrency",
        str(concurrency),
        *SERVER_CLIENT,
    ]


def copy_rows(src: Path, dst: Path, n: int | None = None) -> int:
    """The first n rows (all: None) of a JSONL file, .xz-compressed or not, into dst; how many were written."""
    count = 0
    with lzma.open(src, "rt") if src.suffix == ".xz" else open(src) as f, open(dst, "w") as out:
        for line in f:
            if n is not None and count >= n:
                break
            out.write(line)
            count += 1
    return count


def read_summary(path: Path):
    try:
        return json.loads(path.read_text() or "{}")
    except (OSError, ValueError):
        return {}


# ---- sglang.sh's regen phase: the same rows through SGLang, then through the batch backend ---------
def side_by_side(call: Call, which: str, n: int, url: str | None = None, concurrency: int = 1024) -> dict:
    """The first n train rows through the SGLang server at `url` (which="sglang", `concurrency` in
    flight; its cache flushed: 03 just sent the same prompts) or the batch backend (server gone):
    RUN/bench/regen_side_by_side.json, with whichever of the two has run."""
    d = call.dl / "side"
    d.mkdir(parents=True, exist_ok=True)
    (call.run / "bench").mkdir(parents=True, exist_ok=True)
    copy_rows(call.run / "data/blend/train.jsonl", d / "rows.jsonl", n)
    shutil.rmtree(d / which, ignore_errors=True)
    sampling = ("--max-tokens", _env("MAX_TOKENS", 256), *SAMPLING)
    if which == "sglang":
        flush(url)
        args = over([url], call.model_dir, concurrency)
    else:
        args = list(BATCH)
    (d / f"{which}.s").unlink(missing_ok=True)
    t0 = time.time()
    regenerate(call, d / "rows.jsonl", d / which, d / f"{which}.json", *args, *sampling)
    (d / f"{which}.s").write_text(f"{t0}\n{time.time()}\n")
    res = {
        "rows": n,
        "note": "first N rows of the blend's train split, max_tokens as 03, greedy; wall from start "
        "to end of the command",
    }
    for k in ("sglang", "batch"):
        walls = (d / f"{k}.s").read_text().split() if (d / f"{k}.s").is_file() else []
        if (d / f"{k}.json").is_file() and len(walls) == 2:
            res[k] = {"wall_s": float(walls[1]) - float(walls[0]), "summary": read_summary(d / f"{k}.json")}
    (call.run / "bench/regen_side_by_side.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v["wall_s"] for k, v in res.items() if isinstance(v, dict)}), flush=True)
    return res


# ---- regen_feed.sh: is the client the limit of one server? ------------------------------------------
def regen_feed(
    call: Call,
    *,
    n: int = 4096,
    concurrency: int = 1024,
    rows_xz: Path | None = None,
    python: str | None = None,
    port: int = 30000,
) -> int:
    """The same N rows through one server by one client at C, by two clients at C/2 on halves at once,
    then by the batch backend (server stopped): OUT/regen_feed.json after each part."""
    d = call.dl / "feed"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    rows = d / "rows.jsonl"
    total = copy_rows(rows_xz or call.repo / REGEN_ROWS, rows, n)
    lines = rows.read_text().splitlines(keepends=True)
    (d / "half1.jsonl").write_text("".join(lines[: n // 2]))
    (d / "half2.jsonl").write_text("".join(lines[n // 2 :]))
    sampling = ("--max-tokens", "256", *SAMPLING)
    res: dict = {"rows": total}

    def record(name: str, wall: float, *summaries: str) -> None:
        res[name] = {"wall_s": wall, **{s: read_summary(d / f"{s}.json") for s in summaries}}
        (call.out / "regen_feed.json").write_text(json.dumps(res, indent=1))
        print(json.dumps({k: v.get("wall_s") for k, v in res.items() if isinstance(v, dict)}), flush=True)

    server = target_server(call, d / "server.log", python=python, port=port)
    if not started(call, server):
        return 1
    try:
        flush(server.base_url)
        args = over([server.base_url], call.model_dir, concurrency)
        _, wall = regenerate(call, rows, d / "one", d / "one.json", *args, *sampling)
        record("one", wall, "one")
        flush(server.base_url)
        half = over([server.base_url], call.model_dir, concurrency // 2)
        t0 = time.time()
        with ThreadPoolExecutor(2) as pool:  # two clients at once, on the two halves
            list(
                pool.map(
                    lambda i: regenerate(
                        call, d / f"half{i}.jsonl", d / f"two{i}", d / f"two_{i}.json", *half, *sampling
                    ),
                    (1, 2),
                )
            )
        record("two", time.time() - t0, "two_1", "two_2")
        line = running_line("server", d / "server.log")
        print(line, flush=True)
        (d / "running.txt").write_text(line + "\n")
    finally:
        server.stop()
    _, wall = regenerate(call, rows, d / "batch", d / "batch.json", *BATCH, *sampling)
    record("batch", wall, "batch")
    with open(d / "server.log", "rb") as f, lzma.open(call.out / "feed-server.log.xz", "wb") as out:
        shutil.copyfileobj(f, out)
    shutil.copyfile(d / "running.txt", call.out / "running.txt")
    call.say("done")
    return 0


# ---- regen_servers.sh: does regeneration scale with servers on one GPU? ----------------------------
def regen_servers(
    call: Call,
    *,
    k: int = 4,
    n: int = 4096,
    concurrency: int = 512,
    mem: float = 0.5,
    full: bool = True,
    rows_xz: Path | None = None,
    python: str | None = None,
    port: int = 30000,
) -> int:
    """K servers (sglang.commands.regeneration_commands: graph-sized, a fixed KV pool, own ports) up
    together for every run: the first N rows through 1, 2, 4 .. K of them by one client over their
    URLs, then the whole train split through all K (full, with 200 s left). OUT/regen_servers.json
    after each run; the servers' running requests in OUT/running.txt, their logs in OUT/servers-logs.tar.xz."""
    d = call.dl / "servers"
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    copy_rows(rows_xz or call.repo / REGEN_ROWS, d / "train.jsonl")
    copy_rows(d / "train.jsonl", d / "rows.jsonl", n)
    res = {
        "concurrency_per_server": concurrency,
        "mem_fraction_static": mem,
        "max_running_requests": REGEN_RUNNING,
        "cuda_graph_max_bs": REGEN_RUNNING,
        "runs": {},
    }
    servers = TargetServers(
        str(call.model_dir),
        k,
        d,
        prefix=str(call.sglang_prefix),
        port=port,
        startup_timeout=STARTUP_S,
        python=python,
        mem_fraction_static=mem,
    )
    if not started(call, servers):
        return 1
    try:

        def measure(name: str, count: int, rows: Path) -> None:
            urls = servers.urls[:count]
            for url in urls:
                flush(url, quiet=True)
            rc, wall = regenerate(
                call,
                rows,
                d / name,
                d / f"{name}.json",
                *over(urls, call.model_dir, concurrency),
                "--max-tokens",
                "256",
                *SAMPLING,
            )
            if rc != 0:
                call.say(f"{name}: regenerate exit {rc}")
            res["runs"][name] = {"servers": count, "wall_s": wall, "summary": read_summary(d / f"{name}.json")}
            (call.out / "regen_servers.json").write_text(json.dumps(res, indent=1))
            print(
                {m: (r["servers"], round(r["wall_s"], 1), r["summary"].get("tok_s")) for m, r in res["runs"].items()},
                flush=True,
            )

        count = 1
        while count <= k:
            measure(f"n{n}_k{count}", count, d / "rows.jsonl")
            count *= 2
        if full and call.left() > 200:
            measure(f"train_k{k}", k, d / "train.jsonl")
    finally:
        servers.stop()
    logs = [s.log_path for s in servers.servers]
    lines = [running_line(f"server {i}", log) for i, log in enumerate(logs)]
    print("\n".join(lines), flush=True)
    (call.out / "running.txt").write_text("".join(f"{line}\n" for line in lines))
    with tarfile.open(call.out / "servers-logs.tar.xz", "w:xz") as tar:
        for log in logs:
            tar.add(log, arcname=log.name)
    call.say("done")
    return 0
