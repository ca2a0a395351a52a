"""What a regeneration run is asked to do: RegenConfig and the input it reads.

The input is a blend split (JSONL); `plan_turns` decides which assistant turns the target
answers again, so a resumed run replays the same plan.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, fields
from pathlib import Path

from draftlab.core.errors import InputError
from draftlab.core.records import RecordError, jsonl_lines, validate_conversation

SYSTEM_POLICIES = ("keep", "drop", "set")
TRUNCATION_POLICIES = ("drop", "keep_flag")
RETRY_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}


@dataclass
class RegenConfig:
    """Everything that decides what a regenerated row contains and how hard we try to get it."""

    model: str = ""  # the `model` field of requests (transformers serve: the folder path)
    model_name: str = ""  # recorded on rows (default: model)
    temperature: float = 0.0
    top_p: float = 1.0
    max_tokens: int = 512
    stop: list[str] | None = None
    seed: int | None = None
    system_policy: str = "keep"  # keep: as in the data | drop: remove | set: replace by system_prompt
    system_prompt: str = ""
    truncation: str = "drop"  # drop | keep_flag: what to do with finish_reason == "length"
    max_assistant_turns: int = 0  # 0: every assistant turn; n: the conversation up to the n-th
    concurrency: int = 8  # in-flight requests per server
    request_timeout: float = 120.0  # seconds per request
    max_retries: int = 5  # retries after the first attempt
    backoff_base: float = 0.5  # seconds; doubles every retry (with jitter)
    backoff_max: float = 20.0
    down_after: int = 3  # consecutive connection failures before a server is taken out
    server_cooldown: float = 5.0  # seconds out before it is tried again (doubles, max 120 s)
    max_outage: float = 300.0  # seconds with no server reachable before the run stops (resumable)
    shard_rows: int = 10000  # rows per shard file
    retry_errors: bool = True  # a rerun retries ids that are only in errors.jsonl
    fsync: bool = False  # fsync every line (power-loss safety; kill -9 needs none)

    def __post_init__(self):
        """Refuse values that would make a run hang or fail later (InputError is a ValueError)."""
        if self.system_policy not in SYSTEM_POLICIES:
            raise InputError(f"system_policy must be one of {SYSTEM_POLICIES}, got {self.system_policy!r}")
        if self.system_policy == "set" and not self.system_prompt:
            raise InputError("system_policy 'set' needs a non-empty system_prompt (--system-prompt)")
        if self.truncation not in TRUNCATION_POLICIES:
            raise InputError(f"truncation must be one of {TRUNCATION_POLICIES}, got {self.truncation!r}")
        self._check_numbers()
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.model_name = self.model_name or self.model

    def _check_numbers(self) -> None:
        """Each number in its range, finite (a nan would compare False everywhere and disable a bound)."""
        checks = [
            ("max_tokens", self.max_tokens >= 1, ">= 1"),
            ("concurrency", self.concurrency >= 1, ">= 1"),
            ("shard_rows", self.shard_rows >= 1, ">= 1"),
            ("max_retries", self.max_retries >= 0, ">= 0"),
            ("max_assistant_turns", self.max_assistant_turns >= 0, ">= 0"),
            ("seed", self.seed is None or self.seed >= 0, ">= 0 or None"),
            ("temperature", math.isfinite(self.temperature) and self.temperature >= 0, "finite and >= 0"),
            ("top_p", 0 < self.top_p <= 1, "in (0, 1]"),
            ("request_timeout", math.isfinite(self.request_timeout) and self.request_timeout > 0, "finite and > 0"),
            ("max_outage", math.isfinite(self.max_outage) and self.max_outage >= 0, "finite and >= 0"),
        ]
        for name, ok, wanted in checks:
            if not ok:
                raise InputError(f"{name} must be {wanted}, got {getattr(self, name)!r}")

    def sampling(self) -> dict:
        out = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "stop": self.stop or None,
        }
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
    if path.is_dir():
        raise InputError(f"{path}: is a folder; give the conversations file (JSONL)")
    if not path.is_file():
        raise InputError(f"{path}: input not found")
    try:
        lines = list(jsonl_lines(path))
    except OSError as exc:
        raise InputError(f"{path}: cannot read the input ({exc.strerror or exc})") from exc
    rows, seen = [], {}
    for line in lines:
        lineno, row, where = line.lineno, line.row, f"{path}: line {line.lineno}"
        if line.error is not None:
            what = "not UTF-8 text" if isinstance(line.error, UnicodeDecodeError) else "not valid JSON"
            raise RecordError(f"{where}: {what} ({line.error})") from line.error
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
