"""`draftlab run`: execute numbered notebooks headlessly with papermill under a parameter profile.

params/<profile>.yaml has a `common:` section (keys every notebook declares, such as TARGET) and
one section per notebook stem. Every key is checked against the notebooks' `parameters` cells
before anything runs, since papermill itself only warns about unknown parameters. An existing run
folder's run.json (draftlab.run.settings) gives the profile and TARGET of a rerun; a different one
given here is an error before anything runs.
"""

from __future__ import annotations

import argparse
import difflib
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import yaml

from draftlab import __version__
from draftlab.core.errors import InputError
from draftlab.core.paths import repo_root
from draftlab.core.provenance import git_commit
from draftlab.core.run_folder import RunFolder
from draftlab.model.target import check_device_name
from draftlab.run import settings
from draftlab.run.notebook import (
    ParameterError,
    check_value,
    declared_parameters,
    merge_metrics,
    notebooks_dir,
)
from draftlab.run.settings import PROFILES

DEFAULT_PROFILE = "quick"


def all_notebooks() -> list[Path]:
    """The numbered notebooks, in order (NN_verb_object.ipynb)."""
    return sorted(p for p in notebooks_dir().glob("[0-9][0-9]_*.ipynb"))


def select_notebooks(names: list[str]) -> list[Path]:
    """Accept '03', '03_regenerate', or a path; default to all numbered notebooks."""
    available = all_notebooks()
    if not names:
        return available
    chosen = []
    for name in names:
        stem = Path(name).stem
        matches = [p for p in available if p.stem == stem or p.stem.split("_")[0] == stem]
        if len(matches) != 1:
            raise ParameterError(f"notebook {name!r} not found; available: {[p.stem for p in available]}")
        chosen.append(matches[0])
    return chosen


def load_profile(profile: str, params_dir: Path | None = None) -> dict:
    try:
        return settings.load_profile(profile, params_dir)
    except InputError as exc:
        raise ParameterError(str(exc)) from None


def _suggest(name: str, options) -> str:
    close = difflib.get_close_matches(name, list(options), n=1)
    return f" (did you mean {close[0]}?)" if close else ""


def resolve_parameters(notebooks: list[Path], profile: dict, overrides: dict, profile_name: str) -> dict[str, dict]:
    """Parameters for each selected notebook; raises on any key that no notebook declares."""
    every = {p.stem: declared_parameters(p) for p in all_notebooks()}
    union = set().union(*every.values()) if every else set()
    for section, values in profile.items():
        if section == "common":
            for key in values:
                if key not in union:
                    raise ParameterError(
                        f"params/{profile_name}.yaml common: unknown parameter {key}{_suggest(key, union)}"
                    )
            continue
        if section not in every:
            raise ParameterError(
                f"params/{profile_name}.yaml: section {section!r} names no notebook{_suggest(section, every)}"
            )
        for key in values:
            if key not in every[section]:
                raise ParameterError(
                    f"params/{profile_name}.yaml {section}: unknown parameter {key}{_suggest(key, every[section])}"
                )
    selected_union = set().union(*(every[p.stem] for p in notebooks))
    for key in overrides:
        if key not in selected_union:
            raise ParameterError(f"-p {key}: no selected notebook takes this parameter{_suggest(key, selected_union)}")
    resolved = {}
    for nb in notebooks:
        declared = every[nb.stem]
        values = {k: v for k, v in profile.get("common", {}).items() if k in declared}
        values.update(profile.get(nb.stem, {}))
        values.update({k: v for k, v in overrides.items() if k in declared})
        values["PROFILE"] = profile_name
        for key, value in values.items():
            check_value(key, value, declared[key], nb.stem)
        if "DEVICE" in values:
            try:
                check_device_name(values["DEVICE"], where=f"{nb.stem}: DEVICE")
            except InputError as exc:
                raise ParameterError(str(exc)) from None
        resolved[nb.stem] = values
    return resolved


def run_folder_settings(run_dir: Path, profile_name: str | None, overrides: dict) -> tuple[str, dict]:
    """(profile, overrides) for a run into `run_dir`: an existing run's own profile and TARGET unless
    given; given ones that differ from the run's are a ParameterError (a stage of one run on another
    target would mix two runs in one folder)."""
    have = settings.run_settings(run_dir) or {}
    overrides = dict(overrides)
    if profile_name is None:
        profile_name = have.get("PROFILE") or DEFAULT_PROFILE
    elif have.get("PROFILE") not in (None, profile_name):
        raise ParameterError(
            f"{run_dir} is a run of the {have['PROFILE']} profile ({settings.RUN_FILE}): "
            f"--profile {profile_name} would mix two runs; drop --profile, or use a new --run-id"
        )
    if "TARGET" in have:
        if overrides.get("TARGET", have["TARGET"]) != have["TARGET"]:
            raise ParameterError(
                f"{run_dir} is a run of TARGET={have['TARGET']!r} ({settings.RUN_FILE}): "
                f"-p TARGET {overrides['TARGET']} would mix two runs; drop it, or use a new --run-id"
            )
        overrides["TARGET"] = have["TARGET"]
    return profile_name, overrides


