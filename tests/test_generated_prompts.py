"""Prompts written by the target itself: the filter rules, the template prefix, and the generator end to end
against a stub OpenAI-compatible server on the loopback (plus one slow run on the embedded target)."""

import itertools
import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from draftlab.core.errors import RunFailure
from draftlab.core.records import RecordError
from draftlab.dataset_discovery.eval_sets import shipped_rows
from draftlab.dataset_discovery.generated_prompts import GenConfig, generate, template_parts
from draftlab.dataset_discovery.prompt_filter import FilterConfig, screen

GOOD = "Can you explain how a hash map handles collisions, with a short example in Python?"


@pytest.mark.parametrize(
    "text, reason",
    [
        (GOOD, None),
        ("Write a haiku about autumn rain in the city.", None),
        ("", "empty"),
        ("Hi there", "too short"),
        ("word " * 500, "too long"),
        ("Sure! Here is a function that sorts a list of numbers for you.", "assistant leakage (opens like an answer)"),
        ("How do I sort a list?<|im_end|>\n<|im_start|>assistant\nUse sorted().", "assistant leakage"),
        ("How do I sort a list in Python?\nAssistant: use sorted()", "assistant leakage (role marker"),
        ("I'm sorry, but I cannot help with writing that kind of request today.", "refusal"),
        ("The cat sat on the mat and the cat sat on the mat and the cat sat on the mat again", "repeated n-grams"),
        ("1234 5678 9012 3456 7890 !!!! ???? ++++", "not language-like"),
        ("Объясните, пожалуйста, как работает сортировка слиянием в Python?", "not English-like"),
    ],
)
def test_filter_rules(text, reason):
    got = screen(text, FilterConfig(), markers=("<|im_end|>",))
    assert (got is None) if reason is None else got.startswith(reason), got


class ChatML:
    """A tokenizer stand-in with SmolLM2's ChatML template (default system prompt included)."""

    eos_token = "<|im_end|>"
    all_special_tokens = ["<|im_start|>", "<|im_end|>"]

    def apply_chat_template(self, messages, tokenize=False):
        if messages[0]["role"] != "system":
            messages = [{"role": "system", "content": "You are a helpful AI assistant."}] + messages
        return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)


def test_template_prefix_stops_where_the_user_text_starts():
    prefix, end = template_parts(ChatML())
    assert prefix == "<|im_start|>system\nYou are a helpful AI assistant.<|im_end|>\n<|im_start|>user\n"
    assert end == "<|im_end|>"
    hist = [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]
    prefix2, _ = template_parts(ChatML(), hist)
    assert prefix2.endswith("<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\n")


