"""Regeneration: every blended prompt answered again by the target, crash-proof and observable.

A run writes into a work folder:

    manifest.json          what is being regenerated (input, total rows, parameters, each run's start)
    shards/part-NNNNN.jsonl   finished rows (one new shard per run; rotated every `shard_rows`)
    dropped.jsonl          rows dropped by the truncation policy "drop" (with their token counts)
    errors.jsonl           rows that still failed after the retries, each with its reason

Each line is written whole with one `write()` on an O_APPEND descriptor, so `kill -9` can at worst
leave a torn last line; the next run cuts it off (the row is redone). A row id is finished when it
is in a shard or in dropped.jsonl; a rerun skips those (and by default retries the errors), so a
crash at any moment loses nothing and duplicates nothing. `finalize` then writes the training
file (e.g. RUN_DIR/data/regen/train.jsonl) in the input's order.

The server backend is an asyncio client of `/v1/chat/completions` over one or more base URLs
(`regen_batch` is the static-batch GPU backend writing the same records). This module imports
neither torch nor transformers, so the client starts fast.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterable

try:  # the HTTP client the openai SDK (>= 3) is built on; its connection pool is far cheaper
    import httpx2 as httpx  # than httpx 0.28's at tens of concurrent requests (notes/issue4.md)
except ImportError:  # pragma: no cover - older openai releases
    import httpx

from draftlab.records import RecordError, validate_conversation

SYSTEM_POLICIES = ("keep", "drop", "set")
TRUNCATION_POLICIES = ("drop", "keep_flag")
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


@dataclass
class RegenConfig:
    """Everything that decides what a regenerated row contains and how hard we try to get it."""

    model: str = ""                  # the `model` field of requests (transformers serve: the folder path)
    model_name: str = ""             # recorded on rows (default: model)
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    stop: list[str] | None = None
    seed: int | None = None
    system_policy: str = "keep"      # keep: as in the data | drop: remove | set: replace by system_prompt
    system_prompt: str = ""
    truncation: str = "drop"         # drop | keep_flag: what to do with finish_reason == "length"
    max_assistant_turns: int = 0     # 0: every assistant turn; n: the conversation up to the n-th
    concurrency: int = 8             # in-flight requests per server
    request_timeout: float = 120.0   # seconds per request
    max_retries: int = 5             # retries after the first attempt
    backoff_base: float = 0.5        # seconds; doubles every retry (with jitter)
    backoff_max: float = 20.0
    down_after: int = 3              # consecutive connection failures before a server is taken out
    server_cooldown: float = 5.0     # seconds out before it is tried again (doubles, max 120 s)
    shard_rows: int = 10000          # rows per shard file
    retry_errors: bool = True        # a rerun retries ids that are only in errors.jsonl
    fsync: bool = False              # fsync every line (power-loss safety; kill -9 needs none)

    def __post_init__(self):
        if self.system_policy not in SYSTEM_POLICIES:
            raise ValueError(f"system_policy must be one of {SYSTEM_POLICIES}, got {self.system_policy!r}")
        if self.system_policy == "set" and not self.system_prompt:
            raise ValueError("system_policy 'set' needs a non-empty system_prompt")
        if self.truncation not in TRUNCATION_POLICIES:
            raise ValueError(f"truncation must be one of {TRUNCATION_POLICIES}, got {self.truncation!r}")
        if self.max_tokens < 1 or self.concurrency < 1:
            raise ValueError("max_tokens and concurrency must be >= 1")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.model_name = self.model_name or self.model

    def sampling(self) -> dict:
        out = {"temperature": self.temperature, "top_p": self.top_p, "max_tokens": self.max_tokens,
               "stop": self.stop or None}
        if self.seed is not None:
            out["seed"] = self.seed
        return out

    @classmethod
    def from_dict(cls, d: dict) -> "RegenConfig":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


# ------------------------------------------------------------------ input

def load_conversations(path: str | os.PathLike, limit: int = 0) -> list[dict]:
    """Read canonical conversations; a bad row is an error naming the file, line and field."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: input not found")
    rows, seen = [], {}
    with open(path, "rb") as fh:
        for lineno, raw in enumerate(fh, start=1):
            if not raw.strip():
                continue
            where = f"{path}: line {lineno}"
            try:
                row = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise RecordError(f"{where}: not valid JSON ({exc})") from exc
            if not isinstance(row, dict):
                raise RecordError(f"{where}: a row must be a JSON object")
            validate_conversation(row, where)
            if not isinstance(row["id"], str) or not row["id"]:
                raise RecordError(f"{where}: field 'id' must be a non-empty string")
            if not any(m["role"] == "user" for m in row["messages"]):
                raise RecordError(f"{where}: field 'messages' has no user turn to answer")
            if row["id"] in seen:
                raise RecordError(f"{where}: duplicate id {row['id']!r} (first on line {seen[row['id']]})")
            seen[row["id"]] = lineno
            rows.append(row)
            if limit and len(rows) >= limit:
                break
    return rows


