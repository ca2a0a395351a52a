"""ops/gpu/cargo.sh: what a session carries to the GPU machine, packed into chunks here and received there."""

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TRAIN = {
    ".device/a/part-aa": b"a" * 3000,
    ".device/b/part-ab": b"b" * 2000,
    ".device/b/model.gguf.sha256": b"x\n",
    ".whl/w.whl": b"w" * 500,
    ".device/drafts/eagle3/model.safetensors": b"d" * 1500,
}
SGLANG = {f".device/sglang/p{i}/part": b"s" * 1000 for i in range(1, 5)}
MORE_DRAFTS = {".device/drafts/fcnorm-lr1e-3/model.safetensors": b"f" * 1500}


def checkout(path: Path, files: dict[str, bytes]) -> Path:
    """A repository copy holding the script and these items."""
    (path / "ops/gpu").mkdir(parents=True)
    shutil.copy(ROOT / "ops/gpu/cargo.sh", path / "ops/gpu/cargo.sh")
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    return path


def cargo(repo: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "ops/gpu/cargo.sh", *args],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
    )


@pytest.mark.parametrize("kind", ["all", "train"])
def test_packed_chunks_received_in_any_order_give_back_the_items(tmp_path, kind):
    items = {**TRAIN, **SGLANG, **MORE_DRAFTS}
    here = checkout(tmp_path / "here", items)
    packed = cargo(here, "pack", "3K", **({"CARGO": kind} if kind != "all" else {}))
    assert packed.returncode == 0, packed.stderr
    chunks = sorted((here / ".device/cargo").iterdir())
    assert len(chunks) > 1
    there = checkout(tmp_path / "there", {})
    hold = str(tmp_path / "hold")
    for chunk in reversed(chunks):  # one chunk a call, in any order
        shutil.copytree(chunk, there / ".device/cargo" / chunk.name)
        received = cargo(there, "receive", CARGO_HOLD=hold)
        assert received.returncode == 0, received.stderr
        shutil.rmtree(there / ".device/cargo")
    assert "unpacked" in received.stdout
    expected = items if kind == "all" else TRAIN  # train: no SGLang bundle, only the reference draft
    for name, data in expected.items():
        assert (there / name).read_bytes() == data, name
    assert os.path.lexists(there / ".device/sglang") == (kind == "all")  # no dangling link either
    assert (there / ".device/drafts/fcnorm-lr1e-3").exists() == (kind == "all")


def test_a_missing_item_or_an_unknown_kind_is_refused(tmp_path):
    here = checkout(tmp_path, {k: v for k, v in TRAIN.items() if k != ".whl/w.whl"})
    missing = cargo(here, "pack", "3K", CARGO="train")
    assert missing.returncode == 1 and ".whl missing" in missing.stderr
    unknown = cargo(here, "pack", "3K", CARGO="sglang")
    assert unknown.returncode == 2 and "expected all, train or check" in unknown.stderr


@pytest.mark.parametrize("kind", ["all", "train"])
def test_a_compile_cache_sent_back_travels_with_either_kind(tmp_path, kind):
    cache = {".device/compile-cache/compile-cache.tar.xz": b"c" * 800}
    here = checkout(tmp_path / "here", {**TRAIN, **SGLANG, **cache})
    assert cargo(here, "pack", "3K", **({"CARGO": kind} if kind != "all" else {})).returncode == 0
    there = checkout(tmp_path / "there", {})
    for chunk in sorted((here / ".device/cargo").iterdir()):
        shutil.copytree(chunk, there / ".device/cargo" / chunk.name)
    received = cargo(there, "receive", CARGO_HOLD=str(tmp_path / "hold"))
    assert received.returncode == 0, received.stderr
    name = ".device/compile-cache/compile-cache.tar.xz"
    assert (there / ".device/compile-cache").is_symlink() and (there / name).read_bytes() == cache[name]


def test_the_gpu_machine_file_lists_its_torch_stack_with_the_pins_bundles_are_checked_against():
    """ops/gpu_machine_packages.txt, read as `draftlab sglang bundle --machine-packages` reads it."""
    from draftlab.sglang.profiles import read_names, read_versions

    path = ROOT / "ops/gpu_machine_packages.txt"
    assert {"torch", "triton", "numpy", "transformers"} <= read_names(path)
    assert read_versions(path)["torch"] == "2.11.0" and read_versions(path)["transformers"] == "5.17.0"
