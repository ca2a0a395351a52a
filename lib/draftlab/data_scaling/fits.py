"""Curve fits of acceptance vs data, and the extrapolation with its regeneration cost."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from draftlab.core.records import read_jsonl
from draftlab.core.run_folder import RunFolder
from draftlab.data_scaling.plan import ARCHS

# ---------------------------------------------------------------------------------- curve fits


def loglinear(n, a, b):
    """y = a + b log10(n): keeps rising by b per decade (optimistic when extrapolated)."""
    return a + b * np.log10(n)


def saturating(n, y_inf, b, c):
    """y = y_inf - b (n / 1000)^(-c): approaches y_inf (conservative when extrapolated)."""
    return y_inf - b * np.power(np.asarray(n, dtype=float) / 1000.0, -c)


def logistic(n, log10_n50, k, ceiling):
    """y = 1 + (ceiling - 1) / (1 + (n50 / n)^k): rises ever faster in log n below n50, ever slower above it,
    towards a ceiling that is given, not fitted: a chain of S draft tokens accepts at most S + 1 a cycle. Why:
    the recipe study's SGLang points bend upwards in log n, which no concave curve (loglinear,
    saturating) follows, and a fitted ceiling ran to the chain's own."""
    return 1.0 + (ceiling - 1.0) / (1.0 + np.power(10.0, k * (log10_n50 - np.log10(np.asarray(n, dtype=float)))))


MODELS = {"loglinear": (loglinear, 2), "saturating": (saturating, 3), "logistic": (logistic, 2)}
PARAMS = {"loglinear": ("a", "b"), "saturating": ("y_inf", "b", "c"), "logistic": ("log10_n50", "k")}


def curve(model: str, ceiling: float | None = None):
    """The model as a function of (n, *params): the logistic's ceiling bound in."""
    fn = MODELS[model][0]
    return (lambda n, *params: fn(n, *params, ceiling)) if model == "logistic" else fn


@dataclass
class Fit:
    model: str
    params: list
    cov: list
    dof: int
    scale: float  # factor applied to the covariance (reduced chi-square when > 1)
    ok: bool
    reason: str = ""
    ceiling: float | None = None  # the logistic's, given

    def predict(self, n):
        return curve(self.model, self.ceiling)(np.asarray(n, dtype=float), *self.params)

    def band(self, n, level: float = 0.95, draws: int = 4000, seed: int = 0):
        """(low, high) of the prediction at n from parameter draws ~ N(params, cov)."""
        n = np.asarray(n, dtype=float)
        rng = np.random.default_rng(seed)
        samples = rng.multivariate_normal(self.params, np.asarray(self.cov), size=draws, check_valid="ignore")
        with np.errstate(all="ignore"):
            preds = np.stack([curve(self.model, self.ceiling)(n, *s) for s in samples])
        preds = preds[np.all(np.isfinite(preds), axis=1)]
        q = (1 - level) / 2
        return np.quantile(preds, q, axis=0), np.quantile(preds, 1 - q, axis=0)


