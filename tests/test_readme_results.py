"""The results blocks are what their records say: README.md's headline (the best draft, from the recipe
study's combined table) and docs/results.md's block of the published run (its summary.json), rendered by
`make readme` (draftlab.run.published), never typed; SGLang's figures, when a run has them, are shown
apart and labelled as SGLang's."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest

from draftlab.run import published

ROOT = Path(__file__).parents[1]


DOCS = [ROOT / "README.md", ROOT / "docs" / "results.md"]


def test_every_block_agrees_with_its_record():
    for doc in DOCS:
        new, changed = published.update(doc)
        assert not changed, f"{doc.name}'s blocks {changed} are not what their records give: run `make readme`"
    assert published.main(["--check", *map(str, DOCS)]) == 0


def test_the_readme_headline_is_the_best_recipes_draft_beside_the_reference_recipes():
    """One headline draft: the row the best recipe file names, its base read in the same call."""
    text = (ROOT / "README.md").read_text()
    m = published.HEADLINE.search(text)
    assert m and m.group("row") in (ROOT / "recipes" / "eagle3-best.yaml").read_text()
    rows = {r["row"]: r for r in csv.DictReader((ROOT / m.group("table")).open())}
    best = rows[m.group("row")]
    held = float(best["sglang_acceptance_held_out"])
    assert f"**{held:.2f}**" in m.group("body") and f"| {held / float(best['gain_held_out']):.2f} |" in m.group("body")
    assert not published.BLOCK.search(text)  # the reference run's block lives in docs/results.md


def test_a_changed_table_makes_the_headline_check_fail(tmp_path):
    table = tmp_path / "results" / "table.csv"
    table.parent.mkdir()
    shutil.copy(ROOT / "results" / "recipes" / "combined" / "table.csv", table)
    doc = tmp_path / "README.md"
    doc.write_text("<!-- headline: results/table.csv best-data2x base -->\nstale\n<!-- /headline -->\n")
    assert published.main(["--check", str(doc)]) == 1
    assert published.main([str(doc)]) == 0 and published.main(["--check", str(doc)]) == 0
    table.write_text(table.read_text().replace("4.100458949515553", "4.5"))
    assert published.main(["--check", str(doc)]) == 1
    published.main([str(doc)])
    assert "**4.50**" in doc.read_text()


def test_every_headline_number_is_in_the_summary_and_every_figure_exists():
    doc = ROOT / "docs" / "results.md"
    text = doc.read_text()
    m = next((b for b in published.BLOCK.finditer(text) if b.group("run") == "../results/reference"), None)
    assert m
    summary = json.loads((doc.parent / m.group("run") / "summary.json").read_text())
    assert published.fmt("speedup_batch1", summary["speedup_batch1"]) in m.group("body")
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", m.group("body")):
        assert (doc.parent / link).is_file(), link
    outside = text[: m.start()] + text[m.end() :]
    for key in ("speedup_batch1", "eagle3_acceptance_s6_heldout"):  # no copy of a headline figure typed elsewhere
        assert published.fmt(key, summary[key]) not in outside, key


@pytest.fixture
def run_copy(tmp_path):
    rel = "results/reference"
    run = tmp_path / rel
    shutil.copytree(ROOT / rel, run, ignore=shutil.ignore_patterns("executed", "train", "*.log", "bench"))
    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n<!-- results: {rel} -->\nstale\n<!-- /results -->\n\nafter\n")
    return tmp_path, run, readme


def test_a_changed_summary_makes_the_check_fail_and_make_readme_fixes_it(run_copy):
    _, run, readme = run_copy
    assert published.main(["--check", str(readme)]) == 1  # "stale" is not the rendering
    assert published.main([str(readme)]) == 0 and published.main(["--check", str(readme)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    summary["speedup_batch1"] = 1.5
    (run / "summary.json").write_text(json.dumps(summary))
    assert published.main(["--check", str(readme)]) == 1
    published.main([str(readme)])
    assert "| 1.50x |" in readme.read_text() and readme.read_text().endswith("<!-- /results -->\n\nafter\n")


def test_sglang_figures_are_shown_with_their_sources_and_labelled_as_sglangs(run_copy):
    """What run.summary writes once `draftlab bench sglang` has measured a run (its keys merged flat)."""
    _, run, readme = run_copy
    summary = json.loads((run / "summary.json").read_text())
    summary.update(
        {
            "sglang_version": "0.5.17",
            "sglang_speedup_batch1": 1.31,
            "sglang_speedup_c16": None,
            "engine_vs_sglang_acceptance_gap": 0.012,
            "sglang_new_figure": 7.5,
        }
    )
    summary["sources"].update(
        {
            "sglang_version": "sglang/version.txt",
            "sglang_speedup_batch1": "study S=3 c=1",
            "engine_vs_sglang_acceptance_gap": "oracle_chain.json",
            "sglang_new_figure": "study",
        }
    )
    summary["sources"].pop("sglang_speedup_c16", None)  # not measured: no source either
    (run / "summary.json").write_text(json.dumps(summary))
    (run / "figures" / "06_benchmark_acceptance_breakeven_engine_vs_sglang.png").write_bytes(b"png")
    published.main([str(readme)])
    body = published.BLOCK.search(readme.read_text()).group("body")
    engine, sglang = body.split("**In SGLang**")
    assert "**In draftlab's reference engine**" in engine and "| SGLang" not in engine and "sglang_" not in engine
    assert "| SGLang batch-1 speedup over its own plain decoding | 1.31x | study S=3 c=1 |" in sglang
    assert "| SGLang speedup at concurrency 16 | not measured | - |" in sglang
    assert "| largest engine-vs-SGLang acceptance gap, same prompts | 1.2% | oracle_chain.json |" in sglang
    assert "| `sglang_new_figure` | 7.50 | study |" in sglang  # a key added later still shows, with its source
    assert "(SGLang, measured by `draftlab bench sglang`)" in body and "(reference engine)" in body


def test_the_projection_block_is_the_cost_models_and_says_so(tmp_path):
    """A projection on another shape is labelled a cost-model projection, with its GPU and the check beside it;
    a changed summary makes the check fail and `make readme` fixes it."""
    summary = {
        "shapes": [{"name": "big", "parameters": 8.03e9, "gpu": "NVIDIA H100 80GB HBM3"}],
        "projection": [
            {
                "shape": "big",
                "batch": b,
                "setting": "chain6",
                "acceptance": 4.1,
                "speedup": s,
                "points": 3,
                "measured_up_to": 7.0,
                "within_measured": True,
            }
            for b, s in ((4, 2.31), (1, 2.52))
        ],
        "embedded_predicted_speedup": 1.8,
        "embedded_measured_speedup": 1.7,
        "embedded_prediction_error": 0.0588,
    }
    path = tmp_path / "cost" / "summary.json"
    path.parent.mkdir()
    path.write_text(json.dumps(summary))
    doc = tmp_path / "README.md"
    doc.write_text("<!-- projection: cost/summary.json big -->\nstale\n<!-- /projection -->\n")
    assert published.main(["--check", str(doc)]) == 1
    assert published.main([str(doc)]) == 0 and published.main(["--check", str(doc)]) == 0
    body = doc.read_text()
    assert "cost-model projection" in body and "NVIDIA H100 80GB HBM3" in body and "8.0B parameters" in body
    assert "| batch | 1 | 4 |" in body and "| 2.52x | 2.31x |" in body and "error +5.9%" in body
    assert "fitted through 3 forced acceptances." in body and "nothing checks" not in body
    two = [{**p, "points": 2, "measured_up_to": 3.99, "within_measured": False} for p in summary["projection"]]
    path.write_text(json.dumps({**summary, "projection": two}))
    assert published.main(["--check", str(doc)]) == 1
    published.main([str(doc)])
    assert "(two: a line nothing checks), 0.11 beyond the highest measured (3.99)" in doc.read_text()
    doc.write_text("<!-- projection: cost/summary.json other -->\n<!-- /projection -->\n")
    with pytest.raises(SystemExit, match="no projection for shape 'other'"):
        published.main([str(doc)])
