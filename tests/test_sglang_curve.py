"""Notebook 07's SGLang size curve is read as data: the recipe study's size_curve.json, not its code."""

import json

import pytest

from draftlab import data_scaling as scaling
from draftlab.core.errors import InputError

RECORD = "results/recipes/size-curve/size_curve.json"


def test_the_committed_size_curve_reads_back_as_its_lines_and_two_figures(capsys):
    result, figs = scaling.read_size_curve(RECORD)
    printed = capsys.readouterr().out
    assert [p["row"] for p in result["points"]] == ["n1351", "n2702", "n5403", "n10806", "base", "data2x-5ep"]
    assert "data2x-5ep: 43,224 conversations -> 3.74" in printed
    assert "epochs20 read as 86,448 conversations" in printed and "not measured" in printed
    assert sorted(figs) == ["sglang_acceptance_vs_data", "sglang_data_or_passes"]


def test_no_record_skips_the_curve_and_a_wrong_file_is_one_line(tmp_path, capsys):
    assert scaling.read_size_curve("") == (None, {})
    assert "skipped" in capsys.readouterr().out
    with pytest.raises(InputError, match="SGLANG_SIZE_CURVE: .*nope.json: no such file"):
        scaling.read_size_curve(str(tmp_path / "nope.json"))
    other = tmp_path / "metrics.json"
    other.write_text(json.dumps({"points": []}))
    with pytest.raises(InputError, match="not a size curve"):
        scaling.read_size_curve(str(other))


def test_an_empty_curve_has_no_figures():
    assert scaling.size_curve_figures({"points": [], "passes": []}) == {}
    assert scaling.size_curve_lines({"points": [], "extrapolation": {}})[0].startswith("no data-size row")
