"""The TTT objective against its definition, slot by slot: which slots each unroll step scores and
trains, and the loss it gives them (soft and hard labels), on the tiny target."""

import re

import pytest
import torch
import torch._dynamo.utils as dynamo_utils
import torch.nn.functional as F

from draftlab.model.draft import Eagle3Draft, draft_config_for_target
from draftlab.model.hidden import logits_from_last, target_states
from draftlab.train_draft import TTTObjective, targets_at
from draftlab.train_draft.objective import compile_report


def _batch(tiny_target):
    torch.manual_seed(0)
    b, seq = 3, 24
    ids = torch.randint(3, tiny_target.vocab_size, (b, seq))
    valid = torch.ones(b, seq, dtype=torch.bool)
    valid[1, 17:] = False  # right padding
    valid[2, 9:] = False
    loss_mask = valid.clone()
    loss_mask[:2, :6] = False  # the prompt
    loss_mask[2, :2] = False  # a short one: the first assistant slots exist only at early unroll steps
    loss_mask[0, 12:14] = False  # a user turn inside the conversation
    pred_mask = F.pad((loss_mask & valid)[:, 1:], (0, 1))  # token p+1 is an assistant token
    return ids, valid, pred_mask


def _draft(tiny_target, vd=512):
    cfg = draft_config_for_target(tiny_target.config, draft_vocab_size=vd, use_aux=True)
    draft = Eagle3Draft(cfg, tiny_target.model.get_input_embeddings())
    draft.set_vocab(torch.arange(0, 2 * vd, 2))  # every other id: many arg-maxes fall outside
    return draft


def _by_definition(draft, target, ids, valid, pred_mask, steps, decay, loss):
    """sum_i decay^i * mean over trained slots of CE, with slot t of step i predicting after position t+1+i."""
    aux, last, _ = target_states(target, ids, valid.long(), target.capture_layers)
    full = logits_from_last(target, last)  # [B,L,V]
    dids = draft.draft_ids()
    length = ids.shape[1] - 1
    hidden = draft.project(aux[:, :length])
    pos = torch.arange(length)[None].expand(ids.shape[0], -1)
    total, counts = 0.0, []
    for i, hid in draft.ttt_forward(ids[:, 1:], hidden, pos, valid[:, 1:], steps):
        ces, scored, trained = [], 0, 0
        for b in range(ids.shape[0]):
            for t in range(length):
                p = t + 1 + i
                if p >= ids.shape[1] or not pred_mask[b, p]:
                    continue
                scored += 1
                top = int(full[b, p].argmax())
                if not draft.t2d[top]:
                    continue
                trained += 1
                logp = torch.log_softmax(draft.head(hid[b, t]).float(), -1)
                if loss == "soft":
                    ces.append(-(torch.softmax(full[b, p, dids].float(), -1) * logp).sum())
                else:
                    ces.append(-logp[int((dids == top).nonzero())])
        total = total + decay**i * torch.stack(ces).mean()
        counts.append((scored, trained))
    return total, counts


@pytest.mark.parametrize("loss", ["soft", "hard"])
def test_objective_equals_its_definition(tiny_target, loss):
    ids, valid, pred_mask = _batch(tiny_target)
    draft = _draft(tiny_target)
    steps, decay = 4, 0.8
    want, counts = _by_definition(draft, tiny_target, ids, valid, pred_mask, steps, decay, loss)
    want_grad = torch.autograd.grad(want, draft.fc.weight)[0]

    aux, last, _ = target_states(tiny_target, ids, valid.long(), tiny_target.capture_layers)
    targets = targets_at(tiny_target, last, pred_mask, draft.draft_ids(), draft.t2d)
    got, stats = TTTObjective(draft, steps, decay, loss)(aux, ids, valid, targets)
    got_grad = torch.autograd.grad(got, draft.fc.weight)[0]

    assert float(got.detach()) == pytest.approx(float(want.detach()), rel=1e-5)
    assert torch.allclose(got_grad, want_grad, rtol=1e-4, atol=1e-7)
    assert [(int(s[3]), int(s[1])) for s in stats] == counts  # scored and trained slots per step
    assert counts[0][0] > counts[-1][0] > 0 and all(tr < sc for sc, tr in counts)  # masks really select


