"""recipes calibrate: SGLang acceptance against the training's validation, and estimates for unmeasured rows."""

import json

import numpy as np
import pandas as pd
import pytest

from draftlab.core.errors import InputError
from studies.recipes import calibration as cal
from studies.recipes.cli import build_parser

ROWS = ["base", "fcnorm", "lr1e-3", "hardce", "vocab32k", "n1351", "n2702", "n5403"]
SIMS = [3.9, 4.7, 4.6, 3.8, 3.95, 1.5, 1.8, 2.0]
NOISE = [0.02, -0.03, 0.01, -0.02, 0.03, -0.01, 0.02, -0.02]


def table(tmp_path, with_ttt3=True):
    rows = [
        {
            "row": r,
            "val_sim_acceptance": x,
            "sglang_acceptance_held_out": 0.5 + 0.7 * x + e,
            "sglang_acceptance_humaneval": 0.8 + 0.4 * x - e,
        }
        for r, x, e in zip(ROWS, SIMS, NOISE)
    ]
    if with_ttt3:  # its validation simulates 3 steps: off the line, and must not pull it
        rows.append(
            {
                "row": "ttt3",
                "val_sim_acceptance": 3.0,
                "sglang_acceptance_held_out": 3.1,
                "sglang_acceptance_humaneval": 2.5,
            }
        )
    rows.append(
        {
            "row": "eagle1",
            "val_sim_acceptance": 3.1,
            "sglang_acceptance_held_out": None,
            "sglang_acceptance_humaneval": None,
        }
    )  # trained, not measured: not in the fit
    path = tmp_path / "table.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def summary(tmp_path, row, **fields):
    train = tmp_path / row / "train"
    train.mkdir(parents=True)
    (train / "summary.json").write_text(json.dumps(fields))
    return train


def test_the_line_comes_from_the_measured_rows_of_the_same_depth(tmp_path):
    lines, left_out = cal.fit_lines(pd.read_csv(table(tmp_path)))
    held = lines["held_out"]
    assert held.slope == pytest.approx(0.7, abs=0.02) and held.intercept == pytest.approx(0.5, abs=0.08)
    assert "ttt3" in left_out and "ttt3" not in held.rows and "eagle1" not in held.rows
    assert held.r > 0.99 and 0.01 < held.residual_sd < 0.04
    # leave-one-out misses are larger than the in-fit residuals, never smaller
    assert held.leave_one_out_rmse >= held.residual_sd * np.sqrt((len(ROWS) - 2) / len(ROWS))
    # the same fit without ttt3 in the table: identical
    again, _ = cal.fit_lines(pd.read_csv(table(tmp_path, with_ttt3=False)))
    assert again["held_out"].slope == pytest.approx(held.slope)


def test_an_estimate_has_an_interval_that_widens_away_from_the_rows(tmp_path):
    held = cal.fit_lines(pd.read_csv(table(tmp_path)))[0]["held_out"]
    y, low, high = held.predict(3.5)
    assert y == pytest.approx(held.intercept + held.slope * 3.5) and low < y < high
    _, far_low, far_high = held.predict(6.0)
    assert far_high - far_low > high - low
    assert held.inside(3.5) and not held.inside(6.0)


def test_calibrate_writes_the_estimate_of_a_cut_row_named_as_predicted(tmp_path):
    train = summary(
        tmp_path, "epochs10", steps=4509, total_steps=5012, finished=False, eval={"step": 4500, "sim_accept_len": 4.85}
    )
    result = cal.calibrate(table(tmp_path), {"epochs10": train}, tmp_path / "out")
    held = next(e for e in result["estimates"] if e["prompts"] == "held_out")
    assert held["predicted"] == pytest.approx(0.5 + 0.7 * 4.85, abs=0.05)
    assert held["low_95"] < held["predicted"] < held["high_95"]
    assert held["steps"] == 4509 and held["finished"] is False and held["inside_fitted_range"] is False
    assert "not measured" in result["note"]
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"calibration.json", "calibration.csv", "calibration.png"}
    csv = pd.read_csv(tmp_path / "out" / "calibration.csv")
    assert set(csv.loc[~csv["in_fit"], "row"]) == {"ttt3", "eagle1"}


def test_bad_inputs_name_the_file_and_field(tmp_path):
    no_eval = summary(tmp_path, "lr-const", steps=100, total_steps=2505, finished=False)
    with pytest.raises(InputError, match=r"summary.json: field eval.sim_accept_len missing"):
        cal.calibrate(table(tmp_path), {"lr-const": no_eval}, tmp_path / "out")
    with pytest.raises(InputError, match="ttt3 cannot be estimated: its validation simulates 3 steps"):
        cal.calibrate(table(tmp_path), {"ttt3": no_eval}, tmp_path / "out")
    (no_eval / "summary.json").write_text("{torn")
    with pytest.raises(InputError, match=r"summary.json: not JSON"):
        cal.calibrate(table(tmp_path), {"lr-const": no_eval}, tmp_path / "out")
    with pytest.raises(InputError, match=r"nowhere.csv: missing"):
        cal.calibrate(tmp_path / "nowhere.csv", {}, tmp_path / "out")
    bare = tmp_path / "bare.csv"
    pd.DataFrame([{"row": "base"}]).to_csv(bare, index=False)
    with pytest.raises(InputError, match="no column 'val_sim_acceptance'"):
        cal.calibrate(bare, {}, tmp_path / "out")
    few = tmp_path / "few.csv"
    pd.read_csv(table(tmp_path)).head(3).to_csv(few, index=False)
    with pytest.raises(InputError, match="3 rows with val_sim_acceptance"):
        cal.calibrate(few, {}, tmp_path / "out")


def test_the_cli_prints_the_line_and_the_estimate(tmp_path, capsys):
    train = summary(
        tmp_path, "epochs10", steps=5012, total_steps=5012, finished=True, eval={"step": 5012, "sim_accept_len": 4.2}
    )
    argv = [
        "calibrate",
        "--table",
        str(table(tmp_path)),
        "--predict",
        f"epochs10={train}",
        "--out",
        str(tmp_path / "out"),
    ]
    args = build_parser().parse_args(argv)
    assert args.func(args) == 0
    printed = capsys.readouterr().out
    assert (
        "held_out: sglang = " in printed and "epochs10 held_out: predicted" in printed and "(not measured)" in printed
    )
    argv[4] = "epochs10"
    args = build_parser().parse_args(argv)
    with pytest.raises(InputError, match="expected ROW=TRAIN_DIR"):
        args.func(args)
