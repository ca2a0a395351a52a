"""Local OpenAI-compatible servers for regeneration (`transformers serve`), and port helpers.

`LocalServer` runs a real `transformers serve --continuous-batching` for a model folder on
127.0.0.1 (a free port), waits for `/health`, logs to a file, and always stops it (core.process:
its own process group, stopped on `stop()`, on leaving the `with` block, at interpreter exit, and
by the kernel when its parent dies).
SGLang's launch lines are built in `draftlab.sglang.commands`.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

from draftlab.core.errors import InputError, RunFailure
from draftlab.core.process import ServerProcess, ServerStartError

__all__ = [
    "LocalServer",
    "ServerStartError",
    "free_port",
    "free_port_run",
    "require_reachable",
    "transformers_serve_command",
]


def require_reachable(url: str, timeout_s: float = 5.0) -> None:
    """InputError for a URL that names no server, RunFailure unless something accepts TCP
    connections at its host and port: a dead server is said at once, with its URL, instead of as
    every request of a run failing later."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise InputError(f"{url}: not a server URL (bad port)") from None
    if not parts.hostname:
        raise InputError(f"{url}: not a server URL (no host)")
    try:
        socket.create_connection((parts.hostname, port), timeout=timeout_s).close()
    except OSError as exc:
        raise RunFailure(f"{url}: no server reachable at {parts.hostname}:{port} ({exc.strerror or exc})") from None


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free right now on `host` (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def free_port_run(count: int, host: str = "127.0.0.1", tries: int = 50) -> int:
    """A port free now with the `count - 1` after it, for a group of servers on consecutive ports (a lone
    free_port() once found the next one taken: "Address already in use")."""
    for _ in range(tries):
        port, held = free_port(host), []
        try:
            for k in range(count):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                held.append(s)
                s.bind((host, port + k))
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
        return port
    raise OSError(f"no {count} consecutive free ports on {host} in {tries} tries")


def _transformers_exe() -> list[str]:
    """The `transformers` console script of this interpreter's environment."""
    exe = Path(sys.executable).parent / "transformers"
    if exe.exists():
        return [str(exe)]
    found = shutil.which("transformers")
    if found:
        return [found]
    raise FileNotFoundError(
        "the `transformers` command is not installed next to this Python; "
        "install it with: pip install 'transformers[serving]'"
    )


# On CPU, continuous batching sizes its KV cache to 60% of the machine's RAM and those pages are
# touched at start-up (measured: the tiny target's server at 14.2 GB RSS on this 24 GiB machine,
# then killed by the OOM killer under load). A fixed capacity keeps the server small on any
# machine: 16,384 tokens (64 pages of 256) is ~0.75 GB for the embedded target, enough for tens
# of concurrent requests. (A percentage is fragile: 1% here left no room and every request 500'd.)
CPU_KV_CACHE_TOKENS = 16384
KV_PAGE_TOKENS = 256  # transformers' default page (block) size


def transformers_serve_command(
    model_path: str | os.PathLike,
    *,
    host: str = "127.0.0.1",
    port: int = 8000,
    device: str = "cpu",
    continuous_batching: bool = True,
    dtype: str = "auto",
    kv_cache_tokens: int | None = None,
    log_level: str = "info",
    extra_args: tuple[str, ...] = (),
) -> list[str]:
    """argv of `transformers serve` preloading `model_path` (requests must name that path).

    kv_cache_tokens: capacity of the continuous-batching KV cache (default: 16,384 on CPU,
    transformers' memory-based sizing elsewhere)."""
    cmd = [
        *_transformers_exe(),
        "serve",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--device",
        device,
        "--dtype",
        dtype,
        "--log-level",
        log_level,
    ]
    cmd.append("--continuous-batching" if continuous_batching else "--no-continuous-batching")
    if kv_cache_tokens is None and device == "cpu":
        kv_cache_tokens = CPU_KV_CACHE_TOKENS
    if continuous_batching and kv_cache_tokens:
        cmd += ["--cb-num-blocks", str(-(-kv_cache_tokens // KV_PAGE_TOKENS))]
    return cmd + list(extra_args)


class LocalServer(ServerProcess):
    """A `transformers serve` child process for one model folder; use it as a context manager.

    A core.process.ServerProcess: its own process group, killed with its parent (SIGKILL of
    draftlab included), recorded so that a rerun stops a stale one (`stop_stale`).

    >>> with LocalServer(target.path, log_path=run.dir / "logs/serve.log") as srv:
    ...     regenerate(..., base_urls=[srv.base_url], model=srv.model)
    """

    kind = "transformers serve"

    def __init__(
        self,
        model_path: str | os.PathLike,
        log_path: str | os.PathLike,
        *,
        host: str = "127.0.0.1",
        port: int | None = None,
        device: str = "cpu",
        continuous_batching: bool = True,
        dtype: str = "auto",
        kv_cache_tokens: int | None = None,
        startup_timeout: float = 180.0,
        extra_args: tuple[str, ...] = (),
        threads: int | None = None,
        env: dict[str, str] | None = None,
        registry: str | os.PathLike | None = None,
    ):
        self.model_path = Path(model_path)
        if not (self.model_path / "config.json").exists():
            raise FileNotFoundError(f"{self.model_path}: not a model folder (no config.json)")
        port = port or free_port(host)
        env = dict(os.environ if env is None else env)
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("TOKENIZERS_PARALLELISM", "false")
        if threads:  # CPU threads of the server (OMP_NUM_THREADS); None: torch's default
            env["OMP_NUM_THREADS"] = env["MKL_NUM_THREADS"] = str(threads)
        self.host, self.port, self.device, self.threads = host, port, device, threads
        argv = transformers_serve_command(
            self.model_path,
            host=host,
            port=port,
            device=device,
            continuous_batching=continuous_batching,
            dtype=dtype,
            kv_cache_tokens=kv_cache_tokens,
            extra_args=tuple(extra_args),
        )
        super().__init__(
            argv,
            log_path,
            base_url=f"http://{host}:{port}",
            health_path="/health",
            startup_timeout=startup_timeout,
            env=env,
            registry=registry,
        )

    @property
    def urls(self) -> list[str]:
        """Its one base URL, as a list (a group of servers, sglang.server.TargetServers, has several)."""
        return [self.base_url]

    @property
    def model(self) -> str:
        """The `model` field requests must carry (transformers serve wants the folder path)."""
        return str(self.model_path)

    @property
    def command(self) -> list[str]:
        return self.argv

    def rss_mb(self) -> float | None:
        """Resident memory of the server process (Linux), for checks and reports."""
        try:
            for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        except (OSError, AttributeError):
            return None
        return None
