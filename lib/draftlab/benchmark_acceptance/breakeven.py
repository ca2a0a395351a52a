"""Break-even model: will a draft pay off, given its acceptance length and what drafting costs?

Per verify cycle a speculative decoder spends one verify pass of the target plus S draft steps
and emits on average L tokens (L = acceptance length); plain decoding spends one target step per
token. In units of one plain target step (time T1):

    cycle cost  C(S) = v + S * c          v = verify pass / T1, c = draft step / T1
    speedup     = L / C(S)
    break-even  L* = C(S)                 (and L = x * C(S) for a speedup of x)

v is about 1 when the target is memory- or launch-bound (a GPU at small batch: verifying a few
tokens costs about one decode step) and grows with the verified tokens when it is compute-bound
(this CPU). v and c are fitted from the engine's own timings (`fit_costs`) and checked against
its measured speedups on chain lengths left out of the fit (`held_out_check`); `fit_or_refuse` draws
no model, and says why in one line, where it cannot be checked so (fewer than three chain lengths),
is unphysical (a cost at or below zero) or misses a held-out run by more than 25%. A chain of S
steps cannot exceed L = S + 1, so a draft whose
needed L* is above S + 1 can never pay off at that S.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


def cycle_cost(steps: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    return verify_cost + steps * draft_cost


def predicted_speedup(acceptance_length: float, steps: int, draft_cost: float, verify_cost: float = 1.0) -> float:
    return acceptance_length / cycle_cost(steps, draft_cost, verify_cost)


def breakeven_acceptance(steps: int, draft_cost: float, verify_cost: float = 1.0, speedup: float = 1.0) -> float:
    """The acceptance length needed for `speedup` (1.0 = break even)."""
    return speedup * cycle_cost(steps, draft_cost, verify_cost)


def implied_cycle_cost(baseline_tps: float, spec_tps: float, acceptance_length: float) -> float:
    """C = L * baseline / speculative: what one cycle must have cost, in plain-step units."""
    if baseline_tps <= 0 or spec_tps <= 0:
        raise ValueError("tokens/s must be positive")
    return acceptance_length * baseline_tps / spec_tps


@dataclass
class CostModel:
    """Costs relative to one plain target step of `step_s` seconds."""

    verify_cost: float
    draft_cost: float
    step_s: float | None = None
    source: str = ""

    def speedup(self, acceptance_length: float, steps: int) -> float:
        return predicted_speedup(acceptance_length, steps, self.draft_cost, self.verify_cost)

    def breakeven(self, steps: int, speedup: float = 1.0) -> float:
        return breakeven_acceptance(steps, self.draft_cost, self.verify_cost, speedup)


def fit_costs(steps: list[int], cycle_s: list[float], step_s: float, source: str = "") -> CostModel:
    """Least squares of cycle time / T1 = v + c * S over runs with at least two distinct S."""
    import numpy as np

    if len(set(steps)) < 2:
        raise ValueError(f"need runs at two or more chain lengths to fit v and c, got S = {sorted(set(steps))}")
    s = np.asarray(steps, dtype=float)
    y = np.asarray(cycle_s, dtype=float) / step_s
    (v, c), *_ = np.linalg.lstsq(np.stack([np.ones_like(s), s], axis=1), y, rcond=None)
    return CostModel(verify_cost=float(v), draft_cost=float(c), step_s=step_s, source=source)


def decode_rates(row: dict) -> dict:
    """From an engine.compare() row: T1, the cycle time and tokens per cycle of the decode phase
    (the first token comes from the prefill in both paths and is left out)."""
    g, s = row["greedy"], row["speculative"]
    step_s = g["decode_s"] / max(1, g["completion_tokens"] - g["prompts"])
    cycle_s = s["decode_s"] / max(1, s["verify_steps"])
    per_cycle = (s["completion_tokens"] - s["prompts"]) / max(1, s["verify_steps"])
    return {"steps": row["num_steps"], "step_s": step_s, "cycle_s": cycle_s, "tokens_per_cycle": per_cycle}


def fit_from_runs(rows: list[dict]) -> CostModel:
    """Fit v, c from the engine's chain runs (rows of engine.chain_sweep), T1 from their greedy."""
    rates = [decode_rates(r) for r in rows]
    step_s = sum(r["step_s"] for r in rates) / len(rates)
    return fit_costs(
        [r["steps"] for r in rates],
        [r["cycle_s"] for r in rates],
        step_s,
        source=f"{len(rows)} engine runs ({rows[0]['eval_set']}, {rows[0]['samples']} prompts)",
    )


