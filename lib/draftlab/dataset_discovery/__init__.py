"""Notebook 01: the dataset catalog, live Hub search, scoring, and the source adapters that read datasets."""
