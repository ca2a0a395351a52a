"""ops/sglang_hidden/summary.py on fixture proof files: every figure copied with its source, a figure no
file holds is null and says what would measure it, a bad file is one line and exit 2, and the committed
results/sglang-hidden/summary.json is what the builder makes of the files beside it."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ops.sglang_hidden import summary

ROOT = Path(__file__).resolve().parents[2]
SLICES = ("low", "mid", "high", "final")


def slices(err: float, cos: float) -> dict:
    return {s: {"max_abs_err": err * (i + 1), "min_cosine": cos - i * 1e-4} for i, s in enumerate(SLICES)}


# fixture values (not measurements): only their path through the builder is checked
EMBEDDED = {
    "sglang_version": "0.5.17",
    "gpu": "fixture GPU",
    "capture_tok_s": 1000.0,
    "sglang_prefill_tok_s": 4000.0,
    "capture_vs_prefill": 0.25,
    "sglang_vs_transformers_fp32": slices(0.01, 0.9999),
    "transformers_bf16_vs_fp32": slices(0.02, 0.9998),
    "tolerance": {"factor": 2.0, "min_cosine": 0.99, "all": True},
}
DEEPSEEK = {"sglang_version": "0.5.17", "gpu": "fixture GPU", "capture_ids": [2, 30, 58], "config_ids": [1, 29, 57],
            "eagle3_width": 21504, "eagle_flag_width": 7168}  # fmt: skip


def write(folder: Path, **files) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, obj in files.items():
        (folder / f"{name}.json").write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return folder


def test_the_proofs_figures_come_with_their_sources_and_the_rest_is_null(tmp_path):
    got = summary.build(write(tmp_path, embedded=EMBEDDED, deepseek_shape=DEEPSEEK))
    src = got["sources"]
    assert (got["sglang_version"], got["gpu"], got["capture_tok_s"], got["sglang_prefill_tok_s"]) == (
        "0.5.17",
        "fixture GPU",
        1000.0,
        4000.0,
    )
    assert src["capture_tok_s"] == "embedded.json: capture_tok_s"
    versus = got["capture_vs_transformers"]
    assert versus["max_abs_err"] == {"low": 0.01, "mid": 0.02, "high": 0.03, "final": 0.04}
    assert versus["min_cosine"] == pytest.approx(0.9999 - 3e-4) and versus["tolerance"]["all"] is True
    assert "sglang_vs_transformers_fp32.<slice>.min_cosine" in src["capture_vs_transformers.min_cosine"]
    assert got["deepseek_shape"] == {"capture_ids": [2, 30, 58], "config_ids": [1, 29, 57], "eagle3_width": 21504,
                                     "eagle_flag_width": 7168}  # fmt: skip
    for key in (*summary.DRAFT_KEYS, "regeneration_03_tok_s", "regeneration_03_rows"):
        assert got[key] is None and src[key].startswith("not measured (")
    assert "drafts.json" in src["val_acceptance_from_sglang"] and "notebook 03" in src["regeneration_03_rows"]
    keys = {k for k in got if k != "sources"} | {f"{k}.{j}" for k in ("capture_vs_transformers", "deepseek_shape")
                                                 for j in got[k]}  # fmt: skip
    assert keys - {"capture_vs_transformers", "deepseek_shape"} == set(src)  # every figure has its source


def test_the_drafts_and_regeneration_files_fill_their_keys_and_a_half_proof_leaves_nulls(tmp_path):
    drafts = dict.fromkeys(summary.DRAFT_KEYS, 3.5)
    got = summary.build(write(tmp_path, deepseek_shape=DEEPSEEK, drafts=drafts,
                              regeneration_03={"tok_s": 5e4, "rows_done": 2048}))  # fmt: skip
    assert [got[k] for k in summary.DRAFT_KEYS] == [3.5] * 4
    assert (got["regeneration_03_tok_s"], got["regeneration_03_rows"]) == (5e4, 2048)
    assert got["sources"]["regeneration_03_rows"] == "regeneration_03.json: rows_done"
    # no embedded.json: its figures are null; version and GPU come from deepseek_shape.json
    assert got["capture_tok_s"] is None and "proof.py embedded" in got["sources"]["capture_tok_s"]
    assert got["capture_vs_transformers"]["min_cosine"] is None
    assert got["sources"]["gpu"] == "deepseek_shape.json: gpu"
    partial = summary.build(write(tmp_path / "p", embedded={"capture_tok_s": 1.0}))
    assert "embedded.json has no sglang_prefill_tok_s" in partial["sources"]["sglang_prefill_tok_s"]


@pytest.mark.parametrize(
    "files, message",
    [
        ({"embedded": "{not json"}, "embedded.json: not JSON"),
        ({"embedded": {**EMBEDDED, "capture_tok_s": "fast"}}, "capture_tok_s is 'fast', not a number"),
        ({"deepseek_shape": {**DEEPSEEK, "capture_ids": [2, "x"]}}, "not a list of layer indices"),
    ],
)
def test_a_bad_file_is_one_line_and_exit_2(tmp_path, files, message):
    folder = write(tmp_path / "r", **files)
    run = subprocess.run([sys.executable, str(ROOT / "ops/sglang_hidden/summary.py"), "--results", str(folder)],
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and message in run.stderr
    assert not (folder / "summary.json").exists()


def test_the_committed_summary_is_built_from_the_files_beside_it(tmp_path):
    out = tmp_path / "summary.json"
    assert summary.main(["--results", str(ROOT / "results/sglang-hidden"), "--out", str(out)]) == 0
    assert json.loads(out.read_text()) == json.loads((ROOT / "results/sglang-hidden/summary.json").read_text())
