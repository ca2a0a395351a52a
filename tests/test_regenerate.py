"""draftlab.regenerate: input checks, replay plans, crash-safe files, and runs against a real server."""

import json

import pytest

from draftlab.core.records import RecordError
from draftlab.regenerate import (
    RegenConfig,
    finalize,
    load_conversations,
    plan_turns,
    regenerate,
    repair_jsonl,
    scan_work,
    slots,
)
from helpers_regen import (  # noqa: F401
    all_shard_rows,
    make_conversations,
    read_lines,
    tiny_server,
    write_jsonl,
)

# ------------------------------------------------------------------ input and plans


@pytest.mark.parametrize(
    "line, match",
    [
        ("{not json", "line 2: not valid JSON"),
        (json.dumps({"id": "x", "messages": [{"role": "bot", "content": "a"}]}), r"line 2: messages\[0\].role"),
        (json.dumps({"id": "x", "messages": [{"role": "user", "content": 3}]}), r"line 2: messages\[0\].content"),
        (json.dumps({"messages": [{"role": "user", "content": "a"}]}), "line 2: missing field 'id'"),
        (json.dumps({"id": "x", "messages": [{"role": "system", "content": "a"}]}), "line 2: .*no user turn"),
    ],
)
def test_bad_input_names_file_line_and_field(tmp_path, line, match):
    good = make_conversations(1)[0]
    path = tmp_path / "blend.jsonl"
    path.write_text(json.dumps(good) + "\n" + line + "\n")
    with pytest.raises(RecordError, match=match) as err:
        load_conversations(path)
    assert str(path) in str(err.value)


def test_duplicate_ids_are_an_error(tmp_path):
    row = make_conversations(1)[0]
    path = write_jsonl(tmp_path / "in.jsonl", [row, row])
    with pytest.raises(RecordError, match="line 2: duplicate id"):
        load_conversations(path)


def test_plan_applies_system_policy_and_turn_limit():
    msgs = [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
    ]
    assert [m["role"] for m in plan_turns(msgs, RegenConfig())] == ["system", "user", "assistant", "user", "assistant"]
    assert plan_turns(msgs, RegenConfig(system_policy="drop"))[0]["role"] == "user"
    p = plan_turns(msgs, RegenConfig(system_policy="set", system_prompt="Be brief."))
    assert p[0] == {"role": "system", "content": "Be brief."} and len(p) == 5
    p = plan_turns(msgs, RegenConfig(max_assistant_turns=1))
    assert [m["content"] for m in p] == ["S", "u1", "a1"] and slots(p) == [2]
    prompt_only = plan_turns([{"role": "user", "content": "q"}], RegenConfig())
    assert prompt_only[-1] == {"role": "assistant", "content": ""} and slots(prompt_only) == [1]
    with pytest.raises(ValueError, match="system_prompt"):
        RegenConfig(system_policy="set")
    with pytest.raises(ValueError, match="truncation"):
        RegenConfig(truncation="keep")


def test_repair_cuts_a_torn_tail_and_rejects_damage_elsewhere(tmp_path):
    path = tmp_path / "part.jsonl"
    path.write_bytes(b'{"id": "a"}\n{"id": "b"}\n{"id": "c", "mess')
    assert [r["id"] for r in repair_jsonl(path)] == ["a", "b"]
    assert path.read_bytes() == b'{"id": "a"}\n{"id": "b"}\n'
    path.write_bytes(b'{"id": "a"}\n{"id": "b"}')  # whole row, newline lost
    assert [r["id"] for r in repair_jsonl(path)] == ["a", "b"]
    assert path.read_bytes().endswith(b"}\n")
    path.write_bytes(b'{"id": "a"}\n{"id": \n{"id": "c"}\n')
    with pytest.raises(RecordError, match="line 2"):
        repair_jsonl(path)


