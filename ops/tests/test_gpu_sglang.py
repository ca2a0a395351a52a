"""sglang.sh's phases (ops.gpu_sglang) on real processes: an interpreter stand-in answers the
commands that need a GPU or SGLang (`bench specdec`, `bench sglang`, the bundle install, the import
check) by writing what they write, and runs everything else (the oracle gaps, the draftlab CLI) with
this interpreter. What is tested: the study's resume, the oracle loop and its deadlines, what comes
back, the background training, and sglang.sh's exit codes through the thin wrapper."""

import dataclasses
import hashlib
import json
import os
import stat
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest
from test_gpu_call import FAKE_STAGE, bash

from draftlab.model.target import cache_dir, embedded_gguf
from draftlab.sglang.install import DONE_MARKER
from ops import gpu_sglang
from ops.gpu_call import Call
from ops.gpu_sglang import AGAIN, DONE, FAILED, Knobs

ROOT = Path(__file__).resolve().parents[2]

# an interpreter stand-in: what its body answers is logged to FAKE_LOG, everything else runs for real
STAND_IN_HEAD = r"""
import json, os, sys, time
from pathlib import Path
argv = sys.argv[1:]
def log(what):
    with open(os.environ["FAKE_LOG"], "a") as f:
        f.write(json.dumps(what) + "\n")
"""
# FAKE_PLAN {"specdec"|"sglang": "sleep"}
FAKE_PYTHON = r"""
if argv[:2] == ["-m", "draftlab.cli"] and argv[2:3] == ["bench"] and argv[3] in ("specdec", "sglang") and (
        argv[3] == "specdec" or "--summary-only" not in argv):
    log(argv[3:])
    if json.loads(os.environ.get("FAKE_PLAN", "{}")).get(argv[3]) == "sleep":
        time.sleep(300)
    out = Path(argv[argv.index("--out") + 1])
    print("  5%|#         | 1/20 [00:01<00:19,  1.00it/s]", flush=True)
    if argv[3] == "specdec":
        out.write_text("[]")
    else:
        out.mkdir(parents=True, exist_ok=True)
        (out / "plan.json").write_text(json.dumps({"entries": [{"label": "EAGLE3 S6 K1 D7"}]}))
        (out / "failures.jsonl").write_text(json.dumps({"label": "EAGLE3 S6 K1 D7"}) + "\n")  # done, no windows
        (out / "summary.csv").write_text("label\n")
    print("measured", argv[3], flush=True)
    sys.exit(0)
if argv[:2] == ["-m", "draftlab.sglang.install"]:
    log(argv[2:3])
    sys.exit(0)
if argv[:1] == ["-c"] and "import sglang" in argv[1]:
    print("0.5.17")
    sys.exit(0)
"""


