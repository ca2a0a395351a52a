"""An SGLang launch line's `--config FILE.yaml`, read the way SGLang reads it.

SGLang's `launch_server --config X.yaml` turns each key of the file into a flag and puts the line's
own flags after them, so a flag on the line wins over the file. A file that sets
`speculative-algorithm: EAGLE` is the flag bug without the flag on the line; doctor has to read it.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import yaml

from draftlab.flag_diagnosis.inputs import DoctorInputError
from draftlab.sglang.commands import launch_line
from draftlab.sglang.launch import ServerSettings, parse_launch, split_command


def config_file(args: list[str]) -> str | None:
    """The value of `--config` among a launch line's arguments, or None."""
    for i, tok in enumerate(args):
        if tok == "--config" and i + 1 < len(args):
            return args[i + 1]
        if tok.startswith("--config="):
            return tok.split("=", 1)[1]
    return None


def config_flags(path: Path) -> list[str]:
    """The flags a config file stands for (`key: value` -> `--key value`; true -> `--key`)."""
    if not path.is_file():
        raise DoctorInputError(path, "--config file of the launch line not found")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
        raise DoctorInputError(path, f"--config file is not readable YAML ({str(exc).splitlines()[0]})") from exc
    if not isinstance(data, dict):
        raise DoctorInputError(path, f"--config file must be a mapping of flags, found {type(data).__name__}")
    tokens = []
    for key, value in data.items():
        flag = "--" + str(key).replace("_", "-")
        if value is True:
            tokens.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            tokens += [flag, *(str(v) for v in value)]
        else:
            tokens += [flag, str(value)]
    return tokens


def with_config(settings: ServerSettings) -> ServerSettings:
    """`settings` of a launch line with what its --config file sets filled in (the line's flags win)."""
    if not settings.command:
        return settings
    env, args = split_command(settings.command)
    path = config_file(args)
    if path is None:
        return settings
    flags = config_flags(Path(path).expanduser())
    rest, skip = [], False
    for tok in args:
        if skip:
            skip = False
            continue
        if tok == "--config":
            skip = True
            continue
        if not tok.startswith("--config="):
            rest.append(tok)
    merged = parse_launch(launch_line([*flags, *rest]))
    merged = replace(merged, source=settings.source, command=settings.command, env=env)
    merged.config_file = path  # where a fix can also be made (ServerSettings has no field for it)
    return merged
