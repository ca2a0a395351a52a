"""Processes that draftlab starts (servers: transformers serve, SGLang; commands with a deadline): bounded and owned.

Why: a benchmark or a regeneration that starts a server must never leave one behind. Each child
runs in its own process group (stopped whole: SGLang's scheduler and detokenizer are children of
the launcher), asks the kernel to kill it when its parent dies (PR_SET_PDEATHSIG, so a SIGKILL
of draftlab does not orphan a GPU server), and is recorded in a registry folder so that a rerun
can find and stop one that an earlier, killed run started. Waiting for health is bounded, prints
what it waits on, and fails with the tail of the server's log. A command with a deadline
(`run_until`, the GPU calls' notebook stages) is stopped at it with all its descendants, a Jupyter
kernel included (it runs in a session of its own).
"""

from __future__ import annotations

import atexit
import ctypes
import io
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path

import httpx

from draftlab.core.stop import pending_stop

__all__ = [
    "ServerProcess",
    "ServerStartError",
    "stop_stale",
    "default_registry",
    "start_owned",
    "descendants",
    "stop_tree",
    "run_until",
    "alive",
    "die_with_parent",
]

_PR_SET_PDEATHSIG = 1
_LIVE: "weakref.WeakSet[ServerProcess]" = weakref.WeakSet()


class ServerStartError(RuntimeError):
    """The server exited or did not answer its health check in time (the message has its log tail)."""


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Linux: the kernel sends this process `sig` when its parent dies, even by SIGKILL. Call it in a child,
    between fork and exec or first thing in a forked worker (a pool's workers otherwise outlive a killed parent,
    blocked on their task queue)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)
    except (OSError, AttributeError):  # not Linux: the process group and atexit still stop it
        pass


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, e.g. a container's or taskset's share), not the host's."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def default_registry() -> Path:
    return Path(os.environ.get("DRAFTLAB_SERVER_REGISTRY", Path.home() / ".cache" / "draftlab" / "servers"))


