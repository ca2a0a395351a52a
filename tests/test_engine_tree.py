"""The engine's tree drafting against SGLang 0.5.17's rules, on a fake draft whose logits depend on
what each query sees (its token, its hidden input, its position and the tokens of the KV slots its
mask shows), so that a different attention rule, expansion or node selection gives another tree.

`sglang_tree` restates SGLang's rules from its source (facts, not its code):
- draft_forward (srt/speculative/eagle_worker_v2.py:608-692) with select_top_k_tokens
  (srt/speculative/spec_utils.py:279-333): the K tokens of the root's top-K, then per step the
  top-K children of each of the K beams, scores multiplied (probabilities, spec_utils.py:310), the
  K best of the K^2 children are the next beams; their hidden states are their parents' rows
  (spec_utils.py:325-326); the KV is not reordered.
- the draft decode attention: beam j at step i writes its KV in slot j of step i
  (eagle_utils.py:60-81, per_step_draft_out_cache_loc) and reads the prefix plus slot j of
  steps 0..i (kernels/ops/speculative/cache_locs.py:56-126, generate_draft_decode_kv_indices,
  used by the triton backend's multi-step draft, srt/layers/attention/triton_backend.py:1929):
  slot lineage, not the beam's own ancestors. Positions: seq_len + i (eagle_worker_common.py
  prepare_for_draft, positions = seq_lens repeated, +1 per step).
- organize_draft_results (eagle_utils.py:100-128): the top D - 1 of all K + (S - 1) K^2
  cumulative scores, sorted by index; build_tree (kernels/ops/speculative/spec_tree.py): the
  parent of score index x is parent_list[x // K] (root when 0).
"""

import pytest
import torch

from draftlab.engine.runners import DraftRunner, SpecConfig

V, R = 40, 997  # vocabulary of the fake draft; rows of its logit table


class _Cfg:
    num_attention_heads = 1
    num_key_value_heads = 1
    head_dim = 1
    hidden_size = 1


class FakeDraft(torch.nn.Module):
    """Logits = table[hash(own token, hidden input, position, tokens visible in the KV)]."""

    config = _Cfg()
    use_aux = True

    def __init__(self, table):
        super().__init__()
        self.register_buffer("table", table)
        self.dummy = torch.nn.Parameter(torch.zeros(1))

    @staticmethod
    def key(own, hidden, pos, visible_sum):
        return (7 * own + 13 * hidden + 31 * pos + 101 * visible_sum) % R

    def forward(self, ids, hidden, pos, past_key_values=None, attention_mask=None):
        cache = past_key_values
        kv = (ids.to(torch.float32) + 1)[:, None, :, None]  # token + 1 (0 = an empty slot)
        keys, _ = cache.update(kv, kv, 0)
        seen = keys[0, 0, :, 0]  # [M]
        visible_sum = (attention_mask[0, 0].float() * seen[None]).sum(-1).long()  # [L]
        h = hidden[0, :, 0].long()
        idx = self.key(ids[0], h, pos[0], visible_sum)
        return self.table[idx][None], ids.to(torch.float32)[..., None], None

    def to_target_ids(self, ids):
        return ids


class _Target:
    class model:  # noqa: N801
        @staticmethod
        def get_output_embeddings():
            return None


