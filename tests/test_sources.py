"""Adapters on fixture rows written in each dataset family's schema, bad rows, and offline sources."""

import json
import time
from pathlib import Path

import pytest

from draftlab.core.records import conversation_id
from draftlab.dataset_discovery import offline
from draftlab.dataset_discovery import sources as S

FIXTURES = Path(__file__).parents[1] / "data" / "fixtures"

# fixture file -> (adapter it must be detected as, rows, roles of the first conversation)
FAMILIES = {
    "alpaca.jsonl": ("alpaca", 3, ["user", "assistant"]),
    "instruction_response.jsonl": ("instruction_response", 2, ["user", "assistant"]),
    "problem_solution.jsonl": ("problem_solution", 2, ["user", "assistant"]),
    "question_answer.jsonl": ("question_answer", 2, ["user", "assistant"]),
    "system_question_response.jsonl": ("system_question_response", 2, ["system", "user", "assistant"]),
    "openai_messages.jsonl": ("openai_messages", 2, ["user", "assistant", "user", "assistant"]),
    "sharegpt.jsonl": ("sharegpt", 2, ["user", "assistant"]),
    "commit.jsonl": ("commit", 2, ["user", "assistant"]),
    "opencodeinstruct.jsonl": ("opencodeinstruct", 2, ["user", "assistant"]),
}


def _normalize_file(name, **kw):
    path = FIXTURES / name
    adapter = S.detect_adapter(S.jsonl_columns(path), where=name)
    return adapter, S.normalize(S.read_jsonl_rows(path), name, adapter, **kw)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_each_family_becomes_canonical_conversations(name):
    expected_adapter, n, roles = FAMILIES[name]
    adapter, out = _normalize_file(name)
    assert adapter.name == expected_adapter
    assert out.rejects == []
    assert len(out.conversations) == n
    first = out.conversations[0]
    assert [m["role"] for m in first["messages"]] == roles
    for conv in out.conversations:
        assert set(conv) == {"id", "source", "messages", "meta"}
        assert conv["id"] == conversation_id(conv["messages"], name)
        assert all(isinstance(m["content"], str) and m["content"].strip() for m in conv["messages"])
        assert conv["meta"]["adapter"] == expected_adapter


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_datasets_load_dataset_gives_the_same_conversations(name):
    """The same files through `datasets.load_dataset("json")` (what local Parquet/JSON sources use)."""
    ds = S.load_local(FIXTURES / name)
    adapter = S.detect_adapter(ds.column_names, where=name)
    assert adapter.name == FAMILIES[name][0]
    via_datasets = S.normalize(iter(ds), name, adapter)
    _, via_lines = _normalize_file(name)
    assert [c["id"] for c in via_datasets.conversations] == [c["id"] for c in via_lines.conversations]


def test_draftlabs_own_conversations_keep_their_meta():
    """A blend's output read back as a source (the reference held-out split) keeps the definition each
    prompt came from, which decontamination by definition needs; nested values and provenance are not copied."""
    row = {
        "messages": [{"role": "user", "content": "Explain `pkg.f`."}],
        "meta": {"package": "pkg", "qualname": "f", "template": "explain", "line": 99, "nested": {"a": 1}},
    }
    (conv,) = S.normalize([row], "ref", S.ADAPTERS[0]).conversations
    assert S.ADAPTERS[0].name == "openai_messages"
    assert conv["meta"] == {
        "package": "pkg",
        "qualname": "f",
        "template": "explain",
        "line": 1,
        "adapter": "openai_messages",
    }


def test_alpaca_input_is_appended_only_when_present():
    _, out = _normalize_file("alpaca.jsonl")
    first, second = out.conversations[0]["messages"][0]["content"], out.conversations[1]["messages"][0]["content"]
    assert first == "Write a function that returns the square of a number."
    assert second == "Reverse the given string.\n\nhello"


def test_sharegpt_maps_speakers_and_keeps_system_turn():
    _, out = _normalize_file("sharegpt.jsonl")
    assert [m["role"] for m in out.conversations[1]["messages"]] == ["system", "user", "assistant"]
    assert out.conversations[1]["messages"][0]["content"] == "You are a senior engineer."


