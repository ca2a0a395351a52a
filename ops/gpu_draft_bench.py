"""ops/gpu/bench_draft.sh on the GPU machine: a trained draft benchmarked in the reference engine
without rerunning the notebooks. The draft travels as the parts ops/gpu/prepare_draft.sh made
(.device/draft-a with SHA256 and COUNT, .device/draft-b; a call carries at most 64 MiB and the target's
GGUF fills most of two), the held-out prompts as .device/prompts; each call stashes what it carried
under DL (the set-up must run on the call that carries .device/b, before the set is complete), and the
call that completes the set checks and unpacks the draft, then runs the benches until the deadline.

Knobs: SAMPLES (64), MIN_LEFT (60: a bench starts only with this many seconds left), BENCH ("NAME ARGS...":
that one run instead of the list), the deadline and folders: gpu_call's. Results: OUT/<name>.json.
Exit codes: 0 every bench has its JSON; 3 call again (parts or prompts missing, or benches left for
want of time); 1 failed (set-up, the parts do not match SHA256, a bench failed).
"""

from __future__ import annotations

import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path

from ops import gpu_call
from ops.gpu_call import CUT, Call, join_parts, until, written

DONE, AGAIN, FAILED = 0, 3, 1
# in priority order: the graphed prefill (default) against the eager one, same draft, same prompts
BENCHES = (
    ("bf16_chain_blend", "--dtype bfloat16 --steps 3,4,5,6,7"),
    ("bf16_chain_blend_nopad", "--dtype bfloat16 --steps 3,5 --prefill-bucket 0"),
    ("bf16_chain_humaneval", "--dtype bfloat16 --steps 4,5 --eval-set humaneval"),
    ("fp32_chain_blend", "--dtype float32 --steps 3,4,5"),
)


@dataclass
class Knobs:
    """bench_draft.sh's own environment variables (the call's are gpu_call's)."""

    samples: int  # SAMPLES
    min_left: int  # MIN_LEFT
    benches: list[tuple[str, list[str]]]  # BENCH's one run, else BENCHES

    @classmethod
    def from_env(cls, env=None) -> "Knobs":
        env = os.environ if env is None else env
        one = env.get("BENCH", "").split()
        benches = [(one[0], one[1:])] if one else [(name, args.split()) for name, args in BENCHES]
        return cls(samples=int(env.get("SAMPLES") or 64), min_left=int(env.get("MIN_LEFT") or 60), benches=benches)


def parts_dir(call: Call) -> Path:
    return call.dl / "draft-parts"


def prompts_dir(call: Call) -> Path:
    return call.dl / "prompts"


def draft_dir(call: Call) -> Path:
    return call.dl / "draft/eagle3"


def stash(call: Call) -> None:
    """What this call carried (.device/draft-*, .device/prompts) copied under DL for the call that completes the set."""
    for folder, dest in [
        *((d, parts_dir(call)) for d in sorted(call.repo.glob(".device/draft-*"))),
        (call.repo / ".device/prompts", prompts_dir(call)),
    ]:
        dest.mkdir(parents=True, exist_ok=True)
        files = sorted(f for f in folder.glob("*") if f.is_file()) if folder.is_dir() else []
        for f in files:
            shutil.copyfile(f, dest / f.name)
        if files:
            call.say(f"stashed {' '.join(f.name for f in files)} from {folder.relative_to(call.repo)}")


def draft_parts(call: Call) -> list[Path]:
    """draft.tar.part-N in numeric order."""
    return sorted(parts_dir(call).glob("draft.tar.part-*"), key=lambda p: (len(p.name), p.name))


def missing(call: Call) -> str | None:
    """What the set still lacks, as a log line; None when every part and the prompts are here."""
    count = parts_dir(call) / "COUNT"
    want = int(count.read_text().strip() or 0) if count.is_file() else 0
    have = len(draft_parts(call))
    prompts = sorted(p.name for p in prompts_dir(call).glob("*"))
    if want and have >= want and prompts:
        return None
    return f"{have} of {want} draft parts, prompts: {' '.join(prompts)}"


def unpack(call: Call) -> str | None:
    """The parts joined, checked against SHA256 and unpacked into DL/draft (once); a one-line error, else None."""
    if (draft_dir(call) / "model.safetensors").is_file():
        return None
    parts, tar = draft_parts(call), call.dl / "draft.tar"
    sums = parts_dir(call) / "SHA256"
    try:
        want = sums.read_text().split()[0]
        got = join_parts(parts, tar)
        if got != want:
            return (
                f"{tar} (joined from {parts[0].name}..{parts[-1].name} in {parts_dir(call)}) does not match "
                f"{sums}: sha256 {got}, want {want}"
            )
        tmp = call.dl / "draft.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        with tarfile.open(tar) as t:
            t.extractall(tmp, filter="data")
        shutil.rmtree(call.dl / "draft", ignore_errors=True)
        tmp.replace(call.dl / "draft")
    except (OSError, IndexError, tarfile.TarError) as exc:
        return f"the draft parts: {exc or type(exc).__name__} ({sums})"
    return None


def done(call: Call, name: str) -> bool:
    return written(call.out / f"{name}.json")


def bench(call: Call, knobs: Knobs, name: str, args: list[str]) -> int:
    """One `draftlab bench specdec` run on the blend's prompts (unless args say otherwise), if it has no JSON yet
    and MIN_LEFT s are left, stopped at the deadline: DONE, AGAIN (skipped or cut) or FAILED."""
    if done(call, name):
        return DONE
    if call.left() < knobs.min_left:
        call.say(f"{name}: skipped, {call.left()} s left")
        return AGAIN
    call.say(f"bench {name}: {' '.join(args)}")
    argv = call.cli(
        "bench",
        "specdec",
        "--target",
        "embedded",
        "--draft",
        draft_dir(call),
        "--device",
        "cuda",
        "--max-new-tokens",
        128,
        "--samples",
        knobs.samples,
        "--eval-set",
        prompts_dir(call) / "test.jsonl",
        "--out",
        call.out / f"{name}.json",
        *args,
    )
    rc = until(argv, call.deadline, quiet=True)
    call.say(f"bench {name}: exit {rc}")
    return DONE if rc == 0 and done(call, name) else AGAIN if rc == CUT else FAILED


def run(call: Call, knobs: Knobs | None = None, setup=gpu_call.ensure_all) -> int:
    """One call of bench_draft.sh: stash, set-up, and once the set is complete the benches in order."""
    knobs = knobs or Knobs.from_env()
    call.out.mkdir(parents=True, exist_ok=True)
    stash(call)
    if not setup(call):
        call.say("FAILED: set-up (see above)")
        return FAILED
    lack = missing(call)
    if lack:
        call.say(f"NOT DONE YET: {lack}. NEXT: bench_draft.sh with the rest")
        return AGAIN
    error = unpack(call)
    if error:
        call.say(f"FAILED: {error}")
        return FAILED
    outcomes = [bench(call, knobs, name, args) for name, args in knobs.benches]
    results = len(list(call.out.glob("*.json")))
    rc = FAILED if FAILED in outcomes else AGAIN if AGAIN in outcomes else DONE
    call.say(
        f"{'DONE' if rc == DONE else 'NOT DONE YET' if rc == AGAIN else 'FAILED'}: {results} result files "
        f"in {call.out}{'. NEXT: bench_draft.sh again' if rc == AGAIN else ''}"
    )
    return rc
