"""An offline SGLang bundle, build side: real wheels, resolved and fetched where a package index is
reachable (here or through `--find-links`); draftlab.sglang.install installs them where none is.

  resolve   `pip install --dry-run --report` for the GPU machine's python/platform (not this one's)
  select    drop what the GPU machine already has (by name; `--keep` overrides) and the packages the
            chosen backends never import (draftlab.sglang.profiles; `--drop-package` / `--keep`)
  fetch     each chosen wheel once, checked against the sha256 in pip's report
  slim      rewrite a wheel without some of its files (draftlab.sglang.wheels)
  pack      one tar of the wheels, split into parts of at most `--part-size` bytes, each part in its
            own folder with a copy of the lock file (sha256 of every wheel, of the tar, of each part)
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.sglang.install import (
    LOCK_FORMAT,
    LOCK_KIND,
    LOCK_NAME,
    BundleError,
    _pip,
    _say,
    _warn,
    human,
    normalize,
    sha256_file,
)
from draftlab.sglang.profiles import (
    DEFAULT_PROFILE,
    PROFILES,
    SGLANG_EXTRAS,
    SGLANG_KERNEL_HEAVY,
    machine_conflicts,
)
from draftlab.sglang.wheels import pack, slim_wheel, split


def manylinux_platforms(glibc: str = "2.39", arch: str = "x86_64") -> list[str]:
    """pip's --platform tags for a glibc: pip matches each tag exactly, so list every older one."""
    m = re.fullmatch(r"(\d+)\.(\d+)", glibc)
    if not m:
        raise BundleError(f"cannot read glibc version {glibc!r} (example: 2.39)")
    major, minor = int(m.group(1)), int(m.group(2))
    tags = [f"manylinux_{major}_{n}_{arch}" for n in range(minor, 4, -1)]
    for legacy, needs in (("manylinux2014", 17), ("manylinux2010", 12), ("manylinux1", 5)):
        if major == 2 and minor >= needs:
            tags.append(f"{legacy}_{arch}")
    return tags


def _target_args(python_version: str, platforms: list[str]) -> list[str]:
    args = ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp"]
    for tag in platforms:
        args += ["--platform", tag]
    return args


def _progress(total: int | None, desc: str):
    """A tqdm bar on stderr when tqdm is importable (build side only), else None."""
    if not total:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return tqdm(total=total, desc=desc, unit="wheel", file=sys.stderr, leave=False)


def _run_pip(cmd: list[str], log: Path, what: str, env: dict | None = None, count: int | None = None) -> None:
    """Run pip with its output in `log`; with `count`, a bar advances on each wheel pip saves."""
    bar = _progress(count, what)
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        proc = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True, errors="replace"
        )
        for line in proc.stdout:
            f.write(line)
            if bar is not None and line.lstrip().startswith(("Saved ", "File was already downloaded")):
                bar.update(1)
        proc.wait()
    if bar is not None:
        bar.close()
    if proc.returncode != 0:
        errors = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.startswith("ERROR")]
        detail = errors[-1] if errors else f"exit {proc.returncode}"
        raise BundleError(f"{what} failed: {detail} (full log: {log})")


@dataclass
class Resolved:
    name: str  # normalised
    version: str
    url: str
    filename: str
    sha256: str | None
    requested: bool
    requires: list


def read_report(path: Path) -> list[Resolved]:
    """The wheels a `pip install --dry-run --report` chose."""
    try:
        report = json.loads(Path(path).read_text())
        items = report["install"]
    except (OSError, ValueError, KeyError) as e:
        raise BundleError(f"{path}: not a pip installation report ({e})")
    out = []
    for it in items:
        meta, info = it["metadata"], it["download_info"]
        url = info["url"]
        filename = url.rsplit("/", 1)[-1].split("#", 1)[0]
        if not filename.endswith(".whl"):
            raise BundleError(f"{path}: {meta['name']} resolved to {filename}, not a wheel")
        hashes = (info.get("archive_info") or {}).get("hashes") or {}
        sha = hashes.get("sha256")
        if sha is None and (info.get("archive_info") or {}).get("hash", "").startswith("sha256="):
            sha = info["archive_info"]["hash"].split("=", 1)[1]
        out.append(
            Resolved(
                normalize(meta["name"]),
                meta["version"],
                url,
                filename,
                sha,
                bool(it.get("requested")),
                list(meta.get("requires_dist") or []),
            )
        )
    return out


