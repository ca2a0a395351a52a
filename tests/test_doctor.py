"""draftlab doctor: one broken input per check, a clean pass, malformed inputs, and the live probe."""

import json
import shutil
import sys
from pathlib import Path

import pytest

from draftlab.flag_diagnosis.cases import build_cases, good_draft
from draftlab.flag_diagnosis.cli import add_doctor_parser, doctor_main
from draftlab.flag_diagnosis.doctor import diagnose, mode_widths
from draftlab.flag_diagnosis.inputs import (
    DoctorInputError,
    load_target_info,
    read_draft,
)
from draftlab.flag_diagnosis.probe import acceptance_length, probe

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_doctor.sglang_stub import SGLangStub  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEEPSEEK_TINY = str(ROOT / "data/configs/deepseek-tiny")
DEEPSEEK_61 = str(ROOT / "data/configs/deepseek-v3-61layer")

# (case name, check that must fire, its severity): the library must hold every one of them.
EXPECTED = [
    ("flag_eagle", "algorithm", "error"),
    ("topk1_draft_tokens", "topk_draft_tokens", "warning"),
    ("unequal_batch_cap", "max_running_requests", "error"),
    ("fc_eagle1_width", "fc_width", "error"),
    ("hidden_from_other_target", "hidden_size", "error"),
    ("fc_norm_without_tensors", "fc_norm", "error"),
    ("norm_tensor_without_key", "fc_norm", "error"),
    ("no_eagle_config", "capture_layers_present", "warning"),
    ("layer_out_of_range", "capture_layers_range", "error"),
    ("input_of_layer_ids", "capture_layers_convention", "warning"),
    ("trained_layers_shifted", "capture_layers_convention", "error"),
    ("deepseek_offset", "capture_layers_deepseek", "error"),
    ("draft_vocab_size_wrong", "draft_vocab", "error"),
    ("vocab_from_other_target", "vocab_size", "error"),
    ("t2d_wrong_length", "t2d_size", "error"),
    ("d2t_out_of_range", "d2t_mapping", "error"),
    ("short_context", "context_length", "error"),
    ("tied_embeddings", "tie_word_embeddings", "error"),
    ("plain_llama_arch", "architectures", "error"),
    ("rope_theta_default", "rope", "warning"),
    ("rope_only_new_keys", "rope", "warning"),
    ("prefixed_names", "unknown_tensors", "error"),
    ("missing_hidden_norm", "missing_tensors", "error"),
    ("qproj_one_h", "tensor_shapes", "error"),
]


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    root = tmp_path_factory.mktemp("doctor")
    good = good_draft(root / "good", "tiny", draft_vocab_size=512)
    cases = build_cases(good, root / "cases", "tiny", DEEPSEEK_TINY)
    return root, good, {c.name: c for c in cases}


def run_cli(argv, capsys):
    import argparse

    ap = argparse.ArgumentParser()
    add_doctor_parser(ap.add_subparsers(dest="command"))
    args = ap.parse_args(["doctor", *argv])
    code = doctor_main(args)
    out = capsys.readouterr()
    return code, out.out, out.err


def problems(result):
    return [(f.check, f.severity) for f in result["findings"] if f.severity in ("error", "warning")]


def test_good_export_passes_clean(library, capsys):
    _, good, cases = library
    case = cases["good"]
    result = diagnose(str(good), "tiny", case.launches)
    assert problems(result) == []
    assert {f.check for f in result["findings"]} >= {
        "algorithm",
        "fc_width",
        "capture_layers_range",
        "d2t_mapping",
        "context_length",
        "rope",
        "missing_tensors",
        "max_running_requests",
    }
    code, out, _ = run_cli(
        ["--draft", str(good), "--target", "tiny", *sum((["--launch", c] for c in case.launches), []), "--json"], capsys
    )
    assert code == 0
    data = json.loads(out)
    assert data["errors"] == 0 and data["warnings"] == 0 and data["target_shape"]["hidden_size"] == 64


@pytest.mark.parametrize("name,check,severity", EXPECTED, ids=[e[0] for e in EXPECTED])
def test_each_broken_case_gets_its_finding(library, name, check, severity):
    case = library[2][name]
    assert (case.check, case.severity) == (check, severity)
    result = diagnose(str(case.draft) if case.draft else None, case.target, case.launches)
    hits = [f for f in result["findings"] if f.check == check and f.severity == severity]
    assert hits, f"{name}: expected {check}/{severity}, got {problems(result)}"
    assert all(f.what and f.why and f.fix for f in hits)  # what is wrong, why it matters, the exact fix


