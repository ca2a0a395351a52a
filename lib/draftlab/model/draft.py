"""The EAGLE-3 draft: one Llama decoder layer over (embedding, projected target features).

Parameter names are exactly the contract's tensor names (docs/eagle3-contract.md section 1), so
export is the state dict minus nothing but the (never registered) shared embedding.

Alignment (same as SGLang's llama_eagle3):
  hidden[:, t]     projected feature of token t (fc over the three captured target states)
  input_ids[:, t]  token t+1
  logits[:, t]     predicts token t+2 (over the draft vocabulary; map with to_target_ids)
  hidden_out[:, t] pre-norm output, fed back as the next draft step's hidden

The EAGLE-1-style variant (config.eagle_config["use_aux_hidden_state"] = False) takes the
target's final (post-norm) hidden state directly: no fc, otherwise the same module.

EAGLE 3.1's norms before fc (model.contract.fc_norms) are built from the config keys SGLang reads
and applied where SGLang applies them, inside `project`, so the engine stays SGLang's oracle.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DynamicCache, LlamaConfig
from transformers.models.llama.modeling_llama import (
    LlamaMLP,
    LlamaRMSNorm,
    LlamaRotaryEmbedding,
    apply_rotary_pos_emb,
    repeat_kv,
)

from draftlab.model.capture import (
    capture_layers_from_config,
    default_capture,
    is_deepseek,
    recorded_deepseek,
)
from draftlab.model.contract import FC_NORMS, fc_norm_keys, fc_norms, sglang_loads_as
from draftlab.model.target import text_config


def make_draft_config(
    *,
    hidden_size: int,
    vocab_size: int,
    draft_vocab_size: int,
    num_attention_heads: int,
    num_key_value_heads: int,
    head_dim: int | None = None,
    intermediate_size: int | None = None,
    rms_norm_eps: float = 1e-5,
    rope_theta: float = 10000.0,
    rope_scaling: dict | None = None,
    max_position_embeddings: int = 2048,
    capture_layers: list[int] | None = None,
    use_aux: bool = True,
    hidden_act: str = "silu",
    bos_token_id: int | None = None,
    eos_token_id=None,
    pad_token_id: int | None = None,
    fc_norm: str = "none",
) -> LlamaConfig:
    """A LlamaConfig with the contract's extra keys (draft_vocab_size, eagle_config).

    fc_norm: the norm before fc (model.contract.FC_NORMS), written as SGLang's own config keys so
    that export and loading need no translation; "none" adds no key at all."""
    if fc_norm not in FC_NORMS:
        raise ValueError(f"fc_norm {fc_norm!r}: expected one of {', '.join(FC_NORMS)}")
    if fc_norm != "none" and not use_aux:
        raise ValueError(f"fc_norm {fc_norm!r} needs fc: the EAGLE-1-style draft (use_aux false) has none")
    head_dim = head_dim or hidden_size // num_attention_heads
    rope_parameters = {"rope_type": "default", "rope_theta": float(rope_theta)}
    if rope_scaling:
        rope_parameters = {**rope_scaling, "rope_theta": float(rope_theta)}
        rope_parameters.setdefault("rope_type", rope_scaling.get("type", "default"))
    cfg = LlamaConfig(
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=1,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        head_dim=head_dim,
        vocab_size=vocab_size,
        rms_norm_eps=rms_norm_eps,
        rope_parameters=rope_parameters,
        max_position_embeddings=max_position_embeddings,
        hidden_act=hidden_act,
        tie_word_embeddings=False,
        attention_bias=False,
        mlp_bias=False,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    cfg.draft_vocab_size = int(draft_vocab_size)
    cfg.eagle_config = {
        "eagle_aux_hidden_state_layer_ids": list(capture_layers) if capture_layers is not None else None,
        "use_aux_hidden_state": bool(use_aux),
    }
    top, eagle = fc_norm_keys(() if fc_norm == "none" else (fc_norm,))
    for key, value in top.items():
        setattr(cfg, key, value)
    cfg.eagle_config.update(eagle)
    return cfg


def draft_config_for_target(
    target_config,
    *,
    draft_vocab_size: int,
    capture_layers: list[int] | None = None,
    intermediate_size: int | None = None,
    use_aux: bool = True,
    max_position_embeddings: int | None = None,
    fc_norm: str = "none",
) -> LlamaConfig:
    """Draft config matching a target's (transformers) config: same H, V, heads, rope."""
    tc = text_config(target_config)
    n_layers = tc.num_hidden_layers
    heads = tc.num_attention_heads
    rope = getattr(tc, "rope_parameters", None) or {}
    rope_theta = rope.get("rope_theta", getattr(tc, "rope_theta", 10000.0))
    scaling = (
        {k: v for k, v in rope.items() if k != "rope_theta"} if rope.get("rope_type", "default") != "default" else None
    )
    eos = tc.eos_token_id
    cfg = make_draft_config(
        hidden_size=tc.hidden_size,
        vocab_size=tc.vocab_size,
        draft_vocab_size=draft_vocab_size,
        num_attention_heads=heads,
        num_key_value_heads=getattr(tc, "num_key_value_heads", None) or heads,
        head_dim=getattr(tc, "head_dim", None) or tc.hidden_size // heads,
        intermediate_size=intermediate_size or tc.intermediate_size,
        rms_norm_eps=getattr(tc, "rms_norm_eps", 1e-5),
        rope_theta=rope_theta,
        rope_scaling=scaling,
        max_position_embeddings=max(max_position_embeddings or 0, tc.max_position_embeddings),
        capture_layers=capture_layers if capture_layers is not None else default_capture(n_layers),
        use_aux=use_aux,
        bos_token_id=tc.bos_token_id,
        eos_token_id=eos,
        pad_token_id=getattr(tc, "pad_token_id", None),
        fc_norm=fc_norm,
    )
    # Export writes SGLang's config ids by the target family's rule (model.capture).
    if is_deepseek(getattr(tc, "model_type", None), getattr(target_config, "architectures", None)):
        cfg.capture_convention = "deepseek"
    return cfg


