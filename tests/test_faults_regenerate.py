"""Issue 19 for `regenerate` and `monitor`: every fault a bounded, clear outcome, with real processes.

Bad input: one `error: ...` line on stderr naming file, row or field, exit 2, no traceback. A dead
server: exit 1 within seconds. A server killed mid-run: retried and said so, then a clean stop after
--max-outage with the rows kept, the monitor saying "stalled", and a rerun finishing the job.
"""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftlab.core.serve import LocalServer, free_port
from draftlab.regenerate import scan_work
from helpers_regen import (  # noqa: F401
    LIB,
    all_shard_rows,
    make_conversations,
    run_draftlab,
    tiny_folder,
    tiny_server,
    write_jsonl,
)

GOOD = {"id": "a", "source": "s", "messages": [{"role": "user", "content": "hi"}]}


draftlab = run_draftlab


def assert_one_line_error(proc, code: int, *needles: str) -> str:
    """Exit `code`, exactly one stderr line `error: ...` holding every needle, no traceback."""
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


def rows_text(*rows) -> str:
    return "".join(json.dumps(r) + "\n" for r in rows)


# (case, input file content or None for special set-ups, extra flags, words the error line must hold)
INPUT_CASES = [
    ("empty file", "", [], ["no conversations"]),
    ("blank lines only", "\n  \n", [], ["no conversations"]),
    ("not JSON", rows_text(GOOD) + "{oops\n", [], ["line 2", "not valid JSON"]),
    ("not text", b"\xff\xfe\x00garbage\n", [], ["line 1"]),
    ("a row is an array", "[1, 2]\n", [], ["line 1", "JSON object"]),
    ("no messages field", rows_text({"id": "a"}), [], ["line 1", "'messages'"]),
    ("messages a string", rows_text({"id": "a", "messages": "hi"}), [], ["line 1", "'messages'"]),
    ("empty messages", rows_text({"id": "a", "messages": []}), [], ["line 1", "'messages'"]),
    (
        "content a number",
        rows_text({"id": "a", "messages": [{"role": "user", "content": 3}]}),
        [],
        ["line 1", "messages[0].content"],
    ),
    (
        "unknown role",
        rows_text({"id": "a", "messages": [{"role": "bot", "content": "x"}]}),
        [],
        ["line 1", "messages[0].role"],
    ),
    ("id a number", rows_text({"id": 7, "messages": [{"role": "user", "content": "x"}]}), [], ["line 1", "'id'"]),
    ("duplicate id", rows_text(GOOD, GOOD), [], ["line 2", "duplicate id"]),
    (
        "no user turn",
        rows_text({"id": "a", "messages": [{"role": "assistant", "content": "x"}]}),
        [],
        ["line 1", "no user turn"],
    ),
    ("--concurrency 0", rows_text(GOOD), ["--concurrency", "0"], ["concurrency"]),
    ("--timeout 0", rows_text(GOOD), ["--timeout", "0"], ["--timeout"]),
    ("--system-policy set without a prompt", rows_text(GOOD), ["--system-policy", "set"], ["--system-prompt"]),
    ("--limit -1", rows_text(GOOD), ["--limit", "-1"], ["--limit"]),
]


@pytest.mark.parametrize("case,content,flags,needles", INPUT_CASES, ids=[c[0] for c in INPUT_CASES])
def test_bad_input_file_is_one_line(tmp_path, case, content, flags, needles):
    src = tmp_path / "in.jsonl"
    src.write_bytes(content if isinstance(content, bytes) else content.encode())
    proc = draftlab(
        "regenerate",
        src,
        tmp_path / "w",
        "--base-url",
        f"http://127.0.0.1:{free_port()}",
        "--model",
        "x",
        "--no-progress",
        *flags,
    )
    line = assert_one_line_error(proc, 2, *needles)
    if "line " in " ".join(needles):
        assert str(src) in line  # the file, the row and the field


