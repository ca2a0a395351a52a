"""The reference speculative engine: one SpecEngine for chain and tree drafting, greedy verify.

SpecConfig says what to draft (steps S, top-k K, draft tokens D, mode EAGLE3 or EAGLE); the
engine runs the draft/verify cycle over TargetRunner and DraftRunner (engine.runners) and
returns per-prompt PromptResults. The cycle is the same loop for a chain (K = 1) and a tree.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from draftlab.engine.runners import DraftRunner, SpecConfig, TargetRunner
from draftlab.model.hidden import draft_layers

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
            raise ValueError(
                f"prompt of {n_prompt} tokens + {self.cfg.max_new_tokens} new needs a cache of "
                f"{need} slots; the engine was built with max_len={self.max_len}"
            )

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
        greedy, feats = self.runner.step(
            self._padded(prompt_ids, size), self._t([list(range(size))]), self._t([0]), anc, graph=graphed
        )
        return int(greedy[n - 1]), feats[:n]

    def _draft_prefill(self, prompt_ids: list[int], root: int, feats):
        """The draft over the prompt: extend over its first n - 1 positions (bucketed like the
        target's prefill), then the cycle's own graphed step over the last one, which drafts.
        Draft position p holds token p + 1 (the root at n - 1) with the target's features of token p."""
        n = len(prompt_ids)
        if n > 1:
            size, graphed, anc = self._prefill_plan(n - 1)
            pad = torch.zeros(size - (n - 1), feats.shape[-1], dtype=feats.dtype, device=self.device)
            self.draft_runner.extend(
                self._padded(prompt_ids[1:], size),
                torch.cat([feats[: n - 1], pad])[None],
                self._t([0]),
                anc,
                graph=graphed,
            )
        draft = self.draft_runner.chain if self.cfg.topk == 1 else self.draft_runner.grow
        return draft(self._t([[root]]), feats[None, n - 1 :], self._t([n - 1]), self._tril(1), graph=self.use_graphs)

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
        """Speculative decoding of one prompt: chain drafting when topk is 1, a tree otherwise."""
        if self.draft_runner is None:
            raise ValueError("speculative decoding needs a draft")
        self._check_len(len(prompt_ids))
        return self._decode(prompt_ids, _ChainCycle if self.cfg.topk == 1 else _TreeCycle)

    def _decode(self, prompt_ids: list[int], cycle_kind) -> PromptResult:
        """The cycle shared by chain and tree: prefill, then verify -> accept -> emit -> commit until done.

        The cycle kind builds the verify block from what was drafted, walks the accepted path and
        re-extends the draft; everything else (timing, stop rules, positions, counts) is here once.
        """
        limit, dev = self.cfg.max_new_tokens, self.device
        t0 = time.perf_counter()
        m = len(prompt_ids)  # position of the root (the last emitted token, not yet in the target cache)
        root, feats = self._prefill(prompt_ids)
        drafted = self._draft_prefill(prompt_ids, root, feats)
        _sync(dev)
        t1 = time.perf_counter()
        res = PromptResult(tokens=[root], prefill_s=t1 - t0)
        cycle = cycle_kind(self)
        base = self._t([m])
        done = root in self.eos or limit <= 1
        while not done:
            base.fill_(m)
            candidates, a, state = cycle.verify(root, drafted, base, m)
            res.verify_steps += 1
            res.accepted.append(a)
            emitted, done = _stop_at(candidates, self.eos, limit - len(res.tokens))
            res.tokens += emitted
            if done:
                break
            drafted = cycle.commit(state, a, base, m)
            root = candidates[-1]  # the target's own token after the accepted ones
            m += a + 1
        _sync(dev)
        res.decode_s = time.perf_counter() - t1
        return res


class _ChainCycle:
    """Chain drafting: S draft tokens per cycle, one verify of S + 1 tokens."""

    def __init__(self, engine: SpecEngine):
        s, dev = engine.cfg.num_steps, engine.device
        self.engine, self.s = engine, s
        self.anc = engine._tril(s + 1)
        self.v_ids = torch.empty(1, s + 1, dtype=torch.long, device=dev)
        self.v_pos = torch.empty(1, s + 1, dtype=torch.long, device=dev)
        self.offsets = torch.arange(s + 1, device=dev)

    def verify(self, root: int, drafted, base, m: int):
        """(the target's tokens to emit, accepted count, what commit needs)."""
        s = self.s
        self.v_ids[0, 0] = root
        self.v_ids[0, 1:] = drafted
        torch.add(self.offsets, base, out=self.v_pos[0])
        greedy, vfeats = self.engine.runner.step(self.v_ids, self.v_pos, base, self.anc, graph=self.engine.use_graphs)
        both = torch.cat([greedy, drafted]).tolist()  # the one host sync of the cycle
        g, d = both[: s + 1], both[s + 1 :]
        a = 0
        while a < s and d[a] == g[a]:
            a += 1
        return g[: a + 1], a, (greedy, vfeats)

    def commit(self, state, a: int, base, m: int):
        """Target slots m..m+a hold root, d_1..d_a; the draft re-extends them with the target's
        features (ids = tokens m+1..m+a+1 = g[0..a]) and drafts the next chain."""
        greedy, vfeats = state
        engine = self.engine
        engine.draft_runner.cache.length = m
        return engine.draft_runner.chain(
            greedy[None, : a + 1], vfeats[None, : a + 1], base, engine._tril(a + 1), graph=engine.use_graphs
        )


class _TreeCycle:
    """Tree drafting (topk K, S steps, D verified tokens): one draft and one verify pass a cycle."""

    def __init__(self, engine: SpecEngine):
        d, dev = engine.cfg.num_draft_tokens, engine.device
        self.engine, self.d = engine, d
        self.v_ids = torch.empty(1, d, dtype=torch.long, device=dev)
        self.v_pos = torch.empty(1, d, dtype=torch.long, device=dev)

    def verify(self, root: int, tree, base, m: int):
        d = self.d
        tokens_t, depths_t, parents_t, anc = tree
        self.v_ids[0, 0] = root
        self.v_ids[0, 1:] = tokens_t
        self.v_pos[0, 0] = m
        torch.add(depths_t, base, out=self.v_pos[0, 1:])
        greedy, vfeats = self.engine.runner.step(self.v_ids, self.v_pos, base, anc, graph=self.engine.use_graphs)
        both = torch.cat([greedy, self.v_ids[0], parents_t]).tolist()  # the one host sync of the cycle
        g, tokens, parent = both[:d], both[d : 2 * d], both[2 * d :]
        # walk: follow the child whose token equals the target's choice at the current node
        path, cur = [0], 0
        while True:
            nxt = [i for i in range(1, d) if parent[i] == cur and tokens[i] == g[cur]]
            if not nxt:
                break
            cur = nxt[0]
            path.append(cur)
        return [tokens[i] for i in path[1:]] + [g[cur]], len(path) - 1, (greedy, vfeats, path)

    def commit(self, state, a: int, base, m: int):
        """Compact the accepted path's KV to slots m..m+a; the draft re-extends over tokens
        m+1..m+a+1 with the target's features of m..m+a and grows the next tree."""
        greedy, vfeats, path = state
        engine = self.engine
        if path != list(range(a + 1)):
            engine.runner.cache.move([m + i for i in path], [m + j for j in range(a + 1)])
        idx = engine._t(path)
        return engine.draft_runner.grow(
            greedy.index_select(0, idx)[None],
            vfeats.index_select(0, idx)[None],
            base,
            engine._tril(a + 1),
            graph=engine.use_graphs,
        )
