"""The recipe study's data-size curve: notebook 07's question (how much acceptance does 10x more data buy,
and at what cost) answered in SGLang rather than by simulated acceptance.

Its points are the rows that differ from the reference recipe only in how many conversations they train on
(SIZE_ROWS, all at 5 epochs, so the steps grow with the samples); each gets its SGLang held-out acceptance
with a bootstrap standard error over prompts, and the conversations and training seconds of its own summary.
The fits and the extrapolation are notebook 07's (data_scaling.fits: log-linear, saturating, and the logistic
under the chain's ceiling S + 1; 95% bands).
Since every size ran 5 epochs, the curve mixes more data with more steps; the PASSES_ROWS (the same recipe with
other passes: twice the epochs on the same data, twice the data at the same steps) tell the two apart, drawn
against the optimizer steps beside the size rows. Since at equal steps twice the data and twice the passes read
alike, `passes_as_data` reads those rows, and the planned epochs20 that no session could train, on the curve as if
their passes were fresh conversations.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from draftlab.core.acceptance import acceptance_length, acceptance_se
from draftlab.core.files import atomic_write_json
from draftlab.core.paths import repo_path
from draftlab.data_scaling.figures import fits_as_dict, plot_data_or_passes, plot_scaling
from draftlab.data_scaling.fits import MODELS, chain_ceiling, extrapolate, fit_all
from draftlab.data_scaling.recipe_rows import recipe
from draftlab.data_scaling.recipes import combined_table, replies_of, served

SIZE_ROWS = ("n1351", "n2702", "n5403", "n10806", "base", "data2x-5ep")
PASSES_ROWS = ("epochs10", "data2x")  # the reference recipe with other passes over the conversations
PLANNED_PASSES_ROWS = ("epochs20",)  # defined (recipe_rows) but too long to train in one session's device time
METRIC = "sglang_acceptance"


def size_points(combined: pd.DataFrame, rows=SIZE_ROWS) -> list[dict]:
    """One point per measured row of `rows` in a combined table: its study's held-out replies and summary."""
    points = []
    for _, line in combined[combined["row"].isin(rows)].iterrows():
        study = Path(line["study"])
        plan = json.loads((study / "sglang" / "plan.json").read_text())
        tokens, verify = served(replies_of(study / "sglang", line["row"]), range(*plan["sets"]["held_out"]))
        summary = json.loads((study / line["row"] / "train" / "summary.json").read_text())
        acceptance = acceptance_length(tokens, verify)
        if acceptance is None:
            continue
        points.append(
            {
                "arch": "eagle3",
                "source": "scaling",
                "row": line["row"],
                "n": summary["train_stats"]["kept"],
                METRIC: acceptance,
                f"{METRIC}_se": acceptance_se(tokens, verify),
                "prompts": len(tokens),
                "train_s": summary["elapsed_total_s"],
                "steps": summary.get("total_steps"),
                "epochs": recipe(line["row"])["epochs"],
                "concurrency": _concurrency(line),
                "chain_steps": plan["steps"],
            }
        )
    return sorted(points, key=lambda p: p["n"])


def _concurrency(line: pd.Series) -> int | None:
    """The batch its acceptance was read at (studies before 2026-12-02's column: None)."""
    value = line.get("acceptance_concurrency")
    return None if value is None or pd.isna(value) else int(value)


def last_point_from_the_rest(points: list[dict], ceiling: float | None) -> dict:
    """Each model fitted without the largest point, its prediction there (95% band) beside the measurement:
    an extrapolation checked out of sample, one doubling ahead."""
    if len(points) < 2:
        return {}
    rest, last = points[:-1], points[-1]
    out = {"row": last["row"], "n": last["n"], "measured": last[METRIC]}
    for model, fit in fit_all(rest, metric=METRIC, ceiling=ceiling).get("eagle3", {}).items():
        out[model] = reading_at(fit, last["n"])
    return out


def reading_text(reading: dict) -> str:
    """A reading_at's prediction and band as the lines print them."""
    return f"{reading['pred']:.2f} (95%: {reading['band'][0]:.2f}-{reading['band'][1]:.2f})"


def reading_at(fit, n: float) -> dict:
    """A fit's prediction at n conversations with its 95% band, or why it has none."""
    if not fit.ok:
        return {"ok": False, "reason": fit.reason}
    lo, hi = fit.band([n])
    return {"ok": True, "pred": float(fit.predict([n])[0]), "band": [float(lo[0]), float(hi[0])]}


