"""`draftlab bench cost`: config parsing, random models of a shape, the cycle-cost fit, the report and resume.

The servers and their measurements are faked here (a fixture that answers like a server of known
cycle cost); the real measurement needs SGLang on a GPU (ops/cost_model/run.sh)."""

import asyncio
import csv
import json
from contextlib import nullcontext

import pytest

from draftlab.benchmark_acceptance import cost_bench, cost_report
from draftlab.benchmark_acceptance.cost_fit import FitError, fit_cycle, fit_table, predict_speedup
from draftlab.benchmark_acceptance.cost_plan import CostJob, ResultsFolder, parse_settings
from draftlab.benchmark_acceptance.cost_shape import build_draft, build_target, load_config, shape_info
from draftlab.cli import main
from draftlab.core.errors import InputError
from draftlab.model.capture import config_ids, default_capture
from draftlab.model.export import validate

TINY = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 8,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 512,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}


@pytest.fixture
def tiny_config(tmp_path):
    folder = tmp_path / "tiny-shape"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY))
    return folder


# ---------------------------------------------------------------------------- config parsing


def test_config_from_folder_and_file(tiny_config):
    config, name = load_config(str(tiny_config))
    assert name == "tiny-shape" and config.num_hidden_layers == 8
    config2, _ = load_config(str(tiny_config / "config.json"))
    assert config2.hidden_size == 64
    info = shape_info(config)
    assert info["layers"] == 8 and info["head_dim"] == 16 and info["bf16_bytes"] == 2 * info["parameters"]


def test_published_shapes_parse():
    sizes = {
        n: shape_info(load_config(f"data/configs/{n}")[0])["parameters"] / 1e9 for n in ("smollm2-135m", "llama-3.1-8b")
    }
    assert 0.13 < sizes["smollm2-135m"] < 0.14 and 7.9 < sizes["llama-3.1-8b"] < 8.1


@pytest.mark.parametrize(
    "content, words",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected an object"),
        ('{"hidden_size": 8}', "no model_type"),
        ('{"model_type": "no-such-architecture"}', "cannot read its config"),
        ('{"model_type": "llama", "hidden_size": "wide"}', "hidden_size"),
    ],
)
def test_bad_config_is_one_line(tmp_path, content, words):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(InputError) as err:
        load_config(str(path))
    assert words in str(err.value) and "\n" not in str(err.value)


