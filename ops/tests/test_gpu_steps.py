"""ops.gpu_steps, and ops/gpu/common.sh calling it as the GPU steps do."""

import json
import os
import subprocess
import sys
from pathlib import Path

from ops import gpu_steps

ROOT = Path(__file__).resolve().parents[2]


def test_stage_done_reads_metrics_and_07_needs_complete(tmp_path):
    assert not gpu_steps.stage_done(tmp_path, "00")
    (tmp_path / "metrics.json").write_text(json.dumps({"00_environment_check": {}, "07_data_scaling": {}}))
    assert gpu_steps.stage_done(tmp_path, "00") and not gpu_steps.stage_done(tmp_path, "07")
    (tmp_path / "metrics.json").write_text(json.dumps({"07_data_scaling": {"complete": True}}))
    assert gpu_steps.stage_done(tmp_path, "07")


def test_add_seconds_accumulates_over_calls(tmp_path):
    path = tmp_path / "04.seconds.json"
    gpu_steps.add_seconds(path, "04_train_draft", 120)
    assert gpu_steps.add_seconds(path, "04_train_draft", 30) == {"04_train_draft": 150}


def test_offline_summary_and_merge(tmp_path):
    (tmp_path / "eagle3").mkdir()
    (tmp_path / "eagle3" / "train.csv").write_text("step,loss\n1,2.0\n2,1.5\n")
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "shard.safetensors").write_bytes(b"x" * 10)
    rec = gpu_steps.offline_summary(tmp_path, tmp_path / "out.json")
    assert rec["train_csv_last"] == {"step": "2", "loss": "1.5"} and rec["hidden_bytes"] == 10
    (tmp_path / "a.json").write_text('{"a": 1}')
    assert gpu_steps.merge_json(tmp_path / "m.json", [tmp_path / "a.json"]) == [{"a": 1}]


def test_common_sh_calls_the_module(tmp_path):
    """The bash side of the steps: stage_done and the per-stage seconds, through common.sh itself."""
    env = {
        **os.environ,
        "OUT": str(tmp_path / "out"),
        "DL": str(tmp_path / "dl"),
        "SITE": str(tmp_path / "site"),
        "SCRATCH": str(tmp_path / "scratch"),
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    run = tmp_path / "dl" / "results" / "reference"
    run.mkdir(parents=True)
    (run / "metrics.json").write_text(json.dumps({"00_environment_check": {}}))
    script = (
        "source ops/gpu/common.sh; stage_done 00 && echo done00; stage_done 01 || echo todo01; "
        'python3 -m ops.gpu_steps add-seconds "$RUN/s.json" x 5; cat "$RUN/s.json"; '
        '[ -n "$EMBEDDED_SHA256" ] && echo sha-ok'
    )
    out = subprocess.run(["bash", "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert "done00" in out.stdout and "todo01" in out.stdout and '{"x": 5}' in out.stdout, out.stdout + out.stderr
    assert "sha-ok" in out.stdout