def plan_turns(messages: list[dict], config: RegenConfig) -> list[dict]:
    """The conversation to replay: system policy applied, cut after `max_assistant_turns`.

    Returns messages where each assistant turn (after the first user turn) is a slot to
    regenerate; a conversation ending on a user turn gets an empty assistant slot appended.
    """
    msgs = [dict(role=m["role"], content=m["content"]) for m in messages]
    if config.system_policy in ("drop", "set"):
        msgs = [m for m in msgs if m["role"] != "system"]
    if config.system_policy == "set":
        msgs.insert(0, {"role": "system", "content": config.system_prompt})
    if msgs[-1]["role"] != "assistant":
        msgs.append({"role": "assistant", "content": ""})
    if config.max_assistant_turns:
        seen_user, n = False, 0
        for i, m in enumerate(msgs):
            seen_user = seen_user or m["role"] == "user"
            if m["role"] == "assistant" and seen_user:
                n += 1
                if n == config.max_assistant_turns:
                    msgs = msgs[: i + 1]
                    break
    return msgs


def slots(plan: list[dict]) -> list[int]:
    """Indices of the assistant turns to regenerate (those after the first user turn)."""
    first_user = next(i for i, m in enumerate(plan) if m["role"] == "user")
    return [i for i, m in enumerate(plan) if m["role"] == "assistant" and i > first_user]


# ------------------------------------------------------------------ output files

