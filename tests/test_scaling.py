"""Data-scaling study: nested subsets, resumable results, curve fits and their bands, cost of 10x."""

import json
import time
from pathlib import Path

import numpy as np
import pytest

from draftlab import data_scaling as scaling
from draftlab.core.records import conversation_id


def _conversation(k: int, t_done: float) -> dict:
    messages = [
        {"role": "user", "content": f"Write a function number {k} that adds {k} to x."},
        {"role": "assistant", "content": f"def add_{k}(x):\n    return x + {k}\n"},
    ]
    return {
        "id": conversation_id(messages, "fixture"),
        "source": "fixture",
        "messages": messages,
        "meta": {"regen": {"completion_tokens": [12 + k % 5], "t_done": t_done}},
    }


def _regen_dir(run_dir, n_train: int, n_val: int | None):
    regen = run_dir / "data" / "regen"
    regen.mkdir(parents=True)
    t0 = 1_000_000.0
    (regen / "train.jsonl").write_text("".join(json.dumps(_conversation(k, t0 + k)) + "\n" for k in range(n_train)))
    if n_val:
        (regen / "val.jsonl").write_text("".join(json.dumps(_conversation(1000 + k, t0)) + "\n" for k in range(n_val)))
    return regen


def test_subsets_are_nested_seeded_and_capped(tmp_path):
    _regen_dir(tmp_path, 30, None)
    plan = scaling.prepare(tmp_path, tmp_path / "scaling", [5, 10, 100], seed=3, val_samples=6)
    rows = [json.loads(line) for line in plan.train_file.read_text().splitlines()]
    held = [json.loads(line) for line in plan.val_file.read_text().splitlines()]
    assert len(rows) == 24 and len(held) == 6 and not {r["id"] for r in rows} & {r["id"] for r in held}
    assert plan.sizes == [5, 10, 24] and any("capped" in n for n in plan.notes)
    # the same seed gives the same order (subset n = first n rows: nested); another seed another
    again = scaling.prepare(tmp_path, tmp_path / "again", [5], seed=3, val_samples=6)
    assert again.train_file.read_text() == plan.train_file.read_text()
    other = scaling.prepare(tmp_path, tmp_path / "other", [5], seed=4, val_samples=6)
    assert other.train_file.read_text() != plan.train_file.read_text()


def test_prepare_takes_notebook_04s_holdout_when_there_is_no_val_jsonl(tmp_path):
    _regen_dir(tmp_path, 20, None)
    from draftlab.model.chat_data import split_holdout

    _, val04 = split_holdout(tmp_path / "data" / "regen" / "train.jsonl", 5, tmp_path / "train" / "holdout", 7)
    plan = scaling.prepare(tmp_path, tmp_path / "s", [10], seed=0, val_samples=3)
    assert plan.val_file == val04 and plan.available == 15 and "04" in plan.notes[0]


def test_prepare_names_the_missing_stage(tmp_path):
    with pytest.raises(scaling.ScalingError, match="03_regenerate"):
        scaling.prepare(tmp_path, tmp_path / "s", [10])


def test_prepare_uses_val_jsonl_when_present(tmp_path):
    regen = _regen_dir(tmp_path, 12, 4)
    plan = scaling.prepare(tmp_path, tmp_path / "s", [4, 12])
    assert plan.val_file == regen / "val.jsonl" and plan.available == 12 and plan.sizes == [4, 12]


def test_loglinear_fit_recovers_parameters_and_band_covers_truth():
    n = np.array([1000, 2000, 5000, 10000, 20000])
    rng = np.random.default_rng(0)
    y = 1.2 + 0.4 * np.log10(n) + rng.normal(0, 0.01, len(n))
    fit = scaling.fit_curve(n, y, [0.01] * len(n), "loglinear")
    assert fit.ok and abs(fit.params[1] - 0.4) < 0.05
    lo, hi = fit.band([200000])
    truth = 1.2 + 0.4 * np.log10(200000)
    assert lo[0] < truth < hi[0] and hi[0] - lo[0] < 0.5


def test_saturating_fit_finds_the_ceiling():
    n = np.array([1000, 2000, 5000, 10000, 20000, 50000])
    y = 2.5 - 0.8 * (n / 1000.0) ** -0.6
    fit = scaling.fit_curve(n, y, [0.005] * len(n), "saturating")
    assert fit.ok and abs(fit.params[0] - 2.5) < 0.05
    # too few points for three parameters: refused with a reason, not a made-up curve
    short = scaling.fit_curve(n[:3], y[:3], None, "saturating")
    assert not short.ok and "need at least 4" in short.reason


