"""The phases of ops/gpu/recipes.sh on the GPU machine: the recipe study, trained and
measured through `python -m studies.recipes` (studies.recipes.study) as child processes.

    stash    nothing else (a transfer call: recipes.sh took the cargo chunk and the bundle parts)
    train    set-up and the study's data; once per machine, while a row is still to train, the training-speed
             check (`python -m studies.recipes speed`); then `python -m studies.recipes train` of ROWS, PARALLEL
             at a time, until the deadline sends it SIGTERM (3: call again)
    speed    set-up and data, benchmarks/tokenize_profile.py on 300 rows (OUT/tokenize_profile*.txt),
             the speed check on SPEED_SAMPLES rows
    measure  SGLang from the bundle, then `python -m studies.recipes measure` of `base` (the published draft) and
             every row of ROWS on the held-out split and HumanEval; the report
    suite    SGLang from the bundle, then every draft of PUBLISHED and ROWS on each set of the evaluation suite
             (ops.gpu_recipes_suite; SUITE_SAMPLES prompts a set): STUDY/suite/summary.json
PHASE may name several, run in order within one call ("regen train").
Knobs (defaults as recipes.sh had them): ROWS (epochs10,fcnorm,vocab32k,eagle1), PARALLEL (4),
SPEED_STEPS (30), SPEED_SAMPLES (0: all), SPEED_VARIANTS ("eager compiled"; also keep_head, offline; none: no check),
TRAIN_SET (more `recipes train` options, whitespace-split), SAMPLES (64), HUMANEVAL (32), MULTI_TURN (0; N: the
first N held-out multi-turn prompts of MULTI_TURN_HELD_OUT after those),
RECIPES_TARGET (embedded; tests train the tiny one), CHAIN (more chain lengths S measured per row, e.g.
1,2,3,4,5,6,7: a server each, all up at once; default none: S = 6 alone), CONCURRENCY (16,1: the main
servers' levels; acceptance and the CHAIN servers' one window come from the first, so 1,16 gives the
chain at batch 1), REPEATS (3: rounds of measured windows, every server's turn in each; the table takes the median),
SERVER_FLAGS (more SGLang flags for every measured server, e.g. --sleep-on-idle),
PUBLISHED (rows of PUBLISHED_RUNS measured from their carried published drafts, not trained), SEND_DRAFTS
(rows whose trained drafts come back, comma-separated, or none; unset: a train call sends the rows it finished,
at most MAX_DRAFTS_SENT, since a call returns at most 8 files and a draft is 2 of them),
CHAIN_ROWS (the rows that get the CHAIN servers; default all), REGEN_SET (extra; multi-turn or broad: the regenerated
set of gpu_recipes_regen), REGEN_ROWS (its prompts answered: gpu_recipes_regen.DEFAULT_ROWS), REGEN_SERVERS (2),
REGEN_CONCURRENCY (512 a server: its CUDA graphs), SUITE_SAMPLES (64), PREFIX and the deadline: gpu_call's.
The study lives in DL/recipes. Every call sends back OUT/recipes.tar.gz (no weights, data, token caches
or TensorBoard logs) and each SEND_DRAFTS row's draft as OUT/draft-<row>.tar.part-N (here: cat them |
tar -xf - gives <row>/draft/); the speed check OUT/speed.json.
Exit codes: 0 done, 3 call again, 1 failed, 2 an unknown phase.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from draftlab.core.files import atomic_write_json
from ops import gpu_call, gpu_pack, gpu_sglang
from ops import gpu_recipes_regen as regen_sets
from ops import gpu_recipes_suite as suite_phase
from ops.gpu_call import CUT, Call, until, unxz, written

DONE, AGAIN, FAILED = 0, 3, 1
STOPPED = (128 + signal.SIGTERM, 128 + signal.SIGINT)  # a study command stopped by a signal, its work saved
SPLITS = ("data/regen/train", "data/regen/val", "data/blend/test")  # under results/reference, .jsonl.xz
PACK_EXCLUDES = ("*.safetensors", "ckpt-*", "data", "tokens", "tb")  # recipes.tar.gz
MAX_DRAFTS_SENT = 2  # a draft is two 15 MiB parts; a call returns at most 8 files, 64 MiB together
PROFILE_CHILD_S = 120  # each tokeniser profile at most
# published recipe rows (base aside: the reference draft) -> the folder with draft/eagle3.commit, train/summary.json
PUBLISHED_RUNS = {
    row: f"results/recipes/rows/{row}"
    for row in (
        "fcnorm fcnorm-lr1e-3 n10806 best-data2x epochs10 data2x-5ep lr-const eagle1-lr1e-3 best-const data2x-mt"
        " eagle1-data2x"
    ).split()
}
# published rows whose training was cut before its last step (their summary.json says how far): best-data2x's
# device time ran out at step 4,595 of 4,945 (2026-12-02), its learning rate then 1.3% of the peak
PUBLISHED_UNFINISHED = {"best-data2x"}
MULTI_TURN_HELD_OUT = "results/recipes/data/multi-turn-held-out.jsonl"  # recipes multi-turn-held-out
SPEED_MIN_S = 120  # the speed check starts only with this much of the call left (the tokenising, ~30 s for 21.6K rows)


@dataclass
class Knobs:
    """recipes.sh's own environment variables (the call's are gpu_call's)."""

    rows: list[str]  # ROWS
    parallel: int  # PARALLEL
    speed_steps: int  # SPEED_STEPS
    speed_samples: int  # SPEED_SAMPLES (0: every row)
    speed_variants: list[str]  # SPEED_VARIANTS
    train_set: list[str]  # TRAIN_SET
    samples: int  # SAMPLES
    humaneval: int  # HUMANEVAL
    multi_turn: int  # MULTI_TURN
    target: str  # RECIPES_TARGET
    base_draft: Path  # the published draft (carried as .device/drafts/eagle3): row `base`
    published: list[str]  # PUBLISHED: more rows measured from their published drafts (PUBLISHED_RUNS)
    carried_drafts: Path  # where the cargo put them: .device/drafts/<row>
    concurrency: str  # CONCURRENCY
    repeats: int  # REPEATS
    server_flags: str  # SERVER_FLAGS: more SGLang flags for every server measured, e.g. --sleep-on-idle
    send_drafts: list[str] | None  # SEND_DRAFTS; None (unset): the rows a train call finishes
    chain: str  # CHAIN
    chain_rows: str  # CHAIN_ROWS
    regen_set: str  # REGEN_SET
    regen_rows: int  # REGEN_ROWS
    regen_servers: int  # REGEN_SERVERS
    regen_concurrency: int  # REGEN_CONCURRENCY
    suite_samples: int  # SUITE_SAMPLES

    @classmethod
    def from_env(cls, call: Call, env=None) -> "Knobs":
        env = os.environ if env is None else env

        def get(name: str, default) -> str:
            return env.get(name) or str(default)

        # checked by `python -m studies.recipes speed`
        variants = [v for v in get("SPEED_VARIANTS", "eager compiled").split() if v != "none"]
        return cls(
            rows=[r for r in get("ROWS", "epochs10,fcnorm,vocab32k,eagle1").split(",") if r],
            parallel=int(get("PARALLEL", 4)),
            speed_steps=int(get("SPEED_STEPS", 30)),
            speed_samples=int(get("SPEED_SAMPLES", 0)),
            speed_variants=variants,
            train_set=env.get("TRAIN_SET", "").split(),
            samples=int(get("SAMPLES", 64)),
            humaneval=int(get("HUMANEVAL", 32)),
            multi_turn=int(get("MULTI_TURN", 0)),
            target=get("RECIPES_TARGET", "embedded"),
            base_draft=call.repo / ".device/drafts/eagle3",
            send_drafts=None
            if "SEND_DRAFTS" not in env
            else [r for r in env["SEND_DRAFTS"].split(",") if r not in ("", "none")],
            chain=env.get("CHAIN", ""),
            chain_rows=env.get("CHAIN_ROWS", ""),
            regen_set=get("REGEN_SET", "extra"),
            regen_rows=int(get("REGEN_ROWS", regen_sets.DEFAULT_ROWS.get(get("REGEN_SET", "extra"), 0))),
            regen_servers=int(get("REGEN_SERVERS", 2)),
            regen_concurrency=int(get("REGEN_CONCURRENCY", 512)),
            suite_samples=int(get("SUITE_SAMPLES", 64)),
            published=[r for r in env.get("PUBLISHED", "").split(",") if r],
            carried_drafts=call.repo / ".device/drafts",
            concurrency=get("CONCURRENCY", "16,1"),
            repeats=int(get("REPEATS", 3)),
            server_flags=env.get("SERVER_FLAGS", ""),
        )


