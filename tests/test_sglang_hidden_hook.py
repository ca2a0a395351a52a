"""The part of the SGLang capture that runs in SGLang's workers, driven with stand-in modules on the CPU:
arming, what is spooled per request chunk, TP ranks other than 0, the checks that stop a wrong capture, and
the writer thread: the client waits for a chunk still being written, and a write that fails is an error file."""

import json
import threading
from types import SimpleNamespace

import pytest
import torch

from draftlab.core.errors import InputError
from draftlab.sglang import hidden_hook
from draftlab.sglang.hidden_hook import CaptureHook, hook_flags, hook_specs, take_request, worker_error
from draftlab.sglang.hidden_server import capture_command

H = 4


class Mode:
    def __init__(self, extend=True):
        self.extend = extend

    def is_extend(self):
        return self.extend


def batch(rids, lens, starts, extend=True):
    return SimpleNamespace(
        rids=rids, forward_mode=Mode(extend), extend_seq_lens_cpu=lens, extend_prefix_lens_cpu=starts
    )


def armed_hook(tmp_path, monkeypatch, chosen=(2, 4, 5)):
    """A hook whose first forward has run: SGLang's setter stood in for by one that picks `chosen`."""
    monkeypatch.setattr(
        hidden_hook, "set_capture", lambda inner, archs, ids: setattr(inner, "layers_to_capture", list(chosen))
    )
    monkeypatch.setattr(CaptureHook, "is_writer", lambda self: True)
    spec = hook_specs(tmp_path, [1, 3, 4], [2, 4, 5], H, ["LlamaForCausalLM"])[0]
    hook = hidden_hook.capture_hook(spec["config"])
    inner = SimpleNamespace()
    assert hook(inner, (None, None, batch(["x"], [3], [0])), torch.zeros(3, H)) is None  # arming forward: untouched
    return hook, inner


def test_flags_name_the_hook_and_turn_off_prefix_reuse_and_prefill_graphs(tmp_path):
    specs = hook_specs(tmp_path, [1, 14, 26], [2, 15, 27], 576, ["LlamaForCausalLM"])
    flags = hook_flags(specs)
    assert (
        flags[0] == "--forward-hooks" and "--disable-radix-cache" in flags and "--disable-prefill-cuda-graph" in flags
    )
    spec = json.loads(flags[1])[0]
    assert spec["target_modules"] == ["model"] and spec["hook_factory"] == "draftlab.sglang.hidden_hook:capture_hook"
    assert spec["config"]["config_ids"] == [1, 14, 26] and spec["config"]["layers"] == [2, 15, 27]
    module, factory = spec["hook_factory"].split(":")
    assert callable(getattr(__import__(module, fromlist=[factory]), factory))  # what SGLang's resolver imports


def test_spools_each_request_chunk_and_returns_the_plain_output(tmp_path, monkeypatch):
    hook, inner = armed_hook(tmp_path, monkeypatch)
    final = torch.arange(7 * H, dtype=torch.float32).reshape(7, H)
    aux = [final + 100, final + 200, final + 300]  # a list, as llama.py returns it
    rid = "draftlab-run-0"
    out = hook(inner, (None, None, batch([rid, "warmup-1"], [5, 2], [0, 0])), (final, aux))
    assert out is final  # the outer model sees no capture
    # the second chunk of the same request (chunked prefill), tokens 5..7
    final2 = torch.full((3, H), -1.0)
    hook(inner, (None, None, batch([rid], [3], [5])), (final2, torch.cat([final2] * 3, -1)))
    got_aux, got_final = take_request(tmp_path, rid, 8)
    assert torch.equal(got_final, torch.cat([final[:5], final2]))
    assert torch.equal(got_aux[:5], torch.cat([a[:5] for a in aux], -1))
    assert not list(tmp_path.glob("draftlab-*")) and not list(tmp_path.glob("warmup*"))  # taken; warm-ups never spooled
    assert worker_error(tmp_path) is None


