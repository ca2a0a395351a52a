"""JupyterLab settings for this repository: `make lab` and the Lab tests load this file (--config).

Two things a new user would otherwise trip over (issue 20.5):
- Autosave wrote outputs into the tracked notebooks/NN_*.ipynb, which the repository's own test
  rejects. Here every save of a tracked notebook goes to disk stripped, as the git filter would
  strip it (outputs, counts, run-time metadata); the open tab keeps its outputs until closed.
  Executed copies with outputs are what `draftlab run` writes to results/<run_id>/executed/.
  Other notebooks (scratch ones, results/*/executed/) are saved as they are.
- Each notebook showed twice in the file browser, the .ipynb and its jupytext .py twin. The
  twins are hidden from listings; jupytext still reads and writes them as the pair.
"""

import fnmatch

import nbformat
from nbstripout import strip_output

TRACKED = "notebooks/[0-9][0-9]_*.ipynb"
TWINS = "[0-9][0-9]_*.py"
# nbstripout's own default keys, plus the kernel's language_info, which a run adds and the
# committed notebooks do not carry (the same list as the git filter: see the Makefile's setup)
STRIP_KEYS = ["metadata.signature", "metadata.widgets", "metadata.language_info", "cell.metadata.collapsed",
              "cell.metadata.ExecuteTime", "cell.metadata.execution", "cell.metadata.heading_collapsed",
              "cell.metadata.hidden", "cell.metadata.scrolled"]


def strip_tracked_notebook(model, path, contents_manager, **kwargs):
    """pre_save_hook: a tracked notebook reaches the disk without outputs, so git and the tests see it clean."""
    if model.get("type") != "notebook" or not fnmatch.fnmatch(path.strip("/"), TRACKED):
        return
    model["content"] = strip_output(nbformat.from_dict(model["content"]), keep_output=False, keep_count=False,
                                    keep_id=True, extra_keys=STRIP_KEYS)


c = get_config()  # noqa: F821 (provided by the Jupyter config loader)
c.ContentsManager.pre_save_hook = strip_tracked_notebook
c.ContentsManager.hide_globs = ["__pycache__", "*.pyc", "*.pyo", ".DS_Store", "*~", TWINS]  # jupyter_server's + TWINS
