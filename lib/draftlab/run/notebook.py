"""What every numbered notebook calls first and last: parameter checks, run folder, figures, metrics."""

from __future__ import annotations

import ast
import json
import random
from dataclasses import dataclass
from pathlib import Path

from draftlab import __version__
from draftlab.core.errors import InputError
from draftlab.core.files import atomic_write_json
from draftlab.core.paths import repo_root
from draftlab.core.run_folder import RunFolder
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
    caveat: str | None = None  # random weights, or demo scale: "...: not a result"; every figure carries it
    source: str = ""  # what measured this notebook's figures (engine, prompt set and n), set where it is known

    @property
    def folder(self) -> RunFolder:
        """The run folder's named places (core.run_folder: one owner of its layout)."""
        return RunFolder(self.dir)

    @property
    def figures(self) -> Path:
        return self.folder.figures

    @property
    def target_spec(self) -> str:
        return self.params["TARGET"]

    @property
    def profile(self) -> str:
        return self.params["PROFILE"]

    def data(self, stage: str) -> Path:
        path = self.folder.data(stage)
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
    run_dir = settings.resolve_run_dir(params["RUN_DIR"])
    taken = settings.adopt(run_dir, name, params, declared)
    if taken:
        namespace.update(taken)
        params.update(taken)
        print(
            f"{params['RUN_DIR']}: from the run folder ({settings.RUN_FILE}, the {params['PROFILE']} profile): "
            + ", ".join(f"{k}={v!r}" for k, v in taken.items())
        )
    RunFolder(run_dir).figures.mkdir(parents=True, exist_ok=True)  # run.json waits for the stage to finish
    random_weights = settings.caveat(params["TARGET"]) if name not in settings.NO_WEIGHTS else None
    demo = settings.scale_caveat(params["PROFILE"]) if name != "00_environment_check" else None
    caveat = "; ".join(c for c in (random_weights, demo) if c) or None
    print(
        f"RUN_DIR {params['RUN_DIR']} ({settings.describe(run_dir)}); TARGET={params['TARGET']!r}, "
        f"PROFILE={params['PROFILE']!r}" + (f": figures stamped '{caveat}'" if caveat else "")
    )
    if random_weights:
        print("For the real story use TARGET='embedded' (README: Lab defaults).")
    seed_everything(int(params["SEED"]))
    show_errors_in_view()
    return Run(name=name, dir=run_dir, params=params, device=resolve_device(params["DEVICE"]), caveat=caveat)


# JupyterLab's Run All makes the last cell active and scrolls to it, also when a cell above stopped the run
# (jupyterlab#8714): the error cell then sits off screen. Its output scrolls it back into view.
SCROLL_TO_ERROR = """
for (const ms of [400, 1500, 3000]) {
  setTimeout(() => { const cell = element.closest('.jp-Cell'); if (cell) cell.scrollIntoView({block: 'center'}); }, ms);
}
"""


