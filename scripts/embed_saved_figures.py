#!/usr/bin/env python3
"""Embed in published executed notebooks the figures their cells saved but did not display.

GPU runs executed with MPLBACKEND=Agg: each `nb.save_figure(...)` wrote RUN/figures/<name>.png,
but the notebook shows a `PosixPath(...)` (or nothing) where the plot belongs. For every code
cell that saved a figure and shows none, this adds one `image/png` display output built from
exactly that run's PNG file (base64, sha256 recorded in the output's metadata), keeping every
existing output. Nothing is drawn anew. A figure is taken only when the file is in the run's
figures/ folder and the cell ran without error, and it is named either by the cell's own
`PosixPath(...)` output or by a top-level `save_figure(run, fig, "label")` in its source (the
file name is `<notebook>_<label>.png`). A call nested in a branch may not have run: its file is
taken only when git shows the figure and the notebook were committed together.

    python scripts/embed_saved_figures.py                 # every results/*/executed/*.ipynb
    python scripts/embed_saved_figures.py --check         # exit 1 if any would change
    python scripts/embed_saved_figures.py PATH.ipynb ...  # these notebooks (RUN/executed/X.ipynb)
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# PosixPath('...') in old records; "saved <path>" since run.notebook.Saved
PATH_OUTPUT = re.compile(r"(?:PosixPath\('|saved )([^'\s]*/figures/([^'/\s]+\.png))")
SAVE_CALL = re.compile(r"""^(\s*).*save_figure\(\s*run\s*,\s*\w+\s*,\s*["']([^"']+)["']\s*\)""", re.M)
MARK = "draftlab_embedded_figure"


def _text(value) -> str:
    return "".join(value) if isinstance(value, list) else (value or "")


def _committed_together(a: Path, b: Path) -> bool:
    """True when some commit touched both files (a figure published with its notebook)."""

    def commits(path: Path) -> set[str]:
        try:
            out = subprocess.run(
                ["git", "log", "--format=%H", "--", str(path)],
                cwd=path.parent,
                capture_output=True,
                text=True,
                check=True,
            ).stdout
        except (OSError, subprocess.CalledProcessError):
            return set()
        return set(out.split())

    return bool(commits(a) & commits(b))


def figures_saved_by(cell: dict, stem: str) -> list[tuple[str, bool]]:
    """(file name, certain) for each figure the cell saved; certain = shown by its output or top-level call."""
    names: dict[str, bool] = {}
    for out in cell.get("outputs", []):
        for match in PATH_OUTPUT.finditer(_text(out.get("data", {}).get("text/plain"))):
            names[match.group(2)] = True
    for match in SAVE_CALL.finditer(_text(cell.get("source"))):
        name = f"{stem}_{match.group(2)}.png"
        names[name] = names.get(name, False) or not match.group(1)
    return list(names.items())


def image_output(png: Path, relative: str) -> dict:
    data = png.read_bytes()
    return {
        "output_type": "display_data",
        "data": {
            "image/png": base64.b64encode(data).decode("ascii"),
            "text/plain": [f"<figure saved by this cell: {relative}>"],
        },
        "metadata": {
            MARK: {
                "file": relative,
                "sha256": hashlib.sha256(data).hexdigest(),
                "added_by": "scripts/embed_saved_figures.py",
                "why": "the run used a non-interactive matplotlib backend; this is the PNG the cell saved",
            }
        },
    }


def repair(path: Path, write: bool = True) -> tuple[int, list[str]]:
    """Add the missing figures to one executed notebook; returns (figures added, notes on skipped ones)."""
    raw = path.read_text()
    nb = json.loads(raw)
    figures = path.parent.parent / "figures"
    stem, added, notes = path.stem, 0, []
    for index, cell in enumerate(nb["cells"]):
        if cell.get("cell_type") != "code":
            continue
        outputs = cell.setdefault("outputs", [])
        if any("image/png" in out.get("data", {}) for out in outputs):
            continue  # it shows a figure already
        saved = figures_saved_by(cell, stem)
        if not saved:
            continue
        if cell.get("execution_count") is None or any(out.get("output_type") == "error" for out in outputs):
            notes.append(f"{path}: cell {index} did not run cleanly; nothing embedded")
            continue
        for name, certain in saved:
            png = figures / name
            if not png.is_file():
                notes.append(f"{path}: cell {index} saved {name}, but {png} is missing; nothing embedded")
            elif not certain and not _committed_together(png, path):
                notes.append(
                    f"{path}: cell {index} may have saved {name} (call inside a branch) and git does not "
                    "show it committed with this notebook; nothing embedded"
                )
            else:
                outputs.append(image_output(png, f"figures/{name}"))
                added += 1
    if added and write:
        end = "\n" if raw.endswith("\n") else ""  # nbformat's layout, so only the new outputs show in a diff
        path.write_text(json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + end)
    return added, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="executed notebooks (default results/*/executed/*.ipynb)"
    )
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a figure would be added")
    args = parser.parse_args(argv)
    paths = args.notebooks or sorted(ROOT.glob("results/*/executed/*.ipynb"))
    total = 0
    for path in paths:
        added, notes = repair(path, write=not args.check)
        total += added
        for note in notes:
            print(f"note: {note}", file=sys.stderr)
        if added:
            print(f"{path}: {'would embed' if args.check else 'embedded'} {added} saved figure(s)")
    print(f"{total} figure(s) {'missing' if args.check else 'embedded'} in {len(paths)} notebook(s)")
    return 1 if args.check and total else 0


if __name__ == "__main__":
    sys.exit(main())
