"""Live-server benchmark: parsing of SGLang-shaped bodies (fixtures written here), the window loop
against a mock SGLang, the statistics, the sweep plan, evaluation sets, and the baseline path
against a real local server (tiny target)."""

import json
import math

import httpx
import pytest

from draftlab.benchmark_acceptance import cli as bench_cli
from draftlab.benchmark_acceptance import live as bench
from draftlab.dataset_discovery.offline import HUMANEVAL_INSTRUCTION

# SGLang's native /generate body (meta_info always present; speculative fields on EAGLE servers)
GENERATE_SPEC = {
    "text": " Paris.",
    "meta_info": {
        "id": "a1b2",
        "finish_reason": {"type": "length", "length": 32},
        "prompt_tokens": 12,
        "completion_tokens": 32,
        "cached_tokens": 0,
        "e2e_latency": 0.21,
        "spec_verify_ct": 14,
        "spec_accept_length": 2.2857,
        "spec_accept_rate": 0.43,
    },
}
GENERATE_PLAIN = {
    "text": " Paris.",
    "meta_info": {
        "id": "c3",
        "finish_reason": {"type": "stop", "matched": 2},
        "prompt_tokens": 12,
        "completion_tokens": 9,
        "cached_tokens": 0,
        "e2e_latency": 0.1,
    },
}
# OpenAI chat body with return_meta_info: true (meta_info inside each choice, usage beside it)
CHAT_SPEC = {
    "id": "x",
    "object": "chat.completion",
    "created": 0,
    "model": "default",
    "choices": [
        {
            "index": 0,
            "message": {"role": "assistant", "content": "def add(a, b):\n    return a + b"},
            "finish_reason": "stop",
            "matched_stop": 2,
            "meta_info": {
                "id": "x",
                "prompt_tokens": 40,
                "completion_tokens": 21,
                "spec_verify_ct": 7,
                "finish_reason": {"type": "stop", "matched": 2},
            },
        }
    ],
    "usage": {"prompt_tokens": 40, "completion_tokens": 21, "total_tokens": 61},
}
CHAT_PLAIN = {
    "id": "y",
    "object": "chat.completion",
    "created": 0,
    "model": "default",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "length"}],
    "usage": {"prompt_tokens": 40, "completion_tokens": 16, "total_tokens": 56},
}


def test_parse_shapes():
    u = bench.parse_response(GENERATE_SPEC)
    assert (u.completion_tokens, u.spec_verify_ct, u.prompt_tokens, u.finish_reason) == (32, 14, 12, "length")
    u = bench.parse_response(CHAT_SPEC)
    assert (u.completion_tokens, u.spec_verify_ct, u.finish_reason) == (21, 7, "stop")
    assert bench.parse_response(CHAT_PLAIN).spec_verify_ct is None
    assert bench.parse_response(GENERATE_PLAIN).spec_verify_ct is None
    assert bench.parse_response(GENERATE_SPEC).e2e_latency == pytest.approx(0.21)  # the server's own seconds
    assert bench.parse_response(CHAT_SPEC).e2e_latency is None  # not given: never a made-up 0


def test_a_window_sums_the_servers_latencies_only_when_every_reply_has_one():
    spec, plain, chat = (bench.parse_response(b) for b in (GENERATE_SPEC, GENERATE_PLAIN, CHAT_SPEC))
    w = bench.measured_window("x", "u", 1, 0, [spec, plain], 0.5, True, 0, True)
    assert w.server_s == pytest.approx(0.31) and w.wall_s == 0.5
    assert bench.measured_window("x", "u", 1, 0, [spec, chat], 0.5, True, 0, True).server_s is None
    assert bench.measured_window("x", "u", 1, 0, [], 0.5, True, 0, True).server_s is None


def test_parse_errors_name_the_problem():
    with pytest.raises(ValueError, match="req 3: field 'choices' is empty"):
        bench.parse_response({"choices": []}, "req 3")
    with pytest.raises(ValueError, match="no completion_tokens"):
        bench.parse_response({"choices": [{"message": {}}]})
    with pytest.raises(ValueError, match="neither"):
        bench.parse_response({"text": "x"})


def test_acceptance_is_token_weighted_and_absent_without_fields():
    a, b = bench.parse_response(GENERATE_SPEC), bench.parse_response(CHAT_SPEC)
    assert bench.acceptance_length([a, b]) == pytest.approx((32 + 21) / (14 + 7))
    # the per-request mean (2.2857 + 3.0) / 2 differs: we never report that as the figure
    assert bench.acceptance_length([a, b]) != pytest.approx((32 / 14 + 21 / 7) / 2)
    assert bench.acceptance_length([bench.parse_response(CHAT_PLAIN)]) is None
    assert bench.acceptance_length([a, bench.parse_response(CHAT_PLAIN)]) is None  # never a silent 1.0
    assert bench.acceptance_length([]) is None


def mock_sglang(spec: bool, completion=20, verify=8):
    """A transport that answers like SGLang (or a plain server) and records flushes."""
    seen = {"flush": 0, "chat": []}

    def handler(request: httpx.Request):
        if request.url.path == "/flush_cache":
            seen["flush"] += 1
            return httpx.Response(200, text="Cache flushed.")
        body = json.loads(request.content)
        seen["chat"].append(body)
        meta = {"completion_tokens": completion, "prompt_tokens": 5}
        if spec:
            meta["spec_verify_ct"] = verify
        choice = {"index": 0, "message": {"role": "assistant", "content": "x"}, "finish_reason": "length"}
        if body.get("return_meta_info"):
            choice["meta_info"] = meta
        return httpx.Response(200, json={"choices": [choice], "usage": {"completion_tokens": completion}})

    return httpx.MockTransport(handler), seen


