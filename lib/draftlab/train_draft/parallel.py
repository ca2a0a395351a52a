"""Several drafts trained at once on one GPU: one `draftlab train` process each.

A draft's training step leaves part of an H200 idle (a profiled 16,384-token step: 151 ms of
kernels in 181 ms of wall time; the step is bound by kernel launches, not arithmetic), so the
EAGLE-3 and EAGLE-1-style drafts of notebook 04 can share the GPU instead of taking turns; how
much that gains is not measured yet. Each process trains into its own folder exactly as `draftlab train --resume` would;
the parent tokenises once (the children then read the cache instead of writing it together),
shows the steps of all of them in one tqdm bar, and raises with a log's tail when one fails.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from draftlab.core.process import die_with_parent
from draftlab.core.progress import tqdm
from draftlab.model.target import load_tokenizer, resolve_path
from draftlab.train_draft.checkpoint import load_checkpoint_draft
from draftlab.train_draft.config import TrainConfig
from draftlab.train_draft.loop import TrainingRun, tokenized


def cli_args(cfg: TrainConfig, resume: bool) -> list[str]:
    """`draftlab train` arguments that rebuild `cfg` (every TrainConfig field is a flag)."""
    args = []
    for f in dataclasses.fields(TrainConfig):
        value = getattr(cfg, f.name)
        flag = "--" + f.name.replace("_", "-")
        if isinstance(value, list):
            if value:
                args += [flag, *map(str, value)]
        else:
            args += [flag, str(value)]
    return args + (["--resume"] if resume else [])


def child_env(n_children: int) -> dict:
    """The environment for each child: the cores split between them, unless OMP_NUM_THREADS is set.

    16 OpenMP threads per process on 16 cores made every small CPU op of the set-up spin against
    the other process (dev/LOG.md)."""
    threads = os.environ.get("OMP_NUM_THREADS") or str(max(1, (os.cpu_count() or 1) // n_children))
    return {**os.environ, "OMP_NUM_THREADS": threads}


def _terminate_with_parent() -> None:
    """A child gets SIGTERM when the process that started it dies: a killed notebook kernel must not leave
    trainings running on the GPU (each checkpoints on the signal, core.stop, and a rerun resumes it)."""
    die_with_parent(signal.SIGTERM)


def _steps_done(out_dir: Path) -> int:
    csv = out_dir / "train.csv"
    if not csv.is_file():
        return 0
    lines = csv.read_text().strip().splitlines()
    return int(lines[-1].split(",")[0]) if len(lines) > 1 else 0


def _total_steps(log: Path) -> int | None:
    m = re.search(r"(\d+) steps x \d+ micro-batches", log.read_text(errors="replace")) if log.is_file() else None
    return int(m.group(1)) if m else None


def tokenize_first(cfgs: list[TrainConfig], target=None) -> None:
    """Tokenise every config's train and val files into its cache (TrainConfig.token_cache_dir) before
    the training processes start: they then read the cache instead of writing it at the same time."""
    tokenizer = target.tokenizer if target is not None else load_tokenizer(str(resolve_path(cfgs[0].target)))
    for c in cfgs:
        tokenized(c, tokenizer)


def precompute_first(cfgs: list[TrainConfig], target=None) -> None:
    """The offline configs' target states, computed here once per store (TrainConfig.hidden_dir) before the
    training processes start: rows that share a store then only read it (precompute_hidden finds it
    complete), and the target's forward is paid once for all of them instead of once per row and epoch."""
    done = set()
    for c in cfgs:
        if c.hidden != "offline" or c.hidden_dir in done:
            continue
        if not c.hidden_dir:
            raise ValueError(f"{c.out_dir}: hidden='offline' rows started together need a shared hidden_dir")
        run = TrainingRun(c, target=target)
        run.prepare()
        target = run.target
        done.add(c.hidden_dir)
    if done:
        del run, target
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # the training processes need what the forward held on the GPU


def train_side_by_side(cfgs: list[TrainConfig], resume: bool = True, target=None, poll_s: float = 5.0) -> dict:
    """Train every config at once, each in its own process; {arch: result} as `train` returns it
    (read back from summary.json, with the draft loaded from the last checkpoint)."""
    archs = [c.arch for c in cfgs]
    if len(set(archs)) != len(archs) or len({c.out_dir for c in cfgs}) != len(cfgs):
        raise ValueError(f"side-by-side training needs one config per arch and folder, got {archs}")
    if any(c.hidden == "offline" for c in cfgs):
        raise ValueError(
            "side-by-side training needs hidden='online' (offline shards would be written by every process)"
        )
    tokenize_first(cfgs, target)
    env = child_env(len(cfgs))
    procs = {}
    for c in cfgs:
        out = Path(c.out_dir)
        out.mkdir(parents=True, exist_ok=True)
        log = open(out / "train.log", "a")
        procs[c.arch] = (
            subprocess.Popen(
                [sys.executable, "-m", "draftlab.cli", "train", *cli_args(c, resume)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_terminate_with_parent if sys.platform == "linux" else None,
            ),
            log,
            out,
        )
    bar = tqdm(desc="train " + " + ".join(archs), unit="step")
    try:
        while any(p.poll() is None for p, _, _ in procs.values()):
            totals = [_total_steps(out / "train.log") for _, _, out in procs.values()]
            if all(totals):
                bar.total = sum(totals)
            bar.n = sum(_steps_done(out) for _, _, out in procs.values())
            bar.refresh()
            time.sleep(poll_s)
        bar.n = sum(_steps_done(out) for _, _, out in procs.values())
        bar.refresh()
    finally:
        bar.close()
        for p, log, _ in procs.values():
            if p.poll() is None:
                p.terminate()
            log.close()
    failed = {a: out for a, (p, _, out) in procs.items() if p.returncode != 0}
    if failed:
        tails = {a: (out / "train.log").read_text(errors="replace")[-2000:] for a, out in failed.items()}
        raise RuntimeError(
            "side-by-side training failed: "
            + "; ".join(f"{a} ({failed[a] / 'train.log'}):\n{t}" for a, t in tails.items())
        )
    results = {}
    for c in cfgs:
        out = Path(c.out_dir)
        r = json.loads((out / "summary.json").read_text())
        r["draft"], r["target"] = load_checkpoint_draft(out, target=target, device=c.device)
        r["out_dir"] = out
        results[c.arch] = r
    return results