def study_dir(call: Call) -> Path:
    return call.dl / "recipes"


def data_dir(call: Call) -> Path:
    return study_dir(call) / "data"


def last_line(path: Path, chars: int) -> str:
    """The last non-empty line of a log's last `chars` characters (progress bars' \\r as line ends)."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - chars))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    return next((line for line in reversed(tail.replace("\r", "\n").split("\n")) if line), "")


# ---- the study's inputs ------------------------------------------------------------------------------
def stage_data(call: Call, knobs: Knobs) -> bool:
    """The reference run's regenerated set and held-out split (tracked .xz), and the published drafts with
    their training summaries as trained rows: the reference draft as `base`, each PUBLISHED row's from
    .device/drafts/<row> (restored by ops/gpu/published_draft.sh PUBLISHED_RUNS[row] .device/drafts/<row>,
    carried with the cargo). What is there already is kept."""
    data = data_dir(call)
    data.mkdir(parents=True, exist_ok=True)
    drafts = {"base": (knobs.base_draft, "results/reference")}
    for row in knobs.published:
        if row not in PUBLISHED_RUNS:
            call.say(f"FAILED: PUBLISHED row {row!r}: expected one of {', '.join(PUBLISHED_RUNS)}")
            return False
        drafts[row] = (knobs.carried_drafts / row, PUBLISHED_RUNS[row])
    try:
        for split in SPLITS:
            dst = data / f"{Path(split).name}.jsonl"
            if not written(dst):
                tmp = dst.with_name(dst.name + ".tmp")
                unxz(call.repo / "results/reference" / f"{split}.jsonl.xz", tmp)
                tmp.replace(dst)
        for name in regen_sets.SETS:  # the answers a session brought back
            tracked = call.repo / regen_sets.REGENERATED[name]
            if not written(regen_sets.regenerated(data, name)) and tracked.is_file():
                unxz(tracked, regen_sets.regenerated(data, name))
        present = [n for n in regen_sets.SETS if written(regen_sets.regenerated(data, n))]
        # the rows and regenerated sets `recipes grow` has already seen (it is ~10 s even as a no-op); a row whose
        # set is not here yet is skipped by it, and grown once a later call brings the set
        grown = data / "grown-rows.json"
        seen = json.loads(grown.read_text()) if grown.is_file() else {"rows": [], "sets": []}
        if present and not (set(knobs.rows) <= set(seen["rows"]) and set(present) <= set(seen["sets"])):
            sets = [f"--regenerated={n}={regen_sets.regenerated(data, n)}" for n in present]
            argv = call.study("recipes", "grow", "--rows", ",".join(knobs.rows), "--train-file", data / "train.jsonl")
            if until([*argv, *sets], call.deadline - 30) != DONE:
                call.say("FAILED: the data-volume rows' train files (python -m studies.recipes grow)")
                return False
            atomic_write_json(grown, {"rows": sorted({*seen["rows"], *knobs.rows}), "sets": present})
        for row, (draft, run) in drafts.items():
            staged = study_dir(call) / row
            if not (staged / "draft/model.safetensors").is_file():
                (staged / "train").mkdir(parents=True, exist_ok=True)
                shutil.copytree(draft, staged / "draft", dirs_exist_ok=True)
                shutil.copyfile(call.repo / run / "train/summary.json", staged / "train/summary.json")
    except (OSError, lzma.LZMAError) as exc:
        call.say(f"FAILED: the study's data: {exc}")
        return False
    return True


# ---- the training-speed check -------------------------------------------------------------------------
def speed_measured(path: Path) -> bool:
    try:
        return any(isinstance(v, dict) for v in json.loads(path.read_text()).values())
    except (OSError, ValueError, AttributeError):
        return False


def speed_check(call: Call, knobs: Knobs) -> None:
    """`python -m studies.recipes speed`: SPEED_STEPS steps of the reference recipe by each of SPEED_VARIANTS, once per
    machine, into STUDY/speed.json (and OUT/speed.json). It tokenises into the rows' shared cache first."""
    study, data = study_dir(call), data_dir(call)
    result = study / "speed.json"
    if speed_measured(result):
        return
    if not knobs.speed_variants:
        call.say("speed check: SPEED_VARIANTS=none")
        return
    if call.left() < SPEED_MIN_S:
        call.say(f"speed check: {call.left()} s left, too few; a later call runs it")
        return
    argv = call.study(
        "recipes",
        "speed",
        "--variants",
        ",".join(knobs.speed_variants),
        "--train-file",
        data / "train.jsonl",
        "--val-file",
        data / "val.jsonl",
        "--out",
        study,
        "--target",
        knobs.target,
        "--steps",
        knobs.speed_steps,
        "--samples",
        knobs.speed_samples,
        "--set",
        "device",
        "cuda",
    )
    rc = until(argv, call.deadline - 30)
    call.say(f"speed check: exit {rc}")
    if result.is_file():
        print(result.read_text(), flush=True)
        shutil.copyfile(result, call.out / "speed.json")


