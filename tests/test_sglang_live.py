"""benchmark_acceptance.sglang_live and .sglang_study: windows over /generate, resumable results, the study's table."""

import json
from pathlib import Path

import httpx
import pandas as pd
import pytest

from draftlab.benchmark_acceptance import sglang_live as live
from draftlab.benchmark_acceptance import sglang_study
from draftlab.benchmark_acceptance.live import Window
from draftlab.benchmark_acceptance.sglang_report import sglang_summary, variant_table
from draftlab.benchmark_acceptance.sglang_study import _trees, _variants, study_entries
from draftlab.cli import build_parser
from draftlab.core.errors import RunFailure
from draftlab.core.records import append_jsonl
from draftlab.sglang.launch import parse_launch


def mock_generate(verify_every: int | None, outputs=None):
    """A transport that answers /generate like SGLang: output ids, meta_info with spec_verify_ct
    (when speculative), and records flushes and bodies."""
    seen = {"flush": 0, "bodies": []}

    def handler(request: httpx.Request):
        if request.url.path == "/flush_cache":
            seen["flush"] += 1
            return httpx.Response(200, text="Cache flushed.")
        assert request.url.path == "/generate"
        body = json.loads(request.content)
        seen["bodies"].append(body)
        n = body["sampling_params"]["max_new_tokens"]
        ids = outputs(body["input_ids"]) if outputs else [t + 1 for t in body["input_ids"]][:n]
        meta = {
            "completion_tokens": len(ids),
            "prompt_tokens": len(body["input_ids"]),
            "finish_reason": {"type": "length"},
            "e2e_latency": 0.001 * len(ids),  # the server's own seconds for the request
        }
        if verify_every:
            meta["spec_verify_ct"] = -(-len(ids) // verify_every)
        return httpx.Response(200, json={"text": "x", "output_ids": ids, "meta_info": meta})

    return httpx.MockTransport(handler), seen


PROMPTS = [[i, i + 1, i + 2, i + 3] for i in range(0, 40, 4)]


def test_windows_send_the_same_ids_greedy_and_pool_acceptance():
    transport, seen = mock_generate(verify_every=2)
    entry = live.Entry("EAGLE3 S3", "cmd", concurrency=[1, 4], steps=3, topk=1, draft_tokens=4, algorithm="EAGLE3")
    windows, first = live.measure_server("http://sg:1", entry, PROMPTS, warmup=1, max_new_tokens=4, transport=transport)
    # per concurrency one unmeasured warm-up window, then one flushed measured one
    assert [w.concurrency for w in windows] == [1, 4] and seen["flush"] == 2
    assert len(seen["bodies"]) == 2 * 2 * len(PROMPTS)
    assert all(b["sampling_params"] == {"temperature": 0, "max_new_tokens": 4} for b in seen["bodies"])
    assert [b["input_ids"] for b in seen["bodies"][len(PROMPTS) : 2 * len(PROMPTS)]] == PROMPTS
    w = windows[0]
    assert w.completion_tokens == 40 and w.verify_steps == 20 and w.acceptance_length == pytest.approx(2.0)
    assert w.server_s == pytest.approx(0.001 * 40)  # the replies' e2e_latency summed: the server's share
    assert [r.index for r in first] == list(range(len(PROMPTS)))  # batch-1 outputs, in prompt order
    assert first[0].output_ids == [1, 2, 3, 4]


def test_a_concurrency_window_keeps_its_streams_busy_and_batch_1_uses_the_oracles_prompts():
    transport, seen = mock_generate(verify_every=2)
    entry = live.Entry("baseline", "cmd", concurrency=[1, 2, 8])
    windows, first = live.measure_server(
        "http://sg:1", entry, PROMPTS, warmup=0, max_new_tokens=4, samples=3, transport=transport
    )
    # batch 1: the first 3 (the engine's oracle prompts); c=2: max(3, 4*2) = 8; c=8: all 10 there are
    assert [w.requests for w in windows] == [3, 8, 10] and len(first) == 3
    assert [b["input_ids"] for b in seen["bodies"][:3]] == PROMPTS[:3]


def test_a_plain_server_has_no_acceptance_and_a_dead_one_fails_loudly():
    transport, _ = mock_generate(verify_every=None)
    windows, _ = live.measure_server(
        "http://b:1", live.Entry("baseline", "cmd"), PROMPTS, warmup=0, max_new_tokens=4, transport=transport
    )
    assert windows[0].acceptance_length is None and windows[0].verify_steps is None
    dead = httpx.MockTransport(lambda r: httpx.Response(503, text="down"))
    with pytest.raises(RuntimeError, match="every request failed"):
        live.measure_server(
            "http://b:1", live.Entry("baseline", "cmd"), PROMPTS, warmup=0, max_new_tokens=4, transport=dead
        )


def test_an_answer_without_output_ids_is_an_error_not_a_match():
    bad = httpx.MockTransport(lambda r: httpx.Response(200, json={"text": "x", "meta_info": {"completion_tokens": 1}}))
    with pytest.raises(RuntimeError, match="no 'output_ids'"):
        live.measure_server(
            "http://b:1",
            live.Entry("baseline", "cmd"),
            PROMPTS[:2],
            warmup=0,
            max_new_tokens=4,
            transport=bad,
        )


def test_agreement_counts_identical_outputs_and_common_prefix():
    a = [[1, 2, 3], [4, 5, 6], [7, 8]]
    b = [[1, 2, 3], [4, 9, 6], [0, 8]]
    got = live.agreement(a, b)
    assert got["identical"] == 1 and got["prompts"] == 3
    assert got["mean_common_prefix"] == pytest.approx((3 + 1 + 0) / 3)
    with pytest.raises(ValueError):
        live.agreement(a, b[:2])


def _write_result(out, label, tok_s, completion, verify, outputs, concurrency=1, **extra):
    w = Window(
        label,
        "u",
        concurrency,
        0,
        len(outputs),
        completion,
        verify,
        completion / tok_s,
        tok_s,
        completion / verify if verify else None,
        True,
        0,
        True,
    )
    append_jsonl(
        out / "windows.jsonl",
        [{**w.__dict__, "steps": extra.get("steps"), "server_avg_accept_length": extra.get("server")}],
    )
    append_jsonl(
        out / "outputs" / f"{live.slug(label)}.jsonl", [{"index": i, "output_ids": o} for i, o in enumerate(outputs)]
    )


def test_summary_gives_speedup_against_the_baseline_and_agreement(tmp_path):
    _write_result(tmp_path, "baseline", 800.0, 1000, None, [[1, 2, 3], [4, 5]])
    _write_result(tmp_path, "EAGLE3 S6 K1 D7", 1200.0, 1000, 400, [[1, 2, 3], [4, 6]], steps=6, server=2.49)
    table = live.summarize(tmp_path).set_index("label")
    spec = table.loc["EAGLE3 S6 K1 D7"]
    assert spec["speedup"] == pytest.approx(1.5) and spec["acceptance_length"] == pytest.approx(2.5)
    assert spec["server_avg_accept_length"] == pytest.approx(2.49) and spec["steps"] == 6
    assert spec["identical"] == 1 and spec["mean_common_prefix"] == pytest.approx(2.0)
    assert live._done_labels(tmp_path) == {"baseline", "EAGLE3 S6 K1 D7"}  # a rerun skips both


def test_windows_written_before_server_s_existed_still_summarize(tmp_path):
    _write_result(tmp_path, "baseline", 800.0, 1000, None, [[1, 2]])
    _write_result(tmp_path, "EAGLE3 S6 K1 D7", 1000.0, 1000, 400, [[1, 2]], steps=6)
    rows = [json.loads(line) for line in (tmp_path / "windows.jsonl").read_text().splitlines()]
    assert all("server_s" in r for r in rows)
    (tmp_path / "windows.jsonl").write_text(
        "".join(json.dumps({k: v for k, v in r.items() if k != "server_s"}) + "\n" for r in rows)
    )
    assert live.summarize(tmp_path).set_index("label").loc["EAGLE3 S6 K1 D7", "speedup"] == pytest.approx(1.25)


def test_study_plan_equal_max_running_requests_and_the_wrong_flag():
    entries = study_entries(
        "/m",
        "/d",
        chain=[1, 2, 6],
        main_steps=6,
        trees=_trees("5x4x8,6x8x16"),
        concurrency=[1, 4, 16, 64],
        wrong_flag=True,
        max_running_requests=64,
        port=31000,
        extra=("--attention-backend", "triton"),
    )
    by = {e.label: e for e in entries}
    assert list(by)[0] == "baseline" and by["baseline"].concurrency == [1, 4, 16, 64]
    assert by["EAGLE3 S6 K1 D7"].concurrency == [1, 4, 16, 64] and by["EAGLE3 S1 K1 D2"].concurrency == [1]
    assert by["EAGLE3 S5 K4 D8"].topk == 4 and "EAGLE3 S6 K8 D16" in by
    wrong = entries[-1]
    assert wrong.algorithm == "EAGLE" and wrong.concurrency == [1]
    settings = [parse_launch(e.command) for e in entries]
    assert {s.max_running_requests for s in settings} == {64}
    assert parse_launch(wrong.command).speculative_algorithm == "EAGLE"
    assert len({e.command.split("--port ")[1].split()[0] for e in entries}) == len(entries)  # side by side
    assert "--cuda-graph-max-bs 64 " in by["baseline"].command and "--cuda-graph-max-bs 1 " in wrong.command
    nccl = [int(e.command.split("--nccl-port ")[1].split()[0]) for e in entries]  # servers start together
    http = {int(e.command.split("--port ")[1].split()[0]) for e in entries}
    assert len(set(nccl)) == len(entries) and not set(nccl) & http
    with pytest.raises(ValueError, match="STEPSxTOPKxDRAFT_TOKENS"):
        _trees("5x4")
    with pytest.raises(ValueError, match="STEPSxTOPKxDRAFT_TOKENS"):
        _trees("''")  # a shell's quotes passed through a variable: an error, not a silent empty list
    assert _trees("none") == []


def test_a_variant_serves_the_baseline_and_main_chain_again_with_its_flags_at_batch_1():
    variants = _variants(["no-overlap=--disable-overlap-schedule", "attn=--speculative-attention-mode decode"])
    assert variants[1] == ("attn", ("--speculative-attention-mode", "decode"))
    common = dict(chain=[1, 6], main_steps=6, trees=[], concurrency=[1, 16], max_running_requests=64, port=31000)
    entries = study_entries(
        "/m", "/d", wrong_flag=True, extra=("--attention-backend", "triton"), variants=variants, **common
    )
    by = {e.label: e for e in entries}
    assert list(by)[-4:] == [
        "baseline [no-overlap]",
        "EAGLE3 S6 K1 D7 [no-overlap]",
        "baseline [attn]",
        "EAGLE3 S6 K1 D7 [attn]",
    ]
    for label, e in by.items():
        flagged = "--disable-overlap-schedule" in e.command
        assert flagged == (e.variant == "no-overlap") and (e.variant is None) == ("[" not in label)
    assert by["baseline [attn]"].algorithm is None and by["EAGLE3 S6 K1 D7 [attn]"].concurrency == [1]
    assert parse_launch(by["EAGLE3 S6 K1 D7 [no-overlap]"].command).num_steps == 6
    http = [int(e.command.split("--port ")[1].split()[0]) for e in entries]
    nccl = [int(e.command.split("--nccl-port ")[1].split()[0]) for e in entries]
    assert len(set(http)) == len(entries) and len(set(nccl)) == len(entries) and not set(http) & set(nccl)
    for bad in ("no-overlap", "=--x", "a b=--x"):
        with pytest.raises(Exception, match="expected NAME=FLAGS"):
            _variants([bad])
    with pytest.raises(Exception, match="given twice"):
        _variants(["a=--x", "a=--y"])


def test_variants_are_compared_with_the_default_flags_and_kept_out_of_the_studys_own_figures(tmp_path):
    out = tmp_path / "sglang" / "study"
    servers = [  # label, tok/s, tokens, verify, steps, variant
        ("baseline", 800.0, 8000, None, None, None),
        ("EAGLE3 S1 K1 D2", 700.0, 1700, 1000, 1, None),
        ("EAGLE3 S6 K1 D7", 1200.0, 2900, 1000, 6, None),
        ("baseline [no-overlap]", 760.0, 8000, None, None, "no-overlap"),
        ("EAGLE3 S6 K1 D7 [no-overlap]", 1900.0, 2900, 1000, 6, "no-overlap"),
    ]
    for label, tok_s, tokens, verify, steps, variant in servers:
        w = Window(
            label,
            "u",
            1,
            0,
            4,
            tokens,
            verify,
            tokens / tok_s,
            tok_s,
            tokens / verify if verify else None,
            True,
            0,
            True,
            # the server's own seconds: 80% of the baseline's wall, 90% of the chain's; none for the variant
            None if variant else tokens / tok_s * (0.9 if steps else 0.8),
        )
        extra = {
            "steps": steps,
            "topk": steps and 1,
            "draft_tokens": steps and steps + 1,
            "algorithm": steps and "EAGLE3",
            "variant": variant,
        }
        append_jsonl(out / "windows.jsonl", [{**w.__dict__, **extra}])
    got = variant_table(live.summarize(out), 6).set_index("variant")
    assert list(got.index) == ["default", "no-overlap"]
    assert got.loc["no-overlap", "speedup"] == pytest.approx(1900 / 760)
    assert got.loc["no-overlap", "speedup_vs_default_baseline"] == pytest.approx(1900 / 800)
    assert got.loc["default", "server_speedup"] == pytest.approx((1200 / 0.9) / (800 / 0.8))
    assert pd.isna(got.loc["no-overlap", "server_speedup"])  # its windows have no server seconds
    assert got.loc["no-overlap", "baseline_vs_default_baseline"] == pytest.approx(760 / 800)
    assert got.loc["default", "speedup"] == pytest.approx(1.5) and got.loc["default", "acceptance"] == pytest.approx(
        2.9
    )
    assert [r["label"] for r in live.cycle_rates(out)] == ["EAGLE3 S1 K1 D2", "EAGLE3 S6 K1 D7"]
    values, _ = sglang_summary(tmp_path)
    assert values["sglang_speedup_batch1"] == pytest.approx(1.5)  # the study's own flags, not the variant's


def test_break_even_fitted_to_the_servers_cycle_costs(tmp_path):
    """Cycle time = v + c*S plain steps, recovered from windows built with v = 1.2, c = 0.25."""
    step = 1 / 800.0  # baseline: 800 tok/s at batch 1
    _write_result(tmp_path, "baseline", 800.0, 8000, None, [[1]])
    for s, acc in ((1, 1.7), (3, 2.4), (6, 2.9)):
        cycle = (1.2 + 0.25 * s) * step
        verify = 1000
        tokens = int(acc * verify)
        _write_result(tmp_path, f"EAGLE3 S{s} K1 D{s + 1}", tokens / (verify * cycle), tokens, verify, [[1]], steps=s)
    rows = [json.loads(x) for x in (tmp_path / "windows.jsonl").read_text().splitlines()]
    for r in rows:  # what measure() records beside each window
        r.update(algorithm=None if r["label"] == "baseline" else "EAGLE3", topk=None if r["label"] == "baseline" else 1)
    (tmp_path / "windows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model, rates = live.fit_server_costs(tmp_path)
    assert model.verify_cost == pytest.approx(1.2, rel=1e-6) and model.draft_cost == pytest.approx(0.25, rel=1e-6)
    s6 = next(r for r in rates if r["steps"] == 6)
    assert s6["predicted_speedup"] == pytest.approx(s6["measured_speedup"], rel=1e-6)
    assert s6["breakeven_acceptance"] == pytest.approx(2.7) and s6["acceptance_for_2x"] == pytest.approx(5.4)


def test_run_summary_keys_come_from_the_study_the_oracle_and_03(tmp_path):
    from draftlab.benchmark_acceptance.sglang_report import sglang_summary

    study = tmp_path / "sglang" / "study"
    rows = [
        ("baseline", 800.0, 1000, None, None, None),
        ("EAGLE3 S6 K1 D7", 1200.0, 1000, 400, "EAGLE3", 6),
        ("EAGLE3 S3 K1 D4", 1000.0, 1000, 450, "EAGLE3", 3),
        ("EAGLE EAGLE S6 K1 D7", 500.0, 1000, 980, "EAGLE", 6),
    ]
    for label, tps, tokens, verify, algo, steps in rows:
        _write_result(study, label, tps, tokens, verify, [[1, 2]], steps=steps)
    recs = [json.loads(x) for x in (study / "windows.jsonl").read_text().splitlines()]
    for r, (_, _, _, _, algo, steps) in zip(recs, rows):
        r.update(algorithm=algo, topk=1 if algo else None, draft_tokens=steps + 1 if steps else None)
    (study / "windows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    (tmp_path / "sglang" / "version.txt").write_text("0.5.17\n")
    (tmp_path / "sglang" / "oracle_chain.json").write_text(
        json.dumps(
            [
                {
                    "mode": "EAGLE3",
                    "num_steps": 6,
                    "topk": 1,
                    "num_draft_tokens": 7,
                    "acceptance_length": 2.45,
                    "samples": 1,
                },
                {
                    "mode": "EAGLE3",
                    "num_steps": 3,
                    "topk": 1,
                    "num_draft_tokens": 4,
                    "acceptance_length": 2.2,
                    "samples": 1,
                },
            ]
        )
    )
    # an engine run over a different number of prompts is not a gap on the same prompt ids: skipped
    (tmp_path / "sglang" / "oracle_other.json").write_text(
        json.dumps(
            [
                {
                    "mode": "EAGLE3",
                    "num_steps": 6,
                    "topk": 1,
                    "num_draft_tokens": 7,
                    "acceptance_length": 9.9,
                    "samples": 64,
                }
            ]
        )
    )
    metrics = {"03_regenerate": {"backend": "server", "splits": {"train": {"tok_s": 41000.0, "rows_done": 10}}}}
    s, src = sglang_summary(tmp_path, metrics)
    assert s["sglang_version"] == "0.5.17" and s["sglang_baseline_tok_s_batch1"] == pytest.approx(800)
    assert s["sglang_acceptance_s6_heldout"] == pytest.approx(2.5)
    assert s["sglang_speedup_batch1"] == pytest.approx(1.5) and "EAGLE3 S6 K1 D7" in src["sglang_speedup_batch1"]
    assert s["sglang_speedup_c16"] is None  # not measured: stays None, never filled in
    assert s["sglang_wrong_flag_acceptance"] == pytest.approx(1000 / 980)
    # S6: (2.45 - 2.5) / 2.5 = -2%; S3: (2.2 - 1000/450) / (1000/450) = -1%: the largest is kept
    assert s["engine_vs_sglang_acceptance_gap"] == pytest.approx(0.02)
    assert s["sglang_regeneration_tok_s"] == 41000.0
    metrics["03_regenerate"]["backend"] = "batch"
    assert sglang_summary(tmp_path, metrics)[0]["sglang_regeneration_tok_s"] is None


def test_break_even_beside_the_engine_draws_both_fits(tmp_path):
    """Notebook 06's SGLang section: both curves and both engines' points in one figure."""
    from draftlab.benchmark_acceptance.breakeven import CostModel

    _write_result(tmp_path, "baseline", 800.0, 8000, None, [[1]])
    for s, acc in ((1, 1.7), (3, 2.4)):
        _write_result(
            tmp_path, f"EAGLE3 S{s} K1 D{s + 1}", acc * 800 / (1.2 + 0.25 * s), int(acc * 1000), 1000, [[1]], steps=s
        )
    rows = [json.loads(x) for x in (tmp_path / "windows.jsonl").read_text().splitlines()]
    for r in rows:
        r.update(algorithm=None if r["label"] == "baseline" else "EAGLE3", topk=None if r["label"] == "baseline" else 1)
    (tmp_path / "windows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    model, rates = live.fit_server_costs(tmp_path)
    engine = CostModel(verify_cost=1.1, draft_cost=0.08)
    checks = [{"tokens_per_cycle": 2.4, "measured_speedup": 1.9}]
    fig = live.plot_breakeven_beside(engine, checks, model, rates, 3)
    ax = fig.axes[0]
    assert len(ax.lines) == 3  # two curves and the break-even line
    assert [c.get_offsets().shape[0] for c in ax.collections] == [1, 2]  # engine point, SGLang points
    assert "SGLang" in ax.lines[1].get_label() and "break-even L=1.95" in ax.lines[1].get_label()


def test_the_published_study_draws_its_figures_without_a_gpu(tmp_path):
    """The committed H200 study (results/reference/sglang) is what a reader redraws."""
    import shutil

    from draftlab.benchmark_acceptance.sglang_figures import draw_study_figures, engine_chain_rows

    src = Path(__file__).resolve().parents[1] / "results" / "reference" / "sglang"
    shutil.copytree(src, tmp_path / "sglang")
    assert [r["num_steps"] for r in engine_chain_rows(tmp_path / "sglang")] == [1, 3, 6]
    written = draw_study_figures(tmp_path)
    assert [p.name for p in written] == [
        "sglang_tok_s_by_concurrency.png",
        "sglang_acceptance_by_steps.png",
        "sglang_breakeven_engine_vs_sglang.png",
    ]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 20_000 for p in written)


def test_bench_sglang_writes_the_variants_table_beside_the_study(tmp_path, monkeypatch, capsys):
    """The command's own path from --variant to OUT/variants.csv, with a measure() that records windows as
    the real one does (tok/s by label) instead of starting SGLang."""
    tok_s = {"baseline": 800.0, "EAGLE3 S6 K1 D7": 1200.0, "baseline [no-overlap]": 760.0}
    monkeypatch.setattr(sglang_study, "load_eval_set", lambda *a: [{"messages": []}] * 4)
    monkeypatch.setattr(sglang_study, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(sglang_study, "encode_prompts", lambda tok, messages: [[1, 2]] * len(messages))

    def fake_measure(entries, ids, out, **kwargs):
        for e in entries:
            rate, verify = tok_s.get(e.label, 1900.0), (1000 if e.algorithm else None)
            w = Window(e.label, "u", 1, 0, 4, 2900, verify, 2900 / rate, rate, 2.9 if verify else None, True, 0, True)
            extra = {k: getattr(e, k) for k in ("steps", "topk", "draft_tokens", "algorithm", "variant")}
            append_jsonl(Path(out) / "windows.jsonl", [{**w.__dict__, **extra}])

    monkeypatch.setattr(sglang_study, "measure", fake_measure)
    out = tmp_path / "sglang" / "study"
    argv = ["bench", "sglang", "--model-path", "/m", "--draft", "/d", "--chain", "6", "--trees", "none"]
    argv += ["--no-wrong-flag", "--concurrency", "1", "--samples", "4", "--out", str(out)]
    argv.append("--variant=no-overlap=--disable-overlap-schedule")
    args = build_parser(argv).parse_args(argv)
    assert args.func(args) == 0
    plan = json.loads((out / "plan.json").read_text())
    assert plan["variants"] == {"no-overlap": ["--disable-overlap-schedule"]}
    got = pd.read_csv(out / "variants.csv").set_index("variant")
    assert got.loc["no-overlap", "flags"] == "--disable-overlap-schedule" and pd.isna(got.loc["default", "flags"])
    assert got.loc["no-overlap", "speedup"] == pytest.approx(1900 / 760)
    assert got.loc["no-overlap", "speedup_vs_default_baseline"] == pytest.approx(1900 / 800)
    assert "no-overlap" in capsys.readouterr().out


def test_server_flags_reach_every_server_of_the_study(tmp_path, monkeypatch):
    """--server-flags (e.g. --sleep-on-idle) in every launch command, the variants' too, and in plan.json."""
    monkeypatch.setattr(sglang_study, "load_eval_set", lambda *a: [{"messages": []}] * 4)
    monkeypatch.setattr(sglang_study, "load_tokenizer", lambda path: None)
    monkeypatch.setattr(sglang_study, "encode_prompts", lambda tok, messages: [[1, 2]] * len(messages))
    seen = []
    monkeypatch.setattr(sglang_study, "measure", lambda entries, ids, out, **kw: seen.extend(entries))
    out = tmp_path / "sglang" / "study"
    argv = ["bench", "sglang", "--model-path", "/m", "--draft", "/d", "--chain", "5,6", "--trees", "5x4x8"]
    argv += ["--concurrency", "1", "--samples", "4", "--out", str(out), "--variant=recv4=--scheduler-recv-interval 4"]
    argv.append("--server-flags=--sleep-on-idle --enable-metrics")
    args = build_parser(argv).parse_args(argv)
    with pytest.raises(RunFailure, match="no server was measured"):  # the stand-in measured nothing
        args.func(args)
    assert len(seen) == 7  # baseline, S5, S6, the tree, the wrong flag, the variant's pair
    assert all(" --sleep-on-idle --enable-metrics" in e.command for e in seen)
    assert json.loads((out / "plan.json").read_text())["server_flags"] == ["--sleep-on-idle", "--enable-metrics"]
