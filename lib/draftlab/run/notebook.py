"""What every numbered notebook calls first and last: parameter checks, run folder, figures, metrics."""

from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass
from pathlib import Path

from draftlab.core.files import atomic_write_json
from draftlab.core.paths import repo_root
from draftlab.model.target import resolve_device

REQUIRED_PARAMETERS = ("RUN_DIR", "PROFILE", "TARGET", "DEVICE", "SEED")


class ParameterError(ValueError):
    """A notebook got a parameter it does not declare, or one of the wrong type."""


def notebooks_dir() -> Path:
    root = repo_root()
    if root is None:
        raise FileNotFoundError("draftlab notebooks live in the repository checkout; install it editable")
    return root / "notebooks"


def notebook_path(name: str) -> Path:
    return notebooks_dir() / f"{name}.ipynb"


def declared_parameters(path: str | Path) -> dict:
    """Names and default values of the cell tagged `parameters` (literals only), read without running it."""
    nb = json.loads(Path(path).read_text())
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            params = {}
            for node in ast.parse(source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    params[node.targets[0].id] = ast.literal_eval(node.value)
            return params
    raise ParameterError(f"{path}: no cell tagged 'parameters'")


def check_value(name: str, value, default, where: str) -> None:
    """Reject a value whose type cannot stand in for the default (ints may stand in for floats)."""
    if default is None or value is None:
        return
    ok = isinstance(value, type(default)) or (isinstance(default, float) and isinstance(value, int))
    if isinstance(default, int) and isinstance(value, bool) != isinstance(default, bool):
        ok = False
    if not ok:
        raise ParameterError(
            f"{where}: parameter {name} = {value!r} is {type(value).__name__}, expected {type(default).__name__} "
            f"(default {default!r})"
        )


@dataclass
class Run:
    name: str
    dir: Path
    params: dict
    device: str

    @property
    def figures(self) -> Path:
        return self.dir / "figures"

    @property
    def target_spec(self) -> str:
        return self.params["TARGET"]

    @property
    def profile(self) -> str:
        return self.params["PROFILE"]

    def data(self, stage: str) -> Path:
        path = self.dir / "data" / stage
        path.mkdir(parents=True, exist_ok=True)
        return path


def start(name: str, namespace: dict) -> Run:
    """Validate this notebook's parameters (papermill only warns on unknown ones), seed, make folders."""
    params = {k: v for k, v in namespace.items() if k.isupper() and not k.startswith("_")}
    source = notebook_path(name)
    if source.exists():
        declared = declared_parameters(source)
        unknown = sorted(set(params) - set(declared))
        if unknown:
            raise ParameterError(f"{name}: unknown parameter(s) {unknown}; this notebook takes {sorted(declared)}")
        for key, value in params.items():
            check_value(key, value, declared[key], name)
    missing = [k for k in REQUIRED_PARAMETERS if k not in params]
    if missing:
        raise ParameterError(f"{name}: the parameters cell must define {missing}")
    root = repo_root()
    run_dir = Path(params["RUN_DIR"])
    if not run_dir.is_absolute() and root is not None:
        run_dir = root / run_dir
    (run_dir / "figures").mkdir(parents=True, exist_ok=True)
    seed_everything(int(params["SEED"]))
    return Run(name=name, dir=run_dir, params=params, device=resolve_device(params["DEVICE"]))


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def save_figure(run: Run, fig, label: str) -> Path:
    """Save a figure as RUN_DIR/figures/<notebook>_<label>.png (what the README links to)."""
    path = run.figures / f"{run.name}_{label}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def save_metrics(run: Run, metrics: dict) -> Path:
    """Merge this notebook's metrics into RUN_DIR/metrics.json under its own name."""
    return merge_metrics(run.dir, run.name, metrics)


def merge_metrics(run_dir: Path, key: str, value: dict) -> Path:
    """Set one section of RUN_DIR/metrics.json, keeping the others (written atomically)."""
    path = Path(run_dir) / "metrics.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = value
    atomic_write_json(path, data, indent=2, sort_keys=True, default=_jsonable)
    return path


def _jsonable(value):
    """numpy/torch scalars and paths into plain JSON."""
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    return str(value)
