"""Published executed notebooks (results/*/executed/*.ipynb, committed) show the figures they saved.

The GPU runs executed with a non-interactive backend, so their notebooks showed `PosixPath(...)`
where each plot belongs (issue 20.3). scripts/embed_saved_figures.py adds the saved PNG files
afterwards; these tests hold both the rule and the honesty of that repair.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers_lab import published_notebooks

ROOT = Path(__file__).parents[1]
SCRIPT = ROOT / "scripts" / "embed_saved_figures.py"
MARK = "draftlab_embedded_figure"
FIGURE_PATH = re.compile(r"(PosixPath\('|saved )[^'\s]*/figures/[^'\s]+\.png")  # a cell's saved-figure result


PUBLISHED = published_notebooks()


def code_cells(path: Path) -> list[dict]:
    return [c for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code"]


def text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def test_there_are_published_notebooks():
    assert any(p.parts[-3] == "reference" for p in PUBLISHED), "results/reference/executed/ has no notebook"


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: f"{p.parts[-3]}/{p.stem}")
def test_published_notebook_that_saves_figures_embeds_them(path):
    cells = code_cells(path)
    if not any("save_figure(" in text(c["source"]) for c in cells):
        pytest.skip(f"{path.name} saves no figure")
    shown = sum("image/png" in o.get("data", {}) for c in cells for o in c.get("outputs", []))
    assert shown, f"{'/'.join(path.parts[-3:])} saves figures but embeds none: run scripts/embed_saved_figures.py"
    for i, cell in enumerate(cells):
        outs = cell.get("outputs", [])
        named = [o for o in outs if FIGURE_PATH.search(text(o.get("data", {}).get("text/plain")))]
        if named:
            assert any("image/png" in o.get("data", {}) for o in outs), (
                f"{path.name} code cell {i}: a figure path, no figure"
            )


@pytest.mark.parametrize("path", PUBLISHED, ids=lambda p: f"{p.parts[-3]}/{p.stem}")
def test_embedded_saved_figures_are_the_runs_files(path):
    """Every figure added after the run is byte for byte the PNG in that run's figures/ folder."""
    for cell in code_cells(path):
        for out in cell.get("outputs", []):
            mark = out.get("metadata", {}).get(MARK)
            if mark:
                data = base64.b64decode(out["data"]["image/png"])
                assert hashlib.sha256(data).hexdigest() == mark["sha256"]
                assert data == (path.parent.parent / mark["file"]).read_bytes(), f"{path.name}: {mark['file']} differs"


def _notebook(cells: list[dict]) -> dict:
    return {"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


def _code(source: str, outputs: list[dict], count: int | None = 1) -> dict:
    return {
        "cell_type": "code",
        "execution_count": count,
        "id": f"c{count}",
        "metadata": {},
        "outputs": outputs,
        "source": source,
    }


def test_embed_script_adds_the_saved_file_and_only_that(tmp_path):
    run = tmp_path / "run"
    (run / "executed").mkdir(parents=True)
    (run / "figures").mkdir()
    shutil.copy(
        ROOT / "results/reference/figures/00_environment_check_capture_layers.png", run / "figures" / "00_x_shown.png"
    )
    path_out = {
        "output_type": "execute_result",
        "execution_count": 1,
        "metadata": {},
        "data": {"text/plain": "PosixPath('/elsewhere/run/figures/00_x_shown.png')"},
    }
    nb = _notebook(
        [
            _code('nb.save_figure(run, fig, "shown")', [path_out], 1),
            _code('nb.save_figure(run, fig, "missing")', [], 2),  # no such file: must not be invented
            _code('nb.save_figure(run, fig, "shown")', [], None),  # never ran
        ]
    )
    target = run / "executed" / "00_x.ipynb"
    target.write_text(json.dumps(nb))
    check = subprocess.run([sys.executable, str(SCRIPT), "--check", str(target)], capture_output=True, text=True)
    assert check.returncode == 1 and "would embed 1" in check.stdout
    done = subprocess.run([sys.executable, str(SCRIPT), str(target)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "00_x_missing.png" in done.stderr and "did not run" in done.stderr
    cells = json.loads(target.read_text())["cells"]
    assert cells[0]["outputs"][0] == path_out  # the text is kept
    image = cells[0]["outputs"][1]
    assert base64.b64decode(image["data"]["image/png"]) == (run / "figures" / "00_x_shown.png").read_bytes()
    assert cells[1]["outputs"] == [] and cells[2]["outputs"] == []
    again = subprocess.run([sys.executable, str(SCRIPT), "--check", str(target)], capture_output=True, text=True)
    assert again.returncode == 0, "a second pass must change nothing"
