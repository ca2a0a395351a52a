"""The recipe study's broad set: each kind's share, its openings reaching the prompt writer, summaries from real
prose, the kinds in turn in the written set (a text two kinds wrote kept once), resume, and bad input."""

import json
import lzma
import subprocess
import sys

import pytest

from draftlab.dataset_discovery.generated_prompts import generate
from draftlab.dataset_discovery.prompt_filter import FilterConfig, screen
from draftlab.dataset_discovery.prose import prose_conversations
from studies.recipes import broad
from studies.recipes.broad import FROM_PROSE, KINDS, broad_prompts, kind_counts
from tests.test_generated_prompts import ChatML, stub_completions

SHARED = " how tides work along a long rocky coast, please explain it to me?"
MATH_SECOND = KINDS["math"][0][1]  # the opening of math's second attempt


def stub_writer():
    """A loopback /v1/completions that continues a user turn with a distinct text naming the kind its opening
    belongs to, except that chat's second turn and math's second one come out the same."""
    count = {}

    def answer(body):
        turn = body["prompt"].split("<|im_start|>user\n")[-1]
        kind = next((k for k, (openings, _, _) in KINDS.items() if turn in openings), "chat")
        count[kind] = count.get(kind, 0) + 1
        if kind == "chat":  # its second turn is the one math's second attempt writes after its opening
            text = f"Help me understand chat question number {count[kind]} about my small garden project."
            return MATH_SECOND + SHARED if count[kind] == 2 else text
        if kind == "math" and count[kind] == 2:
            return SHARED
        return f" this {kind} question number {count[kind]} about my small garden project, please help."

    return stub_completions(answer)


@pytest.mark.parametrize("n", [5, 7, 100, 22044])
def test_kind_counts_follow_the_shares_and_sum_to_n(n):
    counts = kind_counts(n)
    assert sum(counts.values()) == n and set(counts) == set(KINDS)
    assert all(abs(counts[k] - n * share) < 1 for k, (_, share, _) in KINDS.items())


def test_broad_prompts_write_every_kind_in_turn(tmp_path, monkeypatch):
    monkeypatch.setattr(broad, "generate", _generate_with(ChatML()))
    server, url, seen = stub_writer()
    try:
        result = broad_prompts([url], "stub", 20, tmp_path / "work", tmp_path / "broad.jsonl.xz", concurrency=1)
    finally:
        server.shutdown()
    assert {k: v.get("kept", 0) + v["prose"] for k, v in result["kinds"].items()} == kind_counts(20)
    assert result["kinds"]["summaries"] == {"prose": 3}  # real passages enough: nothing asked of the target
    rows = [json.loads(line) for line in lzma.open(tmp_path / "broad.jsonl.xz", "rt")]
    kinds = [r["meta"]["kind"] for r in rows]
    assert kinds[:5] == list(KINDS)  # one of each kind in turn
    assert result["written"] == len(rows) == 19  # the text chat and math both wrote: chat's copy alone
    assert sum(r["messages"][0]["content"] == MATH_SECOND + SHARED for r in rows) == 1
    assert all(r["messages"][0]["role"] == "user" and len(r["messages"]) == 1 for r in rows)
    for kind, (openings, _, max_tokens) in KINDS.items():
        asked = [b for b in seen if b["prompt"].split("<|im_start|>user\n")[-1] in (openings or ("",))]
        mine = [r for r in rows if r["meta"]["kind"] == kind]
        if kind in FROM_PROSE:
            assert not asked and all(r["source"] == "prose" and r["meta"]["package"] for r in mine)
            continue
        assert asked and all(b["max_tokens"] == max_tokens for b in asked)
        texts = [r["messages"][0]["content"] for r in mine]
        assert all(any(t.startswith(o) for o in openings) for t in texts) if openings else texts
    again = broad_prompts([url], "stub", 20, tmp_path / "work", tmp_path / "broad2.jsonl.xz", concurrency=1)
    assert again["written"] == result["written"]  # resumed from the work folder: nothing asked again
    assert (tmp_path / "broad2.jsonl.xz").read_bytes() == (tmp_path / "broad.jsonl.xz").read_bytes()


def _generate_with(tokenizer):
    """generate with a stand-in tokenizer and no evaluation sets (the stub's texts are not contaminated)."""
    return lambda cfg, progress=True: generate(cfg, tokenizer=tokenizer, eval_texts={}, progress=False)


def test_too_few_prompts_is_one_line(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "studies.recipes", "broad-prompts", "--base-url", "http://127.0.0.1:9", "--model", "m",
         "--n", "3", "--work", str(tmp_path / "w"), "--out", str(tmp_path / "o.jsonl.xz")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and run.stderr.strip() == "error: --n 3: at least 5 (one prompt a kind)"
    assert not (tmp_path / "w").exists()


def test_no_opening_is_refused_by_the_filter_whatever_follows():
    """An opening the filter refuses (e.g. "Here is ...": opens like an answer) would waste every attempt."""
    rest = "the numbers in my notes from class today, as clearly as you can please."
    for kind, (openings, _, _) in KINDS.items():
        for opening in openings:
            assert screen(opening + rest, FilterConfig(), markers=("<|im_end|>",)) is None, (kind, opening)


def test_the_target_writes_the_summaries_that_prose_cannot_fill(tmp_path, monkeypatch):
    monkeypatch.setattr(broad, "generate", _generate_with(ChatML()))
    monkeypatch.setattr(broad, "prose_conversations", lambda: prose_conversations(limit=1))
    server, url, seen = stub_writer()
    try:
        result = broad_prompts([url], "stub", 20, tmp_path / "work", tmp_path / "broad.jsonl.xz", concurrency=1)
    finally:
        server.shutdown()
    assert result["kinds"]["summaries"]["prose"] == 1 and result["kinds"]["summaries"]["kept"] == 2
    rows = [json.loads(line) for line in lzma.open(tmp_path / "broad.jsonl.xz", "rt")]
    summaries = [r for r in rows if r["meta"]["kind"] == "summaries"]
    assert [r["source"] for r in summaries] == ["prose", "generated/stub", "generated/stub"]
    assert all(b["max_tokens"] == 512 for b in seen if b["prompt"].endswith(KINDS["summaries"][0]))
