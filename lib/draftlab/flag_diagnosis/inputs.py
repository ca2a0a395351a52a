"""What doctor reads: a draft folder, a target's config, and the Finding it reports.

Only configs and safetensors headers are read; the one exception is the two small index tensors
`d2t` and `t2d` (Vd and V entries), whose values are the thing being checked.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from draftlab.model.capture import default_capture, is_deepseek
from draftlab.model.contract import EAGLE3_ARCH, field_type_problems, safetensors_layout
from draftlab.model.target import TargetError, resolve_path, text_config

SEVERITIES = ("error", "warning", "info", "ok")
# Prefixes that training frameworks leave on names; SGLang's loader skips such names silently.
KNOWN_PREFIXES = ("draft_model.", "model.", "module.", "_orig_mod.", "eagle.", "draft.")


class DoctorInputError(Exception):
    """An input doctor cannot read. `str()` is one line naming the file."""

    def __init__(self, where, message: str):
        super().__init__(f"{where}: {message}")
        self.where = str(where)


@dataclass
class Finding:
    """One check's verdict: what is wrong, why it matters, and the exact fix."""

    check: str
    severity: str  # error | warning | info | ok
    what: str
    why: str = ""
    fix: str = ""
    where: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Reading inputs
# ---------------------------------------------------------------------------------------------