class JsonlAppender:
    """One whole line per `write()` on an O_APPEND descriptor: a crash can only tear the last line."""

    def __init__(self, path: Path, fsync: bool = False):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.fsync = path, fsync
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.rows = 0

    def write(self, row: dict) -> None:
        data = (json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            view = view[os.write(self.fd, view):]
        if self.fsync:
            os.fsync(self.fd)
        self.rows += 1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def repair_jsonl(path: Path) -> list[dict]:
    """Read a JSONL file, cutting a torn last line off the file; a bad line elsewhere is an error."""
    with open(path, "rb") as fh:
        data = fh.read()
    rows, pos = [], 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        line = data[pos:] if end < 0 else data[pos:end]
        try:
            if line.strip():
                rows.append(json.loads(line))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            if end < 0 or data[end + 1:].strip() == b"":
                with open(path, "r+b") as fh:  # torn tail: cut it so the file is all valid lines
                    fh.truncate(pos)
                return rows
            lineno = data[:pos].count(b"\n") + 1
            raise RecordError(f"{path}: line {lineno}: not valid JSON ({exc})") from exc
        if end < 0:  # a whole row without its newline: complete the line
            with open(path, "ab") as fh:
                fh.write(b"\n")
            break
        pos = end + 1
    return rows


@dataclass
class WorkState:
    """What a work folder already holds."""

    done: dict = field(default_factory=dict)      # id -> shard row
    dropped: dict = field(default_factory=dict)   # id -> dropped record
    errors: dict = field(default_factory=dict)    # id -> last error record
    duplicates: int = 0

    @property
    def finished(self) -> set:
        return set(self.done) | set(self.dropped)


def shard_paths(work: Path) -> list[Path]:
    return sorted((work / "shards").glob("part-*.jsonl"))


def scan_work(work: str | os.PathLike, repair: bool = True) -> WorkState:
    """Load every output file of a work folder (cutting torn tails when `repair`)."""
    work = Path(work)
    read = repair_jsonl if repair else _read_lenient
    state = WorkState()
    for path in shard_paths(work):
        for row in read(path):
            if row["id"] in state.done:
                state.duplicates += 1
            state.done.setdefault(row["id"], row)
    if (work / "dropped.jsonl").exists():
        for row in read(work / "dropped.jsonl"):
            state.dropped[row["id"]] = row
    if (work / "errors.jsonl").exists():
        for row in read(work / "errors.jsonl"):
            state.errors[row["id"]] = row
    return state


def _read_lenient(path: Path) -> list[dict]:
    """Read-only variant for observers (the monitor): skip a torn last line, never write."""
    rows = []
    with open(path, "rb") as fh:
        for raw in fh:
            try:
                rows.append(json.loads(raw))
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
    return rows


class Outputs:
    """The writers of one run: a fresh shard (rotated), dropped.jsonl and errors.jsonl."""

    def __init__(self, work: Path, config: RegenConfig):
        self.work, self.config = work, config
        existing = shard_paths(work)
        self.next_index = (int(existing[-1].stem.split("-")[1]) + 1) if existing else 0
        self.shard: JsonlAppender | None = None
        self.dropped = JsonlAppender(work / "dropped.jsonl", config.fsync)
        self.errors = JsonlAppender(work / "errors.jsonl", config.fsync)
        self.written: set = set()

    def write_done(self, row: dict) -> None:
        if row["id"] in self.written:
            return
        if self.shard is None or self.shard.rows >= self.config.shard_rows:
            if self.shard is not None:
                self.shard.close()
            self.shard = JsonlAppender(self.work / "shards" / f"part-{self.next_index:05d}.jsonl",
                                       self.config.fsync)
            self.next_index += 1
        self.shard.write(row)
        self.written.add(row["id"])

    def write_dropped(self, rec: dict) -> None:
        if rec["id"] not in self.written:
            self.dropped.write(rec)
            self.written.add(rec["id"])

    def write_error(self, rec: dict) -> None:
        self.errors.write(rec)

    def close(self) -> None:
        for w in (self.shard, self.dropped, self.errors):
            if w is not None:
                w.close()


# What a row's content depends on: a resume with other values would mix two datasets.
IDENTITY_FIELDS = ("temperature", "top_p", "max_tokens", "stop", "seed", "system_policy",
                   "system_prompt", "truncation", "max_assistant_turns")


class WorkLock:
    """An exclusive flock on WORK/.lock: two writers in one folder would duplicate rows.
    The kernel drops it when the process dies (kill -9 included), so no stale locks."""

    def __init__(self, work: Path):
        import fcntl

        work.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(work / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(self.fd, 32, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise RuntimeError(f"{work}: another process (pid {other or '?'}) is regenerating "
                               f"into this folder; wait for it or stop it first") from None
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, str(os.getpid()).encode(), 0)

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # closing drops the flock
            self.fd = -1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


def write_manifest(work: Path, input_path: str, total: int, config: RegenConfig, backend: str,
                   servers: list[str]) -> None:
    """manifest.json: the monitor reads `total` and the runs' start times from it.

    Refuses to resume a folder whose rows were made with other sampling or policies."""
    path = work / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else {"runs": []}
    old = manifest.get("config") or {}
    changed = {k: (old[k], getattr(config, k)) for k in IDENTITY_FIELDS
               if k in old and old[k] != getattr(config, k)}
    if changed and (shard_paths(work) or (work / "dropped.jsonl").exists()):
        detail = ", ".join(f"{k}: {a!r} -> {b!r}" for k, (a, b) in changed.items())
        raise ValueError(f"{work}: holds rows made with other parameters ({detail}); "
                         f"resume with the same ones or use a new work folder")
    manifest.update(input=str(input_path), total=total, config=asdict(config))
    manifest["runs"].append({"started": time.time(), "backend": backend, "servers": servers,
                             "pid": os.getpid()})
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.replace(path)


def finalize(work: str | os.PathLike, output: str | os.PathLike, rows: list[dict]) -> dict:
    """Write the training file: finished rows in the input's order (atomic replace). Counts back."""
    work, output = Path(work), Path(output)
    state = scan_work(work)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_suffix(output.suffix + ".tmp")
    kept = 0
    with open(tmp, "w", encoding="utf-8") as fh:
        for row in rows:
            if row["id"] in state.done:
                fh.write(json.dumps(state.done[row["id"]], ensure_ascii=False) + "\n")
                kept += 1
    tmp.replace(output)
    ids = {r["id"] for r in rows}
    errors = {i for i in state.errors if i in ids and i not in state.finished}
    return {"rows_in": len(rows), "rows_kept": kept,
            "rows_dropped_truncated": len(ids & set(state.dropped)),
            "rows_error": len(errors),
            "rows_missing": len(ids - state.finished - errors),
            "duplicates_seen": state.duplicates, "output": str(output)}


def build_row(row: dict, plan: list[dict], turns: list[dict], config: RegenConfig, backend: str,
              attempts: int, t0: float) -> dict:
    """The regenerated conversation with what produced it under meta.regen."""
    truncated = [i for i, t in enumerate(turns) if t["finish_reason"] == "length"]
    regen = {
        "backend": backend,
        "model": config.model_name,
        "servers": [t["server"] for t in turns],
        "sampling": config.sampling(),
        "system_policy": config.system_policy,
        "system_prompt": config.system_prompt if config.system_policy == "set" else None,
        "finish_reasons": [t["finish_reason"] for t in turns],
        "prompt_tokens": [t["prompt_tokens"] for t in turns],
        "completion_tokens": [t["completion_tokens"] for t in turns],
        "truncated": bool(truncated),
        "truncated_turns": truncated,
        "attempts": attempts,
        "latency_s": round(time.time() - t0, 3),
        "t_done": time.time(),
    }
    meta = dict(row.get("meta") or {})
    meta["regen"] = regen
    return {"id": row["id"], "source": row.get("source", ""), "messages": plan, "meta": meta}


def outcome(out: Outputs, stats: "RunStats", regen_row: dict) -> str:
    """Route a regenerated row by the truncation policy; returns 'done' or 'dropped'."""
    regen = regen_row["meta"]["regen"]
    stats.add_tokens(regen)
    if regen["truncated"] and out.config.truncation == "drop":
        out.write_dropped({"id": regen_row["id"], "reason": "length",
                           "turns": regen["truncated_turns"],
                           "finish_reasons": regen["finish_reasons"],
                           "completion_tokens": regen["completion_tokens"],
                           "prompt_tokens": regen["prompt_tokens"], "t_done": regen["t_done"]})
        stats.dropped += 1
        return "dropped"
    if regen["truncated"]:
        stats.kept_flagged += 1
    out.write_done(regen_row)
    stats.done += 1
    return "done"


@dataclass
class RunStats:
    total: int = 0
    skipped: int = 0           # finished by an earlier run
    done: int = 0
    dropped: int = 0
    kept_flagged: int = 0
    errors: int = 0
    requests: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reasons: Counter = field(default_factory=Counter)
    error_reasons: Counter = field(default_factory=Counter)
    t_start: float = field(default_factory=time.monotonic)

    def add_tokens(self, regen: dict) -> None:
        self.prompt_tokens += sum(x or 0 for x in regen["prompt_tokens"])
        self.completion_tokens += sum(x or 0 for x in regen["completion_tokens"])
        self.finish_reasons.update(regen["finish_reasons"])

    def summary(self) -> dict:
        wall = time.monotonic() - self.t_start
        return {"rows_total": self.total, "rows_skipped_resume": self.skipped,
                "rows_done": self.done, "rows_dropped_truncated": self.dropped,
                "rows_kept_truncated": self.kept_flagged, "rows_error": self.errors,
                "requests": self.requests, "retries": self.retries,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "finish_reasons": dict(self.finish_reasons),
                "error_reasons": dict(self.error_reasons),
                "wall_s": round(wall, 2),
                "tok_s": round(self.completion_tokens / wall, 2) if wall > 0 else 0.0}


class Progress:
    """tqdm over rows with tokens/s, errors and truncations in the postfix."""

    def __init__(self, stats: RunStats, enabled: bool, desc: str = "regenerate"):
        self.stats, self.bar, self.last = stats, None, 0.0
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=stats.total, initial=stats.skipped, unit="row", desc=desc,
                            dynamic_ncols=True, smoothing=0.1)

    def step(self, n: int = 1) -> None:
        if self.bar is None:
            return
        self.bar.update(n)
        now = time.monotonic()
        if now - self.last > 0.5:
            self.last = now
            s = self.stats
            wall = max(now - s.t_start, 1e-6)
            self.bar.set_postfix(tok_s=f"{s.completion_tokens / wall:.1f}", err=s.errors,
                                 trunc=s.dropped + s.kept_flagged, refresh=False)

    def close(self) -> None:
        if self.bar is not None:
            self.step(0)
            self.bar.close()


# ------------------------------------------------------------------ servers and requests

class RequestFailed(Exception):
    def __init__(self, reason: str, retryable: bool, server_down: bool = False,
                 retry_after: float | None = None):
        super().__init__(reason)
        self.reason, self.retryable, self.server_down = reason, retryable, server_down
        self.retry_after = retry_after


class Endpoint:
    def __init__(self, url: str, capacity: int):
        self.url = url.rstrip("/")
        self.capacity = capacity
        self.in_flight = 0
        self.fails = 0              # consecutive connection-level failures
        self.down_until = 0.0       # monotonic time; 0 = in service
        self.probation = False      # back from a cooldown: one request at a time until one succeeds
        self.outages = 0
        self.ok = 0
        self.failed = 0

    def limit(self, now: float) -> int:
        if self.down_until > now:
            return 0
        return 1 if self.probation else self.capacity


class ServerPool:
    """Spreads requests over base URLs with a slot limit each; a server that stops answering is
    taken out for a cooldown (doubling) and then tried again one request at a time."""

    def __init__(self, urls: list[str], config: RegenConfig):
        if not urls:
            raise ValueError("at least one base URL is needed")
        self.endpoints = [Endpoint(u, config.concurrency) for u in urls]
        self.config = config
        self.cond = asyncio.Condition()

    async def acquire(self) -> Endpoint:
        async with self.cond:
            while True:
                now = time.monotonic()
                free = [e for e in self.endpoints if e.in_flight < e.limit(now)]
                if free:
                    ep = min(free, key=lambda e: (e.in_flight / e.capacity, e.fails))
                    ep.in_flight += 1
                    return ep
                waits = [e.down_until - now for e in self.endpoints if e.down_until > now]
                try:
                    await asyncio.wait_for(self.cond.wait(), timeout=min(waits) if waits else None)
                except asyncio.TimeoutError:
                    pass

    async def release(self, ep: Endpoint, ok: bool, server_down: bool = False) -> None:
        async with self.cond:
            ep.in_flight -= 1
            if ok:
                ep.ok += 1
                ep.fails, ep.probation = 0, False
            else:
                ep.failed += 1
                if server_down and ep.down_until <= time.monotonic():  # not already out
                    ep.fails += 1
                    if ep.probation or ep.fails >= self.config.down_after:
                        ep.outages += 1
                        cool = min(120.0, self.config.server_cooldown * 2 ** (ep.outages - 1))
                        ep.down_until = time.monotonic() + cool
                        ep.probation = True
                        ep.fails = 0
            self.cond.notify_all()

    def stats(self) -> dict:
        return {e.url: {"ok": e.ok, "failed": e.failed, "outages": e.outages}
                for e in self.endpoints}


def parse_completion(resp: httpx.Response) -> dict:
    """text, finish reason and token counts of a /v1/chat/completions answer (or RequestFailed)."""
    try:
        body = resp.json()
        choice = body["choices"][0]
        text = choice["message"]["content"]
        finish = choice.get("finish_reason")
        usage = body.get("usage") or {}
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise RequestFailed(f"malformed response body ({type(exc).__name__}: {str(exc)[:120]})",
                            retryable=True)
    if not isinstance(text, str):
        raise RequestFailed("malformed response body (message.content is not a string)", True)
    return {"text": text, "finish_reason": finish, "prompt_tokens": usage.get("prompt_tokens"),
            "completion_tokens": usage.get("completion_tokens")}


def reason_kind(reason: str) -> str:
    """A short category of an error reason, for counts (timeout, connection, HTTP 500, ...)."""
    body = reason.split(": ", 1)[1] if reason.startswith("turn ") else reason
    if body.startswith("HTTP "):
        return body.split(":")[0]
    for kind in ("timeout", "connection", "malformed"):
        if kind in body.split(" (")[0]:
            return kind
    return body[:40]


class ChatClient:
    """Requests with timeouts, retries and exponential backoff over a ServerPool."""

    def __init__(self, pool: ServerPool, config: RegenConfig, stats: RunStats):
        self.pool, self.config, self.stats = pool, config, stats
        n = sum(e.capacity for e in pool.endpoints)
        self.http = httpx.AsyncClient(
            timeout=httpx.Timeout(config.request_timeout, connect=min(10.0, config.request_timeout)),
            limits=httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4))

    async def aclose(self) -> None:
        await self.http.aclose()

    def body(self, messages: list[dict]) -> dict:
        c = self.config
        body = {"model": c.model, "messages": messages, "max_tokens": c.max_tokens,
                "temperature": c.temperature, "top_p": c.top_p}
        if c.stop:
            body["stop"] = c.stop
        if c.seed is not None:
            body["seed"] = c.seed
        return body

    async def _once(self, ep: Endpoint, body: dict) -> dict:
        try:
            resp = await self.http.post(f"{ep.url}/v1/chat/completions", json=body)
        except httpx.ConnectError as exc:
            raise RequestFailed(f"connection refused or failed ({exc})", True, server_down=True)
        except httpx.ConnectTimeout:
            raise RequestFailed("connect timeout", True, server_down=True)
        except httpx.TimeoutException as exc:
            raise RequestFailed(f"timeout after {self.config.request_timeout:g} s "
                                f"({type(exc).__name__})", True)
        except httpx.TransportError as exc:  # dropped connection, incomplete body, ...
            raise RequestFailed(f"connection dropped ({type(exc).__name__}: {exc})", True,
                                server_down=True)
        if resp.status_code != 200:
            retry_after = None
            if resp.status_code == 429:
                try:
                    retry_after = float(resp.headers.get("retry-after", ""))
                except ValueError:
                    pass
            return_text = resp.text[:200].replace("\n", " ")
            raise RequestFailed(f"HTTP {resp.status_code}: {return_text}",
                                retryable=resp.status_code in RETRY_STATUS or resp.status_code >= 500,
                                retry_after=retry_after)
        return parse_completion(resp)

    async def complete(self, messages: list[dict]) -> tuple[dict, int]:
        """One assistant turn; returns (result with 'server', attempts) or raises RequestFailed."""
        body = self.body(messages)
        c = self.config
        for attempt in range(c.max_retries + 1):
            ep = await self.pool.acquire()
            self.stats.requests += 1
            try:
                result = await self._once(ep, body)
            except RequestFailed as exc:
                await self.pool.release(ep, ok=False, server_down=exc.server_down)
                if not exc.retryable or attempt == c.max_retries:
                    exc.reason = f"{exc.reason} [server {ep.url}, attempt {attempt + 1}]"
                    raise
                self.stats.retries += 1
                delay = min(c.backoff_max, c.backoff_base * 2 ** attempt) * random.uniform(0.5, 1.0)
                if exc.retry_after is not None:
                    delay = min(c.backoff_max, max(delay, exc.retry_after))
                await asyncio.sleep(delay)
                continue
            except BaseException:
                await self.pool.release(ep, ok=False)
                raise
            await self.pool.release(ep, ok=True)
            result["server"] = ep.url
            return result, attempt + 1
        raise AssertionError("unreachable")


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
        plan[i] = {"role": "assistant", "content": result.pop("text")}
        turns.append(result)
    return build_row(row, plan, turns, client.config, "server", attempts, t0)


