"""The regeneration measurements of the GPU machine (ops.gpu_regen: regen_servers.sh and
regen_feed.sh) on real processes: an interpreter stand-in runs the OpenAI fake
(helpers_regen/fake_openai.py) on the launch command's --port in place of `python -m
sglang.launch_server` (which needs a GPU), and the real `draftlab regenerate` client is measured
against it. Also the one builder of the regeneration server, with each path's values."""

import json
import lzma
import shlex
import stat
import sys
import tarfile
import time
from pathlib import Path

import httpx
import pytest

from draftlab.core.serve import free_port, free_port_run
from draftlab.sglang.install import DONE_MARKER
from helpers_regen.fake_openai import FakeOpenAIProcess
from ops import gpu_regen
from ops.gpu_call import Call

pytestmark = pytest.mark.server

ROOT = Path(__file__).resolve().parents[2]
FAKE_OPENAI = ROOT / "tests" / "helpers_regen" / "fake_openai.py"


def fake_sglang_python(tmp_path: Path, body: str | None = None) -> str:
    """An interpreter stand-in: the OpenAI fake on the launch command's --port (or `body`, a shell line)."""
    script = tmp_path / "python-fixture"
    body = body or f'exec {shlex.quote(sys.executable)} {shlex.quote(str(FAKE_OPENAI))} --delay 0.01 --port "$port"'
    script.write_text(f'#!/bin/sh\nwhile [ $# -gt 0 ]; do [ "$1" = --port ] && port=$2; shift; done\n{body}\n')
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(script)


@pytest.fixture
def call(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_SERVER_REGISTRY", str(tmp_path / "registry"))
    now = int(time.time())
    c = Call(
        out=tmp_path / "out",
        dl=tmp_path / "dl",
        site=tmp_path / "site",
        scratch=tmp_path / "scratch",
        t0=now,
        deadline=now + 300,
        repo=ROOT,
    )
    for folder in (c.out, c.sglang_prefix):
        folder.mkdir(parents=True)
    (c.sglang_prefix / DONE_MARKER).write_text("{}")  # an installed bundle, as far as server_env checks
    return c


@pytest.fixture
def rows_xz(tmp_path) -> Path:
    """The first 8 conversations of the tracked regenerated set."""
    with lzma.open(ROOT / gpu_regen.REGEN_ROWS, "rt") as f:
        lines = [next(f) for _ in range(8)]
    path = tmp_path / "rows.jsonl.xz"
    with lzma.open(path, "wt") as out:
        out.writelines(lines)
    return path


def test_one_builder_keeps_each_paths_server(call, monkeypatch):
    """sglang.sh's one server (1,024 running, graphs of 512) as common.sh's target_command wrote it."""
    monkeypatch.delenv("REGEN_MAX_RUNNING", raising=False)
    monkeypatch.delenv("REGEN_GRAPH_BS", raising=False)
    server = gpu_regen.target_server(call, call.dl / "s.log")
    assert server.command == (
        f"python -m sglang.launch_server --model-path {call.model_dir} --host 127.0.0.1 --port 30000 --tp 1 "
        "--dtype bfloat16 --mem-fraction-static 0.5 --max-running-requests 1024 --attention-backend triton "
        "--sampling-backend pytorch --grammar-backend none --cuda-graph-max-bs 512"
    )
    monkeypatch.setenv("REGEN_MAX_RUNNING", "512")
    assert "--max-running-requests 512 " in gpu_regen.target_server(call, call.dl / "s.log").command


def gone(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_regen_servers_keeps_its_servers_up_across_every_client_run(call, rows_xz, tmp_path):
    port = free_port_run(2)  # the two servers' PORT and PORT + 1
    assert (
        gpu_regen.regen_servers(
            call, k=2, n=4, concurrency=4, rows_xz=rows_xz, port=port, python=fake_sglang_python(tmp_path)
        )
        == 0
    )
    res = json.loads((call.out / "regen_servers.json").read_text())
    assert {k: res[k] for k in ("concurrency_per_server", "mem_fraction_static", "max_running_requests")} == {
        "concurrency_per_server": 4,
        "mem_fraction_static": 0.5,
        "max_running_requests": 512,
    }
    runs = res["runs"]
    assert {n: (r["servers"], r["summary"]["rows_done"]) for n, r in runs.items()} == {
        "n4_k1": (1, 4),
        "n4_k2": (2, 4),
        "train_k2": (2, 8),
    }
    assert all(r["wall_s"] > 0 and r["summary"]["rows_error"] == 0 for r in runs.values())
    logs = sorted((call.dl / "servers").glob("sglang-*.log"))
    assert [log.read_text().count("# ") for log in logs] == [1, 1]  # each launched once, for all three runs
    for p in (port, port + 1):  # and stopped after them
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"http://127.0.0.1:{p}/health", timeout=2)
    with tarfile.open(call.out / "servers-logs.tar.xz") as tar:
        assert sorted(tar.getnames()) == ["sglang-0.log", "sglang-1.log"]
    assert (call.out / "running.txt").read_text().startswith("server 0 running requests: median ")


def test_a_server_that_dies_at_start_is_one_line_and_stops_the_others(call, rows_xz, tmp_path, capsys):
    python = fake_sglang_python(tmp_path, 'echo "scheduler died: no GPU" >&2; exit 1')
    t0 = time.time()
    assert gpu_regen.regen_servers(call, k=2, n=4, rows_xz=rows_xz, python=python, port=free_port_run(2)) == 1
    assert time.time() - t0 < 30
    out = capsys.readouterr().out
    failed = [line for line in out.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "SGLang server exited with code 1 before" in failed[0], out
    assert "scheduler died: no GPU" in out  # the log's tail, below the line
    assert not (call.out / "regen_servers.json").exists()


def test_regen_feed_one_client_then_two_on_halves(call, rows_xz, tmp_path, monkeypatch):
    monkeypatch.setenv("REGEN_MAX_RUNNING", "8")
    python = fake_sglang_python(tmp_path)
    assert gpu_regen.regen_feed(call, n=6, concurrency=4, rows_xz=rows_xz, python=python, port=free_port()) == 0
    res = json.loads((call.out / "regen_feed.json").read_text())
    assert res["rows"] == 6 and res["one"]["one"]["rows_done"] == 6
    assert res["two"]["two_1"]["rows_done"] == 3 and res["two"]["two_2"]["rows_done"] == 3
    assert "batch" in res  # the batch backend's run (it fails without CUDA: an empty summary)
    assert (call.out / "feed-server.log.xz").is_file() and (call.out / "running.txt").is_file()


def test_side_by_side_through_the_server_records_its_rows_and_wall(call, rows_xz):
    """sglang.sh's regen phase: the first n train rows through the server 03 used."""
    (call.run / "data/blend").mkdir(parents=True)
    gpu_regen.copy_rows(rows_xz, call.run / "data/blend/train.jsonl")
    with FakeOpenAIProcess(delay=0.01) as srv:
        res = gpu_regen.side_by_side(call, "sglang", 5, srv.base_url, concurrency=4)
    assert res["rows"] == 5 and res["sglang"]["summary"]["rows_done"] == 5 and res["sglang"]["wall_s"] > 0
    assert json.loads((call.run / "bench/regen_side_by_side.json").read_text()) == res
    assert (call.dl / "side/rows.jsonl").read_text().count("\n") == 5 and "batch" not in res