def _setup(tmp_path, case):
    """argv (after `regenerate IN WORK`) and paths for the cases that need more than an input file."""
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD])
    work = tmp_path / "w"
    url = f"http://127.0.0.1:{free_port()}"
    flags = ["--base-url", url, "--model", "x", "--no-progress"]
    if case == "missing input":
        src = tmp_path / "nope.jsonl"
    elif case == "input is a folder":
        src = tmp_path
    elif case == "missing --model":
        flags = ["--base-url", url, "--no-progress"]
    elif case == "no server given":
        flags = ["--no-progress"]
    elif case == "base URL without a scheme":
        flags = ["--base-url", "localhost:8000", "--model", "x"]
    elif case == "base URL not http":
        flags = ["--base-url", "ftp://127.0.0.1:21", "--model", "x"]
    elif case == "changed parameters on resume":
        (work / "shards").mkdir(parents=True)
        (work / "manifest.json").write_text(json.dumps({"runs": [], "config": {"max_tokens": 16}}))
        write_jsonl(work / "shards" / "part-00000.jsonl", [GOOD])
        flags += ["--max-tokens", "32"]
    elif case == "work folder is a file":
        work = tmp_path / "afile"
        work.write_text("x")
    elif case == "corrupt manifest":
        work.mkdir()
        (work / "manifest.json").write_text("{not json")
    elif case == "corrupt shard line":
        (work / "shards").mkdir(parents=True)
        (work / "shards" / "part-00000.jsonl").write_text('{"id": "a"}\n{broken\n{"id": "b"}\n')
    elif case == "--output is a folder":
        flags += ["--output", str(tmp_path)]
    elif case == "--serve of a missing target":
        flags = ["--serve", str(tmp_path / "nosuch"), "--no-progress"]
    return src, work, flags


SETUP_CASES = [
    ("missing input", 2, ["nope.jsonl", "not found"]),
    ("input is a folder", 2, ["is a folder"]),
    ("missing --model", 2, ["--model"]),
    ("no server given", 2, ["--base-url", "--serve"]),
    ("base URL without a scheme", 2, ["localhost:8000"]),
    ("base URL not http", 2, ["ftp://"]),
    ("changed parameters on resume", 2, ["max_tokens: 16 -> 32"]),
    ("work folder is a file", 2, ["afile", "is a file"]),
    ("corrupt manifest", 2, ["manifest.json"]),
    ("corrupt shard line", 2, ["part-00000.jsonl", "line 2"]),
    ("--output is a folder", 2, ["--output"]),
    ("--serve of a missing target", 2, ["--serve", "nosuch"]),
]


@pytest.mark.parametrize("case,code,needles", SETUP_CASES, ids=[c[0] for c in SETUP_CASES])
def test_bad_invocation_is_one_line(tmp_path, case, code, needles):
    src, work, flags = _setup(tmp_path, case)
    assert_one_line_error(draftlab("regenerate", src, work, *flags), code, *needles)