RECOMPILE_LIMIT = 32  # compile_ttt: graphs of the unroll step, 8 expected


class Eagle3Attention(nn.Module):
    """Llama attention whose q/k/v take the 2H-wide (embedding, hidden) concatenation."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        h = config.hidden_size
        self.head_dim = config.head_dim
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim**-0.5
        self.q_proj = nn.Linear(2 * h, self.num_heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(2 * h, self.num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(2 * h, self.num_kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=False)

    def qkv(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """x [B,T,2H] -> q [B,heads,T,d], k/v [B,kv_heads,T,d] (rope applied)."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        return q, k, v

    def attend(self, q, k, v, mask: torch.Tensor | None) -> torch.Tensor:
        """q [B,h,T,d], k/v [B,kvh,S,d], mask bool [B|1,1,T,S] (True = visible) -> [B,T,H]."""
        k = repeat_kv(k, self.num_key_value_groups)
        v = repeat_kv(v, self.num_key_value_groups)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scaling)
        b, _, t, _ = out.shape
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class Eagle3DecoderLayer(nn.Module):
    """SGLang's `midlayer`: norms on both inputs, 2H-wide attention, residual on the hidden."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.self_attn = Eagle3Attention(config)
        self.mlp = LlamaMLP(config)
        self.hidden_norm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.input_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = LlamaRMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def attn_input(self, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        """[B,T,H] x2 -> [B,T,2H] (embedding first, as in SGLang)."""
        return torch.cat([self.input_layernorm(embeds), self.hidden_norm(hidden)], dim=-1)

    def finish(self, hidden: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """Residual + MLP; returns the pre-norm output [B,T,H]."""
        h = hidden + attn_out
        return h + self.mlp(self.post_attention_layernorm(h))


class Eagle3Draft(nn.Module):
    """EAGLE-3 draft (or the EAGLE-1-style variant) sharing the target's frozen embedding."""

    def __init__(self, config: LlamaConfig, embed_tokens: nn.Module):
        super().__init__()
        self.config = config
        eagle = getattr(config, "eagle_config", None) or {}
        self.use_aux = bool(eagle.get("use_aux_hidden_state", True))
        h, vd, v = config.hidden_size, config.draft_vocab_size, config.vocab_size
        if self.use_aux:
            self.fc = nn.Linear(3 * h, h, bias=False)
        # Norms before fc, named as SGLang's checkpoint names them (input_norm, fc_norm.i); none by default.
        self.fc_norms = fc_norms(config) if self.use_aux else ()
        eps = config.rms_norm_eps
        self.input_norm = LlamaRMSNorm(3 * h, eps=eps) if "concat" in self.fc_norms else None
        self.fc_norm = (
            nn.ModuleList([LlamaRMSNorm(h, eps=eps) for _ in range(3)]) if "per_layer" in self.fc_norms else None
        )
        self.midlayer = Eagle3DecoderLayer(config)
        self.norm = LlamaRMSNorm(h, eps=config.rms_norm_eps)
        self.lm_head = nn.Linear(h, vd, bias=False)
        # Identity mapping until a vocabulary is set (set_vocab); exported as the contract says.
        self.register_buffer("d2t", torch.zeros(vd, dtype=torch.int64))
        t2d = torch.zeros(v, dtype=torch.bool)
        t2d[:vd] = True
        self.register_buffer("t2d", t2d)
        self.rotary_emb = LlamaRotaryEmbedding(config=config)  # inv_freq is non-persistent
        # Shared with the target and frozen: kept outside the module tree so that it is never
        # saved, exported, moved or wrapped by DDP.
        self._embed = [embed_tokens]
        self.ttt_step_fn = None  # compile_ttt: the compiled unroll step
        self.init_weights()

    # ---- construction helpers -------------------------------------------------------------
    def init_weights(self, std: float = 0.02) -> None:
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=std)
            elif isinstance(m, LlamaRMSNorm):
                nn.init.ones_(m.weight)

    @property
    def embed_tokens(self) -> nn.Module:
        return self._embed[0]

    @property
    def capture_layers(self) -> list[int] | None:
        return (getattr(self.config, "eagle_config", None) or {}).get("eagle_aux_hidden_state_layer_ids")

    @property
    def draft_vocab_size(self) -> int:
        return self.config.draft_vocab_size

    def set_vocab(self, draft_ids: torch.Tensor) -> None:
        """Install a draft vocabulary: draft_ids [Vd] sorted target ids."""
        draft_ids = torch.as_tensor(draft_ids, dtype=torch.int64, device=self.d2t.device)
        if draft_ids.numel() != self.draft_vocab_size:
            raise ValueError(f"draft vocabulary has {draft_ids.numel()} ids, config says {self.draft_vocab_size}")
        self.d2t.copy_(draft_ids - torch.arange(draft_ids.numel(), device=draft_ids.device))
        self.t2d.zero_()
        self.t2d[draft_ids] = True

    def draft_ids(self) -> torch.Tensor:
        """[Vd] target ids of the draft vocabulary."""
        return torch.arange(self.draft_vocab_size, device=self.d2t.device) + self.d2t

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    # ---- forward --------------------------------------------------------------------------
    def project(self, aux: torch.Tensor) -> torch.Tensor:
        """[B,T,3H] captured target states -> [B,T,H]; identity for the EAGLE-1 variant.

        The norms before fc run in SGLang's order: input_norm over all 3H, then fc_norm.i per chunk."""
        if not self.use_aux:
            return aux
        x = aux.to(self.fc.weight.dtype)
        if self.input_norm is not None:
            x = self.input_norm(x)
        if self.fc_norm is not None:
            chunks = x.chunk(3, dim=-1)  # 3 x [B,T,H]: (low, mid, high)
            x = torch.cat([norm(c) for norm, c in zip(self.fc_norm, chunks)], dim=-1)  # [B,T,3H]
        return self.fc(x)

    def _embed_ids(self, input_ids: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            e = self.embed_tokens(input_ids.to(self.embed_tokens.weight.device))
        return e.to(device=like.device, dtype=like.dtype)

    def forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        past_key_values=None,
        attention_mask: torch.Tensor | None = None,
    ):
        """One draft step over T new positions, appending to the KV cache.

        input_ids [B,T], hidden [B,T,H] (projected), position_ids [B,T] or [T].
        attention_mask: None (causal over cache + new), 2D [B, past+T] padding mask (1 = keep),
        or a 4D mask [B|1, 1, T, past+T] (bool True = visible, or additive float), e.g. a tree.
        Returns (logits [B,T,Vd], hidden_out [B,T,H], past_key_values).
        """
        if past_key_values is None:
            past_key_values = DynamicCache()
        layer = self.midlayer
        embeds = self._embed_ids(input_ids, hidden)
        x = layer.attn_input(embeds, hidden)  # [B,T,2H]
        if position_ids.dim() == 1:
            position_ids = position_ids.unsqueeze(0).expand(input_ids.shape[0], -1)
        cos, sin = self.rotary_emb(x, position_ids)
        q, k, v = layer.self_attn.qkv(x, cos, sin)
        past = past_key_values.get_seq_length(0) if len(getattr(past_key_values, "layers", [])) else 0
        k, v = past_key_values.update(k, v, 0)
        mask = self._inference_mask(attention_mask, q.shape[2], past, k.shape[2], x.device)
        hidden_out = layer.finish(hidden, layer.self_attn.attend(q, k, v, mask))
        return self.head(hidden_out), hidden_out, past_key_values

    @staticmethod
    def _inference_mask(attention_mask, t: int, past: int, total: int, device) -> torch.Tensor | None:
        """Bool mask [B|1,1,T,S] (True = visible) for causal attention over cache + new tokens."""
        if attention_mask is not None and attention_mask.dim() == 4:
            return attention_mask.to(device)
        causal = None
        if t > 1:
            q_pos = torch.arange(t, device=device) + past  # [T]
            causal = (torch.arange(total, device=device)[None, :] <= q_pos[:, None])[None, None]  # [1,1,T,S]
        if attention_mask is None:
            return causal
        if attention_mask.shape[-1] != total:
            raise ValueError(f"attention_mask has {attention_mask.shape[-1]} columns, cache + new = {total}")
        pad = attention_mask.to(device=device, dtype=torch.bool)[:, None, None, :]  # [B,1,1,S]
        mask = pad if causal is None else pad & causal
        # A padding query that sees nothing would give NaN rows; let it see everything (ignored anyway).
        return mask | ~mask.any(-1, keepdim=True)

    def head(self, hidden_out: torch.Tensor) -> torch.Tensor:
        """[B,T,H] pre-norm output -> [B,T,Vd] logits over the draft vocabulary."""
        return self.lm_head(self.norm(hidden_out))

    def ttt_forward(
        self,
        input_ids: torch.Tensor,
        hidden: torch.Tensor,
        position_ids: torch.Tensor,
        valid: torch.Tensor,
        steps: int,
    ):
        """Training-time test: unroll `steps` draft steps over the whole sequence at once.

        input_ids [B,T] (token t+1 at slot t), hidden [B,T,H] (projected feature of token t),
        position_ids [B,T], valid [B,T] bool (real, non-padding slots).
        Step i feeds token t+1+i at slot t (right-shifted with pad 0) and the previous step's
        pre-norm output; slot t then sits at position t+i and sees step-0 keys at slots <= t
        (the prefix) plus its own keys of steps 1..i (the chain): what inference sees.
        Yields (i, hidden_out [B,T,H]) for each step (pre-norm; logits = draft.head(hidden_out)),
        so that the caller can compute the large [B,T,Vd] logits under activation checkpointing.
        """
        b, t = input_ids.shape
        device = hidden.device
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()  # [T,T]
        prefix_mask = causal[None, None] & valid[:, None, None, :]  # [B,1,T,T]
        eye = torch.eye(t, dtype=torch.bool, device=device)[None, None].expand(b, 1, t, t)
        keys = values = None
        ids = input_ids
        step = self.ttt_step_fn or self.ttt_step
        for i in range(steps):
            if i > 0:  # shift tokens left by one: slot t now holds token t+1+i
                ids = F.pad(ids[:, 1:], (0, 1), value=0)
            mask = torch.cat([prefix_mask] + [eye] * i, dim=-1)  # [B,1,T,(i+1)T]
            hidden, keys, values = step(self._embed_ids(ids, hidden), hidden, position_ids + i, keys, values, mask)
            yield i, hidden

    def ttt_step(self, embeds, hidden, positions, keys, values, mask):
        """One unroll step of ttt_forward: embeds/hidden [B,T,H], positions [B,T], keys/values of the
        earlier steps [B,kvh,iT,d] (None at step 0), mask [B,1,T,(i+1)T] ->
        (hidden_out [B,T,H], keys and values with this step's appended)."""
        layer = self.midlayer
        x = layer.attn_input(embeds, hidden)  # [B,T,2H]
        cos, sin = self.rotary_emb(x, positions)
        q, k, v = layer.self_attn.qkv(x, cos, sin)
        # contiguous from the first step on: later steps then see keys of one layout (one compiled graph)
        keys = k.contiguous() if keys is None else torch.cat([keys, k], dim=2)
        values = v.contiguous() if values is None else torch.cat([values, v], dim=2)
        return layer.finish(hidden, layer.self_attn.attend(q, keys, values, mask)), keys, values

    def compile_ttt(self) -> None:
        """torch.compile the unroll step (dynamic shapes: batches differ in B and T): its norms, rotary,
        MLP and masks fused into fewer kernels. Inference (`forward`) is left eager.

        The step is one graph per (first step or later) x (batch of one or more) x (training or
        no_grad): 8, which is dynamo's default recompile limit, past which it silently runs the step
        eager (seen on the H200). So the limit is raised for this process. (Training's
        evaluation runs eager: TTTObjective.eager.)"""
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        self.ttt_step_fn = torch.compile(self.ttt_step, dynamic=True)


