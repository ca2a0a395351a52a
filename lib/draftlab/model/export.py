"""Export a draft in SGLang's EAGLE-3 format, and validate an exported folder.

The tensor table lives in model.contract and the capture-id rule in model.capture. `validate`
reads only config.json and the safetensors header (no weights), so it runs on any folder in
milliseconds, whatever the draft size.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from draftlab.core.files import atomic_path, atomic_write
from draftlab.core.provenance import provenance
from draftlab.model.capture import config_ids, outside_target, recorded_deepseek
from draftlab.model.contract import (
    EAGLE3_ARCH,
    FC_NORM_TENSORS,
    LEGACY_FC_NORM_NAMES,
    expected_tensors,
    fc_norm_keys,
    field_type_problems,
    safetensors_layout,
)
from draftlab.model.target import target_dims

CONFIG_REQUIRED = (
    "architectures",
    "model_type",
    "num_hidden_layers",
    "hidden_size",
    "vocab_size",
    "draft_vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "max_position_embeddings",
    "tie_word_embeddings",
    "eagle_config",
)
SAFETENSORS_DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16"}
_NORM_NAMES = {n for names in FC_NORM_TENSORS.values() for n in names}  # the norms before fc


# ---- export ----------------------------------------------------------------------------------
def export_config(draft, max_position_embeddings: int | None = None, dtype: str = "bfloat16") -> dict:
    """config.json content: transformers' keys plus the legacy rope keys and eagle_config."""
    cfg = draft.config
    d = cfg.to_dict()
    rope = dict(d.get("rope_parameters") or {})
    d["architectures"] = ["LlamaForCausalLMEagle3"]
    d["model_type"] = "llama"
    d["num_hidden_layers"] = 1
    d["tie_word_embeddings"] = False
    d["draft_vocab_size"] = int(cfg.draft_vocab_size)
    d["head_dim"] = int(cfg.head_dim)
    # Legacy keys (SGLang 0.5.x reads rope_theta / rope_scaling; transformers 5 writes rope_parameters).
    d["rope_theta"] = float(rope.get("rope_theta", 10000.0))
    scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
    d["rope_scaling"] = None if scaling.get("rope_type", "default") == "default" else scaling
    d["max_position_embeddings"] = int(max(cfg.max_position_embeddings, max_position_embeddings or 0))
    layers = draft.capture_layers
    # draftlab's ids are hidden_states indices ("input of layer i"); SGLang's config ids follow
    # its own rule (model.capture), so convert them there and record the trained indices.
    deepseek = d.pop("capture_convention", None) == "deepseek"
    eagle = {
        "eagle_aux_hidden_state_layer_ids": config_ids(layers, deepseek) if layers is not None else None,
        "use_aux_hidden_state": bool(draft.use_aux),
    }
    # The norms before fc the draft runs, in SGLang's canonical keys (a legacy use_aux_norm is rewritten).
    for key in ("fc_norm", "use_aux_norm", "norm_before_fc"):
        d.pop(key, None)
    top, eagle_norms = fc_norm_keys(draft.fc_norms)
    d.update(top)
    eagle.update(eagle_norms)
    d["eagle_config"] = eagle
    if layers is not None:
        d["draftlab"] = {"capture_layers": [int(i) for i in layers]}
        if deepseek:
            d["draftlab"]["capture_convention"] = "deepseek"
    d["torch_dtype"] = dtype
    d["dtype"] = dtype
    for k in (
        "_name_or_path",
        "transformers_version",
        "output_hidden_states",
        "return_dict",
        "use_cache",
        "id2label",
        "label2id",
        "problem_type",
        "chunk_size_feed_forward",
        "is_encoder_decoder",
        "output_attentions",
    ):
        d.pop(k, None)
    return d


def export_draft(draft, folder, max_position_embeddings: int | None = None, dtype: str = "bfloat16") -> Path:
    """Write config.json + model.safetensors (contract names, no prefix, no embedding).

    max_position_embeddings: the target's context (the export keeps the larger of this and the
    draft config's). Floating weights are cast to `dtype`; d2t stays int64, t2d bool.
    Returns the folder. Fails (before writing) if the result would not pass `validate`.
    """
    from safetensors.torch import save_file

    if draft.capture_layers is None and draft.use_aux:
        raise ValueError("draft has no eagle_aux_hidden_state_layer_ids; set config.eagle_config before export")
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch_dtype = getattr(torch, dtype)
    tensors = {}
    for name, t in draft.state_dict().items():
        t = t.detach().cpu()
        if t.is_floating_point():
            t = t.to(torch_dtype)
        tensors[name] = t.contiguous()
    config = export_config(draft, max_position_embeddings, dtype)
    problems = check(
        config, {n: (list(t.shape), _st_dtype(t.dtype)) for n, t in tensors.items()}, allow_eagle1=not draft.use_aux
    )
    if problems:
        raise ValueError("export would not match the EAGLE-3 contract:\n  " + "\n  ".join(problems))
    with atomic_path(folder / "model.safetensors") as tmp:
        save_file(tensors, str(tmp), metadata={"format": "pt"})
        tmp.chmod(0o644)  # safetensors writes 0600; a server may run as another user
    atomic_write(folder / "config.json", json.dumps(config, indent=2, sort_keys=True) + "\n")
    record = provenance({"dtype": dtype})  # commit, versions, command: how to make this draft again
    atomic_write(folder / "provenance.json", json.dumps(record, indent=2, sort_keys=True) + "\n")
    return folder


