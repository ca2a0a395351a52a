"""The Makefile's set-up does what it says: `make setup TORCH=...` on an existing venv installs that torch."""

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1]


def _dry_run(venv: Path, torch: str) -> str:
    return subprocess.run(
        ["make", "-n", "-C", str(ROOT), "setup", f"VENV={venv}", f"TORCH={torch}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_a_new_torch_requirement_reinstalls_torch_and_draftlab(tmp_path):
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    stamps = [venv / ".torch-torch==2.13.0", venv / ".draftlab-installed", venv / ".draftlab-tools"]
    later = time.time() + 60  # newer than pyproject.toml
    for stamp in stamps:
        stamp.touch()
        os.utime(stamp, (later, later))
    same = _dry_run(venv, "torch==2.13.0")
    assert "pip install" not in same  # nothing to do: the venv holds this torch
    other = _dry_run(venv, "torch==2.11.0")
    assert 'pip install -q --disable-pip-version-check "torch==2.11.0"' in other
    assert '-e ".[dev]" "torch==2.11.0"' in other  # draftlab reinstalled against it


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_the_venvs_torch_is_kept_by_later_targets(tmp_path):
    """After `make setup TORCH=torch==2.11.0` (a CUDA build on a GPU machine), `make lab`, `make test` and
    `make demo` keep it: they reinstalled the default CPU torch and draftlab before (issue 20.9)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    later = time.time() + 60
    for stamp in (venv / ".torch-torch==2.11.0", venv / ".draftlab-installed", venv / ".draftlab-tools"):
        stamp.touch()
        os.utime(stamp, (later, later))
    (venv / ".torch-requirement").write_text("torch==2.11.0\n")  # what the torch stamp's recipe records
    for target in ("setup", "lab", "test", "demo"):
        out = subprocess.run(
            ["make", "-n", "-C", str(ROOT), target, f"VENV={venv}"], capture_output=True, text=True, check=True
        ).stdout
        assert "pip install" not in out, f"make {target} reinstalls: {out}"
    back = _dry_run(venv, "torch==2.13.0")  # an explicit TORCH still switches
    assert 'pip install -q --disable-pip-version-check "torch==2.13.0"' in back
    assert "> " + str(venv / ".torch-requirement") in back


@pytest.mark.skipif(shutil.which("make") is None, reason="no make on this machine")
def test_make_lab_takes_a_port_and_a_token(tmp_path):
    """`make lab PORT=... TOKEN=...` (issue 20.8); without TOKEN, Lab makes its own and prints it."""

    def lab(*extra):
        return subprocess.run(
            ["make", "-n", "-C", str(ROOT), "lab", f"VENV={tmp_path / 'venv'}", *extra],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    given = lab("PORT=8890", "TOKEN=s3cret")
    assert "--port=8890" in given and "--IdentityProvider.token=s3cret" in given and "--ip=127.0.0.1" in given
    default = lab()
    assert "--port=8888" in default and "IdentityProvider.token" not in default
