"""README.md's results block is what the published run's summary.json says (issue 20.4): rendered by
`make readme` (draftlab.run.published), never typed; SGLang's figures, when a run has them, are shown
apart and labelled as SGLang's."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from draftlab.run import published

ROOT = Path(__file__).parents[1]


def test_readme_block_agrees_with_the_published_summary():
    new, changed = published.update(ROOT / "README.md")
    assert not changed, f"README.md's results block of {changed} is not what summary.json gives: run `make readme`"
    assert published.main(["--check", str(ROOT / "README.md")]) == 0


def test_every_headline_number_is_in_the_summary_and_every_figure_exists():
    text = (ROOT / "README.md").read_text()
    m = next((b for b in published.BLOCK.finditer(text) if b.group("run") == "results/reference"), None)
    assert m and m.group("run") == "results/reference"
    summary = json.loads((ROOT / m.group("run") / "summary.json").read_text())
    assert published.fmt("speedup_batch1", summary["speedup_batch1"]) in m.group("body")
    for link in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", m.group("body")):
        assert (ROOT / link).is_file(), link
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
