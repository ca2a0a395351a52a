"""An offline SGLang bundle: real wheels, resolved and fetched where a package index is reachable,
installed with hash checks where none is.

Build side (needs pip and a package index, here or through `--find-links`):
  resolve   `pip install --dry-run --report` for the GPU machine's python/platform (not this one's)
  select    drop what the GPU machine already has (by name; `--keep` overrides) and the packages the
            chosen backends never import (a profile; `--drop-package` / `--keep` adjust it)
  fetch     each chosen wheel once, checked against the sha256 in pip's report
  slim      rewrite a wheel without some of its files (zip and RECORD), still a valid wheel
  pack      one tar of the wheels, split into parts of at most `--part-size` bytes, each part in its
            own folder with a copy of the lock file (sha256 of every wheel, of the tar, of each part)

Install side (standard library and pip only, so it runs on the GPU machine before anything of
draftlab's own is installed): `python3 -m draftlab.sglang.bundle stage|install|exec ...`
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
import base64
import csv
import fnmatch
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

LOCK_NAME = "sglang-bundle.lock.json"
DONE_MARKER = ".draftlab-sglang-bundle.json"
SLIM_NOTE = "DRAFTLAB-SLIMMED.json"  # written into a slimmed wheel's .dist-info (listed in RECORD)
LOCK_FORMAT = 1
LOCK_KIND = "draftlab-sglang-bundle"
EXIT_ERROR = 1
EXIT_USAGE = 2

# The GPU machine's Python packages, by name (/work/.library/device/KINDS.md, "Python packages
# already there", as read on 2026-11-17). A bundle leaves these out unless `--keep` names them.
GPU_MACHINE_PACKAGES = frozenset(re.sub(r"[-_.]+", "-", n).lower() for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch
build certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage
cuda-bindings cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops
equinox etils execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio
h11 h5py hf-xet httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig
interface-meta jax jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver
lazy-loader lightning lightning-utilities linear-operator lineax llvmlite lxml markdown
markdown-it-py markupsafe matplotlib mdurl meson ml-dtypes mpi4py mpmath msgpack multidict
multipledispatch mypy-extensions nanobind narwhals networkx ninja numba numba-cuda numpy numpyro
nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft
nvidia-cufile nvidia-curand nvidia-cusolver nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py
nvidia-nccl-cu13 nvidia-nvjitlink nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime
onnxscript opencv-python-headless optax opt-einsum opt-einsum-fx optimistix orbax-checkpoint
packaging pandas pathspec patsy peft pillow pip pluggy portalocker prometheus-client propcache
protobuf psutil pyarrow pybind11 py-cpuinfo pygments pyparsing pyproject-hooks pyre-extensions
pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout pytest-xdist python-dateutil
pytorch-lightning pyyaml regex requests rich sacrebleu safetensors scikit-build-core scikit-image
scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools shellingham simplejson six
sortedcontainers statsmodels sympy tabulate tensorboard tensorboard-data-server tensorstore
threadpoolctl tifffile tiktoken timm tokenizers toolz torch torchaudio torchdiffeq torch-geometric
torchmetrics torchvision tqdm transformers treescope triton typer typing-extensions typing-inspect
urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl zipp
""".split())

# Versions seen there (KINDS.md's pip-list row, python3 3.12.3): used only to warn when a bundled
# package's pin excludes the machine's version of a package the bundle leaves out.
GPU_MACHINE_VERSIONS = {
    "accelerate": "1.15.0", "huggingface-hub": "1.33.0", "numpy": "2.5.2", "safetensors": "0.8.0",
    "sentencepiece": "0.2.2", "tiktoken": "0.14.0", "tokenizers": "0.23.2", "torch": "2.11.0",
    "torchaudio": "2.11.0", "torchvision": "0.26.0", "transformers": "5.17.0", "triton": "3.6.0",
}

# Extra requirements per SGLang release, resolved together with it (and always bundled, even where
# the machine has the name): SGLang 0.5.17 fails at import under transformers 5.17 (AutoConfig
# "'qwen3_asr' is already used"); it pins transformers==5.12.1, which needs tokenizers<=0.23.0.
SGLANG_EXTRAS = {
    "0.5.17": ["transformers==5.12.1", "tokenizers==0.22.2"],
}

SGLANG_KERNEL_HEAVY = (
    "sgl_kernel/flash_ops.*",   # FlashAttention 3 (--attention-backend fa3), 1.1 GB unpacked
    "sgl_kernel/infllm_ops.*",  # InfLLM-V2 sparse attention
    "sgl_kernel/sm100/*",       # common ops for GPUs other than sm90 (Hopper loads sm90/)
)


