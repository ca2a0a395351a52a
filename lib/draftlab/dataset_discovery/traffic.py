"""A team's own served requests as canonical conversations: what its server actually sees.

Read per line, in any of these forms:
- `{"messages": [...]}` (OpenAI chat messages, optionally with `id` and `meta`);
- a full `/v1/chat/completions` request body (`model`, `messages`, `temperature`, `max_tokens`, ...),
  or an OpenAI batch-file line that holds one under `body`;
- SGLang's request log written with `--log-requests --log-requests-level 3 --log-requests-format json
  --log-requests-target DIR` (SGLang 0.5.17: DIR/<host>_<rank>.log, each line `[time] {"event": ...}`):
  the `request.received.openai` events carry the OpenAI body under `obj`; other events (the tokenized
  `request.received` / `request.finished`, whose prompt is already rendered by the chat template) are
  skipped. At level 2 SGLang cuts every string over 2,048 characters to its two ends joined by '...':
  such rows are refused, since a cut prompt is not what the server saw.
SGLang's other dump, `--dump-requests-folder` (configure_logging), is a pickle of its internal
request objects holding rendered prompt text or token ids, not messages, and unpickling it needs
SGLang's classes: not read here.

A bad row is one line naming the file, the line and the field: an error for `draftlab bench`, a
reject record for `draftlab blend` (as every blend source).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Iterator

from draftlab.core.records import RecordError, conversation_id
from draftlab.dataset_discovery.sources import Normalized, RowError, check_messages

LOG_PREFIX = re.compile(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] ")
OPENAI_EVENT = "request.received.openai"
SGLANG_CUT = 2048  # SGLang's --log-requests-level 2 string limit (request_logger._transform_data_for_logging)
ROLE_MAP = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
SAMPLING_KEYS = ("model", "temperature", "top_p", "max_tokens", "max_completion_tokens", "stream")


def _content(value, where: str) -> str:
    """A message's text: a string, or OpenAI content parts of type text joined."""
    if isinstance(value, str):
        if len(value) == SGLANG_CUT + 3 and value[SGLANG_CUT // 2 : SGLANG_CUT // 2 + 3] == "...":
            raise RowError(f"{where} was cut to 2,048 characters by SGLang's --log-requests-level 2; log with level 3")
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            if kind != "text" or not isinstance(part.get("text"), str):
                raise RowError(f"{where}[{j}] is a {kind!r} part; only text parts can be replayed")
            texts.append(_content(part["text"], f"{where}[{j}].text"))
        return "\n".join(texts)
    raise RowError(f"{where} is {type(value).__name__}, not a string or a list of text parts")


def request_messages(body: dict) -> list[dict]:
    """Canonical messages of one chat request body; RowError naming the field otherwise."""
    if "messages" not in body:
        raise RowError(f"no 'messages' field (keys {sorted(body)[:8]})")
    turns = body["messages"]
    if not isinstance(turns, list) or not turns:
        raise RowError("field 'messages' is not a non-empty list")
    messages = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, dict):
            raise RowError(f"messages[{i}] is {type(turn).__name__}, not an object")
        role = turn.get("role")
        if role not in ROLE_MAP:
            raise RowError(f"messages[{i}].role is {role!r}; replayable roles are {sorted(ROLE_MAP)}")
        if turn.get("content") is None:
            raise RowError(f"messages[{i}].content is missing (a tool call without text cannot be replayed)")
        messages.append({"role": ROLE_MAP[role], "content": _content(turn["content"], f"messages[{i}].content")})
    check_messages(messages)
    return messages


def _request_body(row: dict) -> dict | None:
    """The chat request a line holds, or None for an SGLang log event that is not one."""
    if "event" in row and "obj" in row:
        return row["obj"] if row["event"] == OPENAI_EVENT else None
    if isinstance(row.get("body"), dict) and "messages" not in row:
        return row["body"]
    return row


def traffic_rows(path: str | Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line, {"messages", "meta"}, None) per request, or (line, None, reason) for a bad one."""
    path = Path(path)
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8").strip()
            except UnicodeDecodeError as exc:
                yield lineno, None, f"invalid UTF-8 at byte {exc.start}"
                continue
            if not text:
                continue
            try:
                row = json.loads(LOG_PREFIX.sub("", text, count=1))
            except json.JSONDecodeError as exc:
                yield lineno, None, f"not valid JSON ({exc.msg})"
                continue
            if not isinstance(row, dict):
                yield lineno, None, f"row is {type(row).__name__}, not an object"
                continue
            body = _request_body(row)
            if body is None:
                continue
            try:
                messages = request_messages(body)
            except RowError as exc:
                yield lineno, None, str(exc)
                continue
            meta = {k: body[k] for k in SAMPLING_KEYS if isinstance(body.get(k), (str, int, float, bool))}
            if isinstance(row.get("meta"), dict):
                meta |= {k: v for k, v in row["meta"].items() if isinstance(v, (str, int, float, bool))}
            yield lineno, {"messages": messages, "meta": meta, "id": row.get("id")}, None


def read_traffic(path: str | Path, source: str | None = None, limit: int | None = None) -> Normalized:
    """Every request of a traffic file as a canonical conversation; bad rows become rejects (blend)."""
    path = Path(path)
    if not path.is_file():
        raise RecordError(f"{path}: traffic file {'is a folder' if path.is_dir() else 'does not exist'}")
    source = source or f"traffic/{path.stem}"
    out = Normalized()
    for lineno, row, reason in traffic_rows(path):
        if limit is not None and len(out.conversations) >= limit:
            break
        if row is None:
            out.rejects.append({"source": source, "line": lineno, "reason": reason})
            continue
        meta = {**row["meta"], "line": lineno, "adapter": "traffic", "file": path.name}
        out.conversations.append(
            {
                "id": conversation_id(row["messages"], source),
                "source": source,
                "messages": row["messages"],
                "meta": meta,
            }
        )
    return out


def traffic_prompts(path: str | Path, limit: int | None = None) -> list[dict]:
    """A traffic file as an evaluation set: the first bad row is an error naming file, line and field."""
    path = Path(path)
    rows = read_traffic(path, limit=limit)
    if rows.rejects:
        first = rows.rejects[0]
        raise RecordError(f"{path}: line {first['line']}: {first['reason']}")
    if not rows.conversations:
        raise RecordError(f"{path}: no chat requests in the file (OpenAI messages or SGLang's JSON request log)")
    return rows.conversations
