"""recipes.sh's phases (draftlab.run.gpu_recipes) on CPU with real processes: the speed check's rate,
the study's data from the tracked .xz files, the speed phase with an interpreter stand-in answering the
GPU-only commands (`draftlab train --device cuda`, the tokeniser profile), the train phase with the tiny
target cut at its deadline and resumed, what comes back, and recipes.sh's exit codes through the wrapper."""

import csv
import io
import json
import lzma
import tarfile
import time
from pathlib import Path

import pytest
from tests.test_recipes import SMOKE
from tests.test_train import write_fixture

from draftlab.run import gpu_recipes
from draftlab.run.gpu_call import Call
from draftlab.run.gpu_recipes import AGAIN, DONE, Knobs
from test_gpu_sglang import HOLDS_CARGO, logged, stand_in_python, wrapper_stash_log

ROOT = Path(__file__).resolve().parents[1]

# answers `-m draftlab.cli train` (the speed check: a train.csv of four logged rows) and the tokeniser
# profile, logging argv (and PYTHONPATH)
FAKE_PYTHON = r'''
import csv
if argv[:3] == ["-m", "draftlab.cli", "train"]:
    log({"argv": argv[3:], "pythonpath": os.environ.get("PYTHONPATH", "")})
    out = Path(argv[argv.index("--out-dir") + 1])
    out.mkdir(parents=True)
    with open(out / "train.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["step", "loss", "tokens_per_s", "elapsed_s"])
        for i in range(1, 5):
            w.writerow([10 * i, 1.0, 100.0 * i, float(i)])
    print("step 40 loss 1.0\r", flush=True)
    sys.exit(0)
if argv[:1] and argv[0].endswith("tokenize_profile.py"):
    log({"argv": argv})
    print("tokenising: 10 conv/s]\nrows 300 in 1.0 s\n" + "".join(f"line {i}\n" for i in range(50)), end="")
    sys.exit(0)
'''


@pytest.fixture
def call(tmp_path, monkeypatch):
    fake = stand_in_python(tmp_path, monkeypatch, FAKE_PYTHON)
    monkeypatch.setattr(gpu_recipes.gpu_call, "ensure_all", lambda c: True)  # the set-up: tested in test_gpu_call
    now = int(time.time())
    c = Call(out=tmp_path / "out", dl=tmp_path / "dl", site=tmp_path / "site", scratch=tmp_path / "scratch",
             t0=now, deadline=now + 600, repo=ROOT, python=fake)
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


def test_rate_after_warmup_is_the_rate_between_the_first_and_last_logged_rows(tmp_path):
    rows = [{"step": "10", "tokens_per_s": "100", "elapsed_s": "1"}, {"step": "20", "tokens_per_s": "150",
            "elapsed_s": "2"}, {"step": "30", "tokens_per_s": "200", "elapsed_s": "3"}]
    # 200 tok/s * 3 s - 100 tok/s * 1 s = 500 tokens in the 2 s after the first window
    assert gpu_recipes.rate_after_warmup(rows) == {"steps": 30, "tok_s_after_warmup": 250.0, "tok_s_cumulative": 200.0}
    assert gpu_recipes.rate_after_warmup(rows[:2]) is None
    reference = list(csv.DictReader(open(ROOT / "results/reference/train/train.csv")))
    rate = gpu_recipes.rate_after_warmup(reference)
    assert rate["steps"] == int(reference[-1]["step"]) and rate["tok_s_after_warmup"] > 0


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


def test_speed_phase_profiles_checks_each_objective_once_and_packs(call, tmp_path, capsys):
    staged_small(call, tmp_path)
    k = knobs(call, tmp_path, SPEED_STEPS=40, SPEED_SAMPLES=1500, SPEED_VARIANTS="new old new_keep_head")
    assert gpu_recipes.run_phase(call, "speed", k) == DONE
    runs = logged(tmp_path)
    profiles, trains = runs[:2], runs[2:]
    assert profiles[1]["argv"][-2:] == ["embedded", "cuda"] and profiles[0]["argv"][-1] == "300"
    profile = (call.out / "tokenize_profile.txt").read_text()
    assert "conv/s]" not in profile and "line 49" in profile
    assert (call.out / "tokenize_profile_after_target.txt").is_file()
    shown = capsys.readouterr().out
    assert "line 38\n" in shown and "line 39\n" not in shown  # the first 40 lines of the first profile in the log
    assert [r["pythonpath"].split(":")[0] for r in trains] == [str(ROOT / "lib"), str(ROOT / ".device/oldlib/lib"),
                                                                str(ROOT / "lib")]
    first = trains[0]["argv"]
    assert first[first.index("--stop-after") + 1] == "40" and first[first.index("--max-train-samples") + 1] == "1500"
    assert "--recompute-head" not in first and trains[2]["argv"][-2:] == ["--recompute-head", "false"]
    assert "speed new: exit 0 step 40 loss 1.0" in shown
    res = json.loads((call.out / "speed.json").read_text())
    assert set(res) == {"old", "new", "new_keep_head", "note"}
    assert res["new"] == {"steps": 40, "tok_s_after_warmup": (1600 - 100) / 3, "tok_s_cumulative": 400.0}
    assert json.loads((gpu_recipes.study_dir(call) / "speed.json").read_text()) == res
    assert "recipes/speed.json" in packed(call) and "recipes/speed/new/train.csv" in packed(call)
    assert not [n for n in packed(call) if "/data" in n or n.endswith(".safetensors")]
    gpu_recipes.speed_check(call, k)  # once per machine
    assert len(logged(tmp_path)) == len(runs)


