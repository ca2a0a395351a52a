"""The data-scaling study's plan (notebook 07): subsets, the recipe taken from 04, the results store."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.core.files import atomic_write
from draftlab.core.records import RecordError, jsonl_line, read_jsonl
from draftlab.core.run_folder import RunFolder
from draftlab.model.chat_data import split_holdout
from draftlab.train_draft import find_checkpoint

ARCHS = ("eagle3", "eagle1")
# TrainConfig fields that make up the recipe; two drafts are comparable only when these agree.
RECIPE_KEYS = (
    "epochs",
    "lr",
    "draft_vocab_size",
    "max_len",
    "overlong",
    "ttt_steps",
    "step_decay",
    "batch_tokens",
    "max_batch",
    "grad_accum",
    "warmup_ratio",
    "lr_schedule",
    "weight_decay",
    "grad_clip",
    "intermediate_size",
    "init_from_target",
    "capture_layers",
)


class ScalingError(RuntimeError):
    """The study cannot run as asked (missing stage output, too little data); the message says why."""


# ---------------------------------------------------------------------------------- the plan


@dataclass
class StudyPlan:
    """What the study trains on and measures with."""

    train_file: Path  # shuffled training rows; subset n = the first n usable rows
    val_file: Path  # held-out conversations (never in any subset)
    sizes: list  # the subset sizes actually used (capped at what the data holds)
    available: int  # training rows available
    notes: list = field(default_factory=list)  # what was changed from the request, and why


def prepare(run_dir, out_dir, sizes: list[int], seed: int = 0, val_samples: int = 256) -> StudyPlan:
    """Shuffle RUN_DIR/data/regen/train.jsonl once (seeded) into out_dir; cap sizes at the data.

    The held-out split is RUN_DIR/data/regen/val.jsonl when 03 wrote one; otherwise notebook 04's
    hold-out (RUN_DIR/train/holdout/) when it exists, else `val_samples` seeded rows held out here
    with the same function (`chat_data.split_holdout`). Held-out rows are never trained on.
    """
    regen = RunFolder(run_dir).regen
    source = regen / "train.jsonl"
    if not source.is_file():
        raise ScalingError(f"{source}: missing; run notebook 03_regenerate first (it writes data/regen/)")
    if not sizes or any(int(n) < 1 for n in sizes):
        raise ScalingError(f"SIZES = {sizes}: give one or more positive subset sizes")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    notes = []
    val_file, train_source = regen / "val.jsonl", source
    if not val_file.is_file():
        mine = Path(run_dir) / "train" / "holdout"  # notebook 04's split: its drafts never saw these rows
        if (mine / "val.jsonl").is_file() and (mine / "train.jsonl").is_file():
            train_source, val_file = mine / "train.jsonl", mine / "val.jsonl"
            notes.append(f"no {regen / 'val.jsonl'}: using notebook 04's hold-out split {mine}")
        else:
            train_source, val_file = split_holdout(source, val_samples, out / "holdout", seed)
            notes.append(f"no {regen / 'val.jsonl'}: held out {val_samples} rows (seeded) into {out / 'holdout'}")
    rows = list(read_jsonl(train_source))
    if not rows:
        raise ScalingError(f"{train_source}: no conversations")
    for k, row in enumerate(rows, 1):
        if not isinstance(row.get("messages"), list) or "id" not in row:
            raise RecordError(f"{train_source}: row {k}: fields 'id' and 'messages' (a list) are required")
    order = list(range(len(rows)))
    random.Random(seed).shuffle(order)
    train_rows = [rows[i] for i in order]
    shuffled = out / "train_shuffled.jsonl"
    _write_if_changed(shuffled, train_rows)
    used = sorted({min(int(n), len(train_rows)) for n in sizes})
    if max(int(n) for n in sizes) > len(train_rows):
        notes.append(f"sizes above the {len(train_rows)} available training rows were capped to it")
    return StudyPlan(train_file=shuffled, val_file=val_file, sizes=used, available=len(train_rows), notes=notes)


def _write_if_changed(path: Path, rows: list[dict]) -> None:
    """Rewrite only when the content differs, so token caches keyed on the file's mtime stay valid."""
    data = b"".join(jsonl_line(r) for r in rows)
    if path.is_file() and path.read_bytes() == data:
        return
    atomic_write(path, data)


def recipe_from_04(run_dir, arch: str = "eagle3") -> dict | None:
    """The recipe notebook 04 trained with (RUN_DIR/train/<arch>/ latest checkpoint), or None."""
    try:
        ck = find_checkpoint(Path(run_dir) / "train" / arch)
    except FileNotFoundError:
        return None
    cfg = json.loads((ck / "state.json").read_text())["train_config"]
    return {k: cfg[k] for k in RECIPE_KEYS if k in cfg}


NOT_IN_KEY = ("threads", "save_every", "log_every")  # how, not what: a rerun with others reuses results


def settings_key(arch: str, n: int, settings: dict, eval_settings: dict) -> str:
    """A short hash of everything that decides a result row (a rerun with other settings redoes it)."""
    settings = {k: v for k, v in settings.items() if k not in NOT_IN_KEY}
    blob = json.dumps([arch, int(n), settings, eval_settings], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


# ---------------------------------------------------------------------------------- results store


def load_results(path) -> list[dict]:
    path = Path(path)
    return list(read_jsonl(path)) if path.is_file() else []


def done_keys(path) -> set:
    return {r["key"] for r in load_results(path)}
