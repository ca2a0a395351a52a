"""Training: TTT loss learns, online == offline hidden states, --resume is exact, logs and checkpoints."""

import csv
import json

import pytest
import torch

from draftlab.train_draft import TrainConfig, plan_epoch, summarize, train


def write_fixture(folder, n_train: int = 32, n_val: int = 8, new_tokens: int = 24):
    """Regenerated-style conversations: the tiny target's own greedy replies to short prompts (so the
    target's arg-max tokens are in the draft vocabulary, as with real regenerated data)."""
    import random

    from draftlab.core.records import make_conversation, write_jsonl
    from draftlab.model.target import load_target

    t = load_target("tiny", device="cpu")
    tok = t.tokenizer
    tok.padding_side = "left"
    rng = random.Random(0)
    words = "the a cat dog runs jumps over lazy quick brown fox python code function returns list".split()
    prompts = [[{"role": "user", "content": " ".join(rng.choices(words, k=6)) + "?"}] for _ in range(n_train + n_val)]
    enc = tok(
        [t.render(p, add_generation_prompt=True) for p in prompts],
        return_tensors="pt",
        padding=True,
        add_special_tokens=False,
    )
    with torch.no_grad():
        out = t.model.generate(**enc, max_new_tokens=new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
    rows = [
        make_conversation(p + [{"role": "assistant", "content": tok.decode(o, skip_special_tokens=True)}], "tiny")
        for p, o in zip(prompts, out[:, enc["input_ids"].shape[1] :])
    ]
    folder.mkdir(parents=True, exist_ok=True)
    write_jsonl(folder / "train.jsonl", rows[:n_train])
    write_jsonl(folder / "val.jsonl", rows[n_train:])
    return folder / "train.jsonl", folder / "val.jsonl"


@pytest.fixture(scope="module")
def fixture_files(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("regen"))


def small_config(files, out_dir, **kw):
    base = dict(
        train_file=str(files[0]),
        val_file=str(files[1]),
        out_dir=str(out_dir),
        target="tiny",
        device="cpu",
        draft_vocab_size=512,
        epochs=2,
        batch_tokens=512,
        max_batch=8,
        ttt_steps=3,
        lr=3e-3,
        log_every=1,
        eval_every=4,
        save_every=3,
        init_from_target=False,
    )
    base.update(kw)
    return TrainConfig(**base)


def test_plan_epoch_is_deterministic_and_covers_all():
    lengths = [5, 50, 7, 9, 100, 3, 30, 12] * 10
    a = plan_epoch(lengths, 200, 4, seed=1, epoch=0)
    assert a == plan_epoch(lengths, 200, 4, seed=1, epoch=0)
    assert a != plan_epoch(lengths, 200, 4, seed=1, epoch=1)
    assert sorted(i for b in a for i in b) == list(range(len(lengths)))
    assert all(len(b) <= 4 and max(lengths[i] for i in b) * len(b) <= 200 or len(b) == 1 for b in a)


def test_summarize_simulated_acceptance():
    stats = torch.tensor([[2.0, 2, 8, 10], [1.0, 1, 5, 10], [0.0, 0, 0, 10]])
    s = summarize(stats, 0.8)
    assert s["acc_0"] == 0.8 and s["acc_1"] == 0.5
    assert s["sim_accept_len"] == pytest.approx(1 + 0.8 + 0.4 + 0.0)
    assert s["loss"] == pytest.approx(1.0 + 0.8 * 1.0)


@pytest.mark.slow
def test_training_learns_and_logs(fixture_files, tmp_path):
    out = tmp_path / "train" / "eagle3"
    r = train(small_config(fixture_files, out, epochs=3))
    assert r["finished"]
    rows = list(csv.DictReader(open(out / "train.csv")))
    assert len(rows) == r["total_steps"]
    first, last = float(rows[0]["loss"]), float(rows[-1]["loss"])
    assert last < first, (first, last)
    evals = list(csv.DictReader(open(out / "eval.csv")))
    # an untrained draft scores ~1/512 here
    assert float(evals[-1]["acc_0"]) > 0.1 and float(evals[-1]["sim_accept_len"]) > 1.1, evals[-1]
    assert (out / "tb").is_dir() and any((out / "tb").iterdir())
    assert (out / "latest").read_text().strip() == f"ckpt-{r['total_steps']:07d}"
    assert set(p.name for p in (out / (out / "latest").read_text().strip()).iterdir()) == {
        "draft.safetensors",
        "optimizer.safetensors",
        "state.json",
    }
    vocab = json.loads((out / "vocab.json").read_text())
    assert len(vocab["draft_ids"]) == 512 and vocab["draft_ids"] == sorted(vocab["draft_ids"])


def test_a_signal_checkpoints_and_stops_the_call(fixture_files, tmp_path, monkeypatch):
    """SIGTERM mid-run (here sent during the first step): the step ends, a checkpoint is written, Stopped
    says where and how to resume (exit 143 from the command); resume then continues from it."""
    import os
    import signal

    from draftlab.core.stop import Stopped
    from draftlab.train_draft import loop

    real_step = loop.TrainingRun.train_step

    def step_then_signal(self, *args):
        out = real_step(self, *args)
        if self.step == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return out

    monkeypatch.setattr(loop.TrainingRun, "train_step", step_then_signal)
    out = tmp_path / "eagle3"
    cfg = small_config(fixture_files, out, save_every=100, eval_every=100)
    with pytest.raises(Stopped, match="at step 1 of .* \\(checkpoint ckpt-0000001\\), stopped by SIGTERM") as exc:
        train(cfg)
    assert exc.value.exit_code == 143
    assert (out / "latest").read_text().strip() == "ckpt-0000001"
    assert not json.loads((out / "summary.json").read_text())["finished"]
    monkeypatch.setattr(loop.TrainingRun, "train_step", real_step)
    r = train(cfg, resume=True)
    assert r["finished"] and r["resumed_from_step"] == 1


def test_the_learning_rate_schedule_is_a_setting(fixture_files, tmp_path):
    """lr_schedule: after the warm-up cosine decays towards 0 and constant holds the peak; an unknown one
    is refused before the target loads."""
    lrs = {}
    for schedule in ("cosine", "constant"):
        out = tmp_path / schedule
        train(small_config(fixture_files, out, epochs=1, eval_every=100, save_every=100, lr_schedule=schedule))
        lrs[schedule] = [float(r["lr"]) for r in csv.DictReader(open(out / "train.csv"))]
    assert len(lrs["cosine"]) == len(lrs["constant"]) > 3
    assert lrs["constant"][1:] == [3e-3] * (len(lrs["constant"]) - 1)  # one warm-up step, then the peak
    cosine = lrs["cosine"]
    assert cosine[-1] < 0.2 * 3e-3 and all(a > b for a, b in zip(cosine[1:], cosine[2:]))
    with pytest.raises(ValueError, match="lr_schedule = 'wsd', expected one of"):
        train(small_config(fixture_files, tmp_path / "bad", lr_schedule="wsd"))


@pytest.mark.slow
def test_resume_is_exact(fixture_files, tmp_path):
    straight = train(small_config(fixture_files, tmp_path / "a" / "eagle3", save_every=100, eval_every=100))
    part = train(small_config(fixture_files, tmp_path / "b" / "eagle3", save_every=100, eval_every=100, stop_after=3))
    assert not part["finished"] and part["steps"] == 3
    resumed = train(small_config(fixture_files, tmp_path / "b" / "eagle3", save_every=100, eval_every=100), resume=True)
    assert resumed["finished"] and resumed["steps"] == straight["steps"]
    sa, sb = straight["draft"].state_dict(), resumed["draft"].state_dict()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), k
    rows = list(csv.DictReader(open(tmp_path / "b" / "eagle3" / "train.csv")))
    assert [int(r["step"]) for r in rows] == list(range(1, straight["steps"] + 1))
    # training time adds up over the calls: the resumed call reports the first call's seconds too
    assert part["resumed_from_step"] is None and resumed["resumed_from_step"] == 3
    assert part["elapsed_total_s"] == part["elapsed_s"]
    assert resumed["elapsed_total_s"] > resumed["elapsed_s"] + 0.5 * part["elapsed_s"]
    # and so do the tokens: the rate over every call is the straight run's tokens over the calls' seconds
    epochs_tokens = straight["tokens_per_s"] * straight["elapsed_s"]
    assert straight["tokens_per_s_all_calls"] == pytest.approx(straight["tokens_per_s"])
    assert resumed["tokens_per_s_all_calls"] * resumed["elapsed_total_s"] == pytest.approx(epochs_tokens)
    assert resumed["tokens_per_s"] * resumed["elapsed_s"] < epochs_tokens  # this call's alone: fewer


