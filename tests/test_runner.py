import json
import subprocess
import sys

import pytest
import yaml

from draftlab.run import notebook as nb
from draftlab.run import runner


def test_profiles_only_name_declared_parameters():
    notebooks = runner.all_notebooks()
    for profile in runner.PROFILES:
        runner.resolve_parameters(notebooks, runner.load_profile(profile), {}, profile)


def test_misspelled_override_fails_before_running():
    with pytest.raises(nb.ParameterError, match="did you mean TARGET"):
        runner.resolve_parameters(
            runner.select_notebooks(["00"]), runner.load_profile("smoke"), {"TARGT": "x"}, "smoke"
        )


def test_unknown_profile_key_fails(tmp_path):
    profile = {"common": {"TARGET": "tiny"}, "00_environment_check": {"SEEDS": 1}}
    with pytest.raises(nb.ParameterError, match="unknown parameter SEEDS"):
        runner.resolve_parameters(runner.select_notebooks(["00"]), profile, {}, "x")
    with pytest.raises(nb.ParameterError, match="names no notebook"):
        runner.resolve_parameters(runner.select_notebooks(["00"]), {"99_nothing": {}}, {}, "x")


def test_wrong_type_fails():
    with pytest.raises(nb.ParameterError, match="expected int"):
        runner.resolve_parameters(runner.select_notebooks(["00"]), {}, {"SEED": "zero"}, "smoke")


def test_cli_rejects_bad_parameter_with_exit_2(tmp_path):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "draftlab.cli",
            "run",
            "00",
            "--profile",
            "smoke",
            "-p",
            "DEVISE",
            "cpu",
            "--results",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "DEVISE" in proc.stderr and "DEVICE" in proc.stderr
    assert not any(tmp_path.iterdir())  # nothing ran, nothing written


def test_notebook_start_rejects_injected_unknown(tmp_path):
    params = {"RUN_DIR": str(tmp_path), "PROFILE": "smoke", "TARGET": "tiny", "DEVICE": "cpu", "SEED": 0, "EXTRA": 1}
    with pytest.raises(nb.ParameterError, match="EXTRA"):
        nb.start("00_environment_check", params)


def test_run_environment_check_smoke(tmp_path):
    run_dir = runner.run_notebooks(["00"], "smoke", {"SEED": 3}, run_id="t", results_dir=tmp_path)
    params = yaml.safe_load((run_dir / "params.yaml").read_text())
    assert params["notebooks"]["00_environment_check"]["SEED"] == 3
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["00_environment_check"]["target"]["capture_layers"] == [2, 4, 5]
    assert (run_dir / "figures" / "00_environment_check_capture_layers.png").stat().st_size > 1000
    assert (run_dir / "executed" / "00_environment_check.ipynb").is_file()


def test_rerun_of_one_stage_keeps_the_other_stages_parameters(tmp_path):
    run_dir = runner.run_notebooks(["00"], "smoke", {"SEED": 3}, run_id="t", results_dir=tmp_path)
    (run_dir / "params.yaml").write_text(
        yaml.safe_dump({"notebooks": {"99_other": {"SEED": 1}, "00_environment_check": {"SEED": 0}}})
    )
    runner.run_notebooks(["00"], "smoke", {"SEED": 4}, run_id="t", results_dir=tmp_path)
    notebooks = yaml.safe_load((run_dir / "params.yaml").read_text())["notebooks"]
    assert notebooks["99_other"] == {"SEED": 1}
    assert notebooks["00_environment_check"]["SEED"] == 4
