"""Notebook 06's runs (benchmark_acceptance.sweeps) on the tiny target, every branch the notebook
can take: both drafts on two sets, the wrong flag, the chain sweep reusing the per-set runs,
prompt lookup, a bf16 sweep with trees, a tree in the main dtype, break-even fits and metrics."""

import json

import pytest
import torch

from draftlab.benchmark_acceptance import report, sweeps
from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.export import export_draft

PROMPTS = ["Write a Python function that adds two numbers.", "What is a list comprehension?"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory, tiny_target):
    root = tmp_path_factory.mktemp("run06")
    for arch, use_aux in (("eagle3", True), ("eagle1", False)):
        torch.manual_seed(0)
        cfg = draft_config_for_target(tiny_target.model.config, draft_vocab_size=256, use_aux=use_aux)
        draft = Eagle3Draft(cfg, tiny_target.model.get_input_embeddings())
        draft.set_vocab(torch.arange(256))
        export_draft(draft, root / "drafts" / arch, dtype="float32")
    blend = root / "data" / "blend"
    blend.mkdir(parents=True)
    rows = [
        {
            "id": f"r{i}",
            "source": "test",
            "messages": [{"role": "user", "content": p}, {"role": "assistant", "content": "ok"}],
        }
        for i, p in enumerate(PROMPTS)
    ]
    (blend / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


def test_notebook_06_runs(run_dir, tiny_target):
    steps, chain_steps, new = 2, [1, 2], 6
    drafts = sweeps.load_drafts(run_dir, ["eagle3", "eagle1"], tiny_target)
    sets = sweeps.load_sets(tiny_target, ["blend", "humaneval"], run_dir, 2)
    assert [s["samples"] for s in sweeps.set_sizes(sets)] == [2, 2]
    first = "blend"

    main, greedy = sweeps.runs_by_set(tiny_target, drafts, sets, steps, new)
    assert [(r["eval_set"], r["arch"]) for r in main] == [
        ("blend", "eagle3"),
        ("blend", "eagle1"),
        ("humaneval", "eagle3"),
        ("humaneval", "eagle1"),
    ]
    assert set(greedy) == {"blend", "humaneval"}
    wrong = sweeps.wrong_mode_runs(tiny_target, drafts, sets[first], first, greedy[first], steps, new)
    assert [r["mode"] for r in wrong] == ["EAGLE"]
    chain = sweeps.runs_by_chain(
        tiny_target, drafts, ["eagle3"], sets[first], first, chain_steps, main, greedy[first], new
    )
    assert [r["num_steps"] for r in chain] == chain_steps
    assert chain[1] is main[0]  # S = 2 on the first set was measured in section 2 already
    lookup_rows = sweeps.lookup_by_chain(sets[first], greedy[first], first, chain_steps)
    assert all(r["acceptance_length"] >= 1.0 for r in lookup_rows)
    lookup_main = sweeps.lookup_by_set(sets, greedy, steps)

    assert (
        sweeps.fast_dtype_runs(
            "tiny",
            "cpu",
            "float32",
            "",
            run_dir / "drafts" / "eagle3",
            "eagle3",
            sets[first],
            first,
            chain_steps,
            [],
            [2, 3],
            steps,
            new,
        )
        == []
    )
    fast = sweeps.fast_dtype_runs(
        "tiny",
        "cpu",
        "float32",
        "bfloat16",
        run_dir / "drafts" / "eagle3",
        "eagle3",
        sets[first],
        first,
        chain_steps,
        [],
        [2, 3],
        steps,
        new,
    )
    assert [r["arch"] for r in fast] == ["eagle3", "eagle3", "eagle3 tree K=2 D=3"]
    assert {r["dtype"] for r in fast} == {"bfloat16"}
    tree = sweeps.tree_runs(
        tiny_target, drafts["eagle3"], "eagle3", sets[first], first, greedy[first], [2, 3], steps, new
    )
    assert tree[0]["topk"] == 2 and sweeps.tree_runs(tiny_target, None, "x", [], first, [], [], steps, new) == []

    fits, checks, model_arch = sweeps.breakeven_fits(chain, ["eagle3"])
    assert model_arch == "eagle3" and len(checks["eagle3"]) == 2
    lookup_rows = sweeps.predict_lookup(lookup_rows, fits, model_arch)
    assert all(r["predicted_speedup"] is not None for r in lookup_rows)
    fig = sweeps.plot_breakeven(fits[model_arch], chain_steps, checks[model_arch], "tiny")
    assert fig.axes
    fig = sweeps.breakeven_figure(fits, checks, model_arch, chain_steps, "cpu (float32), blend n=2")
    assert fig.axes[0].get_title().startswith("eagle3 on cpu (float32), blend n=2: v=")
    assert len(sweeps.checks_table(checks)) == 2 and set(sweeps.checks_table(checks)["arch"]) == {"eagle3"}
    assert sweeps.plot_speedup_dtypes(chain, fast, "eagle3").axes
    assert list(report.shown(fast, columns=["arch", "dtype"]).columns) == ["arch", "dtype"]

    m = sweeps.metrics(
        device="cpu",
        dtype="float32",
        max_new_tokens=new,
        sets=sets,
        main=main,
        wrong=wrong,
        chain=chain,
        fast=fast,
        lookup_main=lookup_main,
        lookup_rows=lookup_rows,
        tree=tree,
        fits=fits,
        checks=checks,
        example={},
        live=None,
    )
    assert m["lossless"] is True  # fp32 greedy verification emits exactly the target's greedy tokens
    assert len(m["by_set"]) == 4 and m["tree"] and m["by_chain_fast_dtype"]
    json.dumps(m, default=str)


def test_the_sections_notebook_06_can_skip(tmp_path):
    """06's optional sections are calls that return None (nb.save_figure then saves nothing) or a note."""
    assert sweeps.wrong_mode_runs(None, {"eagle3": None}, [], "blend", [], 3, 8, enabled=False) == []
    assert sweeps.plot_speedup_dtypes([], [], "eagle3") is None
    assert sweeps.breakeven_figure({}, {}, None, [1, 3], "cpu") is None
    assert sweeps.checks_table({}).empty
    assert sweeps.live_runs("", {"x": "http://h"}, "blend", tmp_path, 2) is None
    assert report.shown([]) == "skipped" and report.shown(None, "no live endpoints given") == "no live endpoints given"
    assert sweeps.sglang_study_dir("", tmp_path) == tmp_path / "sglang" / "study"
    assert sweeps.sglang_study_dir("elsewhere", tmp_path) == sweeps.Path("elsewhere")
    assert sweeps.sglang_breakeven(tmp_path, {}, {}, None, 3) == (None, None)
    assert sweeps.sglang_rates_table(None) is None
    assert list(sweeps.sglang_rates_table({"rates": [{"a": 1}]}).columns) == ["a"]
