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
from draftlab.data_scaling.figures import fits_as_dict
from draftlab.data_scaling.fits import chain_ceiling, extrapolate, fit_all
from draftlab.data_scaling.sglang_curve import METRIC, size_curve_figures, size_curve_lines
from studies.recipes.rows import recipe
from studies.recipes.study import combined_table, replies_of, served

SIZE_ROWS = ("n1351", "n2702", "n5403", "n10806", "base", "data2x-5ep")
PASSES_ROWS = ("epochs10", "data2x")  # the reference recipe with other passes over the conversations
PLANNED_PASSES_ROWS = ("epochs20",)  # defined (studies.recipes.rows) but too long to train in one session's device time


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
        "note": "SGLang held-out acceptance at chain S = 6; rows at 5 epochs on nested subsets (rows.ROWS)",
    }
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_json(out / "size_curve.json", result, indent=1)
    figs = size_curve_figures(result, factor, goal)
    for name, file in (
        ("sglang_acceptance_vs_data", "size_curve.png"),
        ("sglang_data_or_passes", "data_or_passes.png"),
    ):
        if name in figs:
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