def alive(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited and not yet reaped, counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie (exited, not yet reaped) counts as gone
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except (OSError, IndexError):
        return True


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_group_gone(pgid: int, timeout: float) -> bool:
    """Wait until no process of group `pgid` is left, reaped ones included (a member killed after its leader
    exited is reaped by init a moment later): whether it went within `timeout` seconds."""
    end = time.monotonic() + timeout
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:  # not ours to wait for
            return False
        if time.monotonic() >= end:
            return False
        time.sleep(0.05)


def stop_stale(registry: str | os.PathLike | None = None, *, grace: float = 10.0) -> list[dict]:
    """Stop every recorded server that outlived the draftlab process that started it (its recorded
    parent is gone) and still runs the recorded command (a pid reused by another program is left
    alone); servers of live draftlab processes are theirs. Returns the records it stopped. Every
    launch calls it first, so a rerun cleans up after a killed run."""
    folder = Path(registry) if registry else default_registry()
    stopped = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            rec = json.loads(path.read_text())
            pid = int(rec["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            path.unlink(missing_ok=True)
            continue
        parent = rec.get("parent")
        if isinstance(parent, int) and alive(parent):
            continue  # a live run's server (this process's own included)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            same = [c.decode(errors="replace") for c in cmdline if c] == rec["argv"]
        except OSError:
            same = False
        if same and alive(pid):
            _kill_group(pid, signal.SIGTERM)
            deadline = time.monotonic() + grace
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            _kill_group(pid, signal.SIGKILL)
            stopped.append(rec)
        path.unlink(missing_ok=True)
    return stopped


def start_owned(argv, **popen_kwargs) -> subprocess.Popen:
    """Popen in a process group of its own, killed by the kernel when this process dies."""
    return subprocess.Popen([str(a) for a in argv], start_new_session=True, preexec_fn=die_with_parent, **popen_kwargs)


def descendants(pid: int) -> list[int]:
    """Every live descendant of `pid` (children first), from /proc; [] where /proc is missing."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue
    found, todo = [], [pid]
    while todo:
        for kid in children.get(todo.pop(0), []):
            if kid not in found:
                found.append(kid)
                todo.append(kid)
    return found


def stop_tree(proc: subprocess.Popen, grace: float = 5.0) -> list[int]:
    """SIGTERM `proc`'s process group and every descendant (found before the first signal: a
    Jupyter kernel is in a session of its own), SIGKILL whatever is left after `grace` seconds.
    Returns the descendants' pids."""
    kids = descendants(proc.pid)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _kill_group(proc.pid, sig)
        for kid in kids:
            try:
                os.kill(kid, sig)
            except (ProcessLookupError, PermissionError):
                pass
        if sig == signal.SIGTERM:
            end = time.monotonic() + grace
            while time.monotonic() < end and (proc.poll() is None or any(alive(k) for k in kids)):
                time.sleep(0.1)
    try:
        proc.wait(timeout=5.0)
    except subprocess.TimeoutExpired:
        pass
    return kids


def run_until(
    argv, deadline: float, *, poll: float = 2.0, grace: float = 5.0, on_deadline=None, on_line=None, **popen_kwargs
) -> int | None:
    """Run `argv` (start_owned) until it exits or time.time() reaches `deadline`; then stop it and
    its descendants (stop_tree) and return None. `on_deadline(proc, kids)` is told first (to say so).
    `on_line(line)` gets each line of its stdout and stderr as it comes (e.g. to leave progress bars out)."""
    if on_line is not None:
        popen_kwargs.update(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    proc = start_owned(argv, **popen_kwargs)
    reader = None
    if on_line is not None:
        reader = threading.Thread(target=_read_lines, args=(proc.stdout, on_line), daemon=True)
        reader.start()
    try:
        while True:
            try:
                rc = proc.wait(timeout=max(0.05, min(poll, deadline - time.time())))
                break
            except subprocess.TimeoutExpired:
                if time.time() >= deadline:
                    rc = None
                    break
        if rc is None:
            if on_deadline is not None:
                on_deadline(proc, descendants(proc.pid))
            stop_tree(proc, grace)
        if reader is not None:
            reader.join(timeout=grace)  # a descendant left holding the pipe does not hold us
        return rc
    except BaseException:  # interrupted: leave nothing behind
        stop_tree(proc, grace=1.0)
        raise


def _read_lines(stream, on_line) -> None:
    for line in io.TextIOWrapper(stream, errors="replace"):
        on_line(line.rstrip("\n"))


class ServerProcess:
    """A child HTTP server: started, health-checked, logged to a file, always stopped.

    >>> with ServerProcess(argv, "logs/x.log", base_url="http://127.0.0.1:30000") as srv:
    ...     httpx.get(srv.base_url + "/health")
    """

    kind = "server"

    def __init__(
        self,
        argv: list[str],
        log_path: str | os.PathLike,
        *,
        base_url: str,
        health_path: str = "/health",
        startup_timeout: float = 300.0,
        env: dict[str, str] | None = None,
        registry: str | os.PathLike | None = None,
        progress_every: float = 15.0,
    ):
        self.argv = [str(a) for a in argv]
        self.log_path = Path(log_path)
        self.base_url = base_url.rstrip("/")
        self.health_path = health_path
        self.startup_timeout = startup_timeout
        self.env = env
        self.registry = Path(registry) if registry else default_registry()
        self.progress_every = progress_every
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None  # of the last start, kept after stop (for checks)
        self.startup_s: float | None = None
        self._t0 = 0.0

    # ------------------------------------------------------------------ life cycle
    def start(self) -> "ServerProcess":
        """Launch and block until the health check answers 200; on any failure the group is gone."""
        self.launch()
        self.wait_ready()
        return self

    def launch(self) -> "ServerProcess":
        """Start the process without waiting (several servers can then start side by side)."""
        if self.proc is not None:
            raise RuntimeError(f"{self.kind} already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ if self.env is None else self.env)
        for rec in stop_stale(self.registry):
            print(
                f"stopped a stale server left by an earlier run: pid {rec['pid']} ({rec.get('base_url')})",
                file=sys.stderr,
                flush=True,
            )
        self._t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"# {shlex.join(self.argv)}\n".encode())
            log.flush()
            self.proc = start_owned(self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)
        self.pid = self.proc.pid
        _LIVE.add(self)
        self._record()
        return self

    def wait_ready(self) -> "ServerProcess":
        """Block until healthy (bounded by startup_timeout from launch); stops the group on failure."""
        if self.proc is None:
            raise RuntimeError(f"{self.kind} not launched")
        try:
            self._wait_healthy(self._t0)
        except BaseException:
            self.stop()
            raise
        if self.startup_s is None:
            self.startup_s = time.monotonic() - self._t0
        return self

    def _record(self) -> None:
        self.registry.mkdir(parents=True, exist_ok=True)
        (self.registry / f"{self.pid}.json").write_text(
            json.dumps(
                {
                    "pid": self.pid,
                    "argv": self.argv,
                    "base_url": self.base_url,
                    "log": str(self.log_path),
                    "parent": os.getpid(),
                    "started": time.time(),
                }
            )
        )

    def _wait_healthy(self, t0: float) -> None:
        url = self.base_url + self.health_path
        next_note = t0 + self.progress_every
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ServerStartError(
                    f"{self.kind} exited with code {code} before {url} answered "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            try:
                if httpx.get(url, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            stop = pending_stop()
            if stop is not None:  # a stop does not wait for a start that may take minutes (a large model's)
                stop.stopped(f"{self.kind} start at {url} abandoned after {time.monotonic() - t0:.0f} s")
            now = time.monotonic()
            if now - t0 > self.startup_timeout:
                raise ServerStartError(
                    f"no answer from {url} within {self.startup_timeout:.0f} s "
                    f"(log {self.log_path}):\n{self.log_tail()}"
                )
            if now >= next_note:
                print(
                    f"waiting for {self.kind} at {url}: {now - t0:.0f} s of {self.startup_timeout:.0f} s "
                    f"(log {self.log_path})",
                    file=sys.stderr,
                    flush=True,
                )
                next_note = now + self.progress_every
            time.sleep(0.5)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM the whole process group, SIGKILL it after `grace` seconds. Idempotent."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        _LIVE.discard(self)
        _kill_group(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            pass
        _kill_group(proc.pid, signal.SIGKILL)  # leftovers of the group, even if the leader exited
        try:
            proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            pass
        _wait_group_gone(proc.pid, 5.0)  # so that a caller (or a test) never sees the group still there
        (self.registry / f"{proc.pid}.json").unlink(missing_ok=True)

    def server_info(self, timeout: float = 10.0) -> dict | None:
        """SGLang's /server_info (or the older /get_server_info) as a dict; None when neither answers."""
        for path in ("/server_info", "/get_server_info"):
            try:
                r = httpx.get(self.base_url + path, timeout=timeout)
            except httpx.HTTPError:
                continue
            if r.status_code == 200:
                try:
                    body = r.json()
                except ValueError:
                    continue
                if isinstance(body, dict):
                    return body
        return None

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def __del__(self):  # last resort; normal paths call stop() explicitly
        try:
            self.stop(grace=2.0)
        except Exception:
            pass


@atexit.register
def _stop_all() -> None:
    for srv in list(_LIVE):
        srv.stop(grace=3.0)
