"""Static checks of an EAGLE-3 draft against its target (docs/eagle3-contract.md 1-2).

Every check here is a line of the contract that SGLang does not enforce itself: a draft that
breaks it either fails at start-up (the lucky case) or serves with acceptance length near 1.0
and no error. Each returns a list of Findings (an "ok" Finding when it passed).
"""

from __future__ import annotations

from draftlab.flag_diagnosis.inputs import (
    KNOWN_PREFIXES,
    DraftFiles,
    Finding,
    TargetInfo,
    _config_fix,
    _fmt,
)
from draftlab.model.capture import (
    CaptureError,
    captured_states,
    config_ids,
    outside_target,
    trained_layers,
)
from draftlab.model.contract import (
    EAGLE3_ARCH,
    FC_NORM_TENSORS,
    LEGACY_FC_NORM_NAMES,
    expected_tensors,
    fc_norms,
    sglang_loads_as,
)

NORM_TENSORS = frozenset(n for names in FC_NORM_TENSORS.values() for n in names)  # every norm before fc

# ---------------------------------------------------------------------------------------------
# Checks: each returns a list of Findings (an "ok" Finding when it passed)
# ---------------------------------------------------------------------------------------------


def check_architecture(d: DraftFiles) -> list:
    where = str(d.config_path)
    out = []
    archs = d.config.get("architectures")
    if archs != [EAGLE3_ARCH] and d.uses_aux:
        out.append(
            Finding(
                "architectures",
                "error",
                f'architectures is {archs!r}, not ["{EAGLE3_ARCH}"]',
                "SGLang picks the draft model class from this field; another class builds a different network "
                "(LlamaForCausalLMEagle is EAGLE-2, LlamaForCausalLM a plain model) or refuses the weights",
                _config_fix("architectures", [EAGLE3_ARCH]),
                where,
            )
        )
    else:
        out.append(Finding("architectures", "ok", f"architectures {archs!r}", where=where))
    if d.config.get("model_type") != "llama":
        out.append(
            Finding(
                "architectures",
                "warning",
                f'model_type is {d.config.get("model_type")!r}, not "llama"',
                "SGLang builds the config object from model_type; the EAGLE-3 draft class reads Llama fields",
                _config_fix("model_type", "llama"),
                where,
            )
        )
    if d.config.get("num_hidden_layers") != 1:
        out.append(
            Finding(
                "architectures",
                "warning",
                f"num_hidden_layers is {d.config.get('num_hidden_layers')!r}, not 1",
                "SGLang's EAGLE-3 draft has exactly one decoder layer (midlayer); other values are ignored or misread",
                _config_fix("num_hidden_layers", 1),
                where,
            )
        )
    return out


def check_hidden_size(d: DraftFiles, t: TargetInfo) -> list:
    h = d.config.get("hidden_size")
    if h != t.hidden_size:
        return [
            Finding(
                "hidden_size",
                "error",
                f"draft hidden_size {h} differs from the target's {t.hidden_size}",
                "the draft shares the target's token embedding and consumes its hidden states: both must be "
                f"{t.hidden_size} wide, otherwise start-up fails or the draft was trained for another target",
                f"train the draft for this target (hidden {t.hidden_size}), or serve it with the target it was "
                "trained on",
                str(d.config_path),
            )
        ]
    return [Finding("hidden_size", "ok", f"hidden_size {h} = target's", where=str(d.config_path))]


def check_fc_width(d: DraftFiles, t: TargetInfo) -> list:
    if not d.uses_aux:
        return [
            Finding(
                "fc_width", "info", "EAGLE-1-style draft (no aux hidden states): no fc to check", where=str(d.folder)
            )
        ]
    shape = d.tensors.get("fc.weight", (None, None))[0] if "fc.weight" in d.tensors else None
    if shape is None:
        return []  # reported by check_tensor_names as a missing tensor
    want = 3 * t.hidden_size
    if len(shape) != 2 or shape[1] != want:
        got = shape[1] if len(shape) == 2 else shape
        return [
            Finding(
                "fc_width",
                "error",
                f"fc.weight is {_fmt(shape)}: it takes {got} inputs, but the target delivers 3 x "
                f"{t.hidden_size} = {want}",
                "SGLang runs fc only when the incoming width differs from H; an fc of the wrong width either fails at "
                "start-up or projects hidden states the draft never saw in training",
                f"export fc.weight as [{d.config.get('hidden_size')}, {want}] (three captured layers of the "
                f"{t.hidden_size}-wide target)",
                str(d.weight_files[0]),
            )
        ]
    return [
        Finding("fc_width", "ok", f"fc.weight {_fmt(shape)} takes 3 x {t.hidden_size}", where=str(d.weight_files[0]))
    ]