def test_a_precomputed_argmax_gives_the_same_targets(tiny_target):
    ids, valid, pred_mask = _batch(tiny_target)
    draft = _draft(tiny_target)
    _, last, _ = target_states(tiny_target, ids, valid.long(), tiny_target.capture_layers)
    a = targets_at(tiny_target, last, pred_mask, draft.draft_ids(), draft.t2d)
    top = logits_from_last(tiny_target, last).argmax(-1)
    b = targets_at(tiny_target, last, pred_mask, draft.draft_ids(), draft.t2d, top=top, chunk=5)
    assert torch.equal(a.rows, b.rows) and torch.equal(a.top, b.top) and torch.equal(a.draft_top, b.draft_top)
    assert torch.allclose(a.logits, b.logits, atol=1e-5)
    assert len(a.rows) == int(pred_mask.sum())
    inside = a.draft_top >= 0
    assert torch.equal(draft.draft_ids()[a.draft_top[inside]], a.top[inside])


def test_unknown_loss_is_refused(tiny_target):
    with pytest.raises(ValueError, match="loss = 'kl'"):
        TTTObjective(_draft(tiny_target), 2, 0.8, "kl")


@pytest.mark.slow
def test_the_compiled_objective_computes_the_same(tiny_target):
    """TrainConfig.compile: torch.compile of the unroll step and the step loss (inductor; on the CPU here)."""
    ids, valid, pred_mask = _batch(tiny_target)
    aux, last, _ = target_states(tiny_target, ids, valid.long(), tiny_target.capture_layers)
    results = []
    for compiled in (False, True):
        torch.manual_seed(0)
        draft = _draft(tiny_target)
        targets = targets_at(tiny_target, last, pred_mask, draft.draft_ids(), draft.t2d)
        loss, stats = TTTObjective(draft, 3, 0.8, compile=compiled)(aux, ids, valid, targets)
        results.append((loss.detach(), stats, torch.autograd.grad(loss, draft.fc.weight)[0]))
    (a, sa, ga), (b, sb, gb) = results
    assert draft.ttt_step_fn is not None
    assert torch.allclose(a, b, rtol=1e-5) and torch.equal(sa[:, [1, 3]], sb[:, [1, 3]])
    assert torch.allclose(ga, gb, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_the_compiled_step_stays_compiled_over_a_run(tiny_target):
    """A run's batches of one and of several rows, trained and then evaluated under no_grad: every
    frame dynamo meets is compiled. (On the H200 the step needed a ninth graph, past dynamo's
    default recompile limit of 8, and from then on silently ran eager.)"""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(0)
    draft = _draft(tiny_target)
    objective = TTTObjective(draft, 3, 0.8, compile=True)
    for grad in (True, False):
        for b, seq in ((3, 24), (1, 20), (2, 30)):
            ids = torch.randint(3, tiny_target.vocab_size, (b, seq))
            valid = torch.ones(b, seq, dtype=torch.bool)
            aux, last, _ = target_states(tiny_target, ids, valid.long(), tiny_target.capture_layers)
            targets = targets_at(tiny_target, last, F.pad(valid[:, 1:], (0, 1)), draft.draft_ids(), draft.t2d)
            with torch.set_grad_enabled(grad):
                loss, _ = objective(aux, ids, valid, targets)
            if grad:
                loss.backward()
    assert counters["frames"]["total"] == counters["frames"]["ok"], dict(counters["unimplemented"])
    assert not any("recompile limit" in k for k in counters["unimplemented"])
    compiled, frames = draft.ttt_step_fn, counters["frames"]["total"]
    with torch.no_grad(), objective.eager():  # training's evaluation: eager, dynamo sees nothing
        objective(aux, ids, valid, targets)
        assert draft.ttt_step_fn is None and objective.step_loss == objective._step_loss
    assert counters["frames"]["total"] == frames
    assert draft.ttt_step_fn is compiled and objective.step_loss != objective._step_loss
    # the compiler's account that a compiled training run prints at its end: tracing's total first
    report = compile_report()
    assert report.startswith("compile times (s, nested): ") and "_compile.compile_inner" in report, report
    assert re.search(r"; caches: fxgraph hit \d+, fxgraph miss \d+, autograd hit \d+, autograd miss \d+$", report)

    # laid out as by the `tabulate` package (on the H200 the string form's parse found "none"): the same report
    def spaced(rows, headers):
        return "\n".join(f"{a:<40} {b}" for a, b in [headers, *rows])

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dynamo_utils, "tabulate", spaced)
        assert compile_report() == report
