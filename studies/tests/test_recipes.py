"""The recipe study: its base is the reference run's recipe, rows train (and resume) through
`draftlab train`, the SGLang plan gives every row its own server, and the table reads per-set acceptance."""

import csv
import json
import math
import os
import signal
import threading

import pandas as pd
import pytest
import yaml

from draftlab.benchmark_acceptance.sglang_live import slug
from draftlab.core.errors import InputError
from draftlab.core.records import append_jsonl
from draftlab.core.stop import Stopped
from draftlab.train_draft import TrainConfig
from studies.recipes import cli as recipes_cli
from studies.recipes import figures as recipe_figures
from studies.recipes import rows as recipe_rows
from studies.recipes import speed as recipe_speed
from studies.recipes import study as recipes
from studies.recipes import volume
from tests.test_train import write_fixture

SMOKE = {
    "device": "cpu",
    "draft_vocab_size": 256,
    "max_len": 64,
    "epochs": 1.0,
    "batch_tokens": 256,
    "max_batch": 4,
    "ttt_steps": 2,
    "max_val_samples": 4,
    "log_every": 1,
    "save_every": 2,
    "eval_every": 4,
    "threads": 1,
}


def test_base_is_the_reference_runs_recipe():
    params = yaml.safe_load(open("results/reference/params.yaml"))["notebooks"]["04_train_draft"]
    names = {
        "epochs": "EPOCHS",
        "draft_vocab_size": "DRAFT_VOCAB_SIZE",
        "lr": "LR",
        "max_len": "MAX_LEN",
        "batch_tokens": "BATCH_TOKENS",
        "max_batch": "MAX_BATCH",
        "ttt_steps": "TTT_STEPS",
        "max_val_samples": "VAL_SAMPLES",
    }
    assert {k: params[v] for k, v in names.items()} == {k: recipe_rows.BASE[k] for k in names}
    assert params["ARCHS"] == [recipe_rows.BASE["arch"]]
    for row in recipe_rows.ROWS:  # every row is a valid TrainConfig
        TrainConfig.from_dict(recipe_rows.recipe(row))


def test_rows_train_resume_after_a_cut_and_export(tmp_path):
    train_file, val_file = write_fixture(tmp_path / "regen", n_train=24, n_val=4)
    out = tmp_path / "study"
    extra = {**SMOKE, "target": "tiny"}
    stop = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGTERM))  # as ops' deadline or a user's kill
    stop.start()
    with pytest.raises(Stopped, match="recipe rows base, hardce cut, stopped by SIGTERM; run the same"):
        recipes.train_rows(
            ["base", "hardce"], str(train_file), str(val_file), out, target="tiny", parallel=2, extra=extra
        )
    stop.join()
    assert json.loads((out / "train_status.json").read_text()) == {"base": "cut", "hardce": "cut"}
    status = recipes.train_rows(
        ["base", "hardce"], str(train_file), str(val_file), out, target="tiny", parallel=2, extra=extra
    )
    assert status == {"base": "done", "hardce": "done"}, (out / "base" / "train.log").read_text()[-2000:]
    for row in ("base", "hardce"):
        assert (out / row / "draft" / "config.json").is_file()
        state = json.loads(sorted((out / row / "train").glob("ckpt-*/state.json"))[-1].read_text())
        assert state["train_config"]["loss"] == ("hard" if row == "hardce" else "soft")
    assert recipes.train_rows(["base"], str(train_file), str(val_file), out, extra=extra) == {"base": "done"}
    with pytest.raises(Exception, match="recipe row 'nope'"):
        recipes.train_rows(["nope"], str(train_file), str(val_file), out)


def test_a_row_stopped_by_a_signal_is_cut_not_failed(tmp_path):
    (tmp_path / "r" / "train").mkdir(parents=True)
    assert recipes.row_status(tmp_path, "r", 143) == "cut"  # SIGTERM: checkpointed, exit 128 + 15
    assert recipes.row_status(tmp_path, "r", 130) == "cut"  # SIGINT
    assert recipes.row_status(tmp_path, "r", -9) == "cut"  # killed outright: the last checkpoint stays
    assert recipes.row_status(tmp_path, "r", 0) == "failed (exit 0)"  # exit 0 and nothing to show
    assert recipes.row_status(tmp_path, "r", 1) == "failed (exit 1)"
    (tmp_path / "r" / "train" / "summary.json").write_text('{"finished": true}')
    (tmp_path / "r" / "draft").mkdir()
    (tmp_path / "r" / "draft" / "model.safetensors").write_bytes(b"w")
    assert recipes.row_status(tmp_path, "r", 0) == "done"


def test_offline_rows_share_one_store_of_target_states_that_the_parent_computes(tmp_path):
    train_file, val_file = write_fixture(tmp_path / "regen", n_train=24, n_val=4)
    out = tmp_path / "study"
    extra = {**SMOKE, "target": "tiny", "hidden": "offline"}
    status = recipes.train_rows(
        ["base", "hardce"], str(train_file), str(val_file), out, target="tiny", parallel=2, extra=extra
    )
    assert status == {"base": "done", "hardce": "done"}, (out / "base" / "train.log").read_text()[-2000:]
    n = json.loads((out / "hidden" / "train" / "index.json").read_text())["num_samples"]
    for row in ("base", "hardce"):  # each row found the store complete: it only read it
        assert f"{n} samples already done" in (out / row / "train.log").read_text()
        assert not (out / row / "hidden").exists()


