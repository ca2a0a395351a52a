"""The cycle-cost fit of `draftlab bench cost`: what one speculative cycle costs, in plain decode steps.

With the acceptance forced to tau tokens per verify (SGLang's SGLANG_SIMULATE_ACC_LEN), a server
emits tau tokens per cycle, so

    tok/s_spec = tau / cycle_s          tok/s_plain = 1 / step_s        (per stream)
    speedup    = tok/s_spec / tok/s_plain = tau / C,   C = cycle_s / step_s   (the cycle cost)

C grows a little with tau (more accepted tokens to write back and to extend the draft over), so
it is fitted per setting and batch size as C(tau) = c0 + c1 * tau over the measured points. The
acceptance needed for a speedup x is then tau_x = x * c0 / (1 - x * c1); a chain of S steps cannot
accept more than S + 1 tokens, so a tau_x above that is out of reach at that setting.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from draftlab.core.errors import RunFailure

TARGETS = (1.0, 1.5, 2.0)  # the speedups reported: break even, 1.5x, 2x
MIN_CYCLE_COST = 0.5  # a cycle verifies at least one token per stream: below half a plain step is not physical
ACCEPTANCE_TOLERANCE = 0.10  # measured acceptance may differ from the forced one by this share (last cycles)


class FitError(RunFailure):
    """The measurements cannot give a cycle cost (too few points, or not physical): one line saying why."""


@dataclass
class CycleFit:
    """C(tau) = c0 + c1 * tau plain steps per cycle, for one shape, setting and batch size."""

    shape: str
    setting: str
    batch: int
    max_acceptance: int  # S + 1: the most a cycle can accept
    c0: float
    c1: float
    points: int
    max_residual: float  # largest |predicted - measured| / measured speedup over the points
    measured_span: tuple[float, float] = (1.0, 1.0)  # lowest and highest acceptance measured (tokens per cycle)

    def cycle_cost(self, acceptance: float) -> float:
        return self.c0 + self.c1 * acceptance

    def speedup(self, acceptance: float) -> float:
        """Predicted speedup over plain decoding at this acceptance length (1 .. S + 1)."""
        if not 1.0 <= acceptance <= self.max_acceptance + 1e-9:
            raise FitError(
                f"acceptance {acceptance:g} outside 1 .. {self.max_acceptance} (setting {self.setting}: "
                f"a cycle accepts at most {self.max_acceptance} tokens)"
            )
        return acceptance / self.cycle_cost(acceptance)

    def needed(self, speedup: float) -> float | None:
        """The acceptance length that gives `speedup`; None when no reachable acceptance does."""
        denom = 1.0 - speedup * self.c1
        if denom <= 0:
            return None
        tau = speedup * self.c0 / denom
        return max(tau, 1.0) if tau <= self.max_acceptance else None

    def as_dict(self) -> dict:
        out = asdict(self)
        out["cycle_cost_at_1"] = self.cycle_cost(1.0)
        out["cycle_cost_at_max"] = self.cycle_cost(float(self.max_acceptance))
        for x in TARGETS:
            out[f"acceptance_for_{x:g}x"] = self.needed(x)
        return out


def fit_cycle(
    points: list[tuple[float, float]],
    *,
    shape: str,
    setting: str,
    batch: int,
    max_acceptance: int,
    measured: list[float | None] | None = None,
) -> CycleFit:
    """Least squares of C = tau / speedup against tau over (forced acceptance, speedup) points.

    `measured`: the acceptance each point's server reported (None: not reported); where given it is
    the tokens per cycle the fit uses (a request's first token comes from the prefill and its last
    cycle may be cut by the token limit, so it sits a little below the forced value). Raises FitError,
    one line naming the setting and batch, for too few points or measurements that no cycle cost explains."""
    where = f"{shape} {setting} batch {batch}"
    if any(not (math.isfinite(s) and s > 0) for _, s in points):
        raise FitError(f"{where}: a speedup is not a positive number ({[round(s, 4) for _, s in points]})")
    taus = sorted({float(t) for t, _ in points})
    if len(taus) < 2:
        raise FitError(f"{where}: {len(points)} point(s) at acceptance {taus}; the fit needs two or more acceptances")
    for (tau, _), got in zip(points, measured or [None] * len(points)):
        if got is not None and abs(got - tau) > ACCEPTANCE_TOLERANCE * tau:
            raise FitError(
                f"{where}: the server measured acceptance {got:.2f} at forced {tau:g}: "
                "SGLANG_SIMULATE_ACC_LEN was not in effect"
            )
    low = [s for t, s in points if t == taus[0]]
    high = [s for t, s in points if t == taus[-1]]
    if sum(high) / len(high) <= sum(low) / len(low):
        raise FitError(
            f"{where}: speedup does not rise with the forced acceptance ({taus[0]:g} -> {taus[-1]:g}); "
            "the forced acceptance had no effect"
        )
    points = [(t if got is None else got, s) for (t, s), got in zip(points, measured or [None] * len(points))]
    n = len(points)
    xs = [float(t) for t, _ in points]
    ys = [float(t) / s for t, s in points]  # cycle cost of each point, in plain steps
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    c1 = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx
    c0 = my - c1 * mx
    fit = CycleFit(shape, setting, int(batch), int(max_acceptance), c0, c1, n, 0.0, (min(xs), max(xs)))
    if min(fit.cycle_cost(1.0), fit.cycle_cost(float(max_acceptance))) < MIN_CYCLE_COST:
        raise FitError(
            f"{where}: fitted cycle cost {fit.cycle_cost(1.0):.2f} .. {fit.cycle_cost(float(max_acceptance)):.2f} "
            f"plain steps; below {MIN_CYCLE_COST} is not physical (baseline and speculative runs disagree)"
        )
    fit.max_residual = max(abs(t / fit.cycle_cost(t) - s) / s for t, s in points)
    return fit


def fit_table(rows: list[dict], max_acceptance: dict[str, int]) -> tuple[list[CycleFit], list[str]]:
    """Fits for every (shape, setting, batch) of table rows; (fits, one-line refusals)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["shape"], r["setting"], int(r["batch"])), []).append(r)
    fits, errors = [], []
    for (shape, setting, batch), group in sorted(groups.items()):
        try:
            fits.append(
                fit_cycle(
                    [(float(r["acceptance"]), float(r["speedup"])) for r in group],
                    shape=shape,
                    setting=setting,
                    batch=batch,
                    max_acceptance=max_acceptance[setting],
                    measured=[_number(r.get("measured_acceptance")) for r in group],
                )
            )
        except FitError as exc:
            errors.append(str(exc))
    return fits, errors


def _number(value) -> float | None:
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def predict_speedup(fits: list[CycleFit], acceptance: float, *, setting: str, batch: int, shape: str | None = None):
    """The fitted speedup at `acceptance` for one setting and batch size (of `shape`, or the only shape).

    E.g. what a draft measured at acceptance 4.10 with chain S = 6 buys on a target at batch 1:
    predict_speedup(fits, 4.10, setting="chain6", batch=1)."""
    match = [f for f in fits if f.setting == setting and f.batch == batch and shape in (None, f.shape)]
    shapes = sorted({f.shape for f in match})
    if not match:
        raise FitError(f"no fit for setting {setting} at batch {batch}" + (f" on {shape}" if shape else ""))
    if len(shapes) > 1:
        raise FitError(f"fits of several shapes ({', '.join(shapes)}) for {setting} batch {batch}: name the shape")
    return match[0].speedup(acceptance)
