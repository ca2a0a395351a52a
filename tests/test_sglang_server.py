"""core.process and sglang.server: real child processes started, health-checked, and never left behind."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from draftlab.core.process import ServerProcess, ServerStartError, stop_stale
from draftlab.core.serve import free_port
from draftlab.sglang.commands import sglang_speculative_command
from draftlab.sglang.server import SGLangServer, sglang_argv

HEALTH = Path(__file__).parent / "helpers_sglang" / "health_server.py"


def _gone(pid: int, within: float = 10.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
            if Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
                return True
        except (ProcessLookupError, FileNotFoundError):
            return True
        time.sleep(0.1)
    return False


def _grandchild(log: Path) -> int:
    for _ in range(100):
        for line in log.read_text().splitlines() if log.exists() else []:
            if line.startswith("grandchild "):
                return int(line.split()[1])
        time.sleep(0.1)
    raise AssertionError(f"no grandchild pid in {log}")


def _server(tmp_path, *extra, timeout=20.0, log=None):
    port = free_port()
    return ServerProcess(
        [sys.executable, str(HEALTH), str(port), *extra],
        log or tmp_path / "logs" / "srv.log",
        base_url=f"http://127.0.0.1:{port}",
        startup_timeout=timeout,
        registry=tmp_path / "registry",
    )


def test_start_waits_for_health_and_stop_takes_the_whole_group(tmp_path):
    srv = _server(tmp_path, "--ready-after", "1.0", "--spawn-child")
    t0 = time.monotonic()
    with srv:
        assert time.monotonic() - t0 >= 1.0 and srv.alive()  # 503 until ready: it waited
        assert srv.startup_s >= 1.0
        grandchild = _grandchild(srv.log_path)
        assert json.loads((tmp_path / "registry" / f"{srv.pid}.json").read_text())["argv"] == srv.argv
    assert _gone(srv.pid) and _gone(grandchild)
    assert not list((tmp_path / "registry").glob("*.json"))  # the record goes with the server
    assert srv.log_path.read_text().startswith("# ")  # the command heads the log


def test_stop_returns_only_once_the_whole_group_is_gone(tmp_path):
    """A member that outlives its leader's SIGTERM dies by the group's SIGKILL and is reaped by init a moment
    later; stop() waits for that, so that nothing of the group is left when it returns (2026-12-03: CI saw a
    transformers serve group still there right after the with block)."""
    srv = _server(tmp_path, "--stubborn-child")
    with srv:
        grandchild = _grandchild(srv.log_path)
    for kill in (lambda: os.killpg(srv.pid, 0), lambda: os.kill(grandchild, 0)):
        with pytest.raises(ProcessLookupError):  # no process of the group, not even one exited and not yet reaped
            kill()


def test_no_health_within_the_timeout_is_a_clear_error_and_nothing_is_left(tmp_path):
    srv = _server(tmp_path, "--ready-after", "60", timeout=1.5)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError, match="no answer from .*/health within 2 s"):
        srv.start()
    assert time.monotonic() - t0 < 10
    assert _gone(srv.pid)


def test_a_stop_does_not_wait_for_a_slow_start(tmp_path):
    """A SIGTERM while a server starts (a large model's takes minutes) abandons the start at once: the
    one-line Stopped with the resume hint, exit code 143, and the server's whole group is gone."""
    import threading

    from draftlab.core.stop import Stopped, graceful_stop

    srv = _server(tmp_path, "--ready-after", "600", "--spawn-child", timeout=300)
    timer = threading.Timer(1.5, os.kill, (os.getpid(), signal.SIGTERM))
    t0 = time.monotonic()
    with graceful_stop("rerun to continue"), pytest.raises(Stopped) as err:
        timer.start()
        srv.start()
    assert time.monotonic() - t0 < 10
    assert err.value.exit_code == 143 and "start at" in str(err.value) and "rerun to continue" in str(err.value)
    assert _gone(srv.pid) and _gone(_grandchild(srv.log_path))


def test_a_server_that_exits_reports_its_code_and_log(tmp_path):
    srv = ServerProcess(
        [sys.executable, "-c", "import sys; print('bad flag --x'); sys.exit(3)"],
        tmp_path / "x.log",
        base_url=f"http://127.0.0.1:{free_port()}",
        startup_timeout=20,
        registry=tmp_path / "registry",
    )
    with pytest.raises(ServerStartError, match=r"exited with code 3(.|\n)*bad flag --x"):
        srv.start()


def test_a_sigkill_of_the_parent_takes_the_server_down(tmp_path):
    """PR_SET_PDEATHSIG: `kill -9` of draftlab must not orphan a GPU server."""
    port = free_port()
    parent = textwrap.dedent(f"""
        import sys, time
        sys.path.insert(0, {str(Path(__file__).parents[1] / "lib")!r})
        from draftlab.core.process import ServerProcess
        srv = ServerProcess([sys.executable, {str(HEALTH)!r}, "{port}"], {str(tmp_path / "p.log")!r},
                            base_url="http://127.0.0.1:{port}", startup_timeout=20,
                            registry={str(tmp_path / "registry")!r}).start()
        print(srv.pid, flush=True)
        time.sleep(600)
    """)
    proc = subprocess.Popen([sys.executable, "-c", parent], stdout=subprocess.PIPE, text=True)
    child = int(proc.stdout.readline())
    assert not _gone(child, within=0.5)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone(child), "the server outlived its SIGKILLed parent"


def test_stop_stale_stops_recorded_servers_and_spares_reused_pids(tmp_path):
    registry = tmp_path / "registry"
    registry.mkdir()
    port = free_port()
    argv = [sys.executable, str(HEALTH), str(port)]
    orphan = subprocess.Popen(argv, start_new_session=True)  # as if its parent had died unnoticed
    (registry / f"{orphan.pid}.json").write_text(json.dumps({"pid": orphan.pid, "argv": argv}))
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    (registry / f"{other.pid}.json").write_text(json.dumps({"pid": other.pid, "argv": ["not", "this"]}))
    (registry / "junk.json").write_text("{not json")
    mine = subprocess.Popen(argv[:2] + [str(free_port())], start_new_session=True)  # a live run's server
    (registry / f"{mine.pid}.json").write_text(json.dumps({"pid": mine.pid, "argv": mine.args, "parent": os.getppid()}))
    try:
        stopped = stop_stale(registry, grace=5)
        orphan.wait(timeout=10)
        assert [r["pid"] for r in stopped] == [orphan.pid]
        assert other.poll() is None  # a pid now running something else is left alone
        assert mine.poll() is None  # a server whose draftlab process still runs is that process's
        assert [p.name for p in registry.glob("*.json")] == [f"{mine.pid}.json"]
    finally:
        mine.kill()
        other.kill()
        orphan.kill()


def test_sglang_server_from_draftlabs_own_launch_command(tmp_path):
    cmd = sglang_speculative_command(
        "/m/target", "/d/eagle3", num_steps=6, port=31007, extra=("--attention-backend", "triton")
    )
    srv = SGLangServer(cmd, tmp_path / "s.log", python="/usr/bin/python3", registry=tmp_path / "r")
    assert srv.base_url == "http://127.0.0.1:31007"
    assert srv.argv[:3] == ["/usr/bin/python3", "-m", "sglang.launch_server"]
    assert srv.argv[-2:] == ["--attention-backend", "triton"] and "--speculative-num-steps" in srv.argv
    with pytest.raises(ValueError, match="not an SGLang launch command"):
        sglang_argv("python -m http.server 8000")


def test_the_serve_command_without_sglang_is_one_clear_error(tmp_path, capsys, monkeypatch):
    from draftlab.sglang import server

    monkeypatch.setenv("DRAFTLAB_SERVER_REGISTRY", str(tmp_path / "registry"))
    cmd = sglang_speculative_command("/m/target", "/d/eagle3", port=free_port())
    code = server.main(["--launch", cmd, "--log", str(tmp_path / "s.log"), "--startup-timeout", "30"])
    err = capsys.readouterr().err
    assert code == 1 and "error: SGLang server exited with code 1" in err
    assert "No module named 'sglang'" in err  # the log's tail says why
    assert not list((tmp_path / "registry").glob("*.json"))


def test_measure_runs_real_processes_records_failures_resumes_and_leaves_nothing(tmp_path, monkeypatch):
    """draftlab.sglang.live.measure over real server processes: one that never starts (recorded,
    the rest measured), all stopped afterwards, and a rerun measures nothing twice."""
    from draftlab.benchmark_acceptance import sglang_live as live

    monkeypatch.setenv("DRAFTLAB_SERVER_REGISTRY", str(tmp_path / "registry"))
    ports = {}
    args = {
        "baseline": [],
        "dies": ["--fail-generate"],
        "EAGLE3 S3 K1 D4": ["--accept", "2"],
        "broken": ["--ready-after", "600"],
    }
    pids = []

    def server(entry, log):
        ports[entry.label] = port = free_port()
        srv = ServerProcess(
            [sys.executable, str(HEALTH), str(port), *args[entry.label]],
            log,
            base_url=f"http://127.0.0.1:{port}",
            startup_timeout=3 if entry.label == "broken" else 20,
            registry=tmp_path / "registry",
        )
        pids.append(srv)
        return srv

    entries = [
        live.Entry("baseline", "cmd"),
        live.Entry("dies", "cmd"),  # healthy, then every request fails: recorded, the next still measured
        live.Entry("EAGLE3 S3 K1 D4", "cmd", [1, 2], 3, 1, 4, "EAGLE3"),
        live.Entry("broken", "cmd"),
    ]
    prompts = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    done = live.measure(entries, prompts, tmp_path / "out", repeats=2, warmup=1, max_new_tokens=3, server=server)
    assert done == ["baseline", "EAGLE3 S3 K1 D4"]
    assert all(_gone(s.pid) for s in pids)
    assert not list((tmp_path / "registry").glob("*.json"))
    failures = [json.loads(x) for x in (tmp_path / "out" / "failures.jsonl").read_text().splitlines()]
    assert [f["label"] for f in failures] == ["broken", "dies"] and "no answer" in failures[0]["error"]
    assert "every request failed" in failures[1]["error"] and "500" in failures[1]["error"]
    windows = [(w["label"], w["repeat"], w["concurrency"]) for w in live.read_windows(tmp_path / "out")]
    assert windows == [  # in rounds: every server's turn before any server's second window
        ("baseline", 0, 1),
        ("EAGLE3 S3 K1 D4", 0, 1),
        ("EAGLE3 S3 K1 D4", 0, 2),
        ("baseline", 1, 1),
        ("EAGLE3 S3 K1 D4", 1, 1),
        ("EAGLE3 S3 K1 D4", 1, 2),
    ]
    table = live.summarize(tmp_path / "out").set_index(["label", "concurrency"])
    assert table.loc[("EAGLE3 S3 K1 D4", 1), "acceptance_length"] == pytest.approx(8 / 5)  # 3+3+2 tokens, 2+2+1 steps
    assert table.loc[("EAGLE3 S3 K1 D4", 1), "identical"] == 3  # same fixture outputs as the baseline
    assert (
        live.measure(
            [entries[0], entries[2]], prompts, tmp_path / "out", repeats=2, warmup=1, max_new_tokens=3, server=server
        )
        == []
    )


def test_a_sigterm_between_turns_keeps_the_rounds_done_and_stops_every_server(tmp_path, monkeypatch):
    """A stop is a signal: a SIGTERM during a turn lets that turn finish, then the measurement stops with
    one line (core.stop.Stopped, exit 143) before the next turn; the windows taken stay, no server runs on."""
    import os
    import signal

    from draftlab.benchmark_acceptance import sglang_live as live
    from draftlab.core.stop import Stopped

    monkeypatch.setenv("DRAFTLAB_SERVER_REGISTRY", str(tmp_path / "registry"))
    procs, turns = [], []
    real_turn = live._measure_turn

    def turn(*args, **kwargs):
        result = real_turn(*args, **kwargs)
        turns.append(1)
        if len(turns) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only records it: the loop stops at its next check
        return result

    monkeypatch.setattr(live, "_measure_turn", turn)

    def server(entry, log):
        procs.append(_server(tmp_path, *(["--accept", "2"] if entry.algorithm else []), log=log))
        return procs[-1]

    entries = [live.Entry("baseline", "cmd"), live.Entry("EAGLE3 S3 K1 D4", "cmd", [1], 3, 1, 4, "EAGLE3")]
    with pytest.raises(Stopped) as stopped:
        live.measure(
            entries, [[1, 2, 3], [4, 5]], tmp_path / "out", repeats=3, warmup=0, max_new_tokens=3, server=server
        )
    assert stopped.value.exit_code == 143 and "stopped by SIGTERM" in str(stopped.value)
    windows = [(w["label"], w["repeat"]) for w in live.read_windows(tmp_path / "out")]
    assert windows == [("baseline", 0), ("EAGLE3 S3 K1 D4", 0), ("baseline", 1)]
    assert all(_gone(p.pid) for p in procs)
