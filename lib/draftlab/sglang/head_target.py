"""A target for training from SGLang-captured states: config, tokenizer and three tensors, no decoder.

Training needs of the target only what surrounds the draft: its config (shape, rope, capture ids),
its tokenizer and chat template, the token embedding the draft shares, and the head that turns the
stored final state into the target's next-token distribution. They are read from the target's
safetensors by name, so a target that only SGLang can run (TP-sized, MoE) trains on one GPU.
SGLang's stored final state is already normed, so this target's final norm passes its input
through; it keeps the norm's weight for `init_from_target`.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from draftlab.core.errors import InputError
from draftlab.model.target import EMBEDDED_NAME, Target, load_tokenizer, resolve_device, resolve_path

EMBED_NAMES = ("model.embed_tokens.weight", "model.language_model.embed_tokens.weight", "embed_tokens.weight")
HEAD_NAMES = ("lm_head.weight", "model.lm_head.weight", "language_model.lm_head.weight")
NORM_NAMES = (
    "model.norm.weight",
    "model.language_model.norm.weight",
    "language_model.model.norm.weight",
    "norm.weight",
)


class AppliedNorm(nn.Module):
    """The target's final norm, already applied to the states SGLang stored: identity, weight kept."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)

    def forward(self, x):
        return x


class HeadModel(nn.Module):
    """What `model.hidden` and training call on a target's model: embeddings, head, final norm, config."""

    def __init__(self, config, embed: torch.Tensor, head: torch.Tensor, norm: torch.Tensor):
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding.from_pretrained(embed, freeze=True)
        self.lm_head = nn.Linear(head.shape[1], head.shape[0], bias=False, device="meta")  # no random init
        self.lm_head.weight = nn.Parameter(head, requires_grad=False)
        self.norm = AppliedNorm(norm)

    @property
    def base_model(self):
        return self

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def get_input_embeddings(self):
        return self.embed_tokens

    def get_output_embeddings(self):
        return self.lm_head


def weight_files(folder: Path) -> dict[str, Path]:
    """tensor name -> safetensors file of a model folder (its index, or every file's header)."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        return {name: folder / file for name, file in json.loads(index.read_text())["weight_map"].items()}
    where = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as f:
            where.update({name: path for name in f.keys()})
    return where


def read_tensor(where: dict, names, folder: Path, what: str, required: bool = True):
    """The first of `names` that the folder holds (one tensor read, not the file)."""
    from safetensors import safe_open

    for name in names:
        if name in where:
            with safe_open(str(where[name]), framework="pt") as f:
                return f.get_tensor(name)
    if required:
        raise InputError(f"--target {folder}: no {what} tensor (looked for {', '.join(names)})")
    return None


def load_head_target(spec: str, device: str = "auto", dtype=None) -> Target:
    """The target of `spec` with HeadModel in place of the decoder (`load_target`'s signature)."""
    from transformers import AutoConfig

    path = resolve_path(spec)
    device = resolve_device(device)
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    config = AutoConfig.from_pretrained(path)
    where = weight_files(path)
    embed = read_tensor(where, EMBED_NAMES, path, "token embedding")
    head = read_tensor(where, HEAD_NAMES, path, "lm_head", required=False)
    if head is None:
        if not getattr(config, "tie_word_embeddings", False):
            raise InputError(f"--target {path}: no lm_head tensor and the embeddings are not tied")
        head = embed
    norm = read_tensor(where, NORM_NAMES, path, "final norm")
    model = HeadModel(config, embed.to(dtype), head.to(dtype), norm.to(dtype)).to(device).eval()
    name = EMBEDDED_NAME if spec == "embedded" else ("tiny" if spec == "tiny" else spec)
    tokenizer = load_tokenizer(str(path))
    return Target(name=name, path=path, model=model, tokenizer=tokenizer, device=device, dtype=dtype)
