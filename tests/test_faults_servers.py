"""`regenerate` against servers that are alive but wrong (loopback stubs), its own server child dying,
base URLs as users paste them, empty answers, reused work folders and Ctrl-C: real `draftlab` processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from draftlab.regenerate import RegenConfig, regenerate
from draftlab.regenerate.client import ServerUnreachable, check_base_url
from helpers_regen import all_shard_rows, make_conversations, write_jsonl
from helpers_regen.stub_servers import StubServer
from test_faults_options import draftlab

ROWS = make_conversations(4, multi_turn_every=0, prompt_only_every=0)


def popen(*argv) -> subprocess.Popen:
    from test_faults_options import LIB

    env = dict(os.environ, PYTHONPATH=LIB + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.Popen(
        [sys.executable, "-m", "draftlab.cli", *map(str, argv)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def wait_for_state(work: Path, state: str, timeout: float = 30.0) -> dict:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            status = json.loads((work / "status.json").read_text())
            if status.get("state") == state:
                return status
        except (OSError, ValueError):
            pass
        time.sleep(0.1)
    raise AssertionError(f"{work}/status.json never said {state!r}")


def one_error_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    errors = [x for x in stderr.splitlines() if x.startswith("error: ")]
    assert len(errors) == 1 and stderr.strip().splitlines()[-1] == errors[0], stderr
    return errors[0]


@pytest.mark.parametrize("mode, flags", [("drop", []), ("hang", ["--timeout", "1"])])
def test_alive_but_silent_server_is_an_outage(tmp_path, mode, flags):
    """Dropped connections and requests never answered start the outage clock: said on the progress
    line, in status.json and by the monitor, and --max-outage ends the run with the rows kept."""
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    work = tmp_path / "work"
    with StubServer("ok") as good:  # an earlier run finished two rows
        proc = draftlab("regenerate", src, work, "--base-url", good.base_url, "--model", "m", "--limit", "2")
        assert proc.returncode == 0, proc.stderr
    with StubServer(mode) as bad:
        t0 = time.monotonic()
        run = popen("regenerate", src, work, "--base-url", bad.base_url, "--model", "m", "--no-progress",
                    "--max-outage", "4", *flags)  # fmt: skip
        status = wait_for_state(work, "stalled")
        assert "not answering" in status["message"] and status["max_outage"] == 4
        shown = draftlab("monitor", work)
        assert "stalled: no server for" in shown.stdout, shown.stdout
        _, stderr = run.communicate(timeout=60)
        took = time.monotonic() - t0
    assert run.returncode == 1 and took < 20, (run.returncode, took, stderr)
    assert "not answering for" in stderr  # the progress note, before the one error line
    line = one_error_line(stderr)
    assert "no server answered for" in line and "2/4 rows finished and kept" in line, line
    assert len(all_shard_rows(work)) == 2


@pytest.mark.parametrize("suffix", ["/v1", "/v1/", "/v1/chat/completions"])
def test_base_url_forms_users_paste_are_accepted(tmp_path, suffix):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:2])
    with StubServer("ok") as srv:
        proc = draftlab("regenerate", src, tmp_path / "w", "--base-url", srv.base_url + suffix, "--model", "m",
                        "--no-progress")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "/v1/chat/completions" in srv.paths and not any("/v1/v1" in p for p in srv.paths)
    assert check_base_url("http://h:8000/proxy/v1/chat/completions") == "http://h:8000/proxy"


def test_wrong_path_is_one_line_not_a_404_per_row(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:3])
    with StubServer("ok") as srv:
        proc = draftlab("regenerate", src, tmp_path / "w", "--base-url", srv.base_url + "/api", "--model", "m",
                        "--no-progress")  # fmt: skip
    assert proc.returncode == 2
    line = one_error_line(proc.stderr)
    assert "HTTP 404" in line and "--base-url" in line


def test_empty_answers_are_failed_rows_not_kept(tmp_path):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS[:3])
    work = tmp_path / "w"
    with StubServer("ok", answer="  ") as srv:
        proc = draftlab("regenerate", src, work, "--base-url", srv.base_url, "--model", "m", "--no-progress",
                        "--output", tmp_path / "out.jsonl")  # fmt: skip
    assert proc.returncode == 1
    summary = json.loads(proc.stdout)
    assert summary["rows_error"] == 3 and summary["error_reasons"] == {"empty answer": 3}
    assert "3 of 3 rows failed (empty answer x3)" in one_error_line(proc.stderr)
    assert all_shard_rows(work) == [] and summary["final"]["rows_kept"] == 0
    reasons = [json.loads(x)["reason"] for x in (work / "errors.jsonl").read_text().splitlines()]
    assert all("empty answer" in r for r in reasons)


def test_resume_of_another_job_is_refused_and_loses_nothing(tmp_path):
    """The reported case: same ids, other prompts and model, in a reused folder."""
    a = write_jsonl(tmp_path / "A.jsonl", ROWS)
    b_rows = [{**r, "messages": [{"role": "user", "content": "other " + r["messages"][-2]["content"]}]} for r in ROWS]
    b = write_jsonl(tmp_path / "B.jsonl", b_rows)
    work = tmp_path / "w"
    with StubServer("ok") as srv:
        first = draftlab("regenerate", a, work, "--base-url", srv.base_url, "--model", "m1", "--limit", "3")
        assert first.returncode == 0, first.stderr
        before = sorted(p.read_bytes() for p in (work / "shards").glob("*.jsonl"))
        proc = draftlab("regenerate", b, work, "--base-url", srv.base_url, "--model", "m2",
                        "--output", tmp_path / "o.jsonl")  # fmt: skip
        assert proc.returncode == 2
        line = one_error_line(proc.stderr)
        assert "input: " in line and "A.jsonl" in line and "B.jsonl" in line and "model: 'm1' -> 'm2'" in line
        assert sorted(p.read_bytes() for p in (work / "shards").glob("*.jsonl")) == before
        assert not (tmp_path / "o.jsonl").exists()
        # the same job goes on (the rest of A, without --limit)
        again = draftlab("regenerate", a, work, "--base-url", srv.base_url, "--model", "m1", "--no-progress")
        assert again.returncode == 0 and len(all_shard_rows(work)) == 4, again.stderr


def test_folder_without_a_job_record_is_adopted_only_for_the_same_input(tmp_path):
    """A folder written before jobs were recorded: the same input file name, model and sampling resume it
    (and record the job); another input is refused."""
    a = write_jsonl(tmp_path / "A.jsonl", ROWS)
    work = tmp_path / "w"
    with StubServer("ok") as srv:
        assert (
            draftlab("regenerate", a, work, "--base-url", srv.base_url, "--model", "m", "--limit", "2").returncode == 0
        )
        manifest = json.loads((work / "manifest.json").read_text())
        del manifest["job"]
        (work / "manifest.json").write_text(json.dumps(manifest))
        b = write_jsonl(tmp_path / "B.jsonl", ROWS)
        refused = draftlab("regenerate", b, work, "--base-url", srv.base_url, "--model", "m")
        assert refused.returncode == 2 and "input: A.jsonl -> B.jsonl" in one_error_line(refused.stderr)
        adopted = draftlab("regenerate", a, work, "--base-url", srv.base_url, "--model", "m", "--no-progress")
    assert adopted.returncode == 0, adopted.stderr
    assert "job" in json.loads((work / "manifest.json").read_text()) and len(all_shard_rows(work)) == 4


def test_own_server_child_exit_stops_the_run_at_once(tmp_path):
    """A server draftlab started (here a real child process) exits: the run stops within a second or
    two, not after --max-outage, with the rows kept."""

    class Child:  # what LocalServer / SGLangServer expose: the Popen and the log
        kind = "stand-in server"
        log_path = tmp_path / "serve.log"

        def __init__(self):
            self.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    child = Child()
    config = RegenConfig(model="m", max_outage=300, request_timeout=60)
    with StubServer("hang") as srv:
        t0 = time.monotonic()
        killer = subprocess.Popen(
            [sys.executable, "-c", f"import os,time; time.sleep(1); os.kill({child.proc.pid}, 9)"]
        )
        with pytest.raises(ServerUnreachable, match="exited with code -9"):
            regenerate(ROWS, tmp_path / "w", [srv.base_url], config, progress=False, children=[child])
        killer.wait()
    assert time.monotonic() - t0 < 5
    assert json.loads((tmp_path / "w" / "status.json").read_text())["state"] == "stopped"


@pytest.mark.parametrize("command", ["regenerate", "monitor"])
def test_ctrl_c_is_one_line(tmp_path, command):
    src = write_jsonl(tmp_path / "in.jsonl", ROWS)
    work = tmp_path / "w"
    with StubServer("hang") as srv:
        run = popen("regenerate", src, work, "--base-url", srv.base_url, "--model", "m", "--no-progress")
        wait_for_state(work, "running")
        if command == "monitor":
            run.send_signal(signal.SIGINT)
            run.communicate(timeout=30)
            run = popen("monitor", work, "--watch", "1")
            time.sleep(3)
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=30)
    assert run.returncode == 130, stderr
    assert "interrupted" in one_error_line(stderr)
    if command == "regenerate":
        assert json.loads((work / "status.json").read_text())["state"] == "stopped"


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.slow
@pytest.mark.server
def test_serve_child_killed_stops_the_run_at_once(tmp_path):
    """`--serve`: the transformers server draftlab started is killed mid-run; the run stops within
    seconds (not --max-outage 300) with one line naming it, the rows kept, and no server left."""
    src = write_jsonl(tmp_path / "in.jsonl", make_conversations(200, multi_turn_every=0, prompt_only_every=0))
    work = tmp_path / "w"
    run = popen("regenerate", src, work, "--serve", "tiny", "--device", "cpu", "--max-tokens", "8", "--no-progress")
    wait_for_state(work, "running", timeout=240)
    server = _children(run.pid)
    assert server, "no server child found"
    os.kill(server[0], signal.SIGKILL)
    t0 = time.monotonic()
    _, stderr = run.communicate(timeout=120)
    assert run.returncode == 1 and time.monotonic() - t0 < 15, stderr
    line = one_error_line(stderr)
    assert "exited with code -9" in line and "rows finished and kept" in line, line


@pytest.mark.slow
def test_blend_ctrl_c_is_one_line(tmp_path):
    """A real Ctrl-C (SIGINT) to a real `draftlab blend` mid-way: one line, exit 130, no half-written split."""
    import signal
    import subprocess
    import sys
    import time

    spec = Path(__file__).parents[1] / "params" / "blend-offline.yaml"
    out = tmp_path / "blend"
    proc = subprocess.Popen([sys.executable, "-m", "draftlab.cli", "blend", str(spec), "--out", str(out),
                             "--total", "24000", "--target", "tiny"], stderr=subprocess.PIPE, text=True)  # fmt: skip
    deadline = time.monotonic() + 120
    while not out.is_dir() and proc.poll() is None and time.monotonic() < deadline:  # the blend has begun
        time.sleep(0.2)
    time.sleep(1)  # inside the blend (24,000 rows take far longer)
    assert proc.poll() is None, "the blend ended before the signal: make it bigger"
    proc.send_signal(signal.SIGINT)
    err = proc.communicate(timeout=120)[1].strip().splitlines()
    # 130, or killed by the SIGINT itself after the line (seen once under load in a full run, likely a native
    # library re-raising the signal at exit): a shell reads both as status 130
    assert proc.returncode in (130, -signal.SIGINT), (proc.returncode, err)
    assert err[-1] == f"error: interrupted; {out} holds only whole files" and "Traceback" not in "\n".join(err)
    assert not list(out.glob("*.jsonl.tmp*")) and not list(out.glob("*.tmp"))