def load_draft(folder, target) -> Eagle3Draft:
    """Read an exported draft folder (config.json + model.safetensors, contract names).

    The embedding comes from the `Target`; weights are cast to the target's dtype and device.
    """
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path, w_path = folder / "config.json", folder / "model.safetensors"
    for p in (cfg_path, w_path):
        if not p.exists():
            raise FileNotFoundError(f"{p}: missing; is {folder} an exported draft (draftlab export)?")
    raw = json.loads(cfg_path.read_text())
    config = config_from_dict(raw)
    if config.vocab_size != target.vocab_size or config.hidden_size != target.hidden_size:
        raise ValueError(
            f"{cfg_path}: draft (hidden_size={config.hidden_size}, vocab_size={config.vocab_size}) "
            f"does not fit target {target.name} (hidden_size={target.hidden_size}, vocab_size={target.vocab_size})"
        )
    draft = Eagle3Draft(config, target.model.get_input_embeddings())
    state, skipped = _sglang_state(load_file(str(w_path)), draft.state_dict().keys(), w_path)
    missing, _ = draft.load_state_dict(state, strict=False)
    if missing or skipped:
        raise ValueError(f"{w_path}: missing tensors {missing}, unexpected tensors {skipped}")
    dtype = target.dtype if isinstance(target.dtype, torch.dtype) else getattr(torch, str(target.dtype))
    draft.to(device=target.device)
    for p in draft.parameters():
        p.data = p.data.to(dtype)
    return draft.eval()


