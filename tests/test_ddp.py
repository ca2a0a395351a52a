"""DDP through torchrun: two gloo processes on the CPU (each accumulating 2 micro-batches under
no_sync) train the same draft as one process accumulating the same 4 micro-batches per step."""

import contextlib
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from draftlab.core.serve import free_port
from test_train import small_config, write_fixture


@pytest.mark.slow
def test_two_gloo_processes_match_one_process_with_accumulation(tmp_path):
    from draftlab.train_draft import find_checkpoint, train

    files = write_fixture(tmp_path / "regen", n_train=24, n_val=4)
    common = dict(epochs=1, save_every=100, eval_every=100, threads=1, batch_tokens=160)
    ddp_out = tmp_path / "ddp" / "eagle3"
    cfg = small_config(files, ddp_out, grad_accum=2, **common)
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--nnodes=1",
        f"--master_port={free_port()}",
        "-m",
        "draftlab.cli",
        "train",
    ]
    for k, v in vars(cfg).items():
        if k == "capture_layers":
            continue
        args += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "world 2" in proc.stdout
    ddp = load_file(str(find_checkpoint(ddp_out) / "draft.safetensors"))

    single = train(small_config(files, tmp_path / "one" / "eagle3", grad_accum=4, **common))
    ref = single["draft"].state_dict()
    assert int(find_checkpoint(ddp_out).name.split("-")[1]) == single["steps"] > 1
    for k, v in ref.items():
        assert torch.allclose(ddp[k].float(), v.float(), atol=1e-4), (k, (ddp[k].float() - v.float()).abs().max())


def _rank_pids(parent: int) -> dict[int, int]:
    """{rank: pid} of torchrun's worker processes (their RANK from /proc/<pid>/environ)."""
    from pathlib import Path

    kids = Path(f"/proc/{parent}/task/{parent}/children").read_text().split()
    out = {}
    for pid in map(int, kids):
        env = dict(v.split("=", 1) for v in Path(f"/proc/{pid}/environ").read_bytes().decode().split("\0") if "=" in v)
        if "RANK" in env:
            out[int(env["RANK"])] = pid
    return out


@pytest.mark.slow
def test_a_signal_to_one_rank_stops_both_at_the_same_step(tmp_path):
    """SIGTERM to rank 1 alone: the ranks agree every step, so rank 0 writes the checkpoint of the same step
    and both stop (a rank that stopped alone would leave the other waiting in a collective)."""
    import json
    import signal
    import time

    files = write_fixture(tmp_path / "regen", n_train=24, n_val=4)
    out = tmp_path / "ddp" / "eagle3"
    cfg = small_config(files, out, epochs=30, save_every=1000, eval_every=1000, threads=1, batch_tokens=160)
    args = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node=2",
        "--nnodes=1",
        f"--master_port={free_port()}",
        "-m",
        "draftlab.cli",
        "train",
    ]
    for k, v in vars(cfg).items():
        if k != "capture_layers":
            args += [f"--{k.replace('_', '-')}", str(v)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    t0 = time.time()
    while not ((out / "train.csv").is_file() and len((out / "train.csv").read_text().splitlines()) > 2):
        assert proc.poll() is None and time.time() - t0 < 300, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    ranks = _rank_pids(proc.pid)
    os.kill(ranks[1], signal.SIGTERM)
    try:
        _, stderr = proc.communicate(timeout=300)
    finally:  # a hung run must not outlive the test: torchrun, then its ranks
        if proc.poll() is None:
            for pid in [*ranks.values(), proc.pid]:
                with contextlib.suppress(ProcessLookupError):  # a rank that already exited
                    os.kill(pid, signal.SIGKILL)
    assert proc.returncode != 0
    assert "stopped by SIGTERM" in stderr, stderr[-3000:]
    step = int((out / "latest").read_text().strip().split("-")[1])
    summary = json.loads((out / "summary.json").read_text())
    assert 0 < step == summary["steps"] < summary["total_steps"] and not summary["finished"]


def test_a_signal_just_after_the_agreement_waits_for_the_next_step(monkeypatch):
    """The signal lands on this rank right after the all-reduce said no rank had one: this rank must answer
    what was agreed (go on, as the others do) and keep the signal for the next step's agreement."""
    from types import SimpleNamespace

    from draftlab.core.stop import StopRequest
    from draftlab.train_draft.loop import TrainingRun

    run = SimpleNamespace(world=2, device="cpu", stop=StopRequest("resume"), halted=False)

    def all_reduce_then_signal(tensor, op=None):  # no rank had one; then SIGTERM arrives here
        run.stop._handle(15, None)

    monkeypatch.setattr(torch.distributed, "all_reduce", all_reduce_then_signal)
    assert TrainingRun.stop_asked(run) is False and run.stop.requested == 15
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda tensor, op=None: None)
    assert TrainingRun.stop_asked(run) is True  # the next step's agreement carries it to every rank