async def regenerate_async(rows: list[dict], work: str | os.PathLike, base_urls: list[str],
                           config: RegenConfig, *, input_path: str = "", progress: bool = True,
                           desc: str = "regenerate") -> dict:
    """Regenerate the rows not yet finished in `work`; returns the run's summary."""
    work = Path(work)
    with WorkLock(work):
        return await _regenerate_locked(rows, work, base_urls, config, input_path=input_path,
                                        progress=progress, desc=desc)


async def _regenerate_locked(rows, work, base_urls, config, *, input_path, progress, desc):
    state = scan_work(work)
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise RecordError(f"{input_path or 'input'}: duplicate ids; ids must be unique")
    finished = state.finished
    todo = [r for r in rows if r["id"] not in finished
            and (config.retry_errors or r["id"] not in state.errors)]
    stats = RunStats(total=len(rows), skipped=len(rows) - len(todo))
    write_manifest(work, input_path, len(rows), config, "server", list(base_urls))
    out = Outputs(work, config)
    out.written |= finished
    pool = ServerPool(list(base_urls), config)
    client = ChatClient(pool, config, stats)
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
    try:
        await asyncio.gather(*(worker() for _ in range(n_workers)))
    finally:
        bar.close()
        out.close()
        await client.aclose()
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


def regenerate(rows: list[dict], work: str | os.PathLike, base_urls: list[str],
               config: RegenConfig, **kwargs) -> dict:
    """Blocking wrapper of `regenerate_async` (works in scripts and notebooks)."""
    return run_sync(regenerate_async(rows, work, base_urls, config, **kwargs))


