"""EAGLE 3.1's norms before fc as SGLang 0.5.17 reads them (srt/models/llama_eagle3.py): the draft
option, export and load, the contract's table, the doctor's check, the training option.

The literal names and keys below are SGLang's: `fc_norm` (legacy `use_aux_norm`) at the top level
gives fc_norm.{0,1,2}.weight [T]; `norm_before_fc` (eagle_config first, else top level) gives
input_norm.weight [3T]; both use rms_norm_eps; input_norm runs first; neither has a prefix.
"""

import hashlib
import json

import pytest
import torch
from transformers import LlamaConfig

from draftlab.flag_diagnosis.cases import edit_config, edit_tensors, good_draft
from draftlab.flag_diagnosis.doctor import diagnose
from draftlab.model.contract import expected_tensors, fc_norms
from draftlab.model.draft import Eagle3Draft, draft_config_for_target, load_draft
from draftlab.model.export import export_config, export_draft, validate

SMALL = dict(
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    max_position_embeddings=256,
)
# The default draft (seed 0) as the code before the option built it: sha256 of its state dict and
# its logits on a fixed input (recorded at the branch point, commit 63ab3a5).
DEFAULT_STATE_SHA = "313277015f0013cf165dc79fdc76502897ffdbc1d2885779576dea8db9480765"
DEFAULT_LOGITS = (
    0.07400224753655493,
    64.59076229459606,
    [-0.036209799349308014, 0.17963023483753204, -0.22101184725761414, -0.002955243457108736],
)