def test_library_covers_every_check():
    from draftlab.flag_diagnosis import inputs as doctor_checks

    source = Path(doctor_checks.__file__).read_text()
    import re

    checks = set(re.findall(r'Finding\(\s*"([a-z0-9_]+)",\s*"(?:error|warning)"', source))
    checks |= set(re.findall(r'check = "([a-z0-9_]+)" if', source)) | {"capture_layers_convention"}
    covered = {e[1] for e in EXPECTED}
    assert checks - covered <= {"files"}, f"checks without a broken case: {checks - covered - {'files'}}"


def test_exit_codes_and_fixes_in_text(library, capsys):
    case = library[2]["flag_eagle"]
    code, out, _ = run_cli(["--draft", str(case.draft), "--target", "tiny", "--launch", case.launches[0]], capsys)
    assert code == 1
    assert "ERROR   algorithm" in out and "--speculative-algorithm EAGLE3" in out  # the corrected command
    warn = library[2]["no_eagle_config"]
    code, out, _ = run_cli(["--draft", str(warn.draft), "--target", "tiny", "--quiet"], capsys)
    assert code == 0 and "WARNING capture_layers_present" in out and "ok      " not in out


def test_draftlab_export_writes_sglang_ids_and_passes(tmp_path):
    """draftlab.model.export writes SGLang's config ids (trained index - 1) and records the trained indices."""
    d = good_draft(tmp_path / "raw", "tiny", draft_vocab_size=256)
    cfg = json.loads((d / "config.json").read_text())
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]
    assert cfg["draftlab"] == {"capture_layers": [2, 4, 5]}
    assert problems(diagnose(str(d), "tiny")) == []


def test_input_of_layer_ids_without_record_are_flagged(tmp_path):
    """A naive export with input-of-layer ids: SGLang would shift every layer by one."""
    d = good_draft(tmp_path / "raw", "tiny", draft_vocab_size=256, sglang_ids=False)
    assert json.loads((d / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 4, 5]
    assert problems(diagnose(str(d), "tiny")) == [("capture_layers_convention", "warning")]


@pytest.mark.parametrize(
    "breakage,expect",
    [
        ("missing_folder", "draft folder not found"),
        ("bad_json", "config.json: not valid JSON (line"),
        ("no_config", "config.json: file not found"),
        ("truncated_weights", "model.safetensors: not a readable safetensors file"),
        ("bin_only", "model.safetensors: file not found (found pytorch_model.bin"),
        ("bad_launch", "cannot split it"),
        ("bad_server_info", "server_info.json: not valid JSON"),
        ("missing_target", "target not found"),
    ],
)
def test_malformed_inputs_give_one_line_naming_the_file(library, tmp_path, capsys, breakage, expect):
    _, good, _ = library
    d = tmp_path / "d"
    shutil.copytree(good, d)
    argv = ["--draft", str(d), "--target", "tiny"]
    if breakage == "missing_folder":
        argv[1] = str(tmp_path / "nope")
    elif breakage == "bad_json":
        (d / "config.json").write_text('{"hidden_size": 64,\n')
    elif breakage == "no_config":
        (d / "config.json").unlink()
    elif breakage == "truncated_weights":
        data = (d / "model.safetensors").read_bytes()
        (d / "model.safetensors").write_bytes(data[:200])
    elif breakage == "bin_only":
        (d / "model.safetensors").rename(d / "pytorch_model.bin")
    elif breakage == "bad_launch":
        argv += ["--launch", "python -m sglang.launch_server --model-path 'x"]
    elif breakage == "bad_server_info":
        (tmp_path / "server_info.json").write_text("{oops")
        argv += ["--server-info", str(tmp_path / "server_info.json")]
    elif breakage == "missing_target":
        argv[3] = str(tmp_path / "no-target")
    code, out, err = run_cli(argv, capsys)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and expect in err and "Traceback" not in err


def test_target_from_hub_id_reads_only_config(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"hidden_size": 64, "num_hidden_layers": 8, "vocab_size": 49152, "model_type": "llama"}))

    def fake_download(repo_id, filename, **kw):
        calls.append((repo_id, filename))
        return str(cfg)

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", fake_download)
    info = load_target_info("org/model")
    assert calls == [("org/model", "config.json")] and info.hidden_size == 64


