"""Figures, tables, printed notes, findings and metrics of notebook 07."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from draftlab.data_scaling.fits import MODELS, refusal
from draftlab.data_scaling.plan import ARCHS


# ---------------------------------------------------------------------------------- figures
def errorbars_95(ax, x: list, points: list[dict], metric: str, **style) -> None:
    """Each point's `metric` at x with its 95% bar (1.96 x its `metric`_se, none when unknown)."""
    ax.errorbar(
        x, [p[metric] for p in points], yerr=[1.96 * (p.get(metric + "_se") or 0) for p in points], capsize=3, **style
    )


def plot_scaling(
    results: list[dict], fits: dict, factor: float = 10.0, goal: float | None = None, metric: str = "sim_accept_len"
):
    """Acceptance length vs training conversations (log x), both architectures, fits and 95% bands."""
    import matplotlib.pyplot as plt  # the kernel's inline backend in a notebook, Agg without a display

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    colors = {"eagle3": "tab:blue", "eagle1": "tab:orange"}
    labels = {"eagle3": "EAGLE-3 (3 layers + fc)", "eagle1": "EAGLE-1-style (final state)"}
    n_all = [r["n"] for r in results]
    if not n_all:
        ax.text(0.5, 0.5, "no finished subsets yet", ha="center", transform=ax.transAxes)
        return fig
    why_not = refusal(fits)
    if why_not:  # the points alone, at their own scale, and the one line that says why no curve is drawn
        factor = 1.0
    grid = np.geomspace(min(n_all), factor * max(n_all), 120)
    for arch in ARCHS:
        rows = sorted((r for r in results if r["arch"] == arch), key=lambda r: r["n"])
        if not rows:
            continue
        c = colors[arch]
        for src, marker in (("scaling", "o"), ("04", "s")):
            pts = [r for r in rows if r["source"] == src]
            if pts:
                errorbars_95(
                    ax,
                    [r["n"] for r in pts],
                    pts,
                    metric,
                    fmt=marker,
                    color=c,
                    label=f"{labels[arch]}" + (" (04 draft)" if src == "04" else ""),
                )
        chain = [r for r in rows if r.get("chain_acceptance_length")]
        if chain:
            ax.plot(
                [r["n"] for r in chain],
                [r["chain_acceptance_length"] for r in chain],
                "x",
                color=c,
                ms=8,
                label=f"{labels[arch]}: real chain S={len(chain[0]['chain_position_acceptance'])}",
            )
        for model, style in (("loglinear", "-"), ("saturating", "--"), ("logistic", ":")):
            fit = fits.get(arch, {}).get(model)
            if fit is None or not fit.ok:
                continue
            label = f"{arch} {model} fit" + (f" under a ceiling of {fit.ceiling:g}" if fit.ceiling else "")
            ax.plot(grid, fit.predict(grid), style, color=c, lw=1.2, alpha=0.9, label=label)
            lo, hi = fit.band(grid)
            ax.fill_between(grid, lo, hi, color=c, alpha=0.12 if model == "loglinear" else 0.06)
    if why_not:
        ax.text(0.0, -0.2, why_not, transform=ax.transAxes, va="top", ha="left", wrap=True, color="tab:red")
    else:
        ax.axvline(max(n_all), color="grey", lw=0.8, ls=":")
        ax.axvline(factor * max(n_all), color="grey", lw=0.8, ls=":")
        ax.text(factor * max(n_all), ax.get_ylim()[0], f" {factor:g}x", color="grey", va="bottom")
    top = max([r[metric] for r in results if r.get(metric) is not None] + [ax.get_ylim()[1]])
    if goal is not None and top >= 0.6 * goal:
        ax.axhline(goal, color="green", lw=0.8, ls="-.", label=f"goal {goal:g}")
    elif goal is not None:  # far above the data: say so instead of squashing the curves
        ax.text(
            0.01, 0.98, f"goal {goal:g} (above this scale)", transform=ax.transAxes, va="top", fontsize=8, color="green"
        )
    ax.set_xscale("log")
    ax.set_xlabel("regenerated training conversations (same epochs per sample)")
    what = "simulated from per-position rates" if metric == "sim_accept_len" else metric
    ax.set_ylabel(f"held-out acceptance length\n(dots: {what}; x: real chain decoding)")
    ax.set_title("Acceptance length vs training data (bars and bands: 95%)")
    ax.legend(loc="best")
    ax.grid(alpha=0.3, which="both")
    return fig


