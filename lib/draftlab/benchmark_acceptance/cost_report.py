"""The results of `draftlab bench cost`: table.csv, summary.json and the speedup plot.

table.csv has one row per shape, setting, batch size and forced acceptance; its first columns are
fixed (TABLE_COLUMNS), extra columns follow. The plot shows, per shape and setting, speedup against
acceptance for every batch size (measured points, fitted curve) with the 1x, 1.5x and 2x lines, so
a reader sees at a glance where speculation pays.
"""

from __future__ import annotations

import csv
import math
import statistics
from pathlib import Path

from draftlab.benchmark_acceptance.cost_fit import TARGETS, CycleFit, FitError, fit_table
from draftlab.benchmark_acceptance.cost_plan import PLAIN
from draftlab.core.errors import InputError
from draftlab.core.files import atomic_path, atomic_write_json

TABLE_COLUMNS = ("shape", "gpu", "setting", "batch", "acceptance", "tok_s", "baseline_tok_s", "speedup")
EXTRA_COLUMNS = (
    "tok_s_min",
    "tok_s_max",
    "baseline_tok_s_min",
    "baseline_tok_s_max",
    "windows",
    "measured_acceptance",
    "cycle_cost",
)
PLOT_NAME = "speedup.png"
CHECKED_POINTS = 3  # a fitted line is drawn (and called checked) only over this many acceptances or more


def table_rows(measurements: list[dict]) -> list[dict]:
    """Speculative cells joined with the plain cell of the same shape, setting and batch."""
    plain = {(m["shape"], m["setting"], m["batch"]): m for m in measurements if m["server"] == PLAIN}
    rows = []
    for m in measurements:
        base = plain.get((m["shape"], m["setting"], m["batch"]))
        if m["server"] == PLAIN or base is None:
            continue
        tok, ref, tau = float(m["tok_s"]), float(base["tok_s"]), float(m["acceptance"])
        speedup = tok / ref
        rows.append(
            {
                "shape": m["shape"],
                "gpu": m["gpu"],
                "setting": m["setting"],
                "batch": int(m["batch"]),
                "acceptance": int(tau),
                "tok_s": round(tok, 2),
                "baseline_tok_s": round(ref, 2),
                "speedup": round(speedup, 4),
                "tok_s_min": _round(m["tok_s_min"], 2),
                "tok_s_max": _round(m["tok_s_max"], 2),
                "baseline_tok_s_min": _round(base["tok_s_min"], 2),
                "baseline_tok_s_max": _round(base["tok_s_max"], 2),
                "windows": m["windows"],
                "measured_acceptance": _round(m.get("measured_acceptance")),
                "cycle_cost": round(tau / speedup, 4),
            }
        )
    return sorted(rows, key=lambda r: (r["shape"], r["setting"], r["batch"], r["acceptance"]))


def _round(value, digits: int = 3):
    try:
        return round(float(value), digits)
    except (TypeError, ValueError):
        return ""


def write_table(rows: list[dict], path) -> Path:
    with atomic_path(path) as tmp:
        with open(tmp, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=TABLE_COLUMNS + EXTRA_COLUMNS)
            writer.writeheader()
            writer.writerows(rows)
    return Path(path)


