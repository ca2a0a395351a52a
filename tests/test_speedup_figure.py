"""The speedup-by-chain figure of notebook 06 (and README.md): trees apart from chains, and every run
whose outputs were not all identical to greedy drawn hollow in red and labelled k/n (issue 20.4)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

from draftlab.benchmark_acceptance import report
from helpers_lab import png_text

matplotlib.use("Agg")

ROOT = Path(__file__).parents[1]


def row(S, K, D, speedup, same, n=16, dtype="bfloat16", arch="eagle3"):
    """A metrics.json table row, as 06 records it."""
    return {
        "eval_set": "blend",
        "arch": arch,
        "mode": "EAGLE3",
        "dtype": dtype,
        "samples": n,
        "S": S,
        "K": K,
        "D": D,
        "speedup": speedup,
        "lossless": f"{same}/{n}",
    }


def drawn(ax):
    """(x, y, facecolor, edgecolor) of every drawn point."""
    out = []
    for c in ax.collections:
        for (x, y), face, edge in zip(c.get_offsets(), c.get_facecolors(), c.get_edgecolors()):
            out.append((float(x), float(y), tuple(face), tuple(edge)))
    return out


def test_a_run_that_is_not_lossless_is_hollow_red_and_labelled():
    import matplotlib.colors as mcolors

    rows = [
        row(3, 1, 4, 1.43, 16),
        row(4, 1, 5, 1.44, 16),
        row(6, 1, 7, 1.35, 16),
        row(6, 8, 64, 1.52, 3, arch="eagle3 tree K=8 D=64"),
        row(7, 1, 8, 1.30, 12),
    ]
    fig = report.plot_speedup_by_chain(rows)
    ax = fig.axes[0]
    chain = [line for line in ax.lines if line.get_label().startswith("eagle3 chain")]
    assert len(chain) == 1 and list(chain[0].get_xdata()) == [3, 4, 6, 7]  # the tree is not on the chain's line
    points = {(x, y): (face, edge) for x, y, face, edge in drawn(ax)}
    white, red = mcolors.to_rgba("white"), mcolors.to_rgba("tab:red")
    for xy in ((6, 1.52), (7, 1.30)):
        assert points[xy] == (white, red), xy
    for xy in ((3, 1.43), (4, 1.44), (6, 1.35)):
        assert points[xy][0] != white, xy
    assert sorted(t.get_text() for t in ax.texts) == ["12/16", "3/16"]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert report.NOT_LOSSLESS in labels and "eagle3 tree K=8 D=64 at S=6 (bfloat16)" in labels


def test_all_lossless_has_no_not_lossless_entry():
    fig = report.plot_speedup_by_chain([row(1, 1, 2, 1.1, 16), row(2, 1, 3, 1.2, 16)])
    assert report.NOT_LOSSLESS not in [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert not fig.axes[0].texts


def test_the_readme_figure_is_drawn_from_the_published_runs_metrics():
    """results/reference/figures/readme/06_speedup_by_chain.png carries the sha256 of the rows it drew:
    those of metrics.json now (`make readme` redraws it)."""
    run = ROOT / "results" / "reference"
    rows = report.speedup_rows(json.loads((run / "metrics.json").read_text())["06_benchmark_acceptance"])
    marks = {r["lossless"] for r in rows}
    assert "16/16" in marks and any(k != n for k, n in (m.split("/") for m in marks))  # lossless and not, both drawn
    assert png_text(run / report.README_FIGURE).get("draftlab:rows_sha256") == report.rows_digest(rows)


def test_engine_rows_are_read_too():
    """Notebook 06 passes engine.public rows (num_steps, topk, identical_outputs), not table rows."""
    r = {
        "eval_set": "blend",
        "arch": "eagle3",
        "dtype": "float32",
        "samples": 2,
        "num_steps": 3,
        "topk": 1,
        "num_draft_tokens": 4,
        "speedup": 1.2,
        "identical_outputs": 1,
    }
    assert report.run_point(r) == (3, 1, 4, 1.2, 1, 2)
    fig = report.plot_speedup_by_chain([r])
    assert [t.get_text() for t in fig.axes[0].texts] == ["1/2"]


def test_engine_vs_sglang_compares_each_run_with_the_model_at_its_own_chain_length():
    """Every measured run is a dot against the model at its own S (not a line for one S against dots of all),
    labelled with S (and top-k or the wrong flag), the largest miss in the legend."""
    from draftlab.benchmark_acceptance.breakeven import CostModel
    from draftlab.benchmark_acceptance.sglang_figures import plot_predicted_vs_measured

    engine = CostModel(1.0, 0.1)
    checks = [
        {"steps": s, "measured_speedup": m, "predicted_speedup": p, "held_out": True}
        for s, m, p in [(1, 1.5, 1.53), (3, 1.9, 1.91), (6, 1.9, 1.95)]
    ]
    server = CostModel(2.9, 0.01)
    rates = [
        {"steps": 6, "topk": 1, "algorithm": "EAGLE3", "measured_speedup": 0.98, "predicted_speedup": 0.97},
        {"steps": 6, "topk": 8, "algorithm": "EAGLE3", "measured_speedup": 0.98, "predicted_speedup": 1.26},
        {"steps": 6, "topk": 1, "algorithm": "EAGLE", "measured_speedup": 0.43, "predicted_speedup": 0.35},
    ]
    fig = plot_predicted_vs_measured(engine, checks, server, rates)
    ax = fig.axes[0]
    assert sum(len(c.get_offsets()) for c in ax.collections) == 6  # one dot per run
    assert sorted(t.get_text() for t in ax.texts) == sorted(["S=1", "S=3", "S=6", "S=6", "S=6 topk 8", "S=6 EAGLE"])
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend[0].endswith("held-out, largest miss +3% at S=6")
    assert legend[1].endswith("chains in-sample, largest miss +29% at S=6")
