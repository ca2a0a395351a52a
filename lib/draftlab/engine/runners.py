"""The pieces one speculative cycle runs on: slot KV caches, masks, CUDA graphs, and the two runners.

TargetRunner verifies a block of drafted tokens against the target; DraftRunner extends the
EAGLE-3 draft from captured target states. Both keep preallocated caches so a cycle allocates
nothing and can be captured as a CUDA graph.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from draftlab.model.target import text_config

MODES = ("EAGLE3", "EAGLE")
TREE_ATTENTION = ("sglang", "ancestors")  # SpecConfig.draft_tree_attention


@dataclass
class SpecConfig:
    mode: str = "EAGLE3"
    num_steps: int = 3  # S: draft steps (tree depth)
    topk: int = 1  # K: 1 = chain
    num_draft_tokens: int | None = None  # D: verified tokens incl. the root; chain forces S + 1
    max_new_tokens: int = 128
    cuda_graphs: bool | None = None  # None: on when the target is on CUDA
    # Pad each prompt's prefill to a multiple of this many tokens, so that a few CUDA graphs serve
    # every prompt: an eager prefill is a visible share of a short decode (dev/LOG.md,
    # "graphed prefill"). The padding's KV lands in slots that the mask hides until a later step
    # overwrites them. None: 64 on CUDA, 0 (exact lengths) elsewhere.
    prefill_bucket: int | None = None
    # Which earlier draft tokens a tree step's beams attend to (topk > 1). "sglang": beam j sees
    # the KV written by beam slot j at the earlier steps, whichever beam held that slot, as
    # SGLang's draft decode reads it (its kv indices are per slot; the KV is not reordered when
    # the next beams are chosen). "ancestors": each beam sees its own ancestors (exact tree
    # attention; not what SGLang measures). dev/LOG.md, "tree gap".
    draft_tree_attention: str = "sglang"

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.draft_tree_attention not in TREE_ATTENTION:
            raise ValueError(f"draft_tree_attention must be one of {TREE_ATTENTION}, got {self.draft_tree_attention!r}")
        if self.num_steps < 1 or self.topk < 1:
            raise ValueError("num_steps and topk must be >= 1")
        if self.topk == 1:
            self.num_draft_tokens = self.num_steps + 1  # as SGLang forces
        elif not self.num_draft_tokens or self.num_draft_tokens < 2:
            raise ValueError("num_draft_tokens (>= 2) is required when topk > 1")
        max_nodes = self.topk + (self.num_steps - 1) * self.topk * self.topk
        if self.topk > 1 and self.num_draft_tokens - 1 > max_nodes:
            raise ValueError(
                f"num_draft_tokens - 1 = {self.num_draft_tokens - 1} exceeds the {max_nodes} "
                f"nodes a tree of topk {self.topk} and {self.num_steps} steps can hold"
            )

    def slots_after_root(self) -> int:
        """Cache slots a cycle writes from the root on: the verify's D, or the tree's beams
        ((S - 1) x K slots after the root), whichever is more."""
        return max(self.num_draft_tokens, 1 + (self.num_steps - 1) * self.topk)


# --------------------------------------------------------------------------- caches and masks


class SlotCache:
    """KV buffers [1, kv_heads, max_len, head_dim] per layer, written at `self.slots` ([L] long).

    Quacks like a transformers Cache for the attention layers (`update` returns the whole
    buffers); which slots are visible is decided by the explicit 4D mask, never by a length.
    """

    is_compileable = True

    def __init__(self, n_layers: int, kv_heads: int, head_dim: int, max_len: int, dtype, device):
        shape = (1, kv_heads, max_len, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(n_layers)]
        self.max_len = max_len
        self.slots: torch.Tensor | None = None
        self.length = 0  # informational only (some model code asks for it)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.keys[layer_idx].index_copy_(2, self.slots, key_states)
        self.values[layer_idx].index_copy_(2, self.slots, value_states)
        return self.keys[layer_idx], self.values[layer_idx]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    def get_mask_sizes(self, *args, **kwargs):
        return self.max_len, 0

    def move(self, src: list[int], dst: list[int]) -> None:
        """Copy the KV of slots `src` to slots `dst` (tree verify: compact the accepted path)."""
        device = self.keys[0].device
        s = torch.tensor(src, device=device)
        d = torch.tensor(dst, device=device)
        for buf in self.keys + self.values:
            buf.index_copy_(2, d, buf.index_select(2, s))


def build_mask(base: torch.Tensor, anc: torch.Tensor, max_len: int, dtype) -> torch.Tensor:
    """[1,1,L,max_len] mask for L new tokens at slots base..base+L-1.

    Slots below `base` (the committed prefix) are visible to all; among the new slots, query i
    sees slot j when anc[i, j] (ancestor-or-self: lower-triangular for a chain, the tree
    otherwise). Bool (True = visible) when dtype is torch.bool, else additive float.
    base: [1] long tensor, anc: [L,L] bool tensor (device tensors, so this is graph-capturable).
    """
    n_new = anc.shape[0]
    rel = torch.arange(max_len, device=anc.device) - base  # [M]
    in_new = (rel >= 0) & (rel < n_new)
    vis = (rel < 0)[None, :] | (in_new[None, :] & anc[:, rel.clamp(0, n_new - 1)])  # [L,M]
    if dtype == torch.bool:
        return vis[None, None]
    zero = torch.zeros((), dtype=dtype, device=anc.device)
    return torch.where(vis, zero, torch.finfo(dtype).min)[None, None]


class Graphed:
    """A CUDA graph of `fn(*inputs)` with static input buffers; call copies inputs in and replays."""

    def __init__(self, fn, inputs, pool=None):
        self.inputs = [x.clone() for x in inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm-up (allocations, lazy inits) outside the graph
                fn(*self.inputs)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.outputs = fn(*self.inputs)

    def __call__(self, *inputs):
        for buf, x in zip(self.inputs, inputs):
            if buf.data_ptr() != x.data_ptr():
                buf.copy_(x)
        self.graph.replay()
        return self.outputs


def _maybe_graphed(graphs: dict, fn, inputs: tuple, graph: bool):
    """fn(*inputs), or the replay of fn's CUDA graph for this many new tokens (captured on first use)."""
    if not graph:
        return fn(*inputs)
    n_new = inputs[0].shape[1]
    if n_new not in graphs:
        graphs[n_new] = Graphed(fn, list(inputs))
    return graphs[n_new](*inputs)