def tokenize_profile(call: Call, out: Path, shown: int, *target_device: str) -> int:
    """benchmarks/tokenize_profile.py on 300 rows into `out` (its conv/s bars left out); the first lines shown."""
    lines: list[str] = []

    def keep(line: str) -> None:
        if "conv/s]" not in line:
            if len(lines) < shown:
                print(line, flush=True)
            lines.append(line)

    argv = [call.python, "benchmarks/tokenize_profile.py", call.model_dir, data_dir(call) / "train.jsonl", 300]
    rc = until(
        [*argv, *target_device], min(time.time() + PROFILE_CHILD_S, call.deadline - 30), on_line=keep, cwd=call.repo
    )
    out.write_text("".join(f"{line}\n" for line in lines))
    return rc


# ---- rows -------------------------------------------------------------------------------------------------
def outcome(rc: int) -> int:
    """A study command's exit as the phase's: done, stopped (SIGTERM at the deadline: it checkpointed, so call
    again), or failed."""
    return DONE if rc == DONE else AGAIN if rc in (CUT, *STOPPED) else FAILED


def train_rows(call: Call, knobs: Knobs) -> int:
    """`python -m studies.recipes train` of ROWS, sent SIGTERM 15 s before the deadline (its rows then
    checkpoint, it writes their status and exits: call again); each row's last log line."""
    study, data = study_dir(call), data_dir(call)
    if call.left() < 16:
        call.say(f"no time left to train ({call.left()} s): call again")
        return AGAIN
    argv = call.study(
        "recipes",
        "train",
        "--rows",
        ",".join(knobs.rows),
        "--train-file",
        data / "train.jsonl",
        "--val-file",
        data / "val.jsonl",
        "--out",
        study,
        "--parallel",
        knobs.parallel,
        "--target",
        knobs.target,
        "--set",
        "device",
        "cuda",
        "--set",
        "save_every",
        100,
        "--set",
        "eval_every",
        500,
        *knobs.train_set,
    )
    rc = until(argv, call.deadline - 15)
    for row in knobs.rows:
        call.say(f"{row}: {last_line(study / row / 'train.log', 400)}")
    return outcome(rc)


