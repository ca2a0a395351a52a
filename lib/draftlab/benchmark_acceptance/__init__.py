"""Notebook 06: acceptance length, speed and the break-even model (`draftlab bench specdec`, `bench live`)."""