def check_fc_norm(d: DraftFiles) -> list:
    """The norms before fc (EAGLE 3.1): config keys and tensors agree as SGLang 0.5.17 reads them.

    SGLang builds a norm from its key alone and loads whatever weight it finds: a key without its
    tensors serves an untrained norm (weight 1), tensors without their key are skipped. No error either way.
    """
    if not d.uses_aux:
        return []
    where, norms = str(d.config_path), fc_norms(d.config)
    names = {sglang_loads_as(n, NORM_TENSORS) for n in d.tensors}  # every spelling SGLang loads a norm under
    keys = {
        "concat": ("norm_before_fc", _config_fix("eagle_config", {**d.eagle_config, "norm_before_fc": True})),
        "per_layer": ("fc_norm", _config_fix("fc_norm", True)),
    }
    out = []
    for norm, tensors in FC_NORM_TENSORS.items():
        key, fix = keys[norm]
        present = [n for n in tensors if n in names]
        if norm in norms and len(present) < len(tensors):
            lacking = ", ".join(n for n in tensors if n not in names)
            out.append(
                Finding(
                    "fc_norm",
                    "error",
                    f"config.json sets {key} but model.safetensors lacks {lacking}",
                    "SGLang builds the norm before fc and finds no weight for it: it keeps its initial 1s, so fc sees "
                    "states normed without the trained scales, with no error",
                    f"export the draft's {', '.join(tensors)}, or remove {key} from config.json if the draft was "
                    "trained without it",
                    where,
                )
            )
        elif present and norm not in norms:
            nested = (
                " (eagle_config.fc_norm is not read: SGLang reads fc_norm at the top level only)"
                if (norm == "per_layer" and "fc_norm" in d.eagle_config)
                else ""
            )
            out.append(
                Finding(
                    "fc_norm",
                    "error",
                    f"model.safetensors has {', '.join(present)} but config.json does not set {key}{nested}",
                    "SGLang then builds no norm before fc and skips these tensors silently: fc gets un-normed states "
                    "the draft was not trained on",
                    fix,
                    where,
                )
            )
    if not out:
        what = (
            " then ".join(f"{keys[n][0]} ({', '.join(FC_NORM_TENSORS[n])})" for n in norms)
            if norms
            else "no norm before fc (fc_norm, norm_before_fc unset; no such tensors)"
        )
        out.append(Finding("fc_norm", "ok", what, where=where))
    return out