def test_the_speed_check_times_each_variant_on_the_shared_tokens(tmp_path, capsys):
    train_file, val_file = write_fixture(tmp_path / "regen", n_train=24, n_val=4)
    out = tmp_path / "study"
    smoke = {**SMOKE, "epochs": 30.0}  # enough batches for 30 steps
    res = recipe_speed.check_speed(
        ["eager", "keep_head"], str(train_file), str(val_file), out, target="tiny", steps=30, extra=smoke
    )
    assert set(res) == {"eager", "keep_head", "note"}
    assert res["eager"]["steps"] == 30 and res["eager"]["tok_s_after_warmup"] > 0
    assert res["eager"]["loss"] == res["keep_head"]["loss"]  # the same arithmetic (recomputing the head: CUDA only)
    assert json.loads((out / "speed.json").read_text()) == res
    assert list((out / "tokens").iterdir()) and not (out / "speed" / "tokens").exists()
    with pytest.raises(Exception, match="speed variant 'fast': expected one of eager, keep_head, compiled, offline"):
        recipe_speed.check_speed(["fast"], str(train_file), str(val_file), out, target="tiny")


def test_rate_after_warmup_is_the_rate_between_the_first_and_last_logged_rows():
    rows = [
        {"step": "10", "tokens_per_s": "100", "elapsed_s": "1", "loss": "3"},
        {"step": "20", "tokens_per_s": "150", "elapsed_s": "2", "loss": "2"},
        {"step": "30", "tokens_per_s": "200", "elapsed_s": "3", "loss": "1"},
    ]
    # 200 tok/s * 3 s - 100 tok/s * 1 s = 500 tokens in the 2 s after the first window
    assert recipe_speed.rate_after_warmup(rows) == {
        "steps": 30,
        "tok_s_after_warmup": 250.0,
        "tok_s_cumulative": 200.0,
        "loss": 1.0,
    }
    assert recipe_speed.rate_after_warmup(rows[:2]) is None
    reference = list(csv.DictReader(open("results/reference/train/train.csv")))
    rate = recipe_speed.rate_after_warmup(reference)
    assert rate["steps"] == int(reference[-1]["step"]) and rate["tok_s_after_warmup"] > 0


def test_each_row_gets_its_own_server_and_ports(tmp_path):
    entries = recipes.row_entries(
        ["base", "fcnorm", "epochs10"], tmp_path, "/m", steps=6, concurrency=[1, 16], port=32000
    )
    assert [e.label for e in entries] == ["baseline", "base", "fcnorm", "epochs10"]
    assert entries[0].algorithm is None and all(e.algorithm == "EAGLE3" and e.steps == 6 for e in entries[1:])
    for e, row in zip(entries[1:], ["base", "fcnorm", "epochs10"]):
        assert f"--speculative-draft-model-path {tmp_path / row / 'draft'}" in e.command
    ports = [e.command.split("--port ")[1].split()[0] for e in entries]
    nccl = [e.command.split("--nccl-port ")[1].split()[0] for e in entries]
    assert len(set(ports)) == len(set(nccl)) == 4 and not set(ports) & set(nccl)


def test_a_chain_sweep_gives_each_row_a_server_per_length(tmp_path):
    entries = recipes.row_entries(
        ["base", "fcnorm"], tmp_path, "/m", steps=6, concurrency=[16, 1], port=32000, chain=[1, 3, 6]
    )
    assert [e.label for e in entries] == ["baseline", "base", "base S1", "base S3", "fcnorm", "fcnorm S1", "fcnorm S3"]
    assert [e.steps for e in entries[1:]] == [6, 1, 3] * 2
    assert [e.concurrency for e in entries] == [[16, 1], [16, 1], [16], [16], [16, 1], [16], [16]]
    for e in entries[1:]:
        assert f"--speculative-num-steps {e.steps} " in e.command
    ports = [int(e.command.split(flag)[1].split()[0]) for e in entries for flag in ("--port ", "--nccl-port ")]
    assert len(set(ports)) == len(ports)
    with pytest.raises(Exception, match="too many for the port plan"):
        recipes.row_entries(
            list(recipe_rows.ROWS), tmp_path, "/m", steps=6, concurrency=[16], port=32000, chain=list(range(1, 8))
        )
    only = recipes.row_entries(
        ["base", "fcnorm"],
        tmp_path,
        "/m",
        steps=6,
        concurrency=[1, 16],
        port=32000,
        chain=[1, 3, 6],
        chain_rows=["fcnorm"],
    )  # the sweep for one row
    assert [e.label for e in only] == ["baseline", "base", "fcnorm", "fcnorm S1", "fcnorm S3"]


def trained_rows(out, *rows) -> None:
    """What `recipes train` leaves for a finished row: its draft's weights and its training summary."""
    for row in rows:
        (out / row / "draft").mkdir(parents=True)
        (out / row / "draft" / "model.safetensors").write_bytes(b"w")
        (out / row / "train").mkdir()
        (out / row / "train" / "summary.json").write_text("{}")


