"""Progress bars: plain text bars everywhere, never ipywidgets, never painted as errors in JupyterLab.

`tqdm.auto` in a kernel without ipywidgets warns in a pink box ("IProgress not found") and falls
back to a text bar on stderr, which Lab also paints pink. draftlab's bars are `tqdm.std` bars: on
stdout inside a Jupyter kernel (Lab redraws them in place), on stderr in a terminal. In a kernel,
`quiet_in_kernel` (run when draftlab is imported) also filters that warning from other libraries'
`tqdm.auto` and turns off the bars of huggingface_hub, transformers ("Loading weights") and
datasets ("Saving the dataset"), which would land on stderr.
"""

from __future__ import annotations

import os
import sys
import warnings

KERNEL_MININTERVAL_S = 1.0  # a redraw a second at most in a notebook, so long runs keep small outputs


def in_kernel() -> bool:
    """True inside a Jupyter (IPython) kernel: JupyterLab, papermill."""
    return "ipykernel" in sys.modules


def tqdm(iterable=None, **kwargs):
    """A tqdm.std bar; in a kernel on stdout, redrawn at most once a second unless told otherwise."""
    from tqdm.std import tqdm as text_bar

    if in_kernel():
        kwargs.setdefault("file", sys.stdout)
        kwargs.setdefault("mininterval", KERNEL_MININTERVAL_S)
    return text_bar(iterable, **kwargs)


def quiet_in_kernel() -> None:
    """In a kernel: no ipywidgets warning from tqdm.auto, no third-party bars on stderr (set before they import)."""
    if not in_kernel():
        return
    warnings.filterwarnings("ignore", message="IProgress not found")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