def test_a_saturating_fit_pinned_at_its_bound_is_refused():
    """SGLang's four data-size points of 2026-12-02 rise faster than log-linearly: the saturating fit ran to
    c = 0.001 and its band came out as -1.7e8 .. -1044; such a fit is refused with the parameter named."""
    n = np.array([1351, 2702, 5403, 21612])
    y = np.array([1.4218, 1.6752, 1.9540, 3.0570])
    fit = scaling.fit_curve(n, y, [0.025, 0.04, 0.055, 0.09], "saturating")
    assert not fit.ok and fit.reason.startswith("c at its bound")
    assert scaling.fit_curve(n, y, [0.025, 0.04, 0.055, 0.09], "loglinear").ok


def test_logistic_fit_under_the_chains_ceiling_follows_points_that_bend_upwards():
    """The six SGLang data-size points of 2026-12-03 (chain S = 6) rise faster than log-linearly: the logistic
    under the ceiling S + 1 = 7 recovers a curve it generated, fits them better than log-linear, and stays
    below its ceiling at 10x; without a ceiling, or with a point at it, it is refused with the reason."""
    n = np.array([1351, 2702, 5403, 10806, 21612, 43224])
    truth = scaling.logistic(n, 4.8, 0.7, 7.0)
    fit = scaling.fit_curve(n, truth, [0.02] * len(n), "logistic", ceiling=7.0)
    assert fit.ok and abs(fit.params[0] - 4.8) < 0.01 and abs(fit.params[1] - 0.7) < 0.01
    assert fit.ceiling == 7.0 and scaling.fit_curve(n, truth, None, "loglinear", ceiling=7.0).ceiling is None
    y = np.array([1.4218, 1.6752, 1.9540, 2.2736, 3.0570, 3.7358])
    se = [0.025, 0.04, 0.055, 0.065, 0.09, 0.11]
    logistic = scaling.fit_curve(n, y, se, "logistic", ceiling=7.0)
    assert logistic.ok and logistic.scale < scaling.fit_curve(n, y, se, "loglinear").scale / 4
    lo, hi = logistic.band([10 * n[-1]])
    assert y[-1] < lo[0] < hi[0] < 7.0
    assert not scaling.fit_curve(n, y, se, "logistic").ok
    at_ceiling = scaling.fit_curve(n, np.minimum(y * 2, 7.0), se, "logistic", ceiling=7.0)
    assert not at_ceiling.ok and "ceiling 7" in at_ceiling.reason


def test_band_widens_when_points_scatter_more_than_their_errors():
    n = np.array([1000, 2000, 5000, 10000])
    y = np.array([1.50, 1.70, 1.62, 1.90])
    tight = scaling.fit_curve(n, y, [0.001] * 4, "loglinear")
    assert tight.scale > 100  # reduced chi-square inflates the covariance
    lo, hi = tight.band([100000])
    assert hi[0] - lo[0] > 0.1


def test_the_scaling_figure_says_its_acceptance_is_simulated():
    """07's dots are simulated from per-position rates, not decoded: the y axis says so (issue 20.8)."""
    from draftlab.data_scaling.figures import plot_scaling

    rows = [{"arch": "eagle3", "source": "scaling", "n": n, "sim_accept_len": 1.0 + n / 1000} for n in (100, 200)]
    fig = plot_scaling(rows, {})
    assert "simulated from per-position rates" in fig.axes[0].get_ylabel()
    assert "real chain decoding" in fig.axes[0].get_ylabel()


def test_extrapolation_prices_regeneration(tmp_path):
    _regen_dir(tmp_path, 10, 2)
    regen = scaling.regen_throughput(tmp_path)
    assert regen["tok_s_source"].startswith("row timestamps")
    (tmp_path / "metrics.json").write_text(json.dumps({"03_regenerate": {"summary": {"tok_s": 500.0}}}))
    regen = scaling.regen_throughput(tmp_path)
    assert regen["tok_s"] == 500.0 and regen["mean_completion_tokens"] == pytest.approx(14.0)
    results = [
        {
            "arch": "eagle3",
            "n": n,
            "source": "scaling",
            "sim_accept_len": 1.2 + 0.3 * np.log10(n),
            "sim_accept_len_se": 0.02,
            "train_s": n * 0.01,
        }
        for n in (100, 200, 500, 1000)
    ]
    fits = scaling.fit_all(results)
    extra = scaling.extrapolate(fits, results, regen, factor=10, goal=4.0)["eagle3"]
    assert extra["n_new"] == 10000 and extra["extra_conversations"] == 9000
    assert extra["regeneration_hours"] == pytest.approx(9000 * 14.0 / 500.0 / 3600)
    assert extra["training_hours_at_new_size"] == pytest.approx(10000 * 0.01 / 3600)
    assert extra["loglinear"]["pred_new"] == pytest.approx(1.2 + 0.3 * 4, abs=0.02)
    assert extra["loglinear"]["reaches_goal"] is False
    fig = scaling.plot_scaling(results, fits, goal=4.0)
    fig2 = scaling.plot_extrapolation({"eagle3": extra})
    assert fig.axes and fig2.axes