def test_measure_rows_takes_repeated_windows_and_the_table_their_median(tmp_path, monkeypatch):
    trained_rows(tmp_path, "base", "fcnorm")
    seen = {}
    monkeypatch.setattr(recipes, "measure", lambda entries, ids, out, **kw: seen.update(kw) or [])
    recipes.measure_rows(["base", "fcnorm"], tmp_path, "/m", [[1, 2]], {"held_out": range(1)}, repeats=3)
    assert seen["repeats"] == 3 and seen["warmup"] == 1
    windows = [{"label": "base", "concurrency": 1, "tokens_per_s": v} for v in (615, 809, 584)]
    assert recipes._tok_s(windows) == {("base", 1): 615.0}  # one noisy window does not make the row
    # over the server's own seconds: only the windows that recorded them (server_s from 2026-12-04)
    windows = [{**w, "completion_tokens": 1000, "server_s": s} for w, s in zip(windows, (2.0, 1.0, None))]
    assert recipes._tok_s(windows, server=True) == {("base", 1): 750.0}


def test_measuring_a_row_whose_training_was_cut_fails_before_any_server_starts(tmp_path, monkeypatch):
    """2026-12-03: ROWS=epochs10, cut at step 4,509 of 5,012, was left out quietly and the call measured base alone."""
    trained_rows(tmp_path, "base")
    (tmp_path / "epochs10" / "train").mkdir(parents=True)
    summary = {"steps": 4509, "total_steps": 5012, "finished": False}
    (tmp_path / "epochs10" / "train" / "summary.json").write_text(json.dumps(summary))
    monkeypatch.setattr(recipes, "measure", lambda *a, **kw: pytest.fail("no server may start"))
    with pytest.raises(InputError, match=r"recipe row epochs10: .*cut at step 4,509 of 5,012"):
        recipes.measure_rows(["base", "epochs10"], tmp_path, "/m", [[1, 2]], {"held_out": range(1)})
    with pytest.raises(InputError, match=r"recipe row fcnorm: .*\(not trained\)"):
        recipes.measure_rows(["base", "fcnorm"], tmp_path, "/m", [[1, 2]], {"held_out": range(1)})
    with pytest.raises(InputError, match="--chain-rows fcnorm not among --rows base"):  # it got no chain quietly
        recipes.measure_rows(
            ["base"], tmp_path, "/m", [[1, 2]], {"held_out": range(1)}, chain=[3], chain_rows=["fcnorm"]
        )