def small_draft(fc_norm="none", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = draft_config_for_target(LlamaConfig(**SMALL), draft_vocab_size=100, fc_norm=fc_norm, **kw)
    return Eagle3Draft(cfg, torch.nn.Embedding(1000, 64)).eval()


def scramble_norms(draft, seed=1):
    """Norm weights other than 1 (as after training), so that a norm that is skipped or swapped shows."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in draft.named_parameters():
            if name.startswith(("fc_norm.", "input_norm.")):
                p.copy_(0.5 + torch.rand(p.shape, generator=g))
    return draft


def rms(x, w, eps):
    """RMSNorm written out (SGLang's forward_native): x / sqrt(mean(x^2) + eps) * w."""
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def state_sha(draft) -> str:
    h = hashlib.sha256()
    for n, t in sorted(draft.state_dict().items()):
        h.update(n.encode())
        h.update(str(t.dtype).encode())
        h.update(str(list(t.shape)).encode())
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def fixed_input(seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 5, 192, generator=g), torch.randint(0, 1000, (1, 5), generator=g)


# ---- the default changes nothing -------------------------------------------------------------
def test_default_none_is_the_draft_from_before_the_option():
    draft = small_draft()
    assert draft.fc_norms == () and draft.fc_norm is None and draft.input_norm is None
    assert state_sha(draft) == DEFAULT_STATE_SHA  # same names, shapes, dtypes and initial values
    aux, ids = fixed_input()
    with torch.no_grad():
        logits = draft(ids, draft.project(aux), torch.arange(5))[0]
    total, absolute, first = DEFAULT_LOGITS
    assert logits.double().sum().item() == pytest.approx(total, abs=1e-4)
    assert logits.double().abs().sum().item() == pytest.approx(absolute, rel=1e-5)
    torch.testing.assert_close(logits[0, 0, :4], torch.tensor(first), rtol=1e-5, atol=1e-6)
    config = export_config(draft)
    assert not {"fc_norm", "use_aux_norm", "norm_before_fc"} & set(config)
    assert sorted(config["eagle_config"]) == ["eagle_aux_hidden_state_layer_ids", "use_aux_hidden_state"]


# ---- where SGLang reads the keys -------------------------------------------------------------
@pytest.mark.parametrize(
    "config,want",
    [
        ({}, ()),
        ({"fc_norm": True}, ("per_layer",)),
        ({"use_aux_norm": True}, ("per_layer",)),  # legacy key
        ({"fc_norm": False, "use_aux_norm": True}, ("per_layer",)),  # `fc_norm or use_aux_norm`
        ({"eagle_config": {"fc_norm": True}}, ()),  # fc_norm is read at the top level only
        ({"eagle_config": {"norm_before_fc": True}}, ("concat",)),
        ({"norm_before_fc": True}, ("concat",)),  # top level when eagle_config lacks it
        ({"norm_before_fc": True, "eagle_config": {"norm_before_fc": False}}, ()),  # eagle_config first
        ({"fc_norm": True, "eagle_config": {"norm_before_fc": True}}, ("concat", "per_layer")),  # SGLang's order
    ],
)
def test_fc_norms_reads_the_keys_as_sglang_does(config, want):
    assert fc_norms(config) == want
    assert (
        fc_norms(
            LlamaConfig(
                **{k: v for k, v in config.items() if k != "eagle_config"}, eagle_config=config.get("eagle_config")
            )
        )
        == want
    )


def test_contract_table_gains_the_norms_keyed_on_the_config():
    base = dict(
        hidden_size=64,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=128,
        vocab_size=1000,
        draft_vocab_size=100,
    )
    plain = expected_tensors(base)
    assert expected_tensors({**base, "fc_norm": True}) == {
        **plain,
        "fc_norm.0.weight": (64,),
        "fc_norm.1.weight": (64,),
        "fc_norm.2.weight": (64,),
    }
    assert expected_tensors({**base, "eagle_config": {"norm_before_fc": True}}) == {
        **plain,
        "input_norm.weight": (192,),
    }
    assert expected_tensors({**base, "fc_norm": True}, target_hidden=32)["fc_norm.0.weight"] == (32,)  # over T
    assert "fc_norm.0.weight" not in expected_tensors({**base, "fc_norm": True}, uses_aux=False)  # no fc, no norm


# ---- the forward: where SGLang applies them ---------------------------------------------------
@pytest.mark.parametrize("fc_norm", ["per_layer", "concat"])
def test_project_applies_the_norm_where_sglang_does(fc_norm):
    draft = scramble_norms(small_draft(fc_norm))
    eps = draft.config.rms_norm_eps
    aux, _ = fixed_input()
    if fc_norm == "concat":
        want = rms(aux, draft.input_norm.weight, eps)
    else:  # fc_norm.0 on the low state, .1 on the mid, .2 on the high
        want = torch.cat([rms(c, n.weight, eps) for n, c in zip(draft.fc_norm, aux.split(64, dim=-1))], dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(draft.project(aux), draft.fc(want), rtol=1e-5, atol=1e-6)
        assert not torch.allclose(draft.project(aux), draft.fc(aux), atol=1e-3)


def test_both_norms_run_in_sglangs_order():
    """A foreign config with both keys: input_norm over the whole width first, then the per-chunk norms."""
    cfg = draft_config_for_target(LlamaConfig(**SMALL), draft_vocab_size=100, fc_norm="per_layer")
    cfg.eagle_config["norm_before_fc"] = True
    draft = scramble_norms(Eagle3Draft(cfg, torch.nn.Embedding(1000, 64)))
    assert draft.fc_norms == ("concat", "per_layer")
    eps, (aux, _) = cfg.rms_norm_eps, fixed_input()
    x = rms(aux, draft.input_norm.weight, eps)
    x = torch.cat([rms(c, n.weight, eps) for n, c in zip(draft.fc_norm, x.split(64, dim=-1))], dim=-1)
    with torch.no_grad():
        torch.testing.assert_close(draft.project(aux), draft.fc(x), rtol=1e-5, atol=1e-6)


def test_option_refuses_unknown_values_and_eagle1():
    with pytest.raises(ValueError, match="expected one of none, per_layer, concat"):
        small_draft("both")
    with pytest.raises(ValueError, match="EAGLE-1"):
        small_draft("per_layer", use_aux=False)


def test_engine_feeds_the_normed_projection_in_eagle3_and_nothing_in_eagle(tiny_target):
    from draftlab import engine as sd

    torch.manual_seed(0)
    cfg = draft_config_for_target(tiny_target.model.config, draft_vocab_size=64, fc_norm="per_layer")
    draft = scramble_norms(Eagle3Draft(cfg, tiny_target.model.get_input_embeddings()).eval())
    feats = torch.randn(1, 4, 3 * tiny_target.hidden_size)
    with torch.no_grad():
        for mode, want in (("EAGLE3", draft.project(feats)), ("EAGLE", feats[..., : tiny_target.hidden_size])):
            runner = sd.DraftRunner(draft, tiny_target, sd.SpecConfig(mode=mode), max_len=32)
            x = feats if mode == "EAGLE3" else feats[..., : tiny_target.hidden_size]
            torch.testing.assert_close(runner.hidden_in(x), want)


# ---- export and load ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "fc_norm,top,eagle,names",
    [
        (
            "per_layer",
            {"fc_norm": True},
            {},
            {"fc_norm.0.weight": [64], "fc_norm.1.weight": [64], "fc_norm.2.weight": [64]},
        ),
        ("concat", {}, {"norm_before_fc": True}, {"input_norm.weight": [192]}),
    ],
)
def test_export_writes_sglangs_keys_and_names_and_loads_back(tmp_path, tiny_target, fc_norm, top, eagle, names):
    torch.manual_seed(0)
    cfg = draft_config_for_target(tiny_target.config, draft_vocab_size=256, fc_norm=fc_norm)
    draft = scramble_norms(Eagle3Draft(cfg, tiny_target.model.get_input_embeddings()).eval())
    draft.set_vocab(torch.arange(0, 512, 2))
    out = export_draft(
        draft, tmp_path / "d", max_position_embeddings=tiny_target.max_position_embeddings, dtype="float32"
    )
    config = json.loads((out / "config.json").read_text())
    for key in ("fc_norm", "use_aux_norm", "norm_before_fc"):
        assert config.get(key) == top.get(key)  # top level: fc_norm only
    assert {k: v for k, v in config["eagle_config"].items() if k == "norm_before_fc"} == eagle
    from draftlab.model.export import read_safetensors_header

    header = read_safetensors_header(out / "model.safetensors")
    got = {n: v["shape"] for n, v in header.items() if "norm" in n and not n.startswith(("midlayer.", "norm."))}
    assert got == names  # top-level names, no midlayer. / model. prefix
    assert validate(out, tiny_target) == []
    back = load_draft(out, tiny_target)
    assert back.fc_norms == (fc_norm,)
    aux, ids = torch.randn(1, 6, 192), torch.randint(0, 500, (1, 6))
    with torch.no_grad():
        a = draft(ids, draft.project(aux), torch.arange(6)[None])[0]
        b = back(ids, back.project(aux), torch.arange(6)[None])[0]
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert diagnose(str(out), "tiny")["errors"] == 0


def test_legacy_names_and_key_load_as_sglang_renames_them(tmp_path, tiny_target):
    torch.manual_seed(0)
    cfg = draft_config_for_target(tiny_target.config, draft_vocab_size=256, fc_norm="per_layer")
    draft = scramble_norms(Eagle3Draft(cfg, tiny_target.model.get_input_embeddings()).eval())
    out = export_draft(
        draft, tmp_path / "d", dtype="float32", max_position_embeddings=tiny_target.max_position_embeddings
    )
    edit_config(out, lambda c: (c.pop("fc_norm"), c.update(use_aux_norm=True)))
    legacy = dict(
        zip(
            ("fc_norm.0.weight", "fc_norm.1.weight", "fc_norm.2.weight"),
            ("aux_norm_low.weight", "aux_norm_mid.weight", "aux_norm_high.weight"),
        )
    )
    edit_tensors(out, lambda t: [t.__setitem__(legacy[k], t.pop(k)) for k in list(t) if k in legacy])
    back = load_draft(out, tiny_target)
    assert back.fc_norms == ("per_layer",)
    for i, norm in enumerate(back.fc_norm):
        assert torch.equal(norm.weight, draft.fc_norm[i].weight)
    result = diagnose(str(out), "tiny")
    assert [(f.check, f.severity) for f in result["findings"] if f.severity != "ok"] == []
    re_export = export_config(back)  # rewritten in the canonical key
    assert re_export.get("fc_norm") is True and "use_aux_norm" not in re_export


def test_validator_reports_norm_keys_and_tensors_that_disagree(tmp_path, tiny_target):
    good = good_draft(tmp_path / "good", "tiny", draft_vocab_size=256)
    key_only = good_draft(tmp_path / "k", "tiny", draft_vocab_size=256)
    edit_config(key_only, lambda c: c.update(fc_norm=True))
    assert any("fc_norm.0.weight missing" in p and "weight 1" in p for p in validate(key_only, tiny_target))
    edit_tensors(good, lambda t: t.update({"input_norm.weight": torch.ones(192)}))
    assert any("input_norm.weight" in p and "skips it silently" in p for p in validate(good, tiny_target))
    typed = good_draft(tmp_path / "t", "tiny", draft_vocab_size=256)
    edit_config(typed, lambda c: c.update(fc_norm="false"))  # Python reads "false" as true
    assert any("'fc_norm'" in p and "a JSON string" in p for p in validate(typed, tiny_target))


# ---- doctor -------------------------------------------------------------------------------------
def fc_norm_findings(folder):
    return [(f.severity, f.what, f.fix) for f in diagnose(str(folder), "tiny")["findings"] if f.check == "fc_norm"]


@pytest.mark.parametrize(
    "name,config_fn,tensor_fn,what,fix",
    [
        (
            "per_layer_key_only",
            lambda c: c.update(fc_norm=True),
            None,
            "sets fc_norm but model.safetensors lacks fc_norm.0.weight, fc_norm.1.weight, fc_norm.2.weight",
            "remove fc_norm",
        ),
        ("legacy_key_only", lambda c: c.update(use_aux_norm=True), None, "lacks fc_norm.0.weight", "export"),
        (
            "concat_key_only",
            lambda c: c["eagle_config"].update(norm_before_fc=True),
            None,
            "sets norm_before_fc but model.safetensors lacks input_norm.weight",
            "remove norm_before_fc",
        ),
        (
            "one_of_three",
            lambda c: c.update(fc_norm=True),
            lambda t: t.update({"fc_norm.0.weight": torch.ones(64)}),
            "lacks fc_norm.1.weight, fc_norm.2.weight",
            "export",
        ),
        (
            "per_layer_tensors_only",
            None,
            lambda t: t.update({f"fc_norm.{i}.weight": torch.ones(64) for i in range(3)}),
            "has fc_norm.0.weight, fc_norm.1.weight, fc_norm.2.weight but config.json does not set fc_norm",
            'set "fc_norm": true in config.json',
        ),
        (
            "concat_tensor_only",
            None,
            lambda t: t.update({"input_norm.weight": torch.ones(192)}),
            "has input_norm.weight but config.json does not set norm_before_fc",
            '"norm_before_fc": true',
        ),
        (
            "key_nested",
            lambda c: c["eagle_config"].update(fc_norm=True),
            lambda t: t.update({f"fc_norm.{i}.weight": torch.ones(64) for i in range(3)}),
            "eagle_config.fc_norm is not read",
            'set "fc_norm": true in config.json',
        ),
    ],
)
def test_doctor_flags_each_mismatch_in_one_line_with_its_fix(tmp_path, name, config_fn, tensor_fn, what, fix):
    folder = good_draft(tmp_path / name, "tiny", draft_vocab_size=256)
    if config_fn:
        edit_config(folder, config_fn)
    if tensor_fn:
        edit_tensors(folder, tensor_fn)
    found = fc_norm_findings(folder)
    assert len(found) == 1, found
    severity, got_what, got_fix = found[0]
    assert severity == "error" and what in got_what and fix in got_fix and "\n" not in got_what
    others = [
        f
        for f in diagnose(str(folder), "tiny")["findings"]
        if f.severity != "ok" and f.check in ("missing_tensors", "unknown_tensors")
    ]
    assert others == []  # reported once, by the fc_norm check


def test_doctor_passes_matching_keys_and_tensors_and_checks_their_shapes(tmp_path):
    plain = good_draft(tmp_path / "plain", "tiny", draft_vocab_size=256)
    assert fc_norm_findings(plain) == [("ok", "no norm before fc (fc_norm, norm_before_fc unset; no such tensors)", "")]
    edit_config(plain, lambda c: c.update(fc_norm=True))
    edit_tensors(plain, lambda t: t.update({f"fc_norm.{i}.weight": torch.ones(64) for i in range(3)}))
    assert [s for s, _, _ in fc_norm_findings(plain)] == ["ok"]
    assert diagnose(str(plain), "tiny")["errors"] == 0
    edit_tensors(plain, lambda t: t.update({"fc_norm.1.weight": torch.ones(192)}))
    shapes = [f for f in diagnose(str(plain), "tiny")["findings"] if f.check == "tensor_shapes"]
    assert shapes[0].severity == "error" and "fc_norm.1.weight is [192], config implies [64]" in shapes[0].what


# ---- training ------------------------------------------------------------------------------------
def test_train_option_help_and_choices():
    from draftlab import cli

    train = cli.build_parser(["train"])._subparsers._group_actions[0].choices["train"]
    action = next(a for a in train._actions if "--fc-norm" in a.option_strings)
    assert action.choices == ["none", "per_layer", "concat", "auto"] and action.default == "auto"  # the recipe's
    assert "RMSNorm before fc" in action.help
    with pytest.raises(SystemExit):
        train.parse_args(["--fc-norm", "both"])


def test_train_settings_refuse_eagle1_norm_and_old_checkpoints_resume(tmp_path):
    from dataclasses import asdict

    from draftlab.train_draft import TrainConfig
    from draftlab.train_draft.checkpoint import check_same_recipe
    from draftlab.train_draft.loop import TrainingRun
    from draftlab.train_draft.stage import train_configs

    data = tmp_path / "train.jsonl"
    data.write_text("")
    with pytest.raises(ValueError, match="eagle3 only"):
        TrainingRun(TrainConfig(train_file=str(data), arch="eagle1", fc_norm="per_layer")).check()
    configs = train_configs(tmp_path, ["eagle3", "eagle1"], {"fc_norm": "concat"})
    assert (configs["eagle3"].fc_norm, configs["eagle1"].fc_norm) == ("concat", "none")
    ck = tmp_path / "ck"
    ck.mkdir()
    old = asdict(TrainConfig())
    old.pop("fc_norm")  # a checkpoint written before the option
    (ck / "state.json").write_text(json.dumps({"train_config": old}))
    check_same_recipe(ck, TrainConfig(fc_norm="none"))  # the option's absence reads as none, not the default
    from draftlab.core.errors import InputError

    with pytest.raises(InputError, match="fc_norm"):
        check_same_recipe(ck, TrainConfig(fc_norm="per_layer"))


def test_trained_per_layer_draft_round_trips_through_export(tmp_path, tiny_target):
    """A few TTT steps move the norms off 1; the export loads back with the same logits."""
    from draftlab.train_draft import train
    from test_train import small_config, write_fixture

    files = write_fixture(tmp_path / "regen", n_train=8, n_val=2, new_tokens=12)
    r = train(
        small_config(
            files,
            tmp_path / "eagle3",
            epochs=1,
            max_batch=2,
            stop_after=3,
            fc_norm="per_layer",
            save_every=100,
            eval_every=100,
        )
    )
    draft = r["draft"].eval()
    assert draft.fc_norms == ("per_layer",)
    assert not torch.equal(draft.fc_norm[0].weight.detach().cpu(), torch.ones(64))  # trained
    out = export_draft(
        draft, tmp_path / "export", max_position_embeddings=tiny_target.max_position_embeddings, dtype="float32"
    )
    assert validate(out, tiny_target) == []
    back = load_draft(out, tiny_target)
    aux, ids = torch.randn(1, 6, 192), torch.randint(0, 500, (1, 6))
    with torch.no_grad():
        a = draft(ids, draft.project(aux), torch.arange(6)[None])[0]
        b = back(ids, back.project(aux), torch.arange(6)[None])[0]
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_sglang_loads_names_as_its_0_5_17_loader_does():
    """llama_eagle3.load_weights: legacy substrings renamed, then the name or `model.` + it among its
    parameters (the layers under model., lm_head at the top); d2t/t2d by substring."""
    from draftlab.model.contract import sglang_loads_as

    names = {
        "fc.weight",
        "midlayer.self_attn.q_proj.weight",
        "norm.weight",
        "lm_head.weight",
        "d2t",
        "t2d",
        "fc_norm.0.weight",
    }
    assert sglang_loads_as("midlayer.self_attn.q_proj.weight", names) == "midlayer.self_attn.q_proj.weight"
    assert sglang_loads_as("layers.0.self_attn.q_proj.weight", names) == "midlayer.self_attn.q_proj.weight"
    assert sglang_loads_as("model.midlayer.self_attn.q_proj.weight", names) == "midlayer.self_attn.q_proj.weight"
    assert sglang_loads_as("model.fc.weight", names) == "fc.weight"
    assert sglang_loads_as("aux_norm_low.weight", names) == "fc_norm.0.weight"
    assert sglang_loads_as("draft_model.d2t", names) == "d2t"
    for skipped in (
        "model.lm_head.weight",
        "draft_model.fc.weight",
        "module.midlayer.mlp.up_proj.weight",
        "embed_tokens.weight",
    ):
        assert sglang_loads_as(skipped, names) is None, skipped


def test_the_doctor_passes_names_sglang_loads_and_flags_those_it_skips(tmp_path):
    """`model.`-prefixed layers load in SGLang 0.5.17 (an info line); `draft_model.` ones do not (an error)."""

    def findings(name, prefix, starts):
        folder = good_draft(tmp_path / name, "tiny", draft_vocab_size=256)
        edit_tensors(folder, lambda t: [t.__setitem__(prefix + k, t.pop(k)) for k in list(t) if k.startswith(starts)])
        return [
            f
            for f in diagnose(str(folder), "tiny")["findings"]
            if f.check in ("unknown_tensors", "missing_tensors") and f.severity != "ok"
        ]

    ok = findings("model", "model.", ("midlayer.", "fc.", "norm."))
    assert [f.severity for f in ok] == ["info"] and "load under another spelling" in ok[0].what
    bad = findings("draft_model", "draft_model.", ("midlayer.",))
    assert [f.severity for f in bad if f.check == "unknown_tensors"] == ["error"]
    assert "draft_model.midlayer" in bad[0].what and any(f.check == "missing_tensors" for f in bad)


def test_load_draft_takes_every_spelling_sglang_loads_and_refuses_those_it_skips(tmp_path, tiny_target):
    """One rule (model.contract.sglang_loads_as) for SGLang's loader, the doctor and load_draft:
    `layers.0.*`, `model.*` and `model.fc_norm.*` load; `draft_model.*` is refused as SGLang skips it."""
    torch.manual_seed(0)
    cfg = draft_config_for_target(tiny_target.config, draft_vocab_size=256, fc_norm="per_layer")
    draft = scramble_norms(Eagle3Draft(cfg, tiny_target.model.get_input_embeddings()).eval())
    out = export_draft(
        draft, tmp_path / "d", dtype="float32", max_position_embeddings=tiny_target.max_position_embeddings
    )

    def spelled(name):
        if name.startswith("midlayer."):
            return "layers.0." + name[len("midlayer.") :]
        return "model." + name if name.startswith(("fc.", "norm.", "fc_norm.")) else name

    edit_tensors(out, lambda t: [t.__setitem__(spelled(k), t.pop(k)) for k in list(t) if spelled(k) != k])
    back = load_draft(out, tiny_target)
    for name, tensor in draft.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name
    assert diagnose(str(out), "tiny")["errors"] == 0
    edit_tensors(out, lambda t: t.__setitem__("draft_model.fc.weight", t.pop("model.fc.weight")))
    with pytest.raises(ValueError, match=r"missing tensors \['fc.weight'\], unexpected tensors \['draft_model"):
        load_draft(out, tiny_target)


@pytest.mark.parametrize(
    "spelling", ["model.fc_norm.{i}.weight", "model.aux_norm_{level}.weight", "aux_norm_{level}.weight"]
)
def test_doctor_judges_every_norm_spelling_sglang_loads(tmp_path, spelling):
    levels = ("low", "mid", "high")
    names = [spelling.format(i=i, level=levels[i]) for i in range(3)]
    keyed = good_draft(tmp_path / "keyed", "tiny", draft_vocab_size=256)
    edit_config(keyed, lambda c: c.update(fc_norm=True))
    edit_tensors(keyed, lambda t: t.update({n: torch.ones(64) for n in names}))
    assert [s for s, _, _ in fc_norm_findings(keyed)] == ["ok"]
    unkeyed = good_draft(tmp_path / "unkeyed", "tiny", draft_vocab_size=256)
    edit_tensors(unkeyed, lambda t: t.update({n: torch.ones(64) for n in names}))
    found = fc_norm_findings(unkeyed)
    assert [s for s, _, _ in found] == ["error"] and "but config.json does not set fc_norm" in found[0][1]
    concat = good_draft(tmp_path / "concat", "tiny", draft_vocab_size=256)
    edit_tensors(concat, lambda t: t.update({"model.input_norm.weight": torch.ones(192)}))
    assert "has input_norm.weight but config.json does not set norm_before_fc" in fc_norm_findings(concat)[0][1]
