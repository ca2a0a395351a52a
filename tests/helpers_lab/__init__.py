"""Start JupyterLab on loopback the way `make lab` does (same config file), for tests that talk to it;
read the text a saved figure carries (png_text); list the published executed notebooks."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).parents[2]
LAB_CONFIG = ROOT / "scripts" / "lab" / "jupyter_server_config.py"


def published_notebooks() -> list[Path]:
    """Executed notebooks git tracks under results/*/executed (a local `make demo` run is not
    published); what is on disk outside a git checkout."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", "results/*/executed/*.ipynb"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        paths = [ROOT / p for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        paths = list(ROOT.glob("results/*/executed/*.ipynb"))
    return sorted(p for p in paths if p.is_file())


@dataclass
class Lab:
    url: str
    token: str
    root: Path
    log: Path

    @property
    def headers(self) -> dict:
        return {"Authorization": f"token {self.token}"}

    def api(self, method: str, path: str, **kwargs) -> httpx.Response:
        response = httpx.request(method, f"{self.url}/api/{path}", headers=self.headers, timeout=30, **kwargs)
        response.raise_for_status()
        return response


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_lab(root: Path, tmp_path: Path, timeout_s: float = 90):
    """JupyterLab serving `root` with the repository's config; stopped (its process group) on exit."""
    port, token = _free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--notebook-dir={root}",
        f"--config={LAB_CONFIG}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {
        **os.environ,
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter-config"),
    }
    log_path = tmp_path / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    lab = Lab(f"http://127.0.0.1:{port}", token, root, log_path)
    try:
        deadline = time.time() + timeout_s
        while True:
            try:
                if httpx.get(f"{lab.url}/api/status", headers=lab.headers, timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None:
                raise RuntimeError(f"JupyterLab exited {proc.returncode}: {log_path.read_text()[-2000:]}")
            if time.time() > deadline:
                raise RuntimeError(f"JupyterLab did not answer in {timeout_s:.0f} s: {log_path.read_text()[-2000:]}")
            time.sleep(0.5)
        yield lab
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()


def png_text(path: Path) -> dict:
    """The tEXt chunks of a PNG (where matplotlib writes savefig's metadata)."""
    data, out, pos = path.read_bytes(), {}, 8
    while pos < len(data):
        size = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + size]
        if kind == b"tEXt":
            key, _, value = body.partition(b"\0")
            out[key.decode("latin-1")] = value.decode("latin-1")
        pos += 12 + size
    return out
