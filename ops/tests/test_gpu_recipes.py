"""recipes.sh's phases (ops.gpu_recipes) on CPU with real processes: the speed check's rate,
the study's data from the tracked .xz files, the speed phase with an interpreter stand-in answering the
GPU-only commands (`draftlab train --device cuda`, the tokeniser profile), the train phase with the tiny
target cut at its deadline and resumed, what comes back, and recipes.sh's exit codes through the wrapper."""

import io
import json
import lzma
import shutil
import tarfile
import time
from pathlib import Path

import pytest
from test_gpu_sglang import HOLDS_CARGO, logged, stand_in_python, wrapper_stash_log

from ops import gpu_recipes
from ops import gpu_recipes_regen as regen_sets
from ops.gpu_call import Call
from ops.gpu_recipes import AGAIN, DONE, FAILED, Knobs
from studies.recipes.rows import GROWN_TRAIN_FILES
from studies.tests.test_recipes import SMOKE
from tests.test_train import write_fixture

ROOT = Path(__file__).resolve().parents[2]

# answers `-m studies.recipes speed` (the speed check: a speed.json with one rate) and the tokeniser
# profile, logging argv
FAKE_PYTHON = r"""
if argv[:3] == ["-m", "studies.recipes", "measure"]:
    log({"argv": argv[3:]})
    sys.exit(0)
if argv[:3] == ["-m", "studies.recipes", "speed"]:
    log({"argv": argv[3:]})
    out = Path(argv[argv.index("--out") + 1])
    (out / "speed.json").write_text(json.dumps({"eager": {"steps": 30, "tok_s_after_warmup": 5.0}, "note": "-"}))
    sys.exit(0)
if argv[:3] == ["-m", "draftlab.cli", "regenerate"]:  # LIMIT answered rows, or the whole call's time
    log({"argv": argv[3:]})
    if os.environ.get("FAKE_REGEN_SLOW"):
        time.sleep(120)
    rows = [{"id": f"x{i}", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
            for i in range(int(argv[argv.index("--limit") + 1]))]
    Path(argv[argv.index("--output") + 1]).write_text("".join(json.dumps(r) + "\n" for r in rows))
    sys.exit(0)
if argv[:3] == ["-m", "studies.recipes", "broad-prompts"]:  # N prompts, as `recipes broad-prompts` writes them
    log({"argv": argv[3:]})
    rows = [{"id": f"b{i}", "messages": [{"role": "user", "content": f"q{i}"}], "meta": {"kind": "chat"}}
            for i in range(int(argv[argv.index("--n") + 1]))]
    import lzma
    with lzma.open(argv[argv.index("--out") + 1], "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
    sys.exit(0)
if argv[:4] == ["-m", "draftlab.cli", "bench", "sglang"]:  # a suite study: each server's per-set table
    log({"argv": argv[4:]})
    if os.environ.get("FAKE_SUITE_CUT"):
        time.sleep(120)
    out = Path(argv[argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    draft = Path(argv[argv.index("--draft") + 1]).parent.name
    sets = {"humaneval": {"kind": "code", "n": 4, "acceptance": 3.0 if draft == "best-broad" else 2.0}}
    (out / "eval_suite.json").write_text(json.dumps({"baseline": {"sets": sets, "mean_general": None},
                                                      "chain6": {"sets": sets, "mean_general": 2.5}}))
    sys.exit(0)
if argv[:1] and argv[0].endswith("tokenize_profile.py"):
    log({"argv": argv})
    print("tokenising: 10 conv/s]\nrows 300 in 1.0 s\n" + "".join(f"line {i}\n" for i in range(50)), end="")
    sys.exit(0)
"""


@pytest.fixture
def call(tmp_path, monkeypatch):
    fake = stand_in_python(tmp_path, monkeypatch, FAKE_PYTHON)
    monkeypatch.setattr(gpu_recipes.gpu_call, "ensure_all", lambda c: True)  # the set-up: tested in test_gpu_call
    # the repo's tracked answers (2026-12-02) would skip the regeneration these tests drive; one test uses them
    for name in regen_sets.SETS:
        monkeypatch.setitem(regen_sets.REGENERATED, name, str(tmp_path / f"no-tracked-{name}.jsonl.xz"))
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
    c.out.mkdir(parents=True)
    return c


