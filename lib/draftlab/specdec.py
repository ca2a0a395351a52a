"""Reference speculative-decoding engine: a transformers target + a draftlab draft, batch 1, greedy.

Why it exists: to measure acceptance length and speedup of a draft without a GPU server, and to
prove the draft/target plumbing lossless (at temperature 0 the emitted tokens must equal the
target's own greedy decoding).

Both models keep their KV in preallocated slot buffers (`SlotCache`) addressed by explicit
positions, with explicit 4D masks, so one code path serves the prefill, chain verify, tree verify
(tree attention mask) and drafting, on CPU eagerly and on CUDA as captured CUDA graphs (the
embedded target is launch-bound on a GPU). Tree drafting (growth, selection, ancestor mask) is
tensor operations only, so a cycle is one draft graph and one verify graph in both modes.

Semantics mirror SGLang's EAGLE worker:
  * chain (topk 1, S steps): S draft tokens per cycle, verify S + 1 tokens.
  * tree (topk K, S steps, D draft tokens): each step expands the K best beams by their top K
    children; the D - 1 best nodes by cumulative log-probability (plus the root) are verified
    with a tree attention mask.
  * mode "EAGLE3": the draft as trained (three captured layers through fc, or the final hidden
    state for an EAGLE-1-style draft), draft lm_head + d2t.
    mode "EAGLE": what `--speculative-algorithm EAGLE` does to any draft: the target's final
    hidden state, fc skipped, the target's lm_head over the full vocabulary, no d2t.
Acceptance length = sum(completion tokens) / sum(verify steps), the contract's §5 definition
(the first token, produced by the prefill, is in the numerator as in SGLang's meta_info).
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import time
import warnings
import weakref
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch

from draftlab.hidden import draft_layers

MODES = ("EAGLE3", "EAGLE")


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
        cfg = self.model.config.get_text_config()
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
            self._hooks.append(base.norm.register_forward_hook(
                lambda mod, args, out: self._captured.__setitem__("final", out)))
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
        out = self.model(input_ids=ids, position_ids=pos, attention_mask=mask, use_cache=True,
                         **{self.cache_kw: self.cache})
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

    def logprobs(self, logits, hidden_out):
        """Scores over the vocabulary this mode drafts from, and whether ids need d2t."""
        if self.mode == "EAGLE3":
            return torch.log_softmax(logits.float(), dim=-1), True
        head_logits = self.target_head(self.draft.norm(hidden_out).to(self.target_head.weight.dtype))
        return torch.log_softmax(head_logits.float(), dim=-1), False

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
        """SGLang-style expansion from the root at position m ([1] tensor): S steps, each feeding the
        K best beams (by cumulative log-probability) at fresh slots after m, each beam seeing the
        prefix and its own ancestors, and keeping their top K children; then the D - 1 best nodes."""
        k, dev = self.topk, hidden.device
        cols = torch.arange(self.max_len, device=dev)
        lp, mapped = self.logprobs(logits, hidden)  # [V*]
        top = lp.topk(k)
        tokens, scores = [self.to_target(top.indices, mapped)], [top.values]
        parents, depths = [torch.full((k,), -1, device=dev)], [torch.ones(k, dtype=torch.long, device=dev)]
        beams = torch.arange(k, device=dev)  # node index of each beam
        beam_tokens, beam_scores = tokens[0], scores[0]  # [K] each
        beam_hidden = hidden[None].expand(k, -1)  # [K,H]: the draft output that predicted each beam
        vis = (cols < m)[None].expand(k, -1)  # [K,M]: slots each beam sees (prefix, then ancestors)
        n_nodes = k
        for depth in range(2, self.steps + 1):
            slots = m + (depth - 2) * k + torch.arange(k, device=dev)  # [K]
            vis = vis | (cols[None] == slots[:, None])
            lg, hid = self.forward(beam_tokens[None], beam_hidden[None], (m + depth - 2).expand(k)[None],
                                   slots, vis[None, None])
            lp, mapped = self.logprobs(lg[0], hid[0])  # [K,V*]
            top = lp.topk(k, dim=-1)
            cand = (beam_scores[:, None] + top.values).flatten()  # [K*K] cumulative scores of the children
            tokens.append(self.to_target(top.indices, mapped).flatten())
            scores.append(cand)
            parents.append(beams[:, None].expand(k, k).flatten())  # row r's children have parent beams[r]
            depths.append(torch.full((k * k,), depth, device=dev))
            best = cand.topk(k).indices  # [K] the next beams, among the K*K children
            beams = n_nodes + best
            beam_tokens, beam_scores = tokens[-1][best], cand[best]
            beam_hidden = hid[0, best // k]
            vis = vis[best // k]
            n_nodes += k * k
        return self._select(torch.cat(tokens), torch.cat(scores), torch.cat(parents), torch.cat(depths))

    def _select(self, tokens, scores, parents, depths):
        """The D - 1 best nodes by score, parents first, with the verify list's parents and ancestor
        mask. Log-probabilities are <= 0 and the depth term breaks ties, so a child never outranks
        its parent: the chosen nodes always include their ancestors."""
        d, n = self.num_draft_tokens, tokens.numel()
        chosen = (scores - 1e-3 * depths).topk(d - 1).indices
        chosen = chosen[torch.argsort(depths[chosen] * n + chosen)]  # [D-1] by depth: parents first
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


# --------------------------------------------------------------------------- results

@dataclass
class PromptResult:
    """One prompt's decode: tokens emitted (first from the prefill), verify steps, timings."""

    tokens: list[int]
    verify_steps: int = 0
    accepted: list[int] = field(default_factory=list)  # draft tokens accepted per verify step
    prefill_s: float = 0.0
    decode_s: float = 0.0


