"""The reference engine: lossless against transformers' own greedy `generate`, chain and tree,
both server modes; the statistics; the draft over SlotCache equals the draft over DynamicCache."""

from collections import Counter

import pytest
import torch

from draftlab import engine as sd
from draftlab.engine import runners, runs
from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.hidden import final_feature, target_states

PROMPTS = [
    "Hello there",
    "Write a poem about cats.",
    "What is 2+2?",
    "def f(x):",
    "Tell me a joke.",
    "List three colours.",
    "Translate 'bonjour' to English.",
    "Why is the sky blue?",
    "import numpy as np",
    "Summarise: the cat sat on the mat.",
    "Count to five.",
    "Name a prime number.",
]
MAX_NEW = 24


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    # This CPU is shared: two OpenMP threads under load made a verify step ~25x slower.
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def hf_greedy(target, ids, max_new):
    """The target's own greedy decoding through transformers' generate (the ground truth)."""
    with torch.no_grad():
        out = target.model.generate(
            torch.tensor([ids], device=target.model.device),
            max_new_tokens=max_new,
            do_sample=False,
            eos_token_id=target.eos_token_ids,
            pad_token_id=target.eos_token_ids[0],
        )
    return out[0, len(ids) :].tolist()


@pytest.fixture(scope="module")
def prompt_ids(tiny_target):
    return sd.encode_prompts(tiny_target, PROMPTS)


@pytest.fixture(scope="module")
def reference(tiny_target, prompt_ids):
    return [hf_greedy(tiny_target, p, MAX_NEW) for p in prompt_ids]


def random_draft(target, vocab_ids, use_aux=True, seed=0):
    """A random draft whose small vocabulary holds tokens the target emits, so that draft tokens
    are sometimes accepted and the acceptance path is exercised."""
    torch.manual_seed(seed)
    cfg = draft_config_for_target(target.model.config, draft_vocab_size=len(vocab_ids), use_aux=use_aux)
    draft = Eagle3Draft(cfg, target.model.get_input_embeddings()).eval()
    draft.set_vocab(torch.tensor(sorted(vocab_ids)))
    return draft


@pytest.fixture(scope="module")
def draft(tiny_target, reference):
    common = [t for t, _ in Counter(t for r in reference for t in r).most_common(6)]
    return random_draft(tiny_target, common)


def run_all(target, draft, prompt_ids, **cfg):
    engine = sd.SpecEngine(target, draft, sd.SpecConfig(max_new_tokens=MAX_NEW, **cfg), max_len=256)
    try:
        return [engine.speculative(p) for p in prompt_ids], engine
    finally:
        engine.close()


def test_greedy_equals_generate(tiny_target, prompt_ids, reference):
    engine = sd.SpecEngine(tiny_target, None, sd.SpecConfig(max_new_tokens=MAX_NEW), max_len=256)
    got = [engine.greedy(p).tokens for p in prompt_ids]
    engine.close()
    assert got == reference


@pytest.mark.parametrize("steps", [1, 3, 6])
def test_chain_is_lossless(tiny_target, draft, prompt_ids, reference, steps):
    results, _ = run_all(tiny_target, draft, prompt_ids, num_steps=steps)
    assert [r.tokens for r in results] == reference
    stats = sd.summarize(results, steps)
    assert sum(stats["accept_histogram"][1:]) > 0, "no draft token was ever accepted: the test exercises nothing"
    assert 1.0 <= stats["acceptance_length"] <= steps + 1 + 1  # +1: the prefill token (SGLang counts it too)
    for r in results:  # every verify step emits accepted + 1 tokens (until EOS / the limit)
        assert len(r.tokens) <= 1 + sum(a + 1 for a in r.accepted)


@pytest.mark.parametrize("topk,draft_tokens,steps", [(2, 5, 3), (3, 8, 3), (4, 16, 5)])
def test_tree_is_lossless(tiny_target, draft, prompt_ids, reference, topk, draft_tokens, steps):
    results, _ = run_all(tiny_target, draft, prompt_ids, num_steps=steps, topk=topk, num_draft_tokens=draft_tokens)
    assert [r.tokens for r in results] == reference
    assert sum(a for r in results for a in r.accepted) > 0


def test_eagle_mode_is_lossless(tiny_target, draft, prompt_ids, reference):
    results, engine = run_all(tiny_target, draft, prompt_ids, num_steps=3, mode="EAGLE")
    assert engine.runner.feature == "final"
    assert [r.tokens for r in results] == reference


