"""Install side of the offline SGLang bundle: standard library and pip only, so it runs on the GPU
machine before anything of draftlab's own is installed: `python3 -m draftlab.sglang.install
stage|install|exec ...` (the build side is draftlab.sglang.bundle).

  stage     copy the parts found in `--parts-dir` folders into a staging folder, checking each
            part's sha256; parts may arrive over several calls
  install   once every part of the lock is staged: reassemble, check the tar's and every wheel's
            sha256, `pip install --no-index --no-deps --no-compile --target` into a fresh folder and
            rename it to the prefix; a marker file written last says the prefix is complete
  exec      run a command with the prefix first on PYTHONPATH (what `server_env` returns)

Errors are one line naming the file, with a non-zero exit.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

LOCK_NAME = "sglang-bundle.lock.json"


DONE_MARKER = ".draftlab-sglang-bundle.json"


LOCK_FORMAT = 1


LOCK_KIND = "draftlab-sglang-bundle"


EXIT_ERROR = 1


EXIT_USAGE = 2


class BundleError(Exception):
    """A failure reported as one line (the message names the file or package at fault)."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


_UNITS = {
    "": 1,
    "B": 1,
    "K": 1 << 10,
    "KB": 10**3,
    "KIB": 1 << 10,
    "M": 1 << 20,
    "MB": 10**6,
    "MIB": 1 << 20,
    "G": 1 << 30,
    "GB": 10**9,
    "GIB": 1 << 30,
}


