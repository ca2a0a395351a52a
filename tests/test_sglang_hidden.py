"""The SGLang hidden-state capture on the CPU: capture ids from a config alone (the embedded target and
DeepSeek-V3), the store it writes (read back by training's reader), resume after a crash, a SIGKILL and a
SIGTERM, the disk check, and the head-only target that trains from it. SGLang itself is stood in for by
an adapter computing the same states with transformers (a test fixture: the GPU proof compares the two)."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import datasets
import pytest
import torch

from draftlab.core.errors import InputError, RunFailure
from draftlab.model.hidden import OfflineHidden, estimate_bytes, final_feature, logits_from_last, target_states
from draftlab.model.target import read_config
from draftlab.sglang.hidden_capture import capture_hidden, capture_plan, store_complete

REPO = Path(__file__).resolve().parents[1]


class TransformersAdapter:
    """(k, aux, final) as SGLang's hook spools them, computed by transformers; `fail_at` raises there."""

    def __init__(self, target, layers, fail_at=None, delay=0.0):
        self.target, self.layers, self.fail_at, self.delay, self.seen = target, layers, fail_at, delay, []

    def states(self, items):
        for k, ids in items:
            if k == self.fail_at:
                raise RuntimeError(f"crash at {k}")
            time.sleep(self.delay)
            aux, last, _ = target_states(self.target, torch.tensor([ids]), None, self.layers)
            self.seen.append(k)
            yield k, aux[0], final_feature(self.target, last)[0]


def dataset(n=6):
    return datasets.Dataset.from_list([{"id": f"c{i}", "input_ids": list(range(5, 5 + 8 + i))} for i in range(n)])


def plan_for(target):
    return capture_plan(json.loads((Path(target.path) / "config.json").read_text()))


def test_capture_ids_from_config_alone_embedded_and_deepseek_v3():
    small = capture_plan(json.loads((REPO / "data/configs/smollm2-135m/config.json").read_text()))
    assert (small["layers"], small["config_ids"], small["width"], small["deepseek"]) == (
        [2, 15, 27],
        [1, 14, 26],
        1728,
        False,
    )
    ds = capture_plan(json.loads((REPO / "data/configs/deepseek-v3-61layer/config.json").read_text()))
    assert (ds["layers"], ds["config_ids"], ds["width"], ds["deepseek"]) == ([2, 30, 58], [1, 29, 57], 21504, True)
    # SGLang's deepseek_v2 setter adds 1 because the first id is 1: [1, 29, 57] -> [2, 30, 58]
    assert estimate_bytes(1, 7168, True, torch.bfloat16) == 3 * 7168 * 2 + 7168 * 2  # 43,008 B aux + 14,336 B final
    with pytest.raises(InputError, match="capture layers"):
        capture_plan(json.loads((REPO / "data/configs/smollm2-135m/config.json").read_text()), [0, 15, 27])


def test_store_format_is_what_training_reads(tiny_target, tmp_path):
    plan, data = plan_for(tiny_target), dataset()
    summary = capture_hidden(TransformersAdapter(tiny_target, plan["layers"]), data, tmp_path, plan, "tiny",
                             torch.float32, shard_tokens=25)  # fmt: skip
    index = json.loads((tmp_path / "index.json").read_text())
    assert index["last"] == "post_norm" and index["source"] == "sglang" and index["layers"] == [2, 4, 5]
    assert [i for sh in index["shards"] for i in sh["ids"]] == data["id"]  # resumable by conversation id
    assert len(index["shards"]) > 1 and summary["captured_tokens"] == sum(len(r) for r in data["input_ids"])
    store = OfflineHidden(tmp_path, data)
    aux, last = store.get([3, 0], 12)
    ids = torch.tensor([data[3]["input_ids"]])
    want_aux, want_last, _ = target_states(tiny_target, ids, None, [2, 4, 5])
    assert torch.equal(aux[0, :11], want_aux[0]) and torch.equal(last[0, :11], final_feature(tiny_target, want_last)[0])
    assert not aux[0, 11:].any() and store.last == "post_norm"
    assert store_complete(tmp_path, data, plan, "tiny", torch.float32)