def test_eagle1_variant_is_lossless(tiny_target, reference, prompt_ids):
    common = [t for t, _ in Counter(t for r in reference for t in r).most_common(6)]
    eagle1 = random_draft(tiny_target, common, use_aux=False, seed=1)
    results, engine = run_all(tiny_target, eagle1, prompt_ids, num_steps=4)
    assert engine.runner.feature == "final"
    assert [r.tokens for r in results] == reference


def test_runner_features_match_hidden_module(tiny_target, prompt_ids):
    """The hooks give what draft training used (draftlab.model.hidden): aux layers and the post-norm final."""
    ids = prompt_ids[0]
    aux, last, _ = target_states(tiny_target, torch.tensor([ids]))
    with torch.no_grad():
        final = final_feature(tiny_target, last)
    for feature, want in (("aux", aux), ("final", final)):
        runner = sd.TargetRunner(tiny_target, feature, max_len=128)
        n = len(ids)
        with torch.no_grad():
            greedy, feats = runner.step(
                torch.tensor([ids]), torch.arange(n)[None], torch.tensor([0]), torch.ones(n, n, dtype=torch.bool).tril()
            )
        runner.close()
        torch.testing.assert_close(feats, want[0], rtol=1e-5, atol=1e-5)


def test_draft_over_slot_cache_equals_dynamic_cache(tiny_target, draft, prompt_ids):
    """Extend + chain through SlotCache and explicit masks == the draft's own DynamicCache path."""
    ids = prompt_ids[1]
    n = len(ids)
    aux, _, _ = target_states(tiny_target, torch.tensor([ids]))
    runner = sd.DraftRunner(draft, tiny_target, sd.SpecConfig(mode="EAGLE3", num_steps=4), max_len=128)
    with torch.no_grad():
        got = runner.chain(
            torch.tensor([ids[1:] + [7]]), aux, torch.tensor([0]), torch.ones(n, n, dtype=torch.bool).tril()
        ).tolist()
        logits, hidden, cache = draft(torch.tensor([ids[1:] + [7]]), draft.project(aux), torch.arange(n)[None])
        want, h, tok = [], hidden[:, -1:], draft.to_target_ids(logits[:, -1:].argmax(-1))
        want.append(int(tok))
        for j in range(3):
            logits, h, cache = draft(tok, h, torch.tensor([[n + j]]), past_key_values=cache)
            tok = draft.to_target_ids(logits.argmax(-1))
            want.append(int(tok))
    assert got == want


def test_summarize_definitions():
    results = [
        sd.PromptResult(tokens=list(range(7)), verify_steps=3, accepted=[2, 0, 1], decode_s=1.0, prefill_s=0.5),
        sd.PromptResult(tokens=list(range(4)), verify_steps=1, accepted=[2], decode_s=0.5, prefill_s=0.5),
    ]
    s = sd.summarize(results, 3)
    assert s["acceptance_length"] == pytest.approx(11 / 4)  # sum tokens / sum verify steps
    assert s["accept_histogram"] == [1, 1, 2, 0]
    # a_1 = P(a>=1 | a>=0) = 3/4; a_2 = P(a>=2 | a>=1) = 2/3; a_3 = P(a>=3 | a>=2) = 0/2
    assert s["position_acceptance"] == pytest.approx([3 / 4, 2 / 3, 0.0])
    assert s["tokens_per_s"] == pytest.approx(11 / 2.5)
    assert s["decode_tokens_per_s"] == pytest.approx(9 / 1.5)


def test_config_checks():
    assert sd.SpecConfig(num_steps=4, topk=1).num_draft_tokens == 5
    with pytest.raises(ValueError, match="num_draft_tokens"):
        sd.SpecConfig(num_steps=3, topk=2)
    with pytest.raises(ValueError, match="exceeds"):
        sd.SpecConfig(num_steps=1, topk=2, num_draft_tokens=8)
    with pytest.raises(ValueError, match="mode"):
        sd.SpecConfig(mode="MEDUSA")


