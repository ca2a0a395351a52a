"""draftlab: train, export, diagnose and benchmark EAGLE-3 speculative-decoding drafts."""

__version__ = "0.1.0"
