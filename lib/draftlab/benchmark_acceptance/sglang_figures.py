"""Figures of a `draftlab bench sglang` study beside the engine's oracle rows, drawn from the files alone.

Why a module of its own: the study runs on a GPU, but its figures are read where the results are
(a laptop, CI, a reviewer's checkout); `draftlab bench sglang --summary-only --figures` draws them
from RUN/sglang/ into RUN/figures/ without SGLang or a GPU. Speeds are medians of the windows (one
window slowed by a neighbour or a late kernel compile moves a mean, not a median); the bars span the
slowest and fastest window.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftlab.benchmark_acceptance.breakeven import check, fit_from_runs
from draftlab.benchmark_acceptance.sglang_live import fit_server_costs, plot_breakeven_beside, read_windows, summarize

__all__ = ["engine_chain_rows", "draw_study_figures"]


def engine_chain_rows(sglang_dir: Path) -> list[dict]:
    """The engine's EAGLE3 chain rows (topk 1) of RUN/sglang/oracle_*.json, by chain length."""
    rows = []
    for path in sorted(Path(sglang_dir).glob("oracle_*.json")):
        rows += [r for r in json.loads(path.read_text()) if r["mode"] == "EAGLE3" and r["topk"] == 1]
    return sorted(rows, key=lambda r: r["num_steps"])


def _by_concurrency(study: Path, table, ax) -> None:
    """Output tok/s against concurrency for the servers measured at more than batch 1."""
    windows = read_windows(study)
    for label in dict.fromkeys(table["label"]):
        rows = table[table.label == label].sort_values("concurrency")
        if len(rows) < 2:
            continue
        lo = [
            min(w["tokens_per_s"] for w in windows if w["label"] == label and w["concurrency"] == c)
            for c in rows.concurrency
        ]
        hi = [
            max(w["tokens_per_s"] for w in windows if w["label"] == label and w["concurrency"] == c)
            for c in rows.concurrency
        ]
        med = rows.tokens_per_s_median.tolist()
        ax.errorbar(
            rows.concurrency,
            med,
            yerr=[[m - a for m, a in zip(med, lo)], [b - m for m, b in zip(med, hi)]],
            marker="o",
            capsize=3,
            label=label,
        )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("concurrent requests")
    ax.set_ylabel("output tok/s (median window; bars: slowest to fastest)")
    ax.legend(fontsize=7)


def _acceptance_by_steps(sglang_dir: Path, table, ax) -> None:
    """Acceptance of the chain at S = 1..7: SGLang's meta_info beside the engine on the same prompt ids."""
    chain = table[(table.concurrency == 1) & (table.algorithm == "EAGLE3") & (table.topk == 1)].sort_values("steps")
    ax.plot(chain.steps, chain.acceptance_length, marker="o", label="SGLang (meta_info, batch 1)")
    engine = engine_chain_rows(sglang_dir)
    if engine:
        ax.plot(
            [r["num_steps"] for r in engine],
            [r["acceptance_length"] for r in engine],
            marker="x",
            ls="--",
            label=f"draftlab engine ({engine[0]['samples']} prompts, {engine[0].get('dtype')})",
        )
    for r in table[(table.concurrency == 1) & (table.topk > 1)].itertuples():
        ax.scatter([r.steps], [r.acceptance_length], marker="^", zorder=3)
        ax.annotate(
            f"tree {int(r.steps)}x{int(r.topk)}x{int(r.draft_tokens)}",
            (r.steps, r.acceptance_length),
            fontsize=7,
            xytext=(4, 2),
            textcoords="offset points",
        )
    ax.set_xlabel("draft steps S")
    ax.set_ylabel("acceptance length (tokens per verify)")
    ax.legend(fontsize=7)


def draw_study_figures(run: str | Path, steps: int = 6) -> list[Path]:
    """RUN/figures/sglang_*.png from RUN/sglang/study and the oracle rows; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # a command, not a notebook: files only
    import matplotlib.pyplot as plt

    run = Path(run)
    sglang_dir, study = run / "sglang", run / "sglang" / "study"
    table = summarize(study)
    figures = run / "figures"
    figures.mkdir(parents=True, exist_ok=True)
    written = []

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    _by_concurrency(study, table, ax)
    ax.set_title("SGLang: output tok/s by concurrency (same prompt ids, equal --max-running-requests)", fontsize=9)
    written.append(figures / "sglang_tok_s_by_concurrency.png")

    fig2, ax2 = plt.subplots(figsize=(6.5, 4.2))
    _acceptance_by_steps(sglang_dir, table, ax2)
    ax2.set_title("acceptance length: SGLang vs the engine's oracle", fontsize=9)
    written.append(figures / "sglang_acceptance_by_steps.png")

    server_model, server_rates = fit_server_costs(study)
    engine_rows = engine_chain_rows(sglang_dir)
    engine_model = fit_from_runs(engine_rows) if len({r["num_steps"] for r in engine_rows}) > 1 else None
    engine_checks = check(engine_rows, engine_model) if engine_model else []
    fig3 = plot_breakeven_beside(engine_model, engine_checks, server_model, server_rates, steps)
    written.append(figures / "sglang_breakeven_engine_vs_sglang.png")

    for f, path in zip((fig, fig2, fig3), written):
        f.tight_layout()
        f.savefig(path, dpi=110)
        plt.close(f)
    return written
