"""Where a real training step's time goes: `draftlab train`'s own run (data, batches, recipe), a few
steps under torch.profiler.

Why: on the H200 the loop trains ~76-79K tok/s while the target's hidden-state forward alone runs
~612K tok/s (issue 18 asks for at least half of that). The third session profiled a step at fixed
shapes with random weights; this profiles the real loop on real batches.

  python3 benchmarks/profile_train_loop.py OUT_DIR [--steps 10] [--warm 5] -- [draftlab train flags]
  e.g. ... OUT -- --train-file data/regen/train.jsonl --target embedded --device cuda --max-train-samples 1500

Writes OUT_DIR/train_loop_profile.txt (the top ops by device time) and OUT_DIR/train_loop.json
(median step seconds and tokens/s, with and without the profiler).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from draftlab.train_draft.cli import add_train_parser, config_from_args
from draftlab.train_draft.loop import TrainingRun


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def timed_steps(run: TrainingRun, n: int) -> list[float]:
    """Seconds of each of the next n optimizer steps (synchronised)."""
    out = []
    for _ in range(n):
        t = time.perf_counter()
        run.train_step(*run.where[run.step])
        _sync(run.device)
        out.append(time.perf_counter() - t)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warm", type=int, default=5)
    ours, train_argv = (
        (sys.argv[1:], [])
        if "--" not in sys.argv
        else (sys.argv[1 : sys.argv.index("--")], sys.argv[sys.argv.index("--") + 1 :])
    )
    args = ap.parse_args(ours)
    sub = argparse.ArgumentParser().add_subparsers()
    cfg = config_from_args(add_train_parser(sub).parse_args(train_argv + ["--out-dir", str(args.out_dir / "run")]))
    run = TrainingRun(cfg)
    run.setup()
    need = args.warm + 2 * args.steps
    if run.total_steps - run.step < need:
        raise SystemExit(
            f"{cfg.train_file}: the plan has {run.total_steps - run.step} steps, the profile needs {need} "
            "(--warm + 2 x --steps); raise --epochs or give more data"
        )
    run.t2d, run.dids, run.tok_seen = run.draft.t2d, run.draft.draft_ids(), 0
    run.draft.train()
    timed_steps(run, args.warm)
    tokens0, plain = run.tok_seen, timed_steps(run, args.steps)
    tokens = run.tok_seen - tokens0
    with profile(
        activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.device.startswith("cuda") else [])
    ) as prof:
        profiled = timed_steps(run, args.steps)
    key = "cuda_time_total" if run.device.startswith("cuda") else "cpu_time_total"
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "train_loop_profile.txt").write_text(prof.key_averages().table(sort_by=key, row_limit=50))
    result = {
        "device": run.device,
        "steps": args.steps,
        "step_s_median": statistics.median(plain),
        "tokens_per_s": tokens / sum(plain),
        "step_s_median_profiled": statistics.median(profiled),
        "recipe": {
            k: getattr(cfg, k)
            for k in (
                "batch_tokens",
                "max_batch",
                "ttt_steps",
                "draft_vocab_size",
                "recompute_head",
                "compile",
                "attention",
            )
        },
    }
    (args.out_dir / "train_loop.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
