"""The GPU call's control flow (ops.gpu_step and its modules) with fake stage commands:
deadlines that stop a stage and its kernel, the cut and skip rules, the state and the packed run,
step's exit codes, and common.sh's functions calling it as the lead's scripts do."""

import hashlib
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from draftlab.model.target import cache_dir, embedded_gguf
from ops import gpu_call, gpu_pack, gpu_stages, gpu_step
from ops.gpu_call import Call, stage_overrides

ROOT = Path(__file__).resolve().parents[2]

# A stand-in for `draftlab run`: FAKE_PLAN {"NN": mode}; done | partial (07 not complete) | empty (no
# metrics) | fail | sleep (starts a child in a session of its own, as a Jupyter kernel is, then sleeps)
FAKE_STAGE = r"""
import json, os, subprocess, sys, time
from pathlib import Path
args = sys.argv[1:]
results = Path(args[args.index("--results") + 1])
run = results / args[args.index("--run-id") + 1]
nb = args[args.index("--results") + 2]
run.mkdir(parents=True, exist_ok=True)
with open(run / "argv.jsonl", "a") as f:
    f.write(json.dumps(args) + "\n")
(run / "params.yaml").write_text(f"nb: {nb}\n")
mode = json.loads(os.environ.get("FAKE_PLAN", "{}")).get(nb, "done")
if mode == "sleep":
    kid = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
    (run / f"{nb}.kid").write_text(str(kid.pid))
    time.sleep(300)
if mode == "fail":
    sys.exit(1)
if mode in ("done", "partial"):
    path = run / "metrics.json"
    metrics = json.loads(path.read_text()) if path.is_file() else {}
    metrics[f"{nb}_stage"] = {"complete": mode == "done"}
    path.write_text(json.dumps(metrics))
"""


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture
def fake(tmp_path, monkeypatch):
    script = tmp_path / "fake_stage.py"
    script.write_text(FAKE_STAGE)
    monkeypatch.setattr(gpu_stages, "MIN_LEFT_S", 1)

    def make(budget_s=60, stages="00 01 03 06 07", plan=None, **kw):
        monkeypatch.setenv("FAKE_PLAN", json.dumps(plan or {}))
        now = int(time.time())
        return Call(
            out=tmp_path / "out",
            dl=tmp_path / "dl",
            site=tmp_path / "site",
            scratch=tmp_path / "scratch",
            t0=now,
            deadline=now + budget_s,
            stages=stages.split(),
            stage_command=[sys.executable, str(script)],
            repo=ROOT,
            **kw,
        )

    return make


def argv_of(call):
    return [json.loads(line) for line in (call.run / "argv.jsonl").read_text().splitlines()]


def test_a_stage_past_the_deadline_is_stopped_with_its_kernel_and_counted_as_a_cut(fake):
    call = fake(budget_s=3, stages="00 06 01", plan={"06": "sleep"})
    t = time.time()
    assert gpu_stages.run_pending(call) == (gpu_stages.AGAIN, [])
    assert time.time() - t < 20
    kid = int((call.run / "06.kid").read_text())
    assert not alive(kid), "the stage's child (its own session) outlived the deadline"
    assert gpu_stages.cuts(call, "06") == 1 and gpu_stages.cuts(call, "00") == 0
    assert [a[-1] for a in argv_of(call)] == ["00", "06"]  # 01 never started
    seconds = json.loads((call.run / "params.d" / "06.seconds.json").read_text())
    assert list(seconds) == ["06_benchmark_acceptance"] and seconds["06_benchmark_acceptance"] >= 1