def test_decode_forwards_and_other_tp_ranks_spool_nothing(tmp_path, monkeypatch):
    hook, inner = armed_hook(tmp_path, monkeypatch)
    final = torch.zeros(2, H)
    assert (
        hook(inner, (None, None, batch(["draftlab-a"], [2], [0], extend=False)), (final, final.repeat(1, 3))) is final
    )
    monkeypatch.setattr(CaptureHook, "is_writer", lambda self: False)
    assert hook(inner, (None, None, batch(["draftlab-b"], [2], [0])), (final, final.repeat(1, 3))) is final
    assert not list(tmp_path.glob("*.safetensors"))


def test_missing_or_short_chunks_are_refused(tmp_path, monkeypatch):
    hook, inner = armed_hook(tmp_path, monkeypatch)
    final = torch.zeros(3, H)
    hook(inner, (None, None, batch(["draftlab-a"], [3], [2])), (final, final.repeat(1, 3)))
    with pytest.raises(ValueError, match="start at token 2, expected 0"):
        take_request(tmp_path, "draftlab-a", 5)
    with pytest.raises(ValueError, match="0 tokens spooled of 4"):
        take_request(tmp_path, "draftlab-none", 4)


def test_a_capture_sglang_chose_differently_is_an_error_file(tmp_path, monkeypatch):
    hook, _ = armed_hook(tmp_path, monkeypatch, chosen=(1, 3, 4))
    assert "SGLang captures hidden_states[1, 3, 4]" in worker_error(tmp_path)
    assert hook.failed


def test_a_wrong_width_is_an_error_file_not_a_spool(tmp_path, monkeypatch):
    hook, inner = armed_hook(tmp_path, monkeypatch)
    final = torch.zeros(4, H)
    hook(inner, (None, None, batch(["draftlab-a", "draftlab-b"], [2, 2], [0, 0])), (final[:2], final.repeat(1, 3)))
    assert "DP attention" in worker_error(tmp_path)
    assert not list(tmp_path.glob("*.safetensors"))


def test_launch_line_keeps_the_users_flags_and_refuses_what_capture_cannot_do(tmp_path):
    plan = {"config_ids": [1, 29, 57], "layers": [2, 30, 58], "hidden_size": 7168, "architectures": ["X"]}
    cmd = capture_command("/m", plan, "--tp-size 8 --attention-backend triton", tmp_path, 31000)
    assert "--tp-size 8 --attention-backend triton --forward-hooks" in cmd and "--disable-radix-cache" in cmd
    for bad in ("--enable-dp-attention", "--pp-size 2", "--speculative-algorithm EAGLE3"):
        with pytest.raises(InputError, match=bad.split()[0]):
            capture_command("/m", plan, bad, tmp_path, 31000)
    assert "--pp-size 1" in capture_command("/m", plan, "--pp-size 1", tmp_path, 31000)


def test_the_client_waits_for_a_chunk_the_writer_thread_still_holds(tmp_path, monkeypatch):
    hook, inner = armed_hook(tmp_path, monkeypatch)
    gate, write = threading.Event(), hidden_hook.write_chunk
    monkeypatch.setattr(hidden_hook, "write_chunk", lambda *a: (gate.wait(10), write(*a))[1])
    final = torch.randn(4, H)
    assert hook(inner, (None, None, batch(["draftlab-a"], [4], [0])), (final, final.repeat(1, 3))) is final
    final.zero_()  # the model may reuse its memory once the hook returned: the spool holds a copy
    assert [p.name for p in tmp_path.iterdir()] == ["draftlab-a.000000000.safetensors.pending"]
    threading.Timer(0.2, gate.set).start()  # the answer came first; the file follows
    aux, got = take_request(tmp_path, "draftlab-a", 4)
    assert got.abs().sum() > 0 and torch.equal(aux, got.repeat(1, 3)) and not list(tmp_path.iterdir())


def test_a_spool_write_that_fails_is_an_error_file_not_a_wait(tmp_path, monkeypatch):
    hook, inner = armed_hook(tmp_path, monkeypatch)

    def full(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hidden_hook, "write_chunk", full)
    final = torch.zeros(2, H)
    hook(inner, (None, None, batch(["draftlab-a"], [2], [0])), (final, final.repeat(1, 3)))
    with pytest.raises(ValueError, match="0 tokens spooled of 2"):
        take_request(tmp_path, "draftlab-a", 2, timeout=30)
    assert "cannot write the spool: OSError" in worker_error(tmp_path) and hook.failed