def test_train_phase_is_cut_at_the_deadline_then_resumed(call, tmp_path, capsys):
    """The tiny target on CPU: exit 3 when the deadline cuts the row, 0 when the next call finishes it."""
    staged_small(call, tmp_path)
    k = knobs(call, tmp_path, ROWS="hardce", PARALLEL=1, SPEED_VARIANTS="new", RECIPES_TARGET="tiny",
              TRAIN_SET=" ".join(f"--set {key} {value}" for key, value in SMOKE.items()), SEND_DRAFTS="hardce")
    call.deadline = int(time.time()) + 18  # `recipes train` stops its rows 15 s before: 2-3 s, too short for one
    assert gpu_recipes.run_phase(call, "train", k) == AGAIN
    study = gpu_recipes.study_dir(call)
    assert json.loads((study / "train_status.json").read_text()) == {"hardce": "cut"}
    assert not list(call.out.glob("draft-*")) and "SEND_DRAFTS: hardce has no trained draft" in capsys.readouterr().out
    assert (study / "hardce/tokens").resolve() == (study / "speed/tokens").resolve()
    call.deadline = int(time.time()) + 600
    assert gpu_recipes.run_phase(call, "train", k) == DONE, (study / "hardce/train.log").read_text()[-2000:]
    assert json.loads((study / "train_status.json").read_text()) == {"hardce": "done"}
    assert (study / "hardce/draft/model.safetensors").is_file()
    # the speed check: cut with the first call (its 30 s margin), measured by the second, with the target
    assert {r["argv"][r["argv"].index("--target") + 1] for r in logged(tmp_path)} == {"tiny"}
    assert "new" in json.loads((study / "speed.json").read_text())
    assert list((study / "speed/tokens").iterdir())  # the rows' tokens went to the shared cache
    names = packed(call)
    parts = sorted(call.out.glob("draft-hardce.tar.part-*"))  # the trained draft, sent back whole (SEND_DRAFTS)
    with tarfile.open(fileobj=io.BytesIO(b"".join(p.read_bytes() for p in parts))) as tar:
        assert tar.extractfile("hardce/draft/model.safetensors").read() == \
            (study / "hardce/draft/model.safetensors").read_bytes()
    assert "recipes/hardce/train.log" in names and "recipes/train_status.json" in names
    assert "recipes/hardce/draft/config.json" in names and "recipes/base/train/summary.json" in names
    assert not [n for n in names if n.endswith(".safetensors") or "ckpt-" in n or "/data" in n
                or Path(n).name in ("tokens", "tb")], names


def test_too_little_time_to_train_asks_for_another_call(call, tmp_path):
    staged_small(call, tmp_path)
    (gpu_recipes.study_dir(call) / "speed.json").write_text(json.dumps({"new": {"tok_s_after_warmup": 1.0}}))
    call.deadline = int(time.time()) + 10
    assert gpu_recipes.run_phase(call, "train", knobs(call, tmp_path, ROWS="hardce")) == AGAIN
    assert not logged(tmp_path) and (call.out / "recipes.tar.gz").is_file()


@HOLDS_CARGO
def test_recipes_sh_phases_exit_codes(tmp_path):
    assert "phase stash" in wrapper_stash_log("recipes.sh", tmp_path)
    assert (tmp_path / "dl/recipes/data").is_dir()


def test_an_unknown_speed_variant_is_named(call):
    with pytest.raises(ValueError, match=r"SPEED_VARIANTS: unknown \['fast'\]; known: old, new, new_keep_head"):
        Knobs.from_env(call, {"SPEED_VARIANTS": "new fast"})
    assert Knobs.from_env(call, {"SPEED_VARIANTS": "new_compiled old"}).speed_variants == ["new_compiled", "old"]