def test_resume_after_a_crash_continues_at_the_first_unsaved_conversation(tiny_target, tmp_path):
    plan, data = plan_for(tiny_target), dataset()
    with pytest.raises(RuntimeError, match="crash at 4"):
        capture_hidden(TransformersAdapter(tiny_target, plan["layers"], fail_at=4), data, tmp_path, plan, "tiny",
                       torch.float32, shard_tokens=20)  # fmt: skip
    index = json.loads((tmp_path / "index.json").read_text())
    saved = index["shards"][-1]["end"]
    assert 0 < saved <= 4 and not store_complete(tmp_path, data, plan, "tiny", torch.float32)
    again = TransformersAdapter(tiny_target, plan["layers"])
    capture_hidden(again, data, tmp_path, plan, "tiny", torch.float32, shard_tokens=20)
    assert again.seen == list(range(saved, 6))
    full = tmp_path / "full"
    capture_hidden(TransformersAdapter(tiny_target, plan["layers"]), data, full, plan, "tiny", torch.float32)
    a, b = OfflineHidden(tmp_path, data), OfflineHidden(full, data)
    assert all(torch.equal(x, y) for x, y in zip(a.get(range(6), 13), b.get(range(6), 13)))


def test_too_little_disk_is_one_line_before_any_work(tiny_target, tmp_path, monkeypatch):
    import shutil

    from draftlab.model import hidden

    plan, data = plan_for(tiny_target), dataset()
    monkeypatch.setattr(hidden.shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    adapter = TransformersAdapter(tiny_target, plan["layers"])
    with pytest.raises(RunFailure, match=r"need 0\.0 GB more, 0\.0 GB free"):
        capture_hidden(adapter, data, tmp_path, plan, "tiny", torch.float32)
    assert adapter.seen == [] and not list(tmp_path.glob("shard-*"))


SCRIPT = textwrap.dedent(
    """
    import sys, torch
    sys.path.insert(0, {tests!r})
    from test_sglang_hidden import TransformersAdapter, dataset, plan_for
    from draftlab.core.errors import run_command
    from draftlab.model.target import load_target
    from draftlab.sglang.hidden_capture import capture_hidden
    target = load_target("tiny", device="cpu")
    plan = plan_for(target)
    adapter = TransformersAdapter(target, plan["layers"], delay=0.4)
    sys.exit(run_command(lambda a: capture_hidden(adapter, dataset(12), {out!r}, plan, "tiny", torch.float32,
                                                   shard_tokens=20) and 0, None))
    """
)


def run_and_signal(tmp_path, sig):
    out = tmp_path / "store"
    code = SCRIPT.format(tests=str(REPO / "tests"), out=str(out))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not (out / "index.json").is_file() and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert proc.poll() is None, proc.communicate()
    os.kill(proc.pid, sig)
    stdout, stderr = proc.communicate(timeout=60)
    return out, proc.returncode, stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_or_stopped_mid_run_resumes(tiny_target, tmp_path, sig):
    out, code, stderr = run_and_signal(tmp_path, sig)
    saved = json.loads((out / "index.json").read_text())["shards"][-1]["end"]
    if sig == signal.SIGTERM:
        assert code == 143 and "stopped by SIGTERM; rerun the same command to resume" in stderr
    else:
        assert code == -signal.SIGKILL
    assert 0 < saved < 12
    plan, data = plan_for(tiny_target), dataset(12)
    again = TransformersAdapter(tiny_target, plan["layers"])
    capture_hidden(again, data, out, plan, "tiny", torch.float32, shard_tokens=20)
    assert again.seen == list(range(saved, 12))
    assert not list(out.glob("*.tmp"))
    store = OfflineHidden(out, data)
    ids = torch.tensor([data[11]["input_ids"]])
    want, _, _ = target_states(tiny_target, ids, None, plan["layers"])
    assert torch.equal(store.get([11], 19)[0][0], want[0])


def test_head_target_gives_the_targets_logits_without_its_decoder(tiny_target):
    from draftlab.sglang.head_target import load_head_target

    head = load_head_target("tiny", device="cpu")
    assert head.num_layers == tiny_target.num_layers and head.capture_layers == tiny_target.capture_layers
    names = sorted(n for n, _ in head.model.named_parameters())
    assert names == ["embed_tokens.weight", "lm_head.weight", "norm.weight"]  # no decoder layer
    ids = torch.tensor([list(range(5, 20))])
    _, last, logits = target_states(tiny_target, ids, None, tiny_target.capture_layers, want_logits=True)
    post = final_feature(tiny_target, last)  # what SGLang stores
    assert torch.allclose(logits_from_last(head, post), logits, atol=1e-5)
    assert torch.equal(final_feature(head, post), post)  # the norm is already applied
    assert torch.equal(head.model.get_input_embeddings().weight, tiny_target.model.get_input_embeddings().weight)


def test_deepseek_v3_config_reads_as_a_head_target_shape():
    config = read_config(str(REPO / "data/configs/deepseek-v3-61layer"))
    assert capture_plan(config)["hidden_size"] * 3 == 21504
