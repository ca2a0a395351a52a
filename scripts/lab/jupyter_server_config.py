"""JupyterLab settings for this repository: `make lab` and the Lab tests load this file (--config).

Two things a new user would otherwise trip over (issue 20.5):
- Autosave wrote outputs into the tracked notebooks/NN_*.ipynb, which the repository's own test
  rejects. Here every save of a tracked notebook goes to disk stripped, as the git filter would
  strip it (outputs, counts, run-time metadata); the open tab keeps its outputs until closed.
  Executed copies with outputs are what `draftlab run` writes to results/<run_id>/executed/.
  Other notebooks (scratch ones, results/*/executed/) are saved as they are.
- Each notebook showed twice in the file browser, the .ipynb and its jupytext .py twin. The
  twins are hidden from listings; jupytext still reads and writes them as the pair.
- Opening a run's executed notebook (results/*/executed/*.ipynb: the committed published runs, and
  what `draftlab run` writes) marked it changed at once (the kernel rewrites language_info), so
  autosave rewrote a published record two minutes later. They are read-only in Lab: it shows them,
  autosave skips them, Ctrl+S says "read-only, use Save as", and a save through the API is refused.
"""

import fnmatch
import os

import nbformat
from jupyter_server.services.contents.largefilemanager import AsyncLargeFileManager
from nbstripout import strip_output
from tornado.web import HTTPError

TRACKED = "notebooks/[0-9][0-9]_*.ipynb"
RECORDS = "results/*/executed/*.ipynb"  # a run's executed notebooks: what the run printed and drew
TWINS = "[0-9][0-9]_*.py"
# nbstripout's own default keys, plus the kernel's language_info, which a run adds and the
# committed notebooks do not carry (the same list as the git filter: see the Makefile's setup)
STRIP_KEYS = [
    "metadata.signature",
    "metadata.widgets",
    "metadata.language_info",
    "cell.metadata.collapsed",
    "cell.metadata.ExecuteTime",
    "cell.metadata.execution",
    "cell.metadata.heading_collapsed",
    "cell.metadata.hidden",
    "cell.metadata.scrolled",
]


def is_record(path: str) -> bool:
    return fnmatch.fnmatch(path.strip("/"), RECORDS)


class DraftlabContentsManager(AsyncLargeFileManager):
    """Jupyter's default contents manager, with a run's executed notebooks reported read-only."""

    def is_writable(self, path):
        return not is_record(path) and super().is_writable(path)


def strip_tracked_notebook(model, path, contents_manager, **kwargs):
    """pre_save_hook: a tracked notebook reaches the disk without outputs, so git and the tests see it clean;
    an existing run record is not overwritten."""
    if is_record(path) and os.path.isfile(contents_manager._get_os_path(path.strip("/"))):
        raise HTTPError(403, f"{path.strip('/')} is a run's record, read-only in JupyterLab: use File > Save As")
    if model.get("type") != "notebook" or not fnmatch.fnmatch(path.strip("/"), TRACKED):
        return
    model["content"] = strip_output(
        nbformat.from_dict(model["content"]), keep_output=False, keep_count=False, keep_id=True, extra_keys=STRIP_KEYS
    )


c = get_config()  # noqa: F821 (provided by the Jupyter config loader)
c.ServerApp.contents_manager_class = DraftlabContentsManager
c.ContentsManager.pre_save_hook = strip_tracked_notebook
c.ContentsManager.hide_globs = ["__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", TWINS]  # jupyter_server's + TWINS
