"""bench_draft.sh's call (ops.gpu_draft_bench) and trace_train_setup.sh's (gpu_bench.trace_setup)
on CPU with real processes: an interpreter stand-in answers `draftlab bench specdec` and
benchmarks/trace_train_setup.py (GPU-only) by writing what they write. What is tested: the parts stashed
over calls and checked against SHA256, the bench list's order, skips and deadline, BENCH, both archs
traced at once, and bench_draft.sh's exit code through the thin wrapper."""

import hashlib
import io
import shutil
import tarfile
import time
from pathlib import Path

import pytest
from test_gpu_call import bash
from test_gpu_sglang import logged, stand_in_python

from draftlab.model.target import cache_dir, embedded_gguf
from ops import gpu_bench, gpu_draft_bench, gpu_step
from ops.gpu_call import Call
from ops.gpu_draft_bench import AGAIN, DONE, FAILED, Knobs

ROOT = Path(__file__).resolve().parents[2]

# answers `-m draftlab.cli bench specdec` (an empty JSON list, after FAKE_SLEEP s) and the set-up trace
# (its profile table, a set-up line, both logged with when they started and ended)
FAKE_PYTHON = r"""
if argv[:4] == ["-m", "draftlab.cli", "bench", "specdec"]:
    log(argv[4:])
    time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
    print("  5%|#         | 1/20 [00:01<00:19,  1.00it/s]", flush=True)
    Path(argv[argv.index("--out") + 1]).write_text("[]")
    print("measured", flush=True)
    sys.exit(0)
if argv[:1] and argv[0].endswith("trace_train_setup.py"):
    t0 = time.time()
    time.sleep(1)
    Path(argv[3]).write_text("cumulative table\n")
    print(f"{argv[2]}: set-up 1.0 s to the first step\nstep 1", flush=True)
    log({"argv": argv, "t0": t0, "t1": time.time()})
    sys.exit(0)
"""


@pytest.fixture
def call(tmp_path, monkeypatch):
    fake = stand_in_python(tmp_path, monkeypatch, FAKE_PYTHON)
    now = int(time.time())
    repo = tmp_path / "repo"  # what the calls carried (.device/...), as the device's checkout holds it
    (repo / ".device").mkdir(parents=True)
    return Call(
        out=tmp_path / "out",
        dl=tmp_path / "dl",
        site=tmp_path / "site",
        scratch=tmp_path / "scratch",
        t0=now,
        deadline=now + 600,
        repo=repo,
        python=fake,
    )