def check(rows: list[dict], model: CostModel) -> list[dict]:
    """Predicted vs measured decode speedup of each run."""
    out = []
    for r in rows:
        rates = decode_rates(r)
        pred = model.speedup(rates["tokens_per_cycle"], r["num_steps"])
        meas = r["decode_speedup"]
        out.append(
            {
                "steps": r["num_steps"],
                "tokens_per_cycle": rates["tokens_per_cycle"],
                "acceptance_length": r["acceptance_length"],
                "predicted_speedup": pred,
                "measured_speedup": meas,
                "relative_error": (pred - meas) / meas if meas else None,
                "breakeven_acceptance": model.breakeven(r["num_steps"]),
            }
        )
    return out


# A model of two costs needs a third chain length to be checked on a run it was not fitted to, and it
# is drawn only when that check holds within this share of the measured speedup.
MIN_CHAIN_LENGTHS = 3
HELD_OUT_TOLERANCE = 0.25


@dataclass
class Verdict:
    """A break-even fit that may refuse: the model (None when refused), its held-out checks, and why not."""

    model: CostModel | None
    checks: list[dict]
    points: list[dict]  # every measured run: steps, tokens_per_cycle, measured_speedup
    reason: str = ""  # one line: why no model is drawn ("" when one is)


def measured_points(rows: list[dict]) -> list[dict]:
    """What a figure draws whether or not a model is: each run's tokens per cycle and measured speedup."""
    return [
        {"steps": r["num_steps"], "tokens_per_cycle": decode_rates(r)["tokens_per_cycle"], "measured_speedup": m}
        for r in rows
        if (m := r.get("decode_speedup"))
    ]


def held_out_check(rows: list[dict]) -> list[dict]:
    """check() of each chain length against the fit of the others (never of the points it was fitted on)."""
    out = []
    for s in sorted({r["num_steps"] for r in rows}):
        model = fit_from_runs([r for r in rows if r["num_steps"] != s])
        out += [{**c, "held_out": True} for c in check([r for r in rows if r["num_steps"] == s], model)]
    return out


def fit_or_refuse(rows: list[dict]) -> Verdict:
    """The cost model of these chain runs, or the reason none is drawn: too few chain lengths to check
    a two-parameter fit, an unphysical fit (a cost at or below zero: break-even would not rise with
    the chain), or a fit that misses a held-out chain length by more than HELD_OUT_TOLERANCE."""
    points = measured_points(rows)
    lengths = sorted({r["num_steps"] for r in rows})
    if len(lengths) < MIN_CHAIN_LENGTHS:
        return Verdict(
            None,
            [],
            points,
            f"no model drawn: runs at {len(lengths)} chain length(s) (S = {lengths}); two costs (v, c) pass "
            f"exactly through two and leave no run to check them on: measure {MIN_CHAIN_LENGTHS} or more",
        )
    model = fit_from_runs(rows)
    if model.draft_cost <= 0 or model.verify_cost <= 0:
        return Verdict(
            None,
            [],
            points,
            f"no model drawn: the fit is unphysical (v = {model.verify_cost:.2f}, c = {model.draft_cost:.3f}): "
            "a cost at or below zero, break-even not rising with the chain; the timings are too noisy at this scale",
        )
    checks = held_out_check(rows)
    worst = max(checks, key=lambda c: abs(c["relative_error"] or 0.0))
    if abs(worst["relative_error"] or 0.0) > HELD_OUT_TOLERANCE:
        return Verdict(
            None,
            checks,
            points,
            f"no model drawn: fitted without S = {worst['steps']}, it predicts {worst['predicted_speedup']:.2f}x "
            f"there where {worst['measured_speedup']:.2f}x was measured ({worst['relative_error']:+.0%}, beyond "
            f"±{HELD_OUT_TOLERANCE:.0%})",
        )
    return Verdict(model, checks, points)


def fit_chain(chain: list[dict], archs) -> tuple[dict, dict, str | None, dict]:
    """(fits, held-out checks, the arch whose fit later sections use or None, {arch: Verdict}) of the chain runs."""
    verdicts = {a: fit_or_refuse(rows) for a in archs if (rows := [r for r in chain if r["arch"] == a])}
    fits = {a: v.model for a, v in verdicts.items() if v.model is not None}
    checks = {a: v.checks for a, v in verdicts.items() if v.model is not None}
    model_arch = "eagle3" if "eagle3" in fits else next(iter(fits), None)
    return fits, checks, model_arch, verdicts


def refusals(verdicts: dict) -> str:
    """One line per arch whose model is not drawn, saying why ("" when every fit holds)."""
    return "\n".join(f"{arch}: {v.reason}" for arch, v in verdicts.items() if v.model is None)