# ------------------------------------------------------------------ the stage (notebook 03)

def regenerate_splits(inputs: dict[str, str | os.PathLike], out_dir: str | os.PathLike,
                      config: RegenConfig, *, backend: str = "server", base_urls=(),
                      target: str = "tiny", device: str = "cpu", dtype=None,
                      batch_size: int = 1024, batch_tokens: int = 0, limits: dict[str, int] | None = None,
                      progress: bool = True) -> dict:
    """Regenerate each split (e.g. train, val) into OUT/<split>.jsonl, resumably.

    backend "server": the given base URLs, or else a `transformers serve` of `target` started
    on loopback for the duration (log: OUT/serve.log). backend "batch": `regen_batch`.
    Work folders are OUT/work/<split>/ (what `draftlab monitor` reads).
    """
    from contextlib import ExitStack

    from draftlab.target import EMBEDDED_NAME, resolve_path

    out_dir = Path(out_dir)
    limits = limits or {}
    rows = {s: load_conversations(p, limits.get(s, 0)) for s, p in inputs.items()}
    config.model_name = config.model_name or (EMBEDDED_NAME if target == "embedded" else target)
    report = {"backend": backend, "splits": {}, "server_startup_s": None}
    with ExitStack() as stack:
        urls = list(base_urls)
        if backend == "batch":
            from draftlab.regen_batch import regenerate_batch
            from draftlab.target import load_target

            tgt = load_target(target, device=device, dtype=dtype)
            config.model = config.model or target
        elif not urls:
            from draftlab.serve import LocalServer

            # the tiny target's ops are too small for two CPU threads (notes/issue4.md)
            threads = 1 if target == "tiny" and device == "cpu" else None
            srv = stack.enter_context(LocalServer(resolve_path(target), out_dir / "serve.log",
                                                  device=device, threads=threads))
            urls, config.model = [srv.base_url], config.model or srv.model
            report["server_startup_s"] = round(srv.startup_s, 1)
        elif not config.model:
            raise ValueError("config.model (the served model name) is needed with base_urls")
        report["servers"] = urls
        for split, split_rows in rows.items():
            work = out_dir / "work" / split
            if backend == "batch":
                summary = regenerate_batch(split_rows, work, config, target=tgt, batch_size=batch_size,
                                           batch_tokens=batch_tokens, input_path=str(inputs[split]),
                                           progress=progress, desc=f"regenerate[batch] {split}")
            else:
                summary = regenerate(split_rows, work, urls, config, input_path=str(inputs[split]),
                                     progress=progress, desc=f"regenerate {split}")
            summary["final"] = finalize(work, out_dir / f"{split}.jsonl", split_rows)
            summary["work"] = str(work)
            report["splits"][split] = summary
    return report


