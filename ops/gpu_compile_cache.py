"""The compilers' on-disk caches (Triton's kernels, Inductor's graphs, SGLang's record of its compiled prefill
graphs), carried from one session to the next.

Why: on a fresh machine the first compile is slow and a warm one is not (2026-12-03, the same H200 kind):
SGLang's target-prefill CUDA graphs took 53-64 s to capture cold and 6-9 s warm, and the compiled training's
first steps 87 s cold against 50 s after a resume on the same machine. Nothing on the GPU machine outlives the
session, so a call with SEND_COMPILE_CACHE=1 sends the caches back (OUT/compile-cache.tar.xz.part-N); here they
go to .device/compile-cache/ (cat the parts into compile-cache.tar.xz there), which ops/gpu/cargo.sh carries
with the rest of the cargo, and the next session's set-up unpacks it into the call's cache folder
(Call.compile_cache, where Call.environ points TRITON_CACHE_DIR, TORCHINDUCTOR_CACHE_DIR and SGLANG_CACHE_DIR;
the caches carried from 2026-12-03 lacked SGLang's, and its servers' capture stayed at ~70 s with them). A cache
that does not match the machine (another Triton, torch or GPU) is only a miss: the compilers key their entries by
them.
"""

from __future__ import annotations

import subprocess
import tarfile

from ops import gpu_pack
from ops.gpu_call import Call
from ops.gpu_pack import human, write_parts

CARRIED = ".device/compile-cache/compile-cache.tar.xz"  # in the repo copy, linked there by cargo.sh
RESTORED = ".restored"  # in Call.compile_cache: the carried cache is unpacked
PARTS = "compile-cache.tar.xz.part-"  # in OUT
OUT_MARGIN = 1024 * 1024  # the call's log still grows after the parts are written


def restore(call: Call) -> bool:
    """Unpack the carried cache into Call.compile_cache, once per machine (entries already there kept)."""
    carried, cache = call.repo / CARRIED, call.compile_cache
    if not carried.is_file() or (cache / RESTORED).is_file():
        return True
    cache.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(carried, "r:xz") as tar:
            for member in tar:
                if not (cache / member.name).exists():
                    tar.extract(member, cache, filter="data")
    except (OSError, tarfile.TarError) as exc:  # a damaged cache costs only the compile it would have saved
        call.say(f"compile cache: {carried} not restored ({exc}); compiling afresh")
        return True
    (cache / RESTORED).touch()
    call.say(f"compile cache: {human(carried.stat().st_size)} restored into {cache}")
    return True


def send(call: Call) -> int:
    """Call.compile_cache as OUT/compile-cache.tar.xz.part-N, if it fits beside what OUT already holds
    (else nothing is sent, and the log says why): 0 sent, 1 not."""
    cache = call.compile_cache
    if not cache.is_dir():
        call.say(f"compile cache: {cache} is empty; nothing to send")
        return 1
    held = [p for p in call.out.iterdir() if p.is_file() and not p.name.startswith(PARTS)]
    room = gpu_pack.OUT_BYTES - OUT_MARGIN - sum(p.stat().st_size for p in held)
    room = min(room, (gpu_pack.OUT_FILES - len(held)) * gpu_pack.PART_BYTES)
    tar = subprocess.Popen(
        ["tar", "-cf", "-", "--exclude", RESTORED, "-C", str(cache), "."],
        stdout=subprocess.PIPE,
    )
    xz = subprocess.Popen(["xz", "-T0", "-6", "-c"], stdin=tar.stdout, stdout=subprocess.PIPE)
    tar.stdout.close()
    parts = write_parts(xz.stdout, call.out / PARTS)
    ok = xz.wait() == 0 and tar.wait() == 0
    size = sum(p.stat().st_size for p in parts)
    if not ok or size > room:
        for part in parts:
            part.unlink()
        why = "tar or xz failed" if not ok else f"{human(size)} compressed, {human(max(room, 0))} of room in OUT"
        call.say(f"compile cache: not sent ({why})")
        return 1
    call.say(
        f"compile cache: {human(size)} in {len(parts)} parts (here: mkdir -p .device/compile-cache && "
        f"cat <files_at>/{PARTS}* > {CARRIED}; then ops/gpu/cargo.sh pack)"
    )
    return 0
