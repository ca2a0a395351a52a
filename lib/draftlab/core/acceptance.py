"""Acceptance length: the one definition (docs/eagle3-contract.md section 5, design.md).

acceptance length = sum(tokens emitted) / sum(verify steps), bonus token included, token-weighted
over all requests; per-request means weight short answers too heavily. Every measurement in
draftlab (live servers, the SGLang probe, the reference engine, prompt lookup, the scaling
study) calls `acceptance_length`; training's simulated figure is `simulated_acceptance`.
"""

from __future__ import annotations

import random
from typing import Iterable


def acceptance_length(tokens: int | Iterable[int], verify_steps: int | Iterable[int]) -> float | None:
    """Token-weighted acceptance length from totals or per-request counts; None without verify steps."""
    tokens = tokens if isinstance(tokens, (int, float)) else sum(tokens)
    verify_steps = verify_steps if isinstance(verify_steps, (int, float)) else sum(verify_steps)
    return tokens / verify_steps if verify_steps else None


def acceptance_se(tokens: list[int], verify_steps: list[int], draws: int = 1000, seed: int = 0) -> float | None:
    """The bootstrap standard error of acceptance_length over requests (resampled with replacement), for
    fits that weight points by their uncertainty; None with fewer than two requests."""
    if len(tokens) < 2:
        return None
    rng, n = random.Random(seed), len(tokens)
    values = []
    for _ in range(draws):
        picks = [rng.randrange(n) for _ in range(n)]
        value = acceptance_length([tokens[i] for i in picks], [verify_steps[i] for i in picks])
        if value is not None:
            values.append(value)
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5


def simulated_acceptance(rates: Iterable[float]) -> float:
    """1 + a0 + a0*a1 + ...: the expected tokens per verify of a chain whose step i is accepted
    with probability a_i given the earlier ones (the per-position acceptance rates)."""
    total, chain = 1.0, 1.0
    for rate in rates:
        chain *= rate
        total += chain
    return total