def run_notebooks(
    names: list[str],
    profile_name: str | None,
    overrides: dict | None = None,
    run_id: str | None = None,
    results_dir: Path | None = None,
    kernel_name: str = "python3",
) -> Path:
    """Execute notebooks into results/<run_id>/executed/; returns the run folder. profile_name None:
    the run folder's own (run.json), else the default (quick)."""
    import papermill

    notebooks = select_notebooks(names)
    run_id = run_id or f"{datetime.now(timezone.utc):%Y%m%d-%H%M%S}-{profile_name or DEFAULT_PROFILE}"
    run_dir = (results_dir or settings.results_root()) / run_id
    profile_name, overrides = run_folder_settings(run_dir, profile_name, overrides or {})
    profile = load_profile(profile_name)
    params = resolve_parameters(notebooks, profile, overrides, profile_name)
    for nb_params in params.values():
        nb_params["RUN_DIR"] = str(run_dir)
    RunFolder(run_dir).executed.mkdir(parents=True, exist_ok=True)
    RunFolder(run_dir).figures.mkdir(exist_ok=True)  # run.json: written by the first notebook that finishes
    record = {
        "run_id": run_id,
        "profile": profile_name,
        "draftlab": __version__,
        "commit": git_commit(),
        "python": sys.version.split()[0],
        "overrides": overrides or {},
        "notebooks": params,
    }
    path = RunFolder(run_dir).params
    if path.exists():  # rerunning stages of an existing run: keep the other notebooks' parameters
        earlier = yaml.safe_load(path.read_text()) or {}
        record["notebooks"] = {**earlier.get("notebooks", {}), **params}
    path.write_text(yaml.safe_dump(record, sort_keys=False))
    timings = {}
    for nb in notebooks:
        print(f"draftlab run: {nb.stem} ({profile_name}) -> {run_dir / 'executed' / nb.name}", flush=True)
        start = time.perf_counter()
        try:
            papermill.execute_notebook(
                str(nb),
                str(RunFolder(run_dir).executed / nb.name),
                parameters=params[nb.stem],
                kernel_name=kernel_name,
                cwd=str(repo_root()),
                progress_bar=False,
                log_output=False,
            )
        finally:
            timings[nb.stem] = round(time.perf_counter() - start, 1)
            _record_timings(run_dir, timings)
        print(f"draftlab run: {nb.stem} done in {timings[nb.stem]:.0f} s", flush=True)
    return run_dir


def _record_timings(run_dir: Path, timings: dict) -> None:
    merge_metrics(
        run_dir, "_run", {"notebook_seconds": dict(timings), "total_seconds": round(sum(timings.values()), 1)}
    )


def parse_overrides(pairs: list[list[str]] | None) -> dict:
    """-p KEY VALUE pairs; VALUE is read as YAML so numbers and booleans keep their type."""
    return {key: yaml.safe_load(value) for key, value in (pairs or [])}


def add_run_parser(subparsers) -> None:
    p = subparsers.add_parser("run", help="execute notebooks headlessly with papermill under a profile")
    p.add_argument("notebooks", nargs="*", help="notebooks to run (e.g. 00 or 00_environment_check); default all")
    p.add_argument(
        "--profile",
        choices=PROFILES,
        default=None,
        help=f"parameter profile (params/PROFILE.yaml); default: an existing run's own (run.json), "
        f"else {DEFAULT_PROFILE}",
    )
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("KEY", "VALUE"), help="override a parameter")
    p.add_argument("--run-id", help="results/<run_id> (default: timestamp-profile); reuse one to rerun a stage")
    p.add_argument("--results", type=Path, help="results folder (default: $DRAFTLAB_RESULTS, else <repo>/results)")
    p.set_defaults(func=_run_cli)


def _run_cli(args: argparse.Namespace) -> int:
    import papermill.exceptions

    try:
        run_dir = run_notebooks(args.notebooks, args.profile, parse_overrides(args.param), args.run_id, args.results)
    except ParameterError as exc:
        print(f"draftlab run: {exc}", file=sys.stderr)
        return 2
    except papermill.exceptions.PapermillExecutionError as exc:
        print(f"draftlab run: a notebook failed: {exc.ename}: {exc.evalue}", file=sys.stderr)
        return 1
    print(f"draftlab run: results in {run_dir}")
    return 0
