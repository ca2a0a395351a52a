"""SGLang servers started from draftlab's own launch commands (`draftlab.sglang.commands` builds them).

`SGLangServer` is a core.process.ServerProcess (own process group, dies with its parent, recorded
for `stop_stale`, bounded health wait) whose argv is an SGLang launch command run by this
machine's interpreter; `python -m draftlab.sglang.server` keeps one up for a shell step.
"""

from __future__ import annotations

import argparse
import os
import shlex
import signal
import sys
import time
from pathlib import Path

from draftlab.core.errors import InputError
from draftlab.core.process import ServerProcess, ServerStartError, stop_stale
from draftlab.core.serve import LocalServer
from draftlab.model.target import TargetError, resolve_device, resolve_path
from draftlab.sglang.commands import regeneration_commands
from draftlab.sglang.install import server_env

__all__ = ["SGLangServer", "TargetServers", "serve_target", "sglang_argv"]


def _flag(argv: list[str], name: str, default: str | None = None) -> str | None:
    for i, token in enumerate(argv):
        if token == name and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return default


def sglang_argv(command: str, python: str | None = None) -> list[str]:
    """A launch command as draftlab writes it (`python -m sglang.launch_server ...`) as the argv to
    run here: the leading `python` becomes this machine's interpreter (or `python`)."""
    argv = shlex.split(command)
    if "sglang.launch_server" not in argv:
        raise ValueError(f"not an SGLang launch command (no `-m sglang.launch_server`): {command[:120]}")
    start = argv.index("sglang.launch_server") - 1
    if start < 0 or argv[start] != "-m":
        raise ValueError(f"expected `python -m sglang.launch_server ...`, got: {command[:120]}")
    return [python or sys.executable, *argv[start:]]


class SGLangServer(ServerProcess):
    """`python -m sglang.launch_server ...` from one of draftlab's launch commands (draftlab.serve)."""

    kind = "SGLang server"

    def __init__(
        self,
        command: str,
        log_path: str | os.PathLike,
        *,
        python: str | None = None,
        startup_timeout: float = 600.0,
        env: dict[str, str] | None = None,
        **kwargs,
    ):
        argv = sglang_argv(command, python)
        host = _flag(argv, "--host", "127.0.0.1")
        port = _flag(argv, "--port", "30000")
        self.command = command
        super().__init__(
            argv,
            log_path,
            base_url=f"http://{host}:{port}",
            health_path="/health",
            startup_timeout=startup_timeout,
            env=env,
            **kwargs,
        )


class TargetServers:
    """`count` SGLang servers of one target, launched together (their graph captures overlap) and
    stopped together: `with TargetServers(...) as servers: servers.urls`."""

    def __init__(
        self,
        model_path: str,
        count: int,
        log_dir: str | os.PathLike,
        *,
        prefix: str | None = None,
        port: int = 30000,
        startup_timeout: float = 600.0,
        python: str | None = None,
        mem_fraction_static: float = 0.5,
    ):
        env = server_env(prefix) if prefix else None
        log_dir = Path(log_dir)
        self.model = str(model_path)  # the `model` field the servers answer to (SGLang serves the folder path)
        self.servers = [
            SGLangServer(cmd, log_dir / f"sglang-{i}.log", python=python, env=env, startup_timeout=startup_timeout)
            for i, cmd in enumerate(
                regeneration_commands(model_path, count, port=port, mem_fraction_static=mem_fraction_static)
            )
        ]

    @property
    def urls(self) -> list[str]:
        return [s.base_url for s in self.servers]

    @property
    def startup_s(self) -> float:
        return max(s.startup_s for s in self.servers)

    def start(self) -> "TargetServers":
        """Launch all, then wait for each (bounded); on any failure all are stopped. They stay up, for
        as many client runs as the caller makes, until stop()."""
        try:
            for s in self.servers:
                s.launch()
            for s in self.servers:
                s.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __enter__(self) -> "TargetServers":
        return self.start()

    def stop(self) -> None:
        for s in self.servers:
            s.stop()

    def __exit__(self, *exc) -> None:
        self.stop()


def serve_target(
    spec: str,
    log_dir: Path,
    *,
    sglang_servers: int = 0,
    prefix: str | None = None,
    device: str = "auto",
    continuous_batching: bool = True,
) -> "TargetServers | LocalServer":
    """The servers a command's `--serve TARGET` starts for its run: `sglang_servers` SGLang servers on this
    GPU, or one `transformers serve` (logs in log_dir). Use it as a context manager: `.urls`, `.model` (the
    served folder) and `.startup_s`. A target that cannot be resolved is an InputError naming --serve."""
    try:
        folder = resolve_path(spec)
    except TargetError as exc:
        raise InputError(f"--serve {exc}") from exc
    if sglang_servers:
        return TargetServers(str(folder), sglang_servers, log_dir, prefix=prefix)
    return LocalServer(
        folder, log_path=log_dir / "serve.log", device=resolve_device(device), continuous_batching=continuous_batching
    )


# ---------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    """`python -m draftlab.sglang.server --launch CMD --log FILE [--prefix DIR] [--ready-file F]`:
    start one SGLang server, write its URL to the ready file once healthy, and keep it until this
    process gets SIGTERM/SIGINT (or dies: the server goes with it). For shell scripts that need a
    server for the length of a step."""
    ap = argparse.ArgumentParser(prog="python -m draftlab.sglang.server", description=main.__doc__)
    ap.add_argument("--launch", required=True, help="an SGLang launch command (python -m sglang.launch_server ...)")
    ap.add_argument("--log", required=True, help="the server's log file")
    ap.add_argument("--prefix", help="offline SGLang install (draftlab sglang install) put first on PYTHONPATH")
    ap.add_argument("--python", default=None, help="interpreter for the server (default: this one)")
    ap.add_argument("--ready-file", help="written with the base URL once the server is healthy")
    ap.add_argument("--startup-timeout", type=float, default=600.0)
    args = ap.parse_args(argv)
    env = server_env(args.prefix) if args.prefix else None
    stop_stale()
    srv = SGLangServer(args.launch, args.log, python=args.python, startup_timeout=args.startup_timeout, env=env)
    stop = {"now": False}

    def _on_signal(signum, frame):
        stop["now"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _on_signal)
    try:
        srv.start()
        print(f"ready: {srv.base_url} after {srv.startup_s:.0f} s (log {srv.log_path})", flush=True)
        if args.ready_file:
            Path(args.ready_file).write_text(srv.base_url + "\n")
        while srv.alive():
            time.sleep(1.0)
        print(f"the server exited by itself (log {srv.log_path}):\n{srv.log_tail()}", file=sys.stderr)
        return 1
    except ServerStartError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        srv.stop()


if __name__ == "__main__":
    sys.exit(main())
