"""Notebook 00: versions, device, and the target's layers, width and capture layers (`draftlab target`)."""