def plot_data_or_passes(sizes: list[dict], passes: list[dict], metric: str):
    """Acceptance vs optimizer steps (log x): the size rows (5 epochs, the data grows with the steps) as one line,
    each row with other passes (more epochs on the same data, more data at the same steps) as a point beside it:
    what the size curve's steps buy without new data. 95% bars."""
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    series = (
        (sizes, "o-", "tab:blue", "5 epochs on more conversations"),
        (passes, "D", "tab:red", "the same recipe with other passes"),
    )
    for rows, style, color, label in series:
        points = sorted((p for p in rows if p.get("steps")), key=lambda p: p["steps"])
        if not points:
            continue
        errorbars_95(ax, [p["steps"] for p in points], points, metric, fmt=style, color=color, label=label)
        for p in points:
            ax.annotate(
                f"{p['row']}: {p['n']:,} x {p['epochs']:g}",
                (p["steps"], p[metric]),
                textcoords="offset points",
                xytext=(6, -12),
                fontsize=8,
            )
    ax.set_xscale("log")
    ax.set_xlim(right=ax.get_xlim()[1] * 1.8)  # room for the last point's label
    ax.xaxis.set_major_formatter(ticker.FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(ticker.NullFormatter())
    ax.set_xlabel("optimizer steps (conversations x epochs / batch)")
    ax.set_ylabel("acceptance length in SGLang, held-out (chain S = 6)")
    ax.set_title("More data or more passes? The reference recipe's rows in SGLang (bars: 95%)")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left")
    fig.tight_layout()
    return fig


def plot_chain_scaling(results: list[dict], chain_fits: dict, factor: float, goal: float | None, steps: int):
    """plot_scaling of the real chain acceptance length at S = `steps`; None when no point has one
    (SPEC_PROMPTS = 0: nb.save_figure then saves nothing)."""
    if not any(r.get("chain_acceptance_length") for r in results):
        return None
    fig = plot_scaling(results, chain_fits, factor, goal, metric="chain_acceptance_length")
    fig.axes[0].set_title(f"Real chain acceptance length (S={steps}) vs training data")
    return fig


def plot_extrapolation(extra: dict):
    """Predicted acceptance at 10x data (95% interval) per architecture and fit, with its cost; None when no
    fit may be extrapolated (nb.save_figure then saves nothing)."""
    import matplotlib.pyplot as plt  # the kernel's inline backend in a notebook, Agg without a display

    if not any(m.get("ok") for e in extra.values() for m in e.values() if isinstance(m, dict)):
        return None

    fig, ax = plt.subplots(figsize=(7.5, 3.6))
    ticks, labels = [], []
    y = 0
    for arch, e in extra.items():
        for model in MODELS:
            m = e.get(model, {})
            if not m.get("ok"):
                continue
            ax.plot([m["pred_now"]], [y], "o", color="grey")
            ax.errorbar(
                [m["pred_new"]],
                [y],
                xerr=[[max(0.0, m["pred_new"] - m["band_new"][0])], [max(0.0, m["band_new"][1] - m["pred_new"])]],
                fmt="D",
                color="tab:blue" if arch == "eagle3" else "tab:orange",
                capsize=3,
            )
            ticks.append(y)
            cost = e.get("regeneration_hours")
            labels.append(
                f"{arch} {model}\n{e['n_now']:,} -> {e['n_new']:,.0f} conv"
                + (f", +{cost:.2g} h regen" if cost is not None else "")
            )
            y += 1
    ax.set_yticks(ticks, labels)
    ax.set_xlabel("acceptance length: fitted now (grey) and predicted with more data (95% band)")
    ax.grid(alpha=0.3)
    return fig


def summary_table(results: list[dict]):
    """A pandas table of the finished points (for the notebook)."""
    import pandas as pd

    cols = [
        "arch",
        "n",
        "source",
        "sim_accept_len",
        "sim_accept_len_se",
        "chain_acceptance_length",
        "chain_acceptance_length_se",
        "train_s",
        "eval_s",
        "train_tokens",
        "vocab_coverage",
    ]
    df = pd.DataFrame(results)
    return df[[c for c in cols if c in df.columns]].sort_values(["arch", "n"]).reset_index(drop=True)


def extrapolation_table(extra: dict):
    """The extrapolation's scalar figures, one column per architecture (for the notebook)."""
    import pandas as pd

    return pd.DataFrame({arch: {k: v for k, v in e.items() if not isinstance(v, dict)} for arch, e in extra.items()})


def print_notes(notes: list[str]) -> None:
    for note in notes:
        print("note:", note)


def print_plan(plan, settings, notes: list[str]) -> None:
    """The subsets, the held-out file, the recipe and the plan's and recipe's notes."""
    print(f"training rows available: {plan.available:,}; subsets: {plan.sizes}; held-out: {plan.val_file}")
    print(f"recipe: {settings.train}")
    print_notes(plan.notes + notes)


def print_regeneration(regen: dict) -> None:
    """The regeneration rate that prices the extra data (fits.regen_throughput)."""
    print(
        f"regeneration: {regen['tok_s'] or float('nan'):.0f} completion tok/s ({regen['tok_s_source']}), "
        f"{regen['mean_completion_tokens'] or float('nan'):.0f} completion tokens per conversation"
    )


def fits_as_dict(fits: dict) -> dict:
    return {arch: {m: asdict(f) for m, f in by.items()} for arch, by in fits.items()}


def findings(results: list[dict], extra: dict, deferred: list, metric: str = "sim_accept_len") -> list[str]:
    """Plain sentences for the notebook's closing summary, from the measured rows and fits only."""
    lines = []
    for arch, e in extra.items():
        rows = sorted((r for r in results if r["arch"] == arch), key=lambda r: r["n"])
        pts = ", ".join(f"{r['n']:,}: {r[metric]:.3f}" for r in rows)
        lines.append(f"{arch}: measured {metric} by training conversations: {pts}")
        for model in MODELS:
            m = e.get(model, {})
            if m.get("ok"):
                lines.append(
                    f"  {model} fit: {e['n_new']:,.0f} conversations -> {m['pred_new']:.3f} "
                    f"[95% {m['band_new'][0]:.3f}, {m['band_new'][1]:.3f}] (gain {m['gain']:+.3f})"
                )
            else:
                lines.append(f"  {model} fit: none ({m.get('reason', 'not fitted')})")
        if e.get("regeneration_hours") is not None:
            lines.append(
                f"  the {e['extra_conversations']:,.0f} extra conversations cost about "
                f"{e['regeneration_hours']:.2f} h of regeneration at the measured rate"
                + (
                    f" and {e['training_hours_at_new_size']:.2f} h of training"
                    if e.get("training_hours_at_new_size")
                    else ""
                )
            )
    e3 = {r["n"]: r[metric] for r in results if r["arch"] == "eagle3"}
    e1 = {r["n"]: r[metric] for r in results if r["arch"] == "eagle1"}
    both = sorted(set(e3) & set(e1))
    if both:
        lines.append("EAGLE-3 / EAGLE-1 ratio by size: " + ", ".join(f"{n:,}: {e3[n] / e1[n]:.2f}x" for n in both))
    if deferred:
        lines.append(f"not run yet (time budget; rerun the notebook to continue): {deferred}")
    return lines


def study_findings(results: list[dict], extra: dict, chain_extra: dict, deferred: list) -> list[str]:
    """The closing summary: simulated acceptance, then real chain decoding when it was measured."""
    lines = findings(results, extra, deferred)
    if chain_extra:
        lines += ["real chain decoding:"] + findings(
            [r for r in results if r.get("chain_acceptance_length")], chain_extra, [], metric="chain_acceptance_length"
        )
    return lines


def study_metrics(
    plan,
    settings,
    notes: list[str],
    study: dict,
    fits: dict,
    chain_fits: dict,
    regen: dict,
    extra: dict,
    chain_extra: dict,
    lines: list[str],
) -> dict:
    """Notebook 07's metrics.json section."""
    return {
        "sizes": plan.sizes,
        "available_rows": plan.available,
        "recipe": settings.train,
        "eval": settings.eval_settings(),
        "notes": notes,
        "complete": not study["deferred"],
        "deferred": study["deferred"],
        "wall_s": study["wall_s"],
        "results": [{k: v for k, v in r.items() if k not in ("draft_dir", "key")} for r in study["results"]],
        "fits": fits_as_dict(fits),
        "chain_fits": fits_as_dict(chain_fits),
        "regeneration": regen,
        "extrapolation": extra,
        "chain_extrapolation": chain_extra,
        "findings": lines,
    }