def _st_dtype(dtype: torch.dtype) -> str:
    return {torch.int64: "I64", torch.bool: "BOOL", **SAFETENSORS_DTYPES}.get(dtype, str(dtype))


# ---- validation ------------------------------------------------------------------------------
def read_safetensors_header(path) -> dict:
    """{name: {"dtype", "shape", "data_offsets"}} (+ "__metadata__") from the file header only."""
    path = Path(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than 8 bytes)")
        (n,) = struct.unpack("<Q", raw)
        if n > 100_000_000:
            raise ValueError(f"{path}: header length {n} is implausible; not a safetensors file")
        return json.loads(f.read(n))


def check(
    config: dict, tensors: dict[str, tuple[list[int], str]], target=None, allow_eagle1: bool = False
) -> list[str]:
    """Every deviation of (config dict, {name: (shape, safetensors dtype)}) from the contract.

    allow_eagle1: accept use_aux_hidden_state = false (the EAGLE-1-style ablation draft, no fc)."""
    typed = field_type_problems(config)
    if typed:  # nothing below can compare or derive shapes from a field it cannot read
        return [f"config.json: {t}" for t in typed]
    p = []
    missing = [k for k in CONFIG_REQUIRED if k not in config]
    if missing:
        p.append(f"config.json: missing keys {missing}")
    if config.get("architectures") != [EAGLE3_ARCH]:
        p.append(f"config.json: architectures = {config.get('architectures')!r}, expected [{EAGLE3_ARCH!r}]")
    if config.get("model_type") != "llama":
        p.append(f"config.json: model_type = {config.get('model_type')!r}, expected 'llama'")
    if config.get("num_hidden_layers") != 1:
        p.append(f"config.json: num_hidden_layers = {config.get('num_hidden_layers')!r}, expected 1")
    if config.get("tie_word_embeddings") is not False:
        p.append(f"config.json: tie_word_embeddings = {config.get('tie_word_embeddings')!r}, expected false")
    if "rope_theta" not in config:
        p.append("config.json: legacy key rope_theta missing (SGLang 0.5.x reads it)")
    rp = config.get("rope_parameters") or {}
    if rp.get("rope_type", "default") != "default" and not config.get("rope_scaling"):
        p.append(f"config.json: rope_parameters has rope_type {rp.get('rope_type')!r} but legacy rope_scaling is empty")
    eagle = config.get("eagle_config")
    use_aux = True
    if not isinstance(eagle, dict):
        p.append("config.json: eagle_config missing (SGLang would silently use its default capture layers)")
        ids = None
    else:
        use_aux = eagle.get("use_aux_hidden_state")
        ids = eagle.get("eagle_aux_hidden_state_layer_ids")
        if use_aux is not True and not (allow_eagle1 and use_aux is False):
            p.append(
                f"config.json: eagle_config.use_aux_hidden_state = {use_aux!r}: an EAGLE-1-style draft "
                "(no fc); SGLang's EAGLE3 cannot serve it (ablation only)"
            )
        if use_aux is not False:
            if not (isinstance(ids, list) and len(ids) == 3 and all(isinstance(x, int) for x in ids)):
                p.append(f"config.json: eagle_config.eagle_aux_hidden_state_layer_ids = {ids!r}, expected 3 ints")
            elif ids != sorted(ids) or len(set(ids)) != 3:
                p.append(
                    f"config.json: eagle_aux_hidden_state_layer_ids {ids} not strictly increasing (low, mid, high)"
                )
    dvs, vs = config.get("draft_vocab_size"), config.get("vocab_size")
    if isinstance(dvs, int) and isinstance(vs, int) and not 0 < dvs <= vs:
        p.append(f"config.json: draft_vocab_size {dvs} not in 1..vocab_size {vs}")
    heads, kvh = config.get("num_attention_heads"), config.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kvh, int) and (kvh <= 0 or heads % kvh):
        p.append(f"config.json: num_attention_heads {heads} not a multiple of num_key_value_heads {kvh}")
    if target is not None:
        t = target_dims(target)
        typed = field_type_problems(
            {
                "hidden_size": t["hidden_size"],
                "vocab_size": t["vocab_size"],
                "num_hidden_layers": t["num_layers"],
                "max_position_embeddings": t["max_position_embeddings"],
            }
        )
        if typed:
            return p + [f"target config: {x}" for x in typed]
        for key, tkey in (("hidden_size", "hidden_size"), ("vocab_size", "vocab_size")):
            if t.get(tkey) is not None and config.get(key) != t[tkey]:
                p.append(f"config.json: {key} = {config.get(key)}, target has {t[tkey]}")
        target_context = t.get("max_position_embeddings")
        if target_context and (config.get("max_position_embeddings") or 0) < target_context:
            p.append(
                f"config.json: max_position_embeddings {config.get('max_position_embeddings')} < target's "
                f"{t['max_position_embeddings']} (SGLang refuses to start without "
                "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1)"
            )
        n = t.get("num_layers")
        deepseek = recorded_deepseek(config)
        if n and isinstance(ids, list) and all(isinstance(x, int) for x in ids):
            bad = outside_target(ids, n, deepseek)
            if bad:
                p.append(
                    f"config.json: capture layer ids {ids}: {bad} fall outside the {n}-layer target (SGLang "
                    f"captures the input of layer id+1, which must be 1..{n - 1}); the concatenation fc "
                    "receives would be narrower than trained"
                )
    if missing and any(
        k in missing
        for k in (
            "hidden_size",
            "vocab_size",
            "draft_vocab_size",
            "intermediate_size",
            "num_attention_heads",
            "num_key_value_heads",
        )
    ):
        return p  # shapes cannot be derived
    exp = {n: list(s) for n, s in expected_tensors(config, uses_aux=use_aux is not False).items()}
    for name, shape in exp.items():
        if name not in tensors:
            p.append(
                f"model.safetensors: tensor {name} missing"
                + (
                    " (SGLang would leave it randomly initialised)"
                    if name == "fc.weight"
                    else " (config.json asks for this norm before fc; SGLang would run it with weight 1)"
                    if name in _NORM_NAMES
                    else ""
                )
            )
            continue
        got_shape, got_dtype = tensors[name]
        if list(got_shape) != shape:
            p.append(f"model.safetensors: {name} shape {list(got_shape)}, expected {shape}")
        want = {"d2t": ("I64",), "t2d": ("BOOL",)}.get(name, ("BF16", "F16", "F32"))
        if got_dtype not in want:
            p.append(f"model.safetensors: {name} dtype {got_dtype}, expected {' or '.join(want)}")
    for name in tensors:
        if name in exp:
            continue
        if "embed_tokens" in name:
            p.append(f"model.safetensors: {name}: the embedding must not be exported (SGLang shares the target's)")
        elif name.startswith(("draft_model.", "model.")):
            p.append(f"model.safetensors: {name}: prefixed name (SGLang skips it silently)")
        elif name.endswith(".bias"):
            p.append(f"model.safetensors: {name}: bias tensors are not part of the contract")
        elif name in LEGACY_FC_NORM_NAMES:
            p.append(
                f"model.safetensors: {name}: legacy name (SGLang renames it to {LEGACY_FC_NORM_NAMES[name]}, "
                "which the contract writes)"
            )
        elif name in _NORM_NAMES:
            p.append(
                f"model.safetensors: {name}: a norm before fc that config.json does not turn on (SGLang "
                "skips it silently: fc gets un-normed states)"
            )
        else:
            p.append(f"model.safetensors: unexpected tensor {name} (SGLang skips it silently)")
    return p