def fit_curve(n, y, se=None, model: str = "loglinear", ceiling: float | None = None) -> Fit:
    """Weighted least squares with scipy's curve_fit; covariance from the standard errors, scaled up
    by the reduced chi-square when the points scatter more than their errors say. `ceiling`: the
    logistic's (the chain's S + 1), which it needs."""
    from scipy.optimize import curve_fit

    ceiling = ceiling if model == "logistic" else None
    fn, k = curve(model, ceiling), MODELS[model][1]
    n, y = np.asarray(n, dtype=float), np.asarray(y, dtype=float)
    if len(n) < k + 1 or len(set(n.tolist())) < k:
        return Fit(model, [], [], len(n) - k, 1.0, False, f"{len(n)} points: need at least {k + 1} for {model}")
    if model == "logistic" and (ceiling is None or y.max() >= ceiling):
        reason = (
            "no ceiling given (a chain's S + 1)" if ceiling is None else f"a point at or above its ceiling {ceiling:g}"
        )
        return Fit(model, [], [], len(n) - k, 1.0, False, reason, ceiling)
    sigma = None
    if se is not None and all(s is not None and s > 0 for s in se):
        sigma = np.asarray(se, dtype=float)
    if model == "loglinear":
        p0, bounds = [float(y.mean()), 0.1], (-np.inf, np.inf)
    elif model == "logistic":
        p0, bounds = [float(np.log10(n.max())), 0.5], ([0.0, 0.01], [12.0, 5.0])
    else:
        p0 = [float(y.max()) + 0.2, max(float(y.max() - y.min()), 0.05), 0.5]
        bounds = ([float(y.max()) - 1e-6, 0.0, 1e-3], [np.inf, np.inf, 5.0])
    try:
        params, cov = curve_fit(
            fn, n, y, p0=p0, sigma=sigma, absolute_sigma=sigma is not None, bounds=bounds, maxfev=20000
        )
    except (RuntimeError, ValueError) as exc:
        return Fit(model, [], [], len(n) - k, 1.0, False, f"fit failed: {exc}", ceiling)
    dof = len(n) - k
    resid = (y - fn(n, *params)) / (sigma if sigma is not None else 1.0)
    chi2 = float((resid**2).sum())
    scale = max(1.0, chi2 / dof) if (sigma is not None and dof > 0) else 1.0
    cov = np.asarray(cov) * scale
    if not np.all(np.isfinite(cov)):
        return Fit(model, params.tolist(), cov.tolist(), dof, scale, False, "covariance not finite", ceiling)
    # a parameter pinned at its bound leaves a covariance that means nothing (the recipe study's saturating
    # fit of four SGLang points sat at c = 0.001 and drew a 95% band of -1.7e8 .. -1044)
    pinned = [
        name
        for name, value, lo, hi in zip(PARAMS[model], params, *(np.broadcast_to(b, k) for b in bounds))
        if np.isclose(value, lo, rtol=1e-6, atol=1e-9) or np.isclose(value, hi, rtol=1e-6, atol=1e-9)
    ]
    if pinned:
        return Fit(
            model,
            params.tolist(),
            cov.tolist(),
            dof,
            scale,
            False,
            f"{', '.join(pinned)} at its bound: these points do not pin the {model} curve down",
            ceiling,
        )
    return Fit(model, params.tolist(), cov.tolist(), dof, scale, True, "", ceiling)


def ceiling_of(depths) -> float | None:
    """The most one cycle can accept at a chain of depth S: S + 1; None when the depths differ or are unknown."""
    depths = set(depths)
    return float(depths.pop() + 1) if len(depths) == 1 and None not in depths else None


def chain_ceiling(points: list[dict]) -> float | None:
    """The logistic's ceiling for chain acceptance: the points' `chain_steps` S, plus 1."""
    return ceiling_of(p.get("chain_steps") for p in points)


def sim_ceiling(results: list[dict]) -> float | None:
    """The logistic's ceiling for simulated acceptance (1 + a0 + a0*a1 + ...): the training-time-test depth, the
    length of each row's `acc`, plus 1."""
    return ceiling_of(len(r["acc"]) if r.get("acc") else None for r in results)


# A curve of two or three parameters through three data sizes has at most one point to spare, and
# its 10x extrapolation and 95% band then rest on the curve's shape, not on the data: below this many
# sizes nothing is fitted or extrapolated.
MIN_SIZES = 4


def fit_all(
    results: list[dict], metric: str = "sim_accept_len", ceiling: float | None = None, min_sizes: int = MIN_SIZES
) -> dict:
    """{arch: {model: Fit}} over the result rows of each architecture; `ceiling`: the logistic's. Fewer than
    `min_sizes` distinct sizes: every Fit refused (ok False) with the reason, nothing to extrapolate."""
    fits = {}
    for arch in ARCHS:
        rows = sorted((r for r in results if r["arch"] == arch and r.get(metric) is not None), key=lambda r: r["n"])
        if not rows:
            continue
        n = [r["n"] for r in rows]
        y = [r[metric] for r in rows]
        se = [r.get(metric + "_se") for r in rows]
        sizes = sorted(set(n))
        if len(sizes) < min_sizes:
            reason = (
                f"no curve drawn: {len(sizes)} data sizes (n = {', '.join(f'{x:g}' for x in sizes)}); a curve "
                f"through fewer than {min_sizes} leaves no size to check it on, so nothing is extrapolated"
            )
            fits[arch] = {m: Fit(m, [], [], len(n) - MODELS[m][1], 1.0, False, reason) for m in MODELS}
            continue
        fits[arch] = {m: fit_curve(n, y, se, m, ceiling) for m in MODELS}
    return fits


