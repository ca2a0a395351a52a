"""Range-checked numeric options, one-line argparse errors and Ctrl-C as one line, for every command.

argparse's own error is a usage block and a line; a user who typed `--max-outage nan` should get one
line naming the option and what it takes, exit 2, like every other bad input.
"""

from __future__ import annotations

import argparse
import functools
import math
import signal
import sys
import threading

from draftlab.core.errors import RunFailure


def number(kind: type, low: float | None = None, *, above: bool = False, high: float | None = None, hint: str = ""):
    """An argparse `type`: an int or a finite float, >= low (> low if `above`) and <= high."""
    word = "an integer" if kind is int else "a finite number"
    bounds = []
    if low is not None:
        bounds.append(f"{'>' if above else '>='} {low:g}")
    if high is not None:
        bounds.append(f"<= {high:g}")
    wanted = f"{word}{' ' + ' and '.join(bounds) if bounds else ''}{' (' + hint + ')' if hint else ''}"

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        if low is not None and (value < low or (above and value == low)) or high is not None and value > high:
            raise argparse.ArgumentTypeError(f"{text!r} is not {wanted}")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its message by this
    return parse


def one_line_errors(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Make the parser's errors one `error: ...` line on stderr and exit 2 (no usage block)."""

    def error(message: str):
        print(f"error: {parser.prog}: {' '.join(message.split())}", file=sys.stderr, flush=True)
        sys.exit(2)

    parser.error = error
    return parser


class Interrupted(RunFailure):
    """Ctrl-C (or SIGTERM) of a command: what it had done is kept; the message says where."""

    exit_code = 130


def interruptible(func, where):
    """`func(args)` with SIGINT and SIGTERM ending it by one line (`where(args)` says what is kept),
    not a traceback. A second signal during the clean-up is not caught: it forces the exit."""

    @functools.wraps(func)  # the command stays its own module's (draftlab --help, the tests)
    def run(args):
        main = threading.current_thread() is threading.main_thread()  # only there can signals be handled
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler) if main else None
        try:
            return func(args)
        except KeyboardInterrupt:
            raise Interrupted(f"interrupted; {where(args)}") from None
        finally:
            if main:
                signal.signal(signal.SIGTERM, previous)

    return run
