"""A target's shape from its config alone, and random models of that shape for `draftlab bench cost`.

The cost of a speculative cycle depends on shapes, not on trained weights, so a random bf16 target
built from the config and a random EAGLE-3 draft of the matching shape (draftlab's own module and
exporter, the capture ids of model.capture) measure it without downloading any weights.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

from draftlab.core.errors import InputError
from draftlab.core.files import atomic_path, atomic_write_json
from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.export import export_draft, validate
from draftlab.model.target import target_dims, text_config

DRAFT_VOCAB = 32000  # the usual EAGLE-3 draft vocabulary (contract section 1); smaller vocabularies keep theirs
SHAPE_KEYS = ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
)
STAMP = "draftlab-cost.json"  # written last in a built folder: the config digest it was built from


def _config_file(target: str) -> tuple[Path | None, str]:
    """(local config.json or None for a Hub id, the shape's default name)."""
    path = Path(target).expanduser()
    if path.is_file():
        return path, path.parent.name or path.stem
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"TARGET {target}: folder has no config.json")
        return path / "config.json", path.name
    if path.suffix == ".json" or target.startswith((".", "/", "~")) or target.count("/") > 1:
        raise InputError(f"TARGET {target}: no such file or folder")
    return None, target.rsplit("/", 1)[-1]


def load_config(target: str):
    """(transformers config, shape name) of a Hub id, a model folder or a config.json; never remote code.

    One-line InputError for a missing, unreadable or malformed config, or one without a decoder's shape."""
    from transformers import AutoConfig

    local, name = _config_file(target)
    if local is not None:
        try:
            raw = json.loads(local.read_text())
        except UnicodeDecodeError:
            raise InputError(f"TARGET {local}: not a text file") from None
        except json.JSONDecodeError as exc:
            raise InputError(f"TARGET {local}: not valid JSON (line {exc.lineno}: {exc.msg})") from None
        if not isinstance(raw, dict):
            raise InputError(f"TARGET {local}: a JSON {type(raw).__name__}, expected an object")
        if "model_type" not in raw:
            raise InputError(f"TARGET {local}: no model_type field (transformers cannot tell the architecture)")
    try:
        config = AutoConfig.from_pretrained(str(local or target), trust_remote_code=False)
    except Exception as exc:  # transformers: unknown model_type, unreachable Hub, remote code asked for
        lines = [x.strip() for x in str(exc).splitlines() if x.strip()] or [type(exc).__name__]
        raise InputError(f"TARGET {target}: cannot read its config ({' '.join(lines[:2])[:300]})") from None
    problems = [k for k in SHAPE_KEYS if not isinstance(getattr(text_config(config), k, None), int)]
    if problems:
        raise InputError(f"TARGET {target}: config has no integer {', '.join(problems)} (not a decoder LM config?)")
    return config, name


def shape_info(config) -> dict:
    """What a table reader needs to know of a shape: sizes and the bf16 weight bytes."""
    tc = text_config(config)
    dims = target_dims(config)
    heads = tc.num_attention_heads
    head_dim = getattr(tc, "head_dim", None) or tc.hidden_size // heads
    kv = getattr(tc, "num_key_value_heads", None) or heads
    h, inter, layers, vocab = tc.hidden_size, tc.intermediate_size, tc.num_hidden_layers, tc.vocab_size
    per_layer = h * head_dim * (2 * heads + 2 * kv) + 3 * h * inter
    tied = bool(getattr(tc, "tie_word_embeddings", False))
    params = layers * per_layer + vocab * h * (1 if tied else 2)
    return {
        "model_type": tc.model_type,
        "layers": layers,
        "hidden_size": h,
        "intermediate_size": inter,
        "heads": heads,
        "kv_heads": kv,
        "head_dim": head_dim,
        "vocab_size": vocab,
        "max_position_embeddings": dims["max_position_embeddings"],
        "parameters": params,
        "bf16_bytes": 2 * params,
    }


def config_digest(config) -> str:
    """A digest of the shape-relevant config (what a resumed run must match)."""
    d = config.to_dict()
    for k in ("_name_or_path", "transformers_version", "dtype", "torch_dtype", "architectures"):
        d.pop(k, None)
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _built(folder: Path, digest: str) -> bool:
    try:
        return json.loads((folder / STAMP).read_text()).get("digest") == digest
    except (OSError, ValueError):
        return False


def build_target(config, folder, *, device: str = "cpu", source: str | None = None) -> Path:
    """Random bf16 weights of the config's shape, saved as sharded safetensors (skipped when built).

    Built on `device` (the GPU when there is one: a 30B-class model initialises in seconds there),
    saved in shards of 2 GB so no whole-model copy is ever made in host memory."""
    import torch
    from transformers import AutoModelForCausalLM

    folder, digest = Path(folder), config_digest(config)
    if _built(folder, digest):
        return folder
    shutil.rmtree(folder, ignore_errors=True)
    free = shutil.disk_usage(folder.parent if folder.parent.exists() else Path.cwd()).free
    need = shape_info(config)["bf16_bytes"]
    if need * 1.05 > free:
        raise InputError(
            f"TARGET: the random bf16 weights need {need / 2**30:.1f} GiB, {folder.parent} has {free / 2**30:.1f} "
            "GiB free; use --weights dummy (SGLang's random weights, nothing written)"
        )
    torch.manual_seed(0)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with atomic_path(folder) as tmp:
        model.save_pretrained(tmp, max_shard_size="2GB")
        _copy_tokenizer(source, tmp)
        for f in tmp.iterdir():
            f.chmod(0o644)  # safetensors writes 0600; the server may run as another user
        atomic_write_json(tmp / STAMP, {"digest": digest, "kind": "random target"})
    del model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return folder


def config_only(config, folder) -> Path:
    """The target folder for --weights dummy: config.json only (SGLang's --load-format dummy makes the weights)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    return folder


def _copy_tokenizer(source: str | None, folder: Path) -> None:
    """The target's tokenizer files, when its folder has them (the servers skip tokenizer init anyway)."""
    src = Path(source).expanduser() if source else None
    if src is not None and src.is_file():
        src = src.parent
    if src is None or not src.is_dir():
        return
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy2(src / name, folder / name)


def build_draft(config, folder, *, device: str = "cpu") -> Path:
    """A random EAGLE-3 draft for the target config, exported in SGLang's format and validated.

    SGLang's default capture layers (model.capture); a draft vocabulary of the first min(32000, V) ids."""
    import torch

    folder, digest = Path(folder), config_digest(config)
    if _built(folder, digest):
        return folder
    vocab = text_config(config).vocab_size
    dcfg = draft_config_for_target(config, draft_vocab_size=min(DRAFT_VOCAB, vocab))
    torch.manual_seed(0)
    with torch.device(device):
        draft = Eagle3Draft(dcfg, embed_tokens=None)  # the embedding is the target's; never saved
    shutil.rmtree(folder, ignore_errors=True)
    export_draft(draft, folder)
    problems = validate(folder, target=config)
    if problems:
        raise InputError(f"the random draft for this TARGET does not pass the EAGLE-3 contract: {problems[0]}")
    atomic_write_json(folder / STAMP, {"digest": digest, "kind": "random draft"})
    return folder