def test_finalize_keeps_input_order_and_counts(tmp_path):
    rows = make_conversations(5)
    work = tmp_path / "work"
    (work / "shards").mkdir(parents=True)
    write_jsonl(work / "shards" / "part-00000.jsonl", [rows[3], rows[0]])
    write_jsonl(work / "shards" / "part-00001.jsonl", [rows[1]])
    write_jsonl(work / "dropped.jsonl", [{"id": rows[2]["id"], "reason": "length"}])
    write_jsonl(work / "errors.jsonl", [{"id": rows[4]["id"], "reason": "HTTP 500"}])
    counts = finalize(work, tmp_path / "train.jsonl", rows)
    assert [r["id"] for r in read_lines(tmp_path / "train.jsonl")] == [rows[i]["id"] for i in (0, 1, 3)]
    assert counts["rows_kept"] == 3 and counts["rows_dropped_truncated"] == 1
    assert counts["rows_error"] == 1 and counts["rows_missing"] == 0


# ------------------------------------------------------------------ against the tiny target's real server


def _cfg(srv, **kw):
    kw.setdefault("max_tokens", 6)
    kw.setdefault("concurrency", 6)
    return RegenConfig(model=srv.model, model_name="tiny", **kw)


@pytest.mark.server
def test_end_to_end_multi_turn_records(tiny_server, tmp_path):
    rows = make_conversations(24)
    cfg = _cfg(
        tiny_server,
        truncation="keep_flag",
        system_policy="set",
        system_prompt="Be brief.",
        temperature=0.7,
        top_p=0.9,
        seed=3,
        stop=["\n\n"],
    )
    summary = regenerate(rows, tmp_path / "work", [tiny_server.base_url], cfg, progress=False)
    assert summary["rows_done"] == 24 and summary["rows_error"] == 0
    out = {r["id"]: r for r in all_shard_rows(tmp_path / "work")}
    assert set(out) == {r["id"] for r in rows}
    for src in rows:
        got = out[src["id"]]
        regen = got["meta"]["regen"]
        n_turns = max(1, sum(m["role"] == "assistant" for m in src["messages"]))
        assert got["messages"][0] == {"role": "system", "content": "Be brief."}
        assert [m["role"] for m in got["messages"][1:]] == [
            m["role"] for m in src["messages"] if m["role"] != "system"
        ] + (["assistant"] if src["messages"][-1]["role"] == "user" else [])
        assert len(regen["finish_reasons"]) == n_turns == len(regen["completion_tokens"])
        assert regen["model"] == "tiny" and regen["servers"] == [tiny_server.base_url] * n_turns
        assert regen["sampling"] == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 6, "stop": ["\n\n"], "seed": 3}
        assert regen["system_policy"] == "set" and regen["system_prompt"] == "Be brief."
        assert all(0 < c <= 6 for c in regen["completion_tokens"])
        assert regen["truncated"] == ("length" in regen["finish_reasons"])
        assert got["meta"]["row"] == src["meta"]["row"]  # the source meta is kept
        if n_turns == 2:  # turn 2 was asked with the regenerated turn 1 in its history
            assert regen["prompt_tokens"][1] > regen["prompt_tokens"][0] + regen["completion_tokens"][0]
            assert got["messages"][2]["content"] != src["messages"][-3]["content"]
    kept_flagged = sum(r["meta"]["regen"]["truncated"] for r in out.values())
    assert summary["rows_kept_truncated"] == kept_flagged


@pytest.mark.server
def test_truncation_drop_counts_and_resume(tiny_server, tmp_path):
    rows = make_conversations(20, multi_turn_every=0)
    work = tmp_path / "work"
    cfg = _cfg(tiny_server, max_tokens=3, truncation="drop")
    first = regenerate(rows[:12], work, [tiny_server.base_url], cfg, progress=False)
    assert first["rows_done"] + first["rows_dropped_truncated"] == 12
    assert first["rows_dropped_truncated"] > 0, "3-token answers of a random model should be cut"
    dropped = read_lines(work / "dropped.jsonl")
    assert all(d["reason"] == "length" and d["completion_tokens"] == [3] for d in dropped)
    assert not any(r["meta"]["regen"]["truncated"] for r in all_shard_rows(work))
    again = regenerate(rows, work, [tiny_server.base_url], cfg, progress=False)
    assert again["rows_skipped_resume"] == 12
    assert again["rows_done"] + again["rows_dropped_truncated"] == 8
    state = scan_work(work)
    assert state.finished == {r["id"] for r in rows} and state.duplicates == 0
    counts = finalize(work, tmp_path / "train.jsonl", rows)
    assert counts["rows_kept"] + counts["rows_dropped_truncated"] == 20


