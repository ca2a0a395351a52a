"""The recipe study: one change per row against the reference recipe, each row's draft measured in SGLang.

Run as `python -m studies.recipes STEP ...` from the repository root (studies/README.md)."""