def measure_rows(call: Call, knobs: Knobs) -> int:
    """`python -m studies.recipes measure` of `base` and ROWS in SGLang, until 30 s before the deadline; the report."""
    study = study_dir(call)
    argv = call.study(
        "recipes",
        "measure",
        "--rows",
        ",".join(["base", *knobs.rows]),
        "--out",
        study,
        "--model-path",
        call.model_dir,
        "--held-out",
        data_dir(call) / "test.jsonl",
        "--samples",
        knobs.samples,
        "--humaneval",
        knobs.humaneval,
        "--multi-turn",
        call.repo / MULTI_TURN_HELD_OUT,
        "--multi-turn-samples",
        knobs.multi_turn,
        "--chain",
        knobs.chain,
        "--chain-rows",
        knobs.chain_rows,
        "--concurrency",
        knobs.concurrency,
        "--repeats",
        knobs.repeats,
        f"--server-flags={knobs.server_flags}",
        "--prefix",
        call.sglang_prefix,
    )
    return outcome(until(argv, call.deadline - 30, quiet=True))


def pack(call: Call, knobs: Knobs, finished: tuple[str, ...] = ()) -> None:
    """The study so far without weights, checkpoints, data, token caches or TensorBoard logs: OUT/recipes.tar.gz;
    and the trained drafts of SEND_DRAFTS (unset: the rows this call `finished`), in parts. Why the default: a
    machine can go cold before the next call (2026-12-03), and a draft not sent back is then trained again."""
    out = call.out / "recipes.tar.gz"
    gpu_pack.tar_gz_without(study_dir(call), "recipes", out, PACK_EXCLUDES)
    call.say(f"packed {gpu_pack.human(out.stat().st_size)}")
    rows = finished[:MAX_DRAFTS_SENT] if knobs.send_drafts is None else knobs.send_drafts
    if knobs.send_drafts is None and finished[MAX_DRAFTS_SENT:]:
        call.say(f"not sent (at most {MAX_DRAFTS_SENT} drafts a call): {', '.join(finished[MAX_DRAFTS_SENT:])}")
    for row in rows:
        if (study_dir(call) / row / "draft/model.safetensors").is_file():
            gpu_pack.send_tree(call, study_dir(call), f"{row}/draft", f"draft-{row}")
        else:
            call.say(f"SEND_DRAFTS: {row} has no trained draft here")


