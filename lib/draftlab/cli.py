"""The `draftlab` command: one entry point, each subcommand defined beside the code it runs.

Only the module of the chosen subcommand is imported, so `draftlab target` or `draftlab monitor`
start without loading torch, and `draftlab --help` imports none.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from pathlib import Path

from draftlab.core.errors import run_command
from draftlab.core.options import number, one_line_errors

PACKAGE = Path(__file__).parent

# name -> (module, function that adds the subparser, its one-line help), in help order. The help is
# repeated here so that `draftlab --help` lists every command without importing any (torch takes
# seconds); tests/test_cli_help.py holds each line equal to the one its module registers.
COMMANDS = {
    "run": ("draftlab.run.runner", "add_run_parser", "execute notebooks headlessly with papermill under a profile"),
    "target": (
        "draftlab.environment_check.cli",
        "add_target_parser",
        "prepare a target (convert/cache) and show its shape",
    ),
    "blend": (
        "draftlab.blend.cli",
        "add_blend_parser",
        "blend prompt sources from a YAML spec into train/val/test files",
    ),
    "discover": (
        "draftlab.dataset_discovery.cli",
        "add_discover_parser",
        "rank candidate datasets (live Hub search when reachable)",
    ),
    "prompts": (
        "draftlab.dataset_discovery.generated_prompts",
        "add_prompts_parser",
        "write broad training prompts with the target itself (Magpie)",
    ),
    "regenerate": (
        "draftlab.regenerate.cli",
        "add_regenerate_parser",
        "answer every prompt again with the target (resumable)",
    ),
    "monitor": ("draftlab.regenerate.cli", "add_monitor_parser", "progress of a regeneration work folder"),
    "train": (
        "draftlab.train_draft.cli",
        "add_train_parser",
        "train an EAGLE-3 (or EAGLE-1-style) draft with training-time test",
    ),
    "export": (
        "draftlab.train_draft.cli",
        "add_export_parser",
        "export a trained draft in SGLang's EAGLE-3 format and validate it",
    ),
    "doctor": (
        "draftlab.flag_diagnosis.cli",
        "add_doctor_parser",
        "check a draft, its target and the SGLang flags for silent mismatches (or probe a server)",
    ),
    "sglang": (
        "draftlab.sglang.cli",
        "add_sglang_parser",
        "an offline SGLang bundle: build it here, install it on a machine without a network",
    ),
    "capture-hidden": (
        "draftlab.sglang.hidden_cli",
        "add_capture_parser",
        "capture the training conversations' hidden states in SGLang (any --tp-size) for draftlab train",
    ),
}
# `draftlab bench <what>`: each benchmark is owned by its stage's cli module.
BENCHES = {
    "blend": (
        "draftlab.blend.cli",
        "add_bench_blend_parser",
        "benchmark the blend pipeline on synthetic conversations (rows/s)",
    ),
    "client": (
        "draftlab.regenerate.cli",
        "add_bench_client_parser",
        "client overhead: draftlab regenerate vs bare openai-SDK gather",
    ),
    "generate": (
        "draftlab.regenerate.cli",
        "add_bench_generate_parser",
        "batch backend: output tokens/s of generate by batch size",
    ),
    "live": (
        "draftlab.benchmark_acceptance.cli",
        "add_bench_live_parser",
        "tokens/s and acceptance length of live SGLang endpoints; sweep commands",
    ),
    "specdec": (
        "draftlab.benchmark_acceptance.cli",
        "add_bench_specdec_parser",
        "reference engine: acceptance length and speedup over its own greedy",
    ),
    "sglang": (
        "draftlab.benchmark_acceptance.cli",
        "add_bench_sglang_parser",
        "start SGLang servers (baseline, chain, trees, wrong flag) and measure them",
    ),
    "cost": (
        "draftlab.benchmark_acceptance.cli",
        "add_bench_cost_parser",
        "SGLang's speculative cycle cost on a target's shape (random weights, forced acceptance)",
    ),
}
BENCH_HELP = "benchmarks: blend, client, live servers, reference engine"


def _exists(module_name: str) -> bool:
    """Is this draftlab module in the package? Looked up as a file: find_spec would import its packages."""
    return PACKAGE.joinpath(*module_name.split(".")[1:]).with_suffix(".py").is_file()


def _register(subparsers, table: dict, only: str | None, lazy: bool = False) -> None:
    """Add the table's commands (only `only`, if given). lazy: a stub per command with its help line and
    nothing imported, for a help listing or a command name that is not in the table."""
    for name, (module_name, function, help_line) in table.items():
        if only is not None and name != only:
            continue
        if not _exists(module_name):
            continue  # a stage not built in this checkout
        if lazy:
            subparsers.add_parser(name, help=help_line)
            continue
        getattr(importlib.import_module(module_name), function)(subparsers)


def build_parser(argv: list[str] | None = None, lazy: bool = True) -> argparse.ArgumentParser:
    """The parser for argv: only the chosen command's module is imported. Without a known command
    (`draftlab --help`, `draftlab bench --help`) the listing is built from the tables alone, unless
    lazy is False (every module imported, as the tests compare)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in list(COMMANDS) + ["bench"] else None
    bench = argv[1] if command == "bench" and len(argv) > 1 and argv[1] in BENCHES else None
    parser = argparse.ArgumentParser(prog="draftlab", description="EAGLE-3 draft toolkit for SGLang")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _register(subparsers, COMMANDS, command if command != "bench" else "", lazy=lazy and command is None)
    if command in (None, "bench"):
        bench_parser = subparsers.add_parser("bench", help=BENCH_HELP)
        _register(bench_parser.add_subparsers(dest="bench", required=True), BENCHES, bench, lazy=lazy and bench is None)
    _every_parser_strict(parser)
    return parser


def _every_parser_strict(parser: argparse.ArgumentParser) -> None:
    """Every command's argparse errors are one `error:` line and exit 2 (no usage block), and a plain
    `type=float` option refuses nan and inf (`--lr nan` would otherwise train on it): no option of any
    command wants them. Range checks stay with the options that know their range (core.options.number)."""
    one_line_errors(parser)
    for action in parser._actions:
        if action.type is float:
            action.type = number(float)
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                _every_parser_strict(sub)


def main(argv: list[str] | None = None) -> int:
    """Run one command: an expected failure is one line on stderr, not a traceback
    (core.errors.run_command is the one place that decides how)."""
    try:
        args = build_parser(argv).parse_args(argv)
        return run_command(args.func, args)  # a DraftlabError: one `error: ...` line, exit 1 or 2
    except KeyboardInterrupt as exc:  # Ctrl-C outside a graceful stop, or a second signal (core.stop)
        signum = getattr(exc, "signum", signal.SIGINT)
        print(f"error: interrupted by {signal.Signals(signum).name}; what was saved is kept", file=sys.stderr)
        return 128 + signum


def entry() -> None:
    """The `draftlab` program: main(), then the exit. Its code is decided by then, so a signal that comes
    while the interpreter shuts down (a second Ctrl-C just after a stop) is ignored instead of breaking
    an exit handler with a traceback; SIGKILL still ends it."""
    code = main()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    sys.exit(code)


if __name__ == "__main__":
    entry()