def validate(folder, target=None, allow_eagle1: bool = False) -> list[str]:
    """Every deviation of an exported folder from the EAGLE-3 contract ([] = conforms).

    Reads only config.json and the safetensors header, and checks that header against the file's
    size the way SGLang's loader does (model.contract.safetensors_layout): a header alone passes a
    file cut in half. `target` (optional): a draftlab Target, a
    transformers config or a dict {hidden_size, vocab_size, num_layers, max_position_embeddings}
    for the cross-checks (dims, capture ids in range, context length). allow_eagle1: accept the
    EAGLE-1-style ablation draft (use_aux_hidden_state false, no fc), which SGLang cannot serve.
    """
    folder = Path(folder)
    p = []
    cfg_path, w_path = folder / "config.json", folder / "model.safetensors"
    if not folder.is_dir():
        return [f"{folder}: not a directory"]
    if not cfg_path.exists():
        p.append(f"{cfg_path}: missing")
    if not w_path.exists():
        p.append(f"{w_path}: missing (one file, model.safetensors, is expected)")
    others = sorted(x.name for x in folder.glob("*.safetensors*") if x.name != "model.safetensors")
    if others:
        p.append(f"{folder}: extra weight files {others} (SGLang expects one model.safetensors)")
    if p and (not cfg_path.exists() or not w_path.exists()):
        return p
    try:
        config = json.loads(cfg_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return p + [f"{cfg_path}: invalid JSON ({e})"]
    if not isinstance(config, dict):
        return p + [f"{cfg_path}: not a JSON object"]
    header, layout = safetensors_layout(w_path)
    p += [f"model.safetensors: {x}" for x in layout]
    if header is None:
        return p
    tensors = {
        n: (v.get("shape"), v.get("dtype")) for n, v in header.items() if n != "__metadata__" and isinstance(v, dict)
    }
    return p + check(config, tensors, target, allow_eagle1)