@dataclass(frozen=True)
class Profile:
    """What a set of server flags never imports: whole packages, and files inside kept wheels."""

    description: str
    drop_packages: dict = field(default_factory=dict)   # name -> why
    drop_files: dict = field(default_factory=dict)      # name -> glob patterns inside the wheel


_NOT_SM90 = "kernels for other attention backends or GPUs than triton on sm90"
PROFILES = {
    "triton-sm90": Profile(
        description="one Hopper GPU (sm90), --attention-backend triton --sampling-backend pytorch "
                    "--grammar-backend none: no FA3/FA4, CuTe DSL, TileLang or Blackwell MLA kernels, "
                    "no pip CUDA compiler (the machine has nvcc 13.0)",
        drop_packages={
            "tokenspeed-mla": "Blackwell-only MLA kernels (imported only when find_spec finds it on sm100)",
            "tokenspeed-triton": "Triton fork used only by tokenspeed-mla",
            "nvidia-cutlass-dsl": "CuTe DSL (FA4, quack, flashinfer's cute-dsl kernels); " + _NOT_SM90,
            "nvidia-cutlass-dsl-libs-base": "CuTe DSL runtime libraries",
            "nvidia-cutlass-dsl-libs-core": "CuTe DSL runtime libraries",
            "nvidia-cutlass-dsl-libs-cu12": "CuTe DSL runtime libraries (CUDA 12)",
            "nvidia-cutlass-dsl-libs-cu13": "CuTe DSL runtime libraries (CUDA 13)",
            "flash-attn-4": "FlashAttention 4 (CuTe DSL); " + _NOT_SM90,
            "quack-kernels": "CuTe DSL kernels; " + _NOT_SM90,
            "tilelang": "TileLang kernels (DeepSeek sparse attention); " + _NOT_SM90,
            "z3-solver": "needed only by tilelang",
            "nvidia-mathdx": "cuBLASDx headers for JIT load-balancing kernels (expert parallelism)",
            "nvidia-cuda-nvcc": "pip CUDA compiler (humming-kernels[cu13] extra); the machine has nvcc 13.0",
            "nvidia-nvvm": "part of the pip CUDA compiler",
            "nvidia-cuda-crt": "part of the pip CUDA compiler",
            "nvidia-cuda-cccl": "CUDA C++ headers for the pip CUDA compiler; the machine's CUDA has them",
            "nvidia-cuda-nvdisasm": "disassembler needed by the CuTe DSL; the machine has nvdisasm",
            "py-spy": "stack dumps of hung schedulers (a debugging aid, run as a program)",
            "torchcodec": "video decoding for multimodal models (imported under try)",
        },
        drop_files={"sglang-kernel": list(SGLANG_KERNEL_HEAVY)},
    ),
    "full": Profile(description="everything pip resolves that the machine lacks"),
}
DEFAULT_PROFILE = "triton-sm90"


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


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 10 ** 3, "KIB": 1 << 10, "M": 1 << 20, "MB": 10 ** 6,
          "MIB": 1 << 20, "G": 1 << 30, "GB": 10 ** 9, "GIB": 1 << 30}


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


# --------------------------------------------------------------------------------------------
# Build side: resolve, select, fetch, slim, pack
# --------------------------------------------------------------------------------------------

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


def _pip(python: str) -> list[str]:
    return [python, "-m", "pip", "--disable-pip-version-check"]


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
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True,
                                errors="replace")
        for line in proc.stdout:
            f.write(line)
            if bar is not None and line.lstrip().startswith(("Saved ", "File was already downloaded")):
                bar.update(1)
        proc.wait()
    if bar is not None:
        bar.close()
    if proc.returncode != 0:
        errors = [line.strip() for line in log.read_text(errors="replace").splitlines()
                  if line.startswith("ERROR")]
        detail = errors[-1] if errors else f"exit {proc.returncode}"
        raise BundleError(f"{what} failed: {detail} (full log: {log})")


@dataclass
class Resolved:
    name: str            # normalised
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
        out.append(Resolved(normalize(meta["name"]), meta["version"], url, filename, sha,
                            bool(it.get("requested")), list(meta.get("requires_dist") or [])))
    return out