def published_draft(tmp_path) -> Path:
    draft = tmp_path / "published"
    draft.mkdir()
    (draft / "model.safetensors").write_bytes(b"w" * 10)
    (draft / "config.json").write_text("{}")
    return draft


def knobs(call, tmp_path, **env) -> Knobs:
    k = Knobs.from_env(call, env={k: str(v) for k, v in env.items()})
    k.base_draft = published_draft(tmp_path)
    return k


def staged_small(call, tmp_path) -> None:
    """The study's data as stage_data leaves it, small: the tiny target's conversations."""
    train, val = write_fixture(tmp_path / "regen", n_train=32, n_val=4)
    data = gpu_recipes.data_dir(call)
    data.mkdir(parents=True)
    for name, src in (("train", train), ("val", val), ("test", val)):
        (data / f"{name}.jsonl").write_bytes(src.read_bytes())


def packed(call) -> list[str]:
    with tarfile.open(call.out / "recipes.tar.gz") as tar:
        return tar.getnames()


def test_stage_data_unpacks_the_tracked_splits_and_the_published_draft_once(call, tmp_path):
    k = knobs(call, tmp_path)
    assert gpu_recipes.stage_data(call, k)
    data, base = gpu_recipes.data_dir(call), gpu_recipes.study_dir(call) / "base"
    for name, xz in (("train", "regen/train"), ("val", "regen/val"), ("test", "blend/test")):
        with lzma.open(ROOT / f"results/reference/data/{xz}.jsonl.xz") as f:
            assert (data / f"{name}.jsonl").read_bytes() == f.read()
    assert (base / "draft/model.safetensors").read_bytes() == b"w" * 10
    assert (base / "train/summary.json").read_bytes() == (ROOT / "results/reference/train/summary.json").read_bytes()
    assert not list(data.glob("*.tmp"))
    (data / "val.jsonl").write_text('{"kept": 1}\n')
    (base / "draft/model.safetensors").write_bytes(b"trained")
    assert gpu_recipes.stage_data(call, k)  # a later call keeps what is there
    assert (data / "val.jsonl").read_text() == '{"kept": 1}\n'
    assert (base / "draft/model.safetensors").read_bytes() == b"trained"
    k.base_draft = tmp_path / "missing"
    (base / "draft/model.safetensors").unlink()
    assert not gpu_recipes.stage_data(call, k)


def test_the_tracked_answers_give_the_data_volume_rows_their_train_files_without_regenerating(
    call, tmp_path, monkeypatch
):
    monkeypatch.setitem(regen_sets.REGENERATED, "extra", "results/recipes/data/extra-regen.jsonl.xz")
    staged_small(call, tmp_path)
    monkeypatch.setattr(gpu_recipes.gpu_sglang, "install_sglang", lambda c: True)
    assert gpu_recipes.run_phase(call, "regen", knobs(call, tmp_path, ROWS="data2x")) == DONE
    assert not logged(tmp_path)  # nothing regenerated: the 21,612 answers came from the repo
    data = gpu_recipes.data_dir(call)
    with lzma.open(ROOT / regen_sets.REGENERATED["extra"]) as f:
        assert (data / "extra-regen.jsonl").read_bytes() == f.read()
    assert len((data / "train-data2x.jsonl").read_text().splitlines()) == 32 + 21612


