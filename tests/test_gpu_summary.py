"""draftlab.run.summary: headline keys from metrics.json, null when unmeasured, overrides only with a source."""

import json

import pytest

from draftlab.run import summary as summary_module


@pytest.fixture(scope="module")
def summary():
    return summary_module


def metrics():
    row = {
        "arch": "eagle3",
        "S": 6,
        "K": 1,
        "D": 7,
        "mode": "EAGLE3",
        "eval_set": "blend",
        "samples": 4,
        "acceptance_length": 2.5,
        "speedup": 1.4,
        "lossless": "4/4",
        "dtype": "float32",
    }
    return {
        "03_regenerate": {"splits": {"train": {"tok_s": 1000.0}}},
        "04_train_draft": {"eagle3": {"train_stats": {"kept": 10}, "elapsed_s": 30.0, "elapsed_total_s": 90.0}},
        "06_benchmark_acceptance": {
            "eval_sets": {"blend": 4},
            "by_set": [row],
            "by_chain": [],
            "wrong_mode": [{**row, "mode": "EAGLE", "acceptance_length": 1.01}],
        },
    }


def test_keys_come_from_metrics_and_missing_ones_are_null(summary):
    s, src = summary.build_summary(metrics())
    assert s["samples"] == 10 and s["regeneration_tok_s"] == 1000.0
    assert s["train_minutes"] == 1.5 and "elapsed_total_s" in src["train_minutes"]  # summed over resumed calls
    assert s["eagle3_acceptance_s6_heldout"] == 2.5 and s["eagle3_wrong_flag_acceptance"] == 1.01
    assert s["speedup_batch1"] == 1.4
    assert s["eagle1_acceptance_s6_heldout"] is None and s["eagle3_acceptance_s6_humaneval"] is None


def test_overrides_need_a_source(summary, tmp_path):
    s, src = summary.build_summary(metrics())
    (tmp_path / "summary_overrides.json").write_text(json.dumps({"train_minutes": {"value": 2.0, "source": "log"}}))
    summary.apply_overrides(tmp_path, s, src)
    assert s["train_minutes"] == 2.0 and src["train_minutes"].startswith("override")
    (tmp_path / "summary_overrides.json").write_text(json.dumps({"train_minutes": {"value": 2.0}}))
    with pytest.raises(SystemExit, match="source"):
        summary.apply_overrides(tmp_path, s, src)


def test_speedup_takes_the_best_lossless_run_of_any_dtype_or_shape(summary):
    m = metrics()
    row = m["06_benchmark_acceptance"]["by_set"][0]
    m["06_benchmark_acceptance"]["by_chain_fast_dtype"] = [
        {**row, "S": 6, "speedup": 1.9, "dtype": "bfloat16", "acceptance_length": 2.7},
        {**row, "S": 4, "speedup": 2.2, "dtype": "bfloat16", "lossless": "3/4"},  # not lossless: not counted
    ]
    m["06_benchmark_acceptance"]["tree"] = [{**row, "arch": "eagle3", "K": 4, "D": 16, "speedup": 1.7}]
    s, src = summary.build_summary(m)
    assert s["speedup_batch1"] == 1.9 and "bfloat16" in src["speedup_batch1"]
    assert s["eagle3_acceptance_s6_heldout"] == 2.5  # acceptance keys stay with the main dtype's rows