def test_work_folder_held_by_another_process(tmp_path):
    """A second writer is refused at once (exit 1), naming the holder's pid."""
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD])
    work = tmp_path / "w"
    work.mkdir()
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import fcntl, os, sys, time\n"
                f"fd = os.open({str(work / '.lock')!r}, os.O_RDWR | os.O_CREAT)\n"
                "fcntl.flock(fd, fcntl.LOCK_EX); os.pwrite(fd, str(os.getpid()).encode(), 0)\n"
                "print('held', flush=True); time.sleep(60)"
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        proc = draftlab("regenerate", src, work, "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "x")
        assert_one_line_error(proc, 1, "another process", f"pid {holder.pid}")
    finally:
        holder.kill()
        holder.wait()
    with open(work / ".lock") as fh:  # the holder's death freed it
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a mode-000 file")
def test_unreadable_input(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", [GOOD])
    src.chmod(0)
    proc = draftlab("regenerate", src, tmp_path / "w", "--base-url", "http://127.0.0.1:9", "--model", "x")
    assert_one_line_error(proc, 2, "cannot read")


def test_closed_port_fails_within_seconds(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", make_conversations(5))
    t0 = time.monotonic()
    proc = draftlab(
        "regenerate", src, tmp_path / "w", "--base-url", f"http://127.0.0.1:{free_port()}", "--model", "x", timeout=30
    )
    assert time.monotonic() - t0 < 15
    assert_one_line_error(proc, 1, "no server answers", "connection refused")
    status = json.loads((tmp_path / "w" / "status.json").read_text())
    assert status["state"] == "stopped"


MONITOR_CASES = [
    ("missing path", lambda t: t / "nowhere", ["no such folder", "work/train"]),
    ("a file", lambda t: (t / "f").write_text("x") and t / "f", ["is a file"]),
    ("an empty folder", lambda t: t, ["not a regeneration work folder", "work/train"]),
    ("the folder above work/", lambda t: _run_tree(t), ["work/train", "work/val"]),
    ("corrupt manifest", lambda t: (t / "manifest.json").write_text("{") and t, ["manifest.json"]),
]


def _run_tree(tmp: Path) -> Path:
    for split in ("train", "val"):
        (tmp / "regen" / "work" / split).mkdir(parents=True)
        (tmp / "regen" / "work" / split / "manifest.json").write_text('{"total": 1, "runs": []}')
    return tmp / "regen"


@pytest.mark.parametrize("case,make,needles", MONITOR_CASES, ids=[c[0] for c in MONITOR_CASES])
def test_monitor_bad_path_is_one_line(tmp_path, case, make, needles):
    assert_one_line_error(draftlab("monitor", make(tmp_path)), 2, *needles)


def _finished(work: Path) -> int:
    return len(scan_work(work, repair=False).finished) if (work / "shards").exists() else 0


@pytest.mark.server
def test_server_killed_mid_run_stops_after_max_outage_and_resumes(tiny_server, tmp_path):
    """SIGKILL a real `transformers serve` mid-run: the client says it retries, the monitor says
    stalled, the run stops with exit 1 within --max-outage, and a rerun finishes every row once."""
    rows = make_conversations(300, multi_turn_every=5)
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    work = tmp_path / "work"
    outage = 8.0
    env = dict(os.environ, PYTHONPATH=LIB + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with LocalServer(tiny_folder(), log_path=tmp_path / "serve.log", threads=1) as srv:
        cmd = [
            sys.executable,
            "-m",
            "draftlab.cli",
            "regenerate",
            str(src),
            str(work),
            "--base-url",
            srv.base_url,
            "--model",
            srv.model,
            "--max-tokens",
            "4",
            "--concurrency",
            "2",
            "--truncation",
            "keep_flag",
            "--no-progress",
            "--max-outage",
            str(outage),
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        deadline = time.monotonic() + 120
        while _finished(work) < 5 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert proc.poll() is None, "the run ended before the server could be killed"
        os.killpg(srv.proc.pid, signal.SIGKILL)
        t_kill = time.monotonic()
        time.sleep(4.0)
        seen = draftlab("monitor", work, timeout=30)
        assert seen.returncode == 0, seen.stderr
        assert "stalled: no server for" in seen.stdout and "ETA" not in seen.stdout, seen.stdout
        out, err = proc.communicate(timeout=outage + 60)
        stopped_after = time.monotonic() - t_kill
    assert proc.returncode == 1, err[-2000:]
    assert stopped_after < outage + 20, stopped_after
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip()]
    assert any("not answering for" in line and "retrying in" in line for line in lines), err[-2000:]
    assert lines[-1].startswith("error: no server answered for") and "rerun the same command" in lines[-1]
    kept = _finished(work)
    assert 5 <= kept < len(rows)
    status = json.loads((work / "status.json").read_text())
    assert status["state"] == "stopped"
    after = draftlab("monitor", work)
    assert "stopped" in after.stdout and "no server answered" in after.stdout, after.stdout
    # the same command against a live server (same model folder) picks up where it stopped
    again = subprocess.run(
        [*cmd[:7], tiny_server.base_url, *cmd[8:]], capture_output=True, text=True, env=env, timeout=600
    )
    assert again.returncode == 0, again.stderr[-2000:]
    summary = json.loads(again.stdout)
    assert summary["rows_skipped_resume"] == kept
    ids = [r["id"] for r in all_shard_rows(work)]
    assert len(ids) == len(set(ids)) == len(rows)
    assert json.loads((work / "status.json").read_text())["state"] == "done"
