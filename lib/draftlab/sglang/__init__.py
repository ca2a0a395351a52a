"""SGLang on machines without a network: an offline bundle of real wheels, built where a package
index is reachable (`draftlab sglang bundle`) and installed, hash-checked, where none is
(`draftlab sglang install`, or `python3 -m draftlab.sglang.install install` with the standard library
and pip alone); and SGLang servers started from draftlab's launch commands (`server`).
"""
