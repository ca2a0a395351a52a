"""`draftlab train` and `export` on bad input: one line on stderr naming the option or file, exit 2 (bad input)
or 1 (a run that learned nothing), never a traceback; a recipe file loads with flags over it; a checkpoint
left half-written is refused, or passed over for the last complete one."""

from __future__ import annotations

import json
import shutil

import pytest

from draftlab.cli import main
from draftlab.core.records import make_conversation, write_jsonl
from draftlab.train_draft import TrainConfig
from draftlab.train_draft.guards import learned_nothing
from test_train import small_config, write_fixture


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("regen"), n_train=16, n_val=4)


@pytest.fixture(scope="module")
def trained(files, tmp_path_factory):
    """A finished tiny training folder with a checkpoint at every step (the last three kept)."""
    from draftlab.train_draft import train

    out = tmp_path_factory.mktemp("trained") / "eagle3"
    train(small_config(files, out, epochs=1, eval_every=100, save_every=1, keep_checkpoints=3))
    return out


def run(capsys, *argv) -> tuple[int, str]:
    try:
        code = main(list(argv))
    except SystemExit as stop:  # argparse's own refusal of a value (one line: core.options)
        code = stop.code
    err = capsys.readouterr().err
    lines = [line for line in err.replace("\r", "\n").splitlines() if line.startswith("error:")]
    assert "Traceback" not in err
    return code, lines


def train_args(files, tmp_path, *extra):
    return [
        "train", "--train-file", str(files[0]), "--out-dir", str(tmp_path / "out"), "--target", "tiny",
        "--device", "cpu", "--draft-vocab-size", "256", "--epochs", "1", "--batch-tokens", "512",
        "--max-batch", "8", "--ttt-steps", "2", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--epochs", "0"], "--epochs 0"),
        (["--epochs", "nan"], "--epochs: 'nan' is not a finite number"),
        (["--epochs", "inf"], "--epochs: 'inf' is not a finite number"),
        (["--epochs", "-1"], "--epochs -1"),
        (["--lr", "nan"], "--lr: 'nan' is not a finite number"),
        (["--lr", "-0.001"], "--lr -0.001"),
        (["--lr", "inf"], "--lr: 'inf' is not a finite number"),
        (["--draft-vocab-size", "0"], "--draft-vocab-size 0"),
        (["--draft-vocab-size", "10000000"], "--draft-vocab-size 10000000: larger than the target's vocabulary"),
        (["--capture-layers", "-1", "2", "3"], "--capture-layers [-1, 2, 3]: [-1] negative"),
        (["--capture-layers", "1", "2", "99"], "--capture-layers [1, 2, 99]: [99] outside the"),
        (["--loss", "wsd"], "loss = 'wsd', expected one of"),
        (["--keep-checkpoints", "0"], "--keep-checkpoints 0: must be a finite number at least 1"),
    ],
)
def test_bad_numbers_are_one_line_and_exit_2(files, tmp_path, capsys, flags, named):
    code, lines = run(capsys, *train_args(files, tmp_path, *flags))
    assert code == 2 and len(lines) == 1 and named in lines[0], lines


def test_target_is_required(files, tmp_path, capsys):
    argv = train_args(files, tmp_path)
    i = argv.index("--target")
    code, lines = run(capsys, *argv[:i], *argv[i + 2 :])
    assert code == 2 and len(lines) == 1 and "--target is required" in lines[0]


@pytest.mark.parametrize("damage", ["no weights", "half-written weights"])
def test_a_target_folder_without_readable_weights(files, tmp_path, capsys, damage):
    from draftlab.model.target import resolve_path

    folder = tmp_path / "target"
    shutil.copytree(resolve_path("tiny"), folder)
    weights = folder / "model.safetensors"
    if damage == "no weights":
        weights.unlink()
    else:
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    argv = train_args(files, tmp_path)
    argv[argv.index("--target") + 1] = str(folder)
    code, lines = run(capsys, *argv)
    assert code == 2 and len(lines) == 1 and f"--target {folder}" in lines[0], lines


def test_data_with_no_trainable_tokens_is_refused(tmp_path, capsys):
    rows = [
        make_conversation([{"role": "user", "content": f"q{k}"}, {"role": "assistant", "content": ""}], "t")
        for k in range(6)
    ]
    write_jsonl(tmp_path / "empty.jsonl", rows)
    code, lines = run(capsys, *train_args([tmp_path / "empty.jsonl"], tmp_path, "--export", str(tmp_path / "d")))
    assert code == 2 and len(lines) == 1 and "empty.jsonl: no trainable tokens" in lines[0], lines
    assert not (tmp_path / "d").exists()  # nothing exported, nothing said to conform


