"""The doctor in the user's numbers: the widths of the EAGLE flag bug for the embedded target and the
DeepSeek-V3 config (config only), the one-flag fix before the whole line, the launch line's paths
against --target and --draft, and an SGLang --config YAML that sets the algorithm."""

import sys
from pathlib import Path

import pytest

from draftlab.flag_diagnosis.cli import add_doctor_parser, doctor_main
from draftlab.flag_diagnosis.doctor import diagnose
from draftlab.flag_diagnosis.inputs import DoctorInputError, load_target_info

sys.path.insert(0, str(Path(__file__).parent))
from fixtures_doctor.shaped_draft import shaped_draft  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
DEEPSEEK_61 = str(ROOT / "data/configs/deepseek-v3-61layer")
LAUNCHER = "python -m sglang.launch_server"
SPEC = "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"


@pytest.fixture(scope="module")
def drafts(tmp_path_factory):
    root = tmp_path_factory.mktemp("shaped")
    embedded = load_target_info("embedded").config_path.parent
    return {
        "embedded": shaped_draft(root / "embedded", embedded, draft_vocab_size=2048),
        "deepseek": shaped_draft(root / "deepseek", DEEPSEEK_61, draft_vocab_size=32000),
    }


def errors(result, check):
    return [f for f in result["findings"] if f.check == check and f.severity in ("error", "warning")]


def test_embedded_flag_bug_in_numbers_and_the_one_flag_fix_first(drafts):
    line = f"{LAUNCHER} --model-path embedded --speculative-algorithm EAGLE --speculative-draft-model-path " + str(
        drafts["embedded"]
    )
    (hit,) = errors(diagnose(str(drafts["embedded"]), "embedded", [f"{line} {SPEC}"]), "algorithm")
    assert "the draft's fc takes 1728 = 3 x 576" in hit.what and "under EAGLE the target sends 576" in hit.what
    assert hit.fix.startswith("set --speculative-algorithm EAGLE3; the whole line: python -m sglang.launch_server")
    assert hit.fix.count("--speculative-algorithm") == 2  # the flag once, then once in the corrected line


def test_deepseek_config_only_target_in_numbers(drafts):
    target = load_target_info(DEEPSEEK_61)
    assert target.default_capture == [2, 30, 58]  # model.capture's rule, for 61 layers
    draft = drafts["deepseek"]
    line = f"{LAUNCHER} --model-path {DEEPSEEK_61} --tp 8 --speculative-algorithm EAGLE "
    result = diagnose(str(draft), DEEPSEEK_61, [f"{line}--speculative-draft-model-path {draft} {SPEC}"])
    (hit,) = errors(result, "algorithm")
    assert "the draft's fc takes 21504 = 3 x 7168 (hidden_states [2, 30, 58])" in hit.what
    assert "under EAGLE the target sends 7168" in hit.what
    assert not errors(result, "fc_width") and not errors(result, "capture_layers_deepseek")
    assert not errors(result, "paths")


def test_deepseek_numbers_from_the_launch_line_alone():
    """No --draft, no --target: the model path of the line is a config folder this machine can read."""
    result = diagnose(launches=[f"{LAUNCHER} --model-path {DEEPSEEK_61} --speculative-algorithm EAGLE {SPEC}"])
    (hit,) = [f for f in errors(result, "algorithm") if "served with" in f.what]
    assert "an EAGLE-3 draft of this target takes 21504 = 3 x 7168 (hidden_states [2, 30, 58])" in hit.what
    assert "under EAGLE the target sends 7168" in hit.what


def test_model_path_other_than_the_target(drafts):
    draft = drafts["embedded"]
    line = f"{LAUNCHER} --model-path {DEEPSEEK_61} --speculative-algorithm EAGLE3 --speculative-draft-model-path "
    (hit,) = errors(diagnose(str(draft), "embedded", [f"{line}{draft} {SPEC}"]), "paths")
    assert hit.severity == "error" and "hidden 7168 there, 576 in --target" in hit.what
    assert hit.fix == f"run doctor with --target {DEEPSEEK_61}, or serve --model-path embedded"
    same = f"{LAUNCHER} --model-path {load_target_info('embedded').config_path.parent} --speculative-algorithm EAGLE3"
    assert not errors(
        diagnose(str(draft), "embedded", [f"{same} --speculative-draft-model-path {draft} {SPEC}"]), "paths"
    )


def test_draft_path_that_does_not_exist_or_is_another_folder(drafts, tmp_path):
    draft = drafts["embedded"]
    line = f"{LAUNCHER} --model-path embedded --speculative-algorithm EAGLE3 {SPEC} --speculative-draft-model-path "
    (missing,) = errors(diagnose(str(draft), "embedded", [line + str(tmp_path / "nowhere")]), "paths")
    assert missing.severity == "warning" and "does not exist on this machine" in missing.what
    assert missing.fix == f"set --speculative-draft-model-path {draft}"
    (other,) = errors(diagnose(str(draft), "embedded", [line + str(drafts["deepseek"])]), "paths")
    assert f"the server loads the draft from {drafts['deepseek']}, doctor checked --draft {draft}" == other.what


def test_config_yaml_that_sets_the_algorithm(drafts, tmp_path):
    draft = drafts["embedded"]
    yaml_file = tmp_path / "serve.yaml"
    yaml_file.write_text(f"model-path: embedded\nspeculative_algorithm: EAGLE\nspeculative-draft-model-path: {draft}\n")
    (hit,) = errors(diagnose(str(draft), "embedded", [f"{LAUNCHER} --config {yaml_file} {SPEC}"]), "algorithm")
    assert "1728 = 3 x 576" in hit.what and f"in {yaml_file}" in hit.fix
    # the line's own flag wins over the file's, as in SGLang
    fixed = diagnose(str(draft), "embedded", [f"{LAUNCHER} --config {yaml_file} --speculative-algorithm EAGLE3 {SPEC}"])
    assert not errors(fixed, "algorithm")


def test_unreadable_config_yaml_is_one_line_exit_2(tmp_path, capsys):
    import argparse

    bad = tmp_path / "bad.yaml"
    bad.write_text("speculative-algorithm: [EAGLE\n")
    with pytest.raises(DoctorInputError, match="bad.yaml: --config file is not readable YAML"):
        diagnose(launches=[f"{LAUNCHER} --config {bad}"])
    parser = argparse.ArgumentParser()
    add_doctor_parser(parser.add_subparsers())
    args = parser.parse_args(["doctor", "--launch", f"{LAUNCHER} --config {tmp_path / 'none.yaml'}"])
    assert doctor_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none.yaml: --config file of the launch line not found" in err
