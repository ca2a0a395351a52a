"""Export round trip and validator: every contract name, shape and dtype (docs/eagle3-contract.md)."""

import json

import pytest
import torch
from transformers import LlamaConfig

from draftlab.model.draft import Eagle3Draft, draft_config_for_target, load_draft
from draftlab.model.export import export_draft, read_safetensors_header, validate
from draftlab.model.target import read_config

# The contract's table for the embedded target (SmolLM2-135M-Instruct: H=576, 9/3 heads of 64, V=49152).
H, V, VD, I = 576, 49152, 32000, 1536
EMBEDDED_EXPECTED = {
    "fc.weight": ([576, 1728], "BF16"),
    "midlayer.self_attn.q_proj.weight": ([576, 1152], "BF16"),
    "midlayer.self_attn.k_proj.weight": ([192, 1152], "BF16"),
    "midlayer.self_attn.v_proj.weight": ([192, 1152], "BF16"),
    "midlayer.self_attn.o_proj.weight": ([576, 576], "BF16"),
    "midlayer.mlp.gate_proj.weight": ([I, 576], "BF16"),
    "midlayer.mlp.up_proj.weight": ([I, 576], "BF16"),
    "midlayer.mlp.down_proj.weight": ([576, I], "BF16"),
    "midlayer.hidden_norm.weight": ([576], "BF16"),
    "midlayer.input_layernorm.weight": ([576], "BF16"),
    "midlayer.post_attention_layernorm.weight": ([576], "BF16"),
    "norm.weight": ([576], "BF16"),
    "lm_head.weight": ([VD, 576], "BF16"),
    "d2t": ([VD], "I64"),
    "t2d": ([V], "BOOL"),
}


@pytest.fixture(scope="module")
def embedded_config():
    return LlamaConfig(**{k: v for k, v in read_config("embedded").items() if not k.startswith("_")})


@pytest.fixture(scope="module")
def embedded_export(tmp_path_factory, embedded_config):
    """An EAGLE-3 draft for the embedded target's dimensions (the target's weights are not loaded)."""
    torch.manual_seed(0)
    cfg = draft_config_for_target(embedded_config, draft_vocab_size=VD)
    draft = Eagle3Draft(cfg, torch.nn.Embedding(V, H))
    ids = torch.randperm(V)[:VD].sort().values
    draft.set_vocab(ids)
    out = tmp_path_factory.mktemp("export") / "eagle3"
    export_draft(draft, out, max_position_embeddings=embedded_config.max_position_embeddings)
    return out, draft, ids


def test_embedded_export_matches_contract(embedded_export, embedded_config):
    out, _, _ = embedded_export
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors", "provenance.json"]
    record = json.loads((out / "provenance.json").read_text())  # how to make this draft again
    assert record["commit"] and record["command"] and {"torch", "safetensors", "python"} <= set(record["versions"])
    header = read_safetensors_header(out / "model.safetensors")
    got = {n: (v["shape"], v["dtype"]) for n, v in header.items() if n != "__metadata__"}
    assert got == EMBEDDED_EXPECTED  # every name, shape and dtype; nothing else (no embedding, no prefix)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"]
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 1
    assert (cfg["hidden_size"], cfg["vocab_size"], cfg["draft_vocab_size"]) == (H, V, VD)
    assert (cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]) == (9, 3, 64)
    assert cfg["intermediate_size"] == I and cfg["rms_norm_eps"] == pytest.approx(1e-5)
    assert cfg["rope_theta"] == 100000.0 and "rope_scaling" in cfg and cfg["rope_parameters"]["rope_theta"] == 1e5
    assert cfg["max_position_embeddings"] >= 8192
    assert cfg["tie_word_embeddings"] is False
    # SGLang adds 1 to config ids: hidden_states [2, 15, 27] are written as [1, 14, 26].
    assert cfg["eagle_config"] == {"eagle_aux_hidden_state_layer_ids": [1, 14, 26], "use_aux_hidden_state": True}
    assert cfg["draftlab"] == {"capture_layers": [2, 15, 27]}
    assert validate(out, embedded_config) == []


def test_export_round_trip_values(embedded_export):
    from safetensors.torch import load_file

    out, draft, ids = embedded_export
    w = load_file(str(out / "model.safetensors"))
    assert torch.equal(w["d2t"] + torch.arange(VD), ids)
    assert w["t2d"].sum() == VD and bool(w["t2d"][ids].all())
    assert torch.equal(w["fc.weight"], draft.fc.weight.detach().to(torch.bfloat16))