# ------------------------------------------------------------------ client-overhead benchmark

def bench_prompts(n: int, seed: int = 0) -> list[dict]:
    """Short, varied chat prompts for throughput measurements (no dataset needed)."""
    rng = random.Random(seed)
    topics = ["rivers", "prime numbers", "bread", "volcanoes", "chess", "owls", "batteries",
              "tides", "jazz", "glaciers", "bicycles", "honey", "comets", "maps", "clocks"]
    asks = ["Explain {} to a child.", "Write three facts about {}.", "Why do people like {}?",
            "Describe {} in one paragraph.", "What is the history of {}?"]
    rows = []
    for i in range(n):
        text = rng.choice(asks).format(rng.choice(topics))
        rows.append({"id": f"bench-{i:05d}", "source": "bench",
                     "messages": [{"role": "user", "content": text}], "meta": {}})
    return rows


async def _bench_openai(base_url: str, rows: list[dict], config: RegenConfig) -> dict:
    """The reference: bare asyncio.gather over the openai SDK, a semaphore for the concurrency."""
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key="not-needed",
                         timeout=config.request_timeout, max_retries=0)
    sem = asyncio.Semaphore(config.concurrency)
    extra = {"stop": config.stop} if config.stop else {}

    async def one(row):
        async with sem:
            r = await client.chat.completions.create(
                model=config.model, messages=row["messages"], max_tokens=config.max_tokens,
                temperature=config.temperature, top_p=config.top_p, **extra)
            return r.usage.completion_tokens

    t0 = time.perf_counter()
    tokens = await asyncio.gather(*(one(r) for r in rows))
    wall = time.perf_counter() - t0
    await client.close()
    return {"tokens": sum(tokens), "wall_s": wall, "tok_s": sum(tokens) / wall}