def parse_size(text: str) -> int:
    """'55M' = 55 MiB (K, M, G are binary; KB, MB, GB decimal; KiB, MiB, GiB binary)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    if not m or m.group(2).upper() not in _UNITS:
        raise BundleError(f"cannot read size {text!r} (examples: 55M, 60MB, 1G)")
    size = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if size <= 0:
        raise BundleError(f"size {text!r} must be positive")
    return size


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


def _say(*parts) -> None:
    print(*parts, flush=True)


def _warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr, flush=True)


def install_commands(lock: dict, out: Path, prefix: str | None = None, stage: str | None = None) -> list[str]:
    """The commands a machine without a network runs, one per transfer (part folder)."""
    try:
        shown = os.path.relpath(out.resolve(), Path.cwd())
        if shown.startswith(".."):
            shown = str(out)
    except ValueError:
        shown = str(out)
    prefix = prefix or default_prefix(lock)
    stage = stage or default_stage(lock)
    folders = []
    for p in lock["parts"]:
        if p["folder"] not in folders:
            folders.append(p["folder"])
    lines = []
    for i, folder in enumerate(folders):
        verb = "install" if i == len(folders) - 1 else "stage"
        tail = f" --prefix {prefix}" if verb == "install" else ""
        lines.append(
            f"PYTHONPATH=lib python3 -m draftlab.sglang.install {verb} "
            f"--parts-dir {shown}/{folder} --stage {stage}{tail}"
        )
    return lines


def _pip(python: str) -> list[str]:
    return [python, "-m", "pip", "--disable-pip-version-check"]


# --------------------------------------------------------------------------------------------
# Staging and installing
# --------------------------------------------------------------------------------------------


def default_prefix(lock: dict) -> str:
    return f"/tmp/sglang-{lock['sglang']}"


def default_stage(lock: dict) -> str:
    return f"/tmp/sglang-{lock['sglang']}-parts"


def load_lock(path: Path) -> dict:
    try:
        lock = json.loads(Path(path).read_text())
    except OSError as e:
        raise BundleError(f"{path}: cannot read the lock file ({e.strerror})")
    except ValueError as e:
        raise BundleError(f"{path}: not JSON ({e})")
    if not isinstance(lock, dict) or lock.get("kind") != LOCK_KIND or lock.get("format") != LOCK_FORMAT:
        raise BundleError(f"{path}: not a draftlab SGLang bundle lock (format {LOCK_FORMAT})")
    for key in ("wheels", "archive", "parts", "sglang"):
        if key not in lock:
            raise BundleError(f"{path}: the lock has no {key!r}")
    return lock


def find_lock(lock_path: Path | None, parts_dirs: list[Path], stage: Path | None) -> tuple[dict, Path]:
    if lock_path is not None:
        return load_lock(lock_path), Path(lock_path)
    for folder in [*parts_dirs, *([stage] if stage else [])]:
        candidate = Path(folder) / LOCK_NAME
        if candidate.is_file():
            return load_lock(candidate), candidate
    looked = ", ".join(str(p) for p in [*parts_dirs, *([stage] if stage else [])]) or "nowhere"
    raise BundleError(f"no {LOCK_NAME} in {looked}; give --lock")


def _copy_checked(src: Path, dst: Path, sha256: str, size: int) -> None:
    if src.stat().st_size != size:
        raise BundleError(f"{src}: {src.stat().st_size} bytes, the lock says {size}")
    tmp = dst.with_name(dst.name + ".tmp")
    h = hashlib.sha256()
    with open(src, "rb") as f, open(tmp, "wb") as g:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            g.write(block)
    if h.hexdigest() != sha256:
        tmp.unlink()
        raise BundleError(f"{src}: sha256 {h.hexdigest()} differs from the lock ({sha256})")
    os.replace(tmp, dst)


def stage_parts(lock: dict, parts_dirs: list[Path], stage: Path) -> tuple[list[str], list[str]]:
    """Copy each part of the lock found in parts_dirs into stage (sha256 checked); returns the
    parts staged now or before, and those still missing."""
    stage = Path(stage)
    stage.mkdir(parents=True, exist_ok=True)
    mine = stage / LOCK_NAME
    text = json.dumps(lock, indent=1) + "\n"
    if mine.exists():
        theirs = load_lock(mine)
        if theirs["archive"]["sha256"] != lock["archive"]["sha256"]:
            raise BundleError(
                f"{mine}: the staging folder holds another bundle "
                f"(archive {theirs['archive']['sha256'][:12]}); use another --stage or remove it"
            )
    else:
        mine.write_text(text)
    present, missing = [], []
    for part in lock["parts"]:
        name = part["file"]
        if "/" in name or name in ("", ".", ".."):
            raise BundleError(f"{mine}: bad part name {name!r}")
        target = stage / name
        if target.is_file() and target.stat().st_size == part["size"]:
            present.append(name)
            continue
        for folder in parts_dirs:
            src = Path(folder) / name
            if src.is_file():
                _copy_checked(src, target, part["sha256"], part["size"])
                present.append(name)
                break
        else:
            missing.append(name)
    return present, missing


def installed_bundle(prefix: Path) -> dict | None:
    """The marker of a complete install in prefix, or None."""
    try:
        return json.loads((Path(prefix) / DONE_MARKER).read_text())
    except (OSError, ValueError):
        return None


def _reassemble(lock: dict, stage: Path, wheels_dir: Path) -> list[Path]:
    """Parts -> tar (sha256 checked) -> wheels_dir (each wheel's sha256 checked)."""
    want = {w["file"]: w for w in lock["wheels"]}
    archive = stage / lock["archive"]["file"]
    h = hashlib.sha256()
    with open(archive, "wb") as g:
        for part in lock["parts"]:
            src = stage / part["file"]
            ph = hashlib.sha256()
            with open(src, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    ph.update(block)
                    h.update(block)
                    g.write(block)
            if ph.hexdigest() != part["sha256"]:
                archive.unlink()
                raise BundleError(f"{src}: sha256 {ph.hexdigest()} differs from the lock ({part['sha256']})")
    if h.hexdigest() != lock["archive"]["sha256"]:
        archive.unlink()
        raise BundleError(f"{archive}: sha256 of the reassembled parts differs from the lock")
    wheels_dir.mkdir(parents=True)
    seen = []
    try:
        with tarfile.open(archive, "r:") as tar:
            for member in tar:
                base = member.name[len("wheels/") :] if member.name.startswith("wheels/") else None
                if not member.isfile() or not base or "/" in base or base not in want:
                    raise BundleError(f"{archive}: unexpected member {member.name!r} (not a wheel of the lock)")
                dst = wheels_dir / base
                wh = hashlib.sha256()
                with tar.extractfile(member) as f, open(dst, "wb") as g:
                    for block in iter(lambda: f.read(1 << 20), b""):
                        wh.update(block)
                        g.write(block)
                if wh.hexdigest() != want[base]["sha256"]:
                    raise BundleError(f"{base}: sha256 {wh.hexdigest()} differs from the lock ({want[base]['sha256']})")
                seen.append(dst)
    finally:
        archive.unlink(missing_ok=True)
    lost = sorted(set(want) - {p.name for p in seen})
    if lost:
        raise BundleError(f"{archive}: wheels of the lock missing from the archive: {', '.join(lost)}")
    return seen


def install_bundle(
    lock: dict,
    *,
    parts_dirs: list[Path],
    stage: Path,
    prefix: Path,
    python: str = sys.executable,
    keep_parts: bool = True,
    force: bool = False,
) -> str:
    """Stage, check and install; returns a one-line summary. The prefix appears (by rename) only
    once pip finished and the marker is written; on any failure nothing is left at prefix."""
    prefix = Path(prefix).absolute()
    stage = Path(stage)
    bundle_id = lock["archive"]["sha256"]
    done = installed_bundle(prefix)
    if done and done.get("bundle") == bundle_id and not force:
        return f"{prefix}: SGLang {lock['sglang']} bundle {bundle_id[:12]} already installed"
    if done is None and prefix.exists() and (not prefix.is_dir() or any(prefix.iterdir())):
        raise BundleError(
            f"{prefix}: exists and holds no bundle install ({DONE_MARKER}); remove it or give another --prefix"
        )
    present, missing = stage_parts(lock, parts_dirs, stage)
    if missing:
        raise BundleError(
            f"missing part(s) {', '.join(missing)} ({len(present)} of {len(lock['parts'])} staged "
            f"in {stage}; looked in {', '.join(str(p) for p in parts_dirs) or 'no --parts-dir'})"
        )
    prefix.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.installing-", dir=prefix.parent))
    try:
        wheels = _reassemble(lock, stage, work / "wheels")
        target = work / "prefix"
        log = work / "pip-install.log"
        cmd = (
            _pip(python)
            + [
                "install",
                "--no-index",
                "--no-deps",
                "--no-compile",
                "--no-cache-dir",
                "--quiet",
                "--target",
                str(target),
            ]
            + [str(w) for w in sorted(wheels)]
        )
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # pip itself runs on the machine's own packages
        with open(log, "w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            lines = [l for l in log.read_text(errors="replace").splitlines() if l.strip()]
            errors = [l for l in lines if l.startswith("ERROR")] or lines[-1:] or [f"exit {proc.returncode}"]
            raise BundleError(f"pip install --target failed: {errors[-1].strip()}")
        marker = {
            "bundle": bundle_id,
            "sglang": lock["sglang"],
            "profile": lock.get("profile"),
            "wheels": [f"{w['name']}=={w['version']}" for w in lock["wheels"]],
            "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "python": sys.version.split()[0],
        }
        (target / DONE_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        old = None
        if prefix.exists() or prefix.is_symlink():
            old = work / "previous"
            os.replace(prefix, old)
        try:
            os.replace(target, prefix)
        except OSError:
            if old is not None:
                os.replace(old, prefix)
            raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if not keep_parts:
        for part in lock["parts"]:
            (stage / part["file"]).unlink(missing_ok=True)
    return (
        f"{prefix}: installed SGLang {lock['sglang']} ({len(lock['wheels'])} wheels, bundle {bundle_id[:12]}); "
        f"run the server with PYTHONPATH={prefix}"
    )


def server_env(prefix, base: dict | None = None, check: bool = True) -> dict:
    """The environment for the SGLang server process: prefix first on PYTHONPATH (and its bin/ on
    PATH). Everything else keeps the machine's packages. Raises BundleError when prefix holds no
    complete install (check=False skips that)."""
    prefix = Path(prefix).absolute()
    if check and installed_bundle(prefix) is None:
        raise BundleError(f"{prefix}: no complete SGLang bundle install (no {DONE_MARKER}); run the install first")
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join([str(prefix)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    if (prefix / "bin").is_dir():
        env["PATH"] = os.pathsep.join([str(prefix / "bin")] + [p for p in env.get("PATH", "").split(os.pathsep) if p])
    return env


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def add_stage_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--parts-dir",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="a folder holding some of the parts (repeatable; parts may arrive over several calls)",
    )
    ap.add_argument("--lock", type=Path, help=f"the lock file (default: {LOCK_NAME} in a --parts-dir or the stage)")
    ap.add_argument(
        "--stage", type=Path, help="staging folder that collects the parts (default /tmp/sglang-VERSION-parts)"
    )


def add_install_arguments(ap: argparse.ArgumentParser) -> None:
    add_stage_arguments(ap)
    ap.add_argument(
        "--prefix", type=Path, help="install folder (default /tmp/sglang-VERSION); replaced only on success"
    )
    ap.add_argument("--python", default=sys.executable, help="the interpreter whose pip installs (default: this one)")
    ap.add_argument("--drop-parts", action="store_true", help="delete the staged parts after a successful install")
    ap.add_argument("--force", action="store_true", help="reinstall even when the prefix holds this bundle")


def stage_main(args: argparse.Namespace) -> int:
    lock, _ = find_lock(args.lock, args.parts_dir, args.stage)
    stage = args.stage or Path(default_stage(lock))
    present, missing = stage_parts(lock, args.parts_dir, stage)
    state = "complete" if not missing else f"still missing: {', '.join(missing)}"
    _say(f"{stage}: {len(present)} of {len(lock['parts'])} part(s) staged; {state}")
    return 0


def install_main(args: argparse.Namespace) -> int:
    lock, _ = find_lock(args.lock, args.parts_dir, args.stage)
    stage = args.stage or Path(default_stage(lock))
    prefix = args.prefix or Path(default_prefix(lock))
    _say(
        install_bundle(
            lock,
            parts_dirs=args.parts_dir,
            stage=stage,
            prefix=prefix,
            python=args.python,
            keep_parts=not args.drop_parts,
            force=args.force,
        )
    )
    return 0


def exec_main(args: argparse.Namespace) -> int:
    command = list(args.command)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise BundleError("exec: give the command after --")
    env = server_env(args.prefix)
    return subprocess.call(command, env=env)


def add_exec_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--prefix", type=Path, required=True, help="an installed bundle prefix")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")


def run_guarded(func, args) -> int:
    """Run a subcommand; a BundleError becomes one line on stderr and exit 1."""
    try:
        return int(func(args) or 0)
    except BundleError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("error: interrupted", file=sys.stderr)
        return 130


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python3 -m draftlab.sglang.install",
        description="Install side of the offline SGLang bundle (standard library + pip).",
    )
    sub = ap.add_subparsers(dest="verb", required=True)
    p = sub.add_parser("stage", help="copy the parts at hand into the staging folder (hash-checked)")
    add_stage_arguments(p)
    p.set_defaults(func=stage_main)
    p = sub.add_parser("install", help="check every hash and install into a prefix, without a network")
    add_install_arguments(p)
    p.set_defaults(func=install_main)
    p = sub.add_parser("exec", help="run a command with the prefix first on PYTHONPATH")
    add_exec_arguments(p)
    p.set_defaults(func=exec_main)
    args = ap.parse_args(argv)
    return run_guarded(args.func, args)


if __name__ == "__main__":
    sys.exit(main())
