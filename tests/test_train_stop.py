"""A stop is a signal: `draftlab train` as a real process, stopped by SIGTERM or SIGINT mid-run, writes a
checkpoint, exits 143/130 with one line saying how to resume, and the same command with --resume ends the
run; a second signal forces the exit. The shared helper (core.stop) and the study and SGLang loops too."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from draftlab.core.stop import Stopped, graceful_stop
from test_train import write_fixture


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("regen"), n_train=32, n_val=4)


def train_argv(files, out, epochs=8):
    return [
        sys.executable, "-m", "draftlab.cli", "train", "--train-file", str(files[0]), "--val-file", str(files[1]),
        "--out-dir", str(out), "--target", "tiny", "--device", "cpu", "--draft-vocab-size", "512",
        "--epochs", str(epochs), "--batch-tokens", "512", "--max-batch", "8", "--ttt-steps", "3",
        "--log-every", "1", "--eval-every", "1000", "--save-every", "1000", "--threads", "1",
    ]  # fmt: skip


def start_and_wait_for_steps(argv, out, steps=2, timeout=240):
    """The process, once its train.csv holds `steps` logged steps (the loop is running)."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while time.time() - t0 < timeout and proc.poll() is None:
        csv = out / "train.csv"
        if csv.is_file() and len(csv.read_text().splitlines()) > steps:
            return proc
        time.sleep(0.2)
    proc.kill()
    raise AssertionError(f"training did not reach step {steps}: {proc.communicate()[1][-2000:]}")


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.replace("\r", "\n").splitlines() if line.startswith("error:")]


@pytest.mark.slow
def test_sigterm_checkpoints_exits_143_with_one_line_and_resume_finishes(files, tmp_path):
    out = tmp_path / "eagle3"
    argv = train_argv(files, out)
    proc = start_and_wait_for_steps(argv, out)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 143, stderr[-2000:]
    assert "Traceback" not in stderr
    [line] = error_lines(stderr)
    assert "stopped by SIGTERM" in line and "--resume" in line, line
    step = int(line.split(" at step ")[1].split()[0])
    ckpt = out / f"ckpt-{step:07d}"
    assert f"checkpoint {ckpt.name}" in line and (ckpt / "state.json").is_file()
    assert (out / "latest").read_text().strip() == ckpt.name
    summary = json.loads((out / "summary.json").read_text())
    assert not summary["finished"] and 0 < step < summary["total_steps"]

    again = subprocess.run([*argv, "--resume"], capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert f"resumed from {ckpt} at step {step}/" in again.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["finished"] and summary["steps"] == summary["total_steps"]
    assert summary["resumed_from_step"] == step


@pytest.mark.slow
def test_a_second_sigint_forces_the_exit_without_a_traceback(files, tmp_path):
    out = tmp_path / "eagle3"
    proc = start_and_wait_for_steps(train_argv(files, out, epochs=40), out)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr[-2000:]
    assert "Traceback" not in stderr
    [line] = error_lines(stderr)
    assert "SIGINT" in line, line


def test_graceful_stop_first_signal_asks_second_forces(capsys):
    with graceful_stop("rerun to go on") as stop:
        assert not stop
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested == signal.SIGTERM
        with graceful_stop("inner hint") as inner:  # nested: the outer request and its hint
            assert inner is stop
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGTERM)
        with pytest.raises(Stopped, match="work, stopped by SIGTERM; rerun to go on") as exc:
            stop.stopped("work")
        assert exc.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL or callable(signal.getsignal(signal.SIGTERM))
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored


def test_ctrl_c_in_any_command_is_one_line(monkeypatch, capsys):
    from draftlab import cli

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_command", lambda func, args: interrupted(args))
    assert cli.main(["monitor", "somewhere"]) == 130
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: interrupted by SIGINT")


def test_sglang_measure_stops_after_the_turn_in_progress_and_stops_its_servers(tmp_path, monkeypatch):
    """measure(): a SIGTERM during a server's turn lets the turn end, stops every server, raises Stopped;
    the rerun measures only what is left."""
    from draftlab.benchmark_acceptance import sglang_live

    class FakeServer:
        def __init__(self, entry, log):
            self.startup_s, self.stopped = 0.0, False
            started.append(self)

        def launch(self):
            pass

        def wait_ready(self):
            pass

        def stop(self):
            self.stopped = True

    def turn(srv, e, rnd, prompt_ids, out, warmup, max_new_tokens, samples):
        (out / "windows.jsonl").open("a").write(json.dumps({"label": e.label, "round": rnd}) + "\n")
        turns.append(e.label)
        if kill:
            os.kill(os.getpid(), signal.SIGTERM)
            kill.clear()
        return True

    entries = [sglang_live.Entry(label=f"s{i}", command="") for i in range(3)]
    monkeypatch.setattr(sglang_live, "_measure_turn", turn)
    monkeypatch.setattr(sglang_live, "stop_stale", lambda: None)
    started, turns, kill = [], [], [True]
    with pytest.raises(Stopped, match="round 1 of 2, before s1, stopped by SIGTERM") as exc:
        sglang_live.measure(entries, [[1]], tmp_path, repeats=2, server=FakeServer)
    assert exc.value.exit_code == 143 and turns == ["s0"]
    assert all(s.stopped for s in started)
    turns.clear()
    assert sglang_live.measure(entries, [[1]], tmp_path, repeats=2, server=FakeServer) == ["s1", "s2"]
    assert turns == ["s1", "s2", "s1", "s2"]


@pytest.mark.slow
def test_the_scaling_study_stops_between_subsets_and_the_rerun_continues(tmp_path, tiny_target, monkeypatch):
    from draftlab import data_scaling as scaling
    from draftlab.data_scaling import study
    from test_scaling import SMOKE_TRAIN, _regen_dir

    _regen_dir(tmp_path, 24, 4)
    plan = scaling.prepare(tmp_path, tmp_path / "scaling", [4, 16])
    settings = scaling.StudySettings(archs=["eagle3"], train=SMOKE_TRAIN, val_samples=2)
    real_train = study.train

    def train_then_signal(cfg, **kw):
        result = real_train(cfg, **kw)
        os.kill(os.getpid(), signal.SIGTERM)  # after the subset's training: its measurement still finishes
        return result

    monkeypatch.setattr(study, "train", train_then_signal)
    with pytest.raises(Stopped, match="1 subsets done in this call, before eagle3 n=16, stopped by SIGTERM"):
        scaling.run_study(tiny_target, "tiny", "cpu", plan, tmp_path / "scaling", settings, progress=False)
    assert len((tmp_path / "scaling" / "results.jsonl").read_text().splitlines()) == 1
    monkeypatch.setattr(study, "train", real_train)
    out = scaling.run_study(tiny_target, "tiny", "cpu", plan, tmp_path / "scaling", settings, progress=False)
    assert out["ran_now"] == [("eagle3", 16)] and len(out["results"]) == 2
