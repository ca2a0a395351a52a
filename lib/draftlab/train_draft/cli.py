"""`draftlab train` and `draftlab export`: train a draft, export a checkpoint in SGLang's format."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch
import torch.utils.checkpoint

from draftlab.core.errors import InputError, RunFailure
from draftlab.model.contract import FC_NORMS
from draftlab.model.export import export_draft, validate
from draftlab.model.target import TargetError, read_config
from draftlab.train_draft.checkpoint import load_checkpoint_draft
from draftlab.train_draft.config import TrainConfig, field_comments, parse_bool
from draftlab.train_draft.guards import refuse_if_learned_nothing
from draftlab.train_draft.loop import train
from draftlab.train_draft.objective import ATTENTION_KERNELS, dist_info
from draftlab.train_draft.recipe import load_recipe

TRAIN_DESCRIPTION = (
    "Every default is the best recipe measured in SGLang (recipes/eagle3-best.yaml says on what); "
    "--config FILE loads another recipe, and flags given on the command line override it. --target has no "
    "default: a draft is trained for one target, and a random stand-in would train a useless draft. "
    "A first SIGTERM or Ctrl-C ends the current step, writes a checkpoint and exits 130/143; "
    "the same command with --resume continues. Exit 2: bad input; 1: the run failed or learned nothing."
)


class _Given(argparse.Action):
    """Store the value and note the flag as given, so that it overrides --config's file."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = getattr(namespace, "given", set()) | {self.dest}


# ---- CLI -------------------------------------------------------------------------------------
def add_train_parser(subparsers) -> argparse.ArgumentParser:
    """`draftlab train`: every TrainConfig field is a --flag; `torchrun ... -m draftlab.cli train` for DDP."""
    ap = subparsers.add_parser(
        "train",
        help="train an EAGLE-3 (or EAGLE-1-style) draft with training-time test",
        description=TRAIN_DESCRIPTION,
    )
    choices = {
        "arch": ["eagle3", "eagle1"],
        "hidden": ["online", "offline", "sglang"],
        "overlong": ["truncate", "drop"],
        "attention": list(ATTENTION_KERNELS),
        "fc_norm": [*FC_NORMS, "auto"],
    }
    ap.add_argument("--config", default="", metavar="FILE", help="a recipe (recipes/*.yaml); flags override it")
    notes = field_comments()  # each field's comment in train_draft/config.py
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        text = f"{notes.get(f.name, '')} (default: {default!r})".replace("%", "%%")
        kw = dict(default=default, action=_Given, help=text)
        if isinstance(default, bool):
            ap.add_argument(flag, type=parse_bool, metavar="BOOL", **kw)
        elif isinstance(default, list):
            ap.add_argument(flag, type=int, nargs=3, metavar="LAYER", **kw)
        else:
            ap.add_argument(flag, type=type(default), choices=choices.get(f.name), **kw)
    ap.add_argument("--resume", action="store_true", help="continue from OUT_DIR's latest checkpoint, exactly")
    ap.add_argument("--export", default="", help="after training, export the draft here (rank 0) and validate it")
    ap.set_defaults(func=_train_main)
    return ap


def config_from_args(args) -> TrainConfig:
    """The TrainConfig of parsed `draftlab train` arguments: the defaults, then --config's file, then the
    flags given on the command line."""
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    d = {name: getattr(args, name) for name in names}
    if getattr(args, "config", ""):
        given = getattr(args, "given", set())
        d.update({k: v for k, v in load_recipe(args.config).items() if k not in given})
    d["capture_layers"] = list(d["capture_layers"] or [])
    if not d["target"]:
        raise InputError("--target is required: the model the draft will serve (a folder, .gguf, Hub id or embedded)")
    return TrainConfig(**d)


def _train_main(args) -> int:
    result = train(config_from_args(args), resume=args.resume)
    refuse_if_learned_nothing(result)
    _, rank, _ = dist_info()
    if args.export and rank == 0 and result["finished"]:
        export_draft(result["draft"], args.export, max_position_embeddings=result["target"].max_position_embeddings)
        problems = validate(args.export, result["target"], allow_eagle1=not result["draft"].use_aux)
        if problems:
            raise RunFailure(f"exported {args.export}: {'; '.join(problems)}")
        print(f"exported {args.export}: conforms to the EAGLE-3 contract")
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    return 0


# ---- CLI -------------------------------------------------------------------------------------
def add_export_parser(subparsers) -> argparse.ArgumentParser:
    """`draftlab export`: a training checkpoint -> SGLang folder, then validate it."""
    ap = subparsers.add_parser(
        "export",
        help="export a trained draft in SGLang's EAGLE-3 format and validate it",
        description="Exit 0 when the folder conforms to the EAGLE-3 contract, 1 on any deviation, 2 when an input "
        "(checkpoint, target) cannot be read.",
    )
    ap.add_argument(
        "checkpoint", help="training checkpoint folder (RUN_DIR/train/<arch>/ckpt-*) or a train dir (latest)"
    )
    ap.add_argument("out", help="output folder (config.json + model.safetensors)")
    ap.add_argument(
        "--target",
        default=None,
        help="target spec (default: the one the checkpoint was trained with); "
        "with --validate-only its config.json (no weights) for the "
        "cross-checks: widths, capture ids in range, context length",
    )
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--validate-only", action="store_true", help="only validate OUT (CHECKPOINT is ignored)")
    ap.add_argument("--allow-eagle1", action="store_true", help="with --validate-only: accept an EAGLE-1-style draft")
    ap.set_defaults(func=_export_main)
    return ap


def _target_config(spec: str) -> dict:
    """A target's config.json (a config file, or any spec model.target resolves), no weights loaded."""
    path = Path(spec).expanduser()
    config_file = path if path.is_file() and path.suffix == ".json" else None
    try:
        return json.loads(config_file.read_text()) if config_file else read_config(spec)
    except json.JSONDecodeError as exc:
        raise TargetError(f"{config_file or spec}: config.json is not valid JSON ({exc})") from exc


def _export_main(args) -> int:
    """Exit codes as the parser's description says; an unreadable input is one line on stderr.

    The errors caught are the ones that name their input (a missing checkpoint, a target that
    cannot be resolved, a state.json or config.json that is not JSON); anything else is a bug and
    keeps its traceback.
    """
    try:
        if args.validate_only:
            if not Path(args.out).is_dir():
                raise InputError(f"{args.out}: no such folder (--validate-only checks an exported draft folder)")
            target = _target_config(args.target) if args.target else None
            problems = validate(args.out, target, allow_eagle1=args.allow_eagle1)
        else:
            draft, target = load_checkpoint_draft(args.checkpoint, target_spec=args.target)
            export_draft(draft, args.out, max_position_embeddings=target.max_position_embeddings, dtype=args.dtype)
            problems = validate(args.out, target, allow_eagle1=not draft.use_aux)
    except (FileNotFoundError, NotADirectoryError, TargetError) as exc:
        print(f"draftlab export: error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    except json.JSONDecodeError as exc:  # _target_config names its file; state.json is the one left
        print(
            f"draftlab export: error: {args.checkpoint}: the checkpoint's state.json is not valid JSON ({exc})",
            file=sys.stderr,
        )
        return 2
    for line in problems:
        print("DEVIATION:", line)
    print(f"{args.out}: {'conforms to the EAGLE-3 contract' if not problems else f'{len(problems)} deviation(s)'}")
    return 0 if not problems else 1