def test_compare_reports_speedup_and_losslessness(tiny_target, draft, prompt_ids):
    res = sd.compare(
        tiny_target,
        draft,
        prompt_ids[:4],
        sd.SpecConfig(num_steps=2, max_new_tokens=12),
        eval_set="unit",
        progress=False,
    )
    assert res["lossless"] and res["identical_outputs"] == 4 and res["samples"] == 4
    assert res["speedup"] > 0 and res["eval_set"] == "unit"
    assert res["speculative"]["completion_tokens"] == res["greedy"]["completion_tokens"]


@pytest.mark.slow
def test_embedded_target_lossless_fp32(embedded_target):
    """The real 30-layer target in fp32: chain and tree, a random draft, against generate."""
    prompts = [
        "What is the capital of France?",
        "Write a Python function that adds two numbers.",
        "Give me three tips for sleeping well.",
        "Explain recursion in one sentence.",
    ]
    ids = sd.encode_prompts(embedded_target, prompts)
    ref = [hf_greedy(embedded_target, p, 32) for p in ids]
    common = [t for t, _ in Counter(t for r in ref for t in r).most_common(64)]
    draft = random_draft(embedded_target, common)
    for cfg in (dict(num_steps=3), dict(num_steps=3, topk=3, num_draft_tokens=8)):
        engine = sd.SpecEngine(embedded_target, draft, sd.SpecConfig(max_new_tokens=32, **cfg), max_len=512)
        got = [engine.speculative(p).tokens for p in ids]
        engine.close()
        assert got == ref, cfg


@pytest.mark.gpu
def test_cuda_graphs_match_eager_fp32():
    from draftlab.model.target import load_target

    target = load_target("tiny", device="cuda", dtype="float32")
    ids = sd.encode_prompts(target, PROMPTS[:6])
    ref = [hf_greedy(target, p, MAX_NEW) for p in ids]
    common = [t for t, _ in Counter(t for r in ref for t in r).most_common(6)]
    draft = random_draft(target, common).cuda()
    for graphs in (False, True):
        for tree in ({}, dict(topk=3, num_draft_tokens=8)):
            engine = sd.SpecEngine(
                target,
                draft,
                sd.SpecConfig(num_steps=3, max_new_tokens=MAX_NEW, cuda_graphs=graphs, **tree),
                max_len=256,
            )
            engine.capture()
            assert [engine.greedy(p).tokens for p in ids] == ref
            assert [engine.speculative(p).tokens for p in ids] == ref
            engine.close()


class FakeGraphed:
    """CPU stand-in for a CUDA graph with the same aliasing: static input buffers copied in on
    each call, and the same output tensors overwritten in place on every replay."""

    def __init__(self, fn, inputs, pool=None):
        self.fn, self.inputs, self.outputs = fn, [x.clone() for x in inputs], None

    def __call__(self, *inputs):
        for buf, x in zip(self.inputs, inputs):
            buf.copy_(x)
        out = self.fn(*self.inputs)
        out = out if isinstance(out, tuple) else (out,)
        if self.outputs is None:
            self.outputs = tuple(o.clone() for o in out)
        else:
            for buf, o in zip(self.outputs, out):
                buf.copy_(o)
        return self.outputs if len(self.outputs) > 1 else self.outputs[0]


def test_graph_plumbing_is_lossless_with_static_buffers(tiny_target, draft, prompt_ids, reference, monkeypatch):
    """The CUDA-graph code path (captured up front, static buffers reused) run on the CPU."""
    monkeypatch.setattr(runners, "Graphed", FakeGraphed)
    engine = sd.SpecEngine(
        tiny_target, draft, sd.SpecConfig(num_steps=4, max_new_tokens=MAX_NEW, cuda_graphs=True), max_len=256
    )
    engine.capture()
    assert sorted(engine.runner.graphs) == [1, 5] and sorted(engine.draft_runner.graphs) == [1, 2, 3, 4, 5]
    assert [engine.greedy(p).tokens for p in prompt_ids] == reference
    results = [engine.speculative(p) for p in prompt_ids]
    engine.close()
    assert [r.tokens for r in results] == reference
    assert sum(a for r in results for a in r.accepted) > 0


