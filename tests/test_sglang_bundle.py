"""The offline SGLang bundle on the CPU, without a network: tiny real wheels written here (valid
METADATA, WHEEL and RECORD), resolved by pip from a local folder (`--no-index --find-links`),
slimmed, locked, split, staged over several "transfers", verified and installed with pip."""

from __future__ import annotations

import base64
import csv
import dataclasses
import hashlib
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from draftlab.sglang import bundle as B
from draftlab.sglang import install as I
from draftlab.sglang import profiles as P
from draftlab.sglang import wheels as W

LIB = str(Path(__file__).resolve().parents[1] / "lib")
PLATFORMS = B.manylinux_platforms("2.39")


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, files: dict, requires=(), tag="py3-none-any") -> Path:
    """A real wheel: the files, METADATA, WHEEL and a RECORD with every hash."""
    dist = name.replace("-", "_")
    info = f"{dist}-{version}.dist-info"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(
        f"Requires-Dist: {r}\n" for r in requires
    )
    pure = "true" if tag.endswith("none-any") else "false"
    contents = dict(files)
    contents[f"{info}/METADATA"] = meta.encode()
    contents[f"{info}/WHEEL"] = f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: {pure}\nTag: {tag}\n".encode()
    rows = [[p, _record_hash(d), str(len(d))] for p, d in contents.items()] + [[f"{info}/RECORD", "", ""]]
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    contents[f"{info}/RECORD"] = out.getvalue().encode()
    path = Path(folder) / f"{dist}-{version}-{tag}.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for p, d in contents.items():
            z.writestr(p, d)
    return path


def check_record(path: Path) -> dict:
    """Every file of the wheel is in RECORD with its hash and size, and every row names a file."""
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if not n.endswith("/")]
        record = next(n for n in names if n.endswith(".dist-info/RECORD"))
        rows = {r[0]: r for r in csv.reader(io.StringIO(z.read(record).decode())) if r}
        assert set(rows) == set(names), set(rows) ^ set(names)
        for n in names:
            if n == record:
                continue
            data = z.read(n)
            assert rows[n][1] == _record_hash(data), n
            assert rows[n][2] == str(len(data)), n
    return rows