def resolve(requirements: list[str], *, python_version: str, platforms: list[str],
            index_args: list[str] = (), python: str = sys.executable, workdir: Path,
            env: dict | None = None) -> tuple[list[Resolved], Path]:
    """Resolve for the target (not this interpreter) with pip's resolver; returns the report's wheels.

    index_args choose where pip looks (e.g. ["--no-index", "--find-links", DIR]); empty means pip
    as configured. pip 23 takes --platform with --dry-run only together with --target (it writes
    nothing there).
    """
    workdir.mkdir(parents=True, exist_ok=True)
    report = workdir / "resolve-report.json"
    report.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="draftlab-resolve-") as target:
        cmd = (_pip(python) + ["install", "--dry-run", "--ignore-installed", "--target", target,
                               "--report", str(report)]
               + _target_args(python_version, platforms) + list(index_args) + list(requirements))
        _run_pip(cmd, workdir / "pip-resolve.log", "resolution (" + " ".join(requirements) + ")", env)
    return read_report(report), report


@dataclass
class Selection:
    included: list            # Resolved
    on_machine: list          # Resolved, left out: the machine has the name
    dropped: list             # (Resolved, why)
    warnings: list


def _requirement_tools():
    try:
        from packaging.markers import default_environment
        from packaging.requirements import Requirement
        from packaging.version import Version
    except ImportError:  # pip always carries a copy
        try:
            from pip._vendor.packaging.markers import default_environment
            from pip._vendor.packaging.requirements import Requirement
            from pip._vendor.packaging.version import Version
        except ImportError:
            return None
    return Requirement, Version, default_environment


def machine_conflicts(bundled: list[Resolved], left_out: list[Resolved], python_version: str,
                      machine_versions: dict) -> list[str]:
    """Pins of the bundled packages that exclude a version the machine is known to have of a
    package the bundle leaves out (the machine's own packages' pins are the machine's affair)."""
    tools = _requirement_tools()
    if tools is None:
        return []
    Requirement, Version, default_environment = tools
    env = dict(default_environment())
    env.update(python_version=python_version, python_full_version=python_version + ".0",
               sys_platform="linux", platform_system="Linux", platform_machine="x86_64",
               implementation_name="cpython", platform_python_implementation="CPython", extra="")
    names = {r.name for r in left_out if r.name in machine_versions}
    found = []
    for pkg in bundled:
        for text in pkg.requires:
            try:
                req = Requirement(text)
            except Exception:
                continue
            name = normalize(req.name)
            if name not in names or not req.specifier:
                continue
            if req.marker is not None and not req.marker.evaluate(env):
                continue
            have = machine_versions[name]
            if not req.specifier.contains(Version(have), prereleases=True):
                found.append(f"{pkg.name} {pkg.version} needs {name}{req.specifier} but the GPU machine "
                             f"has {name} {have}; not bundled (pass --keep {name} to bundle it)")
    return found


def select(resolved: list[Resolved], *, machine: frozenset, keep: set, drop: dict,
           python_version: str = "3.12", machine_versions: dict | None = None) -> Selection:
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


