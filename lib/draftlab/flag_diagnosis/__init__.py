"""Notebook 05: `draftlab doctor`, every silent mismatch of the EAGLE-3 contract and the server flags."""