def resolve(
    requirements: list[str],
    *,
    python_version: str,
    platforms: list[str],
    index_args: list[str] = (),
    python: str = sys.executable,
    workdir: Path,
    env: dict | None = None,
) -> tuple[list[Resolved], Path]:
    """Resolve for the target (not this interpreter) with pip's resolver; returns the report's wheels.

    index_args choose where pip looks (e.g. ["--no-index", "--find-links", DIR]); empty means pip
    as configured. pip 23 takes --platform with --dry-run only together with --target (it writes
    nothing there).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / "resolve-report.json"
    report.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="draftlab-resolve-") as target:
        cmd = (
            _pip(python)
            + ["install", "--dry-run", "--ignore-installed", "--target", target, "--report", str(report)]
            + _target_args(python_version, platforms)
            + list(index_args)
            + list(requirements)
        )
        _run_pip(cmd, workdir / "pip-resolve.log", "resolution (" + " ".join(requirements) + ")", env)
    return read_report(report), report


@dataclass
class Selection:
    included: list  # Resolved
    on_machine: list  # Resolved, left out: the machine has the name
    dropped: list  # (Resolved, why)
    warnings: list


def select(
    resolved: list[Resolved],
    *,
    machine: frozenset,
    keep: set,
    drop: dict,
    python_version: str = "3.12",
    machine_versions: dict | None = None,
) -> Selection:
    """Leave out what the machine has (by name) and what `drop` names, unless `keep` names it."""
    keep = {normalize(k) for k in keep}
    drop = {normalize(k): why for k, why in drop.items()}
    included, on_machine, dropped = [], [], []
    for r in resolved:
        if r.name in keep:
            included.append(r)
        elif r.name in machine:
            on_machine.append(r)
        elif r.name in drop:
            dropped.append((r, drop[r.name]))
        else:
            included.append(r)
    names = {r.name for r in resolved}
    warnings = [f"--keep {k}: pip did not resolve {k}" for k in sorted(keep - names)]
    warnings += machine_conflicts(included, on_machine, python_version, machine_versions or {})
    return Selection(included, on_machine, dropped, warnings)


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.unlink(missing_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _file_url_path(url: str) -> Path | None:
    if not url.startswith("file:"):
        return None
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(url).path))


def fetch(
    items: list[Resolved],
    dest: Path,
    *,
    cache_dirs: list[Path] = (),
    python: str = sys.executable,
    python_version: str = "3.12",
    platforms: list[str] = (),
    index_args: list[str] = (),
    log: Path,
    env: dict | None = None,
    copy_local: bool = True,
) -> dict[str, Path]:
    """Each wheel into dest, by the report's file name: from dest or a cache folder when its sha256
    matches, from a file:// location (copy_local), else with `pip download --no-deps` of the
    report's URL. Every file is then checked against the report's sha256."""
    dest.mkdir(parents=True, exist_ok=True)
    got, wanted = {}, []
    for r in items:
        target = dest / r.filename
        for folder in [dest, *cache_dirs]:
            candidate = Path(folder) / r.filename
            if candidate.is_file() and (r.sha256 is None or sha256_file(candidate) == r.sha256):
                if candidate != target:
                    _link_or_copy(candidate, target)
                got[r.name] = target
                break
        else:
            local = _file_url_path(r.url) if copy_local else None
            if local is not None and local.is_file():
                shutil.copy2(local, target)
                got[r.name] = target
            else:
                wanted.append(r)
    if wanted:
        total = len(wanted)
        _say(f"downloading {total} wheel(s) with pip (log: {log})")
        reqs = [f"{r.name} @ {r.url}" for r in wanted]
        cmd = (
            _pip(python)
            + ["download", "--no-deps", "--progress-bar", "off", "-d", str(dest)]
            + _target_args(python_version, list(platforms))
            + list(index_args)
            + reqs
        )
        _run_pip(cmd, log, f"download of {total} wheel(s)", env, count=total)
        for r in wanted:
            target = dest / r.filename
            if not target.is_file():
                raise BundleError(f"{target}: pip download did not produce it ({r.name} {r.version})")
            got[r.name] = target
    for r in items:
        if r.sha256 is not None:
            digest = sha256_file(got[r.name])
            if digest != r.sha256:
                raise BundleError(f"{got[r.name]}: sha256 {digest} differs from pip's report ({r.sha256})")
    return got


@dataclass
class BundleOptions:
    version: str = "0.5.17"
    out: Path = Path("sglang-bundle")
    part_size: int = 55 << 20
    python_version: str = "3.12"
    platforms: list = field(default_factory=lambda: manylinux_platforms("2.39"))
    profile: str = DEFAULT_PROFILE
    drop_flash_ops: bool | None = None  # None: the profile decides
    drop_packages: list = field(default_factory=list)
    drop_files: list = field(default_factory=list)  # "name:glob"
    keep: list = field(default_factory=list)
    extras: list | None = None  # None: SGLANG_EXTRAS[version]
    machine: frozenset = frozenset()  # what the target machine has (--machine-packages); none: bundle all
    machine_versions: dict = field(default_factory=dict)
    index_args: list = field(default_factory=list)
    cache_dirs: list = field(default_factory=list)
    report: Path | None = None  # reuse a pip report instead of resolving
    python: str = sys.executable
    env: dict | None = None  # environment of the pip runs (None: this one)


def _prepare_out(out: Path) -> None:
    if out.exists() and any(out.iterdir()) and not (out / LOCK_NAME).exists():
        raise BundleError(f"{out}: not empty and holds no {LOCK_NAME}; give an empty or earlier bundle folder")
    out.mkdir(parents=True, exist_ok=True)
    old = out / LOCK_NAME
    if old.exists():
        try:
            folders = {p["folder"] for p in json.loads(old.read_text()).get("parts", [])}
        except (ValueError, KeyError, TypeError):
            folders = set()
        for folder in folders:
            if folder and "/" not in folder and folder not in (".", ".."):
                shutil.rmtree(out / folder, ignore_errors=True)
        shutil.rmtree(out / "wheels", ignore_errors=True)
        old.unlink()


def build_bundle(opts: BundleOptions) -> dict:
    """Resolve, select, fetch, slim, pack and split; writes the lock and returns it."""
    if opts.profile not in PROFILES:
        raise BundleError(f"unknown profile {opts.profile!r} (known: {', '.join(PROFILES)})")
    profile = PROFILES[opts.profile]
    out = Path(opts.out)
    _prepare_out(out)
    extras = list(SGLANG_EXTRAS.get(opts.version, []) if opts.extras is None else opts.extras)
    requirements = [f"sglang=={opts.version}", *extras]
    keep = {normalize(re.split(r"[\s=<>!~@;\[]", e, 1)[0]) for e in extras} | {normalize(k) for k in opts.keep}

    drop = dict(profile.drop_packages)
    drop.update({normalize(n): "--drop-package" for n in opts.drop_packages})
    drop_files = {normalize(k): list(v) for k, v in profile.drop_files.items()}
    if opts.drop_flash_ops is False:
        drop_files.pop("sglang-kernel", None)
    elif opts.drop_flash_ops:
        drop_files.setdefault("sglang-kernel", []).extend(
            p for p in SGLANG_KERNEL_HEAVY if p not in drop_files.get("sglang-kernel", [])
        )
    for spec in opts.drop_files:
        name, sep, pattern = spec.partition(":")
        if not sep or not name or not pattern:
            raise BundleError(f"--drop-files {spec!r}: write PACKAGE:GLOB (e.g. sglang-kernel:sgl_kernel/sm100/*)")
        drop_files.setdefault(normalize(name), []).append(pattern)

    if opts.report is not None:
        resolved, report = read_report(opts.report), Path(opts.report)
        if Path(opts.report).resolve() != (out / "resolve-report.json").resolve():
            shutil.copy2(opts.report, out / "resolve-report.json")
        _say(f"using pip report {opts.report}: {len(resolved)} wheels")
    else:
        _say(
            f"resolving {' '.join(requirements)} for cp{opts.python_version.replace('.', '')} "
            f"{opts.platforms[0] if opts.platforms else ''} (log: {out / 'pip-resolve.log'})"
        )
        resolved, report = resolve(
            requirements,
            python_version=opts.python_version,
            platforms=opts.platforms,
            index_args=opts.index_args,
            python=opts.python,
            workdir=out,
            env=opts.env,
        )
        _say(f"pip resolved {len(resolved)} wheels")
    found = {r.name for r in resolved}
    if normalize("sglang") not in found:
        raise BundleError(f"{report}: the resolution holds no sglang")
    sel = select(
        resolved,
        machine=opts.machine,
        keep=keep,
        drop=drop,
        python_version=opts.python_version,
        machine_versions=opts.machine_versions,
    )
    for name in sorted(set(drop_files) - {r.name for r in sel.included}):
        sel.warnings.append(f"--drop-files {name}: {name} is not in the bundle")
    for w in sel.warnings:
        _warn(w)

    downloads = out / "downloads"
    originals = fetch(
        sel.included,
        downloads,
        cache_dirs=[Path(c) for c in opts.cache_dirs],
        python=opts.python,
        python_version=opts.python_version,
        platforms=opts.platforms,
        index_args=opts.index_args,
        log=out / "pip-download.log",
        env=opts.env,
    )
    wheels_dir = out / "wheels"
    wheels_dir.mkdir(parents=True, exist_ok=True)
    entries = []
    for r in sorted(sel.included, key=lambda r: r.name):
        src = originals[r.name]
        dst = wheels_dir / r.filename
        patterns = drop_files.get(r.name, [])
        removed = slim_wheel(src, dst, patterns) if patterns else []
        if not removed:
            _link_or_copy(src, dst)
        elif patterns:
            _say(
                f"slimmed {r.filename}: {human(src.stat().st_size)} -> {human(dst.stat().st_size)} "
                f"({len(removed)} files removed)"
            )
        entry = {
            "name": r.name,
            "version": r.version,
            "file": dst.name,
            "size": dst.stat().st_size,
            "sha256": sha256_file(dst),
            "source": {"url": r.url, "sha256": r.sha256 or sha256_file(src), "size": src.stat().st_size},
        }
        if removed:
            entry["removed_files"] = removed
        entries.append(entry)

    created = int(time.time())
    archive_path = out / f"sglang-{opts.version}-bundle.tar"
    archive = pack([wheels_dir / e["file"] for e in entries], archive_path, created)
    parts = split(archive_path, opts.part_size, out)
    archive_path.unlink()
    lock = {
        "format": LOCK_FORMAT,
        "kind": LOCK_KIND,
        "sglang": opts.version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        "target": {"python_version": opts.python_version, "implementation": "cp", "platforms": list(opts.platforms)},
        "requirements": requirements,
        "profile": opts.profile,
        "profile_description": profile.description,
        "wheels": entries,
        "on_machine": {r.name: r.version for r in sorted(sel.on_machine, key=lambda r: r.name)},
        "dropped": [
            {"name": r.name, "version": r.version, "why": why}
            for r, why in sorted(sel.dropped, key=lambda x: x[0].name)
        ],
        "warnings": sel.warnings,
        "archive": archive,
        "part_size": opts.part_size,
        "parts": parts,
    }
    text = json.dumps(lock, indent=1) + "\n"
    (out / LOCK_NAME).write_text(text)
    for folder in {p["folder"] for p in parts}:
        (out / folder / LOCK_NAME).write_text(text)
    return lock
