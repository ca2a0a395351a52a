"""ops.gpu_compile_cache: the compilers' caches sent back from one machine and restored on the next."""

import os
import time
from pathlib import Path

from ops import gpu_compile_cache
from ops.gpu_call import Call


def call_in(root: Path, repo: Path) -> Call:
    now = int(time.time())
    call = Call(
        out=root / "out",
        dl=root / "dl",
        site=root / "site",
        scratch=root / "scratch",
        t0=now,
        deadline=now + 60,
        repo=repo,
    )
    call.out.mkdir(parents=True)
    return call


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_a_cache_sent_back_is_restored_on_a_fresh_machine_and_kept_once(tmp_path):
    sender = call_in(tmp_path / "first", tmp_path / "repo")
    cache = sender.compile_cache
    (cache / "triton/abc").mkdir(parents=True)
    (cache / "triton/abc/kernel.cubin").write_bytes(os.urandom(2000))
    (cache / "inductor/fxgraph").mkdir(parents=True)
    (cache / "inductor/fxgraph/graph.py").write_text("x = 1\n")
    assert sender.environ()["TRITON_CACHE_DIR"] == str(cache / "triton")
    assert sender.environ()["TORCHINDUCTOR_CACHE_DIR"] == str(cache / "inductor")
    assert sender.environ()["SGLANG_CACHE_DIR"] == str(cache / "sglang")
    assert gpu_compile_cache.send(sender) == 0
    parts = sorted(sender.out.glob(gpu_compile_cache.PARTS + "*"))
    assert parts
    # here: the parts joined into the carried file, which the next session's repo copy holds
    carried = tmp_path / "repo" / gpu_compile_cache.CARRIED
    carried.parent.mkdir(parents=True)
    carried.write_bytes(b"".join(p.read_bytes() for p in parts))

    receiver = call_in(tmp_path / "second", tmp_path / "repo")
    (receiver.compile_cache / "triton").mkdir(parents=True)
    (receiver.compile_cache / "triton/mine").write_text("compiled here first")
    assert gpu_compile_cache.restore(receiver)
    restored = files(receiver.compile_cache)
    assert restored.pop(gpu_compile_cache.RESTORED) == b""
    assert restored.pop("triton/mine") == b"compiled here first"  # what the machine has is kept
    assert restored == files(cache)
    (receiver.compile_cache / "inductor/fxgraph/graph.py").write_text("x = 2\n")
    assert gpu_compile_cache.restore(receiver)  # once: the marker stops a second unpacking
    assert (receiver.compile_cache / "inductor/fxgraph/graph.py").read_text() == "x = 2\n"


def test_a_cache_too_large_for_what_the_call_returns_is_not_sent(tmp_path, monkeypatch):
    call = call_in(tmp_path, tmp_path / "repo")
    (call.compile_cache / "triton").mkdir(parents=True)
    (call.compile_cache / "triton/big.cubin").write_bytes(os.urandom(300_000))  # incompressible
    (call.out / "recipes.tar.gz").write_bytes(b"r" * 100)
    monkeypatch.setattr(gpu_compile_cache.gpu_pack, "OUT_BYTES", 200_000)
    monkeypatch.setattr(gpu_compile_cache, "OUT_MARGIN", 0)
    assert gpu_compile_cache.send(call) == 1
    assert sorted(p.name for p in call.out.iterdir()) == ["recipes.tar.gz"]  # no part left behind


def test_no_carried_cache_or_a_damaged_one_only_means_compiling_afresh(tmp_path, capsys):
    call = call_in(tmp_path, tmp_path / "repo")
    assert gpu_compile_cache.restore(call) and not call.compile_cache.exists()
    carried = tmp_path / "repo" / gpu_compile_cache.CARRIED
    carried.parent.mkdir(parents=True)
    carried.write_bytes(b"not an xz file")
    assert gpu_compile_cache.restore(call)
    assert "not restored" in capsys.readouterr().out
    assert not (call.compile_cache / gpu_compile_cache.RESTORED).exists()
