"""What README.md tells a real user to type exists (issue 20.9): the notebook parameters it names for real
servers and for sizing a bigger target, the Lab defaults it states, and the SGLang release it names.
Fast: reads the README and the notebooks' parameters cells only."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from draftlab.run import notebook as nb
from draftlab.sglang.bundle import BundleOptions

ROOT = Path(__file__).parents[1]
README = (ROOT / "README.md").read_text()

# (notebook, parameters the README tells a user to set in it)
DOCUMENTED = [
    ("03_regenerate", ["BACKEND", "BASE_URLS", "SERVED_MODEL", "CONCURRENCY", "BATCH_TOKENS"]),
    ("04_train_draft", ["BATCH_TOKENS", "MAX_LEN", "HIDDEN", "SIDE_BY_SIDE"]),
    ("06_benchmark_acceptance", ["LIVE_BASELINE_URL", "LIVE_SPEC_URLS", "SGLANG_STUDY"]),
]


@pytest.mark.parametrize("stem,names", DOCUMENTED, ids=[s for s, _ in DOCUMENTED])
def test_parameters_the_readme_names_are_the_notebooks(stem, names):
    declared = nb.declared_parameters(nb.notebook_path(stem))
    for name in names:
        assert re.search(rf"(`|-p\s+){name}\b", README), f"README no longer names {stem}'s {name}"
        assert name in declared, f"README names {name} for {stem}, which has no such parameter"
    shapes = {"BASE_URLS": list, "LIVE_SPEC_URLS": dict}  # README: '["http://host:30000"]', {"eagle3": "http://..."}
    for name in set(names) & set(shapes):
        assert isinstance(declared[name], shapes[name]), f"{stem}'s {name} is not a {shapes[name].__name__}"


def test_the_lab_defaults_the_readme_states_are_the_notebooks():
    lab = README[README.index("Their defaults are") :]  # the JupyterLab section's sentence (TARGET="tiny" comes later)
    stated = {}
    for key, value in re.findall(r'`(TARGET|PROFILE|RUN_DIR)="([^"]+)"`', lab):
        stated.setdefault(key, value)
    assert stated == {"TARGET": "embedded", "PROFILE": "quick", "RUN_DIR": "results/lab"}, stated
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")):
        declared = nb.declared_parameters(path)
        assert {k: declared[k] for k in stated} == stated, path.stem


def test_the_sglang_release_the_readme_names_is_the_bundles_default():
    named = set(re.findall(r"SGLang release this was measured with is\s+(\d+\.\d+\.\d+)", README))
    assert named == {BundleOptions().version}, named
    assert f"--version {BundleOptions().version}" in README


def test_the_readme_says_how_to_use_a_gated_model():
    assert "HF_TOKEN" in README and "gated" in README
