"""One regeneration run end to end, and notebook 03's splits: server backend or batch backend."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

from draftlab.core.errors import DraftlabError
from draftlab.core.records import RecordError
from draftlab.core.serve import LocalServer
from draftlab.model.target import EMBEDDED_NAME, load_target, resolve_path
from draftlab.regenerate.batch import regenerate_batch
from draftlab.regenerate.client import (
    ChatClient,
    RequestFailed,
    ServerPool,
    ServerUnreachable,
    check_base_url,
    reason_kind,
)
from draftlab.regenerate.config import (
    RegenConfig,
    load_conversations,
    plan_turns,
    slots,
)
from draftlab.regenerate.outputs import (
    Outputs,
    Progress,
    RunStats,
    WorkLock,
    build_row,
    finalize,
    outcome,
    scan_work,
    write_manifest,
    write_status,
)
from draftlab.sglang.server import TargetServers


async def regenerate_row(client: ChatClient, row: dict) -> dict:
    """Replay a conversation turn by turn; each assistant turn sees the regenerated history."""
    t0 = time.time()
    plan = plan_turns(row["messages"], client.config)
    turns, attempts = [], 0
    for i in slots(plan):
        try:
            result, n = await client.complete(plan[:i])
        except RequestFailed as exc:
            exc.reason = f"turn {len(turns)}: {exc.reason}"
            raise
        attempts += n
        if not result["text"].strip():  # nothing to train on: a failed row, not a kept one
            raise RequestFailed(
                f"turn {len(turns)}: empty answer (finish_reason {result['finish_reason']!r}, "
                f"{result['completion_tokens']} tokens) [server {result['server']}]",
                retryable=False,
            )
        plan[i] = {"role": "assistant", "content": result.pop("text")}
        turns.append(result)
    return build_row(row, plan, turns, client.config, "server", attempts, t0)


async def regenerate_async(
    rows: list[dict],
    work: str | os.PathLike,
    base_urls: list[str],
    config: RegenConfig,
    *,
    input_path: str = "",
    progress: bool = True,
    desc: str = "regenerate",
    children=(),
) -> dict:
    """Regenerate the rows not yet finished in `work`; returns the run's summary. `children`: the
    server processes draftlab started for this run (core.process.ServerProcess), watched for exits."""
    work = Path(work)
    with WorkLock(work):
        return await _regenerate_locked(
            rows, work, base_urls, config, input_path=input_path, progress=progress, desc=desc, children=children
        )


def check_children(children) -> None:
    """ServerUnreachable at once when a server draftlab started has exited (it will not come back)."""
    for child in children:
        proc = getattr(child, "proc", None)
        code = proc.poll() if proc is not None else None
        if code is not None:
            log = getattr(child, "log_path", None)
            raise ServerUnreachable(
                f"the server draftlab started ({getattr(child, 'kind', 'server')}, pid {proc.pid}) exited "
                f"with code {code}" + (f"; its log: {log}" if log else "")
            )


async def watch_servers(pool: ServerPool, bar: Progress, work: Path, every: float = 1.0, children=()) -> None:
    """While no server answers: say so on the progress line and in WORK/status.json; past
    `max_outage` seconds, or as soon as a server draftlab started exits, raise ServerUnreachable,
    which stops the run (rows written are kept)."""
    was, wrote = None, 0.0
    while True:
        check_children(children)
        now = time.monotonic()
        outage = pool.outage(now)
        if outage is not None:
            message = pool.outage_message(now)
            bar.note(message)
            if was is None or now - wrote >= 5.0:
                wrote = now
                write_status(
                    work,
                    "stalled",
                    since=time.time() - outage,
                    message=message,
                    max_outage=pool.config.max_outage,
                    servers={e.url: e.last_error for e in pool.endpoints},
                )
            if outage >= pool.config.max_outage:
                raise ServerUnreachable(
                    f"no server answered for {outage:.0f} s "
                    f"({'; '.join(f'{e.url}: {e.last_error}' for e in pool.endpoints)})"
                )
        elif was is not None:
            bar.note(f"server back after {was:.0f} s")
            write_status(work, "running")
        was = outage
        await asyncio.sleep(every)


async def _regenerate_locked(rows, work, base_urls, config, *, input_path, progress, desc, children):
    base_urls = [check_base_url(u) for u in base_urls]
    state = scan_work(work)
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise RecordError(f"{input_path or 'input'}: duplicate ids; ids must be unique")
    finished = state.finished
    todo = [r for r in rows if r["id"] not in finished and (config.retry_errors or r["id"] not in state.errors)]
    stats = RunStats(total=len(rows), skipped=len(rows) - len(todo))
    write_manifest(work, input_path, len(rows), config, "server", list(base_urls), rows, state)
    out = Outputs(work, config)
    out.written |= finished
    pool = ServerPool(list(base_urls), config)
    client = ChatClient(pool, config, stats)
    if todo:
        try:
            await pool.preflight(client.http)
        except ServerUnreachable as exc:
            out.close()
            await client.aclose()
            write_status(work, "stopped", message=str(exc))
            raise
    write_status(work, "running")
    bar = Progress(stats, progress, desc)
    queue: asyncio.Queue = asyncio.Queue()
    for r in todo:
        queue.put_nowait(r)

    async def worker():
        while True:
            try:
                row = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            try:
                outcome(out, stats, await regenerate_row(client, row))
            except RequestFailed as exc:
                stats.errors += 1
                stats.error_reasons[reason_kind(exc.reason)] += 1
                out.write_error({"id": row["id"], "reason": exc.reason, "t": time.time()})
            bar.step()

    n_workers = min(len(todo), sum(e.capacity for e in pool.endpoints)) or 0
    workers = [asyncio.ensure_future(worker()) for _ in range(n_workers)]
    watcher = asyncio.ensure_future(watch_servers(pool, bar, work, every=0.5, children=children))
    try:
        pending = set(workers)
        while pending and not watcher.done():  # the watcher never ends but by raising
            _, pending = await asyncio.wait([*pending, watcher], return_when=asyncio.FIRST_COMPLETED)
            pending.discard(watcher)
            if any(t.done() and not t.cancelled() and t.exception() for t in workers):
                break
        for task in [*workers, watcher]:  # the watcher ends the run early only by raising
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()
    except ServerUnreachable as exc:
        done = len(finished) + stats.done + stats.dropped
        message = (
            f"{exc}; stopped with {done}/{len(rows)} rows finished and kept in {work}: rerun the same command to resume"
        )
        write_status(work, "stopped", message=message)
        raise ServerUnreachable(message) from None
    except (DraftlabError, asyncio.CancelledError, KeyboardInterrupt) as exc:
        write_status(work, "stopped", message=str(exc) or "interrupted")
        raise
    finally:
        for task in [*workers, watcher]:
            task.cancel()
        await asyncio.gather(*workers, watcher, return_exceptions=True)
        bar.close()
        out.close()
        await client.aclose()
    write_status(work, "done")
    summary = stats.summary()
    summary["servers"] = pool.stats()
    return summary


def run_sync(coro):
    """asyncio.run, also from inside a running loop (Jupyter): then in a helper thread."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    import threading

    box: dict = {}

    def target():
        try:
            box["value"] = asyncio.run(coro)
        except BaseException as exc:  # re-raised in the caller's thread
            box["error"] = exc

    thread = threading.Thread(target=target, name="draftlab-regenerate", daemon=True)
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


