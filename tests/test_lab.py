"""JupyterLab starts on loopback, answers /api/status and lists the notebooks."""

import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from draftlab.core.serve import free_port

ROOT = Path(__file__).parents[1]


@pytest.mark.server
def test_jupyterlab_answers_and_lists_notebooks(tmp_path):
    port, token = free_port(), secrets.token_hex(16)
    cmd = [
        sys.executable,
        "-m",
        "jupyterlab",
        "--no-browser",
        "--ip=127.0.0.1",
        f"--port={port}",
        f"--IdentityProvider.token={token}",
        f"--notebook-dir={ROOT}",
    ]
    if os.geteuid() == 0:
        cmd.append("--allow-root")
    env = {**os.environ, "JUPYTER_RUNTIME_DIR": str(tmp_path), "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    log = open(tmp_path / "lab.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        headers = {"Authorization": f"token {token}"}
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            try:
                status = httpx.get(f"{base}/api/status", headers=headers, timeout=2)
                if status.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None, (tmp_path / "lab.log").read_text()
            assert time.time() < deadline, "JupyterLab did not answer in 60 s"
            time.sleep(0.5)
        listing = httpx.get(f"{base}/api/contents/notebooks", headers=headers, timeout=10).json()
        names = {item["name"] for item in listing["content"]}
        assert "00_environment_check.ipynb" in names
        kernels = httpx.get(f"{base}/api/kernelspecs", headers=headers, timeout=10).json()
        assert "draftlab" in kernels["kernelspecs"]
    finally:
        os.killpg(proc.pid, 15)
        proc.wait(timeout=20)