@pytest.mark.server
def test_dead_server_is_taken_out(tiny_server, tmp_path):
    from draftlab.core.serve import free_port

    dead = f"http://127.0.0.1:{free_port()}"
    rows = make_conversations(16, multi_turn_every=0)
    cfg = _cfg(tiny_server, truncation="keep_flag", down_after=2, server_cooldown=30, backoff_base=0.01)
    summary = regenerate(rows, tmp_path / "work", [dead, tiny_server.base_url], cfg, progress=False)
    assert summary["rows_done"] == 16 and summary["rows_error"] == 0
    assert summary["servers"][dead]["outages"] == 1 and summary["servers"][dead]["ok"] == 0
    assert all(r["meta"]["regen"]["servers"] == [tiny_server.base_url] for r in all_shard_rows(tmp_path / "work"))


@pytest.mark.server
def test_cli_end_to_end_with_output(tiny_server, tmp_path):
    from draftlab.regenerate.cli import main

    rows = make_conversations(6)
    src = write_jsonl(tmp_path / "blend" / "train.jsonl", rows)
    code = main(
        [
            "regenerate",
            str(src),
            str(tmp_path / "work"),
            "--base-url",
            tiny_server.base_url,
            "--model",
            tiny_server.model,
            "--max-tokens",
            "4",
            "--truncation",
            "keep_flag",
            "--output",
            str(tmp_path / "regen" / "train.jsonl"),
            "--no-progress",
        ]
    )
    assert code == 0
    assert [r["id"] for r in read_lines(tmp_path / "regen" / "train.jsonl")] == [r["id"] for r in rows]


@pytest.mark.slow
@pytest.mark.server
def test_embedded_server_end_to_end(tmp_path):
    """The real embedded target through its server: answers are text, counts are the tokenizer's."""
    from draftlab.core.serve import LocalServer
    from draftlab.model.target import load_tokenizer, resolve_path

    rows = make_conversations(6, multi_turn_every=3)
    tok = load_tokenizer("embedded")
    with LocalServer(resolve_path("embedded"), log_path=tmp_path / "serve.log") as srv:
        cfg = RegenConfig(
            model=srv.model, model_name="SmolLM2-135M-Instruct", max_tokens=24, truncation="keep_flag", concurrency=6
        )
        summary = regenerate(rows, tmp_path / "work", [srv.base_url], cfg, progress=False)
    assert summary["rows_done"] == 6 and summary["rows_error"] == 0
    for row in all_shard_rows(tmp_path / "work"):
        regen = row["meta"]["regen"]
        answers = [m["content"] for m in row["messages"] if m["role"] == "assistant"]
        assert set(regen["finish_reasons"]) <= {"stop", "length"}
        for text, n, reason in zip(answers, regen["completion_tokens"], regen["finish_reasons"]):
            assert text.strip() and any(c.isalpha() for c in text)
            n_tok = len(tok(text, add_special_tokens=False).input_ids)
            assert abs(n_tok - n) <= 2, (text, n, n_tok)
            if reason == "length":
                assert n == 24


# ------------------------------------------------------------------ the batch backend (CPU, tiny target)


