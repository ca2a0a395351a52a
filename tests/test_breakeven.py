"""Break-even model: algebra, the worked example, the fit recovering known costs, the check."""

import pytest

from draftlab.benchmark_acceptance import breakeven as be


def test_algebra():
    assert be.cycle_cost(4, 0.25) == pytest.approx(2.0)
    assert be.predicted_speedup(3.0, 4, 0.25) == pytest.approx(1.5)
    assert be.breakeven_acceptance(4, 0.25) == pytest.approx(2.0)
    assert be.breakeven_acceptance(4, 0.25, speedup=2.0) == pytest.approx(4.0)
    # at break-even the predicted speedup is exactly 1
    assert be.predicted_speedup(be.breakeven_acceptance(5, 0.1, 1.3), 5, 0.1, 1.3) == pytest.approx(1.0)
    with pytest.raises(ValueError):
        be.implied_cycle_cost(0, 10, 2)


def test_worked_example_of_the_deployment():
    ex = be.worked_example()  # 90 tok/s baseline, 82.3 tok/s at L = 2.1, 5 draft tokens (topk 1: S = 4)
    assert ex["steps"] == 4
    assert ex["measured_speedup"] == pytest.approx(82.3 / 90)
    assert ex["implied_cycle_cost"] == pytest.approx(2.1 * 90 / 82.3)  # 2.2965 plain steps per cycle
    assert ex["implied_draft_cost_per_step"] == pytest.approx((2.1 * 90 / 82.3 - 1) / 4)  # 0.324
    assert ex["breakeven_acceptance"] == pytest.approx(2.1 * 90 / 82.3)
    assert ex["acceptance_for_2x"] == pytest.approx(2 * 2.1 * 90 / 82.3)
    assert ex["acceptance_for_2x"] < ex["max_acceptance"] == 5


def test_fit_recovers_known_costs():
    v, c, t1 = 1.3, 0.2, 0.01
    steps = [1, 2, 3, 5, 7]
    model = be.fit_costs(steps, [t1 * (v + c * s) for s in steps], t1)
    assert model.verify_cost == pytest.approx(v) and model.draft_cost == pytest.approx(c)
    with pytest.raises(ValueError, match="two or more"):
        be.fit_costs([3, 3], [1.0, 1.0], 1.0)


def fake_row(steps, tokens_per_cycle, v=1.2, c=0.15, t1=0.01, prompts=4, tokens=404):
    """A compare() row whose timings follow the model exactly."""
    verify = round((tokens - prompts) / tokens_per_cycle)
    spec_decode = verify * t1 * (v + c * steps)
    greedy_decode = (tokens - prompts) * t1
    return {
        "num_steps": steps,
        "eval_set": "unit",
        "samples": prompts,
        "acceptance_length": tokens / verify,
        "greedy": {"decode_s": greedy_decode, "completion_tokens": tokens, "prompts": prompts},
        "speculative": {
            "decode_s": spec_decode,
            "completion_tokens": tokens,
            "prompts": prompts,
            "verify_steps": verify,
        },
        "decode_speedup": greedy_decode / spec_decode,
    }


def test_fit_from_runs_and_check():
    rows = [fake_row(s, tpc) for s, tpc in [(1, 1.6), (2, 2.0), (4, 2.5), (7, 2.8)]]
    model = be.fit_from_runs(rows)
    assert model.verify_cost == pytest.approx(1.2, rel=1e-6) and model.draft_cost == pytest.approx(0.15, rel=1e-6)
    for r in be.check(rows, model):
        assert r["relative_error"] == pytest.approx(0.0, abs=1e-6)
        assert r["breakeven_acceptance"] == pytest.approx(1.2 + 0.15 * r["steps"])


