"""The core layer: no torch. Records, JSONL I/O, atomic writes, paths, acceptance, launch strings, local servers."""
