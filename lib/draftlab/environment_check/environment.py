"""Facts about this machine and a target, for notebook 00 and bug reports."""

from __future__ import annotations

import importlib.metadata
import platform

from draftlab.model.target import load_target

LIBRARIES = (
    "draftlab",
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "safetensors",
    "huggingface_hub",
    "tokenizers",
    "papermill",
    "jupytext",
    "pandas",
    "matplotlib",
    "openai",
    "httpx",
    "datasketch",
)


def library_versions() -> dict:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def device_info(device: str) -> dict:
    import torch

    info = {"device": device, "cpu_threads": torch.get_num_threads(), "cuda_available": torch.cuda.is_available()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(0)
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    return info


def target_shape(spec: str, device: str) -> dict:
    """Layer count, widths and capture layers; loads the target once to prove it runs."""
    import time

    import torch

    start = time.perf_counter()
    target = load_target(spec, device=device)
    load_s = time.perf_counter() - start
    text = target.render([{"role": "user", "content": "Say hello."}], add_generation_prompt=True)
    ids = target.tokenizer(text, return_tensors="pt").to(target.device)
    with torch.no_grad():
        out = target.model(**ids, output_hidden_states=True)
    layers = target.capture_layers
    h = target.hidden_size
    return {
        "target": target.name,
        "path": str(target.path),
        "dtype": str(target.dtype).replace("torch.", ""),
        "num_hidden_layers": target.num_layers,
        "hidden_size": h,
        "vocab_size": target.vocab_size,
        "max_position_embeddings": target.max_position_embeddings,
        "hidden_states_returned": len(out.hidden_states),  # N + 1: embeddings, then each layer's output
        "capture_layers": layers,
        "eagle3_input_width": 3 * h,
        "fc_weight_shape": [h, 3 * h],
        "eos_token_ids": target.eos_token_ids,
        "pad_token": target.tokenizer.pad_token,
        "load_seconds": round(load_s, 2),
    }


def show(info: dict) -> None:
    width = max(map(len, info))
    for key, value in info.items():
        print(f"{key:<{width}}  {value}")


def plot_capture_layers(shape: dict):
    """One bar per decoder layer; the three whose inputs EAGLE-3 captures are highlighted."""
    import matplotlib.pyplot as plt

    n = shape["num_hidden_layers"]
    captured = set(shape["capture_layers"])
    fig, ax = plt.subplots(figsize=(8, 1.8))
    colors = ["tab:orange" if i in captured else "lightgray" for i in range(n)]
    ax.bar(range(n), [1] * n, color=colors, edgecolor="white")
    for i in sorted(captured):
        ax.text(i, 1.05, f"{i}", ha="center", fontsize=9)
    ax.set_yticks([])
    ax.set_ylim(0, 1.3)
    ax.set_xlabel("decoder layer i (orange: its input, hidden_states[i], is captured)")
    ax.set_title(f"{shape['target']}: {n} layers × {shape['hidden_size']} → draft input {shape['eagle3_input_width']}")
    return fig