def test_a_cut_stage_runs_only_first_and_is_skipped_after_two_cuts(fake):
    call = fake(stages="00 06 01")
    (call.run / "params.d").mkdir(parents=True)
    (call.run / "params.d" / "01.cuts").write_text("1\n")
    (call.run / "params.d" / "06.cuts").write_text("2\n")
    # 00 runs; 06 is skipped (two cuts); 01 was cut once and is not this call's first stage: the next call
    assert gpu_stages.run_pending(call) == (gpu_stages.AGAIN, ["06"])
    assert [a[-1] for a in argv_of(call)] == ["00"]
    assert gpu_stages.run_pending(call) == (gpu_stages.DONE, ["06"])  # 01 now the call's first stage
    assert [a[6] for a in argv_of(call)] == ["00", "01"] and argv_of(call)[-1][7:] == ["-p", "LIVE", "false"]


def test_resumable_stages_are_never_skipped(fake):
    call = fake(stages="00 03 04 07")
    (call.run / "params.d").mkdir(parents=True)
    for nb in ("03", "04", "07"):
        (call.run / "params.d" / f"{nb}.cuts").write_text("5\n")
    assert gpu_stages.run_pending(call) == (gpu_stages.DONE, [])
    assert [a[6] for a in argv_of(call)] == ["00", "03", "04", "07"]


def test_failures_missing_metrics_and_an_unfinished_07(fake):
    assert gpu_stages.run_pending(fake(stages="00 01", plan={"01": "fail"}))[0] == gpu_stages.FAILED
    assert gpu_stages.run_pending(fake(stages="02", plan={"02": "empty"}))[0] == gpu_stages.FAILED
    assert gpu_stages.run_pending(fake(stages="07", plan={"07": "partial"}))[0] == gpu_stages.AGAIN


def test_overrides_the_gpu_machine_adds_then_the_callers(fake, monkeypatch):
    monkeypatch.setattr(gpu_stages, "MIN_LEFT_S", 60)
    call = fake(budget_s=400, overrides=stage_overrides({"P07": "-p SIZES [500,1000]", "P06": " -p SAMPLES  32 "}))
    assert gpu_stages.overrides_for(call, "06") == ["-p", "SAMPLES", "32"]
    assert gpu_stages.overrides_for(call, "01") == ["-p", "LIVE", "false"]
    assert gpu_stages.overrides_for(call, "05") == ["-p", "PROBE_SERVER", "false"]
    # no time budget for 07: the call's deadline stops it with SIGTERM (it checkpoints; the next call resumes)
    assert gpu_stages.overrides_for(call, "07") == ["-p", "SIZES", "[500,1000]"]


def test_call_from_env_deadline_and_knobs():
    env = {
        "OUT": "/o",
        "DL": "/d",
        "BUDGET_S": "100",
        "GPU_CALL_T0": "1000",
        "STAGES": "03 07",
        "P03": "-p A 1",
        "PROFILE": "quick",
    }
    call = Call.from_env(env)
    assert (call.t0, call.deadline, call.stages, call.profile) == (1000, 1100, ["03", "07"], "quick")
    assert call.run == Path("/d/results/reference") and call.overrides == {"03": ["-p", "A", "1"]}
    assert Call.from_env({**env, "GPU_CALL_DEADLINE": "1050"}).deadline == 1050  # common.sh's own
    assert Call.from_env({**env, "GPU_CALL_DEADLINE": "1050"}, budget_s=20).deadline == 1020  # --budget-s wins
    assert Call.from_env(env, stages="06", overrides={"03": []}).overrides == {"03": []}
    assert Call.from_env({**env, "RESULTS": "/r", "RUN_ID": "x"}).run == Path("/r/x")  # common.sh's RESULTS, RUN_ID


def make_run(run: Path) -> None:
    for rel in (
        "data/blend/train.jsonl",
        "data/regen/train.jsonl",
        "data/regen/work/shard-0.work",
        "train/eagle3/ckpt-10/model.safetensors",
        "train/eagle3/.ckpt-tmp/x",
        "train/eagle3/tb/events",
        "train/eagle3/train.csv",
        "train/hidden/h.safetensors",
        "train/tokens/t.bin",
        "drafts/eagle3/config.json",
        "scaling/eagle3-16/x",
        "scaling/train_shuffled.jsonl",
        "scaling/results.jsonl",
        ".restored",
        "figures/a.png",
        "executed/00_environment_check.ipynb",
        "bench/generate_sweep.json",
        "run_notes.md",
    ):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text("x\n")
    (run / "drafts/eagle3/model.safetensors").write_bytes(b"w" * 1000)


