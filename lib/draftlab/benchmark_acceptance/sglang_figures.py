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

from draftlab.benchmark_acceptance.breakeven import as_dict, fit_or_refuse
from draftlab.benchmark_acceptance.report import figure_run
from draftlab.benchmark_acceptance.sglang_live import fit_server_costs, read_windows, summarize
from draftlab.core.run_folder import RunFolder
from draftlab.run.notebook import finish_figure

__all__ = ["engine_chain_rows", "draw_study_figures", "engine_vs_sglang", "plot_predicted_vs_measured"]


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
    ax.legend()


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
            xytext=(4, 2),
            textcoords="offset points",
        )
    ax.set_xlabel("draft steps S")
    ax.set_ylabel("acceptance length (tokens per verify)")
    ax.legend()


def run_label(r: dict) -> str:
    """S, plus the tree's top-k or an algorithm other than EAGLE3 (the wrong flag) where a run has them."""
    topk, algorithm = r.get("topk") or 1, r.get("algorithm")
    return (
        f"S={r['steps']}"
        + (f" topk {topk}" if topk > 1 else "")
        + (f" {algorithm}" if algorithm not in (None, "EAGLE3") else "")
    )


def plot_predicted_vs_measured(engine_model, engine_checks: list, server_model, server_rates: list):
    """Each measured run against the break-even model at its own chain length: predicted speedup over the
    measured one, the diagonal where they agree, each dot labelled with its S, the largest miss in the legend.
    (One curve for one S drawn against the dots of every S compared each run with a model it was not.)
    The engine's predictions are held out (each S from the fit of the others) when its checks are; SGLang's
    are in-sample (its fit of these chain runs)."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.0, 5.0))
    values = []
    for name, model, points in (("engine", engine_model, engine_checks), ("SGLang", server_model, server_rates)):
        pts = [r for r in points if r.get("measured_speedup") and r.get("predicted_speedup") is not None]
        if model is None or not pts:
            continue
        held = all(r.get("held_out") for r in pts)
        miss = max(pts, key=lambda r: abs(r["predicted_speedup"] / r["measured_speedup"] - 1))
        err = miss["predicted_speedup"] / miss["measured_speedup"] - 1
        label = (
            f"{name}: v={model.verify_cost:.2f}, c={model.draft_cost:.3f}; "
            f"{'held-out' if held else 'chains in-sample'}, largest miss {err:+.0%} at S={miss['steps']}"
        )
        dots = ax.scatter([r["measured_speedup"] for r in pts], [r["predicted_speedup"] for r in pts], label=label)
        for r in pts:
            ax.annotate(
                run_label(r),
                (r["measured_speedup"], r["predicted_speedup"]),
                textcoords="offset points",
                xytext=(4, 3),
                color=dots.get_facecolor()[0],
            )
        values += [r["measured_speedup"] for r in pts] + [r["predicted_speedup"] for r in pts]
    if values:
        lo, hi = min(values) * 0.9, max(values) * 1.1
        ax.plot([lo, hi], [lo, hi], color="grey", lw=0.8, ls="--", label="prediction = measurement")
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.14))  # below the axes: no dot hidden
    ax.set_xlabel("measured speedup over the same engine's plain decoding")
    ax.set_ylabel("break-even model's prediction at the run's own S and L")
    ax.set_title("break-even model against every measured run, engine and SGLang")
    return fig


def sglang_source(study: Path) -> str:
    """'SGLang <version> (<study folder>)': the version RUN/sglang/version.txt recorded on the GPU, if any."""
    version = Path(study).parent / "version.txt"
    name = f"SGLang {version.read_text().strip()}" if version.is_file() else "SGLang (version not recorded)"
    return f"{name}, study {'/'.join(Path(study).parts[-3:])}"


def engine_vs_sglang(study: Path, engine_model, engine_checks: list):
    """(SGLang's fitted model with its rates, the predicted-vs-measured figure beside the engine's);
    (None, None) when `study` holds no windows."""
    if not (Path(study) / "windows.jsonl").is_file():
        return None, None
    server_model, server_rates = fit_server_costs(study)
    fig = plot_predicted_vs_measured(engine_model, engine_checks, server_model, server_rates)
    return {"model": as_dict(server_model), "rates": server_rates}, fig


def draw_study_figures(run: str | Path, steps: int = 6) -> list[Path]:
    """RUN/figures/sglang_*.png from RUN/sglang/study and the oracle rows; returns the files written."""
    import matplotlib

    matplotlib.use("Agg")  # a command, not a notebook: files only
    import matplotlib.pyplot as plt

    run = Path(run)
    sglang_dir, study = RunFolder(run).sglang, RunFolder(run).sglang_study
    table = summarize(study)
    figures = RunFolder(run).figures
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
    verdict = fit_or_refuse(engine_rows)  # the engine's model only where its held-out check holds
    fig3 = plot_predicted_vs_measured(verdict.model, verdict.checks, server_model, server_rates)
    written.append(figures / "sglang_breakeven_engine_vs_sglang.png")

    metrics = json.loads(RunFolder(run).metrics.read_text()) if RunFolder(run).metrics.is_file() else {}
    stamped = figure_run(run, metrics.get("06_benchmark_acceptance") or {})  # the run's target, profile, stamps
    for f, path in zip((fig, fig2, fig3), written):
        f.tight_layout()
        meta = finish_figure(stamped, f, source=sglang_source(study))
        f.savefig(path, dpi=110, bbox_inches="tight", metadata=meta)
        plt.close(f)
    return written
