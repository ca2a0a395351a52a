"""The project's expected failures: what the `draftlab` command prints as one line, not a traceback.

A stage raises `InputError` (exit 2: the input, a flag or a work folder is wrong; the message names
the file, row and field) or `RunFailure` (exit 1: the run could not go on, e.g. no server answers).
`run_command` is the one place that turns them into `error: ...` on stderr and the exit code.
"""

from __future__ import annotations

import sys


class DraftlabError(Exception):
    """An expected failure with a message a user can act on; `exit_code` is the command's status."""

    exit_code = 1


class InputError(DraftlabError, ValueError):
    """Bad input: a file, row, field, flag or work folder that cannot be used as given."""

    exit_code = 2


class RunFailure(DraftlabError, RuntimeError):
    """The run could not go on (a server gone, a folder busy); what was done so far is kept."""

    exit_code = 1


def run_command(func, args) -> int:
    """Run a command's function; a DraftlabError becomes one `error: ...` line and its exit code."""
    try:
        return int(func(args) or 0)
    except DraftlabError as exc:
        print(f"error: {' '.join(str(exc).split())}", file=sys.stderr, flush=True)
        return exc.exit_code
