"""Tracked notebooks stay without outputs whichever way they are saved, and Lab lists each one once.

Two guards (issue 20.5): the git clean filter that .gitattributes names (installed by `make setup`
through scripts/install_git_filter.sh) strips what is committed; the Lab config that `make lab`
loads strips what autosave writes to notebooks/NN_*.ipynb and hides the jupytext .py twins.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from helpers_lab import running_lab

ROOT = Path(__file__).parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def with_outputs(nb: dict) -> dict:
    """The notebook as a run in Lab leaves it: outputs, counts, timing metadata, language_info."""
    nb = copy.deepcopy(nb)
    for i, cell in enumerate(c for c in nb["cells"] if c["cell_type"] == "code"):
        cell["execution_count"] = i + 1
        cell["outputs"] = [
            {"output_type": "stream", "name": "stdout", "text": f"out {i}\n"},
            {"output_type": "execute_result", "execution_count": i + 1, "metadata": {}, "data": {"text/plain": f"{i}"}},
        ]
        cell["metadata"]["execution"] = {"iopub.status.busy": "2026-12-01T09:00:00Z"}
    nb["metadata"]["language_info"] = {"name": "python", "version": "3.11"}
    return nb


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, check=check)


@pytest.fixture
def filtered_repo(tmp_path):
    """A fresh git repository with this project's .gitattributes and filter installed."""
    repo = tmp_path / "repo"
    (repo / "notebooks").mkdir(parents=True)
    git(repo, "init", "-q")
    shutil.copy(ROOT / ".gitattributes", repo / ".gitattributes")
    for _ in range(2):  # installing twice must leave one setting, not two
        subprocess.run(["bash", str(ROOT / "scripts" / "install_git_filter.sh"), sys.executable, str(repo)], check=True)
    assert len(git(repo, "config", "--get-all", "filter.nbstripout.clean").stdout.splitlines()) == 1
    return repo


def test_git_filter_commits_a_notebook_with_outputs_stripped(filtered_repo):
    source = ROOT / "notebooks" / "00_environment_check.ipynb"
    work = filtered_repo / "notebooks" / source.name
    work.write_text(json.dumps(with_outputs(json.loads(source.read_text())), indent=1))
    git(filtered_repo, "add", "notebooks")
    staged = git(filtered_repo, "show", f":notebooks/{source.name}").stdout
    assert staged == source.read_bytes(), "the staged notebook differs from its committed, stripped form"
    assert '"out 0' in work.read_text()  # the working copy keeps its outputs
    assert git(filtered_repo, "diff", "--quiet", check=False).returncode == 0  # and git sees nothing to commit


def test_git_filter_leaves_committed_notebooks_unchanged(filtered_repo):
    for path in NOTEBOOKS:
        shutil.copy(path, filtered_repo / "notebooks" / path.name)
    git(filtered_repo, "add", "notebooks")
    for path in NOTEBOOKS:
        assert git(filtered_repo, "show", f":notebooks/{path.name}").stdout == path.read_bytes(), path.name


def test_git_filter_is_installed_in_this_checkout():
    """`make setup` ran before the tests; without this a commit from Lab would carry outputs."""
    if git(ROOT, "rev-parse", "--git-dir", check=False).returncode != 0:
        pytest.skip("not a git checkout")
    clean = git(ROOT, "config", "--get", "filter.nbstripout.clean", check=False).stdout.decode()
    assert "nbstripout" in clean, "no nbstripout filter in .git/config: run `make setup`"
    attrs = git(ROOT, "check-attr", "filter", "--", "notebooks/00_environment_check.ipynb").stdout.decode()
    assert attrs.strip().endswith("nbstripout")


@pytest.mark.server
def test_lab_lists_each_notebook_once(tmp_path):
    with running_lab(ROOT, tmp_path) as lab:
        names = [item["name"] for item in lab.api("GET", "contents/notebooks").json()["content"]]
        stems = sorted(p.stem for p in NOTEBOOKS)
        numbered = sorted(n for n in names if n[:2].isdigit())
        assert numbered == [f"{s}.ipynb" for s in stems], f"Lab lists {numbered}"
        model = lab.api("GET", "contents/notebooks/00_environment_check.ipynb").json()
        assert model["type"] == "notebook" and model["content"]["cells"]


@pytest.mark.server
def test_lab_saves_tracked_notebooks_stripped_and_others_as_they_are(tmp_path):
    root = tmp_path / "root"
    shutil.copytree(ROOT / "notebooks", root / "notebooks")
    name = "notebooks/00_environment_check.ipynb"
    original = (ROOT / name).read_bytes()
    twin = (ROOT / name).with_suffix(".py").read_bytes()
    with running_lab(root, tmp_path) as lab:
        nb = with_outputs(lab.api("GET", f"contents/{name}").json()["content"])
        lab.api("PUT", f"contents/{name}", json={"type": "notebook", "format": "json", "content": nb})
        assert (root / name).read_bytes() == original, "Lab wrote outputs into a tracked notebook"
        assert (root / name).with_suffix(".py").read_bytes() == twin
        lab.api("PUT", "contents/scratch.ipynb", json={"type": "notebook", "format": "json", "content": nb})
        scratch = json.loads((root / "scratch.ipynb").read_text())
        assert any(c.get("outputs") for c in scratch["cells"]), "an untracked notebook lost its outputs"


@pytest.mark.server
def test_lab_serves_a_runs_executed_notebooks_read_only(tmp_path):
    """Opening a published executed notebook marks it changed (the kernel rewrites language_info), so autosave
    rewrote the committed record: Lab gets it as read-only (autosave skips it) and a save is refused."""
    root = tmp_path / "root"
    rel = "results/reference/executed/00_environment_check.ipynb"
    (root / rel).parent.mkdir(parents=True)
    shutil.copy(ROOT / rel, root / rel)
    (root / "notebooks").mkdir()
    shutil.copy(ROOT / "notebooks" / "00_environment_check.ipynb", root / "notebooks")
    with running_lab(root, tmp_path) as lab:
        model = lab.api("GET", f"contents/{rel}").json()
        assert model["type"] == "notebook" and model["writable"] is False
        assert lab.api("GET", "contents/notebooks/00_environment_check.ipynb").json()["writable"] is True
        nb = model["content"]
        nb["metadata"]["language_info"]["version"] = "3.0.0"
        with pytest.raises(httpx.HTTPStatusError) as refused:
            lab.api("PUT", f"contents/{rel}", json={"type": "notebook", "format": "json", "content": nb})
        assert "read-only" in refused.value.response.text  # 403 from the hook; jupytext reports it as a 500
        assert (root / rel).read_bytes() == (ROOT / rel).read_bytes()
        copy = "results/reference/executed/00_copy.ipynb"  # Save As a new name is still possible
        lab.api("PUT", f"contents/{copy}", json={"type": "notebook", "format": "json", "content": nb})
        assert (root / copy).is_file()
