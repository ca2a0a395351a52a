"""TrainConfig: the training recipe and its defaults, in one place.

The defaults are the best recipe measured in SGLang (recipes/eagle3-best.yaml gives its evidence;
tests/test_recipe_files.py holds the file equal to these defaults). The CLI, notebooks 04/07 and the
side-by-side runner read them from this dataclass instead of repeating the numbers.
"""

from __future__ import annotations

import dataclasses
import io
import re
import tokenize
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path


@dataclass
class TrainConfig:
    train_file: str = ""  # canonical conversations (JSONL), e.g. RUN_DIR/data/regen/train.jsonl
    val_file: str = ""  # validation conversations (JSONL); empty: no eval
    out_dir: str = "results/dev/train/eagle3"  # logs, checkpoints, vocab.json
    token_cache: str = ""  # tokenised conversations' cache; empty: <out_dir>/../tokens (rows of a study share one)
    target: str = ""  # the model the draft serves (folder, .gguf, Hub id, embedded); required: a draft fits one
    arch: str = "eagle3"  # eagle3 (three aux states + fc) or eagle1 (final state only, no fc)
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    capture_layers: list = field(default_factory=list)  # empty: SGLang default [2, N//2, N-3]
    draft_vocab_size: int = 16000  # draft vocabulary: the most frequent assistant tokens (d2t/t2d maps)
    intermediate_size: int = 0  # draft MLP width; 0: the target's
    fc_norm: str = "auto"  # RMSNorm before fc: none | per_layer (SGLang fc_norm) | concat | auto: per_layer on eagle3
    init_from_target: bool = False  # lm_head rows and final norm from the target (measured worse on quick)
    max_len: int = 2048  # tokens per conversation
    overlong: str = "truncate"  # conversations longer than max_len: truncate | drop
    max_train_samples: int = 0  # training conversations at most; 0: all
    max_val_samples: int = 256  # validation conversations at most
    epochs: float = 5.0  # passes over the training conversations
    batch_tokens: int = 16384  # padded tokens per micro-batch (per process)
    max_batch: int = 64  # sequences per micro-batch at most
    grad_accum: int = 1  # micro-batches per optimizer step
    ttt_steps: int = 7  # training-time-test unroll: draft positions trained per step
    step_decay: float = 0.8  # loss weight of unroll position i is step_decay**i
    loss: str = "soft"  # soft: CE against the target's softmax over the draft vocabulary | hard: against its arg-max
    lr: float = 1e-3  # AdamW peak learning rate
    warmup_ratio: float = 0.015  # share of the steps spent warming the learning rate up (then lr_schedule)
    lr_schedule: str = "cosine"  # after the warm-up: cosine (decay to 0) | linear (to 0) | constant (the peak held)
    weight_decay: float = 0.0  # AdamW weight decay
    grad_clip: float = 0.5  # gradient norm clip
    hidden: str = "online"  # target states: online (a forward a step) | offline (stored once) | sglang (SGLang's)
    hidden_dir: str = ""  # offline shards (default: <out_dir>/../hidden/<split>)
    hidden_dtype: str = "auto"  # offline storage: auto = bfloat16 on GPU, float32 on CPU
    sglang_args: str = ""  # hidden sglang: the target's SGLang launch flags, given as --sglang-args="--tp-size 8 ..."
    log_every: int = 10  # optimizer steps between lines of train.log
    eval_every: int = 200  # optimizer steps between validation passes
    save_every: int = 500  # optimizer steps between checkpoints (and one at the end)
    keep_checkpoints: int = 2  # checkpoints kept in out_dir (older ones are deleted)
    stop_after: int = 0  # stop after this many steps in this call (a simulated crash); 0: run to the end
    seed: int = 0  # random seed (data order, initialisation)
    threads: int = 2  # torch threads on CPU
    pad_multiple: int = 1  # batch length rounded up to this (64 helped only cuDNN's attention: dev/LOG.md)
    recompute_head: bool = True  # CUDA: recompute each TTT step's [N,Vd] logits in backward (memory for time)
    compile: bool = False  # torch.compile the TTT unroll step and the step loss (same arithmetic, fused kernels)
    attention: str = "auto"  # SDPA kernel: auto (torch picks; cuDNN off on CUDA) | cudnn | efficient | flash | math

    def __post_init__(self):
        if self.fc_norm == "auto":  # the best recipe's norm where there is an fc to norm
            self.fc_norm = "per_layer" if self.arch == "eagle3" else "none"

    @classmethod
    def from_dict(cls, d: dict) -> "TrainConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown training settings {sorted(unknown)}; known: {sorted(names)}")
        return cls(**d)

    @classmethod
    def from_text(cls, pairs) -> dict:
        """(name, text) pairs, as `--set NAME VALUE` gives them, as settings of each field's type."""
        kinds = {f.name: type(f.default) for f in dataclasses.fields(cls)}  # a list field: MISSING's type
        out = {}
        for name, text in pairs:
            if name not in kinds:
                raise ValueError(f"unknown training setting {name!r}; known: {sorted(kinds)}")
            kind = kinds[name]
            out[name] = parse_bool(text) if kind is bool else kind(text) if kind in (int, float, str) else text
        return out

    def token_cache_dir(self) -> Path:
        """Where the tokenised train and val files are cached (one cache entry per file and settings)."""
        return Path(self.token_cache) if self.token_cache else Path(self.out_dir).parent / "tokens"


def parse_bool(text: str) -> bool:
    return str(text).lower() in ("1", "true", "yes")


FIELD_LINE = re.compile(r"^    (\w+): [^=]+=")


@cache
def field_comments() -> dict[str, str]:
    """{field: the comment on its line} of TrainConfig, read from this module's source: `draftlab train`'s
    help text, kept in one place with each default."""
    source = Path(__file__).read_text()
    names = {i: m.group(1) for i, line in enumerate(source.splitlines(), 1) if (m := FIELD_LINE.match(line))}
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT and tok.start[0] in names:
            out[names[tok.start[0]]] = tok.string.lstrip("# ").strip()
    return out
