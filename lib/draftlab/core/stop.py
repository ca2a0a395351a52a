"""A stop is a signal: SIGTERM or SIGINT asks long work to finish its step, save, and exit with one line.

Long loops (training, the scaling study, the SGLang measurements) run inside `graceful_stop`. The
first signal only sets `requested`; the loop checks it between steps, saves what it has (a
checkpoint, the finished records) and calls `stop.stopped(...)`, which raises `Stopped`: one line on
stderr from `draftlab` (core.errors.run_command) and exit 128 + the signal (130 SIGINT, 143 SIGTERM).
A second signal does not wait: it raises `Interrupted` wherever the code is (finally blocks still
run, so servers and children are stopped). Nested contexts share the outermost one's handlers and
resume hint, so a training inside the study says how to resume the study.
"""

from __future__ import annotations

import signal
import threading
from contextlib import contextmanager

from draftlab.core.errors import DraftlabError

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Stopped(DraftlabError):
    """The work stopped cleanly on a signal; what was done is saved. exit_code: 128 + the signal."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum


class Interrupted(KeyboardInterrupt):
    """A second signal: the work is abandoned at once (its last checkpoint or records stay)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class StopRequest:
    """What the loops read: `requested` (the signal number, 0 while none came) and the resume hint."""

    def __init__(self, resume_hint: str):
        self.requested = 0
        self.resume_hint = resume_hint

    def __bool__(self) -> bool:
        return bool(self.requested)

    def _handle(self, signum, frame) -> None:
        if self.requested:
            raise Interrupted(signum)
        self.requested = signum

    def stopped(self, what: str) -> None:
        """Raise Stopped: '<what>, stopped by SIGTERM; <how to resume>' (the one line a command prints)."""
        name = signal.Signals(self.requested or signal.SIGINT).name
        raise Stopped(f"{what}, stopped by {name}; {self.resume_hint}", self.requested or signal.SIGINT)


_active: StopRequest | None = None


def pending_stop() -> StopRequest | None:
    """The active request once a signal came (None otherwise): for waits that may take minutes, such as a
    server's start, which must not hold a stop until they end."""
    return _active if _active is not None and _active.requested else None


@contextmanager
def graceful_stop(resume_hint: str = "rerun the same command to resume"):
    """Inside: the first SIGTERM/SIGINT sets `.requested`, a second raises Interrupted. Outside the main
    thread (no signal handlers there) the request is never set. Nested: the outermost request is used."""
    global _active
    if _active is not None:
        yield _active
        return
    request = StopRequest(resume_hint)
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {sig: signal.signal(sig, request._handle) for sig in SIGNALS}
    _active = request
    try:
        yield request
    finally:
        _active = None
        for sig, handler in previous.items():
            signal.signal(sig, handler)
