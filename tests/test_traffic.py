"""The user's own traffic: OpenAI request bodies, bare messages, SGLang's JSON request log, bad rows."""

import json

import pytest

from draftlab.benchmark_acceptance.eval_suite import load_set
from draftlab.blend import blend
from draftlab.core.records import RecordError
from draftlab.dataset_discovery.traffic import read_traffic, traffic_prompts

BODY = {
    "model": "smollm",
    "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Sort a list in Python?"}],
    "temperature": 0.7,
    "max_tokens": 64,
}
MESSAGES = {"messages": [{"role": "user", "content": "What is a monad?"}]}
PARTS = {
    "messages": [{"role": "user", "content": [{"type": "text", "text": "Explain"}, {"type": "text", "text": "TCP"}]}]
}
BATCH = {"custom_id": "r1", "method": "POST", "url": "/v1/chat/completions", "body": MESSAGES | {"model": "m"}}


def _write(path, lines):
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x) for x in lines) + "\n")
    return path


def test_openai_bodies_and_bare_messages(tmp_path):
    path = _write(tmp_path / "served.jsonl", [BODY, "", MESSAGES, PARTS, BATCH])
    rows = traffic_prompts(path)
    assert [r["messages"][-1]["content"] for r in rows] == [
        "Sort a list in Python?",
        "What is a monad?",
        "Explain\nTCP",
        "What is a monad?",
    ]
    assert rows[0]["messages"][0] == {"role": "system", "content": "Be brief."}
    assert rows[0]["meta"].items() >= {"model": "smollm", "temperature": 0.7, "max_tokens": 64, "line": 1}.items()
    assert rows[1]["meta"]["line"] == 3  # the editor's line: the blank line counts
    assert len({r["id"] for r in rows[:3]}) == 3


def test_sglang_json_request_log(tmp_path):
    """SGLang 0.5.17's --log-requests-format json lines: '[time] {...}'; only the OpenAI events are requests."""
    received = {"timestamp": "t", "event": "request.received.openai", "obj": BODY}
    tokenized = {"timestamp": "t", "event": "request.received", "rid": "x", "obj": {"text": "<|im_start|>user..."}}
    finished = {"timestamp": "t", "event": "request.finished", "rid": "x", "obj": {}, "out": {"text": "ok"}}
    lines = [f"[2026-12-07 10:00:00] {json.dumps(e)}" for e in (received, tokenized, finished)]
    rows = traffic_prompts(_write(tmp_path / "host_0.log", lines))
    assert len(rows) == 1 and rows[0]["messages"][-1]["content"] == "Sort a list in Python?"
    assert rows[0]["meta"]["model"] == "smollm"


def test_level_2_cut_strings_are_refused(tmp_path):
    cut = "a" * 1024 + "..." + "b" * 1024  # SGLang's --log-requests-level 2 form of a long string
    event = {"event": "request.received.openai", "obj": {"messages": [{"role": "user", "content": cut}]}}
    with pytest.raises(RecordError, match=r"line 1: messages\[0\]\.content was cut .* level 3"):
        traffic_prompts(_write(tmp_path / "log.jsonl", [event]))


@pytest.mark.parametrize(
    "line, field",
    [
        ("{not json", "not valid JSON"),
        ({"model": "m"}, "no 'messages' field"),
        ({"messages": [{"role": "tool", "content": "x"}]}, r"messages\[0\]\.role is 'tool'"),
        ({"messages": [{"role": "user", "content": None}]}, r"messages\[0\]\.content is missing"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, r"'image_url' part"),
        ({"messages": [{"role": "assistant", "content": "hi"}]}, "no user message"),
        ([1, 2], "not an object"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path, line, field):
    path = _write(tmp_path / "bad.jsonl", [MESSAGES, line])
    with pytest.raises(RecordError, match=rf"bad\.jsonl: line 2: .*{field}"):
        traffic_prompts(path)
    assert read_traffic(path).rejects[0]["line"] == 2  # the blend keeps going: one reject


def test_missing_or_empty_file(tmp_path):
    with pytest.raises(RecordError, match="does not exist"):
        traffic_prompts(tmp_path / "nope.jsonl")
    with pytest.raises(RecordError, match="no chat requests"):
        traffic_prompts(_write(tmp_path / "empty.jsonl", [{"event": "request.finished", "obj": {}}]))


def test_traffic_is_an_eval_set(tmp_path):
    path = _write(tmp_path / "served.jsonl", [BODY, MESSAGES])
    s = load_set(f"traffic={path}")
    assert (s.name, s.kind, s.general, len(s.prompts)) == ("traffic/served", "traffic", True, 2)
    assert all(p["set"] == "traffic/served" for p in s.prompts)


def test_traffic_is_a_blend_source(tmp_path):
    path = _write(tmp_path / "served.jsonl", [BODY, MESSAGES, {"model": "m"}])
    spec = {
        "tokenizer": "none",
        "sources": [{"name": "ours", "kind": "traffic", "path": str(path)}],
        "decontaminate": {"against": []},
        "filters": {"min_tokens": 1},
        "splits": {"train": 1.0, "val": 0.0, "test": 0.0},
    }
    report = blend(spec, tmp_path / "blend", progress=False)
    assert report["splits"]["train"] == 2 and report["rejected"] == 1
    rejects = [json.loads(x) for x in (tmp_path / "blend" / "rejects.jsonl").read_text().splitlines()]
    assert rejects == [{"source": "ours", "line": 3, "reason": "no 'messages' field (keys ['model'])"}]