@pytest.fixture
def one_thread():
    """The tiny model's ops are so small that a second thread only adds waiting on a busy CPU
    (measured: 0.43 s vs 0.06 s per 6-token generate with neighbours' load)."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_batch_backend_same_records_and_resume(tmp_path, one_thread):
    from draftlab.model.target import load_target
    from draftlab.regenerate import regenerate_batch

    target = load_target("tiny", device="cpu")
    rows = make_conversations(7, multi_turn_every=3)
    work = tmp_path / "work"
    cfg = RegenConfig(model="tiny", max_tokens=5, truncation="keep_flag", system_policy="drop")
    first = regenerate_batch(rows[:4], work, cfg, target=target, batch_size=3, progress=False)
    assert first["rows_done"] == 4
    summary = regenerate_batch(rows, work, cfg, target=target, batch_size=3, progress=False)
    assert summary["rows_skipped_resume"] == 4 and summary["rows_done"] == 3
    out = {r["id"]: r for r in all_shard_rows(work)}
    assert set(out) == {r["id"] for r in rows}
    for src in rows:
        regen = out[src["id"]]["meta"]["regen"]
        msgs = out[src["id"]]["messages"]
        assert regen["backend"] == "batch" and regen["servers"][0].startswith("transformers.generate:cpu")
        assert msgs[0]["role"] == "user"  # system prompts dropped
        assert all(0 <= c <= 5 for c in regen["completion_tokens"])
        assert all(f in ("stop", "length") for f in regen["finish_reasons"])
        assert regen["truncated"] == ("length" in regen["finish_reasons"])
        n_turns = len(regen["completion_tokens"])
        assert n_turns == max(1, sum(m["role"] == "assistant" for m in src["messages"]))
        if n_turns == 2:
            assert regen["prompt_tokens"][1] > regen["prompt_tokens"][0] + regen["completion_tokens"][0]
        # the recorded answer is what the target's tokenizer gives back for those tokens
        for m, n in zip([m for m in msgs if m["role"] == "assistant"], regen["completion_tokens"]):
            assert n == 0 or m["content"]
    manifest = json.loads((work / "manifest.json").read_text())
    assert [r["backend"] for r in manifest["runs"]] == ["batch", "batch"]


def test_batch_greedy_matches_one_by_one_generation(tmp_path, one_thread):
    """Static batching with left padding gives the same greedy answers as unbatched generate."""
    import torch

    from draftlab.model.target import load_target
    from draftlab.regenerate import generate_turns

    target = load_target("tiny", device="cpu")
    prompts = [
        r["messages"][:-1] if r["messages"][-1]["role"] == "assistant" else r["messages"]
        for r in make_conversations(4, multi_turn_every=0, system_every=2)
    ]
    cfg = RegenConfig(max_tokens=6)
    batched = generate_turns(target, prompts, cfg, batch_size=4)
    assert generate_turns(target, prompts, cfg, batch_size=4, cache="static") == batched
    for p, got in zip(prompts, batched):
        ids = target.tokenizer(
            target.render(p, add_generation_prompt=True), return_tensors="pt", add_special_tokens=False
        ).input_ids
        with torch.inference_mode():
            out = target.model.generate(
                ids, max_new_tokens=6, do_sample=False, pad_token_id=target.tokenizer.pad_token_id
            )
        new = out[0, ids.shape[1] :].tolist()
        eos = set(target.eos_token_ids)
        n = next((j for j, t in enumerate(new) if t in eos), len(new))
        assert got["completion_tokens"] == n
        assert got["text"] == target.tokenizer.decode(new[:n], skip_special_tokens=True)


def test_resume_refuses_other_sampling(tmp_path):
    from draftlab.regenerate import write_manifest

    work = tmp_path / "work"
    (work / "shards").mkdir(parents=True)
    write_manifest(work, "in.jsonl", 3, RegenConfig(max_tokens=16), "server", [])
    write_jsonl(work / "shards" / "part-00000.jsonl", make_conversations(1))
    with pytest.raises(ValueError, match="max_tokens: 16 -> 32"):
        write_manifest(work, "in.jsonl", 3, RegenConfig(max_tokens=32), "server", [])
    write_manifest(work, "in.jsonl", 5, RegenConfig(max_tokens=16, concurrency=3), "batch", [])


def test_second_writer_is_refused(tmp_path):
    from draftlab.regenerate import WorkLock

    with WorkLock(tmp_path / "work"):
        with pytest.raises(RuntimeError, match="another process"):
            regenerate(
                make_conversations(1), tmp_path / "work", ["http://127.0.0.1:9"], RegenConfig(model="m"), progress=False
            )
    with WorkLock(tmp_path / "work"):  # released: free again
        pass


def test_batch_size_sweep_forces_equal_work_per_row(tmp_path, one_thread):
    """`draftlab bench generate`: every size decodes exactly new_tokens per row; rows are written."""
    from draftlab.cli import main

    src = tmp_path / "prompts.jsonl"
    write_jsonl(src, make_conversations(3, multi_turn_every=0))
    out = tmp_path / "sweep.json"
    assert (
        main(
            [
                "bench",
                "generate",
                str(src),
                "--target",
                "tiny",
                "--device",
                "cpu",
                "--batch-sizes",
                "1,4",
                "--new-tokens",
                "5",
                "--json",
                str(out),
            ]
        )
        == 0
    )
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch_size"] for r in rows] == [1, 4]
    for r in rows:
        assert r["new_tokens"] == 5 and r["seconds"] > 0
        assert r["output_tok_s"] == pytest.approx(r["batch_size"] * 5 / r["seconds"], rel=0.05)


def test_batch_size_sweep_takes_median_length_prompts(one_thread):
    """A batch of one is the median-length prompt, not the first or the longest (padding and memory)."""
    from draftlab.model.target import load_target
    from draftlab.regenerate import sweep_batch_sizes

    target = load_target("tiny", device="cpu")
    prompts = [[{"role": "user", "content": "word " * n}] for n in (40, 1, 200, 5, 80)]
    rows = sweep_batch_sizes(target, prompts, [1], new_tokens=2)
    median = target.render(prompts[0], add_generation_prompt=True)
    assert rows[0]["prompt_len_padded"] == len(target.tokenizer(median, add_special_tokens=False).input_ids)


def test_plan_batches_equal_runs_within_rows_and_tokens():
    from draftlab.regenerate import plan_batches

    # rows only: 10 rows at 4 a batch -> 3 runs of 4, 4, 2 would leave a small tail; equal runs are 4, 3, 3
    assert [len(r) for r in plan_batches([5] * 10, 4, 0, 8)] == [4, 3, 3]
    runs = plan_batches(list(range(1, 101)), 64, 2000, 10)  # sorted lengths 1..100, 10 new tokens
    assert sorted(i for r in runs for i in r) == list(range(100))
    assert all(len(r) <= 64 and len(r) * (r[-1] + 1 + 10) <= 2000 for r in runs)
    sizes = [len(r) for r in runs]
    assert max(sizes) - min(sizes) <= 1  # equal runs, no small tail
    assert plan_batches([], 8, 100, 4) == []


def test_batch_tokens_caps_generate_calls_and_errors_what_cannot_fit(tmp_path, one_thread, monkeypatch):
    from draftlab.model.target import load_target
    from draftlab.regenerate import batch as regen_batch

    target = load_target("tiny", device="cpu")
    prompts = [[{"role": "user", "content": "word " * n}] for n in (1, 2, 3, 4, 300)]
    calls = []
    real = target.model.generate

    def spy(**kw):
        calls.append(tuple(kw["input_ids"].shape))
        return real(**kw)

    monkeypatch.setattr(target.model, "generate", spy)
    cfg = RegenConfig(max_tokens=4)
    res = regen_batch.generate_turns(target, prompts, cfg, batch_size=8, batch_tokens=60)
    assert "exceeds batch_tokens 60" in res[4]["error"]
    assert all("text" in r for r in res[:4])
    assert len(calls) >= 2 and all(b * (t + 4) <= 60 for b, t in calls)