def fetch(items: list[Resolved], dest: Path, *, cache_dirs: list[Path] = (), python: str = sys.executable,
          python_version: str = "3.12", platforms: list[str] = (), index_args: list[str] = (),
          log: Path, env: dict | None = None, copy_local: bool = True) -> dict[str, Path]:
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
        cmd = (_pip(python) + ["download", "--no-deps", "--progress-bar", "off", "-d", str(dest)]
               + _target_args(python_version, list(platforms)) + list(index_args) + reqs)
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


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _dist_info(names: list[str], wheel: Path) -> str:
    dirs = {n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".dist-info")
            and n.endswith("/RECORD") and n.count("/") == 1}
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
        removed = [n for n in names if not n.startswith(dist_info + "/") and not n.endswith("/")
                   and any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        if not removed:
            if src.resolve() != dest.resolve():
                shutil.copy2(src, dest)
            return []
        gone = set(removed)
        rows = [row for row in csv.reader(io.StringIO(zin.read(record_name).decode("utf-8"))) if row]
        note_name = f"{dist_info}/{SLIM_NOTE}"
        note = json.dumps({"source": src.name, "source_sha256": sha256_file(src),
                           "removed": sorted(removed), "by": "draftlab sglang bundle"},
                          indent=1).encode() + b"\n"
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
            zout.writestr(zipfile.ZipInfo(note_name, date_time=(1980, 1, 1, 0, 0, 0)), note,
                          compress_type=zipfile.ZIP_DEFLATED)
            out = io.StringIO()
            writer = csv.writer(out, lineterminator="\n")
            for row in rows:
                if row[0] in gone or row[0] in (record_name, note_name):
                    continue
                writer.writerow(row)
            writer.writerow([note_name, _record_hash(note), str(len(note))])
            writer.writerow([record_name, "", ""])
            zout.writestr(zipfile.ZipInfo(record_name, date_time=(1980, 1, 1, 0, 0, 0)),
                          out.getvalue().encode("utf-8"), compress_type=zipfile.ZIP_DEFLATED)
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


def read_names(path: Path) -> frozenset:
    """Package names from a file: one a line, `pip freeze`/`pip list` lines too (# comments)."""
    names = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or set(line) <= {"-", " "} or line.lower().startswith("package "):
            continue
        names.add(normalize(re.split(r"[\s=<>!~@;\[]", line, 1)[0]))
    return frozenset(names)


@dataclass
class BundleOptions:
    version: str = "0.5.17"
    out: Path = Path("sglang-bundle")
    part_size: int = 55 << 20
    python_version: str = "3.12"
    platforms: list = field(default_factory=lambda: manylinux_platforms("2.39"))
    profile: str = DEFAULT_PROFILE
    drop_flash_ops: bool | None = None        # None: the profile decides
    drop_packages: list = field(default_factory=list)
    drop_files: list = field(default_factory=list)  # "name:glob"
    keep: list = field(default_factory=list)
    extras: list | None = None                # None: SGLANG_EXTRAS[version]
    machine: frozenset = GPU_MACHINE_PACKAGES
    machine_versions: dict = field(default_factory=lambda: dict(GPU_MACHINE_VERSIONS))
    index_args: list = field(default_factory=list)
    cache_dirs: list = field(default_factory=list)
    report: Path | None = None                # reuse a pip report instead of resolving
    python: str = sys.executable
    env: dict | None = None                   # environment of the pip runs (None: this one)


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
            p for p in SGLANG_KERNEL_HEAVY if p not in drop_files.get("sglang-kernel", []))
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
        _say(f"resolving {' '.join(requirements)} for cp{opts.python_version.replace('.', '')} "
             f"{opts.platforms[0] if opts.platforms else ''} (log: {out / 'pip-resolve.log'})")
        resolved, report = resolve(requirements, python_version=opts.python_version, platforms=opts.platforms,
                                   index_args=opts.index_args, python=opts.python, workdir=out, env=opts.env)
        _say(f"pip resolved {len(resolved)} wheels")
    found = {r.name for r in resolved}
    if normalize("sglang") not in found:
        raise BundleError(f"{report}: the resolution holds no sglang")
    sel = select(resolved, machine=opts.machine, keep=keep, drop=drop,
                 python_version=opts.python_version, machine_versions=opts.machine_versions)
    for name in sorted(set(drop_files) - {r.name for r in sel.included}):
        sel.warnings.append(f"--drop-files {name}: {name} is not in the bundle")
    for w in sel.warnings:
        _warn(w)

    downloads = out / "downloads"
    originals = fetch(sel.included, downloads, cache_dirs=[Path(c) for c in opts.cache_dirs],
                      python=opts.python, python_version=opts.python_version, platforms=opts.platforms,
                      index_args=opts.index_args, log=out / "pip-download.log", env=opts.env)
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
            _say(f"slimmed {r.filename}: {human(src.stat().st_size)} -> {human(dst.stat().st_size)} "
                 f"({len(removed)} files removed)")
        entry = {"name": r.name, "version": r.version, "file": dst.name, "size": dst.stat().st_size,
                 "sha256": sha256_file(dst),
                 "source": {"url": r.url, "sha256": r.sha256 or sha256_file(src), "size": src.stat().st_size}}
        if removed:
            entry["removed_files"] = removed
        entries.append(entry)

    created = int(time.time())
    archive_path = out / f"sglang-{opts.version}-bundle.tar"
    archive = pack([wheels_dir / e["file"] for e in entries], archive_path, created)
    parts = split(archive_path, opts.part_size, out)
    archive_path.unlink()
    lock = {
        "format": LOCK_FORMAT, "kind": LOCK_KIND, "sglang": opts.version,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
        "target": {"python_version": opts.python_version, "implementation": "cp", "platforms": list(opts.platforms)},
        "requirements": requirements, "profile": opts.profile, "profile_description": profile.description,
        "wheels": entries,
        "on_machine": {r.name: r.version for r in sorted(sel.on_machine, key=lambda r: r.name)},
        "dropped": [{"name": r.name, "version": r.version, "why": why}
                    for r, why in sorted(sel.dropped, key=lambda x: x[0].name)],
        "warnings": sel.warnings,
        "archive": archive, "part_size": opts.part_size, "parts": parts,
    }
    text = json.dumps(lock, indent=1) + "\n"
    (out / LOCK_NAME).write_text(text)
    for folder in {p["folder"] for p in parts}:
        (out / folder / LOCK_NAME).write_text(text)
    return lock


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
        lines.append(f"PYTHONPATH=lib python3 -m draftlab.sglang.bundle {verb} "
                     f"--parts-dir {shown}/{folder} --stage {stage}{tail}")
    return lines


