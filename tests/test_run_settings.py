"""A run folder carries its own settings (run.json), stages say in one line what to run first, Lab
defaults are the quick profile on the embedded target, and random weights are stamped on every figure
(issue 20.1, 20.2). Fast: no notebook is executed here (tests/test_notebook_chain.py executes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from draftlab.run import notebook as nb
from draftlab.run import runner, settings
from helpers_lab import png_text

ROOT = Path(__file__).parents[1]
NOTEBOOKS = runner.all_notebooks()


def defaults(stem: str, run_dir: Path) -> dict:
    """A notebook's namespace as Run All in Lab has it: the parameters cell, with RUN_DIR changed."""
    return {**nb.declared_parameters(nb.notebook_path(stem)), "RUN_DIR": str(run_dir)}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_lab_defaults_are_the_quick_profile_on_the_embedded_target(path):
    declared = nb.declared_parameters(path)
    assert (declared["TARGET"], declared["PROFILE"], declared["RUN_DIR"]) == ("embedded", "quick", "results/lab")
    quick = settings.profile_values("quick", path.stem, declared)
    differ = {k: (declared[k], v) for k, v in quick.items() if k != "DEVICE" and declared[k] != v}
    assert not differ, f"{path.stem}: defaults differ from params/quick.yaml (default, quick): {differ}"
    assert settings.caveat(declared["TARGET"]) is None


def test_first_stage_writes_run_json_and_a_later_one_opened_with_only_run_dir_takes_it(tmp_path, capsys):
    ns = {**defaults("00_environment_check", tmp_path), "TARGET": "tiny", "PROFILE": "smoke"}
    first = nb.start("00_environment_check", ns)
    assert not (tmp_path / "run.json").exists()  # a stage that stops before its end pins nothing
    nb.save_metrics(first, {"done": True})
    record = json.loads((tmp_path / "run.json").read_text())
    assert (record["TARGET"], record["PROFILE"], record["written_by"]) == ("tiny", "smoke", "00_environment_check")
    later = defaults("05_flag_diagnosis", tmp_path)
    run = nb.start("05_flag_diagnosis", later)
    assert (later["TARGET"], later["PROFILE"]) == ("tiny", "smoke") == (run.target_spec, run.profile)
    smoke = yaml.safe_load((ROOT / "params" / "smoke.yaml").read_text())["05_flag_diagnosis"]
    for key in ("EVAL_PROMPTS", "MAX_NEW_TOKENS", "BUILD_DRAFT_IF_MISSING"):  # the run's sizes, not Lab's
        assert later[key] == smoke[key] == run.params[key], key
    assert later["DEVICE"] == "auto"  # where this stage runs is the opener's
    out = capsys.readouterr().out
    assert "from the run folder" in out and "TARGET='tiny'" in out and "EVAL_PROMPTS=1" in out
    assert run.caveat == "random weights (tiny target): not a result; demo scale (smoke profile), not a result"
    assert "random weights" in out and f"RUN_DIR {tmp_path} (a smoke run of 'tiny')" in out


def test_an_explicit_value_other_than_the_runs_is_a_one_line_error(tmp_path):
    (tmp_path / "run.json").write_text(json.dumps({"TARGET": "tiny", "PROFILE": "smoke"}))
    ns = {**defaults("05_flag_diagnosis", tmp_path), "TARGET": "data/some-model"}
    with pytest.raises(settings.RunSettingsError, match="is a run of TARGET='tiny'") as err:
        nb.start("05_flag_diagnosis", ns)
    assert len(err.value._render_traceback_()) == 1 and "choose another RUN_DIR" in str(err.value)
    explicit_same = {**defaults("05_flag_diagnosis", tmp_path), "TARGET": "tiny", "PROFILE": "smoke", "EVAL_PROMPTS": 3}
    nb.start("05_flag_diagnosis", explicit_same)
    assert explicit_same["EVAL_PROMPTS"] == 3  # agrees with the run: nothing taken, nothing overridden


def test_a_folder_from_before_run_json_is_read_from_the_runners_params_yaml(tmp_path):
    (tmp_path / "params.yaml").write_text(
        yaml.safe_dump(
            {"profile": "full", "notebooks": {"04_train_draft": {"TARGET": "embedded"}, "05_flag_diagnosis": {}}}
        )
    )
    assert settings.run_settings(tmp_path) is None  # the runner's record of a run whose first stage stopped
    (tmp_path / "metrics.json").write_text(json.dumps({"_run": {}, "04_train_draft": {}}))
    assert settings.run_settings(tmp_path) == {"PROFILE": "full", "TARGET": "embedded"}
    assert settings.run_settings(ROOT / "results" / "reference") == {"PROFILE": "full", "TARGET": "embedded"}
    assert settings.run_settings(tmp_path / "new") is None