def test_published_rows_are_staged_as_trained_from_their_carried_drafts(call, tmp_path):
    k = knobs(call, tmp_path, PUBLISHED="fcnorm")
    k.carried_drafts = tmp_path / "carried"
    assert not gpu_recipes.stage_data(call, k)  # asked for, not carried: fails
    shutil.copytree(k.base_draft, k.carried_drafts / "fcnorm")
    assert gpu_recipes.stage_data(call, k)
    staged = gpu_recipes.study_dir(call) / "fcnorm"
    assert (staged / "draft/model.safetensors").read_bytes() == b"w" * 10
    run = ROOT / gpu_recipes.PUBLISHED_RUNS["fcnorm"]
    assert (staged / "train/summary.json").read_bytes() == (run / "train/summary.json").read_bytes()
    for row, published in gpu_recipes.PUBLISHED_RUNS.items():  # ops/gpu/published_draft.sh restores them
        assert {"eagle3.commit", "eagle3.sha256"} <= {p.name for p in (ROOT / published / "draft").iterdir()}
        summary = json.loads((ROOT / published / "train/summary.json").read_text())
        # finished, or declared cut: then its summary says so
        assert summary["finished"] == (row not in gpu_recipes.PUBLISHED_UNFINISHED), row
        assert summary["steps"] <= summary["total_steps"]
    k.published = ["nope"]
    assert not gpu_recipes.stage_data(call, k)


def test_speed_phase_profiles_checks_the_speed_once_and_packs(call, tmp_path, capsys):
    staged_small(call, tmp_path)
    k = knobs(call, tmp_path, SPEED_STEPS=40, SPEED_SAMPLES=1500, SPEED_VARIANTS="eager keep_head")
    assert gpu_recipes.run_phase(call, "speed", k) == DONE
    runs = logged(tmp_path)
    (profile_a, profile_b, speed), study = runs, gpu_recipes.study_dir(call)
    assert profile_b["argv"][-2:] == ["embedded", "cuda"] and profile_a["argv"][-1] == "300"
    profile = (call.out / "tokenize_profile.txt").read_text()
    assert "conv/s]" not in profile and "line 49" in profile
    assert (call.out / "tokenize_profile_after_target.txt").is_file()
    shown = capsys.readouterr().out
    assert "line 38\n" in shown and "line 39\n" not in shown  # the first 40 lines of the first profile in the log
    argv = speed["argv"]
    for flag, value in (
        ("--variants", "eager,keep_head"),
        ("--steps", "40"),
        ("--samples", "1500"),
        ("--out", str(study)),
        ("--target", "embedded"),
    ):
        assert argv[argv.index(flag) + 1] == value
    assert argv[-3:] == ["--set", "device", "cuda"] and "speed check: exit 0" in shown
    assert json.loads((call.out / "speed.json").read_text())["eager"]["tok_s_after_warmup"] == 5.0
    assert "recipes/speed.json" in packed(call)
    assert not [n for n in packed(call) if "/data" in n or n.endswith(".safetensors")]
    gpu_recipes.speed_check(call, k)  # once per machine
    assert len(logged(tmp_path)) == len(runs)


def test_speed_variants_none_skips_the_speed_check(call, tmp_path, capsys):
    k = knobs(call, tmp_path, SPEED_VARIANTS="none")
    assert k.speed_variants == []
    gpu_recipes.speed_check(call, k)
    assert not logged(tmp_path) and "SPEED_VARIANTS=none" in capsys.readouterr().out


