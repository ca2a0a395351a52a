"""Which hidden states an EAGLE-3 draft reads, and the ids SGLang's config uses for them.

draftlab names a captured state by its `hidden_states` index (transformers'
`output_hidden_states` tuple: 0 is the embedding output, i the input of decoder layer i).
SGLang's config ids (`eagle_aux_hidden_state_layer_ids`) mean "output of layer id": it adds 1,
except on DeepSeek-family targets, which add 1 only when the first id is 1 and otherwise take the
ids as they are. This module is the only place that converts between the two; the exporter
writes with `config_ids` and the doctor reads back with `captured_states`.
"""

from __future__ import annotations

# model_type values SGLang routes through its DeepSeek model classes.
DEEPSEEK_MODEL_TYPES = ("deepseek_v2", "deepseek_v3", "deepseek_v32", "kimi_k2")


class CaptureError(ValueError):
    """No config id list makes SGLang capture the requested hidden states."""


def default_capture(num_layers: int) -> list[int]:
    """SGLang's default capture for an N-layer target, as hidden_states indices: [2, N//2, N-3]."""
    return [2, num_layers // 2, num_layers - 3]


def is_deepseek(model_type: str | None, architectures=None) -> bool:
    """True for targets whose SGLang model applies the DeepSeek id rule."""
    archs = " ".join(architectures or [])
    return (model_type or "") in DEEPSEEK_MODEL_TYPES or "Deepseek" in archs


def captured_states(ids, deepseek: bool = False) -> list[int]:
    """The hidden_states indices SGLang captures for config ids."""
    ids = [int(i) for i in ids]
    if deepseek and ids and ids[0] != 1:
        return ids  # DeepSeek-family models add 1 only when the first id is 1
    return [i + 1 for i in ids]


def outside_target(ids, num_layers: int, deepseek: bool = False) -> list[int]:
    """The config ids whose captured state is not the input of a decoder layer of an N-layer target.

    SGLang captures the input of decoder layer c for each id (c = captured_states); c must name a
    real layer, 1..N-1 (0 is the embedding output, which no id selects). A layer that does not exist
    is never captured, so the concatenation fc receives is narrower than trained: the exporter's
    validator and the doctor both ask this function.
    """
    ids = [int(i) for i in ids]
    return [i for i, c in zip(ids, captured_states(ids, deepseek)) if not 1 <= c <= num_layers - 1]


def config_ids(capture_layers, deepseek: bool = False) -> list[int]:
    """The config ids that make SGLang capture `capture_layers` (the inverse of captured_states).

    Raises CaptureError when no id list does (a DeepSeek target and a first layer of 1)."""
    layers = [int(i) for i in capture_layers]
    shifted = [i - 1 for i in layers]
    if not deepseek or not layers or shifted[0] == 1:
        return shifted
    if captured_states(layers, True) != layers:
        raise CaptureError(f"no config ids make a DeepSeek-family SGLang model capture hidden_states{layers}")
    return layers


def trained_layers(config: dict) -> list[int] | None:
    """The hidden_states indices an exported draft was trained on, when draftlab recorded them."""
    meta = config.get("draftlab")
    if isinstance(meta, dict) and isinstance(meta.get("capture_layers"), list):
        return [int(i) for i in meta["capture_layers"]]
    return None


def recorded_deepseek(config: dict) -> bool:
    """Whether draftlab exported this draft config for a DeepSeek-family target."""
    meta = config.get("draftlab")
    return isinstance(meta, dict) and meta.get("capture_convention") == "deepseek"


def capture_layers_from_config(config: dict) -> list[int] | None:
    """The hidden_states indices a draft reads: draftlab's record, else SGLang's reading of the ids."""
    recorded = trained_layers(config)
    if recorded is not None:
        return recorded
    ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return None if ids is None else captured_states(ids, recorded_deepseek(config))
