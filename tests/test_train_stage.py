"""Notebook 04's orchestration (train_draft.stage) on the tiny target: inputs with and without a
val.jsonl, both drafts trained in turn and exported, and the fall-back when side-by-side fails."""

import shutil

import pytest

from draftlab.model.target import load_target
from draftlab.train_draft import stage
from test_train import write_fixture


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("run04")
    write_fixture(root / "data" / "regen")
    return root


def recipe(train_file, val_file):
    return dict(
        train_file=str(train_file),
        val_file=str(val_file),
        target="tiny",
        device="cpu",
        draft_vocab_size=256,
        epochs=1,
        batch_tokens=512,
        max_batch=8,
        ttt_steps=2,
        lr=3e-3,
        log_every=1,
        eval_every=100,
        save_every=100,
    )


def test_inputs_hold_out_rows_without_a_val_file(run_dir, tmp_path):
    regen = run_dir / "data" / "regen"
    assert stage.training_inputs(run_dir, 4, 0) == (regen / "train.jsonl", regen / "val.jsonl")
    other = tmp_path / "run"
    (other / "data" / "regen").mkdir(parents=True)
    shutil.copy(run_dir / "data/regen/train.jsonl", other / "data/regen/train.jsonl")
    train_file, val_file = stage.training_inputs(other, 4, 0)
    assert val_file.parent == other / "train" / "holdout" and len(val_file.read_text().splitlines()) == 4
    with pytest.raises(FileNotFoundError, match="run notebook 03_regenerate first"):
        stage.training_inputs(tmp_path / "empty", 4, 0)


def test_train_and_export_falls_back_when_side_by_side_fails(run_dir, monkeypatch):
    target = load_target("tiny", device="cpu")
    configs = stage.train_configs(run_dir, ["eagle3", "eagle1"], recipe(*stage.training_inputs(run_dir, 4, 0)))

    def broken(*args, **kwargs):
        raise RuntimeError("a child died")

    monkeypatch.setattr(stage, "train_side_by_side", broken)
    results, exports = stage.train_and_export(configs, target, run_dir, True, False, "float32")
    assert set(results) == {"eagle3", "eagle1"} and exports == {"eagle3": [], "eagle1": []}
    assert (run_dir / "drafts" / "eagle3" / "model.safetensors").is_file()
    table = stage.summary(results)
    assert table["eagle3"]["steps"] == results["eagle3"]["steps"] > 0
    m = stage.metrics(results, exports, run_dir, {"epochs": 1})
    assert m["eagle1"]["export_deviations"] == [] and m["eagle1"]["settings"] == {"epochs": 1}