def test_commit_is_an_edit_request():
    _, out = _normalize_file("commit.jsonl")
    edit, create = out.conversations
    assert "Guard mean against empty input" in edit["messages"][0]["content"]
    assert "return sum(xs) / len(xs)" in edit["messages"][0]["content"]  # old contents in the prompt
    assert "raise ValueError" in edit["messages"][1]["content"]  # new contents in the answer
    assert edit["messages"][0]["content"].startswith("Apply this change to `utils/math.py`")
    assert create["messages"][0]["content"].startswith("Create `README.md`")
    assert edit["meta"]["commit"] == "0f3a1c2"


def test_empty_system_prompt_is_dropped_and_opencodeinstruct_meta_kept():
    _, out = _normalize_file("system_question_response.jsonl")
    assert [m["role"] for m in out.conversations[1]["messages"]] == ["user", "assistant"]
    _, oci = _normalize_file("opencodeinstruct.jsonl")
    assert oci.conversations[0]["meta"]["domain"] == "generic"
    assert oci.conversations[0]["meta"]["id"] == "a1b2c3"


def test_unknown_schema_fails_fast_naming_columns_and_adapters():
    with pytest.raises(S.AdapterError) as err:
        S.detect_adapter(S.jsonl_columns(FIXTURES / "unknown_schema.jsonl"), where="unknown_schema.jsonl")
    msg = str(err.value)
    assert "unknown_schema.jsonl" in msg and "'completion'" in msg and "'prompt'" in msg
    for adapter in S.ADAPTERS:
        assert adapter.name in msg


def test_named_adapter_must_fit():
    with pytest.raises(S.AdapterError, match=r"needs columns \['output'\]"):
        S.detect_adapter(["instruction", "response"], name="alpaca")
    with pytest.raises(S.AdapterError, match="unknown adapter"):
        S.detect_adapter(["a"], name="nope")
    assert S.detect_adapter(["instruction", "input", "output"]).name == "alpaca"
    assert S.detect_adapter(["id", "input", "output", "domain"]).name == "opencodeinstruct"


def test_bad_rows_become_rejects_and_the_rest_goes_on():
    _, out = _normalize_file("bad_rows.jsonl")
    assert len(out.conversations) == 1 and out.conversations[0]["meta"]["line"] == 1
    reasons = {r["line"]: r["reason"] for r in out.rejects}
    assert all(r["source"] == "bad_rows.jsonl" for r in out.rejects)
    assert reasons[2] == "missing field 'output'"
    assert reasons[3] == "field 'instruction' is int, not str"
    assert reasons[4].startswith("empty content in messages[0]")
    assert reasons[5] == "missing field 'output'"
    assert reasons[6].startswith("invalid UTF-8 in messages[0].content")
    assert reasons[7].startswith("not valid JSON on line 7")
    assert reasons[8].startswith("invalid UTF-8 at byte")
    assert reasons[9] == "row is list, not an object"


def test_bad_chat_rows_and_role_map():
    _, out = _normalize_file("bad_chat.jsonl")
    reasons = {r["line"]: r["reason"] for r in out.rejects}
    assert [c["meta"]["line"] for c in out.conversations] == [1]
    assert reasons[2] == "unknown role 'tool' in messages[1]"
    assert reasons[3].startswith("empty content in messages[0]")
    assert reasons[4] == "messages[0].content is list, not str"
    assert reasons[5] == "field 'messages' is str, not a list of turns"
    assert reasons[6] == "no user message"
    assert reasons[7] == "messages[0] has no 'role'"
    _, mapped = _normalize_file("bad_chat.jsonl", role_map={"tool": "user"})
    assert 2 in [c["meta"]["line"] for c in mapped.conversations]


def test_absurd_length_is_rejected():
    rows = [{"instruction": "x" * 50, "output": "y" * 60}]
    out = S.normalize(rows, "s", S.ADAPTERS_BY_NAME["alpaca"], max_chars=100)
    assert out.rejects[0]["reason"] == "absurd length: 110 characters > max_chars 100"


