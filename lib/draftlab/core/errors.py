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

    def _render_traceback_(self) -> list[str]:
        """What IPython (JupyterLab, papermill) shows instead of a traceback: the one line a command prints."""
        return [f"\x1b[0;31m{type(self).__name__}\x1b[0m: {' '.join(str(self).split())}"]


class InputError(DraftlabError, ValueError):
    """Bad input: a file, row, field, flag or work folder that cannot be used as given."""

    exit_code = 2


class RunFailure(DraftlabError, RuntimeError):
    """The run could not go on (a server gone, a folder busy); what was done so far is kept."""

    exit_code = 1


def run_command(func, args) -> int:
    """Run a command's function. A DraftlabError (core.records.RecordError included) becomes one
    `error: ...` line and its exit code; an OSError that names a file (missing, a folder where a file
    is wanted, unreadable) is bad input too, exit 2. Anything else is a bug and keeps its traceback."""
    try:
        return int(func(args) or 0)
    except DraftlabError as exc:
        return _say(str(exc), exc.exit_code)
    except OSError as exc:
        if exc.filename is None:
            raise
        return _say(f"{exc.filename}: {exc.strerror or exc}", InputError.exit_code)


def _say(message: str, code: int) -> int:
    print(f"error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    return code
