"""`draftlab sglang bundle|stage|install|exec`: the offline SGLang bundle from the command line.

`bundle` runs where a package index is reachable; `stage`, `install` and `exec` are the install
side, also runnable without draftlab's dependencies as `python3 -m draftlab.sglang.install ...`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from draftlab.sglang import bundle as B
from draftlab.sglang import install as I
from draftlab.sglang import profiles as P


def add_sglang_parser(subparsers) -> argparse.ArgumentParser:
    ap = subparsers.add_parser(
        "sglang",
        help="an offline SGLang bundle: build it here, install it on a machine without a network",
        description="Build a bundle of real SGLang wheels for another machine's python/platform "
        "(bundle), then collect its parts and install them there without a network "
        "(stage, install), and run the server with the bundle first on PYTHONPATH (exec).",
    )
    sub = ap.add_subparsers(dest="sglang_command", required=True)

    p = sub.add_parser(
        "bundle",
        help="resolve, download, slim, lock and split an SGLang bundle",
        description="Exit 0 when the bundle is written, 1 on a failure (one line naming it).",
    )
    p.add_argument("--version", default="0.5.17", help="SGLang release (default 0.5.17, pinned to torch 2.11.0)")
    p.add_argument("--out", type=Path, required=True, help="bundle folder (empty, or an earlier bundle to replace)")
    p.add_argument(
        "--part-size", default="55M", help="largest part (default 55M = 55 MiB; K/M/G binary, KB/MB/GB decimal)"
    )
    p.add_argument("--python-version", default="3.12", help="the target's python (default 3.12)")
    p.add_argument("--glibc", default="2.39", help="the target's glibc: allows manylinux_2_N up to it (default 2.39)")
    p.add_argument(
        "--platform",
        action="append",
        default=[],
        metavar="TAG",
        help="exact pip platform tags instead of those from --glibc (repeatable)",
    )
    p.add_argument(
        "--profile",
        default=P.DEFAULT_PROFILE,
        choices=sorted(P.PROFILES),
        help=f"what the chosen backends never import (default {P.DEFAULT_PROFILE}: "
        f"{P.PROFILES[P.DEFAULT_PROFILE].description})",
    )
    p.add_argument(
        "--drop-flash-ops",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="drop sgl_kernel's FA3 flash_ops, infllm_ops and sm100/ from sglang-kernel "
        "(default: as the profile says; on in triton-sm90)",
    )
    p.add_argument(
        "--drop-package", action="append", default=[], metavar="NAME", help="leave a package out (repeatable)"
    )
    p.add_argument(
        "--drop-files",
        action="append",
        default=[],
        metavar="NAME:GLOB",
        help="remove files matching GLOB from the wheel of NAME (repeatable)",
    )
    p.add_argument(
        "--keep",
        action="append",
        default=[],
        metavar="NAME",
        help="bundle NAME even where the machine has it or the profile drops it (repeatable)",
    )
    p.add_argument(
        "--extra",
        action="append",
        default=None,
        metavar="REQ",
        help="extra requirement resolved with SGLang and always bundled (repeatable; default for "
        "0.5.17: " + " ".join(P.SGLANG_EXTRAS["0.5.17"]) + ")",
    )
    p.add_argument("--no-extras", action="store_true", help="no extra requirements")
    p.add_argument(
        "--machine-packages",
        type=Path,
        metavar="FILE",
        help="what the target machine already has (`pip freeze` there, or one name a line): left out of the "
        "bundle; without it everything resolved is bundled",
    )
    p.add_argument(
        "--find-links",
        action="append",
        default=[],
        metavar="DIR_OR_URL",
        help="extra place for pip to find wheels (repeatable)",
    )
    p.add_argument("--no-index", action="store_true", help="pip uses no package index (only --find-links)")
    p.add_argument(
        "--pip-arg", action="append", default=[], metavar="ARG", help="one more argument for pip (repeatable)"
    )
    p.add_argument(
        "--cache",
        action="append",
        default=[],
        type=Path,
        metavar="DIR",
        help="folder of wheels downloaded before; reused when the sha256 matches (repeatable)",
    )
    p.add_argument("--report", type=Path, help="reuse this pip --report JSON instead of resolving")
    p.add_argument("--prefix", help="install prefix named in the printed commands (default /tmp/sglang-VERSION)")
    p.set_defaults(func=bundle_main)

    p = sub.add_parser(
        "stage",
        help="copy the parts at hand into a staging folder (sha256 checked)",
        description="Exit 0 with the parts still missing named; 1 on a bad part.",
    )
    I.add_stage_arguments(p)
    p.set_defaults(func=lambda a: I.run_guarded(I.stage_main, a))

    p = sub.add_parser(
        "install",
        help="check every hash and install the bundle into a prefix, without a network",
        description="Exit 0 once installed; 1 on a missing or bad part or a failed pip (one line).",
    )
    I.add_install_arguments(p)
    p.set_defaults(func=lambda a: I.run_guarded(I.install_main, a))

    p = sub.add_parser("exec", help="run a command with an installed bundle first on PYTHONPATH")
    I.add_exec_arguments(p)
    p.set_defaults(func=lambda a: I.run_guarded(I.exec_main, a))
    return ap


def _options(args: argparse.Namespace) -> B.BundleOptions:
    index_args = []
    if args.no_index:
        index_args.append("--no-index")
    for link in args.find_links:
        index_args += ["--find-links", str(link)]
    index_args += list(args.pip_arg)
    extras = [] if args.no_extras else args.extra
    platforms = list(args.platform) or B.manylinux_platforms(args.glibc)
    return B.BundleOptions(
        version=args.version,
        out=args.out,
        part_size=I.parse_size(args.part_size),
        python_version=args.python_version,
        platforms=platforms,
        profile=args.profile,
        drop_flash_ops=args.drop_flash_ops,
        drop_packages=args.drop_package,
        drop_files=args.drop_files,
        keep=args.keep,
        extras=extras,
        machine=P.read_names(args.machine_packages) if args.machine_packages else frozenset(),
        machine_versions=P.read_versions(args.machine_packages) if args.machine_packages else {},
        index_args=index_args,
        cache_dirs=args.cache,
        report=args.report,
    )


def _bundle(args: argparse.Namespace) -> int:
    lock = B.build_bundle(_options(args))
    out = Path(args.out)
    wheels = sum(w["size"] for w in lock["wheels"])
    print(
        f"bundle: {len(lock['wheels'])} wheels, {I.human(wheels)} "
        f"(archive {I.human(lock['archive']['size'])}); left out {len(lock['on_machine'])} the machine has "
        f"and {len(lock['dropped'])} the profile drops"
    )
    for part in lock["parts"]:
        print(f"  {out / part['folder'] / part['file']}  {I.human(part['size'])}")
    print(f"lock: {out / I.LOCK_NAME} (a copy in each part folder)")
    print("on the machine without a network, one call per part folder (carry that folder):")
    for line in I.install_commands(lock, out, prefix=args.prefix):
        print("  " + line)
    return 0


def bundle_main(args: argparse.Namespace) -> int:
    return I.run_guarded(_bundle, args)


if __name__ == "__main__":  # pragma: no cover
    ap = argparse.ArgumentParser(prog="draftlab")
    add_sglang_parser(ap.add_subparsers(dest="command", required=True))
    ns = ap.parse_args()
    sys.exit(ns.func(ns))
