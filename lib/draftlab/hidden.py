"""Target hidden states for draft training and drafting.

"Input of layer i" = transformers' `hidden_states[i]` (index 0 = embedding output), which is what
SGLang's `eagle_aux_hidden_state_layer_ids` mean. The final state for the EAGLE-1-style variant is
the last decoder layer's output *before* the final norm (EAGLE-1's "feature").
"""

from __future__ import annotations

import torch


def _final_norm(model):
    """The target's final RMSNorm (Llama-like models keep it at base_model.norm)."""
    base = getattr(model, "base_model", model)
    norm = getattr(base, "norm", None)
    if norm is None:
        raise ValueError(f"{type(model).__name__}: no final norm at base_model.norm; unsupported target architecture")
    return norm


def _check_layers(layers, num_layers: int):
    if len(layers) != 3:
        raise ValueError(f"capture layers must be 3 ids, got {list(layers)}")
    for i in layers:
        if not 0 <= int(i) < num_layers:
            raise ValueError(f"capture layer {i} outside 0..{num_layers - 1} (input-of-layer ids)")


@torch.no_grad()
def target_states(target, input_ids, attention_mask=None, layers=None, want_logits: bool = False):
    """One target forward: (aux [B,T,3H], last [B,T,H] pre-norm, logits [B,T,V] or None).

    `target` is a draftlab Target (or anything with .model); layers default to
    target.capture_layers.
    """
    model = target.model if hasattr(target, "model") else target
    layers = list(layers if layers is not None else target.capture_layers)
    n = model.config.get_text_config().num_hidden_layers
    _check_layers(layers, n)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    if attention_mask is not None:
        attention_mask = attention_mask.to(device)
    # The pre-norm output of the last layer: hidden_states[-1] is post-norm in transformers.
    captured = {}
    norm = _final_norm(model)
    hook = norm.register_forward_hook(lambda mod, args, out: captured.__setitem__("last", args[0]))
    try:
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=True,
            use_cache=False,
            logits_to_keep=0 if want_logits else 1,
        )
    finally:
        hook.remove()
    hs = out.hidden_states
    aux = torch.cat([hs[i] for i in layers], dim=-1)  # [B,T,3H]
    return aux, captured["last"], (out.logits if want_logits else None)


def aux_hidden(target, input_ids, attention_mask=None, layers=None) -> torch.Tensor:
    """[B,T,3H]: concatenation (low, mid, high) of the captured "input of layer i" states."""
    return target_states(target, input_ids, attention_mask, layers)[0]


def final_hidden(target, input_ids, attention_mask=None) -> torch.Tensor:
    """[B,T,H]: the last decoder layer's pre-norm output (EAGLE-1-style draft input)."""
    model = target.model if hasattr(target, "model") else target
    n = model.config.get_text_config().num_hidden_layers
    return target_states(target, input_ids, attention_mask, layers=[0, 0, n - 1])[1]


def draft_features(target, draft, input_ids, attention_mask=None) -> torch.Tensor:
    """What `draft.project` expects: aux states (EAGLE-3) or the final state (EAGLE-1)."""
    aux, last, _ = target_states(target, input_ids, attention_mask, layers=draft_layers(target, draft))
    return aux if draft.use_aux else last


def draft_layers(target, draft) -> list[int]:
    layers = draft.capture_layers
    if layers is None:
        layers = target.capture_layers
    return list(layers)


@torch.no_grad()
def logits_from_last(target, last: torch.Tensor, vocab_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Target logits from the stored pre-norm last state: lm_head(norm(last)), optionally only
    the columns `vocab_ids` (e.g. the draft vocabulary) [..., len(vocab_ids)]."""
    model = target.model if hasattr(target, "model") else target
    x = _final_norm(model)(last)
    w = model.get_output_embeddings().weight
    if vocab_ids is not None:
        w = w[vocab_ids]
    return x @ w.T.to(x.dtype)
