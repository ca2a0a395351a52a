"""The `draftlab` command: one entry point, each subcommand defined beside the code it runs.

Only the module of the chosen subcommand is imported, so `draftlab target` or `draftlab monitor`
start without loading torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys

from draftlab.core.errors import run_command

# name -> (module, function that adds the subparser), in help order.
COMMANDS = {
    "run": ("draftlab.run.runner", "add_run_parser"),
    "target": ("draftlab.environment_check.cli", "add_target_parser"),
    "blend": ("draftlab.blend.cli", "add_blend_parser"),
    "regenerate": ("draftlab.regenerate.cli", "add_regenerate_parser"),
    "monitor": ("draftlab.regenerate.cli", "add_monitor_parser"),
    "train": ("draftlab.train_draft.cli", "add_train_parser"),
    "export": ("draftlab.train_draft.cli", "add_export_parser"),
    "doctor": ("draftlab.flag_diagnosis.cli", "add_doctor_parser"),
    "sglang": ("draftlab.sglang.cli", "add_sglang_parser"),
}
# `draftlab bench <what>`: each benchmark is owned by its stage's cli module.
BENCHES = {
    "blend": ("draftlab.blend.cli", "add_bench_blend_parser"),
    "client": ("draftlab.regenerate.cli", "add_bench_client_parser"),
    "generate": ("draftlab.regenerate.cli", "add_bench_generate_parser"),
    "live": ("draftlab.benchmark_acceptance.cli", "add_bench_live_parser"),
    "specdec": ("draftlab.benchmark_acceptance.cli", "add_bench_specdec_parser"),
    "sglang": ("draftlab.benchmark_acceptance.cli", "add_bench_sglang_parser"),
}


def _register(subparsers, table: dict, only: str | None) -> None:
    for name, (module_name, function) in table.items():
        if only is not None and name != only:
            continue
        if importlib.util.find_spec(module_name) is None:
            continue  # a stage not built in this checkout
        getattr(importlib.import_module(module_name), function)(subparsers)


def build_parser(argv: list[str] | None = None) -> argparse.ArgumentParser:
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in list(COMMANDS) + ["bench"] else None
    bench = argv[1] if command == "bench" and len(argv) > 1 and argv[1] in BENCHES else None
    parser = argparse.ArgumentParser(prog="draftlab", description="EAGLE-3 draft toolkit for SGLang")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _register(subparsers, COMMANDS, command if command != "bench" else "")
    if command in (None, "bench"):
        bench_parser = subparsers.add_parser("bench", help="benchmarks: blend, client, live servers, reference engine")
        _register(bench_parser.add_subparsers(dest="bench", required=True), BENCHES, bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command: an expected failure is one line on stderr, not a traceback (issue 19.5;
    core.errors.run_command is the one place that decides how)."""
    args = build_parser(argv).parse_args(argv)
    return run_command(args.func, args)  # a DraftlabError: one `error: ...` line, exit 1 or 2


if __name__ == "__main__":
    sys.exit(main())