@pytest.fixture(autouse=True)
def _pip_isolated(monkeypatch):
    """pip here is configured with a mirror and find-links: none of that in these tests."""
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    for var in (
        "PIP_FIND_LINKS",
        "PIP_INDEX_URL",
        "PIP_EXTRA_INDEX_URL",
        "PIP_CONSTRAINT",
        "PIP_NO_INDEX",
        "PIP_REQUIRE_VIRTUALENV",
        "PIP_TARGET",
        "PIP_PREFIX",
        "PYTHONPATH",
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(scope="module")
def index(tmp_path_factory) -> Path:
    """A local 'package index': an app named sglang and its small dependency tree."""
    d = tmp_path_factory.mktemp("index")
    make_wheel(
        d,
        "sglang",
        "0.0.1",
        {"sglang/__init__.py": b"__version__ = '0.0.1'\n"},
        requires=["beta>=2", "gamma", "sglang-kernel==0.0.1", "tr", "heavy"],
    )
    make_wheel(d, "beta", "1.0", {"beta/__init__.py": b"VERSION = '1.0'\n"})
    make_wheel(d, "beta", "2.0", {"beta/__init__.py": b"VERSION = '2.0'\n"})
    make_wheel(d, "gamma", "1.0", {"gamma/__init__.py": b""})
    make_wheel(d, "tr", "1.0", {"tr/__init__.py": b"VERSION = '1.0'\n"})
    make_wheel(d, "tr", "2.0", {"tr/__init__.py": b"VERSION = '2.0'\n"})
    make_wheel(d, "heavy", "1.0", {"heavy/__init__.py": b"", "heavy/blob.bin": os.urandom(50_000)})
    make_wheel(
        d,
        "sglang-kernel",
        "0.0.1",
        {
            "sgl_kernel/__init__.py": b"KERNEL = True\n",
            "sgl_kernel/flash_ops.abi3.so": os.urandom(300_000),
            "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so": os.urandom(20_000),
            "sgl_kernel/sm100/common_ops.abi3.so": os.urandom(30_000),
            "sgl_kernel/sm90/common_ops.abi3.so": os.urandom(120_000),
        },
    )
    make_wheel(d, "plat", "1.0", {"plat/__init__.py": b""}, tag="cp312-cp312-manylinux_2_28_x86_64")
    return d


def _opts(index: Path, out: Path, **kw) -> B.BundleOptions:
    base = dict(
        version="0.0.1",
        out=out,
        part_size=64 << 10,
        python_version="3.12",
        platforms=PLATFORMS,
        extras=["tr==1.0"],
        machine=frozenset({"gamma", "tr"}),
        machine_versions={"tr": "2.0"},
        drop_packages=["heavy"],
        index_args=["--no-index", "--find-links", str(index)],
    )
    base.update(kw)
    return B.BundleOptions(**base)


@pytest.fixture(scope="module")
def built(index, tmp_path_factory):
    """One bundle of the fake index, built once for the tests that read it."""
    out = tmp_path_factory.mktemp("bundle") / "b"
    return out, B.build_bundle(_opts(index, out))


def test_sizes_and_platforms():
    assert I.parse_size("55M") == 55 << 20 and I.parse_size("60MB") == 60_000_000
    assert I.parse_size("1.5K") == 1536 and I.parse_size("4096") == 4096
    for bad in ("", "12X", "-3M", "0"):
        with pytest.raises(I.BundleError):
            I.parse_size(bad)
    tags = B.manylinux_platforms("2.39")
    assert tags[0] == "manylinux_2_39_x86_64" and "manylinux_2_34_x86_64" in tags and "manylinux_2_5_x86_64" in tags
    assert {"manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64"} <= set(tags)
    assert not any(t.startswith("linux_") for t in tags)
    assert "manylinux_2_28_x86_64" not in B.manylinux_platforms("2.27")


def test_resolve_for_another_python_and_platform(index, tmp_path):
    args = ["--no-index", "--find-links", str(index)]
    found, report = B.resolve(
        ["sglang==0.0.1", "tr==1.0", "plat"],
        python_version="3.12",
        platforms=PLATFORMS,
        index_args=args,
        workdir=tmp_path,
    )
    versions = {r.name: r.version for r in found}
    assert versions == {
        "sglang": "0.0.1",
        "beta": "2.0",
        "gamma": "1.0",
        "tr": "1.0",
        "heavy": "1.0",
        "sglang-kernel": "0.0.1",
        "plat": "1.0",
    }
    assert report.is_file()
    plat = next(r for r in found if r.name == "plat")
    assert plat.filename == "plat-1.0-cp312-cp312-manylinux_2_28_x86_64.whl"
    # the same wheel is not for python 3.11 or an older glibc: pip's error comes back as one line
    with pytest.raises(I.BundleError, match="plat"):
        B.resolve(["plat"], python_version="3.11", platforms=PLATFORMS, index_args=args, workdir=tmp_path)
    with pytest.raises(I.BundleError, match="plat"):
        B.resolve(
            ["plat"], python_version="3.12", platforms=B.manylinux_platforms("2.17"), index_args=args, workdir=tmp_path
        )


def test_fetch_by_pip_download_checks_the_report_hash(index, tmp_path):
    args = ["--no-index", "--find-links", str(index)]
    found, _ = B.resolve(["beta==2.0"], python_version="3.12", platforms=PLATFORMS, index_args=args, workdir=tmp_path)
    kw = dict(python_version="3.12", platforms=PLATFORMS, index_args=args, log=tmp_path / "dl.log", copy_local=False)
    got = B.fetch(found, tmp_path / "dl", **kw)
    assert got["beta"].read_bytes() == (index / "beta-2.0-py3-none-any.whl").read_bytes()
    assert "pip" in (tmp_path / "dl.log").read_text() and "download" in (tmp_path / "dl.log").read_text()
    # reused from the folder when the hash matches; a report hash that does not match is an error
    assert B.fetch(found, tmp_path / "dl", **kw)["beta"] == got["beta"]
    forged = [dataclasses.replace(found[0], sha256="0" * 64)]
    with pytest.raises(I.BundleError, match=r"beta-2.0-py3-none-any.whl: sha256 .* differs from pip's report"):
        B.fetch(forged, tmp_path / "dl2", **kw)


def test_select_by_name_keep_and_drop():
    def r(name, version="1", requires=()):
        return B.Resolved(name, version, f"file:///x/{name}.whl", f"{name}.whl", None, False, list(requires))

    found = [r("app", requires=["np<2.4", "lib>=1"]), r("np", "2.3"), r("lib"), r("tr", "5.12"), r("big")]
    sel = B.select(
        found,
        machine=frozenset({"np", "tr", "lib"}),
        keep={"TR"},
        drop={"big": "unused"},
        machine_versions={"np": "2.5.2", "lib": "3.0"},
    )
    assert [x.name for x in sel.included] == ["app", "tr"]
    assert [x.name for x in sel.on_machine] == ["np", "lib"]
    assert [(x.name, why) for x, why in sel.dropped] == [("big", "unused")]
    # the machine's known np 2.5.2 breaks app's pin: said, not silently bundled
    assert len(sel.warnings) == 1 and "np<2.4" in sel.warnings[0] and "--keep np" in sel.warnings[0]


def test_slimmed_wheel_is_valid_and_installs(index, tmp_path):
    src = index / "sglang_kernel-0.0.1-py3-none-any.whl"
    dst = tmp_path / src.name
    removed = W.slim_wheel(src, dst, list(P.SGLANG_KERNEL_HEAVY))
    assert removed == [
        "sgl_kernel/flash_ops.abi3.so",
        "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so",
        "sgl_kernel/sm100/common_ops.abi3.so",
    ]
    rows = check_record(dst)
    assert not any(n in rows for n in removed)
    assert "sgl_kernel/sm90/common_ops.abi3.so" in rows
    with zipfile.ZipFile(dst) as z:
        note = json.loads(z.read(f"sglang_kernel-0.0.1.dist-info/{W.SLIM_NOTE}"))
    assert note["removed"] == removed and note["source_sha256"] == I.sha256_file(src)
    assert dst.stat().st_size < src.stat().st_size / 2
    target = tmp_path / "t"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--target", str(target), str(dst)],
        check=True,
    )
    assert (target / "sgl_kernel/sm90/common_ops.abi3.so").is_file()
    assert not (target / "sgl_kernel/flash_ops.abi3.so").exists() and not (target / "sgl_kernel/sm100").exists()
    # nothing matched: a plain copy
    assert W.slim_wheel(src, tmp_path / "copy.whl", ["nothing/*"]) == []
    assert (tmp_path / "copy.whl").read_bytes() == src.read_bytes()


