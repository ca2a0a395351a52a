"""What a bundle leaves out: the GPU machine's own packages, and what chosen server flags never
import (a profile); the extra requirements each SGLang release needs there."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from draftlab.sglang.install import normalize

# The GPU machine's Python packages, by name (/work/.library/device/KINDS.md, "Python packages
# already there", as read on 2026-11-17). A bundle leaves these out unless `--keep` names them.
GPU_MACHINE_PACKAGES = frozenset(
    re.sub(r"[-_.]+", "-", n).lower()
    for n in """
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
""".split()
)


# Versions seen there (KINDS.md's pip-list row, python3 3.12.3): used only to warn when a bundled
# package's pin excludes the machine's version of a package the bundle leaves out.
GPU_MACHINE_VERSIONS = {
    "accelerate": "1.15.0",
    "huggingface-hub": "1.33.0",
    "numpy": "2.5.2",
    "safetensors": "0.8.0",
    "sentencepiece": "0.2.2",
    "tiktoken": "0.14.0",
    "tokenizers": "0.23.2",
    "torch": "2.11.0",
    "torchaudio": "2.11.0",
    "torchvision": "0.26.0",
    "transformers": "5.17.0",
    "triton": "3.6.0",
}


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
