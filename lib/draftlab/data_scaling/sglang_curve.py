"""Notebook 07's SGLang size curve, read as data: the size_curve.json of the published recipe study
(results/recipes/size-curve/; results/recipes/README.md says how it was made), its lines and its two figures.

Why here: the notebook reads the study's record, not its code. The figures refit the recorded points with
this stage's fits (data_scaling.fits: the same models and the chain's ceiling), so they match the record's.
"""

from __future__ import annotations

import json
from pathlib import Path

from draftlab.core.errors import InputError
from draftlab.core.paths import repo_path
from draftlab.data_scaling.figures import plot_data_or_passes, plot_scaling
from draftlab.data_scaling.fits import MODELS, chain_ceiling, fit_all

METRIC = "sglang_acceptance"


def reading_text(reading: dict) -> str:
    """A reading_at's prediction and band as the lines print them."""
    return f"{reading['pred']:.2f} (95%: {reading['band'][0]:.2f}-{reading['band'][1]:.2f})"


def size_curve_lines(result: dict) -> list[str]:
    """What the curve says, from its own figures: each point, each fit at the extrapolated size, the cost."""
    if not result["points"]:
        return ["no data-size row measured in SGLang yet (recipes.sh with ROWS=n1351,...)"]
    lines = [
        f"{p['row']}: {p['n']:,} conversations -> {p[METRIC]:.2f} +- {1.96 * (p[f'{METRIC}_se'] or 0):.2f} "
        f"in SGLang ({p['prompts']} held-out prompts), trained in {p['train_s'] / 60:.1f} min"
        for p in result["points"]
    ]
    by_n = {p["n"]: p for p in result["points"]}
    for p in result.get("passes", []):
        same = by_n.get(p["n"])
        lines.append(
            f"{p['row']}: {p['n']:,} conversations x {p['epochs']:g} epochs ({p['steps'] or 0:,} steps) -> "
            f"{p[METRIC]:.2f} +- {1.96 * (p[f'{METRIC}_se'] or 0):.2f}"
            + (
                f"; {same['row']}, the same conversations x {same['epochs']:g} epochs ({same['steps'] or 0:,} steps): "
                f"{same[METRIC]:.2f}"
                if same
                else ""
            )
        )
    every = result["points"] + result.get("passes", [])
    batches = sorted({p.get("concurrency") for p in every}, key=lambda b: (b is None, b or 0))
    if len(batches) > 1:  # acceptance moves with the batch (base: 3.06 at 1, 3.17 at 16 in the recipe study)
        lines.append(
            f"WARNING: the points' acceptance was read at different batches ({batches}): measure the "
            "size and passes rows at one concurrency"
        )
    extra = result["extrapolation"].get("eagle3", {})
    for model in MODELS:
        fit = extra.get(model, {})
        lines.append(
            f"{model}: {fit['pred_new']:.2f} at {extra['n_new']:,.0f} conversations (95%: "
            f"{fit['band_new'][0]:.2f}-{fit['band_new'][1]:.2f})"
            if fit.get("ok")
            else f"{model}: no fit ({fit.get('reason', 'no points')})"
        )
    check = result.get("last_point_from_the_rest") or {}
    for model in MODELS:
        fit = check.get(model, {})
        if fit.get("ok"):
            lines.append(
                f"{model} without {check['row']}: {reading_text(fit)} "
                f"at its {check['n']:,} conversations, measured {check['measured']:.2f}"
            )
    for p in result.get("passes_as_data", []):
        readings = [f"{model} {reading_text(p[model])}" for model in MODELS if p.get(model, {}).get("ok")]
        lines.append(
            f"{p['row']} read as {p['n_as_data']:,.0f} conversations: {', '.join(readings) or 'no fit'}; "
            + (f"measured {p['measured']:.2f}" if p["measured"] is not None else "not measured")
        )
    if extra.get("regeneration_hours") is not None:
        lines.append(
            f"the extra {extra['extra_conversations']:,.0f} conversations: "
            f"{extra['regeneration_hours']:.2f} h of regeneration at "
            f"{result['regeneration']['tok_s']:,.0f} tok/s, then "
            f"{extra['training_hours_at_new_size']:.2f} h of training at the largest point's rate"
        )
    return lines


def size_curve_figures(result: dict, factor: float = 10.0, goal: float = 4.0) -> dict:
    """{figure name: figure} of a size curve (none without a point): acceptance vs conversations with the
    fits and their bands, and the passes rows beside the size rows against the optimizer steps."""
    points = result["points"]
    if not points:
        return {}
    fits = fit_all(points, metric=METRIC, ceiling=chain_ceiling(points))
    fig = plot_scaling(points, fits, factor, goal, metric=METRIC)
    fig.axes[0].set_ylabel("acceptance length in SGLang, held-out (chain S = 6)")
    fig.axes[0].set_title("The recipe study's data-size rows in SGLang (bars and bands: 95%)")
    return {
        "sglang_acceptance_vs_data": fig,
        "sglang_data_or_passes": plot_data_or_passes(points, result.get("passes", []), metric=METRIC),
    }


def read_size_curve(path: str, factor: float = 10.0, goal: float = 4.0) -> tuple[dict | None, dict]:
    """A recorded size curve (size_curve.json), its lines printed; (result, {figure name: figure}).
    No path: (None, {}), said so."""
    if not path:
        print("no size_curve.json given (SGLANG_SIZE_CURVE): the SGLang curve is skipped")
        return None, {}
    file = Path(repo_path(path))
    if not file.is_file():
        raise InputError(f"SGLANG_SIZE_CURVE: {path}: no such file (the recipe study writes size_curve.json)")
    result = json.loads(file.read_text())
    if "points" not in result or "extrapolation" not in result:
        raise InputError(f"SGLANG_SIZE_CURVE: {path}: not a size curve (no points or extrapolation)")
    print("\n".join(size_curve_lines(result)))
    return result, size_curve_figures(result, factor, goal)
