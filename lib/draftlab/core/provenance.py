"""Where an artifact came from: the commit, the versions and the command that made it.

A record of this kind sits beside every exported draft (`provenance.json`) and in every run's
`params.yaml`, so a figure or a draft can be traced and made again without a work log.
"""

from __future__ import annotations

import importlib.metadata
import shlex
import subprocess
import sys

from draftlab.core.paths import repo_root

__all__ = ["git_commit", "provenance", "versions"]

PACKAGES = ("draftlab", "torch", "transformers", "safetensors")


def git_commit() -> str:
    """The checkout's short commit (with `+dirty` when it has uncommitted changes), or "unknown"."""
    root = repo_root()
    if root is None:
        return "unknown"
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=root, capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    except (subprocess.CalledProcessError, FileNotFoundError):
        return "unknown"
    return commit + ("+dirty" if dirty else "")


def versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Installed versions of the packages that shape an artifact (None-free: missing ones are left out)."""
    found = {"python": sys.version.split()[0]}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def provenance(extra: dict | None = None) -> dict:
    """The record: commit, versions, and the command line of this process (as a user would retype it)."""
    return {
        "commit": git_commit(),
        "versions": versions(),
        "command": shlex.join(["draftlab" if sys.argv[0].endswith("draftlab") else sys.executable, *sys.argv[1:]]),
        **(extra or {}),
    }