def stub_completions(answer):
    """A loopback /v1/completions that answers each request body with answer(body) (finish 'stop'; 'length'
    for a text marked LENGTH:); returns (server, its URL, the bodies seen)."""
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            text = answer(body)
            finish = "length" if text.startswith("LENGTH:") else "stop"
            out = json.dumps({"choices": [{"text": text.removeprefix("LENGTH:"), "finish_reason": finish}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_port}", seen


def _stub_server(texts):
    """stub_completions answering the canned texts in turn."""
    answers = itertools.cycle(texts)
    return stub_completions(lambda body: next(answers))


def test_generator_end_to_end_with_resume(tmp_path):
    mt_bench = shipped_rows("mt-bench")[3]["messages"][0]["content"]
    texts = [
        GOOD + "<|im_end|>",
        "What are three good habits for writing clean, readable commit messages?",
        GOOD,  # an exact duplicate
        "I'm sorry, I cannot write a question about that topic for you right now.",
        "LENGTH:Tell me about the history of " + "very " * 40,  # ran out of tokens inside the turn
        mt_bench,  # an evaluation prompt: contaminated
        "How do I read a CSV file with pandas and plot two of its columns?",
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    ]
    server, url, seen = _stub_server(texts)
    out = tmp_path / "prompts.jsonl"
    cfg = GenConfig(
        base_urls=[url], model="stub", n=3, out=str(out), concurrency=1
    )  # one in flight: answers in attempt order
    try:
        summary = generate(cfg, tokenizer=ChatML(), progress=False)
        assert summary["kept"] == 3
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        assert [r["messages"][0]["content"] for r in rows] == [GOOD, texts[1], texts[6]]
        assert all(r["messages"][0]["role"] == "user" and r["source"] == "generated/stub" for r in rows)
        reasons = [json.loads(x)["reason"] for x in (tmp_path / "prompts.jsonl.rejects.jsonl").read_text().splitlines()]
        assert [r.split(" (")[0] for r in reasons] == [
            "duplicate",
            "refusal",
            "no end of turn within 256 tokens",
            "contaminated",
        ]
        assert reasons[-1].startswith("contaminated (mt-bench/")
        assert seen[0]["prompt"].endswith("<|im_start|>user\n") and seen[0]["stop"] == ["<|im_end|>"]
        first_attempts = summary["attempts"]

        summary = generate(
            GenConfig(base_urls=[url], model="stub", n=4, out=str(out), concurrency=1), ChatML(), progress=False
        )
        rows = [json.loads(x) for x in out.read_text().splitlines()]
        assert summary["kept"] == 4 and rows[3]["messages"][0]["content"] == texts[7]
        assert summary["attempts"] > first_attempts and len({r["id"] for r in rows}) == 4  # continued, not restarted

        with pytest.raises(RecordError, match="other settings \\(temperature differ"):
            generate(
                GenConfig(base_urls=[url], model="stub", n=5, out=str(out), temperature=0.5), ChatML(), progress=False
            )
    finally:
        server.shutdown()


def test_follow_ups_write_second_turns(tmp_path):
    conv = tmp_path / "answered.jsonl"
    conv.write_text(
        json.dumps({"messages": [{"role": "user", "content": "Hi?"}, {"role": "assistant", "content": "Hello."}]})
        + "\n"
    )
    server, url, seen = _stub_server(["Could you now explain how recursion works, step by step?", GOOD])
    try:
        cfg = GenConfig(base_urls=[url], model="stub", n=1, out=str(tmp_path / "p.jsonl"), follow_ups=str(conv))
        generate(cfg, tokenizer=ChatML(), eval_texts={}, progress=False)
    finally:
        server.shutdown()
    row = json.loads((tmp_path / "p.jsonl").read_text())
    assert [m["role"] for m in row["messages"]] == ["user", "assistant", "user"] and row["meta"]["turn"] == 2
    assert "Hello.<|im_end|>\n<|im_start|>user\n" in seen[0]["prompt"]


def test_openings_start_the_user_turns_in_turn(tmp_path):
    server, url, seen = _stub_server([" reverses a list in place without a copy.", " about autumn rain in the city."])
    cfg = GenConfig(
        base_urls=[url],
        model="stub",
        n=2,
        out=str(tmp_path / "p.jsonl"),
        concurrency=1,
        openings=("Write a Python function that", "Write a short poem"),
    )
    try:
        generate(cfg, tokenizer=ChatML(), eval_texts={}, progress=False)
    finally:
        server.shutdown()
    rows = [json.loads(x) for x in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [r["messages"][0]["content"] for r in rows] == [
        "Write a Python function that reverses a list in place without a copy.",
        "Write a short poem about autumn rain in the city.",
    ]
    assert [r["meta"]["opening"] for r in rows] == list(cfg.openings)
    assert [b["prompt"].split("<|im_start|>user\n")[1] for b in seen[:2]] == list(cfg.openings)


def test_a_server_that_does_not_sample_is_named(tmp_path):
    server, url, _ = _stub_server([GOOD])
    try:
        with pytest.raises(RunFailure, match="same text: the server decodes greedily"):
            generate(GenConfig(base_urls=[url], model="stub", n=2, out=str(tmp_path / "p.jsonl")), ChatML(), {}, False)
    finally:
        server.shutdown()


def test_bad_input_is_one_line():
    run = subprocess.run(
        [sys.executable, "-m", "draftlab.cli", "prompts", "generate", "--base-url", "http://127.0.0.1:9",
         "--model", "embedded", "--n", "0", "--out", "/tmp/never.jsonl"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and run.stderr.strip() == "error: --n 0: ask for at least one prompt"


@pytest.mark.parametrize(
    "args, line",
    [
        (["--model", "embedded"], "error: prompts generate: give --base-url URL and --model NAME, or --serve TARGET"),
        (["--serve", "embedded", "--sglang-prefix", "/x"], "error: --sglang-prefix: only with --sglang-servers K"),
        (["--serve", "no-such-target"], "error: --serve "),
        (
            ["--serve", "embedded", "--sglang-servers", "-1"],
            "error: draftlab prompts generate: argument --sglang-servers: '-1' is not",
        ),
    ],
)
def test_server_options_are_one_line(tmp_path, args, line):
    run = subprocess.run(
        [sys.executable, "-m", "draftlab.cli", "prompts", "generate", "--n", "1", "--out", str(tmp_path / "p.jsonl"),
         *args], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2 and run.stderr.startswith(line) and len(run.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "p.jsonl").exists()


@pytest.mark.slow
@pytest.mark.server
def test_embedded_target_writes_prompts(tmp_path):
    """The real embedded target, served for the run (`--serve`: transformers serve, sampling): it writes user
    turns that pass the filter, and the server is gone afterwards."""
    out = tmp_path / "p.jsonl"
    run = subprocess.run(
        [sys.executable, "-m", "draftlab.cli", "prompts", "generate", "--serve", "embedded", "--device", "cpu",
         "--n", "2", "--max-tokens", "96", "--concurrency", "2", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout.strip().splitlines()[-1])["kept"] == 2
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 2 and all(screen(r["messages"][0]["content"]) is None for r in rows)
    assert (tmp_path / "serve.log").is_file()
