"""TrainConfig: the training recipe and its defaults, in one place.

Every default of the recipe lives here; the CLI, notebooks 04/07 and the side-by-side runner
read it from this dataclass instead of repeating the numbers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class TrainConfig:
    train_file: str = ""  # canonical conversations (JSONL), e.g. RUN_DIR/data/regen/train.jsonl
    val_file: str = ""  # validation conversations (JSONL); empty: no eval
    out_dir: str = "results/dev/train/eagle3"  # logs, checkpoints, vocab.json
    target: str = "tiny"  # target spec for draftlab.model.target.load_target
    arch: str = "eagle3"  # eagle3 (three aux states + fc) or eagle1 (final state only, no fc)
    device: str = "auto"
    capture_layers: list = field(default_factory=list)  # empty: SGLang default [2, N//2, N-3]
    draft_vocab_size: int = 32000
    intermediate_size: int = 0  # 0: the target's
    init_from_target: bool = False  # lm_head rows and final norm from the target (worse on quick: notes/issue5.md)
    max_len: int = 2048  # tokens per conversation
    overlong: str = "truncate"  # or "drop"
    max_train_samples: int = 0  # 0: all
    max_val_samples: int = 256
    epochs: float = 2.0
    batch_tokens: int = 16384  # padded tokens per micro-batch (per process)
    max_batch: int = 64  # sequences per micro-batch at most
    grad_accum: int = 1
    ttt_steps: int = 7
    step_decay: float = 0.8
    lr: float = 1e-4
    warmup_ratio: float = 0.015
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    hidden: str = "online"  # online | offline
    hidden_dir: str = ""  # offline shards (default: <out_dir>/../hidden/<split>)
    hidden_dtype: str = "auto"  # offline storage: auto = bfloat16 on GPU, float32 on CPU
    log_every: int = 10
    eval_every: int = 200
    save_every: int = 500
    keep_checkpoints: int = 2
    stop_after: int = 0  # stop after this many steps in this call (simulated crash / time box); 0: run to the end
    seed: int = 0
    threads: int = 2  # torch threads on CPU
    pad_multiple: int = 1  # batch length rounded up to this (64 helped only cuDNN's attention: LOG.md)
    attention: str = (
        "auto"  # SDPA kernel: auto (torch's choice, cuDNN's off on CUDA) | cudnn | efficient | flash | math
    )

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown training settings {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)