def test_notebook_07s_report_helpers(tmp_path, capsys):
    """07's printed plan and notes, the conditional chain figure, findings and metrics (no loops in 07)."""
    from types import SimpleNamespace

    from draftlab.run.notebook import save_figure

    plan = SimpleNamespace(available=1234, sizes=[4, 8], val_file="v.jsonl", notes=["capped"])
    settings = SimpleNamespace(train={"lr": 1e-3}, eval_settings=lambda: {"val_samples": 6})
    scaling.print_plan(plan, settings, ["recipe note"])
    scaling.print_notes([])
    scaling.print_regeneration({"tok_s": None, "tok_s_source": "none", "mean_completion_tokens": 14.0})
    assert capsys.readouterr().out.splitlines() == [
        "training rows available: 1,234; subsets: [4, 8]; held-out: v.jsonl",
        "recipe: {'lr': 0.001}",
        "note: capped",
        "note: recipe note",
        "regeneration: nan completion tok/s (none), 14 completion tokens per conversation",
    ]
    assert scaling.points_from_04(tmp_path, {}, include=False) == ([], [])
    assert scaling.points_from_04(tmp_path, {})[1]  # included: says why 04's drafts are not points

    results = [
        {
            "arch": "eagle3",
            "n": n,
            "source": "scaling",
            "sim_accept_len": 1.2 + 0.3 * np.log10(n),
            "sim_accept_len_se": 0.02,
            "draft_dir": "d",
            "key": "k",
        }
        for n in (100, 200, 500, 1000)
    ]
    regen = {"tok_s": 500.0, "tok_s_source": "x", "mean_completion_tokens": 14.0}
    extra = scaling.extrapolate(scaling.fit_all(results), results, regen, 10, 4.0)
    assert scaling.plot_chain_scaling(results, {}, 10, 4.0, 6) is None
    run = SimpleNamespace(caveat=None, figures=tmp_path, name="07_data_scaling")
    assert save_figure(run, None, "chain_acceptance_vs_data") is None and not list(tmp_path.glob("*.png"))
    assert list(scaling.extrapolation_table(extra).columns) == ["eagle3"]
    assert "loglinear" not in scaling.extrapolation_table(extra).index
    lines = scaling.study_findings(results, extra, {}, [])
    assert lines == scaling.findings(results, extra, []) and "real chain decoding:" not in lines

    chain = [
        {
            **r,
            "chain_acceptance_length": r["sim_accept_len"] - 0.1,
            "chain_acceptance_length_se": 0.05,
            "chain_position_acceptance": [0.5] * 6,
            "chain_steps": 6,
        }
        for r in results
    ]
    assert scaling.chain_ceiling(chain) == 7.0 and scaling.chain_ceiling(results) is None  # no chain: no ceiling
    assert scaling.sim_ceiling(results) is None and scaling.sim_ceiling([{**r, "acc": [0.5] * 7} for r in results]) == 8
    assert scaling.chain_ceiling([*chain[:-1], {**chain[-1], "chain_steps": 3}]) is None  # depths differ
    chain_fits = scaling.fit_all(chain, "chain_acceptance_length", ceiling=scaling.chain_ceiling(chain))
    assert chain_fits["eagle3"]["logistic"].ceiling == 7.0
    chain_extra = scaling.extrapolate(chain_fits, chain, regen, 10, 4.0)
    fig = scaling.plot_chain_scaling(chain, chain_fits, 10, 4.0, 6)
    assert fig.axes[0].get_title() == "Real chain acceptance length (S=6) vs training data"
    lines = scaling.study_findings(chain, extra, chain_extra, ["eagle1 n=8"])
    assert lines[lines.index("real chain decoding:") + 1].startswith("eagle3: measured chain_acceptance_length")
    study = {"results": chain, "deferred": ["eagle1 n=8"], "wall_s": 3.0}
    m = scaling.study_metrics(plan, settings, ["n"], study, {}, chain_fits, regen, extra, chain_extra, lines)
    assert m["complete"] is False and m["eval"] == {"val_samples": 6} and m["findings"] == lines
    assert "draft_dir" not in m["results"][0] and "key" not in m["results"][0] and m["sizes"] == [4, 8]