def bench_client(base_url: str, model: str, *, n: int = 64, concurrency: int = 8,
                 max_tokens: int = 32, rounds: int = 4, work: str | os.PathLike | None = None,
                 seed: int = 0) -> dict:
    """Our client (full path: resume scan, records, shard writes) vs bare openai SDK gather.

    Same server, prompts, concurrency and sampling (greedy). Rounds alternate which client goes
    first (ABBA) so drift and neighbours' load hit both; reported: the ratio of total tokens/s
    and the median of the per-round paired ratios (ours / SDK; >= 1.0: no client overhead).
    """
    import statistics
    import tempfile

    config = RegenConfig(model=model, max_tokens=max_tokens, concurrency=concurrency,
                         temperature=0.0, truncation="keep_flag")
    rows = bench_prompts(n, seed)
    base = Path(work) if work else Path(tempfile.mkdtemp(prefix="draftlab-bench-"))

    def ours(k):
        t0 = time.perf_counter()
        s = regenerate(rows, base / f"round{k}", [base_url], config, progress=False)
        wall = time.perf_counter() - t0
        if s["rows_done"] != n:
            raise RuntimeError(f"our client finished {s['rows_done']} of {n} rows: {s}")
        return {"tokens": s["completion_tokens"], "wall_s": wall,
                "tok_s": s["completion_tokens"] / wall}

    run_sync(_bench_openai(base_url, rows[: min(8, n)], config))  # warm-up, not counted
    results = {"ours": [], "openai_sdk": []}
    for k in range(rounds):
        order = ("ours", "openai_sdk") if k % 2 else ("openai_sdk", "ours")
        for name in order:
            results[name].append(ours(k) if name == "ours"
                                 else run_sync(_bench_openai(base_url, rows, config)))
    if not work:
        import shutil

        shutil.rmtree(base, ignore_errors=True)
    tot = {k: sum(r["tokens"] for r in v) / sum(r["wall_s"] for r in v) for k, v in results.items()}
    paired = [a["tok_s"] / b["tok_s"] for a, b in zip(results["ours"], results["openai_sdk"])]
    return {"base_url": base_url, "n": n, "concurrency": concurrency, "max_tokens": max_tokens,
            "rounds": results, "ours_tok_s": tot["ours"], "openai_sdk_tok_s": tot["openai_sdk"],
            "ratio": tot["ours"] / tot["openai_sdk"], "ratio_median": statistics.median(paired),
            "paired_ratios": paired}


# ------------------------------------------------------------------ CLI

def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    d = RegenConfig()
    g = p.add_argument_group("sampling and policies (recorded on every row)")
    g.add_argument("--max-tokens", type=int, default=d.max_tokens)
    g.add_argument("--temperature", type=float, default=d.temperature)
    g.add_argument("--top-p", type=float, default=d.top_p)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--system-policy", choices=SYSTEM_POLICIES, default=d.system_policy)
    g.add_argument("--system-prompt", default="", help="the system prompt for --system-policy set")
    g.add_argument("--truncation", choices=TRUNCATION_POLICIES, default=d.truncation,
                   help="what to do with answers cut at max-tokens (finish_reason=length)")
    g.add_argument("--max-assistant-turns", type=int, default=0, help="0: all turns")


def add_regenerate_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "regenerate", help="answer every prompt again with the target (resumable)",
        description="Regenerate conversations with the target: a local/remote OpenAI-compatible "
                    "server (--base-url, or --serve to start transformers serve) or the static "
                    "batch backend (--backend batch, the GPU path). Rerun the same command to "
                    "resume after any crash.")
    p.add_argument("input", help="canonical conversations, JSONL")
    p.add_argument("work", help="work folder (shards, errors, manifest); resume state lives here")
    p.add_argument("--output", default=None, help="final JSONL in input order (written at the end)")
    p.add_argument("--backend", choices=("server", "batch"), default="server")
    p.add_argument("--base-url", action="append", default=[], help="server base URL (repeatable)")
    p.add_argument("--serve", default=None, metavar="TARGET",
                   help="start `transformers serve` for this target spec or folder on loopback")
    p.add_argument("--model", default=None, help="model field of requests (default: the served folder)")
    p.add_argument("--model-name", default="", help="name recorded on rows")
    p.add_argument("--concurrency", type=int, default=8, help="in-flight requests per server")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--max-retries", type=int, default=5)
    p.add_argument("--limit", type=int, default=0, help="only the first N input rows")
    p.add_argument("--shard-rows", type=int, default=10000)
    p.add_argument("--no-retry-errors", action="store_true", help="on resume, skip ids in errors.jsonl")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--log-dir", default=None, help="where --serve writes serve.log (default: work)")
    g = p.add_argument_group("batch backend (--backend batch) and --serve")
    g.add_argument("--target", default="embedded", help="target spec for the batch backend")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda (batch backend, --serve)")
    g.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    g.add_argument("--batch-size", type=int, default=1024)
    g.add_argument("--batch-tokens", type=int, default=0,
                   help="padded tokens (rows x (longest prompt + max tokens)) per generate call at most; 0: no limit")
    g.add_argument("--cache", choices=("dynamic", "static"), default="dynamic",
                   help="KV cache of generate; static lets transformers compile the step on CUDA")
    _add_sampling_args(p)
    p.set_defaults(func=_regenerate_cli)


