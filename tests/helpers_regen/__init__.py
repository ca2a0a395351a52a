"""Shared helpers of the regeneration tests: canonical-conversation fixtures and a tiny server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from draftlab.core import records
from draftlab.core.records import conversation_id

TOPICS = ["rivers", "owls", "tides", "chess", "bread", "comets", "glaciers", "jazz", "maps"]


LIB = str(Path(__file__).resolve().parents[2] / "lib")


def run_draftlab(*argv, timeout=60, lib=LIB, **kw) -> subprocess.CompletedProcess:
    """`python -m draftlab.cli ARGV` as a user runs it, with `lib` (this checkout's, or another tree's for a
    before/after count) first on the path; output captured."""
    env = dict(os.environ, PYTHONPATH=lib + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "draftlab.cli", *map(str, argv)], capture_output=True, text=True,
                          env=env, timeout=timeout, **kw)  # fmt: skip


def make_conversations(
    n: int,
    *,
    multi_turn_every: int = 4,
    system_every: int = 3,
    prompt_only_every: int = 5,
    source: str = "fixture/regen",
) -> list[dict]:
    """n canonical conversations: single-turn, multi-turn (2 assistant turns), with and without a
    system prompt, and prompt-only rows (no assistant turn yet)."""
    rows = []
    for i in range(n):
        topic = TOPICS[i % len(TOPICS)]
        msgs = []
        if system_every and i % system_every == 0:
            msgs.append({"role": "system", "content": f"You are a helpful assistant #{i}."})
        msgs.append({"role": "user", "content": f"Tell me one fact about {topic} (case {i})."})
        if not (prompt_only_every and i % prompt_only_every == 1):
            msgs.append({"role": "assistant", "content": f"Original answer about {topic} " * (1 + i % 4)})
        if multi_turn_every and i % multi_turn_every == 2:
            msgs.append({"role": "user", "content": "And another one?"})
            msgs.append({"role": "assistant", "content": "Original second answer."})
        rows.append({"id": conversation_id(msgs, source), "source": source, "messages": msgs, "meta": {"row": i}})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    records.write_jsonl(path, rows)
    return path


def read_lines(path: Path) -> list[dict]:
    """Every line must be valid JSON (raises otherwise) and end with a newline."""
    data = path.read_bytes()
    assert not data or data.endswith(b"\n"), f"{path}: last line has no newline"
    return [json.loads(line) for line in data.splitlines() if line.strip()]


def all_shard_rows(work: Path) -> list[dict]:
    rows = []
    for p in sorted((work / "shards").glob("part-*.jsonl")):
        rows += read_lines(p)
    return rows


def tiny_folder() -> Path:
    """The tiny target's real folder (servable by `transformers serve`)."""
    from draftlab.model.target import resolve_path

    return resolve_path("tiny")


def group_gone(pid: int) -> bool:
    """True when no process of the process group `pid` is left."""
    import os

    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return True
    return False


import pytest  # noqa: E402


@pytest.fixture(scope="module")
def tiny_server(tmp_path_factory):
    """A real `transformers serve --continuous-batching` of the tiny target, one per test module."""
    from draftlab.core.serve import LocalServer

    log = tmp_path_factory.mktemp("serve") / "serve.log"
    # one thread: the tiny model's ops are too small for two (measured 313-681 vs 45-60 tok/s
    # on the shared CPU; notes/issue4.md)
    with LocalServer(tiny_folder(), log_path=log, threads=1) as srv:
        yield srv