SMOKE_TRAIN = {
    "epochs": 1.0,
    "draft_vocab_size": 49152,  # the whole vocabulary: the random target's arg-max tokens are trained on (a
    # draft that saw no supervised token fails its training)
    "max_len": 64,
    "ttt_steps": 2,
    "batch_tokens": 256,
    "max_batch": 4,
    "lr": 1e-3,
    "log_every": 1,
    "save_every": 2,
    "threads": 1,
}


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One torch thread: on a loaded 2-core machine two threads of tiny matmuls run several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_study_trains_both_archs_resumes_and_skips_done(tmp_path, tiny_target):
    _regen_dir(tmp_path, 24, 4)
    plan = scaling.prepare(tmp_path, tmp_path / "scaling", [4, 8])
    settings = scaling.StudySettings(
        train=SMOKE_TRAIN, val_samples=4, spec_prompts=1, spec_steps=3, spec_max_new_tokens=6
    )
    t0 = time.monotonic()
    out = scaling.run_study(tiny_target, "tiny", "cpu", plan, tmp_path / "scaling", settings, progress=False)
    first = time.monotonic() - t0
    rows = out["results"]
    assert sorted((r["arch"], r["n"]) for r in rows) == [("eagle1", 4), ("eagle1", 8), ("eagle3", 4), ("eagle3", 8)]
    for r in rows:
        assert 1.0 <= r["sim_accept_len"] <= 1 + SMOKE_TRAIN["ttt_steps"]
        assert r["sim_accept_len_se"] is not None and r["val_conversations"] == 4
        assert 1.0 <= r["chain_acceptance_length"] <= 1 + 3 and r["chain_prompts"] == 1 and r["chain_steps"] == 3
        assert (Path(r["draft_dir"]) / "model.safetensors").is_file() and f"/n{r['n']}-" in r["draft_dir"]
    # a rerun finds every result and trains nothing
    t0 = time.monotonic()
    again = scaling.run_study(tiny_target, "tiny", "cpu", plan, tmp_path / "scaling", settings, progress=False)
    assert again["ran_now"] == [] and len(again["results"]) == 4
    assert time.monotonic() - t0 < first
    # other settings are other results (not silently reused)
    other = scaling.StudySettings(train={**SMOKE_TRAIN, "lr": 5e-4}, val_samples=4)
    keys = {
        scaling.settings_key("eagle3", 4, {**s.train, "train_file_rows": plan.available}, s.eval_settings())
        for s in (settings, other)
    }
    assert len(keys) == 2


def test_side_by_side_study_measures_what_the_sequential_one_does(tmp_path, tiny_target):
    """A subset's two archs trained at once (two processes) give the same drafts and figures."""
    _regen_dir(tmp_path, 16, 4)
    rows = {}
    for mode in (False, True):
        plan = scaling.prepare(tmp_path, tmp_path / f"scaling-{mode}", [4])
        settings = scaling.StudySettings(train=SMOKE_TRAIN, val_samples=4, side_by_side=mode)
        out = scaling.run_study(
            tiny_target, "tiny", "cpu", plan, tmp_path / f"scaling-{mode}", settings, progress=False
        )
        rows[mode] = {r["arch"]: r for r in out["results"]}
    assert set(rows[True]) == {"eagle3", "eagle1"}
    for arch, r in rows[True].items():
        assert r["side_by_side"] and not rows[False][arch]["side_by_side"]
        assert r["steps"] == rows[False][arch]["steps"]
        assert r["sim_accept_len"] == pytest.approx(rows[False][arch]["sim_accept_len"], abs=1e-6)
        assert r["acc"] == pytest.approx(rows[False][arch]["acc"], abs=1e-6)


