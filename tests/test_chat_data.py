"""Tokenisation with the target's chat template, assistant-only loss masks, draft vocabulary."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from draftlab.core.process import alive
from draftlab.core.records import RecordError, make_conversation
from draftlab.model import chat_data
from draftlab.model.chat_data import (
    load_tokenized,
    split_holdout,
    tokenize_conversation,
    tokenize_rows,
)
from draftlab.model.target import load_tokenizer
from draftlab.train_draft.vocab import build_draft_vocab, coverage, token_counts


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny")  # the embedded (SmolLM2) tokenizer and chat template


CHAT = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi there"},
    {"role": "assistant", "content": "Hello! How can I help?"},
    {"role": "user", "content": "2+2?"},
    {"role": "assistant", "content": "4"},
]


def masked_text(tok, ids, mask):
    return tok.decode([i for i, m in zip(ids, mask) if m])


def test_mask_covers_assistant_replies_and_end_of_turn_only(tok):
    ids, mask, status = tokenize_conversation(tok, CHAT, 512)
    assert status == "ok"
    assert masked_text(tok, ids, mask) == "Hello! How can I help?<|im_end|>4<|im_end|>"
    # the newline the template writes after <|im_end|> is not a training target
    last = max(j for j, m in enumerate(mask) if m)
    assert tok.decode([ids[last]]) == "<|im_end|>" and tok.decode(ids[last + 1 :]) == "\n"
    # the text is the template's own rendering, without extra special tokens
    assert tok.decode(ids) == tok.apply_chat_template(CHAT, tokenize=False)


def test_default_system_prompt_template_still_masks_right(tok):
    ids, mask, _ = tokenize_conversation(tok, CHAT[1:3], 512)
    assert "SmolLM" in tok.decode(ids)  # the template inserted its default system prompt
    assert masked_text(tok, ids, mask) == "Hello! How can I help?<|im_end|>"


def test_other_template_without_newline(tok):
    t = load_tokenizer("tiny")
    t.chat_template = (
        "{% for m in messages %}{{ '<|im_start|>' + m['role'] + ': ' + m['content'] + '<|im_end|>' }}"
        "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant: ' }}{% endif %}"
    )
    ids, mask, _ = tokenize_conversation(t, CHAT[1:3], 512)
    assert masked_text(t, ids, mask).strip() == "Hello! How can I help?<|im_end|>"


def test_overlong_truncate_or_drop_and_counts(tok):
    rows = [
        make_conversation(CHAT, "x"),
        make_conversation([{"role": "user", "content": "q " * 300}, {"role": "assistant", "content": "a"}], "x"),
        make_conversation([{"role": "user", "content": "only a question"}], "x"),
    ]
    kept, st = tokenize_rows(rows, tok, 64, "truncate")
    assert (st.kept, st.truncated, st.dropped_no_assistant) == (1, 0, 2)  # the truncated one lost its reply
    kept, st = tokenize_rows(rows[:1], tok, 40, "truncate")
    assert st.truncated == 1 and len(kept[0]["input_ids"]) == 40
    kept, st = tokenize_rows(rows, tok, 64, "drop")
    assert (st.kept, st.dropped_overlong, st.dropped_no_assistant) == (1, 1, 1)
    with pytest.raises(ValueError, match="overlong"):
        tokenize_conversation(tok, CHAT, 64, "cut")


def test_bad_row_names_file_row_and_field(tok, tmp_path):
    p = tmp_path / "train.jsonl"
    good = make_conversation(CHAT, "x")
    bad = {"id": "b", "messages": [{"role": "user", "content": 3}]}
    p.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(RecordError, match=r"train.jsonl: row 2: messages\[0\].content"):
        load_tokenized(p, tok, 128)
    with pytest.raises(FileNotFoundError, match="03_regenerate"):
        load_tokenized(tmp_path / "missing.jsonl", tok, 128)


def test_load_tokenized_caches(tok, tmp_path):
    p = tmp_path / "train.jsonl"
    p.write_text(
        "".join(
            json.dumps(
                make_conversation(
                    CHAT[:3] + [{"role": "user", "content": f"q{i}"}, {"role": "assistant", "content": f"a{i}"}], "x"
                )
            )
            + "\n"
            for i in range(5)
        )
    )
    ds, stats = load_tokenized(p, tok, 256, cache_dir=tmp_path / "cache")
    assert len(ds) == 5 and stats["kept"] == 5 and stats["loss_tokens"] > 0
    ds2, stats2 = load_tokenized(p, tok, 256, cache_dir=tmp_path / "cache")
    assert ds2["input_ids"] == ds["input_ids"] and stats2 == stats
    tr, va = split_holdout(p, 2, tmp_path / "holdout")
    assert sum(1 for _ in open(tr)) == 3 and sum(1 for _ in open(va)) == 2


def test_draft_vocab_by_masked_frequency():
    samples = [
        {"input_ids": [7, 5, 5, 9, 9, 9, 3], "loss_mask": [0, 1, 1, 1, 1, 1, 0]},
        {"input_ids": [9, 2, 2], "loss_mask": [1, 0, 0]},
    ]
    counts = token_counts(samples, 12)
    assert counts.tolist() == [0, 0, 0, 0, 0, 2, 0, 0, 0, 4, 0, 0]  # unmasked 7, 3, 2 not counted
    assert build_draft_vocab(counts, 1).tolist() == [9]
    assert build_draft_vocab(counts, 2).tolist() == [5, 9]  # sorted by id
    assert build_draft_vocab(counts, 4).tolist() == [0, 1, 5, 9]  # padded with the lowest unseen ids
    assert coverage(counts, torch.tensor([9])) == pytest.approx(4 / 6)
    with pytest.raises(ValueError, match="sample b: token id 20 >= vocab_size 12"):
        token_counts(
            [{"id": "a", "input_ids": [3], "loss_mask": [1]}, {"id": "b", "input_ids": [20, 30], "loss_mask": [1, 0]}],
            12,
        )


def conversations(n: int) -> list[dict]:
    return [
        make_conversation(
            [{"role": "user", "content": f"question {i} " * (1 + i % 5)}, {"role": "assistant", "content": f"a{i}"}],
            "x",
        )
        for i in range(n)
    ]


def test_parallel_tokenising_matches_one_process(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(chat_data, "CHUNK_ROWS", 7)
    monkeypatch.setattr(chat_data, "PARALLEL_MIN_ROWS", 20)
    rows = conversations(40)
    rows[5]["messages"] = [{"role": "user", "content": "no reply"}]  # dropped, counted in the stats
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    serial, serial_stats = load_tokenized(p, tok, 256, workers=1)
    calls = []
    real = chat_data.tokenize_rows_parallel
    monkeypatch.setattr(chat_data, "tokenize_rows_parallel", lambda *a: calls.append(a[-1]) or real(*a))
    parallel, parallel_stats = load_tokenized(p, tok, 256, workers=2)
    assert calls == [2]  # it did run in two processes
    assert parallel_stats == serial_stats and parallel_stats["dropped_no_assistant"] == 1
    assert parallel["id"] == serial["id"] and parallel["input_ids"] == serial["input_ids"]
    assert parallel["loss_mask"] == serial["loss_mask"]
    # a limit reads rows one by one in this process
    assert len(load_tokenized(p, tok, 256, limit=3, workers=2)[0]) == 3 and calls == [2]


def test_parallel_tokenising_names_the_bad_row_of_a_later_chunk(tok, tmp_path, monkeypatch):
    monkeypatch.setattr(chat_data, "CHUNK_ROWS", 7)
    monkeypatch.setattr(chat_data, "PARALLEL_MIN_ROWS", 20)
    rows = conversations(30)
    rows[22] = {"id": "bad", "messages": [{"role": "user", "content": 3}]}
    p = tmp_path / "train.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(RecordError, match=r"train.jsonl: row 23: messages\[0\].content"):
        load_tokenized(p, tok, 256, workers=2)
    # a bad row early in a large file: the chunks not yet started are dropped, not tokenised first
    rows = conversations(300)
    rows[1] = {"id": "bad", "messages": [{"role": "user", "content": 3}]}
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    started = tmp_path / "started"
    monkeypatch.setenv("CHUNKS_STARTED", str(started))
    monkeypatch.setattr(chat_data, "_tokenize_chunk", counted_chunk)
    with pytest.raises(RecordError, match=r"train.jsonl: row 2: messages\[0\].content"):
        load_tokenized(p, tok, 256, workers=2)
    assert len(started.read_text().split()) < 300 // 7 // 2


REAL_TOKENIZE_CHUNK = chat_data._tokenize_chunk


def counted_chunk(chunk):
    """chat_data._tokenize_chunk that first writes a line per chunk begun (in the forked workers)."""
    with open(os.environ["CHUNKS_STARTED"], "a") as f:
        f.write(f"{chunk[0]}\n")
    return REAL_TOKENIZE_CHUNK(chunk)


WORKER_SCRIPT = """
import os, sys, time
from draftlab.model import chat_data
from draftlab.model.target import load_tokenizer

