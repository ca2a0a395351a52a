"""What a GPU call sends back in OUT: the state a cold machine resumes from, the draft, the packed run.

    state-run.tar.xz (or .part-0, .part-1, ... of 15 MiB)   the run without weights or checkpoints
    draft-eagle3.tar.part-N                                 the exported draft, for analysis here (send_tree)
    reference.tar.gz, summary.json                          results/reference for the commit
A call carries at most 64 MiB in and brings files back in parts of 15 MiB.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
from fnmatch import fnmatch
from pathlib import Path

from draftlab.run import summary
from ops.gpu_call import Call
from ops.gpu_steps import stage_done

PART_BYTES = 15 * 1024 * 1024
OUT_FILES, OUT_BYTES = 8, 64 * 1024 * 1024  # what a call brings back at most (the device's limits)
# never in the state: weights, checkpoints, token and hidden-state caches, TensorBoard logs
STATE_EXCLUDES = (
    "*.safetensors",
    "ckpt-*",
    ".ckpt-*",
    "{run_id}/drafts",
    "{run_id}/scaling/eagle*",
    "{run_id}/scaling/train_shuffled.jsonl",
    "tokens",
    "hidden",
    "tb",
    ".restored",
)
# once 03 is done its work shards repeat its jsonl
REGEN_DONE_EXCLUDES = ("*.work", "{run_id}/data/regen/work")
PACKED_FILES = ("params.yaml", "metrics.json", "summary.json", "README.md")  # each required
PACKED_FOLDERS = ("figures", "executed")  # required
PACKED_EXTRAS = ("bench", "run_notes.md")  # when there (run.summary puts run_notes.md in README.md)


def human(n: int) -> str:
    """Bytes as du -h writes them (512, 1.5M, 12M)."""
    x, units = float(n), ["", "K", "M", "G"]
    while x >= 1024 and len(units) > 1:
        x, units = x / 1024, units[1:]
    return str(n) if units[0] == "" else (f"{x:.1f}{units[0]}" if x < 10 else f"{x:.0f}{units[0]}")


def xz_copy(src: Path, dst: Path, check: bool = False) -> int:
    """src compressed into dst (xz -9 on every core): how a regenerated set comes back; xz's exit code."""
    with open(dst, "wb") as out:
        return subprocess.run(["xz", "-T0", "-9", "-c", str(src)], stdout=out, check=check).returncode


def tar_gz_without(src: Path, arcname: str, out: Path, excludes) -> None:
    """src as arcname in out (gzip), without any path whose part matches one of the patterns (tar's --exclude)."""

    def keep(info: tarfile.TarInfo):
        return None if any(fnmatch(part, p) for part in Path(info.name).parts for p in excludes) else info

    with tarfile.open(out, "w:gz") as tar:
        tar.add(src, arcname=arcname, filter=keep)


def write_parts(stream, prefix: Path, size: int | None = None) -> list[Path]:
    """Copy a binary stream into prefix0, prefix1, ... of `size` bytes each (split -b -d; PART_BYTES)."""
    parts, size = [], size or PART_BYTES
    while chunk := stream.read(size):
        parts.append(prefix.with_name(f"{prefix.name}{len(parts)}"))
        parts[-1].write_bytes(chunk)
    return parts


def state_excludes(call: Call) -> list[str]:
    patterns = STATE_EXCLUDES + (REGEN_DONE_EXCLUDES if stage_done(call.run, "03") else ())
    return [p.format(run_id=call.run_id) for p in patterns]


def save_state(call: Call) -> int:
    """What a cold machine needs to resume: run data and results, no weights, no checkpoints."""
    if not call.run.is_dir():
        return 0
    call.out.mkdir(parents=True, exist_ok=True)
    for old in call.out.glob("state-run.tar.xz*"):
        old.unlink()
    whole = call.out / "state-run.tar.xz"
    tar_argv = [
        "tar",
        "-cf",
        "-",
        "-C",
        str(call.results),
        *(f"--exclude={p}" for p in state_excludes(call)),
        call.run_id,
    ]
    with open(whole, "wb") as out:
        tar = subprocess.Popen(tar_argv, stdout=subprocess.PIPE)
        xz = subprocess.run(["xz", "-T0", "-6"], stdin=tar.stdout, stdout=out)
        tar.stdout.close()
        rc = tar.wait() or xz.returncode
    if whole.stat().st_size > PART_BYTES:
        with open(whole, "rb") as f:
            write_parts(f, call.out / "state-run.tar.xz.part-")
        whole.unlink()
    total = sum(p.stat().st_size for p in call.out.glob("state-run.tar.xz*"))
    call.say(
        f"state for a cold start: {human(total)} in {call.out} (copy to .device/state/ if the next call starts cold)"
    )
    return rc


def send_tree(call: Call, parent: Path, name: str, prefix: str) -> int:
    """parent/name (a path inside parent) as one tar stream in 15 MiB parts, OUT/<prefix>.tar.part-N:
    how a draft (bf16, ~29 MB) comes back, since one returned file holds at most 16 MiB."""
    call.out.mkdir(parents=True, exist_ok=True)
    tar = subprocess.Popen(["tar", "-cf", "-", "-C", str(parent), name], stdout=subprocess.PIPE)
    parts = write_parts(tar.stdout, call.out / f"{prefix}.tar.part-")
    rc = tar.wait()
    call.say(
        f"{prefix}: {len(parts)} parts in {call.out} (here: cat <files_at>/{prefix}.tar.part-* | tar -xf - -C DEST)"
    )
    return rc


def save_draft(call: Call, arch: str = "eagle3") -> int:
    """The run's exported draft: for analysis here, never committed."""
    if not (call.run / "drafts" / arch / "model.safetensors").is_file():
        return 0
    return send_tree(call, call.run / "drafts", arch, f"draft-{arch}")


def pack_reference(call: Call) -> int:
    """results/reference for the commit (no weights, no data): OUT/reference.tar.gz and summary.json."""
    try:
        rc = summary.main([str(call.run)])
    except SystemExit as exc:  # a summary override without its source
        print(exc, flush=True)
        rc = 1
    if rc != 0:
        return 1
    pack = call.dl / "pack"
    stage = pack / call.run_id
    shutil.rmtree(pack, ignore_errors=True)
    stage.mkdir(parents=True)
    try:
        for name in PACKED_FILES:
            shutil.copyfile(call.run / name, stage / name)
        for name in PACKED_FOLDERS:
            shutil.copytree(call.run / name, stage / name)
    except OSError as exc:
        print(f"pack: {exc}", flush=True)
        return 1
    for name in PACKED_EXTRAS:
        src = call.run / name
        if src.is_dir():
            shutil.copytree(src, stage / name)
        elif src.is_file():
            shutil.copyfile(src, stage / name)
    call.out.mkdir(parents=True, exist_ok=True)
    out = call.out / "reference.tar.gz"
    with tarfile.open(out, "w:gz") as tar:
        tar.add(stage, arcname=call.run_id)
    shutil.copyfile(call.run / "summary.json", call.out / "summary.json")
    with tarfile.open(out) as tar:
        members = tar.getmembers()
    call.say(f"packed: {human(out.stat().st_size)} ({len(members)} entries)")
    for m in members:
        print(m.size, m.name + ("/" if m.isdir() else ""))
    return 0


def report(call: Call) -> None:
    call.say("stages done: " + "".join(f"{nb} " for nb in call.stages if stage_done(call.run, nb)))
    try:
        subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.used,memory.total", "--format=csv,noheader"],
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        pass
