"""What every numbered notebook calls first and last: parameter checks, run folder, figures, metrics."""

from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass
from pathlib import Path

from draftlab.core.errors import InputError
from draftlab.core.files import atomic_write_json
from draftlab.core.paths import repo_root
from draftlab.model.target import check_device_name, resolve_device
from draftlab.run import settings
from draftlab.run.settings import StageMissing  # noqa: F401 (what `needs` raises; notebooks may catch it)

REQUIRED_PARAMETERS = ("RUN_DIR", "PROFILE", "TARGET", "DEVICE", "SEED")


class ParameterError(InputError):
    """A notebook got a parameter it does not declare, or one of the wrong type (one line in Lab too)."""


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
    caveat: str | None = None  # "random weights ...: not a result" on a random target; every figure carries it

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
    """Validate this notebook's parameters (papermill only warns on unknown ones), take the run folder's
    settings (run.json: TARGET, PROFILE and that profile's sizes, for parameters left at their defaults),
    seed, make folders. `namespace` is the notebook's globals(): what the run folder decides is set there."""
    params = {k: v for k, v in namespace.items() if k.isupper() and not k.startswith("_")}
    source = notebook_path(name)
    declared = declared_parameters(source) if source.exists() else {}
    if declared:
        unknown = sorted(set(params) - set(declared))
        if unknown:
            raise ParameterError(f"{name}: unknown parameter(s) {unknown}; this notebook takes {sorted(declared)}")
        for key, value in params.items():
            check_value(key, value, declared[key], name)
    missing = [k for k in REQUIRED_PARAMETERS if k not in params]
    if missing:
        raise ParameterError(f"{name}: the parameters cell must define {missing}")
    check_device_name(params["DEVICE"], where=f"{name}: DEVICE")
    root = repo_root()
    run_dir = Path(params["RUN_DIR"])
    if not run_dir.is_absolute() and root is not None:
        run_dir = root / run_dir
    taken = settings.adopt(run_dir, name, params, declared)
    if taken:
        namespace.update(taken)
        params.update(taken)
        print(
            f"{params['RUN_DIR']}: from the run folder ({settings.RUN_FILE}, the {params['PROFILE']} profile): "
            + ", ".join(f"{k}={v!r}" for k, v in taken.items())
        )
    (run_dir / "figures").mkdir(parents=True, exist_ok=True)
    settings.write_run_settings(run_dir, params, written_by=name)
    caveat = settings.caveat(params["TARGET"]) if name not in settings.NO_WEIGHTS else None
    if caveat:
        print(
            f"TARGET={params['TARGET']!r} has random weights: every figure of this run is stamped "
            f"'{caveat}'. For the real story use TARGET='embedded' (README: Lab defaults)."
        )
    seed_everything(int(params["SEED"]))
    return Run(name=name, dir=run_dir, params=params, device=resolve_device(params["DEVICE"]), caveat=caveat)


def needs(run: Run, *stages: str) -> None:
    """Stop here, in one line, when an earlier stage has not written its output in RUN_DIR (StageMissing)."""
    settings.require(run.dir, *stages)


def seed_everything(seed: int) -> None:
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


class Saved(type(Path())):
    """A path a notebook cell wrote, shown as `saved <path>`: the cell's result then reads as what
    happened, not as `PosixPath('...')` beside the figure (issue 20.3)."""

    def __repr__(self) -> str:
        return f"saved {self}"


def save_figure(run: Run, fig, label: str, caveat: str | None = None) -> Path | None:
    """Save a figure as RUN_DIR/figures/<notebook>_<label>.png (what the README links to).

    A run on random weights (run.caveat), or a figure with its own `caveat` (an untrained draft), is
    stamped across every panel and in its title, so it cannot be read as a result; the PNG records it
    under "draftlab:caveat". fig None (a plot with nothing to draw in this run): nothing saved, None."""
    if fig is None:
        return None
    caveat = "; ".join(c for c in (run.caveat, caveat) if c)
    if caveat:
        stamp(fig, caveat)
    path = run.figures / f"{run.name}_{label}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"draftlab:caveat": caveat} if caveat else None)
    return Saved(path)


def stamp(fig, caveat: str) -> None:
    """A red banner above the figure and a watermark across each panel: '<caveat>'."""
    if getattr(fig, "_draftlab_caveat", None) == caveat:
        return
    fig._draftlab_caveat = caveat
    fig.text(
        0.5,
        1.02,
        caveat,
        ha="center",
        va="bottom",
        color="white",
        fontsize=10,
        fontweight="bold",
        bbox={"facecolor": "tab:red", "edgecolor": "none", "pad": 3},
    )
    panels = {}
    for ax in fig.axes:  # a twinx axis shares its panel: one watermark per panel
        panels.setdefault(tuple(round(x, 3) for x in ax.get_position().bounds), ax)
    for ax in panels.values():
        ax.text(
            0.5,
            0.5,
            caveat.split(":")[0].replace(" (", "\n("),
            transform=ax.transAxes,
            ha="center",
            va="center",
            rotation=20,
            fontsize=13,
            color="tab:red",
            alpha=0.28,
            fontweight="bold",
            zorder=10,
        )


def save_metrics(run: Run, metrics: dict) -> Path:
    """Merge this notebook's metrics into RUN_DIR/metrics.json under its own name."""
    return Saved(merge_metrics(run.dir, run.name, metrics))


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