@pytest.mark.slow
def test_offline_equals_online_and_eagle1(fixture_files, tmp_path):
    on = train(small_config(fixture_files, tmp_path / "on" / "eagle3", epochs=1, stop_after=2))
    off = train(small_config(fixture_files, tmp_path / "off" / "eagle3", epochs=1, stop_after=2, hidden="offline"))
    assert (tmp_path / "off" / "hidden" / "train" / "index.json").is_file()
    for k, v in on["draft"].state_dict().items():
        assert torch.allclose(v.float(), off["draft"].state_dict()[k].float(), atol=1e-5), k
    # resumable: a second call finds every shard done and reuses them
    e1 = train(small_config(fixture_files, tmp_path / "off" / "eagle1", arch="eagle1", epochs=1, hidden="offline"))
    assert e1["finished"] and not e1["draft"].use_aux and not hasattr(e1["draft"], "fc")
    rows = list(csv.DictReader(open(tmp_path / "off" / "eagle1" / "train.csv")))
    assert float(rows[-1]["loss"]) < float(rows[0]["loss"])


@pytest.mark.slow
def test_rounded_batch_length_trains_the_same_draft(fixture_files, tmp_path):
    """pad_multiple only adds masked padding columns (fewer distinct shapes on a GPU): same weights,
    online and offline."""
    from draftlab.model.target import load_target
    from draftlab.train_draft import collate

    ds = [{"input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]}, {"input_ids": [4, 5], "loss_mask": [0, 1]}]
    rows = {"input_ids": [r["input_ids"] for r in ds], "loss_mask": [r["loss_mask"] for r in ds]}
    ids, valid, loss = collate(type("D", (), {"__getitem__": lambda self, i: rows})(), [0, 1], 0, multiple=8)
    assert ids.shape == (2, 8) and valid.sum() == 5 and loss.sum() == 3 and not valid[:, 3:].any()
    for hidden in ("online", "offline"):
        one = train(
            small_config(
                fixture_files,
                tmp_path / hidden / "p1" / "eagle3",
                epochs=1,
                stop_after=3,
                hidden=hidden,
                pad_multiple=1,
            )
        )
        wide = train(
            small_config(
                fixture_files,
                tmp_path / hidden / "p16" / "eagle3",
                epochs=1,
                stop_after=3,
                hidden=hidden,
                pad_multiple=16,
            )
        )
        for k, v in one["draft"].state_dict().items():
            assert torch.allclose(v.float(), wide["draft"].state_dict()[k].float(), atol=1e-5), (hidden, k)
    with pytest.raises(ValueError, match="attention"):
        train(
            small_config(fixture_files, tmp_path / "bad" / "eagle3", attention="fastest"),
            target=load_target("tiny", device="cpu"),
        )


@pytest.mark.gpu
def test_gpu_bf16_online_and_offline(fixture_files, tmp_path):
    """The GPU path: bf16 autocast, activation-checkpointed head, online and offline states."""
    for hidden in ("online", "offline"):
        r = train(small_config(fixture_files, tmp_path / hidden / "eagle3", device="cuda", hidden=hidden, epochs=2))
        assert r["finished"] and next(r["draft"].parameters()).is_cuda
        rows = list(csv.DictReader(open(tmp_path / hidden / "eagle3" / "train.csv")))
        assert float(rows[-1]["loss"]) < float(rows[0]["loss"])
        assert r["eval"]["acc_0"] > 0.1


@pytest.mark.slow
def test_offline_precompute_resumes_after_a_crash(fixture_files, tmp_path, tiny_target, capsys):
    from safetensors.torch import load_file

    from draftlab.model.chat_data import load_tokenized
    from draftlab.model.hidden import OfflineHidden, precompute_hidden, target_states

    ds, _ = load_tokenized(fixture_files[0], tiny_target.tokenizer, 256)
    full = precompute_hidden(tiny_target, ds, tmp_path / "a", batch_tokens=256, shard_tokens=300, dtype=torch.float32)
    assert "GB" in capsys.readouterr().out  # the size estimate is printed before starting
    index = json.loads((tmp_path / "a" / "index.json").read_text())
    assert len(index["shards"]) >= 3
    # simulate a crash after the first shard: keep shard 0 only, in the index and on disk
    index["shards"] = index["shards"][:1]
    (tmp_path / "a" / "index.json").write_text(json.dumps(index))
    kept = load_file(str(tmp_path / "a" / "shard-00000.safetensors"))
    for p in (tmp_path / "a").glob("shard-*.safetensors"):
        if p.name != "shard-00000.safetensors":
            p.unlink()
    again = precompute_hidden(tiny_target, ds, tmp_path / "a", batch_tokens=256, shard_tokens=300, dtype=torch.float32)
    assert f"{index['shards'][0]['end']} samples already done" in capsys.readouterr().out
    assert torch.equal(load_file(str(tmp_path / "a" / "shard-00000.safetensors"))["aux"], kept["aux"])
    for k in (0, len(ds) - 1):
        aux, last = again.get([k], len(ds[k]["input_ids"]))
        ref_aux, ref_last, _ = target_states(tiny_target, torch.tensor([ds[k]["input_ids"]]))
        assert torch.allclose(aux, ref_aux, atol=1e-5) and torch.allclose(last, ref_last, atol=1e-5)
    with pytest.raises(ValueError, match="other data"):
        OfflineHidden(tmp_path / "a", ds.select(range(3)))
    assert isinstance(full, OfflineHidden)


@pytest.mark.slow
def test_side_by_side_equals_one_after_the_other(fixture_files, tmp_path):
    """Two archs trained at once in two processes give the weights of in-process training."""
    from draftlab.train_draft.parallel import train_side_by_side

    cfgs = [
        small_config(fixture_files, tmp_path / "par" / arch, arch=arch, epochs=1, threads=1)
        for arch in ("eagle3", "eagle1")
    ]
    par = train_side_by_side(cfgs, resume=True, poll_s=0.5)
    for c in cfgs:
        seq = train(small_config(fixture_files, tmp_path / "seq" / c.arch, arch=c.arch, epochs=1, threads=1))
        assert par[c.arch]["finished"] and par[c.arch]["steps"] == seq["steps"]
        a, b = par[c.arch]["draft"].state_dict(), seq["draft"].state_dict()
        for k in b:
            assert torch.allclose(a[k].float(), b[k].float(), atol=1e-6), (c.arch, k)
        assert (tmp_path / "par" / c.arch / "train.log").is_file()
    with pytest.raises(ValueError, match="online"):
        train_side_by_side([small_config(fixture_files, tmp_path / "x" / "eagle3", hidden="offline")])


def test_checkpoint_draft_reads_the_layers_it_was_trained_on(fixture_files, tmp_path):
    """A checkpoint stores the in-memory config (hidden_states indices): loading it must not read
    them as SGLang's exported ids (+1), or every layer shifts by one, silently."""
    from draftlab.model.export import export_draft, validate
    from draftlab.train_draft import load_checkpoint_draft

    r = train(small_config(fixture_files, tmp_path / "eagle3", epochs=1, stop_after=1))
    draft, target = load_checkpoint_draft(tmp_path / "eagle3", device="cpu")
    assert draft.capture_layers == r["draft"].capture_layers == target.capture_layers
    for k, v in r["draft"].state_dict().items():
        assert torch.equal(v, draft.state_dict()[k]), k
    export_draft(draft, tmp_path / "export")
    assert validate(tmp_path / "export", target) == []


def test_side_by_side_children_split_the_cores(monkeypatch):
    from draftlab.train_draft.parallel import child_env

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    assert child_env(2)["OMP_NUM_THREADS"] == "8"
    assert child_env(32)["OMP_NUM_THREADS"] == "1"
    monkeypatch.setenv("OMP_NUM_THREADS", "3")  # the user's own setting wins
    assert child_env(2)["OMP_NUM_THREADS"] == "3"
