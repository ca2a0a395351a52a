"""The model layer: the target, the draft, their hidden states and the SGLang contract.

Importing the package loads nothing heavy; `capture` and `contract` need no torch.
"""