def test_recipes_measure_server_flags_reach_every_server(tmp_path, monkeypatch):
    """`measure --server-flags=...` to every launch command (the baseline's and each row's)."""
    trained_rows(tmp_path, "base", "fcnorm")
    seen = []
    monkeypatch.setattr(recipes, "measure", lambda entries, ids, out, **kw: seen.extend(entries) or [])
    monkeypatch.setattr(recipes_cli, "prompt_sets", lambda *a: ([{"messages": []}], {"held_out": range(1)}))
    monkeypatch.setattr(recipes_cli, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(recipes_cli, "encode_prompts", lambda tok, messages: [[1, 2]])
    monkeypatch.setattr(recipes_cli, "_report", lambda args: 0)
    argv = ["measure", "--rows", "base,fcnorm", "--out", str(tmp_path), "--model-path", "/m"]
    argv += ["--held-out", "t.jsonl", "--chain", "3", "--server-flags=--sleep-on-idle --enable-metrics"]
    args = recipes_cli.build_parser().parse_args(argv)
    assert args.func(args) == 0
    assert [e.label for e in seen] == ["baseline", "base", "base S3", "fcnorm", "fcnorm S3"]
    assert all(" --sleep-on-idle --enable-metrics" in e.command for e in seen)


def test_table_splits_acceptance_by_prompt_set(tmp_path):
    out = tmp_path
    (out / "sglang" / "outputs").mkdir(parents=True)
    entries = recipes.row_entries(["base"], out, "/m", steps=6, concurrency=[1, 16], port=32000)
    sets = {"held_out": [0, 2], "humaneval": [2, 3]}
    append_jsonl(
        out / "sglang" / "outputs" / "base.jsonl",
        [
            {"index": 0, "output_ids": [], "completion_tokens": 30, "spec_verify_ct": 10},
            {"index": 1, "output_ids": [], "completion_tokens": 20, "spec_verify_ct": 10},
            {"index": 2, "output_ids": [], "completion_tokens": 12, "spec_verify_ct": 6},
        ],
    )
    (out / "sglang" / "plan.json").write_text(
        json.dumps({"steps": 6, "sets": sets, "concurrency": [1, 16], "entries": [e.__dict__ for e in entries]})
    )
    append_jsonl(
        out / "sglang" / "windows.jsonl",
        [
            {"label": "baseline", "concurrency": 1, "tokens_per_s": 100.0, "completion_tokens": 100, "server_s": 0.8},
            {"label": "baseline", "concurrency": 16, "tokens_per_s": 1000.0},
            {"label": "base", "concurrency": 1, "tokens_per_s": 150.0, "completion_tokens": 150, "server_s": 0.6},
            {"label": "base", "concurrency": 16, "tokens_per_s": 700.0},
            {"label": "base", "concurrency": 16, "tokens_per_s": 900.0},
            {"label": "base", "concurrency": 16, "tokens_per_s": 800.0},
        ],
    )
    df = recipes.write_report(out)
    row = df.iloc[0].to_dict()
    assert row["sglang_acceptance_held_out"] == pytest.approx(2.5) and row["sglang_acceptance_humaneval"] == 2.0
    assert row["sglang_speedup_c1"] == pytest.approx(1.5) and row["sglang_speedup_c16"] == pytest.approx(0.8)
    assert row["sglang_tok_s_c16"] == 800.0  # the median of its windows
    assert row["sglang_server_speedup_c1"] == pytest.approx((150 / 0.6) / (100 / 0.8))  # the servers' own seconds
    assert row["acceptance_concurrency"] == 1  # the plan's first level gave the acceptance
    assert (out / "recipes.png").is_file() and (out / "table.csv").is_file()
    assert not (out / "acceptance_by_steps.csv").exists()  # one chain length: nothing to plot by S


def test_report_by_chain_length(tmp_path):
    out = tmp_path
    (out / "sglang" / "outputs").mkdir(parents=True)
    entries = recipes.row_entries(["base"], out, "/m", steps=6, concurrency=[16, 1], port=32000, chain=[2, 6])
    (out / "sglang" / "plan.json").write_text(
        json.dumps(
            {
                "steps": 6,
                "sets": {"held_out": [0, 1], "humaneval": [1, 2]},
                "concurrency": [16, 1],
                "entries": [e.__dict__ for e in entries],
            }
        )
    )
    for label, (a, b) in (("base", (30, 12)), ("base S2", (20, 9))):
        append_jsonl(
            out / "sglang" / "outputs" / f"{slug(label)}.jsonl",
            [
                {"index": 0, "output_ids": [], "completion_tokens": a, "spec_verify_ct": 10},
                {"index": 1, "output_ids": [], "completion_tokens": b, "spec_verify_ct": 6},
            ],
        )
    append_jsonl(
        out / "sglang" / "windows.jsonl",
        [  # the first concurrency's windows: every server has one
            {"label": "baseline", "concurrency": 16, "tokens_per_s": 400.0},
            {"label": "base", "concurrency": 16, "tokens_per_s": 500.0},
            {"label": "base", "concurrency": 1, "tokens_per_s": 90.0},
            {"label": "base S2", "concurrency": 16, "tokens_per_s": 600.0},
        ],
    )
    df = recipes.write_report(out)
    assert list(df["row"]) == ["base"] and df.iloc[0]["sglang_acceptance_held_out"] == 3.0
    by_steps = pd.read_csv(out / "acceptance_by_steps.csv")
    assert by_steps.to_dict("records") == [
        {"row": "base", "steps": 2, "set": "held_out", "acceptance": 2.0},
        {"row": "base", "steps": 2, "set": "humaneval", "acceptance": 1.5},
        {"row": "base", "steps": 6, "set": "held_out", "acceptance": 3.0},
        {"row": "base", "steps": 6, "set": "humaneval", "acceptance": 2.0},
    ]
    speed = pd.read_csv(out / "speed_by_steps.csv")
    assert speed.to_dict("records") == [
        {"row": "base", "steps": 6, "concurrency": 16, "tok_s": 500.0, "speedup": 1.25},
        {"row": "base", "steps": 2, "concurrency": 16, "tok_s": 600.0, "speedup": 1.5},
    ]
    assert (out / "recipes_by_steps.png").is_file()


def test_the_eagle1_row_at_the_best_recipe_differs_from_best_data2x_only_in_the_architecture(tmp_path):
    """best-data2x / eagle1-data2x is the issue's EAGLE-3 / EAGLE-1 ratio "on the same data": one change apart."""
    train = str(tmp_path / "train.jsonl")
    eagle3, eagle1 = (
        recipes.row_config(row, train, "v.jsonl", tmp_path / "study", "tiny", {})
        for row in ("best-data2x", "eagle1-data2x")
    )
    differ = {k for k, v in vars(eagle3).items() if vars(eagle1)[k] != v}
    assert differ == {"arch", "fc_norm", "out_dir"}, differ  # (EAGLE-1 has no fc, so no norm before it)
    assert (eagle1.arch, eagle1.fc_norm, eagle3.arch) == ("eagle1", "none", "eagle3")
    assert eagle1.train_file == eagle3.train_file == str(tmp_path / "train-data2x.jsonl")


def answered_rows(ids, answer="an answer") -> list[dict]:
    return [
        {"id": i, "messages": [{"role": "user", "content": f"q {i}"}, {"role": "assistant", "content": answer}]}
        for i in ids
    ]


def test_a_data_volume_row_trains_on_the_train_file_grown_by_the_regenerated_extra(tmp_path, monkeypatch):
    data = tmp_path / "data"
    data.mkdir()
    append_jsonl(data / "train.jsonl", answered_rows(["t1", "t2"]))
    regenerated = data / "extra-regen.jsonl"
    append_jsonl(regenerated, answered_rows(["x1"]) + answered_rows(["x2"], answer="") + answered_rows(["x3", "x4"]))
    train = str(data / "train.jsonl")
    cfg = recipes.row_config("data2x", train, "v.jsonl", tmp_path / "study", "tiny", {})
    assert cfg.train_file == str(data / "train-data2x.jsonl") and cfg.epochs == 2.5
    assert recipes.row_config("base", train, "v.jsonl", tmp_path / "study", "tiny", {}).train_file == train
    with pytest.raises(Exception, match="recipe row data2x: its train file .*train-data2x.jsonl is missing"):
        recipes.train_rows(["data2x"], train, "v.jsonl", tmp_path / "study", target="tiny")
    monkeypatch.setitem(recipe_rows.EXTRA_ROWS, "data2x", (("extra", 2),))
    skipped = volume.grow_rows(["data2x"], train, {"multi-turn": str(regenerated)})
    assert skipped == {"data2x": {"skipped": "its regenerated set 'extra' is not given"}}
    assert not (data / "train-data2x.jsonl").exists()
    assert volume.grow_rows(["base", "data2x"], train, {"extra": str(regenerated)}) == {
        "data2x": {"train": 2, "extra": 2, "out": cfg.train_file}
    }
    grown = [json.loads(line)["id"] for line in open(cfg.train_file)]
    assert grown == ["t1", "t2", "x1", "x3"]  # the train file, then the first answered extra ones
    assert volume.grow_rows(["data2x"], train, {"extra": str(regenerated)}) == {}  # written once
    monkeypatch.setitem(recipe_rows.EXTRA_ROWS, "data2x", (("extra", 4),))
    (data / "train-data2x.jsonl").unlink()
    with pytest.raises(Exception, match="extra-regen.jsonl: 3 answered conversations, fewer than the 4"):
        volume.grow_rows(["data2x"], train, {"extra": str(regenerated)})
    assert not (data / "train-data2x.jsonl").exists()


def measured_study(out, accepted: dict[str, int]):
    """A study folder as `recipes measure` leaves it: per row one held-out and one HumanEval reply, each with
    10 verify steps, the held-out one with `accepted[row]` tokens (acceptance accepted/10) and HumanEval 20."""
    (out / "sglang" / "outputs").mkdir(parents=True)
    entries = recipes.row_entries(list(accepted), out, "/m", steps=6, concurrency=[16], port=32000)
    (out / "sglang" / "plan.json").write_text(
        json.dumps(
            {
                "steps": 6,
                "sets": {"held_out": [0, 1], "humaneval": [1, 2]},
                "concurrency": [16],
                "entries": [e.__dict__ for e in entries],
            }
        )
    )
    for row, tokens in accepted.items():
        append_jsonl(
            out / "sglang" / "outputs" / f"{slug(row)}.jsonl",
            [
                {"index": 0, "output_ids": [], "completion_tokens": tokens, "spec_verify_ct": 10},
                {"index": 1, "output_ids": [], "completion_tokens": 20, "spec_verify_ct": 10},
            ],
        )
    return out


def test_combined_table_compares_each_row_with_its_own_studys_base(tmp_path):
    old = measured_study(tmp_path / "old", {"base": 30, "eagle1": 24, "fcnorm": 33})
    new = measured_study(tmp_path / "new", {"base": 32, "fcnorm": 36, "lr1e-3": 40})
    df = recipes.write_combined([old, new], tmp_path / "combined")
    assert list(df["row"]) == ["base", "fcnorm", "lr1e-3", "eagle1"]  # ROWS order; fcnorm from the later study
    got = df.set_index("row")
    assert got.loc["fcnorm", "study"] == str(new) and got.loc["eagle1", "study"] == str(old)
    assert got.loc["fcnorm", "gain_held_out"] == pytest.approx(36 / 32)
    assert got.loc["eagle1", "gain_held_out"] == pytest.approx(24 / 30) and got.loc["lr1e-3", "gain_humaneval"] == 1.0
    assert (tmp_path / "combined" / "recipes.png").is_file()
    assert pd.read_csv(tmp_path / "combined" / "table.csv")["row"].tolist() == list(df["row"])
    with pytest.raises(Exception, match="no measured base row"):
        recipes.combined_table([measured_study(tmp_path / "nobase", {"fcnorm": 30})])


def test_a_later_study_that_only_planned_a_row_keeps_the_earlier_measurement(tmp_path):
    old = measured_study(tmp_path / "old", {"base": 30, "n10806": 24})
    cut = measured_study(tmp_path / "cut", {"base": 31, "n10806": 26, "fcnorm": 33})
    (cut / "sglang" / "outputs" / "n10806.jsonl").unlink()  # planned, left at the call's deadline
    got = recipes.combined_table([old, cut]).set_index("row")
    assert got.loc["n10806", "study"] == str(old) and got.loc["n10806", "gain_held_out"] == pytest.approx(24 / 30)
    assert got.loc["base", "study"] == str(cut) and got.loc["fcnorm", "study"] == str(cut)
    alone = recipes.combined_table([cut]).set_index("row")  # measured nowhere: the row stays, unmeasured
    assert pd.isna(alone.loc["n10806", "sglang_acceptance_held_out"])


def test_plot_labels_say_the_batch_of_a_row_read_at_another_concurrency_than_base():
    df = pd.DataFrame({"row": ["base", "n1351", "best-data2x"], "acceptance_concurrency": [16, 1, 16]})
    assert recipe_figures.row_labels(df) == ["base", "n1351\n(batch 1)", "best-data2x"]
    assert recipe_figures.row_labels(df[df["row"] != "base"]) == ["n1351", "best-data2x"]  # no base: nothing to compare


def test_set_values_take_each_settings_type():
    assert TrainConfig.from_text(
        [("compile", "true"), ("save_every", "100"), ("lr", "1e-3"), ("device", "cuda"), ("recompute_head", "false")]
    ) == {"compile": True, "save_every": 100, "lr": 1e-3, "device": "cuda", "recompute_head": False}
    with pytest.raises(ValueError, match="unknown training setting 'speed'"):
        TrainConfig.from_text([("speed", "1")])


def test_extra_prompts_are_the_larger_blends_that_the_reference_has_not_seen(tmp_path):
    import lzma

    from draftlab.core.records import read_jsonl
    from studies.recipes.volume import extra_prompts

    def prompt(i, text=None):
        return {"id": f"id{i}", "source": "docs", "messages": [{"role": "user", "content": text or f"prompt {i}"}]}

    seen = tmp_path / "reference.jsonl.xz"
    with lzma.open(seen, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in (prompt(1), prompt(9, "prompt 2")))  # by id; by user text
    blend = tmp_path / "large.jsonl"
    blend.write_text("".join(json.dumps(prompt(i)) + "\n" for i in range(1, 6)))
    counts = extra_prompts(blend, [seen], 2, tmp_path / "extra.jsonl.xz")
    assert counts["new"] == 3 and [r["id"] for r in read_jsonl(tmp_path / "extra.jsonl.xz")] == ["id3", "id4"]
    with pytest.raises(Exception, match="3 prompts the reference has not seen, fewer than 4"):
        extra_prompts(blend, [seen], 4, tmp_path / "more.jsonl.xz")
    assert not (tmp_path / "more.jsonl.xz").exists()


def test_multi_turn_prompts_pair_unused_extra_prompts_and_regenerate_turn_by_turn(tmp_path):
    """Two-turn prompts from the extra prompts after the first SKIP: each user turn an unused extra prompt or a
    follow-up on the first one, every prompt used once; the regeneration's plan answers both turns in order;
    a grown file takes only conversations with both answers."""
    from draftlab.core.records import read_jsonl
    from draftlab.regenerate.config import RegenConfig, plan_turns, slots
    from studies.recipes.volume import answered, multi_turn_prompts

    def prompt(i, package):
        meta = {"package": package, "module": f"{package}.m", "qualname": f"f{i}"}
        return {"id": f"id{i}", "messages": [{"role": "user", "content": f"prompt {i}"}], "meta": meta}

    extra = tmp_path / "extra.jsonl"
    extra.write_text("".join(json.dumps(prompt(i, "ab"[i % 2])) + "\n" for i in range(40)))
    out = tmp_path / "mt.jsonl.xz"
    argv = ["multi-turn", "--extra", str(extra), "--skip", "10", "--n", "12", "--out", str(out)]
    args = recipes_cli.build_parser().parse_args(argv)
    assert args.func(args) == 0
    rows = list(read_jsonl(out))
    assert len(rows) == 12 and len({r["id"] for r in rows}) == 12
    used = [i for r in rows for i in r["meta"]["from"]]
    assert len(used) == len(set(used)) and min(int(i[2:]) for i in used) >= 10  # each once, none of the first 10
    for r in rows:
        first, answer, second = r["messages"]
        assert (first["role"], answer, second["role"]) == ("user", {"role": "assistant", "content": ""}, "user")
        assert first["content"] == f"prompt {r['meta']['from'][0][2:]}"
        if r["meta"]["follow_up"] == "next prompt":  # the next unused prompt of the same package
            i, j = (int(x[2:]) for x in r["meta"]["from"])
            assert i % 2 == j % 2 and second["content"].endswith(f"prompt {j}")
        plan = plan_turns(r["messages"], RegenConfig())
        assert slots(plan) == [1, 3]  # both assistant turns regenerated, the first before the second
    assert {r["meta"]["follow_up"] for r in rows} == {"same item", "next prompt"}
    with pytest.raises(InputError, match="30 prompts after the first 10 make 2"):
        multi_turn_prompts(extra, 10, 31, tmp_path / "more.jsonl.xz")
    assert not (tmp_path / "more.jsonl.xz").exists()
    both = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    assert answered({"messages": both + both}) and not answered({"messages": [*both, both[0]]})
    assert not answered({"messages": [both[0], {"role": "assistant", "content": ""}, *both]})


def test_held_out_multi_turn_prompts_follow_the_targets_own_answer_and_measure_as_a_third_set(tmp_path):
    """The tracked multi-turn held-out set is what `recipes multi-turn-held-out` makes from the regenerated
    val split (the target's answers, after the training's 256 validation rows); `recipes measure` takes its
    first N as the set multi_turn, after the held-out and HumanEval prompts, earlier turns included."""
    import lzma
    from pathlib import Path

    from studies.recipes.volume import FOLLOW_UPS, answered

    root = Path(__file__).resolve().parents[2]
    tracked = root / "results/recipes/data/multi-turn-held-out.jsonl"
    out = tmp_path / "mt.jsonl"
    argv = ["multi-turn-held-out", "--val", str(root / "results/reference/data/regen/val.jsonl.xz")]
    args = recipes_cli.build_parser().parse_args([*argv, "--n", "64", "--out", str(out)])
    assert args.func(args) == 0 and out.read_bytes() == tracked.read_bytes()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    val = [json.loads(line) for line in lzma.open(root / "results/reference/data/regen/val.jsonl.xz", "rt")]
    assert [r["id"] for r in rows] == [r["id"] for r in val[256:] if answered(r)][:64]
    for row in rows:
        *history, follow = row["messages"]
        assert history == next(v["messages"] for v in val if v["id"] == row["id"]) and follow["role"] == "user"
        name = ".".join(x for x in (row["meta"].get("module"), row["meta"].get("qualname")) if x)
        assert follow["content"] in {f.format(name=name) for f in FOLLOW_UPS}
    held_out = tmp_path / "test.jsonl"
    held_out.write_text("".join(json.dumps(r) + "\n" for r in val[:8]))
    prompts, sets = recipes.prompt_sets(str(held_out), 8, 2, str(out), 4)
    assert sets == {"held_out": range(0, 8), "humaneval": range(8, 10), "multi_turn": range(10, 14)}
    assert [m["role"] for m in prompts[10]["messages"]] == ["user", "assistant", "user"]
    assert recipes.prompt_sets(str(held_out), 8, 2)[1] == {"held_out": range(0, 8), "humaneval": range(8, 10)}
    with pytest.raises(InputError, match="4 multi-turn prompts asked for, but no multi-turn file given"):
        recipes.prompt_sets(str(held_out), 8, 0, None, 4)
    with pytest.raises(InputError, match="64 prompts, fewer than 65"):
        recipes.prompt_sets(str(held_out), 8, 0, str(out), 65)


def test_core_acceptance_se_is_the_bootstrap_spread_over_requests():
    from draftlab.core.acceptance import acceptance_se

    assert acceptance_se([10], [5]) is None  # one request: no spread
    assert acceptance_se([10, 10, 10], [5, 5, 5]) == 0.0
    wide, narrow = acceptance_se([30, 10] * 8, [10, 10] * 8), acceptance_se([30, 10] * 64, [10, 10] * 64)
    assert 0 < narrow < wide and narrow == pytest.approx(wide / 8**0.5, rel=0.25)  # ~1/sqrt(requests): 16 vs 128


def test_size_curve_fits_the_data_size_rows_sglang_acceptance(tmp_path):
    from studies.recipes.size_curve import sglang_size_curve, size_curve_lines, write_size_curve

    study = tmp_path / "study"
    (study / "sglang" / "outputs").mkdir(parents=True)
    sizes = {"n1351": 1351, "n2702": 2702, "n5403": 5403, "n10806": 10806, "base": 21612}
    served_rows = [*sizes, "fcnorm", "epochs10"]
    entries = recipes.row_entries(served_rows, study, "/m", steps=6, concurrency=[16], port=32000)
    plan = {
        "steps": 6,
        "sets": {"held_out": [0, 8], "humaneval": [8, 9]},
        "concurrency": [16],
        "entries": [e.__dict__ for e in entries],
    }
    (study / "sglang" / "plan.json").write_text(json.dumps(plan))
    for k, row in enumerate(served_rows):
        target = 4.0 - 2.0 * (1351 * 2**k / 1000) ** -0.5  # a saturating truth, 8 prompts each, some spread
        append_jsonl(
            study / "sglang" / "outputs" / f"{slug(row)}.jsonl",
            [
                {
                    "index": i,
                    "output_ids": [],
                    "completion_tokens": round(10 * target) + (i % 3) - 1,
                    "spec_verify_ct": 10,
                }
                for i in range(9)
            ],
        )
        (study / row / "train").mkdir(parents=True)
        (study / row / "train" / "summary.json").write_text(
            json.dumps(
                {
                    "train_stats": {"kept": sizes.get(row, 21612)},
                    "elapsed_total_s": 60.0 * 2**k,
                    "tokens_per_s": 1.0,
                    "total_steps": 10 * 2**k,
                }
            )
        )
    regeneration = {"tok_s": 48000.0, "mean_completion_tokens": 240.0}
    got, figs = write_size_curve(recipes.combined_table([study]), tmp_path / "curve", regeneration)
    assert set(figs) == {"sglang_acceptance_vs_data", "sglang_data_or_passes"}
    assert [p["row"] for p in got["points"]] == list(sizes)  # fcnorm changes the recipe: not a size point
    assert [(p["row"], p["n"], p["epochs"], p["steps"]) for p in got["passes"]] == [("epochs10", 21612, 10.0, 640)]
    assert [p["n"] for p in got["points"]] == list(sizes.values())
    assert all(p["sglang_acceptance_se"] > 0 and p["prompts"] == 8 for p in got["points"])
    extra = got["extrapolation"]["eagle3"]
    assert extra["n_new"] == 216120 and extra["measured_now"] == got["points"][-1]["sglang_acceptance"]
    assert extra["regeneration_hours"] == pytest.approx((216120 - 21612) * 240 / 48000 / 3600)
    assert extra["training_hours_at_new_size"] == pytest.approx(960 / 21612 * 216120 / 3600)
    assert extra["loglinear"]["ok"] and extra["saturating"]["ok"]
    assert extra["saturating"]["pred_new"] < extra["loglinear"]["pred_new"]  # it bends, log-linear does not
    assert json.loads((tmp_path / "curve" / "size_curve.json").read_text())["points"] == got["points"]
    assert (tmp_path / "curve" / "size_curve.png").is_file() and (tmp_path / "curve" / "data_or_passes.png").is_file()
    lines = size_curve_lines(got)
    assert lines[0].startswith("n1351: 1,351 conversations -> ")
    assert any(line.startswith("saturating: ") for line in lines)
    assert extra["logistic"]["ok"] and got["fits"]["eagle3"]["logistic"]["ceiling"] == 7.0  # the plan's S = 6
    assert any(line.startswith("logistic: ") for line in lines) and extra["logistic"]["band_new"][1] < 7.0
    check = got["last_point_from_the_rest"]  # the largest point predicted by fits without it
    assert (check["row"], check["measured"]) == (got["points"][-1]["row"], got["points"][-1]["sglang_acceptance"])
    assert check["loglinear"]["ok"] and check["loglinear"]["band"][0] < check["loglinear"]["pred"]
    assert any(line.startswith(f"loglinear without {check['row']}: ") for line in lines)
    base = got["points"][-1]["sglang_acceptance"]
    assert lines[5].startswith("epochs10: 21,612 conversations x 10 epochs (640 steps) -> ")
    assert lines[5].endswith(f"; base, the same conversations x 5 epochs (160 steps): {base:.2f}")
    assert lines[-1].startswith(f"the extra 194,508 conversations: {extra['regeneration_hours']:.2f} h")
    # the passes read as fresh conversations: epochs10 (measured) at 21,612 x 10 / 5, epochs20 (planned) at x 20 / 5
    epochs10, epochs20 = got["passes_as_data"]
    assert (epochs10["row"], epochs10["n_as_data"], epochs10["measured"]) == (
        "epochs10",
        43224,
        got["passes"][0]["sglang_acceptance"],
    )
    assert (epochs20["row"], epochs20["n_as_data"], epochs20["measured"]) == ("epochs20", 86448, None)
    fit = got["extrapolation"]["eagle3"]["loglinear"]
    assert epochs20["loglinear"]["pred"] == pytest.approx(fit["params"][0] + fit["params"][1] * math.log10(86448))
    assert epochs20["loglinear"]["band"][0] < epochs20["loglinear"]["pred"] < epochs20["loglinear"]["band"][1]
    assert any(
        line.startswith("epochs20 read as 86,448 conversations: loglinear ") and line.endswith("not measured")
        for line in lines
    )
    assert any(line.startswith("epochs10 read as 43,224 conversations: ") and "; measured " in line for line in lines)
    assert sglang_size_curve([], tmp_path / "none", regeneration) == (None, {})


def test_passes_are_not_read_as_data_when_the_size_rows_ran_different_epochs():
    from studies.recipes.size_curve import passes_as_data

    points = [{"row": "n1351", "n": 1351, "epochs": 5.0}, {"row": "base", "n": 21612, "epochs": 10.0}]
    assert passes_as_data({}, points, []) == []
    assert [p["n_as_data"] for p in passes_as_data({}, points[1:], [])] == [21612 * 20 / 10]  # epochs20 on base


def test_size_curve_warns_when_its_points_were_read_at_different_batches():
    from studies.recipes.size_curve import size_curve_lines

    point = {
        "row": "n1351",
        "n": 1351,
        "sglang_acceptance": 1.4,
        "sglang_acceptance_se": 0.02,
        "prompts": 64,
        "train_s": 60.0,
    }
    result = {"points": [{**point, "concurrency": 1}, {**point, "row": "base", "concurrency": 16}], "extrapolation": {}}
    assert any(
        line.startswith("WARNING: the points' acceptance was read at different batches ([1, 16])")
        for line in size_curve_lines(result)
    )
    result["points"][1]["concurrency"] = 1
    assert not any(line.startswith("WARNING") for line in size_curve_lines(result))


def test_the_best_recipe_on_twice_the_data_grows_its_own_train_file():
    cfg = recipe_rows.recipe("best-data2x")
    assert cfg["fc_norm"] == "per_layer" and cfg["lr"] == 1e-3 and cfg["epochs"] == recipe_rows.BASE["epochs"]
    assert recipe_rows.row_train_file("best-data2x", "/s/data/train.jsonl") == "/s/data/train-data2x.jsonl"
    assert recipe_rows.EXTRA_ROWS["best-data2x"] == recipe_rows.EXTRA_ROWS["data2x"]


def test_the_broad_row_is_the_best_recipe_on_its_data_and_the_broad_prompts():
    broad, best = recipe_rows.recipe("best-broad"), recipe_rows.recipe("best-data2x")
    assert {k: v for k, v in broad.items() if k != "train_file"} == {k: v for k, v in best.items() if k != "train_file"}
    assert recipe_rows.EXTRA_ROWS["best-broad"] == (*recipe_rows.EXTRA_ROWS["best-data2x"], ("broad", 21612))