def names(path) -> set[str]:
    with tarfile.open(path) as tar:
        return {m.name for m in tar.getmembers()}


def test_save_state_leaves_out_weights_checkpoints_and_caches(fake):
    call = fake()
    make_run(call.run)
    call.out.mkdir(parents=True)
    (call.out / "state-run.tar.xz.part-7").write_text("old")
    assert gpu_pack.save_state(call) == 0
    assert sorted(p.name for p in call.out.iterdir()) == ["state-run.tar.xz"]
    got = names(call.out / "state-run.tar.xz")
    assert {
        "reference/data/blend/train.jsonl",
        "reference/train/eagle3/train.csv",
        "reference/scaling/results.jsonl",
        "reference/data/regen/work/shard-0.work",
        "reference/figures/a.png",
    } <= got
    for gone in (
        "safetensors",
        "ckpt-",
        "/tb",
        "/hidden",
        "/tokens",
        "drafts",
        "scaling/eagle3",
        "train_shuffled",
        ".restored",
    ):
        assert not [n for n in got if gone in n], gone
    (call.run / "metrics.json").write_text(json.dumps({"03_regenerate": {}}))  # 03 done: its work shards go
    gpu_pack.save_state(call)
    assert not [n for n in names(call.out / "state-run.tar.xz") if "work" in n]


def test_large_state_comes_back_in_parts_and_restores(fake, monkeypatch, tmp_path):
    call = fake()
    make_run(call.run)
    (call.run / "data/blend/big.bin").write_bytes(os.urandom(300_000))
    monkeypatch.setattr(gpu_pack, "PART_BYTES", 100_000)
    gpu_pack.save_state(call)
    parts = sorted(p.name for p in call.out.iterdir())
    assert parts == [f"state-run.tar.xz.part-{i}" for i in range(len(parts))] and len(parts) >= 3
    cold = Call(
        out=tmp_path / "o2",
        dl=tmp_path / "dl2",
        site=call.site,
        scratch=call.scratch,
        t0=call.t0,
        deadline=call.deadline,
        repo=tmp_path / "repo",
    )
    (cold.repo / ".device/state").mkdir(parents=True)
    for p in call.out.iterdir():
        (cold.repo / ".device/state" / p.name).write_bytes(p.read_bytes())
    assert gpu_call.restore_state(cold) and (cold.run / ".restored").is_file()
    assert (cold.run / "data/blend/big.bin").read_bytes() == (call.run / "data/blend/big.bin").read_bytes()


def finished_run(run: Path) -> None:
    make_run(run)
    row = {
        "arch": "eagle3",
        "S": 6,
        "K": 1,
        "D": 7,
        "mode": "EAGLE3",
        "eval_set": "blend",
        "samples": 4,
        "acceptance_length": 2.5,
        "speedup": 1.4,
        "lossless": "4/4",
        "dtype": "float32",
    }
    (run / "metrics.json").write_text(
        json.dumps(
            {
                "03_regenerate": {"splits": {"train": {"tok_s": 1000.0}}},
                "06_benchmark_acceptance": {
                    "eval_sets": {"blend": 4},
                    "by_set": [row],
                    "by_chain": [],
                    "wrong_mode": [],
                },
            }
        )
    )
    (run / "params.yaml").write_text("run_id: reference\n")


