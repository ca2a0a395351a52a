"""Real faults: SIGKILL the client at random moments and resume; a proxy that injects failures."""

import os
import random
import signal
import subprocess
import sys
import time

import pytest

from draftlab.regenerate import RegenConfig, regenerate, scan_work
from helpers_regen import (  # noqa: F401
    all_shard_rows,
    make_conversations,
    read_lines,
    tiny_server,
    write_jsonl,
)
from helpers_regen.fault_proxy import FAULTS, FaultProxy


def _rows_on_disk(work) -> int:
    n = 0
    for p in (work / "shards").glob("part-*.jsonl"):
        n += p.read_bytes().count(b"\n")
    if (work / "dropped.jsonl").exists():
        n += (work / "dropped.jsonl").read_bytes().count(b"\n")
    return n


def test_torn_last_line_is_redone(tmp_path):
    """A half-written row (what kill -9 mid-write leaves) is cut off and its id counts as not done."""
    rows = make_conversations(3)
    work = tmp_path / "work"
    write_jsonl(work / "shards" / "part-00000.jsonl", rows[:2])
    with open(work / "shards" / "part-00000.jsonl", "ab") as fh:
        fh.write(b'{"id": "' + rows[2]["id"].encode() + b'", "messages": [{"ro')
    state = scan_work(work)
    assert state.finished == {rows[0]["id"], rows[1]["id"]}
    assert len(read_lines(work / "shards" / "part-00000.jsonl")) == 2


@pytest.mark.server
def test_sigkill_at_random_moments_then_resume(tiny_server, tmp_path):
    rows = make_conversations(400, multi_turn_every=5)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    work = tmp_path / "work"
    cmd = [
        sys.executable,
        "-m",
        "draftlab.regenerate",
        "regenerate",
        str(src),
        str(work),
        "--base-url",
        tiny_server.base_url,
        "--model",
        tiny_server.model,
        "--max-tokens",
        "4",
        "--concurrency",
        "2",
        "--truncation",
        "keep_flag",
        "--shard-rows",
        "50",
        "--no-progress",
    ]
    rng = random.Random(1234)
    kills, before = 0, 0
    while kills < 6:
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        # wait until this run has written something, then kill it a random moment later
        deadline = time.monotonic() + 120
        while _rows_on_disk(work) <= before and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(rng.uniform(0.0, 0.4))
        if proc.poll() is not None:
            break  # finished before the kill: the loop below checks we still got enough kills
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        kills += 1
        before = _rows_on_disk(work)
        assert before < len(rows), "the run finished before it could be killed; use more rows"
    assert kills >= 5, f"only {kills} kills landed mid-run"
    final = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    shard_rows = all_shard_rows(work)  # every line of every shard parses
    ids = [r["id"] for r in shard_rows]
    assert len(ids) == len(set(ids)), "duplicate rows after resume"
    assert set(ids) == {r["id"] for r in rows}
    assert len(list((work / "shards").glob("part-*.jsonl"))) > kills  # a new shard per run
    assert not (work / "errors.jsonl").exists() or read_lines(work / "errors.jsonl") == []
    # abandoned requests must not grow the server without bound (it was OOM-killed at 14 GB
    # before the KV cache was capped on CPU)
    assert tiny_server.alive() and tiny_server.rss_mb() < 4000, tiny_server.rss_mb()


@pytest.mark.server
def test_fault_proxy_every_row_done_or_explained(tiny_server, tmp_path):
    rows = make_conversations(48, multi_turn_every=4)
    for r in rows[:3]:  # three rows the proxy will always refuse
        r["messages"][-1 if r["messages"][-1]["role"] == "user" else -2]["content"] += " POISON"
    poisoned = {r["id"] for r in rows[:3]}
    rates = {"drop": 0.08, "http500": 0.08, "http429": 0.06, "timeout": 0.05, "truncated": 0.08, "malformed": 0.08}
    cfg = RegenConfig(
        model=tiny_server.model,
        max_tokens=6,
        concurrency=6,
        truncation="keep_flag",
        request_timeout=10.0,
        max_retries=10,
        backoff_base=0.05,
        backoff_max=0.4,
        server_cooldown=0.3,
    )
    with FaultProxy(tiny_server.base_url, rates, seed=7, hang_s=30) as proxy:
        summary = regenerate(rows, tmp_path / "work", [proxy.base_url], cfg, progress=False)
    for fault in FAULTS:
        assert proxy.injected[fault] > 0, f"fault {fault} never injected: {proxy.injected}"
    done = {r["id"] for r in all_shard_rows(tmp_path / "work")}
    errors = {e["id"]: e for e in read_lines(tmp_path / "work" / "errors.jsonl")}
    assert done | set(errors) == {r["id"] for r in rows} and not done & set(errors)
    assert poisoned <= set(errors)
    for i in poisoned:
        assert "HTTP 500" in errors[i]["reason"] and "attempt 11" in errors[i]["reason"]
    for e in errors.values():
        assert e["reason"].startswith("turn ") and "[server " in e["reason"]
    assert len(done) >= 0.9 * (len(rows) - 3)
    assert summary["rows_done"] == len(done) and summary["rows_error"] == len(errors)
    assert summary["retries"] >= sum(proxy.injected[f] for f in FAULTS) - 3 * 11
    # a second run retries what failed; the poisoned rows fail again, nothing is duplicated
    with FaultProxy(tiny_server.base_url, {}, seed=8) as proxy:
        again = regenerate(rows, tmp_path / "work", [proxy.base_url], cfg, progress=False)
    assert again["rows_error"] == 3 and again["rows_skipped_resume"] == len(rows) - len(errors)
    ids = [r["id"] for r in all_shard_rows(tmp_path / "work")]
    assert len(ids) == len(set(ids)) == len(rows) - 3


@pytest.mark.server
def test_non_retryable_error_is_recorded_at_once(tiny_server, tmp_path):
    """A 4xx other than 408/409/425/429 is not retried: the row goes to errors with the status."""
    rows = make_conversations(2, multi_turn_every=0)
    cfg = RegenConfig(model="/no/such/model", max_tokens=4, max_retries=5, backoff_base=0.01)
    summary = regenerate(rows, tmp_path / "work", [tiny_server.base_url], cfg, progress=False)
    errors = read_lines(tmp_path / "work" / "errors.jsonl")
    assert summary["rows_error"] == 2 and len(errors) == 2
    assert summary["retries"] == 0 or all("attempt 1]" not in e["reason"] for e in errors)
    for e in errors:
        assert e["reason"].startswith("turn 0: HTTP ")