# --------------------------------------------------------------------------------------------
# Install side: standard library and pip only
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
            raise BundleError(f"{mine}: the staging folder holds another bundle "
                              f"(archive {theirs['archive']['sha256'][:12]}); use another --stage or remove it")
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
                base = member.name[len("wheels/"):] if member.name.startswith("wheels/") else None
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


def install_bundle(lock: dict, *, parts_dirs: list[Path], stage: Path, prefix: Path,
                   python: str = sys.executable, keep_parts: bool = True, force: bool = False) -> str:
    """Stage, check and install; returns a one-line summary. The prefix appears (by rename) only
    once pip finished and the marker is written; on any failure nothing is left at prefix."""
    prefix = Path(prefix).absolute()
    stage = Path(stage)
    bundle_id = lock["archive"]["sha256"]
    done = installed_bundle(prefix)
    if done and done.get("bundle") == bundle_id and not force:
        return f"{prefix}: SGLang {lock['sglang']} bundle {bundle_id[:12]} already installed"
    if done is None and prefix.exists() and (not prefix.is_dir() or any(prefix.iterdir())):
        raise BundleError(f"{prefix}: exists and holds no bundle install ({DONE_MARKER}); remove it or give another --prefix")
    present, missing = stage_parts(lock, parts_dirs, stage)
    if missing:
        raise BundleError(f"missing part(s) {', '.join(missing)} ({len(present)} of {len(lock['parts'])} staged "
                          f"in {stage}; looked in {', '.join(str(p) for p in parts_dirs) or 'no --parts-dir'})")
    prefix.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{prefix.name}.installing-", dir=prefix.parent))
    try:
        wheels = _reassemble(lock, stage, work / "wheels")
        target = work / "prefix"
        log = work / "pip-install.log"
        cmd = _pip(python) + ["install", "--no-index", "--no-deps", "--no-compile", "--no-cache-dir",
                              "--quiet", "--target", str(target)] + [str(w) for w in sorted(wheels)]
        env = dict(os.environ)
        env.pop("PYTHONPATH", None)  # pip itself runs on the machine's own packages
        with open(log, "w") as f:
            proc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env)
        if proc.returncode != 0:
            lines = [l for l in log.read_text(errors="replace").splitlines() if l.strip()]
            errors = [l for l in lines if l.startswith("ERROR")] or lines[-1:] or [f"exit {proc.returncode}"]
            raise BundleError(f"pip install --target failed: {errors[-1].strip()}")
        marker = {"bundle": bundle_id, "sglang": lock["sglang"], "profile": lock.get("profile"),
                  "wheels": [f"{w['name']}=={w['version']}" for w in lock["wheels"]],
                  "installed": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                  "python": sys.version.split()[0]}
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
    return (f"{prefix}: installed SGLang {lock['sglang']} ({len(lock['wheels'])} wheels, bundle {bundle_id[:12]}); "
            f"run the server with PYTHONPATH={prefix}")


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
# Command line (install side runs as `python3 -m draftlab.sglang.bundle`)
# --------------------------------------------------------------------------------------------

def add_stage_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--parts-dir", action="append", default=[], type=Path, metavar="DIR",
                    help="a folder holding some of the parts (repeatable; parts may arrive over several calls)")
    ap.add_argument("--lock", type=Path, help=f"the lock file (default: {LOCK_NAME} in a --parts-dir or the stage)")
    ap.add_argument("--stage", type=Path, help="staging folder that collects the parts (default /tmp/sglang-VERSION-parts)")


def add_install_arguments(ap: argparse.ArgumentParser) -> None:
    add_stage_arguments(ap)
    ap.add_argument("--prefix", type=Path, help="install folder (default /tmp/sglang-VERSION); replaced only on success")
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
    _say(install_bundle(lock, parts_dirs=args.parts_dir, stage=stage, prefix=prefix, python=args.python,
                        keep_parts=not args.drop_parts, force=args.force))
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
    ap = argparse.ArgumentParser(prog="python3 -m draftlab.sglang.bundle",
                                 description="Install side of the offline SGLang bundle (standard library + pip).")
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