def sglang_tree(table, prefix, root_logits, root_hidden, m, steps, topk, d):
    """SGLang's draft tree for one request: (verify-list tokens after the root, parent of each
    verify-list entry as a verify-list index, root = 0)."""
    k = topk
    probs = torch.softmax(root_logits.float(), -1)
    top = torch.topk(probs, k)
    score_list, token_list = [top.values], [top.indices]
    parent_list = list(range(-1, k))  # step 0's parents entry: arange(-1, K)
    beam_tok, beam_score = top.indices, top.values
    beam_hidden = [root_hidden] * k
    history = [[] for _ in range(k)]  # tokens slot j holds, step by step
    prefix_sum = sum(t + 1 for t in prefix)
    for i in range(1, steps):
        rows, outs = [], []
        for j in range(k):
            history[j].append(int(beam_tok[j]))
            vis = prefix_sum + sum(t + 1 for t in history[j])
            rows.append(table[FakeDraft.key(int(beam_tok[j]), beam_hidden[j], m + i - 1, vis)])
            outs.append(int(beam_tok[j]))  # the fake's hidden output is its token
        p = torch.softmax(torch.stack(rows).float(), -1)
        tp = torch.topk(p, k, dim=-1)
        expand = (beam_score[:, None] * tp.values).flatten()
        cs = torch.topk(expand, k).indices
        score_list.append(expand)
        token_list.append(tp.indices.flatten())
        if i < steps - 1:  # organize_draft_results drops the last step's parents
            parent_list += (cs + k * k * (i - 1) + k).tolist()
        beam_tok, beam_score = tp.indices.flatten()[cs], expand[cs]
        beam_hidden = [outs[c // k] for c in cs.tolist()]
    scores, tokens = torch.cat(score_list), torch.cat(token_list)
    sel = torch.sort(torch.topk(scores, d - 1).indices).values.tolist()
    parents = [0]
    for x in sel:
        pb = x // k
        parents.append(0 if pb == 0 else sel.index(parent_list[pb]) + 1)
    return [int(tokens[x]) for x in sel], parents


def engine_tree(table, prefix, root_logits, root_hidden, m, steps, topk, d):
    cfg = SpecConfig(num_steps=steps, topk=topk, num_draft_tokens=d)
    runner = DraftRunner(FakeDraft(table), _Target(), cfg, max_len=64)
    runner.cache.keys[0][0, 0, :m, 0] = torch.tensor(prefix, dtype=torch.float32) + 1
    hidden = torch.full((1,), float(root_hidden))
    tokens, depths, par, anc = runner._grow(root_logits, hidden, torch.tensor([m]))
    # anc is the ancestor-or-self closure of par
    want = torch.eye(d, dtype=torch.bool)
    for i in range(d):
        j = i
        while j:
            j = int(par[j])
            want[i, j] = True
    assert torch.equal(anc, want)
    return tokens.tolist(), par.tolist()


def _case(seed):
    g = torch.Generator().manual_seed(seed)
    table = torch.randn(R, V, generator=g) * 3
    prefix = torch.randint(0, V, (9,), generator=g).tolist()
    return table, prefix, torch.randn(V, generator=g) * 3, 5, len(prefix)


SHAPES = [(5, 4, 8), (3, 2, 5), (4, 3, 10), (6, 8, 16), (3, 4, 20)]


@pytest.mark.parametrize("steps,topk,d", SHAPES)
@pytest.mark.parametrize("seed", range(6))
def test_tree_matches_sglang_rules(steps, topk, d, seed):
    """Same draft, same root: the engine drafts SGLang's verify tree (tokens and parents)."""
    args = (*_case(seed), steps, topk, d)
    assert engine_tree(*args) == sglang_tree(*args)


def test_slot_lineage_differs_from_ancestors_on_this_fake():
    """The fake separates the two attention rules: beam slots change parents in these trees, so
    exact tree attention ("ancestors") drafts other trees in some of the cases above."""
    differ = 0
    for steps, topk, d in SHAPES:
        for seed in range(6):
            table, prefix, root_logits, hidden, m = _case(seed)
            cfg = SpecConfig(num_steps=steps, topk=topk, num_draft_tokens=d, draft_tree_attention="ancestors")
            runner = DraftRunner(FakeDraft(table), _Target(), cfg, max_len=64)
            runner.cache.keys[0][0, 0, :m, 0] = torch.tensor(prefix, dtype=torch.float32) + 1
            tokens, _, par, _ = runner._grow(root_logits, torch.full((1,), float(hidden)), torch.tensor([m]))
            sg = sglang_tree(table, prefix, root_logits, hidden, m, steps, topk, d)
            differ += (tokens.tolist(), par.tolist()) != sg
    assert differ >= 10, differ


def test_selection_keeps_sglang_near_ties():
    """A depth-2 node whose cumulative probability beats a depth-1 node by less than a depth
    penalty would (0.19998 vs 0.1999) is kept, as SGLang's topk of raw scores keeps it; a tie
    keeps the parent (lower index) first, so the chosen nodes always include their ancestors."""
    cfg = SpecConfig(num_steps=2, topk=2, num_draft_tokens=3)
    runner = DraftRunner(FakeDraft(torch.zeros(R, V)), _Target(), cfg, max_len=64)
    tokens = torch.tensor([10, 11, 20, 21, 22, 23])
    # depth 1: 0.5, 0.1999; children of node 0: 0.5 * 0.39996, 0.5 * 0.3; of node 1: small
    scores = torch.tensor([0.5, 0.1999, 0.5 * 0.39996, 0.15, 0.01, 0.005])
    parents = torch.tensor([-1, -1, 0, 0, 1, 1])
    depths = torch.tensor([1, 1, 2, 2, 2, 2])
    tok, dep, par, _ = runner._select(tokens, scores, parents, depths)
    assert tok.tolist() == [10, 20] and par.tolist() == [0, 0, 1]
    # exact tie between a parent and its child (probability 1.0): the parent comes first
    scores = torch.tensor([0.5, 0.3, 0.2, 0.1, 0.3, 0.0])
    tok, dep, par, _ = runner._select(tokens, scores, parents, depths)
    assert tok.tolist() == [10, 11] and par.tolist() == [0, 0, 0]
