"""A contract-shaped EAGLE-3 draft for any target config, written without weights.

The doctor reads config.json and safetensors headers only (plus the small d2t/t2d tensors), so a
DeepSeek-V3-sized draft (fc [7168, 21504]) can be tested without 600 MB of weights: every large
tensor is declared in the header and left as a hole in a sparse file; d2t and t2d are real.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from types import SimpleNamespace

import torch

from draftlab.model.capture import is_deepseek
from draftlab.model.contract import expected_tensors
from draftlab.model.draft import draft_config_for_target
from draftlab.model.export import export_config

DTYPES = {"BF16": 2, "I64": 8, "BOOL": 1}


def shaped_draft(folder, target_dir, draft_vocab_size: int = 32000) -> Path:
    """`folder` with config.json (what draftlab's export writes for this target) and a sparse model.safetensors."""
    from transformers import AutoConfig

    target_dir = Path(target_dir)
    tconf = AutoConfig.from_pretrained(target_dir)
    raw = json.loads((target_dir / "config.json").read_text())
    cfg = draft_config_for_target(tconf, draft_vocab_size=draft_vocab_size)
    if is_deepseek(raw.get("model_type"), raw.get("architectures")):
        cfg.capture_convention = "deepseek"  # what train does for a DeepSeek-family target
    layers = cfg.eagle_config["eagle_aux_hidden_state_layer_ids"]  # hidden_states indices, as the draft holds them
    draft = SimpleNamespace(config=cfg, capture_layers=layers, use_aux=True, fc_norms=())
    config = export_config(draft, raw.get("max_position_embeddings"))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    vocab = int(raw["vocab_size"])
    small = {"d2t": torch.zeros(draft_vocab_size, dtype=torch.int64), "t2d": torch.arange(vocab) < draft_vocab_size}
    shapes = expected_tensors(config, int(raw["hidden_size"]), True)
    header, offset = {}, 0
    for name, shape in shapes.items():
        dtype = {"d2t": "I64", "t2d": "BOOL"}.get(name, "BF16")
        size = DTYPES[dtype] * int(torch.tensor(shape).prod())
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + size]}
        offset += size
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    with open(folder / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(blob)) + blob)
        start = fh.tell()
        for name, tensor in small.items():
            fh.seek(start + header[name]["data_offsets"][0])
            fh.write(tensor.numpy().tobytes())
        fh.truncate(start + offset)  # the rest stays a hole: zeros on read, no disk
    return folder