@pytest.mark.slow
def test_a_run_says_what_share_it_trains_on(files, tmp_path, capsys):
    code = main(train_args(files, tmp_path, "--stop-after", "1"))
    out = capsys.readouterr().out
    assert code == 0 and "trains on 16 of 16 conversations (100.0%) and " in out and "the assistant's" in out


def test_learned_nothing():
    assert learned_nothing([], 0) is None  # no step in this call (resumed a finished run)
    assert "0 supervised tokens" in learned_nothing([0.0, 0.0], 0)
    assert "stayed at 0" in learned_nothing([0.0, 0.0, 0.0], 120)
    assert learned_nothing([0.0], 120) is None and learned_nothing([3.1, 3.0], 120) is None


@pytest.mark.slow
def test_a_run_whose_loss_never_moves_fails_before_export(files, tmp_path, capsys, monkeypatch):
    """The stats' weighted loss pinned (as with empty answers: 0.0 every step): exit 1, one line, no export."""
    from draftlab.train_draft import loop

    monkeypatch.setattr(loop, "summarize", lambda stats, decay: {"loss": 0.0, "acc_0": 0.0})
    code, lines = run(capsys, *train_args(files, tmp_path, "--export", str(tmp_path / "d"), "--log-every", "1000"))
    assert code == 1 and len(lines) == 1 and "learned nothing: the loss stayed at 0" in lines[0], lines
    assert not (tmp_path / "d").exists()


# ---- recipes ----------------------------------------------------------------------------------------
def test_config_file_then_flags(files, tmp_path):
    from draftlab.cli import build_parser
    from draftlab.train_draft.cli import config_from_args

    recipe = tmp_path / "r.yaml"
    recipe.write_text("# a recipe\nlr: 5.0e-4\nfc_norm: none\nepochs: 3\nttt_steps: 5\n")
    argv = ["train", "--config", str(recipe), "--target", "tiny", "--lr", "2e-3", "--train-file", str(files[0])]
    cfg = config_from_args(build_parser(argv).parse_args(argv))
    assert (cfg.lr, cfg.fc_norm, cfg.epochs, cfg.ttt_steps) == (2e-3, "none", 3.0, 5)  # the flag wins
    assert cfg.draft_vocab_size == TrainConfig().draft_vocab_size  # neither: the default


@pytest.mark.parametrize(
    "text, said",
    [("lr: 1e-3\nlearning_rate: 1\n", "unknown key 'learning_rate'"), ("epochs: many\n", "key 'epochs'")],
)
def test_config_file_refused_in_one_line(files, tmp_path, capsys, text, said):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text(text)
    code, lines = run(capsys, *train_args(files, tmp_path, "--config", str(recipe)))
    assert code == 2 and len(lines) == 1 and str(recipe) in lines[0] and said in lines[0], lines


# ---- export ----------------------------------------------------------------------------------------
def copy_of(trained, tmp_path):
    out = tmp_path / "train"
    shutil.copytree(trained, out)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["empty", "half"])
def test_export_refuses_a_half_written_checkpoint_in_one_line(trained, tmp_path, capsys, damage):
    train_dir = copy_of(trained, tmp_path)
    ck = train_dir / (train_dir / "latest").read_text().strip()
    weights = ck / "draft.safetensors"
    weights.write_bytes(b"" if damage == "empty" else weights.read_bytes()[: weights.stat().st_size // 2])
    code, lines = run(capsys, "export", str(ck), str(tmp_path / "d"))
    assert code == 2 and len(lines) == 1 and f"{ck}: not a complete checkpoint: draft.safetensors" in lines[0]


@pytest.mark.slow
def test_export_of_latest_falls_back_to_the_last_complete_checkpoint(trained, tmp_path, capsys):
    train_dir = copy_of(trained, tmp_path)
    latest = (train_dir / "latest").read_text().strip()
    (train_dir / latest / "optimizer.safetensors").unlink()  # a copy cut short
    code = main(["export", str(train_dir), str(tmp_path / "d")])
    captured = capsys.readouterr()
    notes = [line for line in captured.err.splitlines() if "last complete checkpoint" in line]
    assert code == 0 and len(notes) == 1 and latest in notes[0] and "optimizer.safetensors is missing" in notes[0]
    assert "conforms to the EAGLE-3 contract" in captured.out
    assert json.loads((tmp_path / "d" / "config.json").read_text())


def test_export_validate_only_on_a_missing_folder_exits_2(tmp_path, capsys):
    code, lines = run(capsys, "export", "unused", str(tmp_path / "nowhere"), "--validate-only")
    assert code == 2 and len(lines) == 1 and "nowhere: no such folder" in lines[0]
