"""safetensors files written from parts, without joining the parts in memory first.

The hidden-state stores hold a tensor as many row blocks: a shard's conversations ([n_i, W] each), or
the requests of one SGLang batch (row ranges of one host copy). `safetensors.torch.save_file` needs
each tensor whole (a torch.cat: one copy) and then turns it into Python bytes (a second copy, with
the GIL held). Here each part's own memory goes to `write`, which copies it once into the page cache
with the GIL released, so a capture's writer thread does not stall the threads beside it. The file
is an ordinary safetensors file: a little-endian u64 header length, a JSON header padded to 8 bytes,
then the tensors' bytes back to back in header order.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

DTYPE_NAMES = {
    torch.bfloat16: "BF16",
    torch.float16: "F16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.uint8: "U8",
}


def _layout(name: str, parts: list[torch.Tensor]) -> tuple[torch.dtype, list[int], int]:
    """(dtype, shape of the parts joined along dim 0, bytes) of one named tensor's parts."""
    if not parts:
        raise ValueError(f"{name}: no parts to write")
    dtype, rest = parts[0].dtype, tuple(parts[0].shape[1:])
    for p in parts:
        if p.dtype != dtype or tuple(p.shape[1:]) != rest or p.device.type != "cpu":
            raise ValueError(
                f"{name}: parts differ ({p.dtype}, {tuple(p.shape)} on {p.device} after {dtype}, [n, *{rest}] on cpu)"
            )
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"{name}: {dtype} has no safetensors name here")
    rows = sum(int(p.shape[0]) for p in parts)
    return dtype, [rows, *rest], sum(p.numel() for p in parts) * parts[0].element_size()


def _buffer(t: torch.Tensor):
    """The tensor's bytes as a buffer over its own memory (a copy only when it is not contiguous)."""
    flat = t.detach().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy() if flat.numel() else b""


def write_parts(path, tensors: dict) -> Path:
    """Write {name: tensor or list of parts [n_i, *rest]} to `path` as one safetensors file whose tensor
    `name` is the parts joined along dim 0 (same dtype and trailing shape, on the CPU)."""
    groups = {name: list(v) if isinstance(v, (list, tuple)) else [v] for name, v in tensors.items()}
    header, offset = {}, 0
    for name, parts in groups.items():
        dtype, shape, nbytes = _layout(name, parts)
        header[name] = {"dtype": DTYPE_NAMES[dtype], "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as safetensors' own writer does
    path = Path(path)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for parts in groups.values():
            for part in parts:
                f.write(_buffer(part))
    return path