def write_size_curve(
    combined: pd.DataFrame, out: Path, regeneration: dict, factor: float = 10.0, goal: float = 4.0
) -> tuple[dict, dict]:
    """OUT/size_curve.json (points, fits, the extrapolation to `factor` x the largest set with its
    regeneration and training hours, the PASSES_ROWS' points) and OUT/size_curve.png, OUT/data_or_passes.png;
    `regeneration` is a measured {"tok_s", "mean_completion_tokens"} of the target's regeneration, with its
    source. Returns (that result, {figure name: figure}, empty without a point)."""
    points = size_points(combined)
    ceiling = chain_ceiling(points)
    fits = fit_all(points, metric=METRIC, ceiling=ceiling) if points else {}
    passes = size_points(combined, PASSES_ROWS)
    result = {
        "points": points,
        "fits": fits_as_dict(fits),
        "regeneration": regeneration,
        "extrapolation": extrapolate(fits, points, regeneration, factor, goal, metric=METRIC) if fits else {},
        "last_point_from_the_rest": last_point_from_the_rest(points, ceiling),
        "passes": passes,
        "passes_as_data": passes_as_data(fits.get("eagle3", {}), points, passes),
        "note": "SGLang held-out acceptance at chain S = 6; rows at 5 epochs on nested subsets (recipe_rows.ROWS)",
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "size_curve.json", result, indent=1)
    figs = {}
    if points:
        fig = plot_scaling(points, fits, factor, goal, metric=METRIC)
        fig.axes[0].set_ylabel("acceptance length in SGLang, held-out (chain S = 6)")
        fig.axes[0].set_title("The recipe study's data-size rows in SGLang (bars and bands: 95%)")
        figs["sglang_acceptance_vs_data"] = fig
        figs["sglang_data_or_passes"] = plot_data_or_passes(points, result["passes"], metric=METRIC)
        for name, file in (
            ("sglang_acceptance_vs_data", "size_curve.png"),
            ("sglang_data_or_passes", "data_or_passes.png"),
        ):
            figs[name].savefig(out / file, dpi=120)
    return result, figs


def passes_as_data(fits: dict, points: list[dict], passes: list[dict], planned=PLANNED_PASSES_ROWS) -> list[dict]:
    """Each measured passes row and each planned one on the size curve, its passes read as fresh conversations:
    n x its epochs / the size rows' epochs, each fit's prediction there (95% band) beside the measurement (None
    for a planned row, trained on the reference set: base's n). Why: at equal steps twice the data and twice the
    passes read alike in SGLang (data2x-5ep 3.74, epochs10 3.61, inside each other's 95% bars), so this is what
    the curve suggests for more passes; it assumes that holds beyond twice, which only the measured rows check."""
    size_epochs = {p["epochs"] for p in points}
    reference = [p for p in points if p["row"] == "base"]
    if len(size_epochs) != 1 or not reference:
        return []
    (epochs_each,) = size_epochs
    measured = {p["row"]: p for p in passes}
    rows = [*measured.values()] + [
        {"row": r, "n": reference[0]["n"], "epochs": recipe(r)["epochs"], METRIC: None}
        for r in planned
        if r not in measured
    ]
    out = []
    for p in rows:
        n_as_data = p["n"] * p["epochs"] / epochs_each
        entry = {"row": p["row"], "n": p["n"], "epochs": p["epochs"], "n_as_data": n_as_data, "measured": p[METRIC]}
        out.append(entry | {model: reading_at(fit, n_as_data) for model, fit in fits.items()})
    return out


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
    if len(batches) > 1:  # acceptance moves with the batch (base: 3.06 at 1, 3.17 at 16 on 2026-12-02)
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


def sglang_size_curve(
    studies: list[str], out: Path, regeneration: dict, factor: float = 10.0, goal: float = 4.0
) -> tuple[dict | None, dict]:
    """Notebook 07's section in SGLang: the curve of these recipe-study folders (none given: (None, {})),
    printed; returns (result, {figure name: figure})."""
    if not studies:
        print("no recipe-study folders given (SGLANG_STUDIES): the SGLang curve is skipped")
        return None, {}
    result, figs = write_size_curve(combined_table([repo_path(s) for s in studies]), out, regeneration, factor, goal)
    print("\n".join(size_curve_lines(result)))
    return result, figs
