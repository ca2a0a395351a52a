"""The draft module: contract names, KV-cache consistency, TTT == inference chain, hidden states."""

import pytest
import torch

from draftlab.model.capture import default_capture
from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.hidden import (
    aux_hidden,
    draft_features,
    final_hidden,
    logits_from_last,
)


@pytest.fixture(scope="module")
def draft(tiny_target):
    torch.manual_seed(0)
    cfg = draft_config_for_target(tiny_target.config, draft_vocab_size=512)
    return Eagle3Draft(cfg, tiny_target.model.get_input_embeddings()).eval()


def test_default_capture():
    assert default_capture(30) == [2, 15, 27]
    assert default_capture(61) == [2, 30, 58]


def test_state_dict_names_are_the_contract(draft):
    names = set(draft.state_dict())
    assert "fc.weight" in names and "lm_head.weight" in names and "d2t" in names and "t2d" in names
    assert not any("embed" in n for n in names)
    assert draft.state_dict()["midlayer.self_attn.q_proj.weight"].shape == (64, 128)  # [heads*hd, 2H]
    assert draft.capture_layers == [2, 4, 5] and draft.use_aux


def test_hidden_states_alignment(tiny_target):
    ids = torch.randint(0, 1000, (2, 7))
    out = tiny_target.model(ids, output_hidden_states=True)
    aux = aux_hidden(tiny_target, ids, None, [2, 4, 5])
    assert aux.shape == (2, 7, 192)
    assert torch.equal(aux[..., :64], out.hidden_states[2]) and torch.equal(aux[..., 128:], out.hidden_states[5])
    last = final_hidden(tiny_target, ids)
    # pre-norm: the final norm of it gives transformers' (post-norm) last hidden state and the logits
    assert torch.allclose(tiny_target.model.model.norm(last), out.hidden_states[-1], atol=1e-6)
    assert torch.allclose(logits_from_last(tiny_target, last), out.logits, atol=1e-4)
    assert torch.allclose(logits_from_last(tiny_target, last, torch.tensor([5, 9])), out.logits[..., [5, 9]], atol=1e-4)
    with pytest.raises(ValueError, match="outside"):
        aux_hidden(tiny_target, ids, None, [2, 4, 8])


def test_kv_cache_matches_full_forward(draft, tiny_target):
    ids = torch.randint(0, 1000, (2, 10))
    h = draft.project(aux_hidden(tiny_target, ids))
    pos = torch.arange(9)
    with torch.no_grad():
        full, _, cache = draft(ids[:, 1:], h[:, :9], pos)
        assert cache.get_seq_length() == 9
        parts = [draft(ids[:, 1:6], h[:, :5], pos[:5])]
        cache = parts[0][2]
        for j in range(5, 9):
            parts.append(draft(ids[:, 1 + j : 2 + j], h[:, j : j + 1], pos[j : j + 1], cache))
    assert cache.get_seq_length() == 9
    assert torch.allclose(torch.cat([p[0] for p in parts], 1), full, atol=1e-5)


def test_padding_mask_left_padded_batch(draft, tiny_target):
    """A left-padded row gives the same logits as the same row alone."""
    ids = torch.randint(0, 1000, (1, 6))
    h = torch.randn(1, 6, 64)
    with torch.no_grad():
        alone = draft(ids, h, torch.arange(6))[0]
        ids2 = torch.cat([torch.zeros(1, 2, dtype=torch.long), ids], 1)
        h2 = torch.cat([torch.zeros(1, 2, 64), h], 1)
        mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1]])
        pos = torch.tensor([[0, 0, 0, 1, 2, 3, 4, 5]])
        padded = draft(ids2, h2, pos, attention_mask=mask)[0]
    assert torch.allclose(padded[:, 2:], alone, atol=1e-5)


def test_ttt_step_i_equals_the_inference_chain(draft, tiny_target):
    """TTT slot t at step i == draft chain: prefix 0..t, then i steps fed with its own hidden_out."""
    ids = torch.randint(0, 1000, (2, 12))
    h = draft.project(aux_hidden(tiny_target, ids))
    T = 11
    pos = torch.arange(T)[None].expand(2, -1)
    with torch.no_grad():
        ttt = {
            i: draft.head(hid)
            for i, hid in draft.ttt_forward(ids[:, 1:], h[:, :T], pos, torch.ones(2, T, dtype=torch.bool), 4)
        }
        for t in (0, 3, 6):
            logits, hid, cache = draft(ids[:, 1 : t + 2], h[:, : t + 1], pos[:, : t + 1])
            assert torch.allclose(logits[:, t], ttt[0][:, t], atol=1e-5)
            hid = hid[:, t : t + 1]
            for i in range(1, 4):
                tok = ids[:, t + 1 + i : t + 2 + i]
                logits, hid, cache = draft(tok, hid, torch.tensor([t + i]), cache)
                assert torch.allclose(logits[:, 0], ttt[i][:, t], atol=1e-5), (t, i)


def test_to_target_ids_and_set_vocab(draft):
    d = Eagle3Draft(draft.config, draft.embed_tokens)
    ids = torch.arange(0, 1024, 2)
    d.set_vocab(ids)
    assert torch.equal(d.to_target_ids(torch.tensor([0, 3, 511])), torch.tensor([0, 6, 1022]))
    assert torch.equal(d.draft_ids(), ids) and int(d.t2d.sum()) == 512 and bool(d.t2d[1022]) and not d.t2d[1]


def test_eagle1_variant_takes_final_state(tiny_target):
    cfg = draft_config_for_target(tiny_target.config, draft_vocab_size=128, use_aux=False)
    d = Eagle3Draft(cfg, tiny_target.model.get_input_embeddings())
    ids = torch.randint(0, 1000, (1, 5))
    feats = draft_features(tiny_target, d, ids)
    assert feats.shape == (1, 5, 64) and torch.equal(d.project(feats), feats)
    logits, hid, _ = d(ids[:, 1:], feats[:, :4], torch.arange(4))
    assert logits.shape == (1, 4, 128) and hid.shape == (1, 4, 64)
    # SGLang's EAGLE sends the post-norm final state: transformers' hidden_states[-1].
    with torch.no_grad():
        post = tiny_target.model(ids, output_hidden_states=True).hidden_states[-1]
    assert torch.allclose(post, feats, atol=1e-6)
