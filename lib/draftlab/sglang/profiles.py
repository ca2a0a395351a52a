"""What a bundle leaves out: the target machine's own packages (read from a file: `pip freeze` or one
name a line), and what chosen server flags never import (a profile); the extra requirements each SGLang
release needs there."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.sglang.install import normalize

# Extra requirements per SGLang release, resolved together with it (and always bundled, even where
# the machine has the name): SGLang 0.5.17 fails at import under transformers 5.17 (AutoConfig
# "'qwen3_asr' is already used"); it pins transformers==5.12.1, which needs tokenizers<=0.23.0.
SGLANG_EXTRAS = {
    "0.5.17": ["transformers==5.12.1", "tokenizers==0.22.2"],
}


SGLANG_KERNEL_HEAVY = (
    "sgl_kernel/flash_ops.*",  # FlashAttention 3 (--attention-backend fa3), 1.1 GB unpacked
    "sgl_kernel/infllm_ops.*",  # InfLLM-V2 sparse attention
    "sgl_kernel/sm100/*",  # common ops for GPUs other than sm90 (Hopper loads sm90/)
)


@dataclass(frozen=True)
class Profile:
    """What a set of server flags never imports: whole packages, and files inside kept wheels."""

    description: str
    drop_packages: dict = field(default_factory=dict)  # name -> why
    drop_files: dict = field(default_factory=dict)  # name -> glob patterns inside the wheel


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


def read_names(path: Path) -> frozenset:
    """Package names from a file: one a line, `pip freeze`/`pip list` lines too (# comments)."""
    names = set()
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-") or set(line) <= {"-", " "} or line.lower().startswith("package "):
            continue
        names.add(normalize(re.split(r"[\s=<>!~@;\[]", line, 1)[0]))
    return frozenset(names)


def read_versions(path: Path) -> dict[str, str]:
    """{name: version} of the `name==version` lines of such a file (the machine's pins, for machine_conflicts)."""
    versions = {}
    for line in Path(path).read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        name, sep, version = line.partition("==")
        if sep and name and version:
            versions[normalize(name.strip())] = version.strip()
    return versions


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


def machine_conflicts(bundled: list, left_out: list, python_version: str, machine_versions: dict) -> list[str]:
    """Pins of the bundled packages (bundle.Resolved) that exclude a version the machine is known to have of a
    package the bundle leaves out (the machine's own packages' pins are the machine's affair)."""
    tools = _requirement_tools()
    if tools is None:
        return []
    Requirement, Version, default_environment = tools
    env = dict(default_environment())
    env.update(
        python_version=python_version,
        python_full_version=python_version + ".0",
        sys_platform="linux",
        platform_system="Linux",
        platform_machine="x86_64",
        implementation_name="cpython",
        platform_python_implementation="CPython",
        extra="",
    )
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
                found.append(
                    f"{pkg.name} {pkg.version} needs {name}{req.specifier} but the GPU machine "
                    f"has {name} {have}; not bundled (pass --keep {name} to bundle it)"
                )
    return found
