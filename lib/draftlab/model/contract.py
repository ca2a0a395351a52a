"""The SGLang EAGLE-3 tensor table (docs/eagle3-contract.md section 1), written once.

The exporter validates against it before writing, and the doctor checks a folder against it;
both read it here, so a change of the contract is one edit.
"""

from __future__ import annotations

EAGLE3_ARCH = "LlamaForCausalLMEagle3"


def expected_tensors(config: dict, target_hidden: int | None = None, uses_aux: bool | None = None) -> dict:
    """name -> shape (a tuple) that SGLang's LlamaForCausalLMEagle3 allocates for a draft config.

    target_hidden: the width T of one captured target state (the draft's hidden_size when not
    given; equal in every shipped config). uses_aux: whether fc exists (default: the config's
    eagle_config.use_aux_hidden_state, true when absent). Raises KeyError/TypeError/ValueError
    when the config lacks a field the shapes need.
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
        shapes["fc.weight"] = (h, 3 * int(target_hidden or h))
    return shapes
