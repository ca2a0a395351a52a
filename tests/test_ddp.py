"""DDP through torchrun: two gloo processes on the CPU (each accumulating 2 micro-batches under
no_sync) train the same draft as one process accumulating the same 4 micro-batches per step."""

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


@pytest.mark.slow
def test_two_ranks_stop_at_the_same_step_by_rank_0s_clock(tmp_path):
    """stop_at under torchrun: the ranks ask rank 0 every log_every steps and stop together (a rank that
    stopped alone would leave the other waiting in a collective until the timeout)."""
    import json
    import time

    files = write_fixture(tmp_path / "regen", n_train=24, n_val=4)
    out = tmp_path / "ddp" / "eagle3"
    cfg = small_config(
        files,
        out,
        epochs=2,
        save_every=100,
        eval_every=100,
        threads=1,
        batch_tokens=160,
        log_every=2,
        stop_at=time.time() - 1,
    )
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
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (out / "latest").read_text().strip() == "ckpt-0000002"  # the first step rank 0 was asked at
    assert not json.loads((out / "summary.json").read_text())["finished"]