def slow_chunk(chunk):  # a worker that says it started, then takes long
    with open(sys.argv[2], "a") as f:
        f.write(f"{os.getpid()}\\n")
    time.sleep(120)

chat_data._tokenize_chunk = slow_chunk
chat_data.load_tokenized(sys.argv[1], load_tokenizer("tiny"), 256, workers=2)
"""


def test_tokenising_workers_die_with_a_killed_parent(tmp_path):
    """A SIGKILLed parent would leave a pool's forked workers behind for good (seen here with a plain
    ProcessPoolExecutor): they ask the kernel to kill them with it."""
    data, pids = tmp_path / "train.jsonl", tmp_path / "pids"
    data.write_text("".join(json.dumps(r) + "\n" for r in conversations(chat_data.PARALLEL_MIN_ROWS)))
    parent = subprocess.Popen([sys.executable, "-c", WORKER_SCRIPT, str(data), str(pids)])
    try:
        deadline = time.monotonic() + 60
        while not (pids.is_file() and len(pids.read_text().split()) == 2):
            assert time.monotonic() < deadline and parent.poll() is None, "the workers did not start"
            time.sleep(0.2)
        workers = [int(p) for p in pids.read_text().split()]
        assert all(alive(p) for p in workers)
        parent.kill()
        parent.wait()
        deadline = time.monotonic() + 10
        while any(alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not any(alive(p) for p in workers)
    finally:
        parent.kill()
        for p in pids.read_text().split() if pids.is_file() else []:
            if alive(int(p)):
                os.kill(int(p), signal.SIGKILL)