def test_split_and_reassemble_byte_for_byte(tmp_path):
    data = os.urandom(1_000_003)
    src = tmp_path / "blob.tar"
    src.write_bytes(data)
    parts = W.split(src, 300_000, tmp_path / "out")
    assert [p["size"] for p in parts] == [300_000, 300_000, 300_000, 100_003]
    assert [p["folder"] for p in parts] == ["p1", "p2", "p3", "p4"]
    assert parts[0]["file"] == "blob.tar.part-001-of-004"
    joined = b"".join((tmp_path / "out" / p["folder"] / p["file"]).read_bytes() for p in parts)
    assert joined == data
    assert all(
        hashlib.sha256((tmp_path / "out" / p["folder"] / p["file"]).read_bytes()).hexdigest() == p["sha256"]
        for p in parts
    )
    exact = W.split(src, len(data), tmp_path / "one")
    assert len(exact) == 1 and exact[0]["size"] == len(data)


def test_bundle_lock(built):
    out, lock = built
    names = {w["name"]: w for w in lock["wheels"]}
    assert set(names) == {"sglang", "beta", "sglang-kernel", "tr"}
    assert names["beta"]["version"] == "2.0" and names["tr"]["version"] == "1.0"  # tr kept: an override
    assert lock["on_machine"] == {"gamma": "1.0"}
    assert [d["name"] for d in lock["dropped"]] == ["heavy"]
    assert "sgl_kernel/flash_ops.abi3.so" in names["sglang-kernel"]["removed_files"]
    for w in lock["wheels"]:
        path = out / "wheels" / w["file"]
        assert I.sha256_file(path) == w["sha256"] and path.stat().st_size == w["size"]
        check_record(path)
    assert len(lock["parts"]) >= 2 and all(p["size"] <= 64 << 10 for p in lock["parts"])
    assert sum(p["size"] for p in lock["parts"]) == lock["archive"]["size"]
    for p in lock["parts"]:  # each part travels in its own folder, with the lock beside it
        assert (out / p["folder"] / p["file"]).is_file()
        assert json.loads((out / p["folder"] / I.LOCK_NAME).read_text()) == lock
    lines = I.install_commands(lock, out, prefix="/tmp/x")
    assert len(lines) == len(lock["parts"]) and " stage " in lines[0] and lines[-1].endswith("--prefix /tmp/x")