def test_tree_graph_plumbing_matches_eager(tiny_target, draft, prompt_ids, reference, monkeypatch):
    """Tree mode through the graph code path (one draft graph per extend length, one D-token verify
    graph): lossless, and the same draft tokens accepted at every cycle as eager decoding."""
    cfg = dict(num_steps=3, topk=3, num_draft_tokens=8, max_new_tokens=MAX_NEW)
    eager = sd.SpecEngine(tiny_target, draft, sd.SpecConfig(**cfg, cuda_graphs=False), max_len=256)
    want = [eager.speculative(p).accepted for p in prompt_ids]
    eager.close()
    monkeypatch.setattr(runners, "Graphed", FakeGraphed)
    engine = sd.SpecEngine(tiny_target, draft, sd.SpecConfig(**cfg, cuda_graphs=True), max_len=256)
    engine.capture()
    assert sorted(engine.runner.graphs) == [1, 8] and sorted(engine.draft_runner.graphs) == [1, 2, 3, 4]
    results = [engine.speculative(p) for p in prompt_ids]
    engine.close()
    assert [r.tokens for r in results] == reference
    assert [r.accepted for r in results] == want and sum(map(sum, want)) > 0


@pytest.mark.parametrize("tree", [{}, dict(topk=3, num_draft_tokens=8)])
def test_bucketed_prefill_hides_its_padding(tiny_target, draft, prompt_ids, reference, tree):
    """Prompts padded to a multiple of 16 (as CUDA graphs of a few lengths need): greedy and
    speculative decoding are unchanged, and the draft accepts the same tokens at every cycle as
    with exact lengths, so neither cache lets a padding slot be seen."""
    cfg = dict(num_steps=3, max_new_tokens=MAX_NEW, cuda_graphs=False, **tree)
    exact = sd.SpecEngine(tiny_target, draft, sd.SpecConfig(**cfg, prefill_bucket=0), max_len=256)
    want = [exact.speculative(p).accepted for p in prompt_ids]
    exact.close()
    padded = sd.SpecEngine(tiny_target, draft, sd.SpecConfig(**cfg, prefill_bucket=16), max_len=256)
    assert {padded._prefill_size(len(p)) % 16 for p in prompt_ids} == {0}
    assert any(padded._prefill_size(len(p)) > len(p) for p in prompt_ids), "no prompt was padded"
    assert [padded.greedy(p).tokens for p in prompt_ids] == reference
    results = [padded.speculative(p) for p in prompt_ids]
    padded.close()
    assert [r.tokens for r in results] == reference
    assert [r.accepted for r in results] == want and sum(map(sum, want)) > 0