def show_errors_in_view() -> None:
    """In a notebook kernel, every error shows as before and then scrolls its cell into view (no-op elsewhere)."""
    try:
        from IPython import get_ipython
        from IPython.display import Javascript, display
    except ImportError:
        return
    shell = get_ipython()
    if shell is None or getattr(shell, "_draftlab_scrolls", False):
        return

    def handler(self, etype, value, tb, tb_offset=None):
        self.showtraceback((etype, value, tb), tb_offset=tb_offset)
        display(Javascript(SCROLL_TO_ERROR))

    shell.set_custom_exc((Exception,), handler)
    shell._draftlab_scrolls = True


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
    happened, not as `PosixPath('...')` beside the figure."""

    def __repr__(self) -> str:
        return f"saved {self}"


def save_figure(run: Run, fig, label: str, caveat: str | None = None, source: str | None = None) -> Path | None:
    """Save a figure as RUN_DIR/figures/<notebook>_<label>.png (what the README links to): the one door every
    notebook figure goes through.

    Every figure gets legible text (readable), and a source line under it: target, device, profile, what
    measured it (`source`, else run.source, else the notebook's engine) and the draft's training data
    (source_line); the PNG records it under "draftlab:source". A run on random weights or below result
    scale (run.caveat), or a figure with its own `caveat` (an untrained draft), is stamped across every
    panel and in its title, so it cannot be read as a result; the PNG records it under "draftlab:caveat".
    fig None (a plot with nothing to draw in this run): nothing saved, None."""
    if fig is None:
        return None
    path = run.figures / f"{run.name}_{label}.png"
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata=finish_figure(run, fig, caveat, source))
    return Saved(path)


def finish_figure(run: Run, fig, caveat: str | None = None, source: str | None = None) -> dict:
    """What save_figure does to a figure before it is written (legible text, stamps, the source line);
    returns the PNG metadata that records them. For figures written elsewhere (make readme's)."""
    readable(fig)
    caveat = "; ".join(c for c in (run.caveat, caveat) if c)
    if caveat:
        stamp(fig, caveat)
    line = source_line(run, source)
    caption(fig, line)
    return {"draftlab:source": line, **({"draftlab:caveat": caveat} if caveat else {})}


MIN_FONT = 9.0  # points: at dpi 110 about 14 px, legible at 100% zoom (legends were 7, tick labels 6)

DRAFTS_FROM_04 = ("05_flag_diagnosis", "06_benchmark_acceptance")  # measure 04's drafts (07 trains its own)

ENGINES = {  # what measured each notebook's figures when the notebook says nothing more precise
    "00_environment_check": "transformers (shapes only)",
    "01_dataset_discovery": "the dataset catalog",
    "02_blend": "draftlab blend",
    "03_regenerate": "draftlab regenerate",
    "04_train_draft": "draftlab train",
    "05_flag_diagnosis": "draftlab engine",
    "06_benchmark_acceptance": "draftlab engine",
    "07_data_scaling": "draftlab engine",
}


def readable(fig, size: float = MIN_FONT) -> None:
    """Raise every text of the figure (legends, tick labels, notes) to at least `size` points."""
    from matplotlib.text import Text

    for ax in fig.axes:  # tick labels are made again at each draw, from the axis' tick parameters
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            for which, ticks in (("major", axis.get_major_ticks()), ("minor", axis.get_minor_ticks())):
                if ticks and ticks[0].label1.get_fontsize() < size:
                    ax.tick_params(axis=name, which=which, labelsize=size)
    for text in fig.findobj(Text):
        if text.get_text() and text.get_fontsize() < size:
            text.set_fontsize(size)


def device_label(device: str) -> str:
    if str(device).startswith("cuda"):
        import torch

        if torch.cuda.is_available():
            return f"{device} ({torch.cuda.get_device_name()})"
    return str(device)


def training_facts(run_dir: Path) -> str:
    """'draft trained on N conversations, S steps' from 04's metrics in this run folder ('' before 04)."""
    path = RunFolder(run_dir).metrics
    try:
        trained = json.loads(path.read_text()).get("04_train_draft") or {}
    except (OSError, ValueError):
        return ""
    arch = trained.get("eagle3") or next((v for v in trained.values() if isinstance(v, dict)), None)
    if not isinstance(arch, dict) or "steps" not in arch:
        return ""
    conversations = (arch.get("train_stats") or {}).get("kept")
    return f"draft trained on {conversations} conversations, {arch['steps']} steps"


def source_line(run: Run, source: str | None = None) -> str:
    """What a figure of this run measured and where: the line under every saved figure."""
    measured = source or run.source or ENGINES.get(run.name, "draftlab")
    words = measured.split(" ", 2)
    if words[0] == "draftlab" and len(words) > 1:  # "draftlab engine 0.1.0 (float32), ...": whose, and which
        measured = " ".join([words[0], words[1], __version__, *words[2:]])
    parts = [f"target {run.target_spec}", measured, f"device {device_label(run.device)}", f"{run.profile} profile"]
    if run.name in DRAFTS_FROM_04:
        parts.append(training_facts(run.dir))
    return "source: " + "; ".join(p for p in parts if p)


def caption(fig, line: str) -> None:
    """`line` under everything already drawn (a caption below the axes included), left-aligned."""
    if getattr(fig, "_draftlab_source", None) == line:
        return
    fig._draftlab_source = line
    box = fig.get_tightbbox(fig.canvas.get_renderer())  # inches, the whole drawing
    fig.text(
        box.x0 / fig.get_figwidth(),
        box.y0 / fig.get_figheight() - 0.02,
        line,
        ha="left",
        va="top",
        fontsize=MIN_FONT,
        color="dimgray",
        wrap=True,
    )


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
    """Merge this notebook's metrics into RUN_DIR/metrics.json under its own name, with the figures' source
    and scale; the stage has finished, so the run folder now belongs to its TARGET and PROFILE (run.json)."""
    path = Saved(merge_metrics(run.dir, run.name, metrics))
    sources = json.loads(path.read_text()).get("_sources", {})
    merge_metrics(run.dir, "_sources", {**sources, run.name: {"source": source_line(run), "caveat": run.caveat}})
    settings.write_run_settings(run.dir, run.params, written_by=run.name)
    return path


def merge_metrics(run_dir: Path, key: str, value: dict) -> Path:
    """Set one section of RUN_DIR/metrics.json, keeping the others (written atomically)."""
    path = RunFolder(run_dir).metrics
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