def test_load_hub_reads_a_dataset_repository_layout(tmp_path):
    """The Hub loader on a local folder laid out like a dataset repo (no network here)."""
    (tmp_path / "data").mkdir()
    rows = [json.loads(line) for line in (FIXTURES / "alpaca.jsonl").read_text().splitlines()] * 4
    (tmp_path / "data" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ds, cols = S.load_hub(str(tmp_path), split="train")
    assert set(cols) == {"instruction", "input", "output"} and len(ds) == 12
    sample, cols = S.load_hub(str(tmp_path), split="train", max_rows=5, seed=1)
    got = list(sample)
    assert len(got) == 5 and "instruction" in cols
    assert got == list(S.load_hub(str(tmp_path), split="train", max_rows=5, seed=1)[0])  # seeded


def test_load_hub_fails_fast_offline():
    t = time.time()
    with pytest.raises(Exception):
        S.load_hub("nvidia/OpenCodeInstruct", split="train")
    assert time.time() - t < 30


# ------------------------------------------------------------------------- offline sources


def test_humaneval_is_complete_and_eval_only():
    rows = offline.humaneval_conversations()
    assert len(rows) == 164 and len({r["id"] for r in rows}) == 164
    assert rows[0]["meta"]["task_id"] == "HumanEval/0" and rows[0]["meta"]["eval_only"] is True
    assert rows[0]["meta"]["version"] != "unknown"
    assert rows[0]["messages"][0]["content"].startswith("Complete the following Python function.")
    assert len(offline.humaneval_texts()) == 164


def test_definitions_in_a_file(tmp_path):
    src = tmp_path / "mod.py"
    src.write_text(
        'def public(a, b=1) -> int:\n    """Add two numbers together and return the sum."""\n    return a + b\n\n'
        'def _private():\n    """A private helper that must not be listed at all."""\n\n'
        "def undocumented():\n    pass\n\n"
        'class Box:\n    """A box that holds one value for later use."""\n'
        '    def get(self):\n        """Return the value that the box is holding."""\n'
    )
    defs = offline.definitions_in_file(src, "pkg", "1.0", "pkg/mod.py")
    assert [(d.qualname, d.kind) for d in defs] == [("public", "function"), ("Box", "class"), ("Box.get", "method")]
    assert defs[0].signature == "(a, b=1) -> int" and defs[0].module == "pkg.mod"
    assert offline.definitions_in_file(src, "pkg", "1.0", "pkg/_internal.py") == []  # private module


def test_docstring_source_is_deterministic_and_records_versions():
    a = offline.docstring_conversations(["pyyaml"], limit=25)
    b = offline.docstring_conversations(["pyyaml"], limit=25)
    assert a == b and len(a) == 25
    import importlib.metadata

    assert offline.package_versions(a) == {"pyyaml": importlib.metadata.version("pyyaml")}
    templates = {r["meta"]["template"] for r in a}
    assert templates <= {"write", "explain", "test", "use"} and len(templates) >= 2
    assert all(r["messages"][0]["role"] == "user" and len(r["messages"]) == 1 for r in a)


def test_stdlib_docstrings_sample_spreads_over_modules():
    rows = offline.docstring_conversations("stdlib", limit=60, max_per_file=3)
    assert len(rows) == 60
    assert len({r["meta"]["module"] for r in rows}) >= 20
    assert {r["meta"]["package"] for r in rows} == {"stdlib"}


def test_more_templates_add_prompts_per_definition_and_keep_the_first():
    one = offline.docstring_conversations(["pyyaml"], limit=200)
    all_ = offline.docstring_conversations(["pyyaml"], limit=800, templates=4)
    by_def = {}
    for r in all_:
        by_def.setdefault((r["meta"]["module"], r["meta"]["qualname"]), []).append(r)
    assert len(by_def) == len(one) and len(all_) > 2.5 * len(one)
    for r in one:  # each definition's first prompt is the one-template source's prompt
        assert by_def[(r["meta"]["module"], r["meta"]["qualname"])][0]["messages"] == r["messages"]
    for rows in by_def.values():  # distinct templates, 3 for a class and 4 for a function or method
        assert (
            len({x["meta"]["template"] for x in rows}) == len(rows) == (3 if rows[0]["meta"]["kind"] == "class" else 4)
        )
    assert len({r["id"] for r in all_}) == len(all_)


def test_templates_must_be_a_positive_integer(tmp_path):
    from draftlab.blend.spec import BlendSpecError, load_spec

    for bad in ("0", "two", "1.5"):
        path = tmp_path / "s.yaml"
        path.write_text(
            f"total: 10\nsources:\n  - name: d\n    kind: docstrings\n    weight: 1\n    templates: {bad}\n"
        )
        with pytest.raises(BlendSpecError, match="templates"):
            load_spec(path)
