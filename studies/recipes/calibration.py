"""How well the training's own validation (simulated acceptance, `sim_accept_len` in a row's summary.json)
predicts acceptance in SGLang, fitted over the recipe study's measured rows, and the estimate it gives for a
row trained but not measured. Why: a row costs ~450 s of training and ~350 s of SGLang measuring on the GPU;
on 2026-12-03 the 13 measured rows fell on one line (r 0.996), so a trained row can be read before it is
served, and a measuring call spent on the rows that the line says are worth it. An estimate is never a
measurement: every output names it `predicted` with its prediction interval."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from draftlab.core.errors import InputError
from draftlab.core.files import atomic_write_json
from draftlab.core.paths import repo_relative
from studies.recipes.rows import BASE, ROWS, recipe

SIM = "val_sim_acceptance"
MEASURED = {"held_out": "sglang_acceptance_held_out", "humaneval": "sglang_acceptance_humaneval"}


@dataclass
class Line:
    """SGLang acceptance = intercept + slope * simulated acceptance, over `rows`."""

    prompts: str
    intercept: float
    slope: float
    r: float
    residual_sd: float  # the scatter about the line, n - 2 degrees of freedom
    rows: list[str]
    sims: list[float]  # the rows' simulated acceptance, the line's x
    # each row predicted by the line fitted without it: how far an estimate of a new row may miss
    leave_one_out_rmse: float
    leave_one_out_worst: dict

    def predict(self, sim: float, level: float = 0.95) -> tuple[float, float, float]:
        """(estimate, low, high): the OLS prediction interval for one new row."""
        from scipy import stats

        x = np.asarray(self.sims, dtype=float)
        n = len(x)
        spread = self.residual_sd * np.sqrt(1 + 1 / n + (sim - x.mean()) ** 2 / ((x - x.mean()) ** 2).sum())
        half = stats.t.ppf(0.5 + level / 2, n - 2) * spread
        y = self.intercept + self.slope * sim
        return y, y - half, y + half

    def inside(self, sim: float) -> bool:
        return min(self.sims) <= sim <= max(self.sims)


def excluded(row: str) -> str | None:
    """Why a measured row stays out of the fit: its simulation is not of the served chain."""
    if row not in ROWS:
        return "not a recipe row"
    if recipe(row)["ttt_steps"] != BASE["ttt_steps"]:  # ttt3 simulates 3 draft steps, the servers run 6
        return f"its validation simulates {recipe(row)['ttt_steps']} steps, not {BASE['ttt_steps']}"
    return None


def fit_lines(table: pd.DataFrame) -> tuple[dict[str, Line], dict[str, str]]:
    """One line per prompt set over the table's rows with both figures; {row: why left out}. Rows read at
    batch 1 and at 16 share the line: a batch term fitted +0.0003 over the 13 rows of 2026-12-03."""
    from scipy import stats

    for col in ("row", SIM, *MEASURED.values()):
        if col not in table.columns:
            raise InputError(f"recipes calibrate: the table has no column {col!r} (`combine` writes it)")
    left_out = {r: why for r in table["row"] if (why := excluded(r))}
    lines = {}
    for prompts, col in MEASURED.items():
        use = table[~table["row"].isin(left_out) & table[SIM].notna() & table[col].notna()]
        if len(use) < 4:
            raise InputError(f"recipes calibrate: {len(use)} rows with {SIM} and {col}; need at least 4")
        x, y = use[SIM].to_numpy(float), use[col].to_numpy(float)
        fit = stats.linregress(x, y)
        resid = y - (fit.intercept + fit.slope * x)
        misses = leave_one_out(x, y)
        worst = int(np.argmax(np.abs(misses)))
        lines[prompts] = Line(
            prompts,
            float(fit.intercept),
            float(fit.slope),
            float(fit.rvalue),
            float(np.sqrt((resid**2).sum() / (len(x) - 2))),
            use["row"].tolist(),
            x.tolist(),
            float(np.sqrt((misses**2).mean())),
            {"row": use["row"].iloc[worst], "miss": float(misses[worst])},
        )
    return lines, left_out


def leave_one_out(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Measured minus predicted for each point, by the straight line through all the others."""
    from scipy import stats

    misses = np.empty_like(y)
    for i in range(len(x)):
        keep = np.arange(len(x)) != i
        fit = stats.linregress(x[keep], y[keep])
        misses[i] = y[i] - (fit.intercept + fit.slope * x[i])
    return misses


