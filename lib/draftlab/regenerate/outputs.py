"""The work folder of a regeneration run: crash-safe shards, manifest, lock, resume scan, final file.

Each line is written whole with one `write()` on an O_APPEND descriptor, so `kill -9` can at
worst leave a torn last line; the next run cuts it off (the row is redone). A row id is finished
when it is in a shard or in dropped.jsonl; a rerun skips those, so a crash loses nothing and
duplicates nothing. `finalize` writes the training file in the input's order.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftlab.core.errors import InputError, RunFailure
from draftlab.core.files import atomic_write_json
from draftlab.core.progress import tqdm
from draftlab.core.records import RecordError, jsonl_line, jsonl_lines, write_jsonl
from draftlab.regenerate.config import RegenConfig, slots

# ------------------------------------------------------------------ output files


class JsonlAppender:
    """One whole line per `write()` on an O_APPEND descriptor: a crash can only tear the last line."""

    def __init__(self, path: Path, fsync: bool = False):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.fsync = path, fsync
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        self.rows = 0

    def write(self, row: dict) -> None:
        view = memoryview(jsonl_line(row))
        while view:
            view = view[os.write(self.fd, view) :]
        if self.fsync:
            os.fsync(self.fd)
        self.rows += 1

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def repair_jsonl(path: Path) -> list[dict]:
    """Read a JSONL file, cutting a torn last line off the file; a bad line elsewhere is an error."""
    rows = []
    for line in jsonl_lines(path):
        if line.error is not None:
            if line.last:
                with open(path, "r+b") as fh:  # torn tail: cut it so the file is all valid lines
                    fh.truncate(line.start)
                return rows
            raise RecordError(f"{path}: line {line.lineno}: not valid JSON ({line.error})") from line.error
        rows.append(line.row)
        if not line.terminated:  # a whole row without its newline: complete the line
            with open(path, "ab") as fh:
                fh.write(b"\n")
    return rows


@dataclass
class WorkState:
    """What a work folder already holds."""

    done: dict = field(default_factory=dict)  # id -> shard row
    dropped: dict = field(default_factory=dict)  # id -> dropped record
    errors: dict = field(default_factory=dict)  # id -> last error record
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
    return [line.row for line in jsonl_lines(path) if line.error is None]


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
            self.shard = JsonlAppender(self.work / "shards" / f"part-{self.next_index:05d}.jsonl", self.config.fsync)
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
IDENTITY_FIELDS = (
    "temperature",
    "top_p",
    "max_tokens",
    "stop",
    "seed",
    "system_policy",
    "system_prompt",
    "truncation",
    "max_assistant_turns",
)


class WorkLock:
    """An exclusive flock on WORK/.lock: two writers in one folder would duplicate rows.
    The kernel drops it when the process dies (kill -9 included), so no stale locks."""

    def __init__(self, work: Path):
        import fcntl

        if work.exists() and not work.is_dir():
            raise InputError(f"{work}: is a file; the work folder must be a folder (or not exist yet)")
        try:
            work.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"{work}: cannot create the work folder ({exc.strerror or exc})") from exc
        self.fd = os.open(work / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(self.fd, 32, 0).decode(errors="replace").strip()
            os.close(self.fd)
            raise RunFailure(
                f"{work}: another process (pid {other or '?'}) is regenerating "
                f"into this folder; wait for it or stop it first"
            ) from None
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


def read_manifest(work: Path) -> dict:
    """WORK/manifest.json, or an InputError naming it when it is not a manifest."""
    path = Path(work) / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise InputError(
            f"{path}: not a readable manifest ({exc}); move the folder aside or use a new work folder"
        ) from exc
    if not isinstance(manifest, dict) or not isinstance(manifest.get("runs", []), list):
        raise InputError(f"{path}: not a regeneration manifest (no 'runs' list)")
    manifest.setdefault("runs", [])
    return manifest


def job_fingerprint(input_path: str, rows: list[dict] | None, config: RegenConfig) -> dict:
    """What defines a regeneration job: the input's content (sha256 of the file, or of the rows when no
    file is named), the model asked and every parameter a row's content depends on."""
    path = Path(input_path) if input_path else None
    if path is not None and path.is_file():
        digest = hashlib.sha256()
        with open(path, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        sha = digest.hexdigest()
    else:  # rows given directly (a subset may come first): `check_same_prompts` compares them row by row
        sha = None
    job = {"input": str(path.resolve()) if path else "", "input_sha256": sha, "model": config.model}
    return job | {k: getattr(config, k) for k in IDENTITY_FIELDS}


def _job_changes(manifest: dict, job: dict) -> list[str]:
    """What differs between the job a folder was started for and this one ('name: old -> new').

    A folder written before jobs were recorded has only its config and input path: it is adopted when
    those agree (the same command resumes it, as it always did), since refusing it would throw away
    every row it holds; a different input file name, model or sampling is refused as for any folder."""
    old = manifest.get("job")
    if old is None:
        config = manifest.get("config") or {}
        old = {k: config[k] for k in ("model", *IDENTITY_FIELDS) if k in config}
        if manifest.get("input"):
            old["input_name"] = Path(manifest["input"]).name
        job = {**job, "input_name": Path(job["input"]).name}
    changes = []
    if old.get("input_sha256") and job["input_sha256"] and old["input_sha256"] != job["input_sha256"]:
        changes.append(
            f"input: {old.get('input') or 'rows'} (sha256 {old['input_sha256'][:12]}) -> "
            f"{job['input'] or 'rows'} (sha256 {job['input_sha256'][:12]})"
        )
    if "input_name" in old and job.get("input_name") and old["input_name"] != job["input_name"]:
        changes.append(f"input: {old['input_name']} -> {job['input_name']}")
    for key in ("model", *IDENTITY_FIELDS):
        if key in old and old[key] != job[key]:
            changes.append(f"{key}: {old[key]!r} -> {job[key]!r}")
    return changes


def check_same_prompts(work: Path, state: WorkState, rows: list[dict]) -> None:
    """Every finished row of the folder whose id is in `rows` was made from the same prompts (the
    user turns), or an InputError naming the first id that differs: a row of another dataset."""
    for row in rows:
        done = state.done.get(row["id"])
        if done is None:
            continue
        ours = [m["content"] for m in row["messages"] if m["role"] == "user"]
        theirs = [m.get("content") for m in done.get("messages") or [] if m.get("role") == "user"]
        if theirs != ours[: len(theirs)] or not theirs:
            raise InputError(
                f"{work}: holds row {row['id']!r} made from other prompts than the input's; "
                f"resume with the same input, or use a new work folder"
            )


def write_manifest(
    work: Path,
    input_path: str,
    total: int,
    config: RegenConfig,
    backend: str,
    servers: list[str],
    rows: list[dict] | None = None,
    state: WorkState | None = None,
) -> None:
    """manifest.json: the job the folder holds (`job_fingerprint`), and the runs' start times that the
    monitor reads. A folder holding rows of another job (input, model, sampling) is refused, unchanged."""
    path = work / "manifest.json"
    manifest = read_manifest(work) if path.exists() else {"runs": []}
    job = job_fingerprint(input_path, rows, config)
    changes = _job_changes(manifest, job)
    if changes and (shard_paths(work) or (work / "dropped.jsonl").exists()):
        raise InputError(
            f"{work}: holds rows of another job ({'; '.join(changes)}); "
            f"resume with the same input, model and parameters, or use a new work folder"
        )
    if rows is not None and state is not None:
        check_same_prompts(work, state, rows)
    manifest.update(input=str(input_path), total=total, config=asdict(config), job=job)
    manifest["runs"].append({"started": time.time(), "backend": backend, "servers": servers, "pid": os.getpid()})
    atomic_write_json(path, manifest, indent=1)


def write_status(work: Path, state: str, **fields) -> None:
    """WORK/status.json: the writer's own word on where it stands (running, stalled while no server
    answers, stopped, done), so `draftlab monitor` can say "stalled" rather than show an ETA."""
    atomic_write_json(
        Path(work) / "status.json", {"state": state, "pid": os.getpid(), "t": time.time(), **fields}, indent=1
    )


def read_status(work: Path) -> dict | None:
    """The status a writer left, or None (none written, or unreadable mid-replace)."""
    try:
        status = json.loads((Path(work) / "status.json").read_text())
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def finalize(work: str | os.PathLike, output: str | os.PathLike, rows: list[dict]) -> dict:
    """Write the training file: finished rows in the input's order (atomic replace). Counts back."""
    work, output = Path(work), Path(output)
    state = scan_work(work)
    done = [state.done[row["id"]] for row in rows if row["id"] in state.done]
    empty = [r for r in done if _has_empty_answer(r)]  # rows an older version kept: nothing to train on
    kept = write_jsonl(output, (r for r in done if not _has_empty_answer(r)))
    ids = {r["id"] for r in rows}
    errors = {i for i in state.errors if i in ids and i not in state.finished}
    return {
        "rows_in": len(rows),
        "rows_kept": kept,
        "rows_empty_answer": len(empty),
        "rows_dropped_truncated": len(ids & set(state.dropped)),
        "rows_error": len(errors),
        "rows_missing": len(ids - state.finished - errors),
        "duplicates_seen": state.duplicates,
        "output": str(output),
    }


def _has_empty_answer(row: dict) -> bool:
    messages = row.get("messages") or []
    return any(not str(messages[i].get("content") or "").strip() for i in slots(messages)) if messages else True


def build_row(
    row: dict, plan: list[dict], turns: list[dict], config: RegenConfig, backend: str, attempts: int, t0: float
) -> dict:
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
        out.write_dropped(
            {
                "id": regen_row["id"],
                "reason": "length",
                "turns": regen["truncated_turns"],
                "finish_reasons": regen["finish_reasons"],
                "completion_tokens": regen["completion_tokens"],
                "prompt_tokens": regen["prompt_tokens"],
                "t_done": regen["t_done"],
            }
        )
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
    skipped: int = 0  # finished by an earlier run
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
        return {
            "rows_total": self.total,
            "rows_skipped_resume": self.skipped,
            "rows_done": self.done,
            "rows_dropped_truncated": self.dropped,
            "rows_kept_truncated": self.kept_flagged,
            "rows_error": self.errors,
            "requests": self.requests,
            "retries": self.retries,
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "finish_reasons": dict(self.finish_reasons),
            "error_reasons": dict(self.error_reasons),
            "wall_s": round(wall, 2),
            "tok_s": round(self.completion_tokens / wall, 2) if wall > 0 else 0.0,
        }


class Progress:
    """tqdm over rows with tokens/s, errors and truncations in the postfix."""

    def __init__(self, stats: RunStats, enabled: bool, desc: str = "regenerate"):
        self.stats, self.bar, self.last = stats, None, 0.0
        if enabled:
            self.bar = tqdm(
                total=stats.total, initial=stats.skipped, unit="row", desc=desc, dynamic_ncols=True, smoothing=0.1
            )

    def note(self, text: str, every: float = 10.0) -> None:
        """Say something about the run (a server lost, back again): the bar's postfix, or without a
        bar one line on stderr at most every `every` seconds (each new kind of text at once)."""
        if self.bar is not None:
            self.bar.set_postfix_str(text, refresh=True)
            return
        import sys

        now, kind = time.monotonic(), text.split(" for ")[0]
        if kind != getattr(self, "_kind", None) or now - getattr(self, "_said", 0.0) >= every:
            self._kind, self._said = kind, now
            print(text, file=sys.stderr, flush=True)

    def step(self, n: int = 1) -> None:
        if self.bar is None:
            return
        self.bar.update(n)
        now = time.monotonic()
        if now - self.last > 0.5:
            self.last = now
            s = self.stats
            wall = max(now - s.t_start, 1e-6)
            self.bar.set_postfix(
                tok_s=f"{s.completion_tokens / wall:.1f}", err=s.errors, trunc=s.dropped + s.kept_flagged, refresh=False
            )

    def close(self) -> None:
        if self.bar is not None:
            self.step(0)
            self.bar.close()
