"""The SGLang EAGLE-3 tensor table (docs/eagle3-contract.md section 1), written once.

The exporter validates against it before writing, and the doctor checks a folder against it;
both read it here, so a change of the contract is one edit.
"""

from __future__ import annotations

EAGLE3_ARCH = "LlamaForCausalLMEagle3"

# ---- the norms before fc (EAGLE 3.1) ---------------------------------------------------------
# SGLang 0.5.17 (srt/models/llama_eagle3.py, LlamaModel) can RMS-normalise the concatenated target
# states before fc, in this order: "concat" (norm_before_fc: one norm over the whole 3T width,
# weight input_norm.weight), then "per_layer" (fc_norm, legacy use_aux_norm: one norm per captured
# state over its T-wide chunk, weights fc_norm.{0,1,2}.weight, legacy aux_norm_low|mid|high). Both
# use rms_norm_eps, both are skipped with fc when the incoming width is H (the EAGLE flag).
FC_NORMS = ("none", "per_layer", "concat")  # the draft option; SGLang can also combine the two
FC_NORM_TENSORS = {
    "concat": ("input_norm.weight",),
    "per_layer": ("fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"),
}
# SGLang 0.5.17's LlamaForCausalLMEagle3.load_weights renames these substrings of a checkpoint name before
# loading (llama_eagle3.py, legacy_name_map); the contract writes midlayer and the new fc_norm names.
SGLANG_RENAMES = {
    "midlayer": "layers.0",
    "aux_norm_low": "fc_norm.0",
    "aux_norm_mid": "fc_norm.1",
    "aux_norm_high": "fc_norm.2",
}
LEGACY_FC_NORM_NAMES = {
    f"{old}.weight": f"{new}.weight" for old, new in SGLANG_RENAMES.items() if old.startswith("aux_")
}


def _sglang_param(contract_name: str) -> str:
    """Where SGLang 0.5.17 keeps a contract tensor: lm_head at the top, the rest under `model.`."""
    if contract_name == "lm_head.weight":
        return contract_name
    return "model." + contract_name.replace("midlayer.", "layers.0.", 1)


def sglang_loads_as(name: str, contract_names) -> str | None:
    """The contract name a checkpoint tensor `name` is loaded into by SGLang 0.5.17, or None when its
    loader skips it without a message.

    The loader renames SGLANG_RENAMES' substrings, then looks the name up among its parameters, and
    `model.` + the name after that (so `model.midlayer.*` and `layers.0.*` load too, `model.lm_head.weight`
    does not); any name containing d2t or t2d is read as that buffer."""
    for buffer in ("d2t", "t2d"):
        if buffer in name:
            return buffer if buffer in contract_names else None
    params = {_sglang_param(c): c for c in contract_names if c not in ("d2t", "t2d")}
    for old, new in SGLANG_RENAMES.items():
        name = name.replace(old, new)
    return params.get(name, params.get("model." + name))


def fc_norms(config) -> tuple[str, ...]:
    """The norms SGLang builds before fc for a draft config (dict or config object), in the order it
    applies them: () | ("concat",) | ("per_layer",) | ("concat", "per_layer").

    Read as SGLang reads them, Python truthiness included: norm_before_fc from eagle_config, else the
    top level; fc_norm, else the legacy use_aux_norm, at the top level only.
    """
    get = config.get if isinstance(config, dict) else (lambda key, default=None: getattr(config, key, default))
    eagle = get("eagle_config", None)
    eagle = eagle if isinstance(eagle, dict) else {}
    concat = bool(eagle.get("norm_before_fc", get("norm_before_fc", False)))
    per_layer = bool(get("fc_norm", None) or get("use_aux_norm", False))
    return (("concat",) if concat else ()) + (("per_layer",) if per_layer else ())


def fc_norm_keys(norms) -> tuple[dict, dict]:
    """(top-level keys, eagle_config keys) that make SGLang build `norms` (as fc_norms returns them)."""
    top = {"fc_norm": True} if "per_layer" in norms else {}
    eagle = {"norm_before_fc": True} if "concat" in norms else {}
    return top, eagle


