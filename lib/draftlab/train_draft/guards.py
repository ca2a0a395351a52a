"""What training refuses before it spends a step, and what it calls a run that learned nothing.

Bad settings, a target that cannot be read and data with nothing to learn from are InputErrors
(one line naming the option or file, exit 2); a run whose loss never moved is a RunFailure (exit 1),
so that nothing downstream (an export, its "conforms") reads a useless draft as a result.
"""

from __future__ import annotations

import math
from pathlib import Path

from draftlab.core.errors import InputError, RunFailure
from draftlab.core.records import RecordError
from draftlab.model.chat_data import end_of_turn_strings
from draftlab.model.contract import FC_NORMS
from draftlab.train_draft.objective import ATTENTION_KERNELS, LOSSES

# settings that must be finite and above 0 (a count or a rate), and those that must be whole and >= 1
POSITIVE = ("epochs", "lr", "batch_tokens", "max_len", "max_batch", "draft_vocab_size")
AT_LEAST_ONE = ("grad_accum", "ttt_steps", "log_every", "eval_every", "save_every", "keep_checkpoints")
NON_NEGATIVE = ("warmup_ratio", "weight_decay", "grad_clip", "max_train_samples", "max_val_samples", "stop_after")


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def check_settings(cfg, schedules) -> None:
    """A TrainConfig's choices, numbers and input files, before anything is loaded: one line naming the first
    bad one. schedules: the learning-rate schedules training knows (loop.LR_SCHEDULES)."""
    _check_choices(cfg, schedules)
    for name in POSITIVE + AT_LEAST_ONE + NON_NEGATIVE:
        value = getattr(cfg, name)
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise InputError(f"{flag(name)} {value!r}: not a number") from None
        low = 1 if name in AT_LEAST_ONE else 0
        bad = not math.isfinite(number) or number < low or (name in POSITIVE and number <= 0)
        if bad:
            need = "above 0" if name in POSITIVE else f"at least {low}"
            raise InputError(f"{flag(name)} {value}: must be a finite number {need}")
    if cfg.warmup_ratio >= 1:
        raise InputError(f"--warmup-ratio {cfg.warmup_ratio}: must be below 1 (a share of the steps)")
    negative = [i for i in cfg.capture_layers if int(i) < 0]
    if negative:
        raise InputError(f"--capture-layers {list(cfg.capture_layers)}: {negative} negative; layers count from 0")
    _check_files(cfg)


def _check_choices(cfg, schedules) -> None:
    """InputError (a ValueError) for a setting outside its choices: from a recipe file or the API."""
    if cfg.arch not in ("eagle3", "eagle1"):
        raise InputError(f"arch = {cfg.arch!r}, expected eagle3 or eagle1")
    if cfg.hidden not in ("online", "offline", "sglang"):
        raise InputError(f"hidden = {cfg.hidden!r}, expected online, offline or sglang")
    if cfg.lr_schedule not in schedules:
        raise InputError(f"lr_schedule = {cfg.lr_schedule!r}, expected one of {list(schedules)}")
    if cfg.loss not in LOSSES:
        raise InputError(f"loss = {cfg.loss!r}, expected one of {list(LOSSES)}")
    if cfg.attention not in ATTENTION_KERNELS:
        raise InputError(f"attention = {cfg.attention!r}, expected one of {list(ATTENTION_KERNELS)}")
    if cfg.fc_norm not in FC_NORMS or (cfg.fc_norm != "none" and cfg.arch != "eagle3"):
        raise InputError(f"fc_norm = {cfg.fc_norm!r}, expected one of {list(FC_NORMS)} (eagle3 only: eagle1 has no fc)")


def _check_files(cfg) -> None:
    if not cfg.train_file:
        raise RecordError("train_file is not set (--train-file: canonical conversations, JSONL)")
    for name in ("train_file", "val_file"):
        path = Path(getattr(cfg, name)) if getattr(cfg, name) else None
        if path is not None and not path.is_file():
            what = "is a folder" if path.is_dir() else "does not exist"
            raise RecordError(
                f"{path}: {name} {what}; it must be a JSONL file of conversations "
                "(notebook 03_regenerate writes data/regen/train.jsonl)"
            )


def check_against_target(cfg, target) -> None:
    """Settings that depend on the target: the draft vocabulary and the captured layers."""
    if cfg.draft_vocab_size > target.vocab_size:
        raise InputError(
            f"--draft-vocab-size {cfg.draft_vocab_size}: larger than the target's vocabulary ({target.vocab_size})"
        )
    n = target.num_layers
    outside = [i for i in cfg.capture_layers if not 1 <= int(i) <= n - 1]
    if outside:
        raise InputError(
            f"--capture-layers {list(cfg.capture_layers)}: {outside} outside the {n}-layer target "
            f"(hidden_states indices 1..{n - 1})"
        )


def load_target_or_refuse(spec: str, device: str, load):
    """`load(spec, device=device)`, with a target folder missing its weights, or holding half-written
    ones, said in one line (exit 2) instead of a loader's traceback."""
    from safetensors import SafetensorError

    try:
        return load(spec, device=device)
    except InputError:
        raise
    except (OSError, SafetensorError, ValueError, RuntimeError) as exc:
        folder = Path(spec).expanduser()
        where = f"--target {spec}" + (" (a folder)" if folder.is_dir() else "")
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise InputError(f"{where}: its weights cannot be read ({first[:300]})") from None


def check_trainable(stats: dict, path, counts, tokenizer) -> str:
    """Refuse data with no answer token to learn from (a turn's end alone teaches nothing); else the line
    saying what share is trained on. stats: chat_data's TokenStats as a dict; counts: vocab.token_counts."""
    rows, kept, tokens, supervised = (int(stats.get(k, 0)) for k in ("rows", "kept", "tokens", "loss_tokens"))
    ends = {tokenizer.convert_tokens_to_ids(s) for s in end_of_turn_strings(tokenizer)}
    ends = [i for i in ends if isinstance(i, int) and 0 <= i < len(counts)]
    answer = int(counts.sum()) - (int(counts[ends].sum()) if ends else 0)
    if kept == 0 or answer == 0:
        raise InputError(
            f"{path}: no trainable tokens: {kept} of {rows} conversations kept, {answer} answer tokens "
            "(empty answers, or none left after --max-len)"
        )
    return (
        f"trains on {kept:,} of {rows:,} conversations ({kept / max(rows, 1):.1%}) and {supervised:,} of "
        f"{tokens:,} tokens ({supervised / max(tokens, 1):.1%}: the assistant's)"
    )


def learned_nothing(losses: list[float], supervised: float) -> str | None:
    """Why a call's steps taught the draft nothing (no supervised token; every step's loss the same), or None."""
    if not losses:
        return None
    if supervised <= 0:
        return f"{len(losses)} steps saw 0 supervised tokens"
    if len(losses) > 1 and max(losses) - min(losses) <= 1e-9 * max(1.0, abs(losses[0])):
        return f"the loss stayed at {losses[0]:.6g} for all {len(losses)} steps"
    return None


def refuse_if_learned_nothing(result: dict) -> None:
    """RunFailure (exit 1) for a training result whose steps taught the draft nothing: before any export."""
    if result.get("learned_nothing"):
        raise RunFailure(
            f"{result['out_dir']}: the draft learned nothing: {result['learned_nothing']}; "
            "check the training data (answers by this target?) and --lr"
        )