def test_pack_reference_holds_the_results_and_no_data_or_weights(fake):
    call = fake()
    finished_run(call.run)
    call.out.mkdir(parents=True)
    assert gpu_pack.pack_reference(call) == 0
    got = names(call.out / "reference.tar.gz")
    assert {
        "reference/params.yaml",
        "reference/metrics.json",
        "reference/summary.json",
        "reference/README.md",
        "reference/figures/a.png",
        "reference/executed/00_environment_check.ipynb",
        "reference/bench/generate_sweep.json",
        "reference/run_notes.md",
    } <= got
    assert not [n for n in got if n.split("/")[1:2] in (["data"], ["train"], ["drafts"], ["scaling"])]
    assert json.loads((call.out / "summary.json").read_text())["regeneration_tok_s"] == 1000.0
    (call.run / "README.md").unlink()
    (call.run / "figures/a.png").unlink()
    (call.run / "figures").rmdir()
    assert gpu_pack.pack_reference(call) == 1  # figures are required


def test_save_draft_in_parts(fake, monkeypatch):
    call = fake()
    make_run(call.run)
    call.out.mkdir(parents=True)
    monkeypatch.setattr(gpu_pack, "PART_BYTES", 4096)
    assert gpu_pack.save_draft(call) == 0
    parts = sorted(call.out.glob("draft-eagle3.tar.part-*"))
    assert len(parts) >= 2
    whole = call.out / "whole.tar"
    whole.write_bytes(b"".join(p.read_bytes() for p in parts))
    assert names(whole) >= {"eagle3/model.safetensors", "eagle3/config.json"}


@pytest.mark.parametrize(
    "plan, setup_ok, code, files",
    [
        ({}, True, 0, {"reference.tar.gz", "summary.json"}),
        ({"06": "sleep"}, True, 3, {"state-run.tar.xz"}),
        ({"01": "fail"}, True, 1, {"state-run.tar.xz"}),
        ({}, False, 1, set()),
    ],
)
def test_step_exit_codes_and_what_comes_back(fake, plan, setup_ok, code, files):
    call = fake(budget_s=4, stages="00 01 06", plan=plan)
    finished_run(call.run) if setup_ok else None
    (call.run / "metrics.json").unlink(missing_ok=True)
    call.out.mkdir(parents=True)
    assert gpu_step.step(call, attn_check=False, setup=lambda c: setup_ok) == code
    assert {p.name for p in call.out.iterdir()} == files | ({"draft-eagle3.tar.part-0"} if code == 0 else set())


def bash(script: str, tmp_path, **env) -> subprocess.CompletedProcess:
    fake_stage = tmp_path / "fake_stage.py"
    fake_stage.write_text(FAKE_STAGE)
    full = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "DL": str(tmp_path / "dl"),
        "SITE": str(tmp_path / "site"),
        "SCRATCH": str(tmp_path / "scratch"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "STAGE_COMMAND": f"{sys.executable} {fake_stage}",
        **env,
    }
    return subprocess.run(["bash", "-c", script], cwd=ROOT, env=full, capture_output=True, text=True, timeout=120)


LEAD_FUNCTIONS = (
    "say left ensure_all ensure_wheels ensure_target run_pending run_stage stage_done save_state "
    "save_draft pack_reference report gpu_step"
)


