"""Adapters: turn rows of public instruction/chat datasets into canonical conversations.

Every dataset family stores a conversation differently (Alpaca columns, ShareGPT from/value
lists, OpenAI messages, commit diffs...). One adapter per family maps a row to
``[{"role", "content"}, ...]``; `normalize` then checks the result and turns bad rows into
rejects (source, line, reason) instead of stopping the blend. A dataset whose columns fit no
adapter fails at once, naming its columns and the adapters tried.

Where a row came from is one number everywhere (reject records, a conversation's meta, the
blend's dropped rows): `line`, 1-based, the line an editor shows. For JSONL that is the file's
line; for a CSV the record's line when no quoted field spans lines (the header is line 1); for
sources without lines (Parquet, Hub datasets, built-in sources) the 1-based row number.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from draftlab.core.records import ROLES, RecordError, conversation_id, jsonl_lines

# Longer than any sane training conversation; such rows are almost always scraping accidents.
DEFAULT_MAX_CHARS = 200_000

# ShareGPT speaker names seen in the wild, mapped onto canonical roles.
SHAREGPT_ROLES = {
    "human": "user",
    "user": "user",
    "gpt": "assistant",
    "assistant": "assistant",
    "chatgpt": "assistant",
    "bard": "assistant",
    "bing": "assistant",
    "model": "assistant",
    "system": "system",
}


class AdapterError(RecordError):
    """A dataset's columns fit no adapter (or not the one asked for), or its file cannot be read as one.

    A RecordError, so `draftlab` reports it as one line (cli.main) instead of a traceback.
    """


class RowError(ValueError):
    """One row cannot become a conversation; the message is the reason written to the rejects file."""


@dataclass(frozen=True)
class Adapter:
    name: str
    required: tuple[str, ...]
    convert: Callable[[dict, dict], list[dict]]  # (row, options) -> messages
    description: str
    forbidden: tuple[str, ...] = ()  # columns whose presence means another family
    meta_fields: tuple[str, ...] = ()
    keeps_meta: bool = False  # the row's own `meta` (draftlab's conversations read back: a definition, a template)

    def matches(self, columns: Iterable[str]) -> bool:
        cols = set(columns)
        return all(c in cols for c in self.required) and not any(c in cols for c in self.forbidden)


def _text(row: dict, key: str, optional: bool = False) -> str:
    """A string field of a raw row, or RowError naming the field."""
    if key not in row or row[key] is None:
        if optional:
            return ""
        raise RowError(f"missing field {key!r}")
    value = row[key]
    if not isinstance(value, str):
        raise RowError(f"field {key!r} is {type(value).__name__}, not str")
    return value


def _pair(user: str, assistant: str, system: str = "") -> list[dict]:
    messages = [{"role": "system", "content": system}] if system.strip() else []
    messages.append({"role": "user", "content": user})
    messages.append({"role": "assistant", "content": assistant})
    return messages


def _alpaca(row: dict, opts: dict) -> list[dict]:
    instruction = _text(row, "instruction")
    extra = _text(row, "input", optional=True)
    user = f"{instruction}\n\n{extra}" if extra.strip() else instruction
    return _pair(user, _text(row, "output"), _text(row, "system", optional=True))


def _instruction_response(row: dict, opts: dict) -> list[dict]:
    return _pair(_text(row, "instruction"), _text(row, "response"), _text(row, "system", optional=True))


def _problem_solution(row: dict, opts: dict) -> list[dict]:
    return _pair(_text(row, "problem"), _text(row, "solution"))


def _question_answer(row: dict, opts: dict) -> list[dict]:
    return _pair(_text(row, "question"), _text(row, "answer"), _text(row, "system", optional=True))


def _system_question_response(row: dict, opts: dict) -> list[dict]:
    system = _text(row, "system_prompt", optional=True) or _text(row, "system", optional=True)
    return _pair(_text(row, "question"), _text(row, "response"), system)


def _opencodeinstruct(row: dict, opts: dict) -> list[dict]:
    return _pair(_text(row, "input"), _text(row, "output"))


def _commit(row: dict, opts: dict) -> list[dict]:
    """A commit as an edit request: old file + commit message -> new file."""
    old = _text(row, "old_contents", optional=True)
    new = _text(row, "new_contents")
    message = _text(row, "message", optional=True) or _text(row, "subject")
    path = _text(row, "new_file", optional=True) or _text(row, "old_file", optional=True) or "the file"
    lang = _text(row, "lang", optional=True).lower()
    if old.strip():
        user = f"Apply this change to `{path}`: {message.strip()}\n\n```{lang}\n{old}\n```"
    else:
        user = f"Create `{path}`: {message.strip()}"
    return [{"role": "user", "content": user}, {"role": "assistant", "content": f"```{lang}\n{new}\n```"}]


def _message_list(value, key: str, role_key: str, content_key: str, role_map: dict) -> list[dict]:
    if not isinstance(value, list):
        raise RowError(f"field {key!r} is {type(value).__name__}, not a list of turns")
    messages = []
    for i, turn in enumerate(value):
        if not isinstance(turn, dict):
            raise RowError(f"{key}[{i}] is {type(turn).__name__}, not an object")
        if role_key not in turn:
            raise RowError(f"{key}[{i}] has no {role_key!r}")
        if content_key not in turn or turn[content_key] is None:
            raise RowError(f"{key}[{i}] has no {content_key!r}")
        raw_role = turn[role_key]
        role = role_map.get(str(raw_role).lower(), raw_role) if isinstance(raw_role, str) else raw_role
        messages.append({"role": role, "content": turn[content_key]})
    return messages


def _openai_messages(row: dict, opts: dict) -> list[dict]:
    if "messages" not in row or row["messages"] is None:
        raise RowError("missing field 'messages'")
    role_map = {r: r for r in ROLES} | opts.get("role_map", {})
    return _message_list(row["messages"], "messages", "role", "content", role_map)


def _sharegpt(row: dict, opts: dict) -> list[dict]:
    if "conversations" not in row or row["conversations"] is None:
        raise RowError("missing field 'conversations'")
    role_map = SHAREGPT_ROLES | opts.get("role_map", {})
    messages = _message_list(row["conversations"], "conversations", "from", "value", role_map)
    system = _text(row, "system", optional=True)
    if system.strip() and not (messages and messages[0]["role"] == "system"):
        messages.insert(0, {"role": "system", "content": system})
    return messages


# Most specific first: detection takes the first adapter whose required columns are all present.
ADAPTERS: tuple[Adapter, ...] = (
    Adapter("openai_messages", ("messages",), _openai_messages, "messages: [{role, content}]", keeps_meta=True),
    Adapter("sharegpt", ("conversations",), _sharegpt, "conversations: [{from, value}] (+ system)"),
    Adapter(
        "commit",
        ("old_contents", "new_contents"),
        _commit,
        "old_contents/new_contents + message",
        meta_fields=("commit", "lang", "repos"),
    ),
    Adapter(
        "opencodeinstruct",
        ("input", "output"),
        _opencodeinstruct,
        "input/output (OpenCodeInstruct)",
        forbidden=("instruction",),
        meta_fields=("id", "domain", "generation_algorithm", "average_test_score"),
    ),
    Adapter("alpaca", ("instruction", "output"), _alpaca, "instruction/input/output"),
    Adapter("instruction_response", ("instruction", "response"), _instruction_response, "instruction/response"),
    Adapter(
        "system_question_response",
        ("question", "response"),
        _system_question_response,
        "system_prompt/question/response",
    ),
    Adapter("question_answer", ("question", "answer"), _question_answer, "question/answer"),
    Adapter("problem_solution", ("problem", "solution"), _problem_solution, "problem/solution"),
)
ADAPTERS_BY_NAME = {a.name: a for a in ADAPTERS}


def detect_adapter(columns: Iterable[str], name: str | None = None, where: str = "dataset") -> Adapter:
    """The adapter for these columns (or the one named), else AdapterError naming columns and adapters tried."""
    columns = sorted(columns)
    if name is not None:
        if name not in ADAPTERS_BY_NAME:
            raise AdapterError(f"{where}: unknown adapter {name!r}; known: {sorted(ADAPTERS_BY_NAME)}")
        adapter = ADAPTERS_BY_NAME[name]
        missing = [c for c in adapter.required if c not in columns]
        if missing:
            raise AdapterError(f"{where}: adapter {name!r} needs columns {missing}, but the dataset has {columns}")
        return adapter
    for adapter in ADAPTERS:
        if adapter.matches(columns):
            return adapter
    tried = ", ".join(f"{a.name} ({'+'.join(a.required)})" for a in ADAPTERS)
    raise AdapterError(f"{where}: columns {columns} fit no adapter; tried: {tried}")


def check_messages(messages: list[dict], max_chars: int = DEFAULT_MAX_CHARS) -> None:
    """RowError for unknown roles, non-string or empty content, invalid UTF-8, absurd length, no user turn."""
    if not messages:
        raise RowError("no messages")
    total = 0
    for i, msg in enumerate(messages):
        role, content = msg.get("role"), msg.get("content")
        if role not in ROLES:
            raise RowError(f"unknown role {role!r} in messages[{i}]")
        if not isinstance(content, str):
            raise RowError(f"messages[{i}].content is {type(content).__name__}, not str")
        if not content.strip():
            raise RowError(f"empty content in messages[{i}] ({role})")
        try:
            content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise RowError(f"invalid UTF-8 in messages[{i}].content ({exc.reason} at {exc.start})") from None
        total += len(content)
    if total > max_chars:
        raise RowError(f"absurd length: {total} characters > max_chars {max_chars}")
    if not any(m["role"] == "user" for m in messages):
        raise RowError("no user message")


@dataclass
class Normalized:
    """The outcome of normalizing one source: conversations plus rejects.

    A reject record is {"source", "line", "reason"}; `line` is 1-based, as an editor shows it
    (see the module docstring for sources without lines). A whole source that yields nothing
    (an empty or blank-only file) is one reject with "line": None (blend.spec).
    """

    conversations: list[dict] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)


def normalize(
    rows: Iterable,
    source: str,
    adapter: Adapter,
    *,
    max_chars: int = DEFAULT_MAX_CHARS,
    role_map: dict | None = None,
    meta: dict | None = None,
    out: Normalized | None = None,
    first_line: int = 1,
) -> Normalized:
    """Map raw rows through an adapter and check them.

    `rows` yields dicts, or (line, dict_or_None, reason) triples from `read_jsonl_rows`, so that
    lines which are not even JSON become rejects too. Dicts are numbered from `first_line` (2 for
    a CSV, whose header is line 1).
    """
    out = out or Normalized()
    opts = {"role_map": {k.lower(): v for k, v in (role_map or {}).items()}}
    for index, item in enumerate(rows):
        line = first_line + index
        if isinstance(item, tuple):
            line, row, reason = item
            if row is None:
                out.rejects.append({"source": source, "line": line, "reason": reason})
                continue
        else:
            row = item
        try:
            if not isinstance(row, dict):
                raise RowError(f"row is {type(row).__name__}, not an object")
            messages = adapter.convert(row, opts)
            check_messages(messages, max_chars)
        except RowError as exc:
            out.rejects.append({"source": source, "line": line, "reason": str(exc)})
            continue
        own = row.get("meta") if adapter.keeps_meta and isinstance(row.get("meta"), dict) else {}
        fields = [(key, own[key]) for key in own] + [(key, row.get(key)) for key in adapter.meta_fields]
        row_meta = {
            key: value for key, value in fields if isinstance(value, (str, int, float, bool)) and len(str(value)) <= 200
        }
        row_meta.update(line=line, adapter=adapter.name)
        if meta:
            row_meta.update(meta)
        out.conversations.append(
            {"id": conversation_id(messages, source), "source": source, "messages": messages, "meta": row_meta}
        )
    return out


def read_jsonl_rows(path: str | Path) -> Iterator[tuple[int, dict | None, str | None]]:
    """(line, row, None) per non-blank line, or (line, None, reason) for one that is not UTF-8 JSON.

    `line` is 1-based, as an editor shows it. Unlike a strict reader this never stops the blend:
    one broken line costs one row.
    """
    for line in jsonl_lines(path):
        exc = line.error
        if isinstance(exc, UnicodeDecodeError):
            yield line.lineno, None, f"invalid UTF-8 at byte {exc.start} of line {line.lineno}"
        elif exc is not None:
            yield line.lineno, None, f"not valid JSON on line {line.lineno} ({exc.msg})"
        else:
            yield line.lineno, line.row, None


def jsonl_columns(path: str | Path, probe: int = 50) -> list[str]:
    """Union of the keys of the first rows of a JSONL file (for adapter detection)."""
    columns: set[str] = set()
    for n, (_, row, _) in enumerate(read_jsonl_rows(path)):
        if isinstance(row, dict):
            columns.update(row)
        if n >= probe:
            break
    return sorted(columns)


def load_local(path: str | Path, split: str = "train"):
    """A local JSON/JSONL/Parquet/CSV file as a `datasets.Dataset` (schema inferred by datasets).

    A file that datasets cannot parse (a truncated Parquet file, random bytes, a CSV quote never
    closed) is an AdapterError naming the file and the parser's own one-line reason: the parsers
    raise from deep inside datasets, pyarrow or pandas, and their tracebacks name none of it.
    """
    import datasets

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such dataset file")
    kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
    if kind is None:
        raise AdapterError(f"{path}: unknown file type {path.suffix!r} (use .jsonl, .json, .parquet or .csv)")
    if not path.is_file():
        raise AdapterError(f"{path}: not a file")
    import pyarrow

    try:
        return datasets.load_dataset(kind, data_files={split: str(path)}, split=split)
    except (datasets.exceptions.DatasetGenerationError, pyarrow.ArrowException) as exc:
        cause = exc.__cause__ or exc.__context__ or exc
        raise AdapterError(f"{path}: cannot be read as {kind} ({_one_line(cause)})") from exc


def _one_line(exc: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def load_hub(
    hub_id: str,
    split: str = "train",
    config: str | None = None,
    revision: str | None = None,
    max_rows: int | None = None,
    seed: int = 0,
):
    """Rows of a Hub dataset: the whole split, or `max_rows` of a seeded streaming shuffle of it.

    Returns (rows iterable, column names). Streaming avoids downloading all of a multi-GB set
    (OpenCodeInstruct is 6.9 GB) to take a subsample.
    """
    import datasets

    if max_rows is None:
        ds = datasets.load_dataset(hub_id, config, split=split, revision=revision)
        return ds, list(ds.column_names)
    ds = datasets.load_dataset(hub_id, config, split=split, revision=revision, streaming=True)
    ds = ds.shuffle(seed=seed, buffer_size=10_000).take(max_rows)
    columns = list(ds.column_names or [])
    if not columns:
        first = next(iter(ds))
        columns = list(first)
    return ds, columns
