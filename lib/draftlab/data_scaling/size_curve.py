"""The recipe study's data-size curve: notebook 07's question (how much acceptance does 10x more data buy,
and at what cost) answered in SGLang rather than by simulated acceptance.

Its points are the rows that differ from the reference recipe only in how many conversations they train on
(SIZE_ROWS, all at 5 epochs, so the steps grow with the samples); each gets its SGLang held-out acceptance
with a bootstrap standard error over prompts, and the conversations and training seconds of its own summary.
The fits and the extrapolation are notebook 07's (data_scaling.fits: log-linear and saturating, 95% bands).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from draftlab.core.acceptance import acceptance_length, acceptance_se
from draftlab.core.files import atomic_write_json
from draftlab.data_scaling.figures import fits_as_dict, plot_scaling
from draftlab.data_scaling.fits import extrapolate, fit_all
from draftlab.data_scaling.recipes import replies_of, served

SIZE_ROWS = ("n1351", "n2702", "n5403", "n10806", "base", "data2x-5ep")
METRIC = "sglang_acceptance"


def size_points(combined: pd.DataFrame) -> list[dict]:
    """One point per measured SIZE_ROWS row of a combined table: its study's held-out replies and summary."""
    points = []
    for _, line in combined[combined["row"].isin(SIZE_ROWS)].iterrows():
        study = Path(line["study"])
        sets = json.loads((study / "sglang" / "plan.json").read_text())["sets"]
        tokens, verify = served(replies_of(study / "sglang", line["row"]), range(*sets["held_out"]))
        summary = json.loads((study / line["row"] / "train" / "summary.json").read_text())
        if acceptance_length(tokens, verify) is None:
            continue
        points.append({"arch": "eagle3", "source": "scaling", "row": line["row"], "n": summary["train_stats"]["kept"],
                       METRIC: acceptance_length(tokens, verify), f"{METRIC}_se": acceptance_se(tokens, verify),
                       "prompts": len(tokens), "train_s": summary["elapsed_total_s"]})
    return sorted(points, key=lambda p: p["n"])


def write_size_curve(combined: pd.DataFrame, out: Path, regeneration: dict, factor: float = 10.0,
                     goal: float = 4.0) -> dict:
    """OUT/size_curve.json (points, fits, the extrapolation to `factor` x the largest set with its
    regeneration and training hours) and OUT/size_curve.png; `regeneration` is a measured
    {"tok_s", "mean_completion_tokens"} of the target's regeneration, with its source."""
    points = size_points(combined)
    fits = fit_all(points, metric=METRIC) if points else {}
    result = {"points": points, "fits": fits_as_dict(fits), "regeneration": regeneration,
              "extrapolation": extrapolate(fits, points, regeneration, factor, goal, metric=METRIC) if fits else {},
              "note": "SGLang held-out acceptance at chain S = 6; rows at 5 epochs on nested subsets (recipes.ROWS)"}
    atomic_write_json(out / "size_curve.json", result, indent=1)
    if points:
        fig = plot_scaling(points, fits, factor, goal, metric=METRIC)
        fig.axes[0].set_ylabel("acceptance length in SGLang, held-out (chain S = 6)")
        fig.savefig(out / "size_curve.png", dpi=120)
    return result