def read_json(path: Path) -> dict:
    """A JSON object from a file, or a one-line DoctorInputError naming the file and position."""
    path = Path(path)
    if not path.is_file():
        raise DoctorInputError(path, "file not found")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise DoctorInputError(path, f"not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise DoctorInputError(path, f"cannot be read ({exc})") from exc
    if not isinstance(data, dict):
        raise DoctorInputError(path, f"expected a JSON object, found {type(data).__name__}")
    return data


def typed_config(path: Path, section=None) -> dict:
    """read_json, then every typed field read strictly (model.contract.field_type_problems), once.

    The checks compare these values with the target's and do arithmetic on them; a string that
    looks like a number ("49152") would print "49152 differs from 49152", and "8k" would raise deep
    in a check. Such a file is unreadable input (exit 2), said in one line naming file and field.
    section: a function picking the part to check (a multimodal target's text_config).
    """
    config = read_json(path)
    problems = field_type_problems(section(config) if section else config)
    if problems:
        raise DoctorInputError(path, "; ".join(problems))
    return config


@dataclass
class DraftFiles:
    """A draft folder as doctor sees it: its config and the name -> (shape, dtype) of each tensor."""

    folder: Path
    config: dict
    tensors: dict  # name -> (tuple shape, str dtype)
    weight_files: list
    d2t: object = None  # torch.Tensor [Vd] or None
    t2d: object = None  # torch.Tensor [V] or None
    notes: list = field(default_factory=list)

    @property
    def config_path(self) -> Path:
        return self.folder / "config.json"

    @property
    def eagle_config(self) -> dict:
        cfg = self.config.get("eagle_config")
        return cfg if isinstance(cfg, dict) else {}

    @property
    def uses_aux(self) -> bool:
        """EAGLE-3 drafts take three target layers through fc; EAGLE-1-style ones the final state."""
        if "use_aux_hidden_state" in self.eagle_config:
            return bool(self.eagle_config["use_aux_hidden_state"])
        return "fc.weight" in self.tensors or EAGLE3_ARCH in (self.config.get("architectures") or [])


def read_draft(folder) -> DraftFiles:
    """Read a draft folder's config.json and safetensors headers (plus the d2t/t2d index tensors)."""
    from safetensors import safe_open

    folder = Path(folder)
    if not folder.is_dir():
        raise DoctorInputError(folder, "draft folder not found")
    config = typed_config(folder / "config.json")
    files = (
        [folder / "model.safetensors"]
        if (folder / "model.safetensors").is_file()
        else sorted(folder.glob("*.safetensors"))
    )
    if not files:
        other = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt"))
        hint = f" (found {', '.join(other)}: draftlab reads safetensors only)" if other else ""
        raise DoctorInputError(folder / "model.safetensors", f"file not found{hint}")
    tensors, d2t, t2d, notes = {}, None, None, []
    if files[0].name != "model.safetensors":
        notes.append(f"weights are in {', '.join(p.name for p in files)}, the contract asks for one model.safetensors")
    for path in files:
        _, layout = safetensors_layout(path)
        if layout:  # SGLang's loader stops at the same point; safe_open would map past the end
            raise DoctorInputError(path, f"not a readable safetensors file ({'; '.join(layout[:2])})")
        try:
            with safe_open(str(path), framework="pt") as fh:
                for name in fh.keys():
                    part = fh.get_slice(name)
                    tensors[name] = (tuple(part.get_shape()), str(part.get_dtype()))
                    if name == "d2t":
                        d2t = fh.get_tensor(name)
                    elif name == "t2d":
                        t2d = fh.get_tensor(name)
        except Exception as exc:  # safetensors raises its own error types for bad headers
            raise DoctorInputError(path, f"not a readable safetensors file ({type(exc).__name__}: {exc})") from exc
    return DraftFiles(folder=folder, config=config, tensors=tensors, weight_files=files, d2t=d2t, t2d=t2d, notes=notes)


@dataclass
class TargetInfo:
    """The target's shape, read from its config.json only."""

    spec: str
    config_path: Path
    config: dict

    @property
    def text(self) -> dict:
        """The language-model part of the config (multimodal configs nest it under text_config)."""
        return text_config(self.config)

    def _int(self, key):
        value = self.text.get(key)
        if value is None:
            raise DoctorInputError(self.config_path, f"field {key!r} missing from the target config")
        return int(value)

    @property
    def hidden_size(self) -> int:
        return self._int("hidden_size")

    @property
    def num_layers(self) -> int:
        return self._int("num_hidden_layers")

    @property
    def vocab_size(self) -> int:
        return self._int("vocab_size")

    @property
    def max_position_embeddings(self):
        return self.text.get("max_position_embeddings")

    @property
    def model_type(self) -> str:
        return str(self.text.get("model_type") or self.config.get("model_type") or "")

    @property
    def is_deepseek(self) -> bool:
        return is_deepseek(self.model_type, self.config.get("architectures"))

    @property
    def default_capture(self) -> list:
        """SGLang's default capture ids ("input of layer i" = transformers hidden_states[i])."""
        return default_capture(self.num_layers)


def load_target_info(spec: str) -> TargetInfo:
    """A target's config.json without its weights: a folder, a config file, embedded/tiny, or a Hub id."""
    path = Path(str(spec)).expanduser()
    if path.is_file() and path.suffix == ".json":
        return TargetInfo(str(spec), path, typed_config(path, text_config))
    if path.is_dir():
        return TargetInfo(str(spec), path / "config.json", typed_config(path / "config.json", text_config))
    if path.suffix == ".gguf" or str(spec) in ("embedded", "tiny"):
        try:
            folder = resolve_path(str(spec))
        except TargetError as exc:
            raise DoctorInputError(spec, str(exc)) from exc
        return TargetInfo(str(spec), folder / "config.json", typed_config(folder / "config.json", text_config))
    if path.exists() or str(spec).startswith((".", "/")) or str(spec).count("/") != 1:
        raise DoctorInputError(
            spec, "target not found (give a model folder, a config.json, embedded, tiny or a Hub id)"
        )
    from huggingface_hub import hf_hub_download

    try:
        local = hf_hub_download(repo_id=str(spec), filename="config.json")
    except Exception as exc:  # offline, gated, or no such repository
        msg = str(exc).splitlines()[0] if str(exc) else ""
        raise DoctorInputError(
            spec, f"config.json could not be fetched from the Hugging Face Hub ({type(exc).__name__}: {msg})"
        ) from exc
    return TargetInfo(str(spec), Path(local), typed_config(Path(local), text_config))


def _fmt(shape) -> str:
    return "[" + ", ".join(str(s) for s in shape) + "]"


def _config_fix(key: str, value) -> str:
    return f'set "{key}": {json.dumps(value)} in config.json'