def config_from_args(args: argparse.Namespace, model: str) -> RegenConfig:
    return RegenConfig(
        model=model, model_name=args.model_name, temperature=args.temperature, top_p=args.top_p,
        max_tokens=args.max_tokens, stop=args.stop, seed=args.seed,
        system_policy=args.system_policy, system_prompt=args.system_prompt,
        truncation=args.truncation, max_assistant_turns=args.max_assistant_turns,
        concurrency=args.concurrency, request_timeout=args.timeout, max_retries=args.max_retries,
        shard_rows=args.shard_rows, retry_errors=not args.no_retry_errors)


def _regenerate_cli(args: argparse.Namespace) -> int:
    rows = load_conversations(args.input, args.limit)
    work = Path(args.work)
    if args.backend == "batch":
        from draftlab.regen_batch import regenerate_batch

        config = config_from_args(args, model=args.target)
        summary = regenerate_batch(rows, work, config, target=args.target, device=args.device,
                                   dtype=args.dtype, batch_size=args.batch_size,
                                   input_path=args.input, progress=not args.no_progress,
                                   cache=args.cache, batch_tokens=args.batch_tokens)
    elif args.serve:
        from draftlab.serve import LocalServer
        from draftlab.target import resolve_device, resolve_path

        folder = resolve_path(args.serve)
        log = Path(args.log_dir or work) / "serve.log"
        with LocalServer(folder, log_path=log, device=resolve_device(args.device)) as srv:
            print(f"server {srv.base_url} ready in {srv.startup_s:.1f} s (log {log})", flush=True)
            config = config_from_args(args, model=args.model or srv.model)
            config.model_name = args.model_name or Path(folder).name
            summary = regenerate(rows, work, [srv.base_url, *args.base_url], config,
                                 input_path=args.input, progress=not args.no_progress)
    else:
        if not args.base_url or not args.model:
            raise SystemExit("regenerate: give --base-url URL and --model NAME, or --serve TARGET")
        config = config_from_args(args, model=args.model)
        summary = regenerate(rows, work, args.base_url, config, input_path=args.input,
                             progress=not args.no_progress)
    if args.output:
        summary["final"] = finalize(work, args.output, rows)
    print(json.dumps(summary, indent=1))
    return 0 if summary["rows_error"] == 0 else 1


def add_bench_client_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "client", help="client overhead: draftlab regenerate vs bare openai-SDK gather",
        description="Side by side against the same server at the same concurrency; prints "
                    "tokens/s of each and their ratio (>= 1.0 means no client overhead).")
    p.add_argument("--base-url", default=None, help="an existing server")
    p.add_argument("--model", default=None, help="model field of requests")
    p.add_argument("--serve", default=None, metavar="TARGET",
                   help="start transformers serve for this target (default: embedded)")
    p.add_argument("--n", type=int, default=64, help="requests per round")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--device", default="cpu", help="device of the --serve server")
    p.add_argument("--json", default=None, help="also write the result here")
    p.set_defaults(func=_bench_client_cli)


def _bench_client_cli(args: argparse.Namespace) -> int:
    kw = dict(n=args.n, concurrency=args.concurrency, max_tokens=args.max_tokens,
              rounds=args.rounds)
    if args.base_url:
        if not args.model:
            raise SystemExit("bench client: --base-url needs --model")
        res = bench_client(args.base_url, args.model, **kw)
    else:
        import tempfile

        from draftlab.serve import LocalServer
        from draftlab.target import resolve_path

        folder = resolve_path(args.serve or "embedded")
        log = Path(tempfile.mkdtemp(prefix="draftlab-bench-")) / "serve.log"
        with LocalServer(folder, log_path=log, device=args.device) as srv:
            res = bench_client(srv.base_url, srv.model, **kw)
    res["target"] = args.serve or args.model
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftlab.regenerate")
    sub = parser.add_subparsers(dest="command", required=True)
    add_regenerate_parser(sub)
    add_bench_client_parser(sub)
    args = parser.parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