def test_a_missing_stage_names_every_stage_to_run_in_order(tmp_path):
    with pytest.raises(settings.StageMissing) as err:
        settings.require(tmp_path, "04_train_draft")
    text = str(err.value)
    assert "no drafts/eagle3/config.json (04_train_draft's output)" in text
    assert "run 02_blend, then 03_regenerate, then 04_train_draft first" in text
    assert f"draftlab run 02 03 04 --results {tmp_path.parent} --run-id {tmp_path.name}" in text
    assert len(err.value._render_traceback_()) == 1  # Lab shows this line, no traceback
    for name in ("train", "test"):
        (tmp_path / "data" / "blend").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data" / "blend" / f"{name}.jsonl").write_text("{}\n")
    with pytest.raises(settings.StageMissing, match="run 03_regenerate, then 04_train_draft first"):
        settings.require(tmp_path, "04_train_draft", "02_blend")
    settings.require(tmp_path, "02_blend")  # done: nothing raised
    assert settings.run_command(ROOT / "results" / "lab", ["03_regenerate"]) == "draftlab run 03 --run-id lab"


def test_runner_takes_an_existing_runs_profile_and_target_and_refuses_others(tmp_path):
    run_dir = tmp_path / "r"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(json.dumps({"TARGET": "tiny", "PROFILE": "smoke"}))
    assert runner.run_folder_settings(run_dir, None, {}) == ("smoke", {"TARGET": "tiny"})
    assert runner.run_folder_settings(run_dir, "smoke", {"SEED": 1}) == ("smoke", {"SEED": 1, "TARGET": "tiny"})
    with pytest.raises(nb.ParameterError, match="run of the smoke profile"):
        runner.run_folder_settings(run_dir, "quick", {})
    with pytest.raises(nb.ParameterError, match="run of TARGET='tiny'"):
        runner.run_folder_settings(run_dir, None, {"TARGET": "embedded"})
    assert runner.run_folder_settings(tmp_path / "new", None, {}) == ("quick", {})


@pytest.mark.parametrize("value", ["gpu", "CPU", "tpu:0"], ids=lambda v: f"DEVICE={v}")
def test_a_device_that_is_not_one_fails_before_papermill_starts(tmp_path, value):
    """`draftlab run -p DEVICE gpu` prints a ParameterError as one line, exit 2 (tests/test_runner.py's CLI case)."""
    with pytest.raises(nb.ParameterError, match="is not a device: use auto, cpu, cuda or cuda:N"):
        runner.resolve_parameters(
            runner.select_notebooks(["00"]), runner.load_profile("smoke"), {"DEVICE": value}, "smoke"
        )


def test_a_random_target_stamps_every_figure_and_records_it(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = nb.Run(
        "03_regenerate", tmp_path, {"TARGET": "tiny", "PROFILE": "full"}, "cpu", caveat=settings.caveat("tiny")
    )
    run.figures.mkdir()
    fig, (a, b) = plt.subplots(1, 2)
    path = nb.save_figure(run, fig, "x", caveat="untrained draft: not a result")
    want = "random weights (tiny target): not a result; untrained draft: not a result"
    assert want in [t.get_text() for t in fig.texts]  # the banner
    assert all(any("random weights" in t.get_text() for t in ax.texts) for ax in (a, b))  # and each panel
    assert png_text(path).get("draftlab:caveat") == want
    real = nb.Run("03_regenerate", tmp_path, {"TARGET": "embedded", "PROFILE": "full"}, "cpu")
    fig2, _ = plt.subplots()
    saved = png_text(nb.save_figure(real, fig2, "y"))
    assert "draftlab:caveat" not in saved and [t.get_text() for t in fig2.texts] == [saved["draftlab:source"]]
    assert saved["draftlab:source"].startswith("source: target embedded; draftlab regenerate ")
    plt.close("all")
    # a cell that ends with the call shows where the file went, not PosixPath('...') (issue 20.3)
    assert repr(path) == f"saved {tmp_path / 'figures' / '03_regenerate_x.png'}" and path.is_file()
    assert repr(nb.save_metrics(run, {"a": 1})) == f"saved {tmp_path / 'metrics.json'}"
