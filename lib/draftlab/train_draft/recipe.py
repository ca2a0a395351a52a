"""Recipe files: a YAML of TrainConfig settings (recipes/*.yaml), read by `draftlab train --config FILE`.

A recipe holds training settings only, each a TrainConfig field; its comment block says what it was
measured on. Unknown keys and values of the wrong type are refused in one line naming the key and file.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import yaml

from draftlab.core.errors import InputError
from draftlab.train_draft.config import TrainConfig, parse_bool


def load_recipe(path) -> dict:
    """{field: value} of a recipe file, each value of its field's type."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise InputError(f"--config {path}: no such file") from None
    except (OSError, yaml.YAMLError) as exc:
        raise InputError(f"--config {path}: not readable YAML ({' '.join(str(exc).split())[:200]})") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise InputError(f"--config {path}: expected a mapping of training settings, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    out = {}
    for key, value in data.items():
        if key not in fields:
            raise InputError(f"{path}: unknown key {key!r} (not a training setting; see draftlab train --help)")
        out[key] = _typed(fields[key], value, path)
    return out


def _typed(f: dataclasses.Field, value, path: Path):
    """value as the field's type (YAML reads 1e-3 as text, 5 as an int): one line naming key and file if it is not."""
    default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
    try:
        if isinstance(default, bool):
            return value if isinstance(value, bool) else parse_bool(str(value))
        if isinstance(default, list):
            return [int(v) for v in value]
        if isinstance(default, float):
            number = float(value)
            if not math.isfinite(number):
                raise ValueError("not finite")
            return number
        if isinstance(default, int) and isinstance(value, float) and not value.is_integer():
            raise ValueError("not a whole number")
        return type(default)(value)
    except (TypeError, ValueError) as exc:
        raise InputError(f"{path}: key {f.name!r}: {value!r} is not a {type(default).__name__} ({exc})") from None
