"""Running notebooks: the notebook-side helpers (run.notebook) and the headless runner (`draftlab run`)."""