# ---- the phases ----------------------------------------------------------------------------------------------
def ready(call: Call, knobs: Knobs) -> bool:
    return gpu_call.ensure_all(call) and stage_data(call, knobs)


def speed(call: Call, knobs: Knobs) -> int:
    """The tokeniser's profile on this machine (alone, then after the target is loaded) and the speed check."""
    if not ready(call, knobs):
        return FAILED
    tokenize_profile(call, call.out / "tokenize_profile.txt", 40)
    tokenize_profile(call, call.out / "tokenize_profile_after_target.txt", 30, "embedded", "cuda")
    speed_check(call, knobs)
    pack(call, knobs)
    return DONE


def train(call: Call, knobs: Knobs) -> int:
    if not ready(call, knobs):
        return FAILED
    status = study_dir(call) / "train_status.json"  # `recipes train`'s row -> done, cut, ...
    before = json.loads(status.read_text()) if status.is_file() else {}
    if all(before.get(row) == "done" for row in knobs.rows):  # a "train measure" call after the last training call
        call.say("speed check skipped: every row is trained")
    else:
        speed_check(call, knobs)
    rc = train_rows(call, knobs)
    after = json.loads(status.read_text()) if status.is_file() else {}
    pack(call, knobs, tuple(row for row, state in after.items() if state == "done" and before.get(row) != "done"))
    return rc


def regen(call: Call, knobs: Knobs) -> int:
    if knobs.regen_set not in regen_sets.SETS:
        call.say(f"FAILED: REGEN_SET {knobs.regen_set}: expected one of {', '.join(regen_sets.SETS)}")
        return FAILED
    return with_sglang(call, knobs, regen_then_grow)


def regen_then_grow(call: Call, knobs: Knobs) -> int:
    """REGEN_SET's prompts answered by the target, then the data-volume rows' train files that draw on it."""
    args = (knobs.regen_set, knobs.regen_rows, knobs.regen_servers, knobs.regen_concurrency)
    rc = regen_sets.regenerate(call, data_dir(call), *args)
    return rc if rc != DONE else (DONE if stage_data(call, knobs) else FAILED)


def measure(call: Call, knobs: Knobs) -> int:
    return with_sglang(call, knobs, measure_rows)


def suite(call: Call, knobs: Knobs) -> int:
    def step(c: Call, k: Knobs) -> int:
        rows = [*k.published, *k.rows]
        return suite_phase.suite_rows(c, rows, study_dir(c), data_dir(c), k.suite_samples, k.server_flags)

    return with_sglang(call, knobs, step)


def with_sglang(call: Call, knobs: Knobs, step) -> int:
    """Set-up, the study's data and SGLang installed, then `step`; the study packed whatever it returns."""
    if not (ready(call, knobs) and gpu_sglang.install_sglang(call)):
        return FAILED
    rc = step(call, knobs)
    pack(call, knobs)
    return rc


def run_phase(call: Call, phase: str, knobs: Knobs | None = None) -> int:
    """PHASE, or several in one call one after the other ("regen train": the time regeneration leaves goes to
    training), each until the call's deadline; the first that is not done ends the call with its exit code."""
    knobs = knobs or Knobs.from_env(call)
    data_dir(call).mkdir(parents=True, exist_ok=True)
    call.out.mkdir(parents=True, exist_ok=True)
    phases = {"stash": lambda c, k: DONE, "speed": speed, "train": train, "regen": regen, "measure": measure,
              "suite": suite}  # fmt: skip
    unknown = [p for p in phase.split() if p not in phases]
    if unknown or not phase.split():
        call.say(f"unknown PHASE {phase}: expected one or more of {', '.join(phases)}")
        return 2
    for name in phase.split():
        rc = phases[name](call, knobs)
        if rc != DONE:
            return rc
    return DONE
