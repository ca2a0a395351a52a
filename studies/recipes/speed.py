"""The recipe study's training-speed check (`python -m studies.recipes speed`): the reference recipe for a few steps by
each objective variant, one after the other on the tokens every row shares. Why: which implementation the
study's rows should train with, measured on the GPU they train on.
"""

from __future__ import annotations

import csv
import shutil
import sys
import time
from pathlib import Path

from draftlab.core.errors import InputError
from draftlab.core.files import atomic_write_json
from draftlab.core.process import run_until
from draftlab.train_draft import (
    OBJECTIVE_VARIANTS,
    TrainConfig,
    child_env,
    cli_args,
    precompute_first,
    tokenize_first,
)
from studies.recipes.rows import recipe
from studies.recipes.study import shared

SPEED_NOTE = (
    "draftlab train, the reference recipe (rows.BASE), the study's regenerated data, one process "
    "each, one after the other"
)


# the objective's variants, and the compiled one on offline target states (the forward paid once, not per step)
SPEED_VARIANTS = {**OBJECTIVE_VARIANTS, "offline": {"compile": True, "hidden": "offline"}}


def speed_config(
    variant: str, train_file: str, val_file: str, out: Path, target: str, steps: int, samples: int, extra: dict
) -> TrainConfig:
    """The reference recipe for `steps` steps by one variant (SPEED_VARIANTS), in OUT/speed/<variant>."""
    if variant not in SPEED_VARIANTS:
        raise InputError(f"speed variant {variant!r}: expected one of {', '.join(SPEED_VARIANTS)}")
    return TrainConfig.from_dict(
        {
            **recipe("base"),
            "train_file": train_file,
            "val_file": val_file,
            "out_dir": str(out / "speed" / variant),
            "target": target,
            **shared(out),
            "stop_after": steps,
            "max_train_samples": samples,
            "log_every": 10,
            "save_every": 10**6,
            **SPEED_VARIANTS[variant],
            **extra,
        }
    )


def rate_after_warmup(rows: list[dict]) -> dict | None:
    """tok/s between the first and the last logged rows of a train.csv (the first window is warm-up);
    None with fewer than three rows. Each row's tokens_per_s is cumulative since the start."""
    if len(rows) < 3:
        return None
    a, b = rows[0], rows[-1]
    ta, tb = float(a["elapsed_s"]), float(b["elapsed_s"])
    tokens = float(b["tokens_per_s"]) * tb - float(a["tokens_per_s"]) * ta
    return {
        "steps": int(b["step"]),
        "tok_s_after_warmup": tokens / (tb - ta),
        "tok_s_cumulative": float(b["tokens_per_s"]),
        "loss": float(b["loss"]),
    }


def check_speed(
    variants: list[str],
    train_file: str,
    val_file: str,
    out: Path,
    *,
    target: str = "embedded",
    steps: int = 30,
    samples: int = 0,
    per_variant_s: float = 240,
    extra: dict | None = None,
) -> dict:
    """Each objective variant trains the reference recipe for `steps` steps, one after the other on the
    tokens every row shares; their rates after the first logged window (and the loss there, which should
    agree) in OUT/speed.json. Why: which implementation the study's rows should train with."""
    cfgs = {v: speed_config(v, train_file, val_file, out, target, steps, samples, extra or {}) for v in variants}
    tokenize_first(list(cfgs.values()))
    precompute_first(list(cfgs.values()))  # (before the clock: the rows' parent pays it once too)
    res = {}
    for variant, cfg in cfgs.items():
        shutil.rmtree(cfg.out_dir, ignore_errors=True)
        Path(cfg.out_dir).mkdir(parents=True)
        with open(out / "speed" / f"{variant}.log", "wb") as log:
            rc = run_until(
                [sys.executable, "-m", "draftlab.cli", "train", *cli_args(cfg, resume=False)],
                time.time() + per_variant_s,  # a measured window, not a deadline
                stdout=log,
                stderr=log,
                env=child_env(1),
            )
        log_csv = Path(cfg.out_dir) / "train.csv"
        rate = rate_after_warmup(list(csv.DictReader(log_csv.read_text().splitlines()))) if log_csv.is_file() else None
        print(f"speed {variant}: exit {'cut' if rc is None else rc}, {rate}", flush=True)
        if rate:
            res[variant] = rate
    res["note"] = SPEED_NOTE
    atomic_write_json(out / "speed.json", res, indent=1)
    return res