def read_table(path) -> list[dict]:
    """table.csv back as rows (numbers as numbers); one-line InputError for a file that is not one."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{path}: no such file (a `draftlab bench cost` results folder holds table.csv)")
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        head = tuple(reader.fieldnames or ())
        if head[: len(TABLE_COLUMNS)] != TABLE_COLUMNS:
            raise InputError(f"{path}: columns {list(head)[:8]}, expected {list(TABLE_COLUMNS)} first")
        rows = list(reader)
    for i, r in enumerate(rows, start=2):
        try:
            r["batch"], r["acceptance"] = int(r["batch"]), int(r["acceptance"])
            for k in ("tok_s", "baseline_tok_s", "speedup"):
                r[k] = float(r[k])
        except ValueError as exc:
            raise InputError(f"{path}: row {i}: {exc}") from None
    return rows


def load_results(folder, max_acceptance: dict[str, int] | None = None):
    """(table rows, fits, refusals) of a results folder; (None, [], []) when it has no table.csv yet.

    The settings' chain bounds come from the folder's plan.json (or `max_acceptance`)."""
    folder = Path(folder)
    if not (folder / "table.csv").is_file():
        return None, [], []
    rows = read_table(folder / "table.csv")
    if max_acceptance is None:
        import json

        plans = json.loads((folder / "plan.json").read_text()) if (folder / "plan.json").is_file() else {}
        max_acceptance = {s["name"]: s["steps"] + 1 for job in plans.values() for s in job.get("settings", [])}
    missing = sorted({r["setting"] for r in rows} - set(max_acceptance))
    if missing:
        raise InputError(f"{folder}: no plan.json entry for setting(s) {missing}; pass max_acceptance")
    fits, errors = fit_table(rows, max_acceptance)
    return rows, fits, errors


def fits_of(rows: list[dict], max_acceptance: dict[str, int]) -> tuple[list[CycleFit], list[str]]:
    return fit_table(rows, max_acceptance)


def needed_table(fits: list[CycleFit]) -> list[dict]:
    """Per shape, setting and batch: the acceptance needed to break even, for 1.5x and 2x (None: out of reach)."""
    return [
        {
            "shape": f.shape,
            "setting": f.setting,
            "batch": f.batch,
            "cycle_cost_at_1": round(f.cycle_cost(1.0), 3),
            **{f"acceptance_for_{x:g}x": (None if f.needed(x) is None else round(f.needed(x), 2)) for x in TARGETS},
            "max_acceptance": f.max_acceptance,
            "points": f.points,  # under CHECKED_POINTS: a line through the points, nothing checks it
        }
        for f in fits
    ]


def projection(fits: list[CycleFit], acceptance: float, setting: str) -> list[dict]:
    """The speedup a draft measured at `acceptance` with `setting` would give, per shape and batch."""
    out = []
    for f in fits:
        if f.setting != setting:
            continue
        try:
            value = round(f.speedup(acceptance), 3)
        except FitError:
            value = None
        lo, hi = f.measured_span
        out.append(
            {
                "shape": f.shape,
                "batch": f.batch,
                "setting": setting,
                "acceptance": acceptance,
                "speedup": value,
                "points": f.points,
                "measured_up_to": round(hi, 3),  # the highest acceptance measured (tokens per cycle)
                "within_measured": lo - 0.05 <= acceptance <= hi + 0.05,  # interpolated, not extrapolated
            }
        )
    return out


def embedded_check(fits: list[CycleFit], *, acceptance: float, measured: float, setting: str, batch: int, shape: str):
    """Predicted vs measured speedup of a real draft on the embedded target (goal: within 10%)."""
    match = [f for f in fits if (f.shape, f.setting, f.batch) == (shape, setting, batch)]
    if not match:
        raise FitError(f"--check: no fit for {shape} {setting} batch {batch}")
    predicted = match[0].speedup(acceptance)
    return {
        "embedded_check": {"shape": shape, "setting": setting, "batch": batch, "acceptance": acceptance},
        "embedded_predicted_speedup": round(predicted, 4),
        "embedded_measured_speedup": round(measured, 4),
        "embedded_prediction_error": round((predicted - measured) / measured, 4),
    }


def write_summary(path, *, jobs: dict, rows, fits, errors, extra: dict | None = None) -> dict:
    summary = {
        "shapes": [{"name": name, **job.get("shape_info", {}), "gpu": job.get("gpu")} for name, job in jobs.items()],
        "batch_sizes": sorted({int(r["batch"]) for r in rows}),
        "settings": {s["name"]: s for job in jobs.values() for s in job.get("settings", [])},
        "rows": len(rows),
        "needed_acceptance": needed_table(fits),
        "fits": [f.as_dict() for f in fits],
        "fit_errors": errors,
        **(extra or {}),
    }
    atomic_write_json(path, summary, indent=2)
    return summary


def plot(rows: list[dict], fits: list[CycleFit], path=None):
    """Speedup vs forced acceptance: a panel per shape and setting, a colour per batch size.

    Dots: measured; lines: the fitted cycle cost where three or more acceptances were measured (a line
    through two points has nothing to check it: those are joined by a thin dotted line over their own
    span only); dashed: 1x, 1.5x and 2x. Each panel names its GPU. Returns the figure."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    panels = sorted({(r["shape"], r["setting"]) for r in rows})  # only what was measured: no empty panel
    if not panels:
        raise InputError("no rows to plot: nothing measured yet")
    cols = min(3, len(panels))
    nrows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4.6 * cols, 3.8 * nrows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[len(panels) :]:
        ax.axis("off")
    batches = sorted({int(r["batch"]) for r in rows})
    colours = dict(zip(batches, plt.cm.viridis([i / max(1, len(batches) - 1) * 0.85 for i in range(len(batches))])))
    for (shape, setting), ax in zip(panels, flat):
        pts = [r for r in rows if (r["shape"], r["setting"]) == (shape, setting)]
        for b in batches:
            mine = sorted((r for r in pts if int(r["batch"]) == b), key=lambda r: r["acceptance"])
            if not mine:
                continue
            ax.scatter([r["acceptance"] for r in mine], [float(r["speedup"]) for r in mine], color=colours[b], s=14)
            fit = next((f for f in fits if (f.shape, f.setting, f.batch) == (shape, setting, b)), None)
            if fit is not None and fit.points >= CHECKED_POINTS:
                xs = [1 + i * (fit.max_acceptance - 1) / 40 for i in range(41)]
                ax.plot(xs, [fit.speedup(x) for x in xs], color=colours[b], lw=1.2, label=f"batch {b}")
            else:
                xs = [r["acceptance"] for r in mine]
                ax.plot(xs, [float(r["speedup"]) for r in mine], color=colours[b], lw=0.8, ls=":", label=f"batch {b}")
        for x in TARGETS:
            ax.axhline(x, color="grey", lw=0.8, ls="--" if x == 1 else ":")
            ax.text(1.0, x, f" {x:g}x", va="bottom", fontsize=9, color="grey")
        gpu = ", ".join(sorted({r["gpu"] for r in pts})).replace("NVIDIA ", "")
        ax.set_title(f"{shape} · {setting} ({gpu})", fontsize=10)
        ax.set_xlabel("acceptance length (forced)")
        ax.set_ylabel("speedup over plain SGLang")
        ax.legend(fontsize=9, loc="upper left")
    fig.suptitle("SGLang speedup by acceptance and batch size (random weights, forced acceptance)", fontsize=11)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
    return fig


def spread(values: list[float]) -> float:
    """(max - min) / median of a cell's windows: the spread printed beside a figure."""
    med = statistics.median(values)
    return (max(values) - min(values)) / med if med and not math.isnan(med) else float("nan")