def regenerate(rows: list[dict], work: str | os.PathLike, base_urls: list[str], config: RegenConfig, **kwargs) -> dict:
    """Blocking wrapper of `regenerate_async` (works in scripts and notebooks)."""
    return run_sync(regenerate_async(rows, work, base_urls, config, **kwargs))


# ------------------------------------------------------------------ the stage (notebook 03)


def regenerate_splits(
    inputs: dict[str, str | os.PathLike],
    out_dir: str | os.PathLike,
    config: RegenConfig,
    *,
    backend: str = "server",
    base_urls=(),
    target: str = "tiny",
    device: str = "cpu",
    dtype=None,
    batch_size: int = 1024,
    batch_tokens: int = 0,
    limits: dict[str, int] | None = None,
    progress: bool = True,
    sglang_servers: int = 0,
    sglang_prefix: str | None = None,
) -> dict:
    """Regenerate each split (e.g. train, val) into OUT/<split>.jsonl, resumably.

    backend "server": the given base URLs; else `sglang_servers` SGLang servers of `target` on this
    GPU (sglang.server.TargetServers; `sglang_prefix`: an offline install; logs OUT/sglang-N.log);
    else a `transformers serve` of `target` on loopback (log: OUT/serve.log), each for the duration.
    backend "batch": `regen_batch`. Work folders are OUT/work/<split>/ (what `draftlab monitor` reads).
    """
    from contextlib import ExitStack

    out_dir = Path(out_dir)
    limits = limits or {}
    rows = {s: load_conversations(p, limits.get(s, 0)) for s, p in inputs.items()}
    config.model_name = config.model_name or (EMBEDDED_NAME if target == "embedded" else target)
    report = {"backend": backend, "splits": {}, "server_startup_s": None}
    with ExitStack() as stack:
        urls, children = list(base_urls), []
        if backend == "batch":
            tgt = load_target(target, device=device, dtype=dtype)
            config.model = config.model or target
        elif not urls:
            if sglang_servers > 0:
                servers = TargetServers(
                    str(resolve_path(target)), sglang_servers, out_dir, prefix=sglang_prefix or None
                )
            else:  # the tiny target's ops are too small for two CPU threads (dev/notes/regeneration.md)
                threads = 1 if target == "tiny" and device == "cpu" else None
                servers = LocalServer(resolve_path(target), out_dir / "serve.log", device=device, threads=threads)
            srv = stack.enter_context(servers)
            urls, config.model = srv.urls, config.model or srv.model
            children = getattr(srv, "servers", [srv])  # watched: the run stops at once if one exits
            report["server_startup_s"] = round(srv.startup_s, 1)
        elif not config.model:
            raise ValueError("config.model (the served model name) is needed with base_urls")
        report["servers"] = urls
        for split, split_rows in rows.items():
            work = out_dir / "work" / split
            if backend == "batch":
                summary = regenerate_batch(
                    split_rows,
                    work,
                    config,
                    target=tgt,
                    batch_size=batch_size,
                    batch_tokens=batch_tokens,
                    input_path=str(inputs[split]),
                    progress=progress,
                    desc=f"regenerate[batch] {split}",
                )
            else:
                summary = regenerate(
                    split_rows,
                    work,
                    urls,
                    config,
                    input_path=str(inputs[split]),
                    progress=progress,
                    desc=f"regenerate {split}",
                    children=children,
                )
            summary["final"] = finalize(work, out_dir / f"{split}.jsonl", split_rows)
            summary["work"] = str(work)
            report["splits"][split] = summary
    return report