def figure(verdicts: dict, setting: str):
    """eagle3's (else the first arch's) measured runs as dots, with the model's line for each of their chain
    lengths when a model is drawn; otherwise the dots and the one line that says why none is. None: no runs."""
    import matplotlib.pyplot as plt

    if not verdicts:
        return None
    arch = "eagle3" if "eagle3" in verdicts else next(iter(verdicts))
    verdict = verdicts[arch]
    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    steps = sorted({p["steps"] for p in verdict.points})
    if verdict.model is not None:
        plot(
            ax,
            verdict.model,
            steps,
            verdict.checks,
            title=f"{arch} on {setting}: v={verdict.model.verify_cost:.2f}, c={verdict.model.draft_cost:.3f}",
        )
        return fig
    for s in steps:
        pts = [p for p in verdict.points if p["steps"] == s]
        ax.scatter([p["tokens_per_cycle"] for p in pts], [p["measured_speedup"] for p in pts], label=f"S={s}", zorder=3)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("acceptance length (tokens per verify step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(f"{arch} on {setting}: measured runs")
    if steps:
        ax.legend()
    ax.text(0.0, -0.16, verdict.reason, transform=ax.transAxes, va="top", ha="left", wrap=True, color="tab:red")
    return fig


def worked_example(
    baseline_tps: float = 90.0,
    spec_tps: float = 82.3,
    acceptance_length: float = 2.1,
    draft_tokens: int = 5,
    topk: int = 1,
    verify_cost: float = 1.0,
) -> dict:
    """The deployment that motivated draftlab: slower with speculation than without.

    With topk 1, D = 5 draft tokens means S = 4 draft steps. v = 1 assumes the verify of D
    tokens costs one decode step (large target, small batch); the implied cycle cost itself
    needs no assumption.
    """
    steps = draft_tokens - 1 if topk == 1 else None
    cost = implied_cycle_cost(baseline_tps, spec_tps, acceptance_length)
    out = {
        "baseline_tps": baseline_tps,
        "spec_tps": spec_tps,
        "acceptance_length": acceptance_length,
        "draft_tokens": draft_tokens,
        "topk": topk,
        "steps": steps,
        "verify_cost_assumed": verify_cost,
        "measured_speedup": spec_tps / baseline_tps,
        "implied_cycle_cost": cost,  # in plain target steps
        "implied_draft_overhead": cost - verify_cost,
    }  # everything but the verify, per cycle
    if steps:
        model = CostModel(verify_cost, (cost - verify_cost) / steps, source="worked example")
        out.update(
            {
                "implied_draft_cost_per_step": model.draft_cost,
                "breakeven_acceptance": model.breakeven(steps),
                "acceptance_for_1_5x": model.breakeven(steps, 1.5),
                "acceptance_for_2x": model.breakeven(steps, 2.0),
                "max_acceptance": steps + 1,
            }
        )
    return out


def curve(model: CostModel, steps: int, lengths=None) -> tuple[list[float], list[float]]:
    """(acceptance lengths, predicted speedups) for a plot, from 1 to the chain bound S + 1."""
    lengths = lengths or [1 + i * steps / 50 for i in range(51)]
    return lengths, [model.speedup(x, steps) for x in lengths]


def plot(ax, model: CostModel, steps_list, measured: list[dict] | None = None, title: str = "") -> None:
    """Break-even curves (one per S) with measured runs as points (measured_speedup vs tokens/cycle)."""
    for s in steps_list:
        x, y = curve(model, s)
        pts = [m for m in (measured or []) if m["steps"] == s and m["measured_speedup"]]
        miss = [m["relative_error"] for m in pts if m.get("held_out") and m.get("relative_error") is not None]
        note = f", held-out miss {max(miss, key=abs):+.0%}" if miss else ""
        (line,) = ax.plot(x, y, label=f"S={s} (break-even L={model.breakeven(s):.2f}{note})")
        if pts:
            ax.scatter(
                [m["tokens_per_cycle"] for m in pts],
                [m["measured_speedup"] for m in pts],
                color=line.get_color(),
                zorder=3,
            )
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("acceptance length (tokens per verify step)")
    ax.set_ylabel("speedup over plain decoding")
    ax.set_title(title or f"break-even model: v={model.verify_cost:.2f}, c={model.draft_cost:.3f}")
    ax.legend()
    explain(ax)


CAPTION = (
    "v: the cost of one verify pass, c: the cost of one draft step, both in plain decoding steps of the "
    "target (fitted to the chain runs' timings). A cycle of S draft steps costs v + S·c and yields L tokens: "
    "predicted speedup L / (v + S·c), break-even at L = v + S·c. Lines: the model; dots: measured runs."
)


def explain(ax) -> None:
    """The caption under a break-even plot: what v and c are and how the curves follow from them."""
    ax.text(0.0, -0.16, CAPTION, transform=ax.transAxes, fontsize=7, va="top", ha="left", wrap=True, color="dimgray")


def as_dict(model: CostModel) -> dict:
    return asdict(model)