def test_bench_endpoint_windows_and_flush():
    transport, seen = mock_sglang(spec=True)
    prompts = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
    windows = bench.bench_endpoint(
        "http://sg:1",
        prompts,
        label="eagle3",
        concurrency=[1, 3],
        repeats=2,
        warmup=2,
        max_tokens=20,
        transport=transport,
        progress=False,
    )
    assert len(windows) == 4 and seen["flush"] == 4  # one flush before each window
    assert len(seen["chat"]) == 2 + 4 * 6  # warm-up + windows
    assert all(b["temperature"] == 0 and b["return_meta_info"] and not b["stream"] for b in seen["chat"])
    w = windows[0]
    assert w.completion_tokens == 120 and w.verify_steps == 48 and w.acceptance_length == pytest.approx(2.5)
    assert w.tokens_per_s > 0 and w.flushed


def test_plain_server_has_no_acceptance():
    transport, _ = mock_sglang(spec=False)
    prompts = [[{"role": "user", "content": "q"}]] * 3
    windows = bench.bench_endpoint(
        "http://base:1", prompts, label="baseline", repeats=2, warmup=0, transport=transport, progress=False
    )
    assert all(w.acceptance_length is None and w.verify_steps is None for w in windows)
    table = bench.summarize_windows(windows, baseline="baseline")
    assert table["acceptance_length"].isna().all()
    assert table["speedup"].iloc[0] == pytest.approx(1.0)


def test_summary_ci_and_speedup():
    mk = lambda label, rep, tps, verify: bench.Window(
        label, "u", 1, rep, 4, 100, verify, 100 / tps, tps, (100 / verify) if verify else None, True, 0, True
    )
    windows = [mk("baseline", i, t, None) for i, t in enumerate([90.0, 92.0, 88.0])]
    windows += [mk("eagle3", i, t, 40) for i, t in enumerate([180.0, 184.0, 176.0])]
    table = bench.summarize_windows(windows, baseline="baseline", eval_set="humaneval", samples=4).set_index("label")
    assert table.loc["baseline", "tokens_per_s"] == pytest.approx(90.0)
    mean, half = bench.mean_ci([90.0, 92.0, 88.0])
    assert half == pytest.approx(4.303 * 2.0 / math.sqrt(3), rel=1e-3)  # t(0.975, 2) * sd / sqrt(n)
    assert table.loc["eagle3", "speedup"] == pytest.approx(2.0)
    assert table.loc["eagle3", "acceptance_length"] == pytest.approx(2.5)
    assert table.loc["eagle3", "eval_set"] == "humaneval" and table.loc["eagle3", "samples"] == 4


def test_sweep_grid_and_plan_equal_max_running_requests():
    grid = bench.sweep_grid(steps=(1, 3), topks=(1, 4), draft_tokens=(4, 8, 16))
    assert (1, 1, 2) in grid and (3, 1, 4) in grid  # chains: D = S + 1
    assert (3, 4, 8) in grid and (3, 4, 16) in grid and (1, 4, 16) not in grid  # 15 > 4 nodes at S=1
    plan = bench.sweep_plan("/m", "/d", grid, max_running_requests=64, port=31000)
    assert plan[0]["label"] == "baseline" and "--speculative-algorithm" not in plan[0]["command"]
    assert all("--max-running-requests 64" in e["command"] for e in plan)
    assert len({e["url"] for e in plan}) == len(plan)
    e = next(e for e in plan if (e["steps"], e["topk"], e["draft_tokens"]) == (3, 4, 8))
    assert "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8" in e["command"]


def test_eval_sets(tmp_path):
    he = bench.load_eval_set("humaneval")
    assert len(he) == 164 and he[0]["id"] == "HumanEval/0"
    assert he[0]["messages"][0]["content"].startswith(HUMANEVAL_INSTRUCTION)
    with pytest.raises(FileNotFoundError, match="02_blend"):
        bench.load_eval_set("blend", run_dir=tmp_path)
    blend = tmp_path / "data" / "blend"
    blend.mkdir(parents=True)
    rows = [
        {
            "id": "a",
            "source": "s",
            "meta": {},
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}],
        },
        {"id": "b", "source": "s", "meta": {}, "messages": [{"role": "assistant", "content": "no user"}]},
    ]
    (blend / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.load_eval_set("blend", run_dir=tmp_path, limit=1)[0]["messages"] == [{"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="test.jsonl: row 2: field 'messages' has no user turn"):
        bench.load_eval_set("blend", run_dir=tmp_path)


def test_cli_parser_builds():
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    bench_cli.add_bench_live_parser(sub)
    args = parser.parse_args(["live", "--baseline", "http://a", "--spec", "e3=http://b", "--concurrency", "1,4"])
    assert args.func is bench_cli.bench_live and args.spec == ["e3=http://b"]


@pytest.mark.server
def test_baseline_path_against_a_real_server(tiny_target, tmp_path):
    """transformers serve (tiny target): tokens/s measured, no /flush_cache, acceptance absent."""
    from draftlab.core.serve import LocalServer

    prompts = [[{"role": "user", "content": f"Say something about {w}."}] for w in ("cats", "rain", "code", "tea")]
    with LocalServer(tiny_target.path, log_path=tmp_path / "serve.log") as srv:
        windows = bench.bench_endpoint(
            srv.base_url,
            prompts,
            label="baseline",
            model=srv.model,
            concurrency=[1, 2],
            repeats=2,
            warmup=1,
            max_tokens=16,
            progress=False,
        )
    assert len(windows) == 4
    for w in windows:
        assert w.errors == 0 and w.requests == 4 and w.completion_tokens > 0 and w.tokens_per_s > 0
        assert w.acceptance_length is None and not w.flushed and not w.meta_info  # 422: not SGLang
