"""Checkpoints (model, optimizer, RNG, position in the epoch) and the training logs.

A checkpoint holds everything a resumed run needs to continue bit for bit; logs are CSV and
TensorBoard, read back by notebook 04's figures.
"""

from __future__ import annotations

import csv
import json
import random
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import torch.utils.checkpoint
from safetensors.torch import load_file, save_file

from draftlab.core.acceptance import simulated_acceptance
from draftlab.core.files import atomic_path
from draftlab.core.records import RecordError
from draftlab.model.contract import safetensors_layout
from draftlab.model.draft import Eagle3Draft, config_from_dict
from draftlab.model.target import load_target
from draftlab.sglang.head_target import load_head_target
from draftlab.train_draft.config import TrainConfig


# ---- checkpoints -----------------------------------------------------------------------------
def _optimizer_tensors(opt) -> tuple[dict, dict]:
    """Optimizer state -> (tensors for safetensors, JSON-able rest)."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for pid, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"state.{pid}.{k}"] = v.detach().cpu().contiguous()
            else:
                scalars[f"{pid}.{k}"] = v
    return tensors, {"param_groups": sd["param_groups"], "scalars": scalars}


def _optimizer_state(tensors: dict, rest: dict) -> dict:
    state = {}
    for name, v in tensors.items():
        if not name.startswith("state."):
            continue
        _, pid, k = name.split(".", 2)
        state.setdefault(int(pid), {})[k] = v
    for name, v in rest["scalars"].items():
        pid, k = name.split(".", 1)
        state.setdefault(int(pid), {})[k] = v
    return {"state": state, "param_groups": rest["param_groups"]}


def save_checkpoint(out_dir: Path, step: int, draft, opt, sched, cfg: TrainConfig, extra: dict) -> Path:
    """ckpt-NNNNNNN/: draft.safetensors, optimizer.safetensors (+ RNG), state.json; atomic rename."""

    final = out_dir / f"ckpt-{step:07d}"
    with atomic_path(final, prefix=".") as tmp:
        _write_checkpoint(tmp, step, draft, opt, sched, cfg, extra)
    (out_dir / "latest").write_text(final.name + "\n")
    ckpts = sorted(out_dir.glob("ckpt-*"))
    for old in ckpts[: max(0, len(ckpts) - cfg.keep_checkpoints)]:
        shutil.rmtree(old)
    return final


def _write_checkpoint(tmp: Path, step: int, draft, opt, sched, cfg: TrainConfig, extra: dict) -> None:
    tmp.mkdir(parents=True)
    save_file({k: v.detach().cpu().contiguous() for k, v in draft.state_dict().items()}, str(tmp / "draft.safetensors"))
    opt_t, opt_rest = _optimizer_tensors(opt)
    opt_t["rng.torch"] = torch.get_rng_state()
    if torch.cuda.is_available():
        opt_t["rng.cuda"] = torch.cuda.get_rng_state()
    save_file(opt_t, str(tmp / "optimizer.safetensors"))
    state = {
        "step": step,
        "train_config": asdict(cfg),
        "draft_config": draft.config.to_dict(),
        "optimizer": opt_rest,
        "scheduler": sched.state_dict(),
        "python_random": _jsonable(random.getstate()),
        **extra,
    }
    (tmp / "state.json").write_text(json.dumps(state, indent=1))


def _jsonable(x):
    return [_jsonable(v) for v in x] if isinstance(x, (list, tuple)) else x


def _tuple(x):
    return tuple(_tuple(v) for v in x) if isinstance(x, list) else x


def remove_checkpoint_temps(out_dir) -> list[Path]:
    """Remove half-written checkpoints (`.ckpt-*.tmp`, save_checkpoint's temp folders) a killed run left.

    A rerun removes only the temp of the step it saves again; after a resume with another
    save_every the others would stay, each the size of a checkpoint. Returns what was removed.
    """
    leftovers = sorted(Path(out_dir).glob(".ckpt-*.tmp"))
    for path in leftovers:
        print(f"{path}: removing a checkpoint left half-written by an interrupted run", flush=True)
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink()
    return leftovers


def checkpoint_problem(ck: Path) -> str | None:
    """Why a ckpt-* folder cannot be loaded (a file missing, empty, cut short or not JSON), or None.
    A copy interrupted half-way leaves such a folder; a checkpoint draftlab wrote is renamed in whole."""
    try:
        json.loads((ck / "state.json").read_text())
    except FileNotFoundError:
        return "state.json is missing"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"state.json is not valid JSON ({str(exc).splitlines()[0]})"
    for name in ("draft.safetensors", "optimizer.safetensors"):
        if not (ck / name).is_file():
            return f"{name} is missing"
        _, problems = safetensors_layout(ck / name)
        if problems:
            return f"{name}: {problems[0]}"
    return None


def find_checkpoint(path) -> Path:
    """A complete ckpt-* folder: the one given, or the latest of a training folder; when `latest` names
    a half-written one, the last complete one (said in one line). One line (InputError) when none is."""
    path = Path(path)
    if path.is_file():
        raise RecordError(f"{path}: a file; a checkpoint is a ckpt-* folder (or the training folder holding them)")
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such checkpoint or training folder")
    if path.name.startswith("ckpt-") or (path / "state.json").exists():
        problem = checkpoint_problem(path)
        if problem:
            raise RecordError(f"{path}: not a complete checkpoint: {problem}")
        return path
    named = path / (path / "latest").read_text().strip() if (path / "latest").is_file() else None
    ckpts = sorted((p for p in path.glob("ckpt-*") if p.is_dir()), reverse=True)
    if not ckpts and named is None:
        raise FileNotFoundError(f"{path}: no checkpoint (ckpt-*/state.json); train first (draftlab train)")
    problems = {}
    for ck in ([named] if named in ckpts else []) + [c for c in ckpts if c != named]:
        problems[ck] = checkpoint_problem(ck)
        if problems[ck] is None:
            if named is not None and ck != named:
                why = problems.get(named) or "missing"
                print(f"{named}: incomplete ({why}); using {ck.name}, the last complete checkpoint", file=sys.stderr)
            return ck
    first = next(iter(problems.items()), (named, "missing"))
    raise RecordError(f"{first[0]}: not a complete checkpoint ({first[1]}); none in {path} is complete")


def load_checkpoint_draft(path, target_spec: str | None = None, device: str = "cpu", target=None):
    """(draft with trained weights, Target) from a checkpoint, for export or evaluation; `target`:
    an already loaded one (its embedding is shared, as in training). A draft trained on SGLang's
    states (hidden sglang) gets the head-only target it trained with: its target may be too big for
    this process, and the draft needs of it only the embedding, head and config."""
    from safetensors.torch import load_file

    ck = find_checkpoint(path)
    state = json.loads((ck / "state.json").read_text())
    if target is None:
        load = load_head_target if state["train_config"].get("hidden") == "sglang" else load_target
        target = load(target_spec or state["train_config"]["target"], device=device)
    dc = dict(state["draft_config"])
    ids = (dc.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if "draftlab" not in dc and ids is not None:
        # a checkpoint holds the in-memory config, whose ids are already hidden_states indices: say so,
        # or config_from_dict reads them as SGLang's exported ids and shifts every layer by one
        dc["draftlab"] = {"capture_layers": ids}
    draft = Eagle3Draft(config_from_dict(dc), target.model.get_input_embeddings())
    draft.load_state_dict(load_file(str(ck / "draft.safetensors")))
    return draft.to(target.device).eval(), target


# Settings that may change between a run and its resumption (they do not change the result).
RESUME_FREE = (
    "stop_after",
    "eval_every",
    "save_every",
    "log_every",
    "keep_checkpoints",
    "threads",
    "device",
    "hidden",
    "hidden_dir",
    "max_val_samples",
    "val_file",
    "pad_multiple",
    "attention",
    "recompute_head",
    "compile",
    "token_cache",
)


def check_same_recipe(ck: Path, cfg: TrainConfig) -> None:
    """RecordError (one line from `draftlab train`) when the checkpoint was trained with another recipe."""
    try:
        old = json.loads((ck / "state.json").read_text())["train_config"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise RecordError(
            f"{ck / 'state.json'}: not a training checkpoint's state ({exc!r}); use another out_dir "
            f"or delete {ck} to start afresh"
        ) from None
    # a setting added since the checkpoint: the value it had before it existed (fc_norm: none), else its default
    new, defaults = asdict(cfg), {**asdict(TrainConfig(arch=old.get("arch", "eagle3"))), "fc_norm": "none"}
    diff = {
        k: (old.get(k, defaults[k]), new[k]) for k in new if k not in RESUME_FREE and old.get(k, defaults[k]) != new[k]
    }
    if diff:
        raise RecordError(
            f"{ck}: was trained with other settings {diff} (old, new); use another out_dir or "
            f"delete {ck.parent} to start afresh"
        )


def restore_checkpoint(ck: Path, draft, opt, sched, device) -> int:
    """Load a checkpoint into the draft, optimizer, schedule and RNGs; the step it was taken at."""
    state = json.loads((ck / "state.json").read_text())
    draft.load_state_dict({k: v.to(device) for k, v in load_file(str(ck / "draft.safetensors")).items()})
    tensors = load_file(str(ck / "optimizer.safetensors"))
    opt.load_state_dict(
        _optimizer_state(
            {k: v.to(device) if not k.endswith(".step") else v for k, v in tensors.items()}, state["optimizer"]
        )
    )
    sched.load_state_dict(state["scheduler"])
    torch.set_rng_state(tensors["rng.torch"])
    if "rng.cuda" in tensors and torch.cuda.is_available():
        torch.cuda.set_rng_state(tensors["rng.cuda"])
    random.setstate(_tuple(state["python_random"]))
    return int(state["step"])


# ---- logs ------------------------------------------------------------------------------------
class Logs:
    """train.csv + eval.csv + TensorBoard under out_dir (rank 0 only); rows past a resumed step dropped."""

    def __init__(self, out_dir: Path, start_step: int):
        from torch.utils.tensorboard import SummaryWriter

        self.dir = out_dir
        for name in ("train.csv", "eval.csv"):
            p = out_dir / name
            if p.is_file():
                with open(p) as f:
                    rows = [r for r in csv.DictReader(f) if int(r["step"]) <= start_step]
                self._write(p, rows, rewrite=True)
        self.tb = SummaryWriter(log_dir=str(out_dir / "tb"), purge_step=start_step + 1 if start_step else None)

    @staticmethod
    def _write(path: Path, rows: list[dict], rewrite: bool = False):
        if not rows and not rewrite:
            return
        exists = path.is_file() and not rewrite
        fields = list(rows[0].keys()) if rows else []
        if exists:
            with open(path) as f:
                fields = next(csv.reader(f), fields)
        with open(path, "a" if exists else "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=fields)
            if not exists and fields:
                w.writeheader()
            w.writerows(rows)

    def log(self, kind: str, row: dict):
        self._write(self.dir / f"{kind}.csv", [row])
        for k, v in row.items():
            if k != "step" and isinstance(v, (int, float)):
                self.tb.add_scalar(f"{kind}/{k}", v, row["step"])
        self.tb.flush()


def summarize(stats: torch.Tensor, decay: float) -> dict:
    """stats [steps, 4] summed -> loss_i, acc_i, weighted loss, simulated acceptance length."""
    out, loss, rates = {}, 0.0, []
    for i, (ce, n, correct, scored) in enumerate(stats.tolist()):
        li = ce / max(n, 1)
        ai = correct / max(scored, 1)
        out[f"loss_{i}"], out[f"acc_{i}"] = li, ai
        loss += decay**i * li
        rates.append(ai)
    out["loss"] = loss
    out["sim_accept_len"] = simulated_acceptance(rates)
    return out
