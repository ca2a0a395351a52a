"""A run folder's own settings (RUN_DIR/run.json) and the chain of stages that feed each other.

The first stage that runs in a folder (a notebook's `nb.start`, or `draftlab run` before it
starts papermill) writes run.json with the run's TARGET and PROFILE. A later stage opened with
only RUN_DIR set (in JupyterLab, its other parameters at their defaults) takes them from there,
and the profile's values for every other parameter still at its default, so that 05 of a smoke
run runs on the smoke run's target and sizes. A parameter set to another value than the run's is
an error, not a silent mix of two runs. Folders written before run.json existed are read from the
runner's params.yaml.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from datetime import datetime, timezone
from pathlib import Path

import yaml

from draftlab.core.errors import InputError
from draftlab.core.files import atomic_write_json
from draftlab.core.paths import repo_root
from draftlab.core.run_folder import RunFolder

RUN_FILE = "run.json"
IDENTITY = ("TARGET", "PROFILE")  # what a run folder is a run of; everything else may differ per stage
NOT_FROM_PROFILE = ("RUN_DIR", "DEVICE")  # where the run lives and where this stage runs are the opener's
PROFILES = ("smoke", "quick", "full")
RESULT_PROFILES = ("full",)  # the sizes a figure may be read as a result at; below them it is a demo
RANDOM_TARGETS = {"tiny": "random weights (tiny target): not a result"}
NO_WEIGHTS = ("00_environment_check", "01_dataset_discovery", "02_blend")  # shapes, a catalog, a blend: no caveat

# stage -> (files it leaves in RUN_DIR that later stages read, the stage it needs)
STAGES = {
    "02_blend": (("data/blend/train.jsonl", "data/blend/test.jsonl"), None),
    "03_regenerate": (("data/regen/train.jsonl",), "02_blend"),
    "04_train_draft": (("drafts/eagle3/config.json",), "03_regenerate"),
}


class RunSettingsError(InputError):
    """A notebook's TARGET or PROFILE disagrees with the run folder's run.json."""


class StageMissing(InputError):
    """An earlier stage has not run in this run folder; the message says which to run, in order."""


def results_root() -> Path:
    """Where run folders live: $DRAFTLAB_RESULTS, else the checkout's results/ (a notebook's RUN_DIR
    "results/<id>" and `draftlab run --run-id <id>` both mean <this>/<id>)."""
    env = os.environ.get("DRAFTLAB_RESULTS")
    root = repo_root()
    return Path(env) if env else (root / "results" if root is not None else Path("results").resolve())


def resolve_run_dir(value: str | Path) -> Path:
    """A notebook's RUN_DIR as a folder: absolute as given; "results/<id>" under results_root(); any other
    relative path under the checkout."""
    path = Path(value)
    if path.is_absolute():
        return path
    if path.parts and path.parts[0] == "results":
        return results_root().joinpath(*path.parts[1:])
    root = repo_root()
    return root / path if root is not None else path.resolve()


def load_profile(profile: str, params_dir: Path | None = None) -> dict:
    """params/<profile>.yaml as {section: {key: value}} ('common' plus one section per notebook stem)."""
    path = (params_dir or repo_root() / "params") / f"{profile}.yaml"
    if not path.is_file():
        raise InputError(f"{path}: no such profile; choose one of {PROFILES}")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise InputError(f"{path}: must be a mapping of sections")
    return {section: (values or {}) for section, values in data.items()}


def profile_values(profile: str, stem: str, declared: dict) -> dict:
    """What `draftlab run --profile PROFILE` gives notebook `stem` (common keys it declares, then its section)."""
    sections = load_profile(profile)
    values = {k: v for k, v in sections.get("common", {}).items() if k in declared}
    values.update(sections.get(stem, {}))
    return values


def run_settings(run_dir: str | Path) -> dict | None:
    """{"TARGET": ..., "PROFILE": ...} of a run folder: its run.json, else the runner's params.yaml, else None."""
    run_dir = Path(run_dir)
    path = run_dir / RUN_FILE
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError as exc:
            raise InputError(f"{path}: not valid JSON ({exc}); delete it to start the run's settings again") from exc
        return {k: data[k] for k in IDENTITY if k in data}
    params = RunFolder(run_dir).params
    if params.is_file() and finished_stages(run_dir):  # a runner's record pins the folder once a stage finished
        record = yaml.safe_load(params.read_text()) or {}
        targets = Counter(v["TARGET"] for v in (record.get("notebooks") or {}).values() if v.get("TARGET"))
        out = {"PROFILE": record.get("profile")} if record.get("profile") else {}
        if targets:
            out["TARGET"] = targets.most_common(1)[0][0]
        return out or None
    return None


def write_run_settings(run_dir: str | Path, params: dict, written_by: str) -> Path | None:
    """run.json of a folder that has none yet (the first stage writes it); returns its path if written."""
    path = Path(run_dir) / RUN_FILE
    if path.is_file():
        return None
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    record = {k: params[k] for k in IDENTITY if k in params}
    record.update(written_by=written_by, written_at=datetime.now(timezone.utc).isoformat(timespec="seconds"))
    atomic_write_json(path, record, indent=2)
    return path