# --------------------------------------------------------------------------- target


def _cache_kwarg(model) -> str:
    """transformers >= 5.2x names the cache argument `cache`, older ones `past_key_values`."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


class TargetRunner:
    """The target over a SlotCache: step(ids, positions, base, anc) -> (argmax [L], features [L,F])."""

    def __init__(self, target, feature: str, max_len: int, layers: list[int] | None = None):
        """feature: "aux" (three captured layers, [L,3H]; `layers` default to the target's SGLang
        default) or "final" (the target's final hidden state after its norm, as SGLang's EAGLE sends it, [L,H])."""
        self.target = target
        self.model = target.model
        cfg = text_config(self.model.config)
        self.n_layers = cfg.num_hidden_layers
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        self.dtype = next(self.model.parameters()).dtype
        self.device = next(self.model.parameters()).device
        self.max_len = max_len
        self.cache = SlotCache(self.n_layers, kv_heads, head_dim, max_len, self.dtype, self.device)
        self.cache_kw = _cache_kwarg(self.model)
        self.feature = feature
        self.layers = list(layers or target.capture_layers) if feature == "aux" else []
        self.width = cfg.hidden_size * (len(self.layers) if feature == "aux" else 1)  # F of the features [L,F]
        self._captured: dict = {}
        base = getattr(self.model, "model", self.model)
        self._hooks = [base.layers[i].register_forward_pre_hook(self._pre_hook(i)) for i in self.layers]
        if feature == "final":
            self._hooks.append(
                base.norm.register_forward_hook(lambda mod, args, out: self._captured.__setitem__("final", out))
            )
        self.lm_head = self.model.get_output_embeddings()
        self.graphs: dict[int, Graphed] = {}

    def _pre_hook(self, i):
        def hook(module, args, kwargs=None):
            self._captured[i] = args[0] if args else kwargs["hidden_states"]

        return hook

    def close(self):
        for h in self._hooks:
            h.remove()

    def _forward(self, ids, pos, base, anc):
        """ids [1,L], pos [1,L], base [1], anc [L,L] -> (argmax [L], features [L,F])."""
        n_new = ids.shape[1]
        self.cache.slots = base + torch.arange(n_new, device=ids.device)
        mask = build_mask(base, anc, self.max_len, self.dtype)
        self._captured.clear()
        out = self.model(
            input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True, **{self.cache_kw: self.cache}
        )
        greedy = out.logits[0].argmax(-1)  # [L]
        if self.feature == "aux":
            feats = torch.cat([self._captured[i] for i in self.layers], dim=-1)[0]  # [L,3H]
        else:
            feats = self._captured["final"][0]  # [L,H]
        return greedy, feats

    def step(self, ids, pos, base, anc, graph: bool = False):
        return _maybe_graphed(self.graphs, self._forward, (ids, pos, base, anc), graph)


# --------------------------------------------------------------------------- draft


class DraftRunner:
    """The draft over a SlotCache, in the server mode's wiring (see module docstring)."""

    def __init__(self, draft, target, config: SpecConfig, max_len: int):
        self.draft = draft
        self.mode, self.steps, self.topk = config.mode, config.num_steps, config.topk
        self.num_draft_tokens = config.num_draft_tokens
        self.ancestors_only = config.draft_tree_attention == "ancestors"
        self.max_len = max_len
        cfg = draft.config
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        self.dtype = next(draft.parameters()).dtype
        self.device = next(draft.parameters()).device
        self.cache = SlotCache(1, kv_heads, head_dim, max_len, self.dtype, self.device)
        self.target_head = target.model.get_output_embeddings()
        self.graphs: dict[int, Graphed] = {}
        self.extend_graphs: dict[int, Graphed] = {}  # the prompt's bucketed prefill (no drafting)
        self._tri1 = torch.ones(1, 1, dtype=torch.bool, device=self.device)

    @property
    def feature(self) -> str:
        """Which target feature this mode feeds: the three layers only for EAGLE3 with an fc."""
        return "aux" if (self.mode == "EAGLE3" and self.draft.use_aux) else "final"

    def hidden_in(self, feats):
        """Target features [..,F] -> the draft's hidden input [..,H] (fc skipped in EAGLE mode)."""
        if self.mode == "EAGLE3":
            return self.draft.project(feats)
        return feats.to(self.dtype)

    def probs(self, logits, hidden_out):
        """Probabilities over the vocabulary this mode drafts from (fp32 softmax, as SGLang's
        renorm_draft_probs), and whether ids need d2t."""
        if self.mode == "EAGLE3":
            return torch.softmax(logits.float(), dim=-1), True
        head_logits = self.target_head(self.draft.norm(hidden_out).to(self.target_head.weight.dtype))
        return torch.softmax(head_logits.float(), dim=-1), False

    def pick(self, logits, hidden_out):
        """Greedy draft token as a target id: [..] long."""
        if self.mode == "EAGLE3":
            return self.draft.to_target_ids(logits.argmax(-1))
        return self.target_head(self.draft.norm(hidden_out).to(self.target_head.weight.dtype)).argmax(-1)

    def to_target(self, ids, mapped: bool):
        return self.draft.to_target_ids(ids) if mapped else ids

    def forward(self, ids, hidden, pos, slots, mask):
        """One draft pass: ids [1,L], hidden [1,L,H], pos [1,L], slots [L], mask bool [1,1,L,M]."""
        self.cache.slots = slots
        logits, hidden_out, _ = self.draft(ids, hidden, pos, past_key_values=self.cache, attention_mask=mask)
        return logits, hidden_out

    def _extend(self, ids, feats, base, anc):
        """Write the draft's KV for L committed tokens at draft positions base..base+L-1.

        ids [1,L] (token p+1 at draft position p), feats [1,L,F] target features of tokens
        base..base+L-1. Returns (logits [1,L,V*], hidden_out [1,L,H])."""
        pos = (base + torch.arange(ids.shape[1], device=ids.device))[None]  # [1,L]
        mask = build_mask(base, anc, self.max_len, torch.bool)
        return self.forward(ids, self.hidden_in(feats), pos, pos[0], mask)

    def extend(self, ids, feats, base, anc, graph: bool = False):
        """`_extend` alone: the prompt's prefill, in buckets of padded lengths when graphed."""
        return _maybe_graphed(self.extend_graphs, self._extend, (ids, feats, base, anc), graph)

    def _extend_and_chain(self, ids, feats, base, anc):
        """Extend over L committed tokens (see `_extend`), then chain S - 1 steps.

        Returns the S draft tokens [S] (target ids)."""
        n_new = ids.shape[1]
        logits, hidden_out = self._extend(ids, feats, base, anc)
        tok = self.pick(logits[:, -1:], hidden_out[:, -1:])  # [1,1]
        hidden = hidden_out[:, -1:]
        toks = [tok]
        p = base + n_new - 1
        for _ in range(self.steps - 1):
            p = p + 1
            mask = build_mask(p, self._tri1, self.max_len, torch.bool)
            logits, hidden = self.forward(tok, hidden, p[None], p, mask)
            tok = self.pick(logits, hidden)
            toks.append(tok)
        return torch.cat(toks, dim=1)[0]  # [S]

    def chain(self, ids, feats, base, anc, graph: bool = False):
        return _maybe_graphed(self.graphs, self._extend_and_chain, (ids, feats, base, anc), graph)

    def _extend_and_grow(self, ids, feats, base, anc):
        """Extend over L committed tokens, then grow and select a tree (tree mode).

        Tensor operations only, so that one CUDA graph holds the whole drafting of a cycle.
        Returns the D - 1 drafted nodes, parents first: tokens [D-1] (target ids), depths [D-1]
        (1 = child of the root), and for the verify list [root] + nodes: parents [D] (list index
        of each entry's parent; the root is its own) and anc [D,D] (ancestor-or-self mask)."""
        logits, hidden_out = self._extend(ids, feats, base, anc)
        return self._grow(logits[0, -1], hidden_out[0, -1], base + ids.shape[1])

    def _grow(self, logits, hidden, m):
        """SGLang's expansion from the root at position m ([1] tensor): S steps, each feeding the K
        best beams (by cumulative probability, a product as SGLang's select_top_k_tokens) at fresh
        slots after m and keeping their top K children; then the D - 1 best nodes.

        Beam slot j of step i is written at m + i K + j. A beam sees the prefix and, with
        draft_tree_attention "sglang", the slots j of the steps up to its own (SGLang's per-slot
        kv indices: the slot's earlier tokens, which are the beam's ancestors only when the slot
        kept its lineage), or with "ancestors" its own ancestors' slots."""
        k, dev = self.topk, hidden.device
        cols = torch.arange(self.max_len, device=dev)
        p, mapped = self.probs(logits, hidden)  # [V*]
        top = p.topk(k)
        tokens, scores = [self.to_target(top.indices, mapped)], [top.values]
        parents, depths = [torch.full((k,), -1, device=dev)], [torch.ones(k, dtype=torch.long, device=dev)]
        beams = torch.arange(k, device=dev)  # node index of each beam
        beam_tokens, beam_scores = tokens[0], scores[0]  # [K] each
        beam_hidden = hidden[None].expand(k, -1)  # [K,H]: the draft output that predicted each beam
        vis = (cols < m)[None].expand(k, -1)  # [K,M]: slots each beam sees (prefix, then earlier steps)
        n_nodes = k
        for depth in range(2, self.steps + 1):
            slots = m + (depth - 2) * k + torch.arange(k, device=dev)  # [K]
            vis = vis | (cols[None] == slots[:, None])
            lg, hid = self.forward(
                beam_tokens[None], beam_hidden[None], (m + depth - 2).expand(k)[None], slots, vis[None, None]
            )
            p, mapped = self.probs(lg[0], hid[0])  # [K,V*]
            top = p.topk(k, dim=-1)
            cand = (beam_scores[:, None] * top.values).flatten()  # [K*K] cumulative scores of the children
            tokens.append(self.to_target(top.indices, mapped).flatten())
            scores.append(cand)
            parents.append(beams[:, None].expand(k, k).flatten())  # row r's children have parent beams[r]
            depths.append(torch.full((k * k,), depth, device=dev))
            best = cand.topk(k).indices  # [K] the next beams, among the K*K children
            beams = n_nodes + best
            beam_tokens, beam_scores = tokens[-1][best], cand[best]
            beam_hidden = hid[0, best // k]  # SGLang gathers the hidden states by parent too
            if self.ancestors_only:
                vis = vis[best // k]
            n_nodes += k * k
        return self._select(torch.cat(tokens), torch.cat(scores), torch.cat(parents), torch.cat(depths))

    def _select(self, tokens, scores, parents, depths):
        """The D - 1 best nodes by score, in node order (parents first), with the verify list's
        parents and ancestor mask: SGLang's organize_draft_results (top D - 1 of the raw scores,
        sorted by index). Scores are products of probabilities, so a child never outscores its
        parent; the stable sort ranks an equal-scored parent (its index is lower) first, so the
        chosen nodes always include their ancestors."""
        d, n = self.num_draft_tokens, tokens.numel()
        chosen = torch.sort(scores, descending=True, stable=True).indices[: d - 1]
        chosen = chosen.sort().values  # [D-1] node order: by depth, parents first
        index = torch.zeros(n, dtype=torch.long, device=tokens.device)
        index.index_copy_(0, chosen, torch.arange(1, d, device=tokens.device))  # node -> its place in the verify list
        par = parents[chosen]
        par = torch.where(par < 0, torch.zeros_like(par), index[par.clamp(min=0)])  # the root's children: 0
        par = torch.cat([par.new_zeros(1), par])  # [D], the root first
        anc = torch.eye(d, dtype=torch.bool, device=tokens.device)
        cur = torch.arange(d, device=tokens.device)
        for _ in range(self.steps):  # device ops only (no host values), so that it can be captured
            cur = par[cur]
            anc.scatter_(1, cur[:, None], True)
        return tokens[chosen], depths[chosen], par, anc

    def grow(self, ids, feats, base, anc, graph: bool = False):
        return _maybe_graphed(self.graphs, self._extend_and_grow, (ids, feats, base, anc), graph)
