"""Canonical conversation records and crash-safe JSONL files shared by every stage."""

from __future__ import annotations

import hashlib
import json
import lzma
import os
from pathlib import Path
from typing import Iterable, Iterator, NamedTuple

from draftlab.core.errors import InputError
from draftlab.core.files import atomic_path

ROLES = ("system", "user", "assistant")


class RecordError(InputError):
    """An input is malformed or missing: a record, a file, the settings a run is resumed with.

    The message names the file, the 1-based line (or row) and the field, so it can stand alone:
    `draftlab` (core.errors.run_command) prints it as one line on stderr and exits 2 instead of a
    traceback. A ValueError (through InputError), so library callers that catch ValueError keep working.
    """


def conversation_id(messages: list[dict], source: str = "") -> str:
    """Stable content hash: the same source and messages give the same id on every machine."""
    payload = json.dumps(
        {"source": source, "messages": [[m["role"], m["content"]] for m in messages]},
        ensure_ascii=False,
        sort_keys=True,
        separators=(",", ":"),
    )
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()[:20]


def make_conversation(messages: list[dict], source: str, meta: dict | None = None) -> dict:
    return {"id": conversation_id(messages, source), "source": source, "messages": messages, "meta": meta or {}}


def validate_conversation(row: dict, where: str = "") -> None:
    """Raise RecordError naming the field when a row is not a canonical conversation."""
    prefix = f"{where}: " if where else ""
    for key in ("id", "messages"):
        if key not in row:
            raise RecordError(f"{prefix}missing field {key!r}")
    if not isinstance(row["messages"], list) or not row["messages"]:
        raise RecordError(f"{prefix}field 'messages' must be a non-empty list")
    for i, msg in enumerate(row["messages"]):
        if not isinstance(msg, dict):
            raise RecordError(f"{prefix}messages[{i}] is {type(msg).__name__}, not an object")
        if msg.get("role") not in ROLES:
            raise RecordError(f"{prefix}messages[{i}].role is {msg.get('role')!r}, not one of {ROLES}")
        if not isinstance(msg.get("content"), str):
            raise RecordError(f"{prefix}messages[{i}].content is {type(msg.get('content')).__name__}, not a string")


class JsonlLine(NamedTuple):
    """One non-blank line of a JSONL file: its row, or why it is not one."""

    lineno: int  # 1-based
    start: int  # byte offset of the line
    row: object  # the parsed value, None when `error` is set
    error: Exception | None  # json.JSONDecodeError or UnicodeDecodeError
    last: bool  # nothing but blanks follows: a bad line here is a torn tail (a crash mid-write)
    terminated: bool  # a newline ends it


def jsonl_lines(path: str | Path) -> Iterator[JsonlLine]:
    """Every non-blank line of a JSONL file (.jsonl, or .jsonl.xz as the repo keeps data), parsed. The one
    parse loop of draftlab's readers; each caller decides what a bad line means (an error, a torn tail to
    cut or skip, a rejected row)."""
    path = Path(path)
    data = lzma.decompress(path.read_bytes()) if path.suffix == ".xz" else path.read_bytes()
    content_end = len(data.rstrip())  # only blanks after this: a line ending at or past it is the last
    pos, lineno = 0, 0
    while pos < len(data):
        end = data.find(b"\n", pos)
        stop = len(data) if end < 0 else end
        lineno += 1
        raw = data[pos:stop]
        if raw.strip():
            try:
                row, error = json.loads(raw), None
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                row, error = None, exc
            # (`not data[end + 1:].strip()` here copied the rest of the file for every line: 6 minutes
            # for the 21.6K-row regenerated set)
            yield JsonlLine(lineno, pos, row, error, end < 0 or end + 1 >= content_end, end >= 0)
        pos = stop + 1


def jsonl_line(row) -> bytes:
    """One row as one JSONL line (UTF-8, non-ASCII kept, newline-terminated): what every writer writes."""
    return json.dumps(row, ensure_ascii=False).encode("utf-8") + b"\n"


def read_jsonl(path: str | Path, skip_torn_tail: bool = True) -> Iterator[dict]:
    """Yield rows; a torn last line (a crash mid-write) is skipped, a bad line elsewhere is an error."""
    for line in jsonl_lines(path):
        if line.error is None:
            yield line.row
        elif skip_torn_tail and not line.terminated:
            return  # no newline after it: the writer died mid-line
        else:
            raise RecordError(f"{path}: line {line.lineno}: not valid JSON ({line.error})") from line.error


def append_jsonl(path: str | Path, rows: Iterable[dict], fsync: bool = False) -> int:
    """Append rows, each as one whole line, flushed so a reader or a crash never sees half a row."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    count = 0
    with open(path, "ab") as fh:
        for row in rows:
            fh.write(jsonl_line(row))
            fh.flush()
            count += 1
        if fsync:
            os.fsync(fh.fileno())
    return count


def write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    """Write a whole file atomically (temp file + rename)."""
    with atomic_path(path) as tmp:
        count = append_jsonl(tmp, rows)
    return count


def prompt_messages(row: dict, where: str) -> list[dict]:
    """The prompt of a conversation: everything up to and including its last user turn.

    The one cutting rule for every evaluation set (live servers, the reference engine, the
    scaling study): the request a deployed server would get, earlier turns included.
    """
    validate_conversation(row, where)
    messages = row["messages"]
    last_user = max((i for i, m in enumerate(messages) if m["role"] == "user"), default=None)
    if last_user is None:
        raise ValueError(f"{where}: field 'messages' has no user turn to answer")
    return messages[: last_user + 1]
