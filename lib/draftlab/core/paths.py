"""Where things are: the checkout this package runs from, and paths relative to it.

Notebooks run with their own folder as the working directory, so a relative path from a spec
or a parameter is looked up in the checkout when it does not exist from here.
"""

from __future__ import annotations

from pathlib import Path


def repo_root() -> Path | None:
    """The checkout holding this package (editable install), or None when installed elsewhere."""
    root = Path(__file__).resolve().parents[3]  # lib/draftlab/core/paths.py -> the checkout
    return root if (root / "pyproject.toml").exists() else None


def repo_path(path: str | Path) -> Path:
    """A relative path that does not exist from here is taken relative to the checkout (notebooks run elsewhere)."""
    path = Path(path)
    if path.is_absolute() or path.exists():
        return path
    root = repo_root()
    return root / path if root is not None and (root / path).exists() else path


def repo_relative(path: str | Path) -> str:
    """A path inside the checkout written relative to it, any other as given: tables committed to the repo
    name their inputs, and an absolute path would name one machine's checkout."""
    root = repo_root()
    if root is not None:
        try:
            return str(Path(path).resolve().relative_to(root))
        except ValueError:
            pass
    return str(path)