def test_target_from_unreachable_hub_is_one_line(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DoctorInputError) as exc:
        load_target_info("org/not-cached-model")
    assert str(exc.value).startswith("org/not-cached-model: config.json could not be fetched")
    assert "\n" not in str(exc.value)


def test_shipped_61_layer_config_and_dimension_table():
    info = load_target_info(DEEPSEEK_61)
    assert (info.hidden_size, info.num_layers, info.vocab_size, info.is_deepseek) == (7168, 61, 129280, True)
    assert info.default_capture == [2, 30, 58]
    rows = {r["mode"]: r for r in mode_widths(info.config)}
    assert rows["EAGLE3"]["width"] == 21504 and rows["EAGLE3"]["fc applied"] is True
    assert rows["EAGLE"]["width"] == 7168 and rows["EAGLE"]["fc applied"] is False
    assert rows["EAGLE3"]["fc.weight"] == "[7168, 21504]"


def test_acceptance_length_definition():
    assert acceptance_length(
        [{"completion_tokens": 30, "spec_verify_ct": 10}, {"completion_tokens": 10, "spec_verify_ct": 10}]
    )[0] == pytest.approx(2.0)  # token-weighted
    assert acceptance_length([{"completion_tokens": 30}])[0] is None
    assert acceptance_length([{"completion_tokens": 30, "spec_verify_ct": 0}])[0] is None


def test_probe_healthy_eagle3_stub():
    with SGLangStub(algorithm="EAGLE3", tokens=40, verify=16) as url:
        report = probe(url)
    assert report.acceptance_length == pytest.approx(2.5) and not report.collapsed
    assert report.settings.speculative_algorithm == "EAGLE3" and report.endpoint == "/v1/chat/completions"
    assert report.lifetime_accept_length == pytest.approx(2.5)


def test_probe_flag_bug_ranks_eagle_first(library, capsys):
    _, good, _ = library
    with SGLangStub(algorithm="EAGLE", tokens=40, verify=40, draft_path=str(good)) as url:
        report = probe(url, draft=read_draft(good), target=load_target_info("tiny"))
        code, out, _ = run_cli(["--probe", url, "--draft", str(good), "--target", "tiny", "--json"], capsys)
    assert report.acceptance_length == pytest.approx(1.0) and report.collapsed
    assert report.causes[0].cause.startswith("EAGLE-3 draft served with --speculative-algorithm EAGLE")
    assert code == 1
    data = json.loads(out)
    assert data["probe"]["collapsed"] is True
    assert any(f["check"] == "acceptance" for f in data["findings"])
    assert any(f["check"] == "algorithm" and f["severity"] == "error" for f in data["findings"])  # server_info too


def test_probe_without_spec_fields_reports_absent():
    with SGLangStub(algorithm=None) as url:
        report = probe(url)
    assert report.acceptance_length is None and "absent" in report.acceptance_note
    assert report.causes[0].cause == "the server is not speculating"


def test_probe_falls_back_to_get_server_info_and_generate():
    with SGLangStub(
        algorithm="EAGLE3", tokens=30, verify=10, server_info_path="/get_server_info", openai_meta=False
    ) as url:
        report = probe(url)
    assert report.server_info_endpoint == "/get_server_info"
    assert report.endpoint == "/generate" and report.acceptance_length == pytest.approx(3.0)


@pytest.mark.server
def test_probe_real_transformers_serve_has_no_spec_fields(tmp_path):
    """The tiny target behind a real `transformers serve`: acceptance must be absent, not 1.0."""
    from draftlab.core.serve import LocalServer
    from draftlab.model.target import resolve_path

    with LocalServer(resolve_path("tiny"), log_path=tmp_path / "serve.log") as srv:
        report = probe(srv.base_url, model=srv.model, max_tokens=16, prompts=("Say hi.",))
    assert report.endpoint == "/v1/chat/completions"
    assert report.requests and report.requests[0].get("completion_tokens")
    assert report.acceptance_length is None and "absent" in report.acceptance_note
    assert report.server_info is None


def test_launch_only_reads_a_local_draft_path(library):
    _, good, cases = library
    eagle = cases["flag_eagle"].launches[0]  # its --speculative-draft-model-path is the good export
    found = [f for f in diagnose(launches=[eagle])["findings"] if f.check == "algorithm"]
    assert found[0].severity == "error" and "assuming" not in found[0].what
    remote = eagle.replace(str(good), "/nonexistent/draft")
    found = [f for f in diagnose(launches=[remote])["findings"] if f.check == "algorithm"]
    assert found[0].severity == "error" and "assuming an EAGLE-3 draft" in found[0].what