def simulated(train_dir: Path) -> dict:
    """A row's last validation from its train folder's summary.json, and how far its training got."""
    path = Path(train_dir) / "summary.json"
    if not path.is_file():
        raise InputError(f"{path}: missing (a row's train folder: OUT/<row>/train)")
    try:
        summary = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise InputError(f"{path}: not JSON ({exc})") from None
    sim = (summary.get("eval") or {}).get("sim_accept_len")
    if not isinstance(sim, (int, float)):
        raise InputError(f"{path}: field eval.sim_accept_len missing (no validation ran)")
    return {
        "sim": float(sim),
        "at_step": summary["eval"].get("step"),
        "steps": summary.get("steps"),
        "total_steps": summary.get("total_steps"),
        "finished": bool(summary.get("finished")),
    }


def calibrate(table_csv: Path, predict: dict[str, Path], out: Path) -> dict:
    """OUT/calibration.json (the lines, the rows left out, the estimates), OUT/calibration.csv (every row's
    figures beside the line's), OUT/calibration.png."""
    if not Path(table_csv).is_file():
        raise InputError(f"{table_csv}: missing (python -m studies.recipes combine writes OUT/table.csv)")
    table = pd.read_csv(table_csv)
    lines, left_out = fit_lines(table)
    estimates = []
    for row, train_dir in predict.items():
        if why := excluded(row):
            raise InputError(f"recipes calibrate: row {row} cannot be estimated: {why}")
        got = simulated(train_dir)
        for prompts, line in lines.items():
            y, low, high = line.predict(got["sim"])
            estimates.append(
                {
                    "row": row,
                    "prompts": prompts,
                    "predicted": y,
                    "low_95": low,
                    "high_95": high,
                    "inside_fitted_range": line.inside(got["sim"]),
                    "train_dir": str(train_dir),
                    **got,
                }
            )
    rows = []
    for _, t in table.iterrows():
        for prompts, line in lines.items():
            fitted = line.intercept + line.slope * t[SIM] if pd.notna(t[SIM]) else None
            rows.append(
                {
                    "row": t["row"],
                    "prompts": prompts,
                    "sim": t[SIM],
                    "measured": t[MEASURED[prompts]],
                    "fitted": fitted,
                    "in_fit": t["row"] in line.rows,
                    "left_out": left_out.get(t["row"], ""),
                }
            )
    out.mkdir(parents=True, exist_ok=True)
    result = {
        "source": repo_relative(table_csv),
        "lines": {k: asdict(line) for k, line in lines.items()},
        "left_out": left_out,
        "estimates": estimates,
        "note": "estimates are predicted from the training's validation, not measured in SGLang",
    }
    atomic_write_json(out / "calibration.json", result, indent=1)
    pd.DataFrame(rows).to_csv(out / "calibration.csv", index=False)
    plot(pd.DataFrame(rows), lines, estimates, out / "calibration.png")
    return result


def plot(rows: pd.DataFrame, lines: dict[str, Line], estimates: list[dict], path: Path):
    """Measured rows against their simulated acceptance, the fitted line, the estimates with their intervals."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(lines), figsize=(6 * len(lines), 4.5), squeeze=False)
    for ax, (prompts, line) in zip(axes[0], lines.items()):
        mine = rows[(rows["prompts"] == prompts) & rows["measured"].notna() & rows["sim"].notna()]
        fit_in = mine[mine["in_fit"]]
        ax.scatter(fit_in["sim"], fit_in["measured"], color="C0", label="measured in SGLang (in the fit)")
        out = mine[~mine["in_fit"]]
        ax.scatter(out["sim"], out["measured"], color="grey", marker="x", label="measured, left out")
        for _, r in mine.iterrows():
            ax.annotate(r["row"], (r["sim"], r["measured"]), fontsize=7, xytext=(3, -8), textcoords="offset points")
        xs = np.linspace(min(line.sims), max(line.sims), 50)
        ax.plot(
            xs,
            line.intercept + line.slope * xs,
            color="C0",
            lw=1,
            label=f"{line.intercept:.2f} + {line.slope:.3f} x (r {line.r:.3f}, sd {line.residual_sd:.3f})",
        )
        for e in (e for e in estimates if e["prompts"] == prompts):
            ax.errorbar(
                e["sim"],
                e["predicted"],
                yerr=[[e["predicted"] - e["low_95"]], [e["high_95"] - e["predicted"]]],
                fmt="o",
                mfc="none",
                color="C3",
                capsize=3,
            )
            ax.annotate(
                f"{e['row']} (predicted)",
                (e["sim"], e["predicted"]),
                fontsize=7,
                color="C3",
                xytext=(3, 4),
                textcoords="offset points",
            )
        ax.set_xlabel("simulated acceptance in the training's validation (7 draft steps)")
        ax.set_ylabel(f"SGLang acceptance, chain S = 6 ({prompts.replace('_', '-')})")
        ax.legend(fontsize=7, loc="upper left")
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
