"""The `draftlab` command: one entry point, each subcommand defined beside the code it runs."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

# (module, parser-adding function) for top-level subcommands, in help order.
COMMANDS = [
    ("draftlab.runner", "add_run_parser"),
    ("draftlab.target_cli", "add_target_parser"),
    ("draftlab.blend", "add_blend_parser"),
    ("draftlab.regenerate", "add_regenerate_parser"),
    ("draftlab.monitor", "add_monitor_parser"),
    ("draftlab.train", "add_train_parser"),
    ("draftlab.export", "add_export_parser"),
    ("draftlab.doctor", "add_doctor_parser"),
]
# `draftlab bench <what>` benchmarks, each owned by its stage's module.
BENCHES = [
    ("draftlab.blend", "add_bench_blend_parser"),
    ("draftlab.regenerate", "add_bench_client_parser"),
    ("draftlab.bench", "add_bench_live_parser"),
    ("draftlab.specdec", "add_bench_specdec_parser"),
]


def _register(subparsers, table) -> None:
    for module_name, function in table:
        if importlib.util.find_spec(module_name) is None:
            continue  # a stage not built yet in this checkout
        module = importlib.import_module(module_name)
        if hasattr(module, function):
            getattr(module, function)(subparsers)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="draftlab", description=__doc__)
    subparsers = parser.add_subparsers(dest="command", required=True)
    _register(subparsers, COMMANDS)
    bench = subparsers.add_parser("bench", help="benchmarks: blend, client, live servers, reference engine")
    _register(bench.add_subparsers(dest="bench", required=True), BENCHES)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
