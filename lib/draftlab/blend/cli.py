"""`draftlab blend` and `draftlab bench blend`: the command-line faces of the blend stage."""

from __future__ import annotations

import argparse
import json
import sys

from draftlab.blend.bench import bench_blend
from draftlab.blend.pipeline import blend
from draftlab.core.options import interruptible, number, one_line_errors
from draftlab.core.records import RecordError

# -------------------------------------------------------------------------------------- CLI


def add_blend_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("blend", help="blend prompt sources from a YAML spec into train/val/test files")
    p.add_argument("spec", help="blend spec YAML (e.g. params/blend-offline.yaml)")
    p.add_argument("--out", required=True, help="output folder (RUN_DIR/data/blend)")
    p.add_argument("--target", default="embedded", help="target whose tokenizer filters lengths (default embedded)")
    p.add_argument("--total", type=number(int, 1), default=None, help="override the spec's total")
    p.add_argument("--seed", type=number(int, 0), default=None, help="override the spec's seed")
    one_line_errors(p)
    p.set_defaults(func=interruptible(_cmd_blend, lambda args: f"{args.out} holds only whole files"))
    return p


def _cmd_blend(args: argparse.Namespace) -> int:
    """Errors of the spec or a source are RecordErrors (BlendSpecError, AdapterError): `draftlab` prints
    them as one line on stderr and exits 2 (draftlab.cli.main)."""
    report = blend(args.spec, args.out, target=args.target, overrides={"total": args.total, "seed": args.seed})
    for rejected in report["rejected_sources"]:
        print(f"rejected source {rejected['source']}: {rejected['reason']}", file=sys.stderr)
    print(
        json.dumps(
            {
                "splits": report["splits"],
                "dropped": report["dropped"],
                "rejected": report["rejected"],
                "rejected_sources": [r["source"] for r in report["rejected_sources"]],
                "out": str(args.out),
            },
            indent=2,
        )
    )
    return 0


def add_bench_blend_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("blend", help="benchmark the blend pipeline on synthetic conversations (rows/s)")
    p.add_argument("-n", type=int, default=100_000, help="conversations to blend (default 100000)")
    p.add_argument("--tokenizer", default="tiny", help="target spec whose tokenizer is used, or 'none'")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_bench_blend)
    return p


def _cmd_bench_blend(args: argparse.Namespace) -> int:
    print(json.dumps(bench_blend(args.n, args.tokenizer, args.seed, progress=True), indent=2))
    return 0


def main(argv=None) -> int:
    """`python -m draftlab.blend blend SPEC --out DIR` / `python -m draftlab.blend bench -n N`."""
    parser = argparse.ArgumentParser(prog="python -m draftlab.blend")
    sub = parser.add_subparsers(dest="command", required=True)
    add_blend_parser(sub)
    bench = sub.add_parser("bench", help="benchmarks")
    add_bench_blend_parser(bench.add_subparsers(dest="what", required=True))
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except RecordError as exc:  # the same one-line report as `draftlab blend` (draftlab.cli.main)
        print(f"error: {exc}", file=sys.stderr)
        return 2
