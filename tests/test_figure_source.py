"""The one door every notebook figure goes through: the source line, the demo stamp, legible text; and
a missing stage that names the run folders which already have its output."""

import json

import pytest

from draftlab import __version__
from draftlab.run import notebook as nb
from draftlab.run import settings
from helpers_lab import png_text


@pytest.fixture
def plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as pyplot

    return pyplot


def test_a_quick_run_figure_is_a_demo_with_its_source_and_legible_text(tmp_path, plt):
    (tmp_path / "metrics.json").write_text(
        json.dumps({"04_train_draft": {"eagle3": {"steps": 15, "train_stats": {"kept": 80}}}})
    )
    caveat = settings.scale_caveat("quick")
    run = nb.Run("06_benchmark_acceptance", tmp_path, {"TARGET": "embedded", "PROFILE": "quick"}, "cpu", caveat)
    run.source = "draftlab engine (float32), blend n=2"
    run.figures.mkdir()
    fig, ax = plt.subplots()
    ax.plot([1, 2], [1, 2], label="a line")
    ax.legend(fontsize=6)
    ax.tick_params(labelsize=5)
    meta = png_text(nb.save_figure(run, fig, "x"))
    assert meta["draftlab:caveat"] == "demo scale (quick profile), not a result"
    source = meta["draftlab:source"]
    assert source.startswith(f"source: target embedded; draftlab engine {__version__} (float32), blend n=2; ")
    assert "device cpu; quick profile; draft trained on 80 conversations, 15 steps" in source
    sizes = [t.get_fontsize() for t in fig.findobj(plt.Text) if t.get_text()]
    assert min(sizes) >= nb.MIN_FONT


def test_result_scale_is_not_stamped():
    assert settings.scale_caveat("full") is None
    assert settings.scale_caveat("smoke") == "demo scale (smoke profile), not a result"


def test_a_missing_stage_names_the_runs_that_have_it(tmp_path):
    done = tmp_path / "20261207-quick"
    (done / "drafts" / "eagle3").mkdir(parents=True)
    (done / "drafts" / "eagle3" / "config.json").write_text("{}")
    (tmp_path / "half").mkdir()  # a run without the output is not offered
    with pytest.raises(settings.StageMissing) as err:
        settings.require(tmp_path / "lab", "04_train_draft")
    text = str(err.value)
    assert text.endswith(f"; or set RUN_DIR to a run that has it: '{done}'") and "half" not in text
    assert len(err.value._render_traceback_()) == 1


def test_errors_scroll_into_view_only_in_a_kernel():
    nb.show_errors_in_view()  # outside IPython: nothing to register, nothing raised
    assert "scrollIntoView" in nb.SCROLL_TO_ERROR