def adopt(run_dir: Path, stem: str, params: dict, declared: dict) -> dict:
    """The parameters this stage takes from the run folder: {name: value}, empty when it agrees.

    TARGET or PROFILE at the notebook's default takes the run's; a different explicit value is a
    RunSettingsError. When PROFILE is taken, so is the profile's value of each other parameter that
    is still at the notebook's default (except RUN_DIR and DEVICE)."""
    settings = run_settings(run_dir) or {}
    changes = {}
    for key in IDENTITY:
        want, have = settings.get(key), params.get(key)
        if want is None or have == want:
            continue
        if key in declared and have == declared[key]:
            changes[key] = want
            continue
        raise RunSettingsError(
            f"{run_dir} is a run of {key}={want!r} ({RUN_FILE}); this notebook has {key}={have!r}: "
            f"set {key} = {want!r}, or choose another RUN_DIR for a new run"
        )
    if "PROFILE" in changes:
        for key, value in profile_values(changes["PROFILE"], stem, declared).items():
            if key in IDENTITY or key in NOT_FROM_PROFILE or key not in declared:
                continue
            if params.get(key) == declared[key] and value != declared[key]:
                changes[key] = value
    return changes


def caveat(target_spec: str) -> str | None:
    """The label every figure of a run on this target carries, or None for real weights."""
    return RANDOM_TARGETS.get(str(target_spec))


def scale_caveat(profile: str) -> str | None:
    """The label of a run below result scale: smoke and quick train on tens of conversations and evaluate
    on a few prompts, so what they draw shows the pipeline working, not what a draft reaches."""
    return None if profile in RESULT_PROFILES else f"demo scale ({profile} profile), not a result"


def _missing(run_dir: Path, stage: str) -> list[str]:
    return [f for f in STAGES[stage][0] if not (run_dir / f).is_file()]


def finished_stages(run_dir: Path) -> list[str]:
    """The notebooks whose metrics are in RUN_DIR/metrics.json (a notebook writes them as its last step)."""
    try:
        data = json.loads(RunFolder(run_dir).metrics.read_text())
    except (OSError, ValueError):
        return []
    return sorted(k for k in data if not k.startswith("_"))


def describe(run_dir: Path) -> str:
    """What a run folder holds, for a notebook's first line of output."""
    have = run_settings(run_dir) if Path(run_dir).is_dir() else None
    if not have:
        return "a new run folder"
    done = [s for s in STAGES if not _missing(Path(run_dir), s)]
    return f"a {have.get('PROFILE', '?')} run of {have.get('TARGET', '?')!r}" + (
        f" with the outputs of {', '.join(done)}" if done else ""
    )


def runs_with(stages, besides: Path, limit: int = 3) -> list[Path]:
    """Other run folders (results/*, and the folders beside `besides`) that hold every stage's output, newest
    first."""
    parents = {Path(besides).parent, results_root()}
    found = {
        p
        for parent in parents
        if parent.is_dir()
        for p in parent.iterdir()
        if p.is_dir() and p.resolve() != Path(besides).resolve() and not any(_missing(p, s) for s in stages)
    }
    return sorted(found, key=lambda p: p.stat().st_mtime, reverse=True)[:limit]


def _shown(path: Path) -> str:
    root = repo_root()
    try:
        return str(path.relative_to(root)) if root is not None else str(path)
    except ValueError:
        return str(path)


def run_command(run_dir: Path, stems: list[str]) -> str:
    """The `draftlab run` line that runs these stages into this folder."""
    numbers = " ".join(s.split("_")[0] for s in stems)
    if run_dir.parent == results_root():
        return f"draftlab run {numbers} --run-id {run_dir.name}"
    return f"draftlab run {numbers} --results {run_dir.parent} --run-id {run_dir.name}"


def require(run_dir: str | Path, *stages: str) -> None:
    """Raise StageMissing, in one line, when an earlier stage's output is not in the run folder.

    The message lists every stage still to run, earliest first (05 needs 04 needs 03 needs 02)."""
    run_dir = Path(run_dir)
    todo: list[str] = []
    for stage in stages:
        chain, current = [], stage
        while current is not None and _missing(run_dir, current):
            chain.insert(0, current)
            current = STAGES[current][1]
        todo += [s for s in chain if s not in todo]
    if not todo:
        return
    todo.sort()
    last = todo[-1]
    files = ", ".join(_missing(run_dir, last))
    order = ", then ".join(todo)
    others = runs_with(stages, run_dir)
    elsewhere = f"; or set RUN_DIR to a run that has it: {', '.join(repr(_shown(p)) for p in others)}" if others else ""
    raise StageMissing(
        f"{run_dir} has no {files} ({last}'s output): run {order} first, in JupyterLab with this RUN_DIR "
        f"or in a terminal: {run_command(run_dir, todo)}{elsewhere}"
    )