def test_train_phase_is_cut_at_the_deadline_then_resumed(call, tmp_path):
    """The tiny target on CPU: exit 3 when the deadline's SIGTERM cuts the row, 0 when the next call finishes it."""
    staged_small(call, tmp_path)
    k = knobs(
        call,
        tmp_path,
        ROWS="hardce",
        PARALLEL=1,
        SPEED_VARIANTS="eager",
        RECIPES_TARGET="tiny",
        # 20 epochs: a row takes well over the 15 s the first call leaves it, even on a fast CPU
        TRAIN_SET=" ".join(f"--set {key} {value}" for key, value in {**SMOKE, "epochs": 20.0}.items()),
    )  # SEND_DRAFTS unset: the call that finishes a row sends its draft back
    # SIGTERM to the study 15 s before the deadline: ~15 s, too short for a row; it checkpoints what it has
    call.deadline = int(time.time()) + 30
    assert gpu_recipes.run_phase(call, "train", k) == AGAIN
    study = gpu_recipes.study_dir(call)
    assert json.loads((study / "train_status.json").read_text()) == {"hardce": "cut"}
    assert not list(call.out.glob("draft-*"))
    call.deadline = int(time.time()) + 600
    assert gpu_recipes.run_phase(call, "train", k) == DONE, (study / "hardce/train.log").read_text()[-2000:]
    assert json.loads((study / "train_status.json").read_text()) == {"hardce": "done"}
    assert (study / "hardce/draft/model.safetensors").is_file()
    # the speed check: skipped by the first call (too close to its deadline), run by the second, with the target
    assert [r["argv"][r["argv"].index("--target") + 1] for r in logged(tmp_path)] == ["tiny"]
    assert list((study / "tokens").iterdir()) and not (study / "hardce/tokens").exists()  # the rows' shared cache
    names = packed(call)
    parts = sorted(call.out.glob("draft-hardce.tar.part-*"))  # the trained draft, sent back whole
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
        assert (
            tar.extractfile("hardce/draft/model.safetensors").read()
            == (study / "hardce/draft/model.safetensors").read_bytes()
        )
    assert "recipes/hardce/train.log" in names and "recipes/train_status.json" in names
    assert "recipes/hardce/draft/config.json" in names and "recipes/base/train/summary.json" in names
    assert not [
        n
        for n in names
        if n.endswith(".safetensors") or "ckpt-" in n or "/data" in n or Path(n).name in ("tokens", "tb")
    ], names


def test_drafts_sent_back_by_default_are_the_rows_the_call_finished(call, tmp_path, capsys):
    """SEND_DRAFTS unset: the finished rows, at most MAX_DRAFTS_SENT (the rest named); none: nothing; a list: it."""
    study = gpu_recipes.study_dir(call)
    for row in ("a", "b", "c"):
        (study / row / "draft").mkdir(parents=True)
        (study / row / "draft/model.safetensors").write_bytes(row.encode() * 10)

    def sent(finished, **env):
        for part in call.out.glob("draft-*"):
            part.unlink()
        gpu_recipes.pack(call, Knobs.from_env(call, env=env), tuple(finished))
        return sorted({p.name.split(".tar")[0] for p in call.out.glob("draft-*")})

    assert gpu_recipes.MAX_DRAFTS_SENT == 2
    assert sent(["a", "b", "c"]) == ["draft-a", "draft-b"] and "not sent (at most 2 drafts a call): c" in (
        capsys.readouterr().out
    )
    assert sent([]) == [] and sent(["a"], SEND_DRAFTS="none") == []
    assert sent(["a"], SEND_DRAFTS="c") == ["draft-c"]


def test_train_phase_skips_the_speed_check_when_every_row_is_trained(call, tmp_path, monkeypatch, capsys):
    """A `PHASE="train measure"` call after the last training call goes straight to the measure."""
    staged_small(call, tmp_path)
    study = gpu_recipes.study_dir(call)
    (study / "train_status.json").write_text(json.dumps({"hardce": "done", "ttt3": "cut"}))
    monkeypatch.setattr(gpu_recipes, "train_rows", lambda c, k: DONE)
    k = knobs(call, tmp_path, ROWS="hardce", SPEED_VARIANTS="eager")
    assert gpu_recipes.run_phase(call, "train", k) == DONE
    assert not logged(tmp_path) and "speed check skipped" in capsys.readouterr().out
    k.rows = ["hardce", "ttt3"]
    assert gpu_recipes.run_phase(call, "train", k) == DONE
    assert len(logged(tmp_path)) == 1  # a row still to train: the speed check runs


def test_too_little_time_to_train_asks_for_another_call(call, tmp_path):
    staged_small(call, tmp_path)
    (gpu_recipes.study_dir(call) / "speed.json").write_text(json.dumps({"new": {"tok_s_after_warmup": 1.0}}))
    call.deadline = int(time.time()) + 10
    assert gpu_recipes.run_phase(call, "train", knobs(call, tmp_path, ROWS="hardce")) == AGAIN
    assert not logged(tmp_path) and (call.out / "recipes.tar.gz").is_file()