def stand_in_python(tmp_path, monkeypatch, body: str) -> str:
    """The stand-in with `body`'s answers, as an executable in tmp_path; FAKE_LOG set."""
    fake = tmp_path / "python-fixture"
    fake.write_text(f"#!{sys.executable}\n{STAND_IN_HEAD}{body}os.execv(sys.executable, [sys.executable, *argv])\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("FAKE_LOG", str(tmp_path / "fake.log"))
    return str(fake)


@pytest.fixture
def call(tmp_path, monkeypatch):
    fake = stand_in_python(tmp_path, monkeypatch, FAKE_PYTHON)
    now = int(time.time())
    c = Call(
        out=tmp_path / "out",
        dl=tmp_path / "dl",
        site=tmp_path / "site",
        scratch=tmp_path / "scratch",
        t0=now,
        deadline=now + 600,
        repo=ROOT,
        python=fake,
    )
    for folder in (c.out, c.sglang_prefix, c.run / "sglang"):
        folder.mkdir(parents=True)
    (c.sglang_prefix / DONE_MARKER).write_text("{}")
    return c


def logged(tmp_path) -> list[list[str]]:
    path = tmp_path / "fake.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def trained_run(run: Path) -> None:
    """A run whose 04 is done: metrics, the exported draft, the regenerated and held-out splits."""
    for rel in (
        "drafts/eagle3/config.json",
        "data/regen/train.jsonl",
        "data/regen/val.jsonl",
        "data/blend/test.jsonl",
        "train/eagle3/ckpt-5/x.pt",
    ):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text('{"id": "a"}\n')
    (run / "drafts/eagle3/model.safetensors").write_bytes(b"w" * 100)
    (run / "metrics.json").write_text(json.dumps({"04_train_draft": {"kept": 10, "train_stats": {}}}))


def test_study_missing_reads_the_plan_and_what_was_measured_or_failed(tmp_path):
    study = tmp_path / "study"
    assert gpu_sglang.study_missing(study) == ["no plan"]
    study.mkdir()
    (study / "plan.json").write_text(json.dumps({"entries": [{"label": x} for x in ("baseline", "EAGLE3 S1", "tree")]}))
    (study / "windows.jsonl").write_text(json.dumps({"label": "baseline"}) + "\n\n")
    (study / "failures.jsonl").write_text(json.dumps({"label": "tree"}) + "\n")
    assert gpu_sglang.study_missing(study) == ["EAGLE3_S1"]


def test_after_measures_once_sends_back_once_and_is_done(call, tmp_path, capsys):
    trained_run(call.run)
    knobs = Knobs.from_env(call, env={})
    assert knobs.draft == call.run / "drafts/eagle3" and knobs.samples == 32
    assert gpu_sglang.after(call, knobs) == DONE
    out = capsys.readouterr().out
    assert "04 done: {'kept': 10}" in out and "measured sglang" in out and "DONE" in out
    assert "it/s]" not in out  # progress bars left out of the log
    runs = logged(tmp_path)
    assert runs[0] == ["install"] and [r[0] for r in runs[1:]] == ["sglang"] + ["specdec"] * 4
    study = runs[1]
    assert study[study.index("--samples") + 1] == "32" and study[study.index("--out") + 1].endswith("sglang/study")
    assert runs[2][runs[2].index("--steps") + 1] == "1,3,6" and runs[5][-2:] == ["--mode", "EAGLE"]
    assert (call.run / "sglang/version.txt").read_text() == "0.5.17\n"
    assert (call.run / "sglang/summary.json").is_file()  # the real `bench sglang --summary-only`
    assert {"draft-eagle3.tar.part-0", "regen-train.jsonl.xz", "regen-val.jsonl.xz", "sglang-results.tar.gz"} <= {
        p.name for p in call.out.iterdir()
    }
    with tarfile.open(call.out / "sglang-results.tar.gz") as tar:
        names = tar.getnames()
    assert "reference/sglang/oracle_chain.json" in names and "reference/metrics.json" in names
    assert not [n for n in names if "/data" in n or "/drafts" in n or "ckpt-" in n or n.endswith(".pt")], names
    (call.out / "regen-train.jsonl.xz").unlink()
    assert gpu_sglang.after(call, knobs) == DONE  # a second call: nothing measured or sent again
    assert [r[0] for r in logged(tmp_path)[len(runs) :]] == ["install"]
    assert not (call.out / "regen-train.jsonl.xz").exists()


def test_after_with_too_little_time_for_the_study_asks_for_another_call(call, tmp_path):
    trained_run(call.run)
    knobs = dataclasses.replace(Knobs.from_env(call, env={}), study_min_s=10_000)
    assert gpu_sglang.after(call, knobs) == AGAIN
    assert [r[0] for r in logged(tmp_path)] == ["install"] and (call.out / "sglang-results.tar.gz").is_file()


def published_run(root: Path, weights: bytes, knobs: Knobs) -> None:
    """A published run as ORACLE_FROM expects it: RUN/sglang's oracle rows and RUN/draft/eagle3.sha256."""
    (root / "sglang").mkdir(parents=True)
    (root / "draft").mkdir()
    for name, _ in knobs.oracle_specs():
        (root / "sglang" / f"oracle_{name}.json").write_text("[]")
    digest = hashlib.sha256(weights).hexdigest()
    (root / "draft/eagle3.sha256").write_text(f"{digest}  model.safetensors\n")


def test_after_a_published_draft_reuses_the_published_oracle_rows(call, tmp_path, monkeypatch):
    draft = tmp_path / "published"
    draft.mkdir()
    (draft / "model.safetensors").write_bytes(b"w")
    monkeypatch.setattr(gpu_sglang.gpu_call, "ensure_all", lambda c: True)  # the set-up: tested in test_gpu_call
    env = {"DRAFT": str(draft), "STUDY_ARGS": "--chain 6 --trees none", "ORACLE_FROM": str(tmp_path / "run/sglang")}
    knobs = Knobs.from_env(call, env=env)
    published_run(tmp_path / "run", b"w", knobs)
    assert gpu_sglang.after(call, knobs) == DONE
    assert (call.run / "data/blend/test.jsonl").read_text().count("\n") > 100  # from the tracked EVAL_XZ
    runs = logged(tmp_path)
    assert [r[0] for r in runs] == ["install", "sglang"]  # the four oracle rows came from ORACLE_FROM
    assert runs[1][runs[1].index("--chain") + 1] == "6" and runs[1][runs[1].index("--trees") + 1] == "none"
    assert runs[1][runs[1].index("--draft") + 1] == str(draft)


def test_a_study_of_its_own_keeps_the_default_study_apart_and_its_quoted_variant_whole(call, tmp_path, monkeypatch):
    draft = tmp_path / "published"
    draft.mkdir()
    (draft / "model.safetensors").write_bytes(b"w")
    monkeypatch.setattr(gpu_sglang.gpu_call, "ensure_all", lambda c: True)
    variant = "--variant=no-overlap=--disable-overlap-schedule --num-continuous-decode-steps 2"
    env = {"DRAFT": str(draft), "ORACLE_FROM": str(tmp_path / "run/sglang"), "STUDY": "flags"}
    knobs = Knobs.from_env(call, env={**env, "STUDY_ARGS": f"--chain 6 '{variant}'"})
    published_run(tmp_path / "run", b"w", knobs)
    gpu_sglang.after(call, knobs)
    study = logged(tmp_path)[1]
    assert study[study.index("--out") + 1] == str(call.run / "sglang/flags") and variant in study


def test_after_another_draft_measures_the_oracle_rows_anew(call, tmp_path, monkeypatch, capsys):
    draft = tmp_path / "other"
    draft.mkdir()
    (draft / "model.safetensors").write_bytes(b"another draft's weights")
    monkeypatch.setattr(gpu_sglang.gpu_call, "ensure_all", lambda c: True)
    knobs = Knobs.from_env(call, env={"DRAFT": str(draft), "ORACLE_FROM": str(tmp_path / "run/sglang")})
    published_run(tmp_path / "run", b"w", knobs)
    assert gpu_sglang.after(call, knobs) == DONE
    assert [r[0] for r in logged(tmp_path)] == ["install", "sglang", "specdec", "specdec", "specdec", "specdec"]
    assert "measured another draft" in capsys.readouterr().out


def test_wait_training_fails_when_04_stopped_and_waits_while_it_runs(call, capsys):
    assert gpu_sglang.wait_training(call, poll=0.1) == FAILED
    assert "FAILED: 04 is not running and not done" in capsys.readouterr().out
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (call.dl / "train-bg.pid").write_text(f"{sleeper.pid}\n")
        (call.run / "train/eagle3").mkdir(parents=True)
        (call.run / "train/eagle3/train.log").write_text("step 10 loss 2\nstep 20 loss 1\n")
        call.deadline = int(time.time()) + 31
        t0 = time.time()
        assert gpu_sglang.wait_training(call, poll=0.2) == AGAIN
        assert time.time() - t0 < 10 and "04 still training: step 20" in capsys.readouterr().out
    finally:
        sleeper.kill()
        sleeper.wait()


def test_oracle_check_stops_each_command_before_the_deadline_and_resumes(call, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("FAKE_PLAN", json.dumps({"specdec": "sleep", "sglang": "sleep"}))
    knobs = Knobs.from_env(call, env={"SAMPLES": "8"})
    call.deadline = int(time.time()) + 34  # the engine gets until 30 s before it, the study 20 s
    t0 = time.time()
    assert gpu_sglang.oracle_check(call, knobs) == 0
    assert time.time() - t0 < 25
    out = capsys.readouterr().out
    assert "oracle check: engine chain6 exit 124" in out and "oracle check: SGLang study exit 124" in out, out
    assert json.loads((call.out / "oracle_check.json").read_text())["samples"] == 8
    monkeypatch.delenv("FAKE_PLAN")
    call.deadline = int(time.time()) + 600
    chk = call.dl / "check8"
    (chk / "sglang/study/weights.safetensors").parent.mkdir(parents=True, exist_ok=True)
    (chk / "sglang/study/weights.safetensors").write_bytes(b"w")
    first = len(logged(tmp_path))  # (the runs started after the deadline may not have got as far as their log)
    assert gpu_sglang.oracle_check(call, knobs) == 0
    assert [r[0] for r in logged(tmp_path)][first:] == ["specdec", "specdec", "sglang"]
    assert gpu_sglang.oracle_check(call, knobs) == 0  # the engine's rows are kept; the study resumes itself
    assert [r[0] for r in logged(tmp_path)][first + 3 :] == ["sglang"]
    with tarfile.open(call.out / "oracle-check.tar.gz") as tar:
        names = tar.getnames()
    assert "check8/sglang/oracle_tree548.json" in names and "check8/engine_chain6.log" in names
    assert not [n for n in names if n.endswith(".safetensors")]


# a checkout holding packed cargo: a script's `cargo.sh receive` would unpack it and link its folders in
HOLDS_CARGO = pytest.mark.skipif(
    any((ROOT / ".device" / "cargo").glob("c*/chunk.*")),
    reason="this checkout holds packed cargo: receiving it would link its folders in",
)


def wrapper_stash_log(script: str, tmp_path) -> str:
    """A thin ops/gpu wrapper: PHASE=stash takes no cargo and exits 0, an unknown phase exits 2.
    Returns the stash call's log for the script's own checks."""
    env = {"CARGO_HOLD": str(tmp_path / "cargo")}
    out = bash(f"PHASE=stash bash ops/gpu/{script}; echo rc=$?", tmp_path, **env)
    stash = out.stdout + out.stderr
    assert "cargo: no chunk here yet" in stash and "rc=0" in stash, stash
    out = bash(f"PHASE=bogus bash ops/gpu/{script}; echo rc=$?", tmp_path, **env)
    log = out.stdout + out.stderr
    assert "unknown PHASE bogus" in log and "rc=2" in log, log
    return stash


@HOLDS_CARGO
def test_sglang_sh_phases_exit_codes(tmp_path):
    assert "phase stash; bundle parts staged:" in wrapper_stash_log("sglang.sh", tmp_path)


def test_train_in_background_outlives_its_call_and_the_next_call_waits_for_it(call, tmp_path, monkeypatch):
    """04 as step.sh in a session of its own (its stage a fake here), found done by wait_training."""
    (call.dl / "model.gguf").symlink_to(embedded_gguf())
    (call.dl / "model.gguf.ok").write_text("")
    (call.dl / "cache").symlink_to(cache_dir())
    stage = tmp_path / "fake_stage.py"
    stage.write_text(FAKE_STAGE)
    monkeypatch.setenv("STAGE_COMMAND", f"{sys.executable} {stage}")
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    for name, value in (("DL", call.dl), ("SITE", call.site), ("SCRATCH", call.scratch)):
        monkeypatch.setenv(name, str(value))
    assert gpu_sglang.train_in_background(call) == 0
    assert gpu_sglang.wait_training(call, poll=0.5) == DONE
    log = (call.dl / "train-bg.log").read_text()
    argv = json.loads((call.run / "argv.jsonl").read_text().splitlines()[0])
    assert argv[6:] == ["04", "-p", "ARCHS", "[eagle3]", "-p", "SIDE_BY_SIDE", "false", "-p", "EPOCHS", "5.0"], log
    assert (call.dl / "train-bg-out/log").is_file()
