"""`draftlab target`: prepare a target once and print what a draft needs to know about it."""

from __future__ import annotations

import argparse
import json
import sys

from draftlab.model.capture import default_capture
from draftlab.model.target import TargetError, read_config, resolve_path


def add_target_parser(subparsers) -> None:
    p = subparsers.add_parser("target", help="prepare a target (convert/cache) and show its shape")
    p.add_argument("spec", nargs="?", default="embedded", help="embedded | tiny | folder | file.gguf | hub id")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_target_cli)


def _target_cli(args: argparse.Namespace) -> int:
    try:
        path = resolve_path(args.spec)
        config = read_config(args.spec)
    except TargetError as exc:
        print(f"draftlab target: {exc}", file=sys.stderr)
        return 2
    info = {
        "spec": args.spec,
        "path": str(path),
        "num_hidden_layers": config["num_hidden_layers"],
        "hidden_size": config["hidden_size"],
        "vocab_size": config["vocab_size"],
        "max_position_embeddings": config.get("max_position_embeddings"),
        "capture_layers": default_capture(config["num_hidden_layers"]),
    }
    print(json.dumps(info, indent=None if args.json else 2))
    return 0