def test_measure_phase_measures_base_and_the_rows_with_the_knobs(call, tmp_path, monkeypatch):
    staged_small(call, tmp_path)
    monkeypatch.setattr(gpu_recipes.gpu_sglang, "install_sglang", lambda c: True)  # tested in test_gpu_sglang
    k = knobs(
        call,
        tmp_path,
        ROWS="fcnorm,eagle1",
        CHAIN="1,2,3",
        SAMPLES=8,
        HUMANEVAL=4,
        SEND_DRAFTS="fcnorm",
        CONCURRENCY="1,16",
        REPEATS=3,
        SERVER_FLAGS="--sleep-on-idle",
        MULTI_TURN=16,
    )
    assert gpu_recipes.run_phase(call, "measure", k) == DONE
    (run,) = logged(tmp_path)
    argv = run["argv"]
    for flag, value in (
        ("--rows", "base,fcnorm,eagle1"),
        ("--chain", "1,2,3"),
        ("--samples", "8"),
        ("--concurrency", "1,16"),
        ("--repeats", "3"),
        ("--humaneval", "4"),
        ("--multi-turn", str(ROOT / gpu_recipes.MULTI_TURN_HELD_OUT)),
        ("--multi-turn-samples", "16"),
        ("--out", str(gpu_recipes.study_dir(call))),
        ("--held-out", str(gpu_recipes.data_dir(call) / "test.jsonl")),
    ):
        assert argv[argv.index(flag) + 1] == value
    assert "--server-flags=--sleep-on-idle" in argv
    assert (call.out / "recipes.tar.gz").is_file() and not list(call.out.glob("draft-*"))  # fcnorm: not trained


def test_regen_phase_regenerates_the_extra_prompts_sends_them_back_and_grows_the_rows_train_files(
    call, tmp_path, monkeypatch, capsys
):
    staged_small(call, tmp_path)
    monkeypatch.setattr(gpu_recipes.gpu_sglang, "install_sglang", lambda c: True)  # tested in test_gpu_sglang
    k = knobs(call, tmp_path, ROWS="data2x,fcnorm", REGEN_SERVERS=3, REGEN_CONCURRENCY=256)
    monkeypatch.setenv("FAKE_REGEN_SLOW", "1")
    call.deadline = int(time.time()) + 33  # the regeneration stops 30 s before: cut
    assert gpu_recipes.run_phase(call, "regen", k) == AGAIN
    assert not (call.out / "extra-regen.jsonl.xz").exists() and "regeneration: exit 124" in capsys.readouterr().out
    monkeypatch.delenv("FAKE_REGEN_SLOW")
    data = gpu_recipes.data_dir(call)
    (data / "extra-work" / "shards").mkdir(parents=True)  # as a cut `draftlab regenerate` leaves it
    (data / "extra-work" / "shards" / "part-00000.jsonl").write_text('{"id": "x0"}\n')
    (data / "extra-work" / "sglang-0.log").write_text("server log")
    call.deadline = int(time.time()) + 33
    monkeypatch.setenv("FAKE_REGEN_SLOW", "1")
    assert gpu_recipes.run_phase(call, "regen", k) == AGAIN  # cut again: its work folder comes back
    with tarfile.open(call.out / "extra-work.tar.gz") as tar:
        assert sorted(tar.getnames()) == ["extra-work", "extra-work/shards", "extra-work/shards/part-00000.jsonl"]
    monkeypatch.delenv("FAKE_REGEN_SLOW")
    shutil.rmtree(data / "extra-work")  # a cold machine: the carried work folder resumes
    monkeypatch.setattr(regen_sets, "partial", lambda name: str(call.out / f"{name}-work.tar.gz"))
    call.deadline = int(time.time()) + 600
    assert gpu_recipes.run_phase(call, "regen", k) == DONE
    assert (data / "extra-work/shards/part-00000.jsonl").is_file()
    assert "resuming the regeneration" in capsys.readouterr().out
    argv = logged(tmp_path)[-1]["argv"]
    for flag, value in (
        ("--limit", "21612"),
        ("--sglang-servers", "3"),
        ("--concurrency", "256"),
        ("--max-tokens", "256"),
        ("--temperature", "0"),
        ("--truncation", "keep_flag"),
        ("--output", str(data / "extra-regen.jsonl")),
        ("--serve", str(call.model_dir)),
    ):
        assert argv[argv.index(flag) + 1] == value
    assert argv[0] == str(ROOT / regen_sets.EXTRA_PROMPTS) and argv[1] == str(data / "extra-work")
    with lzma.open(call.out / "extra-regen.jsonl.xz") as f:
        assert f.read() == (data / "extra-regen.jsonl").read_bytes()
    grown = (data / "train-data2x.jsonl").read_text().splitlines()
    assert len(grown) == 32 + 21612 and not (data / "train-fcnorm.jsonl").exists()
    children = []
    spawn = gpu_recipes.until
    monkeypatch.setattr(gpu_recipes, "until", lambda argv, *a, **kw: children.append(argv) or spawn(argv, *a, **kw))
    assert gpu_recipes.run_phase(call, "regen", k) == DONE  # done: nothing regenerated again
    assert len(logged(tmp_path)) == 3
    assert not any("grow" in map(str, argv) for argv in children)  # these rows' files are grown: no child
    k.rows = ["data2x", "best-data2x"]  # a row not seen yet: grow runs (a no-op: they share the file)
    assert gpu_recipes.stage_data(call, k)
    assert sum("grow" in map(str, argv) for argv in children) == 1
    assert json.loads((data / "grown-rows.json").read_text()) == {
        "rows": ["best-data2x", "data2x", "fcnorm"],
        "sets": ["extra"],
    }