def test_saved_server_info_file_is_checked(library, tmp_path, capsys):
    _, good, _ = library
    info = SGLangStub(algorithm="EAGLE", draft_path=str(good)).server_info()
    info["context_length"] = 4096  # longer than the draft's max_position_embeddings (2048)
    path = tmp_path / "server_info.json"
    path.write_text(json.dumps(info))
    code, out, _ = run_cli(["--draft", str(good), "--target", "tiny", "--server-info", str(path), "--json"], capsys)
    found = {(f["check"], f["severity"]) for f in json.loads(out)["findings"]}
    assert code == 1 and {("algorithm", "error"), ("context_length", "error")} <= found


def test_probe_reads_the_servers_local_draft_path(library):
    _, good, _ = library
    with SGLangStub(algorithm="EAGLE", tokens=20, verify=20, draft_path=str(good)) as url:
        report = probe(url)  # no --draft: the server_info path is readable here
    assert report.causes[0].score == 0.95 and str(good) in report.causes[0].evidence


def test_eagle1_style_draft(tmp_path):
    """draftlab's EAGLE-1-style ablation (no fc): wrong under EAGLE3, head replaced under EAGLE."""
    import torch
    from transformers import AutoConfig

    from draftlab.model.draft import Eagle3Draft, draft_config_for_target
    from draftlab.model.export import export_draft
    from draftlab.sglang.commands import sglang_speculative_command

    info = load_target_info("tiny")
    cfg = draft_config_for_target(
        AutoConfig.from_pretrained(info.config_path.parent), draft_vocab_size=128, use_aux=False
    )
    draft = Eagle3Draft(cfg, torch.nn.Embedding(info.vocab_size, info.hidden_size))
    draft.set_vocab(torch.arange(128))
    out = export_draft(draft, tmp_path / "eagle1", max_position_embeddings=info.max_position_embeddings)
    for algo, severity in (("EAGLE3", "error"), ("EAGLE", "warning")):
        cmd = sglang_speculative_command(str(info.config_path.parent), str(out), algorithm=algo)
        found = [(f.check, f.severity) for f in diagnose(str(out), "tiny", [cmd])["findings"] if f.severity != "ok"]
        assert ("algorithm", severity) in found and all(c != "fc_width" for c, s in found if s == "error")


def test_notebook_draft_missing_names_notebook_04(tmp_path):
    from draftlab.flag_diagnosis.cases import draft_for_run

    with pytest.raises(FileNotFoundError, match="run notebook 04_train_draft first"):
        draft_for_run(tmp_path, "tiny", False, tmp_path / "work")


@pytest.mark.parametrize("layers", [[2, 4, 5], [3, 4, 6]])
def test_deepseek_non_default_layers_export_passes_doctor(tmp_path, layers):
    """The exporter and the doctor share one capture-id rule (model.capture): a draft trained on
    non-default layers of a DeepSeek-family target is exported with ids that SGLang's DeepSeek
    rule maps back to those layers, so the doctor finds no capture error."""
    import torch
    from transformers import AutoConfig

    from draftlab.flag_diagnosis.checks import check_capture_layers
    from draftlab.flag_diagnosis.inputs import read_draft
    from draftlab.model.capture import captured_states
    from draftlab.model.draft import Eagle3Draft, draft_config_for_target
    from draftlab.model.export import export_draft, validate

    info = load_target_info(DEEPSEEK_TINY)
    cfg = draft_config_for_target(
        AutoConfig.from_pretrained(info.config_path.parent), draft_vocab_size=128, capture_layers=layers
    )
    draft = Eagle3Draft(cfg, torch.nn.Embedding(info.vocab_size, info.hidden_size))
    draft.set_vocab(torch.arange(128))
    out = export_draft(draft, tmp_path / "ds", max_position_embeddings=info.max_position_embeddings)
    written = json.loads((out / "config.json").read_text())["eagle_config"]["eagle_aux_hidden_state_layer_ids"]
    assert captured_states(written, deepseek=True) == layers
    assert validate(out) == []
    findings = check_capture_layers(read_draft(out), info)
    assert [f for f in findings if f.severity in ("error", "warning")] == [], findings
    assert diagnose(str(out), DEEPSEEK_TINY)["errors"] == 0