def refusal(fits: dict) -> str:
    """One line saying why no curve is drawn for any architecture ("" when one is)."""
    if any(f.ok for by_model in fits.values() for f in by_model.values()):
        return ""
    reasons = [f.reason for by_model in fits.values() for f in by_model.values()]
    return reasons[0] if reasons else "no curve drawn: no finished point"


# ---------------------------------------------------------------------------------- costs and extrapolation


def completion_tokens(rows: list[dict]) -> list[int]:
    """Each regenerated conversation's answer tokens (its rows' meta.regen counts, every turn)."""
    return [sum(x or 0 for x in (r.get("meta", {}).get("regen", {}).get("completion_tokens") or [])) for r in rows]


def regen_throughput(run_dir) -> dict:
    """Completion tokens/s of regeneration and mean completion tokens per training conversation.

    The rate comes from 03's metrics (`splits.train.tok_s`, else any `tok_s` under "03_regenerate"); without
    it, from the rows' own token counts and finish times (meta.regen.t_done span), marked as such.
    """
    run_dir = Path(run_dir)
    rows = list(read_jsonl(RunFolder(run_dir).split("regen", "train")))
    tokens = completion_tokens(rows)
    out = {
        "conversations": len(rows),
        "completion_tokens": int(sum(tokens)),
        "mean_completion_tokens": float(np.mean(tokens)) if tokens else None,
        "tok_s": None,
        "tok_s_source": None,
    }
    metrics = RunFolder(run_dir).metrics
    if metrics.is_file():
        m03 = json.loads(metrics.read_text()).get("03_regenerate", {})
        found = ((m03.get("splits") or {}).get("train") or {}).get("tok_s") or _find_key(m03, "tok_s")
        if found:
            out["tok_s"], out["tok_s_source"] = float(found), "metrics.json 03_regenerate"
    if out["tok_s"] is None:
        done = [r["meta"]["regen"].get("t_done") for r in rows if r.get("meta", {}).get("regen", {}).get("t_done")]
        if len(done) > 1 and max(done) > min(done):
            out["tok_s"] = sum(tokens) / (max(done) - min(done))
            out["tok_s_source"] = "row timestamps (first to last finished row; a lower bound on the rate)"
    return out


def _find_key(obj, key):
    if isinstance(obj, dict):
        if isinstance(obj.get(key), (int, float)) and obj[key]:
            return obj[key]
        for v in obj.values():
            hit = _find_key(v, key)
            if hit:
                return hit
    return None


def extrapolate(
    fits: dict,
    results: list[dict],
    regen: dict,
    factor: float = 10.0,
    goal: float | None = None,
    metric: str = "sim_accept_len",
) -> dict:
    """Predicted acceptance at factor x the largest subset (95% band) per architecture and model,
    with the regeneration and training time the extra data would cost."""
    out = {}
    for arch, by_model in fits.items():
        rows = [r for r in results if r["arch"] == arch]
        n_max = max(r["n"] for r in rows)
        n_new = factor * n_max
        biggest = [r for r in rows if r["n"] == n_max and r.get("train_s")]
        sec_per_row = (biggest[0]["train_s"] / n_max) if biggest else None
        extra_rows = n_new - n_max
        regen_s = (
            extra_rows * regen["mean_completion_tokens"] / regen["tok_s"]
            if regen.get("tok_s") and regen.get("mean_completion_tokens")
            else None
        )
        entry = {
            "n_now": n_max,
            "n_new": n_new,
            "measured_now": max((r[metric] for r in rows if r["n"] == n_max), default=None),
            "extra_conversations": extra_rows,
            "regeneration_hours": regen_s / 3600 if regen_s is not None else None,
            "training_hours_at_new_size": sec_per_row * n_new / 3600 if sec_per_row else None,
        }
        for model, fit in by_model.items():
            if not fit.ok:
                entry[model] = {"ok": False, "reason": fit.reason}
                continue
            lo, hi = fit.band([n_max, n_new])
            pred = fit.predict([n_max, n_new])
            e = {
                "ok": True,
                "params": fit.params,
                "pred_now": float(pred[0]),
                "pred_new": float(pred[1]),
                "band_new": [float(lo[1]), float(hi[1])],
                "gain": float(pred[1] - pred[0]),
                "dof": fit.dof,
                "cov_scale": fit.scale,
            }
            if goal is not None:
                e["goal"] = goal
                e["reaches_goal"] = bool(lo[1] >= goal) if lo[1] >= goal else (False if hi[1] < goal else None)
            entry[model] = e
        out[arch] = entry
    return out
