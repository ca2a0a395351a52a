"""Wheel surgery and packing for the bundle: a wheel rewritten without some of its files (zip and
RECORD, still a valid wheel), one tar of the wheels, and its split into parts."""

from __future__ import annotations

import base64
import csv
import fnmatch
import hashlib
import io
import json
import os
import shutil
import tarfile
import zipfile
from pathlib import Path

from draftlab.sglang.install import BundleError, sha256_file

SLIM_NOTE = "DRAFTLAB-SLIMMED.json"  # written into a slimmed wheel's .dist-info (listed in RECORD)


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _dist_info(names: list[str], wheel: Path) -> str:
    dirs = {
        n.split("/", 1)[0]
        for n in names
        if n.split("/", 1)[0].endswith(".dist-info") and n.endswith("/RECORD") and n.count("/") == 1
    }
    if len(dirs) != 1:
        raise BundleError(f"{wheel}: expected one .dist-info/RECORD, found {sorted(dirs) or 'none'}")
    return dirs.pop()


def slim_wheel(src: Path, dest: Path, patterns: list[str]) -> list[str]:
    """Write `dest`: the wheel `src` without the files matching `patterns` (fnmatch on the archive
    path; `*` crosses '/'), its RECORD without their rows, plus a note of what went (in RECORD too).
    Returns the removed paths; with none removed, dest is a copy of src."""
    src, dest = Path(src), Path(dest)
    with zipfile.ZipFile(src) as zin:
        names = zin.namelist()
        dist_info = _dist_info(names, src)
        record_name = f"{dist_info}/RECORD"
        removed = [
            n
            for n in names
            if not n.startswith(dist_info + "/")
            and not n.endswith("/")
            and any(fnmatch.fnmatchcase(n, p) for p in patterns)
        ]
        if not removed:
            if src.resolve() != dest.resolve():
                shutil.copy2(src, dest)
            return []
        gone = set(removed)
        rows = [row for row in csv.reader(io.StringIO(zin.read(record_name).decode("utf-8"))) if row]
        note_name = f"{dist_info}/{SLIM_NOTE}"
        note = (
            json.dumps(
                {
                    "source": src.name,
                    "source_sha256": sha256_file(src),
                    "removed": sorted(removed),
                    "by": "draftlab sglang bundle",
                },
                indent=1,
            ).encode()
            + b"\n"
        )
        tmp = dest.with_name(dest.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as zout:
            for info in zin.infolist():
                if info.filename in gone or info.filename in (record_name, note_name):
                    continue
                copy = zipfile.ZipInfo(info.filename, date_time=info.date_time)
                copy.compress_type, copy.external_attr = info.compress_type, info.external_attr
                copy.create_system, copy.file_size = info.create_system, info.file_size
                with zin.open(info) as fsrc, zout.open(copy, "w", force_zip64=info.file_size > (1 << 31)) as fdst:
                    shutil.copyfileobj(fsrc, fdst, 1 << 20)
            zout.writestr(
                zipfile.ZipInfo(note_name, date_time=(1980, 1, 1, 0, 0, 0)), note, compress_type=zipfile.ZIP_DEFLATED
            )
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            for row in rows:
                if row[0] in gone or row[0] in (record_name, note_name):
                    continue
                writer.writerow(row)
            writer.writerow([note_name, _record_hash(note), str(len(note))])
            writer.writerow([record_name, "", ""])
            zout.writestr(
                zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0)),
                out.getvalue().encode("utf-8"),
                compress_type=zipfile.ZIP_DEFLATED,
            )
        os.replace(tmp, dest)
    return sorted(removed)


def pack(wheels: list[Path], archive: Path, mtime: int) -> dict:
    """One uncompressed tar of the wheels under wheels/ (wheels are compressed already)."""
    with tarfile.open(archive, "w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(wheels, key=lambda p: p.name):
            info = tarfile.TarInfo("wheels/" + path.name)
            info.size = path.stat().st_size
            info.mtime = mtime
            info.mode = 0o644
            with open(path, "rb") as f:
                tar.addfile(info, f)
    return {"file": archive.name, "size": archive.stat().st_size, "sha256": sha256_file(archive)}


def split(path: Path, part_size: int, out_dir: Path, folder_pattern: str = "p{n}") -> list[dict]:
    """Cut `path` into parts of at most part_size bytes, part n into out_dir/<folder_pattern>/."""
    total = path.stat().st_size
    count = max(1, -(-total // part_size))
    width = max(3, len(str(count)))
    parts = []
    with open(path, "rb") as f:
        for n in range(1, count + 1):
            folder = folder_pattern.format(n=n)
            (out_dir / folder).mkdir(parents=True, exist_ok=True)
            name = f"{path.name}.part-{n:0{width}d}-of-{count:0{width}d}"
            target = out_dir / folder / name
            h, left = hashlib.sha256(), part_size
            with open(target, "wb") as g:
                while left > 0:
                    block = f.read(min(left, 1 << 20))
                    if not block:
                        break
                    g.write(block)
                    h.update(block)
                    left -= len(block)
            parts.append({"file": name, "folder": folder, "size": target.stat().st_size, "sha256": h.hexdigest()})
    return parts