def test_curve_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    model = be.CostModel(1.0, 0.25)
    x, y = be.curve(model, 4)
    assert x[0] == 1 and x[-1] == pytest.approx(5) and y[-1] == pytest.approx(2.5)
    fig, ax = plt.subplots()
    be.plot(ax, model, [2, 4], [{"steps": 4, "tokens_per_cycle": 3.0, "measured_speedup": 1.4}])
    assert len(ax.lines) == 3 and len(ax.collections) == 1
    caption = " ".join(t.get_text() for t in ax.texts)  # v and c said in words under the plot (issue 20.8)
    assert "v: the cost of one verify pass" in caption and "c: the cost of one draft step" in caption
    assert "plain decoding steps" in caption and "L / (v + S·c)" in caption
    plt.close(fig)


# ---- fits that refuse: the runs are drawn, one line says why no model is ------------------------


def test_two_chain_lengths_are_refused_not_fitted_exactly():
    rows = [fake_row(s, tpc) for s, tpc in [(1, 1.6), (3, 2.2)]]
    verdict = be.fit_or_refuse(rows)
    assert verdict.model is None and len(verdict.points) == 2
    assert "2 chain length(s)" in verdict.reason and "\n" not in verdict.reason


def test_negative_draft_cost_is_refused():
    # cycle times that fall as the chain grows: the fit's c < 0, break-even would fall with S
    rows = [fake_row(s, tpc, c=0.15) for s, tpc in [(1, 1.6), (2, 2.0), (3, 2.2)]]
    for r, scale in zip(rows, (1.0, 0.85, 0.7)):
        r["speculative"]["decode_s"] *= scale
        r["decode_speedup"] = r["greedy"]["decode_s"] / r["speculative"]["decode_s"]
    verdict = be.fit_or_refuse(rows)
    assert verdict.model is None and "unphysical" in verdict.reason and "c = -" in verdict.reason


def test_a_held_out_miss_is_refused():
    rows = [fake_row(s, tpc) for s, tpc in [(1, 1.6), (2, 2.0), (3, 2.3), (5, 2.6)]]
    rows[1]["speculative"]["decode_s"] *= 1.5  # S = 2 took 1.5x what the others' costs predict
    rows[1]["decode_speedup"] = rows[1]["greedy"]["decode_s"] / rows[1]["speculative"]["decode_s"]
    verdict = be.fit_or_refuse(rows)
    assert verdict.model is None and "fitted without S = " in verdict.reason and "beyond" in verdict.reason


def test_a_fit_that_holds_is_checked_on_held_out_runs():
    rows = [fake_row(s, tpc) for s, tpc in [(1, 1.6), (2, 2.0), (4, 2.5)]]
    verdict = be.fit_or_refuse(rows)
    assert verdict.model is not None and verdict.reason == ""
    assert all(c["held_out"] and abs(c["relative_error"]) < 1e-6 for c in verdict.checks)
    assert len(verdict.checks) == 3


def test_figure_draws_the_runs_and_the_reason_without_a_model():
    import matplotlib

    matplotlib.use("Agg")
    rows = [{**fake_row(s, tpc), "arch": "eagle3"} for s, tpc in [(1, 1.6), (3, 2.2)]]
    fits, checks, model_arch, verdicts = be.fit_chain(rows, ["eagle3"])
    assert fits == {} and model_arch is None and be.refusals(verdicts).startswith("eagle3: no model drawn")
    fig = be.figure(verdicts, "cpu")
    ax = fig.axes[0]
    assert len(ax.collections) == 2 and len(ax.lines) == 1  # the two runs' dots, the speedup-1 line only
    assert any("no model drawn" in t.get_text() for t in ax.texts)
    drawn = be.figure(
        be.fit_chain([{**fake_row(s, t), "arch": "eagle3"} for s, t in [(1, 1.6), (2, 2.0), (4, 2.5)]], ["eagle3"])[3],
        "cpu",
    )
    labels = [line.get_label() for line in drawn.axes[0].lines]
    assert sum("held-out miss" in label for label in labels) == 3  # a line for every measured chain length