def test_heldout_eval_equals_the_training_objectives_own_path(tmp_path, tiny_target):
    """The cached target states give the same per-step stats as train's online path (Features +
    targets_at), for both architectures."""
    import torch
    import torch.nn.functional as F

    from draftlab.model.chat_data import load_tokenized
    from draftlab.model.draft import Eagle3Draft, draft_config_for_target
    from draftlab.train_draft import Features, TTTObjective, collate, targets_at

    _regen_dir(tmp_path, 4, 3)
    ds, _ = load_tokenized(tmp_path / "data" / "regen" / "val.jsonl", tiny_target.tokenizer, 64)
    layers = tiny_target.capture_layers
    held = scaling.HeldOut(tiny_target, ds, layers, progress=False)
    torch.manual_seed(0)
    for use_aux in (True, False):
        cfg = draft_config_for_target(tiny_target.config, draft_vocab_size=512, use_aux=use_aux)
        draft = Eagle3Draft(cfg, tiny_target.model.get_input_embeddings())
        draft.set_vocab(torch.arange(0, 1024, 2))
        ours = scaling.simulated_acceptance(tiny_target, draft, held, 3, bootstrap=2, progress=False)
        objective, feats = TTTObjective(draft, 3, 0.8), Features(tiny_target, layers, use_aux)
        total = torch.zeros(3, 4)
        for k in range(len(ds)):
            ids, valid, loss = collate(ds, [k], tiny_target.tokenizer.pad_token_id)
            f, last = feats([k], ids, valid, "cpu")
            pred = F.pad((loss & valid)[:, 1:], (0, 1))
            total += objective(f, ids, valid, targets_at(tiny_target, last, pred, draft.draft_ids(), draft.t2d))[1]
        from draftlab.train_draft import summarize

        theirs = summarize(total, 0.8)
        assert ours["sim_accept_len"] == pytest.approx(theirs["sim_accept_len"], abs=1e-6)
        assert ours["loss"] == pytest.approx(theirs["loss"], rel=1e-4)


def test_offline_states_are_computed_once_per_subset_for_both_archs(tmp_path, tiny_target):
    _regen_dir(tmp_path, 12, 2)
    plan = scaling.prepare(tmp_path, tmp_path / "scaling", [6])
    settings = scaling.StudySettings(train=SMOKE_TRAIN, hidden="offline", val_samples=2)
    out = scaling.run_study(tiny_target, "tiny", "cpu", plan, tmp_path / "scaling", settings, progress=False)
    assert sorted(a for a, _ in out["ran_now"]) == ["eagle1", "eagle3"]
    index = json.loads((tmp_path / "scaling" / "hidden" / "n6" / "train" / "index.json").read_text())
    assert index["num_samples"] == 6 and index["store_aux"]


@pytest.mark.gpu
def test_study_on_cuda_bf16_with_graphs(tmp_path):
    """The GPU path: bf16 target, autocast training, bf16 exports, chain decoding with CUDA graphs."""
    from draftlab.model.target import load_target

    target = load_target("tiny", device="cuda")
    _regen_dir(tmp_path, 16, 4)
    plan = scaling.prepare(tmp_path, tmp_path / "scaling", [4, 8])
    settings = scaling.StudySettings(
        train=SMOKE_TRAIN, val_samples=4, spec_prompts=2, spec_steps=6, spec_max_new_tokens=16
    )
    out = scaling.run_study(target, "tiny", "cuda", plan, tmp_path / "scaling", settings, progress=False)
    assert len(out["results"]) == 4
    for r in out["results"]:
        assert 1.0 <= r["sim_accept_len"] <= 3.0 and 1.0 <= r["chain_acceptance_length"] <= 7.0


def test_three_sizes_are_drawn_without_a_curve_and_not_extrapolated():
    """07 on three subsets (4, 8, 16 conversations): the points, one line saying why no curve, no 10x band."""
    from draftlab.data_scaling.fits import refusal

    results = [
        {"arch": "eagle3", "n": n, "source": "scaling", "sim_accept_len": 1.0 + 0.1 * i, "sim_accept_len_se": 0.05}
        for i, n in enumerate((4, 8, 16))
    ]
    fits = scaling.fit_all(results)
    assert not any(f.ok for f in fits["eagle3"].values())
    line = refusal(fits)
    assert line.startswith("no curve drawn: 3 data sizes (n = 4, 8, 16)") and "\n" not in line
    extra = scaling.extrapolate(fits, results, {"tok_s": None}, 10, 4.0)["eagle3"]
    assert all(extra[m] == {"ok": False, "reason": line} for m in scaling.MODELS)
    assert scaling.plot_extrapolation({"eagle3": extra}) is None
    fig = scaling.plot_scaling(results, fits, 10.0, 4.0)
    ax = fig.axes[0]
    assert ax.get_xlim()[1] < 40  # the points' own scale, not 10x beyond them
    assert any(t.get_text() == line for t in ax.texts) and not ax.collections[1:]  # no band