def _dirs(out: Path, lock: dict) -> list[Path]:
    return [out / p["folder"] for p in lock["parts"]]


def test_install_over_several_transfers(built, tmp_path):
    out, lock = built
    dirs = _dirs(out, lock)
    stage, prefix = tmp_path / "stage", tmp_path / "prefix"
    present, missing = I.stage_parts(lock, dirs[:1], stage)
    assert len(present) == 1 and missing == [p["file"] for p in lock["parts"][1:]]
    # the install names what is missing, and leaves no prefix
    with pytest.raises(I.BundleError, match=lock["parts"][-1]["file"]) as e:
        I.install_bundle(lock, parts_dirs=[], stage=stage, prefix=prefix)
    assert "missing part" in str(e.value) and not prefix.exists()
    with pytest.raises(I.BundleError):
        I.server_env(prefix)
    # the other parts arrive in later calls
    I.stage_parts(lock, dirs[1:-1], stage)
    line = I.install_bundle(lock, parts_dirs=dirs[-1:], stage=stage, prefix=prefix)
    assert "installed" in line
    assert I.installed_bundle(prefix)["bundle"] == lock["archive"]["sha256"]
    assert (prefix / "sglang/__init__.py").is_file() and not (prefix / "sgl_kernel/flash_ops.abi3.so").exists()
    assert not (prefix / "heavy").exists() and not (prefix / "gamma").exists()
    assert not [p for p in tmp_path.iterdir() if ".installing-" in p.name]  # no work folder left
    env = I.server_env(prefix, base={"PYTHONPATH": "/elsewhere", "PATH": "/usr/bin"})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(prefix), "/elsewhere"]
    got = subprocess.run(
        [sys.executable, "-c", "import beta, tr, sglang, sgl_kernel; print(beta.VERSION, tr.VERSION)"],
        env=I.server_env(prefix),
        capture_output=True,
        text=True,
        check=True,
    )
    assert got.stdout.split() == ["2.0", "1.0"]
    # the same bundle again: nothing to do; another folder at the prefix is never clobbered
    assert "already installed" in I.install_bundle(lock, parts_dirs=[], stage=stage, prefix=prefix)
    other = tmp_path / "mine"
    other.mkdir()
    (other / "keep.txt").write_text("x")
    with pytest.raises(I.BundleError, match="holds no bundle install"):
        I.install_bundle(lock, parts_dirs=[], stage=stage, prefix=other)
    assert (other / "keep.txt").read_text() == "x"


def test_hash_failures_name_the_file(built, tmp_path):
    out, lock = built
    dirs = _dirs(out, lock)
    bad_dir = tmp_path / "bad"
    bad_dir.mkdir()
    part = lock["parts"][1]
    data = bytearray((out / part["folder"] / part["file"]).read_bytes())
    data[100] ^= 0xFF
    (bad_dir / part["file"]).write_bytes(bytes(data))
    stage = tmp_path / "stage"
    with pytest.raises(I.BundleError, match=rf"{part['file']}: sha256 .* differs from the lock"):
        I.stage_parts(lock, [bad_dir], stage)
    assert not (stage / part["file"]).exists()
    # a wheel whose hash is not the lock's (a lock edited after the build): refused before pip runs
    forged = json.loads(json.dumps(lock))
    forged["wheels"][0]["sha256"] = "0" * 64
    prefix = tmp_path / "prefix"
    with pytest.raises(I.BundleError, match=rf"{forged['wheels'][0]['file']}: sha256"):
        I.install_bundle(forged, parts_dirs=dirs, stage=tmp_path / "stage2", prefix=prefix)
    assert not prefix.exists()