def expected_tensors(config: dict, target_hidden: int | None = None, uses_aux: bool | None = None) -> dict:
    """name -> shape (a tuple) that SGLang's LlamaForCausalLMEagle3 allocates for a draft config.

    target_hidden: the width T of one captured target state (the draft's hidden_size when not
    given; equal in every shipped config). uses_aux: whether fc exists (default: the config's
    eagle_config.use_aux_hidden_state, true when absent). Raises KeyError/TypeError/ValueError
    when the config lacks a field the shapes need. The norms before fc follow the config (fc_norms).
    """
    h = int(config["hidden_size"])
    heads = int(config["num_attention_heads"])
    kv = int(config.get("num_key_value_heads") or heads)
    hd = int(config.get("head_dim") or h // heads)
    inter = int(config["intermediate_size"])
    vd = int(config.get("draft_vocab_size") or config["vocab_size"])
    if uses_aux is None:
        uses_aux = (config.get("eagle_config") or {}).get("use_aux_hidden_state", True) is not False
    shapes = {
        "midlayer.self_attn.q_proj.weight": (heads * hd, 2 * h),
        "midlayer.self_attn.k_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.v_proj.weight": (kv * hd, 2 * h),
        "midlayer.self_attn.o_proj.weight": (h, heads * hd),
        "midlayer.mlp.gate_proj.weight": (inter, h),
        "midlayer.mlp.up_proj.weight": (inter, h),
        "midlayer.mlp.down_proj.weight": (h, inter),
        "midlayer.hidden_norm.weight": (h,),
        "midlayer.input_layernorm.weight": (h,),
        "midlayer.post_attention_layernorm.weight": (h,),
        "norm.weight": (h,),
        "lm_head.weight": (vd, h),
        "d2t": (vd,),
        "t2d": (int(config["vocab_size"]),),
    }
    if uses_aux:
        t = int(target_hidden or h)
        shapes["fc.weight"] = (h, 3 * t)
        for norm in fc_norms(config):
            width = 3 * t if norm == "concat" else t  # input_norm over [.., 3T]; each fc_norm.i over one [.., T] chunk
            shapes.update({name: (width,) for name in FC_NORM_TENSORS[norm]})
    return shapes


# ---- config field types ----------------------------------------------------------------------
# SGLang builds the draft from config.json through transformers, which takes each JSON value as it
# is: "8k" fails int() deep inside start-up, and the string "false" is true in Python, so a draft
# with tie_word_embeddings "false" is served tied. The exporter's validator and the doctor both
# refuse a wrongly typed field here, before any check compares it with something.
INT_FIELDS = (
    "hidden_size",
    "vocab_size",
    "draft_vocab_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "num_hidden_layers",
    "max_position_embeddings",
)
FLOAT_FIELDS = ("rope_theta", "rms_norm_eps")
BOOL_FIELDS = ("tie_word_embeddings", "fc_norm", "use_aux_norm", "norm_before_fc")


def _kind(value) -> str:
    return "a JSON string" if isinstance(value, str) else f"{type(value).__name__} {value!r}"


def _is_positive_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _wrong(key: str, v, expected: str, string_note: str = "") -> str:
    """The one message shape of a wrong type; a string value is shown too, with why it is refused."""
    if isinstance(v, str):
        return f"field {key!r} is {_kind(v)} {v!r}, not {expected}{string_note}"
    return f"field {key!r} is {_kind(v)}, not {expected}"


def field_type_problems(config: dict) -> list[str]:
    """ "field 'x' is ..., not ..." for every present field of the wrong JSON type ([] = all readable).

    Integers must be JSON integers above 0 (true/false are not integers, 64.0 is not 64); floats any
    JSON number; booleans true or false. A null value counts as absent (the missing-key checks
    report those). Also reads rope_parameters.rope_theta and eagle_config.use_aux_hidden_state and
    .norm_before_fc.
    """
    rope, eagle = config.get("rope_parameters"), config.get("eagle_config")
    floats = [(k, config.get(k)) for k in FLOAT_FIELDS]
    if isinstance(rope, dict):
        floats.append(("rope_parameters.rope_theta", rope.get("rope_theta")))
    bools = [(k, config.get(k)) for k in BOOL_FIELDS]
    if isinstance(eagle, dict):
        bools += [(f"eagle_config.{k}", eagle.get(k)) for k in ("use_aux_hidden_state", "norm_before_fc")]
    groups = (  # (fields, accepted, what was expected, why a string is not accepted)
        ([(k, config.get(k)) for k in INT_FIELDS], _is_positive_int, "a positive integer", ""),
        (floats, _is_number, "a number", ""),
        (bools, lambda v: isinstance(v, bool), "true/false", " (Python reads any non-empty string as true)"),
    )
    return [
        _wrong(key, v, expected, note)
        for fields, accepted, expected, note in groups
        for key, v in fields
        if v is not None and not accepted(v)
    ]


# ---- safetensors layout ----------------------------------------------------------------------
# Bytes per element of each safetensors dtype SGLang can load.
DTYPE_BYTES = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
HEADER_LIMIT = 100_000_000  # the safetensors reader's own cap on the header length


def safetensors_layout(path) -> tuple[dict | None, list[str]]:
    """(header or None, problems) of a safetensors file, checked as SGLang's loader reads it; each
    problem is one line, without the file's name (the caller prefixes it).

    The header alone says nothing about the bytes behind it: a file cut in half keeps a perfect
    header. So this checks what the loader relies on: 8-byte length, a header that fits in the
    file, every tensor's data_offsets inside the data and equal to dtype x shape, the tensors
    tiling the data without gap or overlap, and file size = 8 + header + data. Reads the first
    8 + header bytes only.
    """
    import json
    import math
    import os

    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) != 8:
            return None, [f"{size} bytes, shorter than the 8-byte header length: not a safetensors file"]
        n = int.from_bytes(raw, "little")
        if n > HEADER_LIMIT or 8 + n > size:
            return None, [
                f"header length {n} runs past the end of the {size}-byte file (truncated, or not a safetensors file)"
            ]
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            return None, [f"header is not valid JSON ({exc})"]
    if not isinstance(header, dict):
        return None, ["header is not a JSON object"]
    data = size - 8 - n
    problems, spans, past = [], [], []
    for key, entry in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(entry, dict):
            problems.append(f"tensor {key}: header entry is not an object")
            continue
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int and o >= 0 for o in offsets)
            and offsets[0] <= offsets[1]
        ):
            problems.append(f"tensor {key}: data_offsets {offsets!r} are not [begin, end] byte offsets")
            continue
        if not (isinstance(shape, list) and all(type(s) is int and s >= 0 for s in shape)):
            problems.append(f"tensor {key}: shape {shape!r} is not a list of sizes")
            continue
        if dtype not in DTYPE_BYTES:
            problems.append(f"tensor {key}: unknown dtype {dtype!r}")
            continue
        begin, end = offsets
        want = math.prod(shape) * DTYPE_BYTES[dtype]
        if end - begin != want:
            problems.append(
                f"tensor {key}: data_offsets {offsets} hold {end - begin} bytes, {dtype} x {shape} needs {want}"
            )
        if end > data:
            past.append(key)
        spans.append((begin, end, key))
    if past:
        problems.append(
            f"data_offsets of {len(past)} tensor(s) ({', '.join(past[:4])}"
            f"{', ...' if len(past) > 4 else ''}) lie past the end of the data: the file has {data} "
            "bytes after the header (truncated, or offsets written wrong)"
        )
    cursor = 0
    for begin, end, key in sorted(spans):
        if begin != cursor:
            problems.append(
                f"tensor {key} starts at byte {begin} of the data, the previous one ends at "
                f"{cursor} ({'gap' if begin > cursor else 'overlap'})"
            )
            break
        cursor = end
    if not problems and cursor != data:
        problems.append(
            f"file size {size} bytes != 8 + header {n} + tensor data {cursor} = {8 + n + cursor} (truncated or padded)"
        )
    elif past:
        problems.append(f"file size {size} bytes, the header describes {8 + n + max(e for _, e, _ in spans)}")
    return header, problems