def _sglang_state(tensors: dict, contract_names, where) -> tuple[dict, list[str]]:
    """The file's tensors under the contract names SGLang 0.5.17 loads them as (model.contract.sglang_loads_as:
    one rule for the loader, the doctor and here), and the names it would skip."""
    state, skipped = {}, []
    for name, tensor in tensors.items():
        contract = sglang_loads_as(name, contract_names)
        if contract is None:
            skipped.append(name)
        elif contract in state:
            raise ValueError(f"{where}: two tensors load as {contract} (one is {name})")
        else:
            state[contract] = tensor
    return state, skipped


def config_from_dict(raw: dict) -> LlamaConfig:
    """LlamaConfig from an exported config.json, keeping draft_vocab_size and eagle_config."""
    raw = dict(raw)
    if "rope_parameters" not in raw and "rope_theta" in raw:
        scaling = raw.get("rope_scaling") or {}
        raw["rope_parameters"] = {
            "rope_type": scaling.get("rope_type", scaling.get("type", "default")),
            **scaling,
            "rope_theta": raw["rope_theta"],
        }
    legacy = (
        "rope_theta",
        "rope_scaling",
        "architectures",
        "model_type",
        "transformers_version",
        "torch_dtype",
        "dtype",
    )
    for k in legacy:
        raw.pop(k, None)
    layers = capture_layers_from_config(raw)
    deepseek = recorded_deepseek(raw)
    eagle = dict(raw.pop("eagle_config", None) or {})
    raw.pop("draftlab", None)
    if layers is not None:
        eagle["eagle_aux_hidden_state_layer_ids"] = layers  # in memory: hidden_states indices
    dvs = raw.pop("draft_vocab_size", None) or raw["vocab_size"]
    cfg = LlamaConfig(**raw)
    cfg.architectures = ["LlamaForCausalLMEagle3"]
    cfg.draft_vocab_size = int(dvs)
    cfg.eagle_config = eagle
    if deepseek:
        cfg.capture_convention = "deepseek"
    return cfg
