"""Time draftlab.train_draft.vocab.token_counts against the per-row version it replaced, on a tokens cache.

Why: the per-row version spent ~345 s on the H200 machine when two trainings ran side by side
(results/h200-profile-2026-11-30/setup-trace/ at commit 68ee383). Run two copies at once to oversubscribe the cores:

  PYTHONPATH=lib .venv/bin/python benchmarks/bench_token_counts.py {old,new} THREADS RUN/train/tokens/train-*/data
"""

import sys
import time

import datasets
import torch

from draftlab.train_draft.vocab import token_counts


def per_row_counts(samples, vocab_size: int) -> torch.Tensor:
    """The replaced version: a bincount and a V-wide add per conversation."""
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for s in samples:
        ids = torch.as_tensor(s["input_ids"], dtype=torch.int64)
        counts += torch.bincount(ids[torch.as_tensor(s["loss_mask"], dtype=torch.bool)], minlength=vocab_size)
    return counts


if __name__ == "__main__":
    which, threads, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    torch.set_num_threads(threads)
    ds = datasets.load_from_disk(folder)
    fn = per_row_counts if which == "old" else token_counts
    t = time.time()
    counts = fn(ds, 49152)
    print(f"{which}: {threads} threads, {time.time() - t:.1f} s, {int(counts.sum()):,} masked tokens")
