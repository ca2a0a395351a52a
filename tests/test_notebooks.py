"""Committed notebooks: outputs stripped, a parameters cell, and in sync with their py:percent twin."""

import json
from pathlib import Path

import jupytext
import pytest

from draftlab.run.notebook import REQUIRED_PARAMETERS, declared_parameters

NOTEBOOKS = sorted((Path(__file__).parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_there_are_notebooks():
    assert NOTEBOOKS and NOTEBOOKS[0].name == "00_environment_check.ipynb"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_outputs_stripped(path):
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            assert cell.get("outputs") == [] and cell.get("execution_count") is None, f"{path.name} has outputs"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_parameters_cell(path):
    params = declared_parameters(path)
    assert set(REQUIRED_PARAMETERS) <= set(params)
    assert all(name.isupper() for name in params)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_paired_text_copy_in_sync(path):
    twin = path.with_suffix(".py")
    assert twin.is_file(), f"{twin.name} missing: run `jupytext --set-formats ipynb,py:percent {path}`"
    a, b = jupytext.read(path), jupytext.read(twin)
    cells = lambda n: [(c.cell_type, c.source.strip()) for c in n.cells]  # noqa: E731
    assert cells(a) == cells(b), f"{path.name} and {twin.name} differ: run `jupytext --sync {twin}`"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_no_definitions_in_notebooks(path):
    for cell in jupytext.read(path).cells:
        if cell.cell_type == "code":
            assert not any(line.startswith(("def ", "class ")) for line in cell.source.splitlines()), path.name