def test_regen_phase_makes_the_multi_turn_prompts_regenerates_them_and_grows_only_their_rows(
    call, tmp_path, monkeypatch, capsys
):
    """REGEN_SET=multi-turn: the two-turn prompts made here from the tracked extra prompts (`recipes
    multi-turn`, for real), answered (the stand-in), sent back, and the rows drawing on that set grown; a row
    whose set is not here yet (data2x: extra) is left for later, not failed."""
    staged_small(call, tmp_path)
    monkeypatch.setattr(gpu_recipes.gpu_sglang, "install_sglang", lambda c: True)
    k = knobs(call, tmp_path, ROWS="data2x-mt,data2x", REGEN_SET="bogus")
    assert gpu_recipes.run_phase(call, "regen", k) == FAILED
    assert "REGEN_SET bogus: expected one of extra, multi-turn" in capsys.readouterr().out
    k.regen_set, k.regen_rows = "multi-turn", Knobs.from_env(call, env={"REGEN_SET": "multi-turn"}).regen_rows
    assert k.regen_rows == 10806  # the most studies.recipes.rows.GROWN_TRAIN_FILES takes from the set
    assert gpu_recipes.run_phase(call, "regen", k) == DONE
    data = gpu_recipes.data_dir(call)
    argv = logged(tmp_path)[-1]["argv"]
    assert argv[:2] == [str(data / "multi-turn-prompts.jsonl.xz"), str(data / "multi-turn-work")]
    assert argv[argv.index("--limit") + 1] == "10806"
    with lzma.open(data / "multi-turn-prompts.jsonl.xz", "rt") as f:
        first = json.loads(f.readline())
    assert [m["role"] for m in first["messages"]] == ["user", "assistant", "user"]
    with lzma.open(call.out / "multi-turn-regen.jsonl.xz") as f:
        assert f.read() == (data / "multi-turn-regen.jsonl").read_bytes()
    assert len((data / "train-mt.jsonl").read_text().splitlines()) == 32 + 10806
    assert not (data / "train-data2x.jsonl").exists()  # its set is not regenerated here: skipped, not failed
    assert json.loads((data / "grown-rows.json").read_text()) == {
        "rows": ["data2x", "data2x-mt"],
        "sets": ["multi-turn"],
    }
    takes = [part for parts in GROWN_TRAIN_FILES.values() for part in parts]
    for name, n in regen_sets.DEFAULT_ROWS.items():  # ops' own copy of the study rows' counts (broad: 2% more)
        most = max(count for set_name, count in takes if set_name == name)
        assert n == (most + most // 50 if name == "broad" else most)


def test_suite_phase_measures_every_draft_on_the_same_prompts_and_writes_the_summary(
    call, tmp_path, monkeypatch, capsys
):
    staged_small(call, tmp_path)
    monkeypatch.setattr(gpu_recipes.gpu_sglang, "install_sglang", lambda c: True)
    flags = "--sleep-on-idle"
    k = knobs(call, tmp_path, PUBLISHED="best-data2x", ROWS="best-broad", SUITE_SAMPLES=8, SERVER_FLAGS=flags)
    k.carried_drafts = tmp_path / "carried"
    shutil.copytree(k.base_draft, k.carried_drafts / "best-data2x")
    assert gpu_recipes.run_phase(call, "suite", k) == FAILED  # best-broad is not trained here
    assert "FAILED: suite: no draft here for best-broad" in capsys.readouterr().out
    study, data = gpu_recipes.study_dir(call), gpu_recipes.data_dir(call)
    shutil.copytree(k.base_draft, study / "best-broad" / "draft")
    (data / "train-broad.jsonl").write_text((data / "train.jsonl").read_text())
    monkeypatch.setenv("FAKE_SUITE_CUT", "1")
    call.deadline = int(time.time()) + 33
    assert gpu_recipes.run_phase(call, "suite", k) == AGAIN  # cut: the next call resumes the row's study
    monkeypatch.delenv("FAKE_SUITE_CUT")
    call.deadline = int(time.time()) + 600
    version = gpu_recipes.gpu_sglang.sglang_dir(call) / "version.txt"  # as install_sglang records it
    version.parent.mkdir(parents=True, exist_ok=True)
    version.write_text("0.5.17\n")
    assert gpu_recipes.run_phase(call, "suite", k) == DONE
    runs = [r["argv"] for r in logged(tmp_path)[-2:]]
    drafts = [str(study / row / "draft") for row in ("best-data2x", "best-broad")]
    assert [r[r.index("--draft") + 1] for r in runs] == drafts
    for argv in runs:  # the same prompts for both: every training file here
        assert [a for a in argv if a.startswith("--train-data=")] == [
            f"--train-data={data / 'train-broad.jsonl'}",
            f"--train-data={data / 'train.jsonl'}",
        ]
        for flag, value in (("--eval-set", "suite"), ("--samples", "8"), ("--chain", "6"), ("--concurrency", "1")):
            assert argv[argv.index(flag) + 1] == value
        assert "--server-flags=--sleep-on-idle" in argv
    summary = json.loads((study / "suite" / "summary.json").read_text())
    assert summary["decontaminated_against"] == ["train-broad.jsonl", "train.jsonl"]
    assert {row: d["sets"]["humaneval"]["acceptance"] for row, d in summary["drafts"].items()} == {
        "best-data2x": 2.0,
        "best-broad": 3.0,
    }
    assert summary["drafts"]["best-broad"]["server"] == "chain6" and "gpu" in summary
    assert summary["sglang_version"] == "0.5.17"
    with tarfile.open(call.out / "recipes.tar.gz") as tar:
        assert "recipes/suite/summary.json" in tar.getnames()


class FakeServers:
    """sglang.server.TargetServers' stand-in: records what it was asked for; FAIL makes its start fail."""

    asked, fail = [], False

    def __init__(self, model_path, count, log_dir, *, prefix=None, startup_timeout=600.0):
        FakeServers.asked.append({"model": model_path, "count": count, "prefix": prefix, "timeout": startup_timeout})
        self.urls, self.startup_s = [f"http://127.0.0.1:{30000 + i}" for i in range(count)], 1.0

    def __enter__(self):
        if FakeServers.fail:
            raise RuntimeError("SGLang server on port 30000 exited during startup (log tail: CUDA error)")
        return self

    def __exit__(self, *exc):
        pass


def test_regen_phase_has_the_target_write_the_broad_prompts_then_answers_them(call, tmp_path, monkeypatch, capsys):
    """REGEN_SET=broad: the prompts written through SGLang servers of the target (`recipes broad-prompts` over
    their URLs, the stand-in), answered, sent back; best-broad's file grows once both its sets are here."""
    staged_small(call, tmp_path)
    monkeypatch.setattr(gpu_recipes.gpu_sglang, "install_sglang", lambda c: True)
    monkeypatch.setattr(regen_sets, "TargetServers", FakeServers)
    FakeServers.asked, FakeServers.fail = [], True
    k = knobs(call, tmp_path, ROWS="best-broad", REGEN_SET="broad")
    assert k.regen_rows == 22044
    assert gpu_recipes.run_phase(call, "regen", k) == FAILED
    assert "FAILED: the servers for the broad prompts: SGLang server on port 30000 exited" in capsys.readouterr().out
    FakeServers.fail = False
    assert gpu_recipes.run_phase(call, "regen", k) == DONE
    data = gpu_recipes.data_dir(call)
    assert FakeServers.asked[-1]["count"] == regen_sets.BROAD_SERVERS == 2
    assert FakeServers.asked[-1]["prefix"] == str(call.sglang_prefix)
    written, answered = logged(tmp_path)[-2]["argv"], logged(tmp_path)[-1]["argv"]
    assert written[written.index("--n") + 1] == "22044" and written[written.index("--model") + 1] == str(call.model_dir)
    assert [a for a in written if a.startswith("--base-url=")] == [
        "--base-url=http://127.0.0.1:30000",
        "--base-url=http://127.0.0.1:30001",
    ]
    assert answered[:2] == [str(data / "broad-prompts.jsonl.xz"), str(data / "broad-work")]
    assert answered[answered.index("--limit") + 1] == "22044"
    with lzma.open(call.out / "broad-regen.jsonl.xz") as f:
        assert f.read() == (data / "broad-regen.jsonl").read_bytes()
    assert not (data / "train-broad.jsonl").exists()  # its other set (extra) is not here yet
    extra = [{"id": f"x{i}", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}
             for i in range(21612)]  # fmt: skip
    (data / "extra-regen.jsonl").write_text("".join(json.dumps(r) + "\n" for r in extra))
    assert gpu_recipes.stage_data(call, k)
    ids = [json.loads(line)["id"] for line in (data / "train-broad.jsonl").read_text().splitlines()]
    assert len(ids) == 32 + 21612 + 21612 and ids[32] == "x0" and ids[32 + 21612] == "x0"
    calls = len(logged(tmp_path))
    assert gpu_recipes.run_phase(call, "regen", k) == DONE and len(logged(tmp_path)) == calls  # nothing again


def test_one_call_runs_several_phases_in_order(call, tmp_path, monkeypatch, capsys):
    staged_small(call, tmp_path)
    monkeypatch.setattr(gpu_recipes.gpu_sglang, "install_sglang", lambda c: True)
    k = knobs(call, tmp_path, ROWS="data2x", REGEN_ROWS=5)
    assert gpu_recipes.run_phase(call, "stash bogus", k) == 2
    assert "unknown PHASE stash bogus: expected" in capsys.readouterr().out
    assert gpu_recipes.run_phase(call, "regen measure", k) == FAILED  # 5 answers: too few for data2x's 21,612
    assert [r["argv"][0] for r in logged(tmp_path)] == [str(ROOT / regen_sets.EXTRA_PROMPTS)]  # measure never ran
    k.rows = ["fcnorm"]  # a row that needs no extra data
    assert gpu_recipes.run_phase(call, "regen measure", k) == DONE
    assert logged(tmp_path)[-1]["argv"][:2] == ["--rows", "base,fcnorm"]


@HOLDS_CARGO
def test_recipes_sh_phases_exit_codes(tmp_path):
    assert "phase stash" in wrapper_stash_log("recipes.sh", tmp_path)
    assert (tmp_path / "dl/recipes/data").is_dir()
