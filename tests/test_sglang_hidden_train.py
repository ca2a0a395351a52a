"""`draftlab train --hidden sglang` on the CPU: a store captured as SGLang's hook writes it (post-norm final
state; computed here by transformers, a stand-in for SGLang) trains with the head-only target, no decoder
loaded, to the same draft as training from transformers' own offline states; `draftlab export` of its
checkpoint loads the head-only target too."""

import pytest
import torch

from draftlab.model.hidden import OfflineHidden
from draftlab.model.target import load_tokenizer, read_config
from draftlab.sglang.hidden_capture import capture_hidden, capture_plan
from draftlab.train_draft.loop import tokenized, train
from test_sglang_hidden import TransformersAdapter
from test_train import small_config, write_fixture


@pytest.mark.slow
def test_training_from_a_sglang_store_matches_training_from_transformers(tiny_target, tmp_path, monkeypatch):
    files = write_fixture(tmp_path / "regen", n_train=16, n_val=4, new_tokens=16)
    common = dict(token_cache=str(tmp_path / "tokens"), epochs=1, save_every=100, eval_every=100)
    ref_cfg = small_config(files, tmp_path / "ref" / "train", hidden="offline", **common)
    cfg = small_config(files, tmp_path / "sgl" / "train", hidden="sglang", sglang_args="--tp-size 2", **common)
    (train_ds, _), (val_ds, _) = tokenized(cfg, load_tokenizer("tiny"))
    plan = capture_plan(read_config("tiny"))
    for split, ds in (("train", train_ds), ("val", val_ds)):  # what the server would have written
        adapter = TransformersAdapter(tiny_target, plan["layers"])
        capture_hidden(adapter, ds, tmp_path / "sgl" / "hidden" / split, plan, "tiny", torch.float32)
    assert OfflineHidden(tmp_path / "sgl" / "hidden" / "train", train_ds).last == "post_norm"
    ref = train(ref_cfg, target=tiny_target)  # a loaded target: no random numbers drawn before the draft's init
    got = train(cfg)  # every split complete: no server is started; the head loader draws none either
    assert type(got["target"].model).__name__ == "HeadModel"
    assert got["eval"]["acc_0"] == pytest.approx(ref["eval"]["acc_0"], abs=1e-6)
    assert got["eval"]["loss"] == pytest.approx(ref["eval"]["loss"], rel=1e-4)
    a, b = got["draft"].state_dict(), ref["draft"].state_dict()
    assert all(torch.allclose(a[k].float(), b[k].float(), atol=1e-4) for k in a)
    from draftlab import cli
    from draftlab.train_draft import checkpoint

    monkeypatch.setattr(checkpoint, "load_target", lambda *a, **k: pytest.fail("export loaded the target's decoder"))
    assert cli.main(["export", str(tmp_path / "sgl" / "train"), str(tmp_path / "draft")]) == 0
    assert (tmp_path / "draft" / "model.safetensors").is_file()