def _corrupt(src, dst, config_edit=None, tensors_edit=None):
    from safetensors.torch import load_file, save_file

    dst.mkdir()
    cfg = json.loads((src / "config.json").read_text())
    w = load_file(str(src / "model.safetensors"))
    if config_edit:
        config_edit(cfg)
    if tensors_edit:
        tensors_edit(w)
    (dst / "config.json").write_text(json.dumps(cfg))
    save_file(w, str(dst / "model.safetensors"))
    return dst


@pytest.mark.parametrize(
    "name, config_edit, tensors_edit, expect",
    [
        ("no_eagle_config", lambda c: c.pop("eagle_config"), None, "eagle_config missing"),
        ("tied", lambda c: c.update(tie_word_embeddings=True), None, "tie_word_embeddings"),
        ("no_rope_theta", lambda c: c.pop("rope_theta"), None, "rope_theta"),
        ("short_context", lambda c: c.update(max_position_embeddings=2048), None, "max_position_embeddings 2048"),
        (
            "bad_layers",
            lambda c: c["eagle_config"].update(eagle_aux_hidden_state_layer_ids=[2, 15, 30]),
            None,
            "outside",
        ),
        ("arch", lambda c: c.update(architectures=["LlamaForCausalLM"]), None, "architectures"),
        ("prefix", None, lambda w: w.update({"draft_model.fc.weight": w.pop("fc.weight")}), "prefixed"),
        (
            "embed",
            None,
            lambda w: w.update({"embed_tokens.weight": torch.zeros(V, H, dtype=torch.bfloat16)}),
            "embedding",
        ),
        (
            "fc_shape",
            None,
            lambda w: w.update({"fc.weight": torch.zeros(H, H, dtype=torch.bfloat16)}),
            "fc.weight shape",
        ),
        ("d2t_dtype", None, lambda w: w.update({"d2t": w["d2t"].to(torch.int32)}), "d2t dtype"),
        ("bias", None, lambda w: w.update({"norm.bias": torch.zeros(H)}), "bias"),
    ],
)
def test_validator_reports_each_deviation(
    tmp_path, embedded_export, embedded_config, name, config_edit, tensors_edit, expect
):
    bad = _corrupt(embedded_export[0], tmp_path / name, config_edit, tensors_edit)
    problems = validate(bad, embedded_config)
    assert any(expect in p for p in problems), problems


def test_validator_reports_several_deviations_and_missing_files(tmp_path, embedded_export, embedded_config):
    def both(c):
        c.pop("eagle_config")
        c["tie_word_embeddings"] = True

    bad = _corrupt(embedded_export[0], tmp_path / "two", both, lambda w: w.pop("lm_head.weight"))
    problems = validate(bad, embedded_config)
    assert len(problems) >= 3, problems
    (tmp_path / "empty").mkdir()
    assert any("config.json: missing" in p for p in validate(tmp_path / "empty"))


def test_eagle1_variant_exports_without_fc(tmp_path):
    cfg = draft_config_for_target(
        LlamaConfig(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=8,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
        ),
        draft_vocab_size=100,
        use_aux=False,
    )
    draft = Eagle3Draft(cfg, torch.nn.Embedding(1000, 64))
    assert not hasattr(draft, "fc")
    export_draft(draft, tmp_path / "e1")
    assert validate(tmp_path / "e1", allow_eagle1=True) == []
    assert any("EAGLE-1" in p for p in validate(tmp_path / "e1"))


def test_load_draft_round_trip_tiny(tmp_path, tiny_target):
    """Exported weights load back (fp32 export) and give identical logits."""
    torch.manual_seed(0)
    cfg = draft_config_for_target(tiny_target.config, draft_vocab_size=256)
    draft = Eagle3Draft(cfg, tiny_target.model.get_input_embeddings())
    draft.set_vocab(torch.arange(0, 512, 2))
    export_draft(draft, tmp_path / "d", max_position_embeddings=tiny_target.max_position_embeddings, dtype="float32")
    assert validate(tmp_path / "d", tiny_target) == []
    back = load_draft(tmp_path / "d", tiny_target)
    ids = torch.randint(0, 500, (1, 6))
    h = torch.randn(1, 6, 64)
    pos = torch.arange(6)[None]
    with torch.no_grad():
        a = draft(ids, h, pos)[0]
        b = back(ids, h, pos)[0]
    assert torch.allclose(a, b)
    assert torch.equal(back.to_target_ids(torch.tensor([0, 1, 255])), torch.tensor([0, 2, 510]))


def test_cli_validate_only(embedded_export, capsys):
    from draftlab.cli import main

    assert main(["export", "-", str(embedded_export[0]), "--validate-only"]) == 0
    assert "conforms" in capsys.readouterr().out
