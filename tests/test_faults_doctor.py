"""Fault injection for `draftlab export` and `draftlab doctor` (issue 19.3-19.6): every bad input is a
bounded outcome, a documented exit code and one line naming the file, field or flag, never a traceback.

Each case runs the real CLI in a subprocess, as a user would. The drafts are real small exports
(the tiny target's shapes, built by draftlab.model.export) broken one way each.
"""

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from draftlab.core.serve import free_port
from draftlab.flag_diagnosis.cases import edit_config, good_draft

ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = "python -m sglang.launch_server --model-path /m"


def draftlab(*argv, timeout=120):
    """(exit code, stdout, stderr) of `draftlab ARGV` in a fresh interpreter."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "lib") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    p = subprocess.run(
        [sys.executable, "-m", "draftlab.cli", *map(str, argv)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
    return p.returncode, p.stdout, p.stderr


def one_line_error(code, out, err, want_code, *names):
    """The outcome every unreadable input must have: exit code, one stderr line naming it, no traceback."""
    assert "Traceback" not in out + err, err
    assert code == want_code, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for name in names:
        assert name in lines[0], (name, lines[0])


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return good_draft(tmp_path_factory.mktemp("faults") / "good", "tiny", draft_vocab_size=256)


@pytest.fixture
def draft(good, tmp_path):
    """A fresh copy of the good export to break."""
    import shutil

    return Path(shutil.copytree(good, tmp_path / "draft"))


def _header(path):
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _write(path, header, data):
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


# ---- export --validate-only (19.3) and export's own inputs (19.5) ----------------------------------


def test_good_export_conforms_with_target(good):
    code, out, err = draftlab("export", "-", good, "--validate-only", "--target", "tiny")
    assert code == 0 and "conforms" in out and "Traceback" not in err


def test_truncated_safetensors_is_a_deviation(draft):
    w = draft / "model.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    code, out, err = draftlab("export", "-", draft, "--validate-only")
    assert code == 1 and "conforms" not in out and "Traceback" not in out + err
    assert "model.safetensors" in out and "bytes" in out


def test_offsets_past_the_end_are_a_deviation(draft):
    w = draft / "model.safetensors"
    header, data = _header(w)
    header["norm.weight"]["data_offsets"] = [len(data) + 1024, len(data) + 1024 + 256]
    _write(w, header, data)
    code, out, err = draftlab("export", "-", draft, "--validate-only")
    assert code == 1 and "conforms" not in out and "Traceback" not in out + err
    assert "norm.weight" in out and "data_offsets" in out


def test_offsets_that_disagree_with_dtype_and_shape_are_a_deviation(draft):
    w = draft / "model.safetensors"
    header, data = _header(w)
    start, end = header["norm.weight"]["data_offsets"]
    header["norm.weight"]["data_offsets"] = [start, end - 4]
    _write(w, header, data)
    code, out, err = draftlab("export", "-", draft, "--validate-only")
    assert code == 1 and "norm.weight" in out and "Traceback" not in out + err


def test_capture_layer_past_the_target_fails_with_target(draft):
    edit_config(draft, lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[1, 3, 40]))
    code, out, err = draftlab("export", "-", draft, "--validate-only", "--target", "tiny")
    assert code == 1 and "capture" in out and "40" in out and "Traceback" not in out + err


def test_short_context_fails_with_target(draft):
    edit_config(draft, lambda c: c.update(max_position_embeddings=16))
    code, out, err = draftlab("export", "-", draft, "--validate-only", "--target", "tiny")
    assert code == 1 and "max_position_embeddings 16" in out and "Traceback" not in out + err


def test_validate_with_missing_target_is_one_line(draft, tmp_path):
    one_line_error(
        *draftlab("export", "-", draft, "--validate-only", "--target", tmp_path / "no-target"), 2, "no-target"
    )


def test_export_of_a_missing_checkpoint_is_one_line(tmp_path):
    one_line_error(*draftlab("export", tmp_path / "no-ckpt", tmp_path / "out"), 2, "no-ckpt")


# ---- doctor: config fields read strictly (19.5, 19.6) ------------------------------------------------


@pytest.mark.parametrize(
    "field,value",
    [
        ("max_position_embeddings", "8k"),
        ("rope_theta", "big"),
        ("tie_word_embeddings", "false"),
        ("vocab_size", "49152"),
        ("intermediate_size", "big"),
        ("hidden_size", 64.5),
    ],
)
def test_doctor_reads_config_fields_strictly(draft, field, value):
    edit_config(draft, lambda c: c.update({field: value}))
    code, out, err = draftlab("doctor", "--draft", draft, "--target", "tiny")
    one_line_error(code, out, err, 2, "config.json", field)
    assert "architectures" not in err


def test_doctor_reads_target_fields_strictly(good, tmp_path):
    from draftlab.flag_diagnosis.inputs import load_target_info

    cfg = json.loads(load_target_info("tiny").config_path.read_text())
    cfg["num_hidden_layers"] = "six"
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(cfg))
    one_line_error(
        *draftlab("doctor", "--draft", good, "--target", tmp_path / "target"), 2, "config.json", "num_hidden_layers"
    )


# ---- doctor: launch commands that cannot be right (19.6) --------------------------------------------


@pytest.mark.parametrize(
    "command,names",
    [
        ("hello world how are you", ["not an SGLang launch command"]),
        ("", ["empty"]),
        ("   ", ["empty"]),
        (
            f"{LAUNCHER} --speculative-algorithm EAGLE3 --speculative-draft-model-path /d --speculative-num-steps 0",
            ["--speculative-num-steps", "0"],
        ),
        (
            f"{LAUNCHER} --speculative-algorithm EAGLE3 --speculative-draft-model-path /d --speculative-eagle-topk -5",
            ["--speculative-eagle-topk", "-5"],
        ),
        (
            f"{LAUNCHER} --speculative-algorithm EAGLE3 --speculative-draft-model-path /d "
            "--speculative-num-draft-tokens -1",
            ["--speculative-num-draft-tokens", "-1"],
        ),
        (f"{LAUNCHER} --speculative-algorithm EAGLE9 --speculative-draft-model-path /d", ["EAGLE9"]),
    ],
)
def test_doctor_refuses_impossible_launch_commands(command, names):
    one_line_error(*draftlab("doctor", "--launch", command), 2, *names)


def test_draft_path_without_algorithm_is_an_error_with_the_fixed_command():
    code, out, err = draftlab("doctor", "--launch", f"{LAUNCHER} --speculative-draft-model-path /d")
    assert code == 1 and "Traceback" not in out + err
    assert "ERROR" in out and "--speculative-algorithm EAGLE3" in out  # the corrected line, in full


# ---- doctor --probe: an unreachable server is an error (19.4) ---------------------------------------


@pytest.mark.parametrize("url", ["closed", "not a url", "ftp://127.0.0.1/x", "http://"])
def test_probe_of_unreachable_or_malformed_url_is_one_line(url):
    if url == "closed":
        url = f"http://127.0.0.1:{free_port()}"
    code, out, err = draftlab("doctor", "--probe", url, timeout=60)
    one_line_error(code, out, err, 2, "--probe")
    assert "not an SGLang server" not in out + err and "0 error(s)" not in out


# ---- doctor tables show fix and why whole (20.6) ----------------------------------------------------


def test_findings_table_shows_long_fix_whole():
    from draftlab.flag_diagnosis.doctor import diagnose, findings_table

    cmd = (
        f"{LAUNCHER} --speculative-algorithm EAGLE --speculative-draft-model-path /very/long/path/to/a/draft "
        "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
    )
    result = diagnose(launches=[cmd])
    fix = next(f.fix for f in result["findings"] if f.check == "algorithm" and f.severity == "error")
    assert len(fix) > 100
    table = findings_table(result["findings"])
    assert fix in table.to_html() and fix in repr(table)  # neither the notebook's HTML nor plain text cuts it