def test_install_command_line_stdlib_only(built, tmp_path):
    """`python3 -m draftlab.sglang.install` with no site-packages at all: one-line errors, then installs."""
    out, lock = built
    dirs = _dirs(out, lock)
    stage, prefix = tmp_path / "stage", tmp_path / "prefix"
    env = dict(os.environ, PYTHONPATH=LIB)

    def run(*args):
        return subprocess.run(
            [sys.executable, "-S", "-m", "draftlab.sglang.install", *args], env=env, capture_output=True, text=True
        )

    first = run("stage", "--parts-dir", str(dirs[0]), "--stage", str(stage))
    assert first.returncode == 0 and "still missing" in first.stdout, first.stderr
    early = run("install", "--parts-dir", str(dirs[0]), "--stage", str(stage), "--prefix", str(prefix))
    assert early.returncode == 1 and not prefix.exists()
    assert early.stderr.count("\n") == 1 and lock["parts"][-1]["file"] in early.stderr
    args = ["install", "--stage", str(stage), "--prefix", str(prefix), "--python", sys.executable]
    for d in dirs:
        args += ["--parts-dir", str(d)]
    done = run(*args)
    assert done.returncode == 0, done.stderr
    assert I.installed_bundle(prefix) is not None
    shown = run("exec", "--prefix", str(prefix), "--", sys.executable, "-c", "import sglang; print(sglang.__version__)")
    assert shown.returncode == 0 and shown.stdout.strip() == "0.0.1"
    assert run("stage", "--parts-dir", str(tmp_path / "nowhere")).returncode == 1


def test_cli_bundle_with_cache_and_report(index, built, tmp_path, capsys):
    """`draftlab sglang bundle` end to end from the command line, reusing the first build's report
    and wheels: the same wheel hashes, and a rebuild over an earlier bundle folder."""
    from draftlab.cli import main

    first_out, first = built
    out = tmp_path / "again"
    argv = [
        "sglang",
        "bundle",
        "--version",
        "0.0.1",
        "--out",
        str(out),
        "--part-size",
        "100K",
        "--extra",
        "tr==1.0",
        "--drop-package",
        "heavy",
        "--no-index",
        "--find-links",
        str(index),
        "--cache",
        str(first_out / "downloads"),
        "--report",
        str(first_out / "resolve-report.json"),
        "--python-version",
        "3.12",
        "--machine-packages",
        str(_names(tmp_path, ["gamma", "tr==2.0"])),
    ]
    assert main(argv) == 0
    text = capsys.readouterr().out
    lock = json.loads((out / I.LOCK_NAME).read_text())
    assert {w["name"]: w["sha256"] for w in lock["wheels"]} == {w["name"]: w["sha256"] for w in first["wheels"]}
    assert "--parts-dir" in text and I.LOCK_NAME in text
    assert main(argv) == 0  # over the earlier bundle: replaced
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    assert main(argv[:5] + [str(tmp_path / "full")] + argv[6:]) == 1
    assert "not empty" in capsys.readouterr().err


def _names(tmp_path: Path, names: list[str]) -> Path:
    path = tmp_path / "machine.txt"
    path.write_text("# pip freeze of the target\n" + "\n".join(names) + "\n")
    return path


def test_default_profile_drops_only_unneeded_kernels():
    prof = P.PROFILES[P.DEFAULT_PROFILE]
    assert "sglang-kernel" in prof.drop_files
    # what SGLang imports on the triton path stays in
    for needed in (
        "sglang",
        "sglang-kernel",
        "flashinfer-python",
        "xgrammar",
        "sgl-deep-gemm",
        "ipython",
        "transformers",
        "tokenizers",
        "apache-tvm-ffi",
    ):
        assert needed not in prof.drop_packages
    assert set(P.SGLANG_EXTRAS["0.5.17"]) == {"transformers==5.12.1", "tokenizers==0.22.2"}


def test_a_machine_file_gives_names_and_pinned_versions(tmp_path):
    path = tmp_path / "machine.txt"
    path.write_text("# pip freeze there\nTorch==2.11.0\nnumpy==2.5.2  # pinned\ntyping_extensions\n")
    assert P.read_names(path) == {"torch", "numpy", "typing-extensions"}
    assert P.read_versions(path) == {"torch": "2.11.0", "numpy": "2.5.2"}