def test_prefill_graphs_are_captured_before_the_prompts(tiny_target, draft, prompt_ids, reference, monkeypatch):
    """capture(prompt_lengths) records one target and one draft prefill graph per bucket, so a timed
    run never captures; replaying them is lossless."""
    monkeypatch.setattr(runners, "Graphed", FakeGraphed)
    engine = sd.SpecEngine(
        tiny_target,
        draft,
        sd.SpecConfig(num_steps=2, max_new_tokens=MAX_NEW, cuda_graphs=True, prefill_bucket=16),
        max_len=256,
    )
    engine.capture([len(p) for p in prompt_ids])
    buckets = {-(-len(p) // 16) * 16 for p in prompt_ids}
    assert set(engine.runner.graphs) == {1, 3} | buckets
    assert set(engine.draft_runner.extend_graphs) == {-(-(len(p) - 1) // 16) * 16 for p in prompt_ids}
    before = (dict(engine.runner.graphs), dict(engine.draft_runner.graphs), dict(engine.draft_runner.extend_graphs))
    assert [engine.greedy(p).tokens for p in prompt_ids] == reference
    results = [engine.speculative(p) for p in prompt_ids]
    after = (engine.runner.graphs, engine.draft_runner.graphs, engine.draft_runner.extend_graphs)
    engine.close()
    assert [r.tokens for r in results] == reference
    assert all(a == b for a, b in zip(before, after)), "a graph was captured during the prompts"


def test_failed_graph_capture_falls_back_to_eager(tiny_target, draft, prompt_ids):
    """Graphs asked for where they cannot be captured (the CPU): the run goes on eagerly, lossless,
    and reports that graphs were off and why."""
    with pytest.warns(UserWarning, match="CUDA graphs off"):
        res = sd.compare(
            tiny_target,
            draft,
            prompt_ids[:3],
            sd.SpecConfig(num_steps=2, max_new_tokens=8, cuda_graphs=True),
            eval_set="unit",
            progress=False,
        )
    assert res["lossless"] and res["cuda_graphs"] is False and res["cuda_graphs_error"]


def test_graph_replay_that_differs_from_eager_is_refused(tiny_target, draft, prompt_ids, monkeypatch):
    """A graph that replays wrongly is caught by the eager check on the first prompt."""

    class WrongGraphed(FakeGraphed):
        def __call__(self, *inputs):
            out = super().__call__(*inputs)
            first = out[0] if isinstance(out, tuple) else out
            if first.dtype == torch.long:
                first.add_(1)  # every graphed greedy token off by one
            return out

    monkeypatch.setattr(runners, "Graphed", WrongGraphed)
    runs._GRAPHS_CHECKED.clear()
    with pytest.warns(UserWarning, match="differs|decoded"):
        engine = sd.graphed_engine(
            tiny_target, draft, sd.SpecConfig(num_steps=2, max_new_tokens=8, cuda_graphs=True), 256, prompt_ids[0]
        )
    assert not engine.use_graphs and engine.graph_error.startswith("RuntimeError: graph replay decoded")
    engine.close()


@pytest.mark.parametrize("tree", [{}, dict(topk=3, num_draft_tokens=8)])
def test_draft_graph_that_loses_acceptance_is_refused(tiny_target, draft, prompt_ids, monkeypatch, tree):
    """A draft graph replaying stale or wrong tokens stays lossless (the target verifies), so only
    the acceptance count on the probe can catch it."""
    cfg = dict(num_steps=3, max_new_tokens=MAX_NEW, **tree)
    eager = sd.SpecEngine(tiny_target, draft, sd.SpecConfig(**cfg, cuda_graphs=False), max_len=256)
    probe = max(prompt_ids, key=lambda p: sum(eager.speculative(p).accepted))
    eager.close()

    class WrongDraftGraphed(FakeGraphed):
        def __call__(self, *inputs):
            out = super().__call__(*inputs)
            if self.fn.__name__ in ("_extend_and_chain", "_extend_and_grow"):
                (out[0] if isinstance(out, tuple) else out).add_(1)  # every drafted token off by one
            return out

    monkeypatch.setattr(runners, "Graphed", WrongDraftGraphed)
    runs._GRAPHS_CHECKED.clear()
    with pytest.warns(UserWarning, match="accepted"):
        engine = sd.graphed_engine(tiny_target, draft, sd.SpecConfig(**cfg, cuda_graphs=True), 256, probe)
    assert not engine.use_graphs and "accepted" in engine.graph_error
    engine.close()


@pytest.mark.parametrize("use_aux", [True, False])
def test_first_draft_token_matches_teacher_forcing(tiny_target, reference, prompt_ids, use_aux):
    """At every cycle root m the engine's first draft token is accepted exactly when the draft run
    teacher-forced over the final sequence (as in training: draftlab.model.hidden features, one pass)
    predicts token m+1: the engine feeds the features and positions training used."""
    common = [t for t, _ in Counter(t for r in reference for t in r).most_common(6)]
    d = random_draft(tiny_target, common, use_aux=use_aux, seed=3)
    engine = sd.SpecEngine(tiny_target, d, sd.SpecConfig(num_steps=3, max_new_tokens=MAX_NEW), max_len=256)
    checked = accepted = 0
    for p in prompt_ids[:6]:
        r = engine.speculative(p)
        x = p + r.tokens
        full = torch.tensor([x])
        aux, last, _ = target_states(tiny_target, full)
        with torch.no_grad():
            logits, _, _ = d(full[:, 1:], d.project((aux if use_aux else last)[:, :-1]), torch.arange(len(x) - 1)[None])
        pred = d.to_target_ids(logits.argmax(-1))[0].tolist()  # pred[t] is the draft's guess for x[t+2]
        m = len(p)
        for a in r.accepted:
            if m + 1 < len(x):
                assert (a >= 1) == (pred[m - 1] == x[m + 1]), (m, a)
                checked += 1
                accepted += a >= 1
            m += a + 1
    engine.close()
    assert checked > 20 and accepted > 0


def test_engine_reads_the_layers_the_draft_was_trained_on(tiny_target):
    cfg = draft_config_for_target(tiny_target.model.config, draft_vocab_size=8, capture_layers=[1, 3, 6])
    d = Eagle3Draft(cfg, tiny_target.model.get_input_embeddings()).eval()
    engine = sd.SpecEngine(tiny_target, d, sd.SpecConfig(num_steps=2, max_new_tokens=4), max_len=64)
    assert engine.runner.layers == [1, 3, 6]
    engine.close()