def _tril(n: int, device) -> torch.Tensor:
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()


def _sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _stop_at(tokens: list[int], eos: set[int], limit: int) -> tuple[list[int], bool]:
    """Cut at the first EOS (kept) or at `limit` tokens; True when decoding is finished."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: min(i + 1, limit)], True
    return tokens[:limit], len(tokens) >= limit


# --------------------------------------------------------------------------- the engine

@dataclass
class SpecConfig:
    mode: str = "EAGLE3"
    num_steps: int = 3  # S: draft steps (tree depth)
    topk: int = 1  # K: 1 = chain
    num_draft_tokens: int | None = None  # D: verified tokens incl. the root; chain forces S + 1
    max_new_tokens: int = 128
    cuda_graphs: bool | None = None  # None: on when the target is on CUDA
    # Pad each prompt's prefill to a multiple of this many tokens, so that a few CUDA graphs serve
    # every prompt (on the H200 the embedded target's eager prefill took 21 ms a prompt, 4% of a
    # 128-token greedy decode and 9% of a speculative one; graphed, 4.8 ms). The padding's KV lands
    # in slots that the mask hides until a later step overwrites them. None: 64 on CUDA, 0
    # (exact lengths) elsewhere.
    prefill_bucket: int | None = None

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.num_steps < 1 or self.topk < 1:
            raise ValueError("num_steps and topk must be >= 1")
        if self.topk == 1:
            self.num_draft_tokens = self.num_steps + 1  # as SGLang forces
        elif not self.num_draft_tokens or self.num_draft_tokens < 2:
            raise ValueError("num_draft_tokens (>= 2) is required when topk > 1")
        max_nodes = self.topk + (self.num_steps - 1) * self.topk * self.topk
        if self.topk > 1 and self.num_draft_tokens - 1 > max_nodes:
            raise ValueError(f"num_draft_tokens - 1 = {self.num_draft_tokens - 1} exceeds the {max_nodes} "
                             f"nodes a tree of topk {self.topk} and {self.num_steps} steps can hold")

    def slots_after_root(self) -> int:
        """Cache slots a cycle writes from the root on: the verify's D, or the tree's beams
        ((S - 1) x K slots after the root), whichever is more."""
        return max(self.num_draft_tokens, 1 + (self.num_steps - 1) * self.topk)


class SpecEngine:
    """Greedy and speculative decoding of one prompt at a time over the same target runner."""

    def __init__(self, target, draft=None, config: SpecConfig | None = None, max_len: int = 1024):
        self.target = target
        self.draft = draft
        self.cfg = config or SpecConfig()
        self.device = next(target.model.parameters()).device
        graphs = self.cfg.cuda_graphs
        self.use_graphs = (self.device.type == "cuda") if graphs is None else bool(graphs)
        bucket = self.cfg.prefill_bucket
        self.prefill_bucket = (64 if self.device.type == "cuda" else 0) if bucket is None else bucket
        self.eos = set(target.eos_token_ids)
        max_len = -(-max_len // 64) * 64  # aligned rows keep SDPA on its fused kernels
        self.max_len = max_len
        self.draft_runner = DraftRunner(draft, target, self.cfg, max_len) if draft else None
        feature = self.draft_runner.feature if self.draft_runner else "aux"
        layers = draft_layers(target, draft) if draft is not None else None  # what the draft was trained on
        self.runner = TargetRunner(target, feature, max_len, layers)
        self._trils: dict[int, torch.Tensor] = {}
        self.graph_error = ""  # why CUDA graphs were turned off, if they were

    def close(self):
        self.runner.close()

    @torch.inference_mode()
    def capture(self, prompt_lengths=()) -> None:
        """Capture every CUDA graph the decode loops replay, before any prompt (the dummy writes
        land in slots that the next prefill overwrites before anything can see them), and the
        bucketed prefills of prompts of these lengths, so that no capture lands in a timed run."""
        if not self.use_graphs:
            return
        zeros = lambda n: torch.zeros(1, n, dtype=torch.long, device=self.device)  # noqa: E731
        arange = lambda n: torch.arange(n, device=self.device)[None]  # noqa: E731
        feats = lambda n: torch.zeros(1, n, self.runner.width, dtype=self.runner.dtype, device=self.device)  # noqa: E731
        base = self._t([0])
        self.runner.step(zeros(1), zeros(1), base, self._tril(1), graph=True)
        for size in sorted({self._prefill_size(n) for n in prompt_lengths}):
            if self._prefill_graphed(size):
                self.runner.step(zeros(size), arange(size), base, self._tril(size), graph=True)
        if self.draft_runner is None:
            return
        s_steps, d = self.cfg.num_steps, self.cfg.num_draft_tokens  # the verify: D tokens (S + 1 for a chain)
        self.runner.step(zeros(d), arange(d), base, self._tril(d), graph=True)
        draft = self.draft_runner.chain if self.cfg.topk == 1 else self.draft_runner.grow
        for n in range(1, s_steps + 2):  # a cycle accepts 0..S tokens: the draft extends over 1..S + 1
            draft(zeros(n), feats(n), base, self._tril(n), graph=True)
        for size in sorted({self._prefill_size(n - 1) for n in prompt_lengths if n > 1}):
            if self._prefill_graphed(size):
                self.draft_runner.extend(zeros(size), feats(size), base, self._tril(size), graph=True)
        _sync(self.device)

    # ---- helpers
    def _t(self, values, dtype=torch.long):
        return torch.tensor(values, dtype=dtype, device=self.device)

    def _tril(self, n: int) -> torch.Tensor:
        """Cached lower-triangular [n,n] bool (a chain's ancestor mask)."""
        if n not in self._trils:
            self._trils[n] = _tril(n, self.device)
        return self._trils[n]

    def _check_len(self, n_prompt: int):
        need = n_prompt + self.cfg.max_new_tokens + self.cfg.slots_after_root() + 2
        if need > self.max_len:
            raise ValueError(f"prompt of {n_prompt} tokens + {self.cfg.max_new_tokens} new needs a cache of "
                             f"{need} slots; the engine was built with max_len={self.max_len}")

    def _prefill_size(self, n: int) -> int:
        """Tokens the prefill of n tokens runs: n rounded up to the bucket (n when off or too long)."""
        if not self.prefill_bucket:
            return n
        size = -(-n // self.prefill_bucket) * self.prefill_bucket
        return size if size <= self.max_len else n

    def _prefill_graphed(self, size: int) -> bool:
        return self.use_graphs and bool(self.prefill_bucket) and size % self.prefill_bucket == 0

    def _prefill_plan(self, n: int):
        """(size, graphed, anc [size,size]) of a prefill over n tokens."""
        size = self._prefill_size(n)
        graphed = self._prefill_graphed(size)
        anc = self._tril(size) if graphed else _tril(size, self.device)  # buckets are few; exact lengths many
        return size, graphed, anc

    def _padded(self, values: list[int], size: int) -> torch.Tensor:
        """[1,size] ids: values, then token 0 as padding (its slots are never visible)."""
        return self._t([values + [0] * (size - len(values))])

    def _prefill(self, prompt_ids: list[int]):
        """Target prefill: returns (first token, features [n,F])."""
        n = len(prompt_ids)
        size, graphed, anc = self._prefill_plan(n)
        greedy, feats = self.runner.step(self._padded(prompt_ids, size), self._t([list(range(size))]), self._t([0]),
                                         anc, graph=graphed)
        return int(greedy[n - 1]), feats[:n]

    def _draft_prefill(self, prompt_ids: list[int], root: int, feats):
        """The draft over the prompt: extend over its first n - 1 positions (bucketed like the
        target's prefill), then the cycle's own graphed step over the last one, which drafts.
        Draft position p holds token p + 1 (the root at n - 1) with the target's features of token p."""
        n = len(prompt_ids)
        if n > 1:
            size, graphed, anc = self._prefill_plan(n - 1)
            pad = torch.zeros(size - (n - 1), feats.shape[-1], dtype=feats.dtype, device=self.device)
            self.draft_runner.extend(self._padded(prompt_ids[1:], size), torch.cat([feats[: n - 1], pad])[None],
                                     self._t([0]), anc, graph=graphed)
        draft = self.draft_runner.chain if self.cfg.topk == 1 else self.draft_runner.grow
        return draft(self._t([[root]]), feats[None, n - 1:], self._t([n - 1]), self._tril(1), graph=self.use_graphs)

    # ---- plain greedy
    @torch.inference_mode()
    def greedy(self, prompt_ids: list[int]) -> PromptResult:
        """The target's own greedy decoding, one token per forward (the speedup baseline)."""
        self._check_len(len(prompt_ids))
        limit = self.cfg.max_new_tokens
        t0 = time.perf_counter()
        first, _ = self._prefill(prompt_ids)
        _sync(self.device)
        t1 = time.perf_counter()
        tokens = [first]
        m = len(prompt_ids)
        anc = self._tril(1)
        ids = self._t([[first]])
        pos, base = self._t([[m]]), self._t([m])
        done = first in self.eos or limit <= 1
        while not done:
            greedy, _ = self.runner.step(ids, pos, base, anc, graph=self.use_graphs)
            tok = int(greedy[0])  # host sync: EOS check
            tokens.append(tok)
            m += 1
            done = tok in self.eos or len(tokens) >= limit
            ids.fill_(tok)
            pos.fill_(m)
            base.fill_(m)
        _sync(self.device)
        t2 = time.perf_counter()
        return PromptResult(tokens=tokens, verify_steps=len(tokens) - 1, prefill_s=t1 - t0, decode_s=t2 - t1)

    # ---- speculative
    @torch.inference_mode()
    def speculative(self, prompt_ids: list[int]) -> PromptResult:
        if self.draft_runner is None:
            raise ValueError("speculative decoding needs a draft")
        self._check_len(len(prompt_ids))
        if self.cfg.topk == 1:
            return self._chain(prompt_ids)
        return self._tree(prompt_ids)

    def _chain(self, prompt_ids: list[int]) -> PromptResult:
        """Chain drafting: S draft tokens per cycle, one verify of S + 1 tokens."""
        s_steps, limit, dev = self.cfg.num_steps, self.cfg.max_new_tokens, self.device
        graphs = self.use_graphs
        t0 = time.perf_counter()
        n = len(prompt_ids)
        root, feats = self._prefill(prompt_ids)
        drafted = self._draft_prefill(prompt_ids, root, feats)
        _sync(dev)
        t1 = time.perf_counter()
        res = PromptResult(tokens=[root], prefill_s=t1 - t0)
        m = n  # position of the root (the last emitted token, not yet in the target cache)
        verify_anc = self._tril(s_steps + 1)
        v_ids = torch.empty(1, s_steps + 1, dtype=torch.long, device=dev)
        v_pos = torch.empty(1, s_steps + 1, dtype=torch.long, device=dev)
        base = self._t([m])
        offsets = torch.arange(s_steps + 1, device=dev)
        done = root in self.eos or limit <= 1
        while not done:
            v_ids[0, 0] = root
            v_ids[0, 1:] = drafted
            base.fill_(m)
            torch.add(offsets, base, out=v_pos[0])
            greedy, vfeats = self.runner.step(v_ids, v_pos, base, verify_anc, graph=graphs)
            both = torch.cat([greedy, drafted]).tolist()  # the one host sync of the cycle
            g, d = both[: s_steps + 1], both[s_steps + 1:]
            a = 0
            while a < s_steps and d[a] == g[a]:
                a += 1
            res.verify_steps += 1
            res.accepted.append(a)
            emitted, done = _stop_at(g[: a + 1], self.eos, limit - len(res.tokens))
            res.tokens += emitted
            if done:
                break
            # commit: target slots m..m+a hold root, d_1..d_a; the draft re-extends them with
            # the target's features (ids = tokens m+1..m+a+1 = g[0..a]).
            self.draft_runner.cache.length = m
            drafted = self.draft_runner.chain(greedy[None, : a + 1], vfeats[None, : a + 1], base,
                                              self._tril(a + 1), graph=graphs)
            root = g[a]
            m += a + 1
        _sync(dev)
        res.decode_s = time.perf_counter() - t1
        return res

    def _tree(self, prompt_ids: list[int]) -> PromptResult:
        """Tree drafting (topk K, S steps, D verified tokens): one draft and one verify pass a cycle."""
        d, limit, dev = self.cfg.num_draft_tokens, self.cfg.max_new_tokens, self.device
        graphs = self.use_graphs
        t0 = time.perf_counter()
        n = len(prompt_ids)
        root, feats = self._prefill(prompt_ids)
        tree = self._draft_prefill(prompt_ids, root, feats)
        _sync(dev)
        t1 = time.perf_counter()
        res = PromptResult(tokens=[root], prefill_s=t1 - t0)
        m = n
        v_ids = torch.empty(1, d, dtype=torch.long, device=dev)
        v_pos = torch.empty(1, d, dtype=torch.long, device=dev)
        base = self._t([m])
        done = root in self.eos or limit <= 1
        while not done:
            tokens_t, depths_t, parents_t, anc = tree
            v_ids[0, 0] = root
            v_ids[0, 1:] = tokens_t
            base.fill_(m)
            v_pos[0, 0] = m
            torch.add(depths_t, base, out=v_pos[0, 1:])
            greedy, vfeats = self.runner.step(v_ids, v_pos, base, anc, graph=graphs)
            both = torch.cat([greedy, v_ids[0], parents_t]).tolist()  # the one host sync of the cycle
            g, tokens, parent = both[:d], both[d:2 * d], both[2 * d:]
            # walk: follow the child whose token equals the target's choice at the current node
            path, cur = [0], 0
            while True:
                nxt = [i for i in range(1, d) if parent[i] == cur and tokens[i] == g[cur]]
                if not nxt:
                    break
                cur = nxt[0]
                path.append(cur)
            a = len(path) - 1
            res.verify_steps += 1
            res.accepted.append(a)
            emitted, done = _stop_at([tokens[i] for i in path[1:]] + [g[cur]], self.eos, limit - len(res.tokens))
            res.tokens += emitted
            if done:
                break
            if path != list(range(a + 1)):  # compact the accepted path's KV to slots m..m+a
                self.runner.cache.move([m + i for i in path], [m + j for j in range(a + 1)])
            idx = self._t(path)
            # the draft re-extends over tokens m+1..m+a+1 with the target's features of m..m+a
            tree = self.draft_runner.grow(greedy.index_select(0, idx)[None], vfeats.index_select(0, idx)[None], base,
                                          self._tril(a + 1), graph=graphs)
            root = g[cur]
            m += a + 1
        _sync(dev)
        res.decode_s = time.perf_counter() - t1
        return res


# --------------------------------------------------------------------------- runs and summaries

def encode_prompts(target, prompts: list) -> list[list[int]]:
    """Chat prompts (lists of messages, or plain strings as one user turn) -> token ids.

    `target` is a Target or just its tokenizer: SGLang's /generate gets these same ids."""
    from draftlab.target import render_chat

    tokenizer = getattr(target, "tokenizer", target)
    out = []
    for p in prompts:
        messages = [{"role": "user", "content": p}] if isinstance(p, str) else p
        text = render_chat(tokenizer, messages, add_generation_prompt=True)
        out.append(tokenizer(text, add_special_tokens=False)["input_ids"])
    return out


def summarize(results: list[PromptResult], num_steps: int | None = None) -> dict:
    """Token-weighted acceptance length, per-position rates, histogram, tokens/s (decode and total)."""
    tokens = sum(len(r.tokens) for r in results)
    verify = sum(r.verify_steps for r in results)
    decode_s = sum(r.decode_s for r in results)
    total_s = decode_s + sum(r.prefill_s for r in results)
    out = {
        "prompts": len(results),
        "completion_tokens": tokens,
        "verify_steps": verify,
        "decode_s": decode_s,
        "total_s": total_s,
        "tokens_per_s": tokens / total_s if total_s else None,
        # decode-only: tokens after the first over decode time (what the break-even model predicts)
        "decode_tokens_per_s": (tokens - len(results)) / decode_s if decode_s else None,
    }
    accepted = [a for r in results for a in r.accepted]
    if num_steps is not None:
        out["acceptance_length"] = tokens / verify if verify else None
        out["mean_accepted_plus_one"] = (sum(accepted) / len(accepted) + 1) if accepted else None
        hist = [0] * (num_steps + 1)
        for a in accepted:
            hist[a] += 1
        out["accept_histogram"] = hist  # verify steps that accepted 0..S draft tokens
        # a_i = P(draft token i accepted | tokens < i accepted), i = 1..S (tree: depth i)
        out["position_acceptance"] = [
            (sum(1 for a in accepted if a >= i) / reached) if (reached := sum(1 for a in accepted if a >= i - 1)) else None
            for i in range(1, num_steps + 1)
        ]
    return out


def run_prompts(engine: SpecEngine, prompt_ids: list[list[int]], speculative: bool, progress: bool = True,
                desc: str | None = None) -> list[PromptResult]:
    from tqdm.auto import tqdm

    fn = engine.speculative if speculative else engine.greedy
    return [fn(p) for p in tqdm(prompt_ids, desc=desc or ("speculative" if speculative else "greedy"),
                                disable=not progress)]


# drafts (or targets, when no draft) whose graph replay matched eager decoding; weak, so that a
# freed draft's id reused by a new one cannot skip the new one's check
_GRAPHS_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # draft -> drafting shapes checked


def graphed_engine(target, draft, config: SpecConfig, max_len: int, probe: list[int],
                   prompt_lengths=()) -> SpecEngine:
    """An engine with its CUDA graphs captured (the prefills of prompts of `prompt_lengths` too),
    or an eager one when capture fails.

    The first engine of each draft and drafting shape also decodes `probe` both ways, greedily
    and speculatively, and falls back to eager if the replay differs (greedy tokens, or the number
    of draft tokens accepted beyond rounding), so a broken graph costs speed, never correctness or
    acceptance; the reason is kept in `engine.graph_error` and reported with the results."""
    engine = SpecEngine(target, draft, config, max_len=max_len)
    if not engine.use_graphs:
        return engine
    key = draft if draft is not None else target.model
    shape = (config.mode, config.num_steps, config.topk, config.num_draft_tokens, engine.prefill_bucket)
    try:
        engine.capture([len(probe), *prompt_lengths])
        if shape not in _GRAPHS_CHECKED.get(key, set()):
            decode = lambda: (engine.greedy(probe).tokens, sum(engine.speculative(probe).accepted) if draft else 0)  # noqa: E731
            graphed = decode()
            engine.use_graphs = False
            eager = decode()
            engine.use_graphs = True
            if graphed[0] != eager[0]:
                raise RuntimeError(f"graph replay decoded {graphed[0][:8]}... but eager decoding {eager[0][:8]}...")
            # a stale buffer in a draft graph would show as far fewer accepted tokens; allow rounding
            if abs(graphed[1] - eager[1]) > 0.02 * eager[1] + 1:
                raise RuntimeError(f"graph replay accepted {graphed[1]} draft tokens on the probe, eager decoding {eager[1]}")
            _GRAPHS_CHECKED.setdefault(key, set()).add(shape)
        return engine
    except Exception as exc:  # noqa: BLE001 - any capture failure means: run eagerly
        engine.close()
        _sync(engine.device)
        reason = f"{type(exc).__name__}: {exc}"[:300]
        warnings.warn(f"CUDA graphs off for this run ({reason})", stacklevel=2)
        engine = SpecEngine(target, draft, replace(config, cuda_graphs=False), max_len=max_len)
        engine.graph_error = reason
        return engine


def compare(target, draft, prompt_ids: list[list[int]], config: SpecConfig, eval_set: str = "prompts",
            greedy_results: list[PromptResult] | None = None, warmup: int = 1, progress: bool = True,
            max_len: int | None = None) -> dict:
    """Greedy vs speculative on the same prompts in the same engine: stats, speedup, losslessness."""
    need = max(len(p) for p in prompt_ids) + config.max_new_tokens + config.slots_after_root() + 2
    max_len = max(max_len or 0, need)
    engine = graphed_engine(target, draft, config, max_len, prompt_ids[0], [len(p) for p in prompt_ids])
    try:
        for p in prompt_ids[:warmup]:  # first-call costs outside the timed runs
            engine.greedy(p)
            engine.speculative(p)
        if greedy_results is None:
            greedy_results = run_prompts(engine, prompt_ids, False, progress, f"greedy ({eval_set})")
        spec = run_prompts(engine, prompt_ids, True, progress, f"{config.mode} S={config.num_steps} "
                           f"K={config.topk} D={config.num_draft_tokens} ({eval_set})")
    finally:
        engine.close()
    g, s = summarize(greedy_results), summarize(spec, config.num_steps)
    same = sum(a.tokens == b.tokens for a, b in zip(greedy_results, spec))
    return {
        "eval_set": eval_set,
        "samples": len(prompt_ids),
        **{k: v for k, v in asdict(config).items() if k not in ("cuda_graphs", "prefill_bucket")},
        "prefill_bucket": engine.prefill_bucket,
        "device": str(engine.device),
        "dtype": str(engine.runner.dtype).replace("torch.", ""),
        "cuda_graphs": engine.use_graphs,
        **({"cuda_graphs_error": engine.graph_error} if engine.graph_error else {}),
        "greedy": g,
        "speculative": s,
        "acceptance_length": s["acceptance_length"],
        "speedup": (s["tokens_per_s"] / g["tokens_per_s"]) if g["tokens_per_s"] and s["tokens_per_s"] else None,
        "decode_speedup": (s["decode_tokens_per_s"] / g["decode_tokens_per_s"])
        if g["decode_tokens_per_s"] and s["decode_tokens_per_s"] else None,
        "identical_outputs": same,
        "lossless": same == len(prompt_ids),
        "_greedy_results": greedy_results,
    }


def public(result: dict) -> dict:
    """A compare() result without the raw per-prompt objects (for JSON / tables)."""
    return {k: v for k, v in result.items() if not k.startswith("_")}


def chain_sweep(target, draft, prompt_ids, steps=range(1, 8), mode: str = "EAGLE3", max_new_tokens: int = 128,
                eval_set: str = "prompts", progress: bool = True, cuda_graphs: bool | None = None,
                prefill_bucket: int | None = None) -> list[dict]:
    """Chain acceptance and speedup for S = 1..7 (greedy decoded once and reused)."""
    rows, greedy = [], None
    for s in steps:
        cfg = SpecConfig(mode=mode, num_steps=s, topk=1, max_new_tokens=max_new_tokens, cuda_graphs=cuda_graphs,
                         prefill_bucket=prefill_bucket)
        res = compare(target, draft, prompt_ids, cfg, eval_set, greedy_results=greedy, progress=progress,
                      warmup=1 if greedy is None else 0)
        greedy = res["_greedy_results"]
        rows.append(public(res))
    return rows


# --------------------------------------------------------------------------- CLI

def _load_prompts(args, target) -> tuple[str, list]:
    from draftlab import bench

    prompts = bench.load_eval_set(args.eval_set, run_dir=args.run_dir, limit=args.samples)
    return args.eval_set, [p["messages"] for p in prompts]


def bench_specdec(args: argparse.Namespace) -> int:
    """`draftlab bench specdec`: engine greedy vs speculative, chain S=1..7, lossless check."""
    from draftlab.draft import load_draft
    from draftlab.target import load_target

    torch.set_num_threads(args.threads)
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    draft = load_draft(args.draft, target)
    name, prompts = _load_prompts(args, target)
    ids = encode_prompts(target, prompts)
    steps = [int(s) for s in args.steps.split(",")]
    rows = []
    graphs = {"auto": None, "on": True, "off": False}[args.cuda_graphs]
    if args.topk == 1:
        rows = chain_sweep(target, draft, ids, steps, args.mode, args.max_new_tokens, name, cuda_graphs=graphs,
                           prefill_bucket=args.prefill_bucket)
    else:
        for s in steps:
            cfg = SpecConfig(mode=args.mode, num_steps=s, topk=args.topk, num_draft_tokens=args.num_draft_tokens,
                             max_new_tokens=args.max_new_tokens, cuda_graphs=graphs, prefill_bucket=args.prefill_bucket)
            rows.append(public(compare(target, draft, ids, cfg, name)))
    for r in rows:
        print(f"{r['eval_set']} n={r['samples']} {r['mode']} S={r['num_steps']} K={r['topk']} D={r['num_draft_tokens']}: "
              f"acceptance {r['acceptance_length']:.3f}, greedy {r['greedy']['tokens_per_s']:.1f} tok/s, "
              f"spec {r['speculative']['tokens_per_s']:.1f} tok/s, speedup {r['speedup']:.3f}x "
              f"(decode {r['decode_speedup']:.3f}x), lossless {r['identical_outputs']}/{r['samples']}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0 if all(r["lossless"] for r in rows) else 1


def add_bench_specdec_parser(subparsers) -> None:
    p = subparsers.add_parser("specdec", help="reference engine: acceptance length and speedup over its own greedy")
    p.add_argument("--target", default="embedded", help="target spec (embedded, tiny, folder, hub id)")
    p.add_argument("--draft", required=True, help="exported draft folder (RUN_DIR/drafts/eagle3)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", help="float32 (default: the lossless check is exact) or bfloat16")
    p.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"), help="auto: on with CUDA")
    p.add_argument("--prefill-bucket", type=int, default=None,
                   help="pad prompts to a multiple of this for graphed prefills (default: 64 on CUDA, 0 elsewhere)")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (2 only on a quiet CPU)")
    p.add_argument("--mode", default="EAGLE3", choices=MODES)
    p.add_argument("--steps", default="1,2,3,4,5,6,7", help="comma-separated chain lengths S")
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument("--eval-set", default="humaneval", help="humaneval | blend (RUN_DIR/data/blend/test.jsonl) | file.jsonl")
    p.add_argument("--run-dir", default="results/dev")
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.set_defaults(func=bench_specdec)