def check_capture_layers(d: DraftFiles, t: TargetInfo) -> list:
    where = str(d.config_path)
    if not d.uses_aux:
        if d.eagle_config.get("use_aux_hidden_state") is False and "fc.weight" in d.tensors:
            return [
                Finding(
                    "capture_layers_present",
                    "error",
                    "eagle_config.use_aux_hidden_state is false but the draft has fc.weight",
                    "SGLang then captures no aux layers: the target sends its final state (width H), fc is "
                    "bypassed and acceptance length collapses to ~1.0 with no error",
                    _config_fix("eagle_config", {**d.eagle_config, "use_aux_hidden_state": True}),
                    where,
                )
            ]
        return [Finding("capture_layers_present", "info", "EAGLE-1-style draft: no capture layers", where=where)]
    n = t.num_layers
    default_cfg_ids = config_ids(t.default_capture, t.is_deepseek)  # the ids that give SGLang's default capture
    ids = d.eagle_config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        return [
            Finding(
                "capture_layers_present",
                "warning",
                "eagle_config.eagle_aux_hidden_state_layer_ids is missing",
                f"SGLang then silently captures its default hidden_states{t.default_capture} of this {n}-layer target; "
                "if the draft was trained on other layers it serves with low acceptance and no error",
                _config_fix(
                    "eagle_config", {"eagle_aux_hidden_state_layer_ids": default_cfg_ids, "use_aux_hidden_state": True}
                )
                + " (the ids of the layers the draft was trained on; these are SGLang's default)",
                where,
            )
        ]
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        return [
            Finding(
                "capture_layers_present",
                "error",
                f"eagle_aux_hidden_state_layer_ids is {ids!r}, not a list of ints",
                "SGLang cannot set the capture layers",
                _config_fix("eagle_config", {"eagle_aux_hidden_state_layer_ids": default_cfg_ids}),
                where,
            )
        ]
    out = [Finding("capture_layers_present", "ok", f"eagle_aux_hidden_state_layer_ids {ids}", where=where)]
    captured = captured_states(ids, t.is_deepseek)
    bad = outside_target(ids, n, t.is_deepseek)
    if len(ids) != 3 or bad:
        out.append(
            Finding(
                "capture_layers_range",
                "error",
                f"layer ids {ids} select hidden_states{captured} of a {n}-layer target"
                + (f"; {bad} fall outside it" if bad else f"; {len(ids)} ids instead of 3"),
                "SGLang captures the input of decoder layer id+1 for each id; a layer that does not exist is never "
                "captured, so the concatenation is narrower than fc expects (start-up or first-step failure)",
                _config_fix(
                    "eagle_config", {"eagle_aux_hidden_state_layer_ids": default_cfg_ids, "use_aux_hidden_state": True}
                )
                + " (or the ids the draft was really trained on)",
                where,
            )
        )
        return out
    out.append(
        Finding("capture_layers_range", "ok", f"ids {ids} -> hidden_states{captured}, inside 1..{n - 1}", where=where)
    )
    if ids != sorted(set(ids)):
        out.append(
            Finding(
                "capture_layers_range",
                "warning",
                f"layer ids {ids} are not strictly increasing",
                "the draft's fc was trained on the concatenation (low, mid, high); SGLang concatenates in the order "
                "captured",
                _config_fix("eagle_config", {"eagle_aux_hidden_state_layer_ids": sorted(set(ids))}),
                where,
            )
        )
    trained = trained_layers(d.config)
    if trained is not None and captured != trained:
        check = "capture_layers_deepseek" if t.is_deepseek else "capture_layers_convention"
        try:
            want_ids = config_ids(trained, t.is_deepseek)
            fix = _config_fix(
                "eagle_config", {"eagle_aux_hidden_state_layer_ids": want_ids, "use_aux_hidden_state": True}
            )
        except CaptureError:
            fix = "no id list makes a DeepSeek-family SGLang model capture these layers; retrain on capturable layers"
        out.append(
            Finding(
                check,
                "error",
                f"the draft was trained on hidden_states{trained} but SGLang will capture hidden_states{captured} from "
                f"ids {ids}",
                "off-by-one capture feeds fc states from the neighbouring layers: no error, lower acceptance",
                fix,
                where,
            )
        )
    elif trained is None and not t.is_deepseek and ids == t.default_capture:
        out.append(
            Finding(
                "capture_layers_convention",
                "warning",
                f'ids {ids} equal SGLang\'s default capture written as "input of layer" ids; SGLang adds 1 to config '
                f"ids and will capture hidden_states{captured}",
                'config ids follow the "output of layer i" convention ([1, N//2-1, N-4] for the default set); '
                "writing the input-of-layer ids shifts every captured layer by one, silently",
                _config_fix(
                    "eagle_config", {"eagle_aux_hidden_state_layer_ids": default_cfg_ids, "use_aux_hidden_state": True}
                )
                + f" if the draft was trained on hidden_states{t.default_capture}",
                where,
            )
        )
    else:
        out.append(
            Finding(
                "capture_layers_convention",
                "ok",
                f"ids {ids} read as output-of-layer ids -> hidden_states{captured}"
                + (" (matches the recorded training layers)" if trained else ""),
                where=where,
            )
        )
    if t.is_deepseek:
        llama_reading = [i + 1 for i in ids]
        if ids[0] != 1 and trained is None:
            out.append(
                Finding(
                    "capture_layers_deepseek",
                    "warning",
                    f"on this DeepSeek-family target SGLang uses ids {ids} as they are (it adds 1 only when the first "
                    f"id is 1): it captures hidden_states{captured}, where a Llama-family target would capture "
                    f"hidden_states{llama_reading}",
                    "the same draft config means different layers on the two families; a draft trained with "
                    "output-of-layer ids is fed states one layer early, with no error",
                    (
                        _config_fix(
                            "eagle_config",
                            {"eagle_aux_hidden_state_layer_ids": llama_reading, "use_aux_hidden_state": True},
                        )
                        + f" if the draft was trained on hidden_states{llama_reading}"
                        if llama_reading[0] != 1
                        else f"if the draft was trained on hidden_states{llama_reading}, no id list captures them on "
                        "DeepSeek: retrain"
                    )
                    + '; add "draftlab": {"capture_layers": [...]} to config.json so doctor can check it',
                    where,
                )
            )
        elif trained is None or captured == trained:
            out.append(
                Finding(
                    "capture_layers_deepseek",
                    "ok",
                    f"DeepSeek-family target, first id {ids[0]}: SGLang adds 1 -> hidden_states{captured}"
                    if ids[0] == 1
                    else f"DeepSeek-family target: ids used as-is -> hidden_states{captured}",
                    where=where,
                )
            )
    return out


