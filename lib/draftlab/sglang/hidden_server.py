"""The SGLang side of the hidden-state capture: a server of the target with draftlab's forward hook.

The server is the user's own launch line (their flags, `--tp-size N` included) plus the flags of
`hidden_hook.hook_flags`; each conversation is one `/generate` request of its token ids with
max_new_tokens 1 and a request id the hook spools under. After the answer the spooled chunks are
read back and deleted. A window of requests is kept in flight so that SGLang batches prefills.
"""

from __future__ import annotations

import shlex
import shutil
import sys
import tempfile
import uuid
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from draftlab.core.errors import InputError, RunFailure
from draftlab.core.serve import free_port
from draftlab.sglang.commands import sglang_target_command
from draftlab.sglang.hidden_hook import RID_PREFIX, hook_flags, hook_specs, take_request, worker_error
from draftlab.sglang.server import SGLangServer

# Flags the capture cannot honour: tokens split across ranks, or a server that is not the plain target.
REFUSED_FLAGS = {
    "--enable-dp-attention": "DP attention splits a batch's tokens across ranks",
    "--speculative-algorithm": "capture serves the target alone (drop the speculative flags)",
    "--enable-mixed-chunk": "mixed prefill/decode batches are not split by the hook",
}
PIPELINE_FLAGS = ("--pp-size", "--pipeline-parallel-size")
LIB_DIR = Path(__file__).resolve().parents[2]  # the folder holding the draftlab package


def check_launch_args(args: list[str]) -> None:
    """One line naming the first flag the capture cannot run with."""
    for i, token in enumerate(args):
        name = token.split("=", 1)[0]
        if name in REFUSED_FLAGS:
            raise InputError(f"--sglang-args: {name}: {REFUSED_FLAGS[name]}")
        if name in PIPELINE_FLAGS:
            value = token.split("=", 1)[1] if "=" in token else (args[i + 1] if i + 1 < len(args) else "")
            if value != "1":
                raise InputError(
                    f"--sglang-args: {name} {value}: pipeline parallelism is not supported (use --tp-size)"
                )


def capture_command(model_path, plan: dict, launch_args: str, spool_dir, port: int) -> str:
    """The launch line: draftlab's plain target command, the user's flags, then the capture's."""
    extra = shlex.split(launch_args or "")
    check_launch_args(extra)
    specs = hook_specs(spool_dir, plan["config_ids"], plan["layers"], plan["hidden_size"], plan["architectures"])
    return sglang_target_command(str(model_path), port=port, extra=tuple(extra + hook_flags(specs)))


def server_env_with_draftlab(env: dict | None) -> dict:
    """The server's environment with draftlab importable (the hook factory is imported in each worker)."""
    import os

    env = dict(os.environ if env is None else env)
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(paths + [str(LIB_DIR)])
    return env


class SGLangCapture:
    """`with SGLangCapture(...) as adapter: capture_hidden(adapter, ...)`: one server for all splits."""

    def __init__(
        self,
        model_path,
        plan: dict,
        launch_args: str,
        log_path,
        *,
        spool_dir=None,
        python: str | None = None,
        env: dict | None = None,
        in_flight: int = 16,
        startup_timeout: float = 900.0,
        request_timeout: float = 900.0,
    ):
        self.own_spool = spool_dir is None  # a temporary spool is removed on exit
        self.spool = Path(spool_dir or tempfile.mkdtemp(prefix="draftlab-spool-", dir=_spool_root()))
        self.spool.mkdir(parents=True, exist_ok=True)
        port = free_port()
        self.command = capture_command(model_path, plan, launch_args, self.spool, port)
        self.server = SGLangServer(
            self.command,
            log_path,
            python=python or sys.executable,
            env=server_env_with_draftlab(env),
            startup_timeout=startup_timeout,
        )
        self.in_flight, self.timeout = max(1, in_flight), request_timeout
        self.run_id = uuid.uuid4().hex[:8]
        self.client = None

    def __enter__(self) -> "SGLangCapture":
        self.server.start()
        self.client = httpx.Client(base_url=self.server.base_url, timeout=self.timeout)
        for i in range(self.in_flight):  # each worker's first forward only turns the capture on
            self._generate([1, 2, 3], f"warmup-{self.run_id}-{i}")
        self._raise_worker_error()
        return self

    def __exit__(self, *exc) -> None:
        if self.client is not None:
            self.client.close()
        self.server.stop()
        if self.own_spool:
            shutil.rmtree(self.spool, ignore_errors=True)

    def _generate(self, ids: list[int], rid: str) -> None:
        body = {"input_ids": list(ids), "rid": rid, "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}}
        try:
            response = self.client.post("/generate", json=body)
        except httpx.HTTPError as exc:
            raise RunFailure(
                f"{self.server.base_url}/generate: {type(exc).__name__}: {exc} (log {self.server.log_path})"
            )
        if response.status_code != 200:
            raise RunFailure(f"{self.server.base_url}/generate: HTTP {response.status_code}: {response.text[:300]}")

    def _raise_worker_error(self) -> None:
        message = worker_error(self.spool)
        if message:
            raise RunFailure(f"SGLang capture hook: {message} (log {self.server.log_path})")

    def one(self, k: int, ids: list[int]):
        """(k, aux [n, 3H], final [n, H]) of one conversation."""
        rid = f"{RID_PREFIX}{self.run_id}-{k}"
        self._generate(ids, rid)
        self._raise_worker_error()
        try:
            aux, final = take_request(self.spool, rid, len(ids), timeout=self.timeout)
        except ValueError as exc:
            self._raise_worker_error()  # the writer's own failure, when it is one
            raise RunFailure(
                f"SGLang capture: {exc} (a prefill replayed from a CUDA graph runs no hook: keep "
                f"--disable-prefill-cuda-graph; log {self.server.log_path})"
            ) from exc
        return k, aux, final

    def states(self, items):
        """(k, aux, final) for each (k, ids) in order, `in_flight` requests at a time."""
        pending: deque = deque()
        with ThreadPoolExecutor(self.in_flight) as pool:
            try:
                for k, ids in items:
                    pending.append(pool.submit(self.one, k, ids))
                    if len(pending) >= self.in_flight:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
            finally:
                for future in pending:
                    future.cancel()


def _spool_root() -> str | None:
    """/dev/shm when there is one (the spool is read back at once: no need for a disk round trip)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() else None