def test_common_sh_functions_as_the_lead_scripts_call_them(tmp_path):
    """sglang.sh's `STAGES=(03); P03="..." run_pending`, run_stage's 124 at the deadline, the variables."""
    out = bash(
        f'source ops/gpu/common.sh; for f in {LEAD_FUNCTIONS}; do [ "$(type -t $f)" = function ] '
        '|| echo "missing $f"; done; echo "vars $RUN $RESULTS $DL"; '
        'STAGES=(03); P03="-p BACKEND server -p BASE_URLS [\\"http://h:1\\"]" run_pending; echo "pending=$?"; '
        "stage_done 03 && echo done03; report",
        tmp_path,
    )
    log = out.stdout + out.stderr
    assert "missing" not in log and "pending=0" in log and "done03" in log and "stages done: 03" in log, log
    run = tmp_path / "dl/results/reference"
    assert f"vars {run} {run.parent} {tmp_path}/dl" in log
    assert (tmp_path / "out/log").read_text().count("stage 03: exit 0") == 1
    out = bash(
        'source ops/gpu/common.sh; FAKE_PLAN=\'{"06": "sleep"}\' run_stage 06 -p SAMPLES 8; '
        'echo "stage=$?"; STAGES=(06); run_pending; echo "again=$? skipped=[$SKIPPED]"',
        tmp_path,
        BUDGET_S="4",
    )
    log = out.stdout + out.stderr
    argv = [json.loads(line) for line in (run / "argv.jsonl").read_text().splitlines()]
    assert argv[0] == [
        "--profile",
        "full",
        "--run-id",
        "reference",
        "--results",
        str(run.parent),
        "03",
        "-p",
        "BACKEND",
        "server",
        "-p",
        "BASE_URLS",
        '["http://h:1"]',
    ]
    assert argv[1][-3:] == ["-p", "SAMPLES", "8"] and "stage=124" in log and "deadline: stopping pid" in log, log
    assert "less than 60 s left: stopping before 06" in log and "again=2 skipped=[]" in log, log


def test_step_sh_runs_to_done_and_packs(tmp_path):
    """step.sh end to end: its set-up finds the GGUF checked and the target converted (this machine's)."""
    dl = tmp_path / "dl"
    dl.mkdir()
    (dl / "model.gguf").symlink_to(embedded_gguf())
    (dl / "model.gguf.ok").write_text("")
    (dl / "cache").symlink_to(cache_dir())
    finished_run(dl / "results/reference")
    (dl / "results/reference/metrics.json").unlink()
    out = bash("bash ops/gpu/step.sh; echo rc=$?", tmp_path, STAGES="00 01", ATTN_CHECK="0")
    log = out.stdout + out.stderr
    assert "rc=0" in log and "DONE: " in log and "embedded target ready" in log, log
    assert {"reference.tar.gz", "summary.json", "log", "draft-eagle3.tar.part-0"} == {
        p.name for p in (tmp_path / "out").iterdir()
    }
    assert (tmp_path / "out/log").read_text().count("DONE: ") == 1


def test_the_gguf_joined_from_its_carried_parts_is_checked(tmp_path, capsys):
    """ensure_gguf through join_parts: parts that are not the embedded GGUF leave no model.gguf."""
    now = int(time.time())
    call = Call(
        out=tmp_path / "out",
        dl=tmp_path / "dl",
        site=tmp_path / "site",
        scratch=tmp_path / "scratch",
        t0=now,
        deadline=now + 60,
        repo=tmp_path / "repo",
    )
    for folder, name in ((call.scratch, "part-aa"), (call.repo / ".device/b", "part-ab")):
        folder.mkdir(parents=True)
        (folder / name).write_bytes(name.encode())
    call.dl.mkdir()
    assert gpu_call.join_parts([call.scratch / "part-aa", call.repo / ".device/b/part-ab"], tmp_path / "j") == (
        hashlib.sha256(b"part-aapart-ab").hexdigest()
    )
    assert not gpu_call.ensure_gguf(call)
    assert "model.gguf: FAILED (sha256)" in capsys.readouterr().out and not (call.dl / "model.gguf").exists()


def test_one_scripts_knob_does_not_break_another_commands_parser(monkeypatch):
    """recipes.sh's CONCURRENCY=1,16 once failed every command: regen-servers' integer default was parsed eagerly."""
    monkeypatch.setenv("CONCURRENCY", "1,16")
    monkeypatch.setenv("K", "many")
    assert gpu_step.parser().parse_args(["recipes", "measure"]).phase == "measure"
    monkeypatch.setenv("CONCURRENCY", "256")
    monkeypatch.setenv("K", "3")
    args = gpu_step.parser().parse_args(["regen-servers"])
    assert (args.concurrency, args.k, args.n, args.mem) == (256, 3, 4096, 0.5)