def carried_draft(repo: Path) -> None:
    """What prepare_draft.sh writes: .device/draft-a (part 0, SHA256, COUNT), draft-b (part 1), prompts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in (("config.json", b"{}"), ("model.safetensors", b"w" * 5000)):
            info = tarfile.TarInfo(f"eagle3/{name}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    data = buf.getvalue()
    a, b, prompts = repo / ".device/draft-a", repo / ".device/draft-b", repo / ".device/prompts"
    for folder in (a, b, prompts):
        folder.mkdir(parents=True)
    (a / "SHA256").write_text(f"{hashlib.sha256(data).hexdigest()}  draft.tar\n")
    (a / "COUNT").write_text("2\n")
    (a / "draft.tar.part-0").write_bytes(data[:4096])
    (b / "draft.tar.part-1").write_bytes(data[4096:])
    (prompts / "test.jsonl").write_text('{"id": "a"}\n')


def ran(tmp_path) -> list[str]:
    """The benches the stand-in ran, by their --out name."""
    return [Path(r[r.index("--out") + 1]).stem for r in logged(tmp_path) if isinstance(r, list)]


def no_setup(call):
    return True  # the set-up: tested in test_gpu_call


def test_parts_over_two_calls_then_the_benches_in_order_skipping_the_existing(call, tmp_path, capsys):
    carried_draft(call.repo)
    later = call.repo / "later"  # the second call's carry
    (call.repo / ".device/draft-b").rename(later)
    knobs = Knobs.from_env({"SAMPLES": "8"})
    assert gpu_draft_bench.run(call, knobs, setup=no_setup) == AGAIN  # the first call: draft-a only
    out = capsys.readouterr().out
    assert "stashed COUNT SHA256 draft.tar.part-0 from .device/draft-a" in out
    assert "NOT DONE YET: 1 of 2 draft parts, prompts: test.jsonl" in out and not logged(tmp_path)
    for folder in ("draft-a", "prompts"):
        shutil.rmtree(call.repo / ".device" / folder)
    later.rename(call.repo / ".device/draft-b")
    (call.out / "bf16_chain_blend_nopad.json").write_text("[]")  # measured by an earlier call
    assert gpu_draft_bench.run(call, knobs, setup=no_setup) == DONE
    out = capsys.readouterr().out
    assert (call.dl / "draft/eagle3/model.safetensors").read_bytes() == b"w" * 5000
    assert ran(tmp_path) == ["bf16_chain_blend", "bf16_chain_humaneval", "fp32_chain_blend"]
    first, humaneval = logged(tmp_path)[0], logged(tmp_path)[1]
    assert first[first.index("--samples") + 1] == "8" and first[first.index("--draft") + 1].endswith("draft/eagle3")
    assert first[-4:] == ["--dtype", "bfloat16", "--steps", "3,4,5,6,7"]
    assert humaneval[humaneval.index("--eval-set") + 1].endswith("prompts/test.jsonl") and humaneval[-1] == "humaneval"
    assert "it/s]" not in out and "measured" in out and "bench fp32_chain_blend: exit 0" in out
    assert "DONE: 4 result files" in out
    assert gpu_draft_bench.run(call, knobs, setup=no_setup) == DONE  # all there: nothing runs again
    assert len(ran(tmp_path)) == 3


def test_a_damaged_part_fails_in_one_line_naming_the_files(call, capsys):
    carried_draft(call.repo)
    part = call.repo / ".device/draft-b/draft.tar.part-1"
    part.write_bytes(b"x" + part.read_bytes()[1:])
    assert gpu_draft_bench.run(call, Knobs.from_env({}), setup=no_setup) == FAILED
    failed = [line for line in capsys.readouterr().out.splitlines() if "FAILED" in line]
    assert len(failed) == 1 and "draft.tar" in failed[0] and "draft-parts/SHA256" in failed[0], failed
    assert not (call.dl / "draft").exists()


def test_missing_parts_and_a_failed_set_up(call, capsys):
    assert gpu_draft_bench.run(call, Knobs.from_env({}), setup=no_setup) == AGAIN
    assert "NOT DONE YET: 0 of 0 draft parts, prompts: . NEXT: bench_draft.sh" in capsys.readouterr().out
    assert gpu_draft_bench.run(call, Knobs.from_env({}), setup=lambda c: False) == FAILED


def test_the_list_stops_when_too_little_time_is_left(call, tmp_path, monkeypatch, capsys):
    carried_draft(call.repo)
    monkeypatch.setenv("FAKE_SLEEP", "8")
    call.deadline = int(time.time()) + 66  # the first bench starts with >= 60 s left and ends with less
    assert gpu_draft_bench.run(call, Knobs.from_env({"MIN_LEFT": "60"}), setup=no_setup) == AGAIN
    out = capsys.readouterr().out
    assert ran(tmp_path) == ["bf16_chain_blend"]
    assert "bf16_chain_blend_nopad: skipped" in out and "fp32_chain_blend: skipped" in out
    assert "NOT DONE YET: 1 result files" in out


def test_bench_runs_one_of_your_own(call, tmp_path):
    carried_draft(call.repo)
    knobs = Knobs.from_env({"BENCH": "again  --dtype float16 --steps 2"})
    assert gpu_draft_bench.run(call, knobs, setup=no_setup) == DONE
    assert ran(tmp_path) == ["again"] and logged(tmp_path)[0][-4:] == ["--dtype", "float16", "--steps", "2"]


def test_trace_setup_runs_both_archs_at_once_and_samples_top(call, tmp_path, capsys):
    call.out.mkdir(parents=True)
    assert gpu_bench.trace_setup(call, limit=30, top_every=0.3, setup=no_setup) == 0
    runs = logged(tmp_path)
    assert sorted(r["argv"][2] for r in runs) == ["eagle1", "eagle3"]
    assert max(r["t0"] for r in runs) < min(r["t1"] for r in runs)  # side by side
    assert runs[0]["argv"][1] == str(call.run)
    for arch in ("eagle3", "eagle1"):
        assert (call.out / f"setup_{arch}.txt").read_text() == "cumulative table\n"
        assert "step 1" in (call.out / f"setup_{arch}.log").read_text()
    out = capsys.readouterr().out
    assert "eagle3: set-up 1.0 s" in out and "eagle1: exit 0" in out and "step 1" not in out
    assert (call.out / "top.log").read_text().count("\n") > 1


def test_trace_setup_stops_each_arch_at_its_limit(call, capsys):
    call.out.mkdir(parents=True)
    t0 = time.time()
    assert gpu_bench.trace_setup(call, limit=0.5, top_every=30, setup=no_setup) == 0
    assert time.time() - t0 < 15 and "eagle3: exit 124" in capsys.readouterr().out


@pytest.mark.skipif(
    any((ROOT / ".device").glob("draft-*")) or (ROOT / ".device/prompts").is_dir(),
    reason="this checkout holds carried draft parts: the call would stash and bench them",
)
def test_bench_draft_sh_without_parts_asks_for_another_call(tmp_path):
    (tmp_path / "dl").mkdir()
    (tmp_path / "dl/model.gguf").symlink_to(embedded_gguf())
    (tmp_path / "dl/model.gguf.ok").write_text("")
    (tmp_path / "dl/cache").symlink_to(cache_dir())
    out = bash("bash ops/gpu/bench_draft.sh; echo rc=$?", tmp_path)
    log = out.stdout + out.stderr
    assert "NOT DONE YET: 0 of 0 draft parts" in log and "rc=3" in log, log
    assert "FAILED" not in log


def test_gpu_step_dispatches_both_commands_with_their_knobs(monkeypatch):
    seen = {}
    monkeypatch.setattr(Call, "enter", lambda self: self)  # no chdir, no environment of a call
    monkeypatch.setattr(gpu_bench, "trace_setup", lambda c, limit: seen.update(limit=limit) or 0)
    monkeypatch.setattr(gpu_draft_bench, "run", lambda c: AGAIN)
    monkeypatch.setenv("LIMIT", "12")
    assert gpu_step.main(["trace-setup"]) == 0 and seen == {"limit": 12}
    assert gpu_step.main(["trace-setup", "--limit", "5"]) == 0 and seen == {"limit": 5}
    assert gpu_step.main(["draft-benches"]) == AGAIN