def test_missing_target_is_one_line(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_config(str(tmp_path / "absent.json"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no config.json"):
        load_config(str(tmp_path / "empty"))


def test_cli_bad_target_exits_2(tmp_path, capsys):
    bad = tmp_path / "config.json"
    bad.write_text("{oops")
    assert main(["bench", "cost", str(bad), "--out", str(tmp_path / "out"), "--dry-run"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: TARGET") and len(err.splitlines()) == 1


# ---------------------------------------------------------------------------- random models


def test_random_target_and_draft(tiny_config, tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    config, _ = load_config(str(tiny_config))
    target = build_target(config, tmp_path / "m" / "target", device="cpu")
    model = AutoModelForCausalLM.from_pretrained(target)
    assert model.config.num_hidden_layers == 8
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.model.layers[0].mlp.gate_proj.weight.shape == (128, 64)
    stamp = (target / "draftlab-cost.json").stat().st_mtime_ns
    assert build_target(config, target, device="cpu") == target  # built once: not rebuilt
    assert (target / "draftlab-cost.json").stat().st_mtime_ns == stamp

    draft = build_draft(config, tmp_path / "m" / "draft", device="cpu")
    assert validate(draft, target=config) == []
    saved = json.loads((draft / "config.json").read_text())
    assert saved["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == config_ids(default_capture(8))
    assert saved["hidden_size"] == 64 and saved["draft_vocab_size"] == 512


def test_dry_run_writes_the_launch_lines(tiny_config, tmp_path):
    out = tmp_path / "out"
    args = ["bench", "cost", str(tiny_config), "--out", str(out), "--dry-run", "--settings", "chain3,tree3-4-8"]
    assert main([*args, "--server-flags", "--attention-backend triton"]) == 0
    text = (out / "commands.txt").read_text()
    assert text.count("SGLANG_SIMULATE_ACC_LEN=") == 8  # 4 + 4 forced acceptances
    assert text.count("--skip-tokenizer-init") == 10 and "--attention-backend triton" in text
    assert "--speculative-eagle-topk 4 --speculative-num-draft-tokens 8" in text
    assert not (out / "plan.json").exists()  # a dry run records no job: the GPU run that follows is not refused
    assert main([*args, "--batches", "1,2"]) == 0


# ---------------------------------------------------------------------------- the fit


def _points(c0, c1, taus):
    return [(t, t / (c0 + c1 * t)) for t in taus]


def test_fit_recovers_cycle_cost():
    fit = fit_cycle(_points(2.5, 0.1, [1, 2, 3, 4, 5, 6, 7]), shape="s", setting="chain6", batch=1, max_acceptance=7)
    assert fit.c0 == pytest.approx(2.5) and fit.c1 == pytest.approx(0.1) and fit.max_residual < 1e-9
    assert fit.needed(1.0) == pytest.approx(2.5 / 0.9)
    assert fit.needed(2.0) == pytest.approx(5.0 / 0.8)
    assert fit.needed(3.0) is None  # 7.5 / 0.7 > 7: out of reach
    assert fit.speedup(4.10) == pytest.approx(4.10 / 2.91)
    assert predict_speedup([fit], 4.10, setting="chain6", batch=1) == pytest.approx(4.10 / 2.91)
    with pytest.raises(FitError, match="outside 1 .. 7"):
        fit.speedup(8.0)


@pytest.mark.parametrize(
    "points, measured, words",
    [
        ([(3, 1.0)], None, "two or more acceptances"),
        ([(1, 0.5), (4, 0.5)], None, "does not rise"),
        ([(1, 0.4), (4, 1.6)], [1.0, 1.02], "was not in effect"),
        ([(1, 4.0), (4, 9.0)], None, "not physical"),
        ([(1, 0.4), (4, float("nan"))], None, "not a positive number"),
    ],
)
def test_fit_refuses_in_one_line(points, measured, words):
    with pytest.raises(FitError) as err:
        fit_cycle(points, shape="s", setting="chain3", batch=4, max_acceptance=4, measured=measured)
    assert words in str(err.value) and "chain3 batch 4" in str(err.value) and "\n" not in str(err.value)


# ---------------------------------------------------------------------------- resume, report


class FakeServers:
    """server_for/measure of a fixture: plain 1000 tok/s x batch; spec tau / (2 + 0.1 tau) of that."""

    def __init__(self, fail_after=None):
        self.started, self.calls, self.fail_after, self.up = [], [], fail_after, None

    def server_for(self, setting, tau):
        self.started.append((setting.name, tau))
        self.up = (setting.name, tau)
        return nullcontext(f"fake://{setting.name}/{tau}")

    def measure(self, url, batch):
        if self.fail_after is not None and len(self.calls) >= self.fail_after:
            raise RuntimeError("server died")
        self.calls.append((url, batch))
        _, tau = self.up
        base = 1000.0 * batch
        rate = base if tau is None else base * tau / (2 + 0.1 * tau)
        return {
            "tok_s": rate,
            "tok_s_min": rate * 0.98,
            "tok_s_max": rate * 1.01,
            "windows": 3,
            "window_tok_s": f"{rate:.1f};{rate:.1f};{rate:.1f}",
            "measured_acceptance": "" if tau is None else float(tau),
            "completion_tokens": 768,
        }


def _job(**kw):
    return CostJob(
        shape="tiny", config_digest="abc", gpu="FakeGPU", settings=parse_settings("chain3"), batches=[1, 4], **kw
    )


def test_resume_measures_only_what_is_missing(tmp_path):
    folder = ResultsFolder(tmp_path / "out")
    first = FakeServers(fail_after=5)
    with pytest.raises(RuntimeError):
        cost_bench.run_job(_job(), folder, server_for=first.server_for, measure=first.measure)
    assert len(folder.rows()) == 5
    second = FakeServers()
    assert cost_bench.run_job(_job(), folder, server_for=second.server_for, measure=second.measure) == 5
    assert second.started == [("chain3", 2), ("chain3", 3), ("chain3", 4)]  # plain and acceptance 1: not started
    assert len(second.calls) == 5 and len(folder.rows()) == 10
    third = FakeServers()
    assert cost_bench.run_job(_job(), folder, server_for=third.server_for, measure=third.measure) == 0
    assert third.started == []
    with pytest.raises(InputError, match="windows"):
        cost_bench.run_job(_job(windows=5), folder, server_for=third.server_for, measure=third.measure)


def test_torn_last_row_is_measured_again(tmp_path):
    folder = ResultsFolder(tmp_path / "out")
    fake = FakeServers()
    cost_bench.run_job(_job(), folder, server_for=fake.server_for, measure=fake.measure)
    text = folder.csv_path.read_text()
    folder.csv_path.write_text(text[:-20])  # a kill in the middle of the last row
    assert len(folder.rows()) == 9
    again = FakeServers()
    assert cost_bench.run_job(_job(), folder, server_for=again.server_for, measure=again.measure) == 1
    assert len(folder.rows()) == 10


def test_report_table_summary_plot(tmp_path):
    folder = ResultsFolder(tmp_path / "out")
    fake = FakeServers()
    cost_bench.run_job(_job(shape_info={"parameters": 1}), folder, server_for=fake.server_for, measure=fake.measure)
    check = {"acceptance": 3.0, "measured": 1.4, "setting": "chain3", "batch": 1, "shape": "tiny"}
    fits, errors, summary = cost_bench.finish(folder, project=(3.5, "chain3"), check=check)
    assert errors == [] and len(fits) == 2
    with open(folder.out / "table.csv", newline="") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = list(reader)
    assert header[:8] == ["shape", "gpu", "setting", "batch", "acceptance", "tok_s", "baseline_tok_s", "speedup"]
    assert len(rows) == 8 and rows[0][:5] == ["tiny", "FakeGPU", "chain3", "1", "1"]
    table = cost_report.read_table(folder.out / "table.csv")
    assert table[3]["speedup"] == pytest.approx(4 / 2.4, rel=1e-3)
    assert summary["batch_sizes"] == [1, 4] and summary["shapes"][0]["name"] == "tiny"
    assert summary["embedded_predicted_speedup"] == pytest.approx(3 / 2.3, rel=1e-3)
    assert summary["embedded_prediction_error"] == pytest.approx((3 / 2.3 - 1.4) / 1.4, rel=1e-3)
    assert summary["projection"][0]["speedup"] == pytest.approx(3.5 / 2.35, rel=1e-3)
    needed = {(n["batch"]): n for n in summary["needed_acceptance"]}
    assert needed[1]["acceptance_for_1x"] == pytest.approx(2 / 0.9, rel=1e-2)
    assert (folder.out / "speedup.png").stat().st_size > 10_000
    refits, _ = fit_table(table, {"chain3": 4})
    assert refits[0].c0 == pytest.approx(2.0, rel=1e-3)


def test_read_table_refuses_other_csv(tmp_path):
    path = tmp_path / "table.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="expected"):
        cost_report.read_table(path)


def test_settings_parse_and_refuse():
    chain, tree = parse_settings("chain6,tree3-4-8")
    assert (chain.max_acceptance, tree.topk, tree.draft_tokens, tree.max_acceptance) == (7, 4, 8, 4)
    for bad in ("chain", "tree3-1-4", "tree2-4-20", "chain3,chain3", "S=6"):
        with pytest.raises(InputError, match="--settings"):
            parse_settings(bad)


def test_sigterm_stops_after_the_cell_and_the_server(tmp_path):
    import os
    import signal

    from draftlab.core.stop import Stopped

    folder = ResultsFolder(tmp_path / "out")
    fake, exited = FakeServers(), []

    class Server:
        def __init__(self, setting, tau):
            fake.server_for(setting, tau)

        def __enter__(self):
            return "fake://"

        def __exit__(self, *exc):
            exited.append(fake.up)

    def measure(url, batch):
        if len(fake.calls) == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        return fake.measure(url, batch)

    with pytest.raises(Stopped, match="SIGTERM") as err:
        cost_bench.run_job(_job(), folder, server_for=Server, measure=measure)
    assert err.value.exit_code == 128 + signal.SIGTERM
    assert len(folder.rows()) == 3 and exited == [("chain3", None), ("chain3", 1)]


def test_measure_cell_against_a_fake_sglang():
    import httpx

    from draftlab.benchmark_acceptance.cost_measure import measure_cell, prompt_ids, server_env

    seen = []

    def answer(request):
        if request.url.path == "/flush_cache":
            return httpx.Response(200)
        body = json.loads(request.content)
        seen.append(body)
        n = body["sampling_params"]["max_new_tokens"]
        meta = {"completion_tokens": n, "prompt_tokens": len(body["input_ids"]), "spec_verify_ct": n // 4}
        return httpx.Response(200, json={"output_ids": [5] * n, "meta_info": meta})

    prompts = prompt_ids(4, 8, vocab=512)
    cell = measure_cell("http://x", 4, prompts, windows=3, max_new_tokens=16, transport=httpx.MockTransport(answer))
    assert len(seen) == 16  # a warm-up window and three measured ones of 4 requests
    assert all(b["sampling_params"]["ignore_eos"] and b["sampling_params"]["temperature"] == 0 for b in seen)
    assert cell["windows"] == 3 and cell["tok_s_min"] <= cell["tok_s"] <= cell["tok_s_max"]
    assert cell["measured_acceptance"] == pytest.approx(4.0) and cell["completion_tokens"] == 3 * 4 * 16
    assert all(200 <= t < 511 for p in prompts for t in p)
    env = server_env({"SGLANG_SIMULATE_ACC_LEN": "9", "PATH": "/bin"}, None)
    assert "SGLANG_SIMULATE_ACC_LEN" not in env and env["PATH"] == "/bin"
    env = server_env({}, 3)
    assert env == {"SGLANG_SIMULATE_ACC_LEN": "3", "SGLANG_SIMULATE_ACC_METHOD": "match-expected"}


def test_notebook_reads_a_results_folder(tmp_path):
    from draftlab.benchmark_acceptance import cost_cli

    assert cost_report.load_results(tmp_path / "none") == (None, [], [])
    folder = ResultsFolder(tmp_path / "out")
    fake = FakeServers()
    cost_bench.run_job(_job(), folder, server_for=fake.server_for, measure=fake.measure)
    cost_bench.finish(folder)
    rows, fits, refused = cost_report.load_results(folder.out)
    assert len(rows) == 8 and len(fits) == 2 and refused == []
    assert cost_report.projection(fits, 4.10, "chain3")[0]["speedup"] is None  # beyond S + 1 = 4
    with pytest.raises(InputError, match="--no-such"):
        cost_cli.run_bench_cost("data/configs/smollm2-135m", tmp_path / "x", no_such=1)


def test_fit_uses_the_measured_tokens_per_cycle():
    forced = [1, 2, 3, 4]
    got = [0.99 * t for t in forced]  # the prefill's token and a cut last cycle
    points = [(t, g / 2.0) for t, g in zip(forced, got)]  # every cycle costs 2 plain steps
    fit = fit_cycle(points, shape="s", setting="chain3", batch=1, max_acceptance=4, measured=got)
    assert fit.c0 == pytest.approx(2.0) and fit.c1 == pytest.approx(0.0, abs=1e-12)


def test_hub_id_offline_is_one_line():
    with pytest.raises(InputError, match="TARGET no-such-org/no-such-model: cannot read its config"):
        load_config("no-such-org/no-such-model")


def test_cost_command_dummy_weights_keep_the_draft_file():
    from draftlab.sglang.commands import cost_command

    plain = cost_command("/t", max_running_requests=16, dummy_weights=True)
    spec = cost_command("/t", "/d", num_steps=6, max_running_requests=16, dummy_weights=True)
    assert "--load-format dummy" in plain and "--speculative-draft-load-format" not in plain
    assert "--load-format dummy" in spec and "--speculative-draft-load-format auto" in spec
    assert "--max-running-requests 16" in plain and "--max-running-requests 16" in spec
    assert "--speculative-num-draft-tokens 7" in spec and "--cuda-graph-max-bs 16" in spec


# ---------------------------------------------------------------------------- chosen acceptances, real prompts


def test_chosen_acceptances_start_fewer_servers(tmp_path):
    folder = ResultsFolder(tmp_path / "out")
    fake = FakeServers()
    job = _job(acceptances=[1, 4])
    assert cost_bench.run_job(job, folder, server_for=fake.server_for, measure=fake.measure) == 6
    assert fake.started == [("chain3", None), ("chain3", 1), ("chain3", 4)]
    fits, errors = fit_table(cost_report.table_rows(folder.rows()), {"chain3": 4})
    assert not errors and {f.points for f in fits} == {2}
    near, far = cost_report.projection(fits, 3.0, "chain3")[0], cost_report.projection(fits, 1.0, "chain3")[0]
    assert near["points"] == 2 and near["within_measured"] and far["within_measured"]
    fig = cost_report.plot(cost_report.table_rows(folder.rows()), fits)
    drawn = [line for line in fig.axes[0].get_lines() if line.get_label().startswith("batch")]
    assert len(drawn) == 2 and all(list(line.get_xdata()) == [1, 4] for line in drawn)  # the points joined, no fit
    with pytest.raises(InputError, match="acceptances"):  # the same shape, other acceptances: refused
        cost_bench.run_job(_job(acceptances=[1, 2, 4]), folder, server_for=fake.server_for, measure=fake.measure)


def test_older_record_without_the_new_knobs_resumes(tmp_path):
    folder = ResultsFolder(tmp_path / "out")
    fake = FakeServers()
    cost_bench.run_job(_job(), folder, server_for=fake.server_for, measure=fake.measure)
    plans = json.loads(folder.plan_path.read_text())
    for key in ("acceptances", "prompts"):
        del plans["tiny"][key]  # a folder measured before these knobs existed
    folder.plan_path.write_text(json.dumps(plans))
    assert cost_bench.run_job(_job(), folder, server_for=fake.server_for, measure=fake.measure) == 0


def test_acceptances_outside_a_setting_are_one_line(tiny_config, tmp_path, capsys):
    out = tmp_path / "out"
    args = ["bench", "cost", str(tiny_config), "--out", str(out), "--dry-run", "--settings", "chain6,chain3"]
    assert main([*args, "--acceptances", "1,5,7"]) == 2  # chain3 reaches 4 only: one acceptance left
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--acceptances 1,5,7" in err[0] and "chain3" in err[0]
    assert main([*args, "--acceptances", "1,3,4,7"]) == 0
    text = (out / "commands.txt").read_text()
    assert text.count("SGLANG_SIMULATE_ACC_LEN=") == 7  # chain6: 1, 3, 4, 7; chain3: 1, 3, 4
    assert main([*args, "--acceptances", "0,2"]) == 2


def test_prompt_file_is_tokenised_and_sent_whole(tmp_path):
    import httpx

    from draftlab.benchmark_acceptance.cost_cli import file_prompts
    from draftlab.benchmark_acceptance.cost_measure import measure_cell

    rows = [
        {"id": f"q{i}", "source": "test", "messages": [{"role": "user", "content": f"question {i}"}]} for i in range(5)
    ]
    path = tmp_path / "held-out.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ids, label = file_prompts(str(path), "tiny", 4)
    assert len(ids) == 5 and label.startswith("held-out.jsonl sha256:") and "(5 prompts)" in label
    with pytest.raises(InputError, match="fewer than the largest batch 8"):
        file_prompts(str(path), "tiny", 8)
    with pytest.raises(InputError, match="no such file"):
        file_prompts(str(tmp_path / "none.jsonl"), "tiny", 1)

    in_flight, peak, seen = [0], [0], []

    async def answer(request):
        if request.url.path == "/flush_cache":
            return httpx.Response(200)
        body = json.loads(request.content)
        seen.append(body["input_ids"])
        in_flight[0] += 1
        peak[0] = max(peak[0], in_flight[0])
        await asyncio.sleep(0.01)
        in_flight[0] -= 1
        n = body["sampling_params"]["max_new_tokens"]
        return httpx.Response(200, json={"output_ids": [5] * n, "meta_info": {"completion_tokens": n}})

    cell = measure_cell(
        "http://x", 2, ids, windows=3, max_new_tokens=8, every_prompt=True, transport=httpx.MockTransport(answer)
    )
    assert len(seen) == 4 * 5 and peak[0] == 2  # every prompt in each of 4 windows, 2 in flight
    assert cell["completion_tokens"] == 3 * 5 * 8