def check_tensor_names(d: DraftFiles, t: TargetInfo) -> list:
    """Unknown or prefixed names (skipped silently by SGLang), missing names, wrong shapes."""
    where = str(d.weight_files[0])
    try:
        expected = expected_tensors(d.config, t.hidden_size, d.uses_aux)
    except KeyError as exc:  # types were checked when the folder was read; only absence is left
        return [
            Finding(
                "config_fields",
                "error",
                f"config.json lacks field {exc} that SGLang needs",
                "SGLang builds the draft's layers from these fields",
                "write the full Llama config fields listed in the contract",
                str(d.config_path),
            )
        ]
    out = []
    norms = NORM_TENSORS  # present or absent: check_fc_norm's
    known = set(expected) | norms
    loads_as = {n: sglang_loads_as(n, known) for n in d.tensors}  # the file's name -> the contract's (None: skipped)
    in_file = {c: n for n, c in loads_as.items() if c is not None}  # the contract's name -> the file's
    found = set(in_file)
    unknown = sorted(n for n, c in loads_as.items() if c is None)
    missing = sorted(set(expected) - found - norms)
    renamed = sorted(n for n, c in loads_as.items() if c is not None and c != n and n not in LEGACY_FC_NORM_NAMES)
    if renamed:
        pairs = ", ".join(f"{n} -> {loads_as[n]}" for n in renamed[:4])
        out.append(
            Finding(
                "unknown_tensors",
                "info",
                f"{len(renamed)} tensors load under another spelling ({pairs})",
                "SGLang 0.5.17 renames midlayer to layers.0 and also tries a `model.` prefix; other loaders may not",
                "rename them to contract names to be safe: " + pairs,
                where,
            )
        )
    prefixed = {}
    for name in unknown:
        for prefix in KNOWN_PREFIXES:
            if name.startswith(prefix) and sglang_loads_as(name[len(prefix) :], known) is not None:
                prefixed[name] = name[len(prefix) :]
    if prefixed:
        pairs = ", ".join(f"{a} -> {b}" for a, b in list(prefixed.items())[:4])
        out.append(
            Finding(
                "unknown_tensors",
                "error",
                f"{len(prefixed)} tensors carry a prefix or old name SGLang does not know ({pairs})",
                "SGLang's loader skips unknown names silently: those layers stay randomly initialised and acceptance "
                "collapses",
                "rename them in model.safetensors: " + pairs,
                where,
            )
        )
    others = [n for n in unknown if n not in prefixed]
    if others:
        embed = [n for n in others if n.endswith("embed_tokens.weight")]
        rest = [n for n in others if n not in embed]
        if rest:
            out.append(
                Finding(
                    "unknown_tensors",
                    "warning",
                    f"{len(rest)} tensors SGLang would skip: {', '.join(rest[:5])}",
                    "unknown names are dropped without a message; if the draft needs them (e.g. biases) it serves "
                    "differently from how it was trained",
                    "remove them, or rename them to contract names",
                    where,
                )
            )
        if embed:
            out.append(
                Finding(
                    "unknown_tensors",
                    "info",
                    f"{embed[0]} is saved",
                    "the token embedding is shared with the target in SGLang; a saved copy is dead weight",
                    f"drop {embed[0]} from the export",
                    where,
                )
            )
    if not prefixed and not others:
        out.append(Finding("unknown_tensors", "ok", f"all {len(found)} tensor names are contract names", where=where))
    if missing:
        out.append(
            Finding(
                "missing_tensors",
                "error",
                f"missing tensors: {', '.join(missing)}",
                "SGLang does not complain about a missing weight: the layer keeps its random initialisation",
                "export every tensor of the contract's table ("
                + ", ".join(missing[:3])
                + ("..." if len(missing) > 3 else "")
                + ")",
                where,
            )
        )
    else:
        out.append(Finding("missing_tensors", "ok", f"all {len(expected)} contract tensors present", where=where))
    own_checks = {"fc.weight", "lm_head.weight", "d2t", "t2d"}  # their shapes have dedicated checks
    wrong = [
        (n, d.tensors[in_file[n]][0], expected[n])
        for n in sorted(found & set(expected))
        if n not in own_checks and tuple(d.tensors[in_file[n]][0]) != expected[n]
    ]
    if wrong:
        desc = "; ".join(f"{n} is {_fmt(g)}, config implies {_fmt(w)}" for n, g, w in wrong[:4])
        out.append(
            Finding(
                "tensor_shapes",
                "error",
                desc,
                "a known name with a wrong shape fails at SGLang start-up (or the config describes another network)",
                "make config.json (hidden_size, heads, head_dim, intermediate_size) match the exported weights; "
                "q/k/v_proj take 2 x hidden_size inputs",
                where,
            )
        )
    else:
        out.append(Finding("tensor_shapes", "ok", "tensor shapes match config.json", where=where))
    return out
