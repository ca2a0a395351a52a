"""draftlab: train, export, diagnose and benchmark EAGLE-3 speculative-decoding drafts."""

from draftlab.core.progress import quiet_in_kernel

__version__ = "0.1.0"

quiet_in_kernel()  # in a Jupyter kernel only: no ipywidgets warning, no third-party bars on stderr
