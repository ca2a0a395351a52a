"""The recipe study's regenerated sets on the GPU machine (recipes.sh PHASE=regen): the prompts a
data-volume row's train file grows by, answered by the target through SGLang.

Three sets (studies.recipes.rows.GROWN_TRAIN_FILES says which file draws from which): `extra`, the larger blend's
prompts that the reference has not seen (tracked as EXTRA_PROMPTS); `multi-turn`, two-turn prompts made from the
extra prompts that `extra` left unanswered (`python -m studies.recipes multi-turn`, made here: nothing to carry);
and `broad`, prompts of five kinds written by the target itself through SGLang servers of it
(`python -m studies.recipes broad-prompts`, made here; a cut one resumes on the same machine). A set
whose answers a session brought back is tracked (REGENERATED) and only unpacked; a cut regeneration sends its
work folder back (OUT/<set>-work.tar.gz), and carried as partial(set) a cold machine resumes from it.
"""

from __future__ import annotations

import tarfile
import threading
import time
from pathlib import Path

from draftlab.sglang.server import TargetServers
from ops import gpu_pack
from ops.gpu_call import CUT, Call, until, written

DONE, AGAIN, FAILED = 0, 3, 1
SETS = ("extra", "multi-turn", "broad")
EXTRA_PROMPTS = "results/recipes/data/extra-prompts.jsonl.xz"  # python -m studies.recipes extra-prompts
# each set's answers, once a session brought them back
REGENERATED = {name: f"results/recipes/data/{name}-regen.jsonl.xz" for name in SETS}
# the prompts of each set regenerated when REGEN_ROWS is unset: the most a grown train file takes from it (as
# studies.recipes.rows.GROWN_TRAIN_FILES says; ops/tests/test_gpu_recipes.py keeps them in step), and for `broad`
# 2% more, since a few of its prompts can be lost (a text two kinds both wrote, an empty answer)
DEFAULT_ROWS = {"extra": 21612, "multi-turn": 10806, "broad": 22044}
BROAD_SERVERS = 2  # SGLang servers of the target that write the broad prompts (one keeps a small target's GPU idle)
BROAD_CONCURRENCY = 256  # prompt requests in flight over them
# as 03 regenerated the reference set (results/reference/params.yaml): greedy, 256 new tokens, over-long kept
REGEN_SAMPLING = ("--max-tokens", "256", "--temperature", "0", "--truncation", "keep_flag", "--timeout", "600")
REGEN_SHOW_S = 60  # progress in the log this often


def partial(name: str) -> str:
    """Where a cut regeneration's work folder is carried back from (.device is ignored by git)."""
    return f".device/{name}-work.tar.gz"


def regenerated(data: Path, name: str) -> Path:
    """The set's answers in the study's data folder (regenerated here, or REGENERATED unpacked)."""
    return data / f"{name}-regen.jsonl"


def prompts(call: Call, data: Path, name: str, rows: int) -> Path | int:
    """The set's prompts: the tracked extra prompts, the multi-turn ones made from them, or the broad ones the
    target writes; AGAIN or FAILED when they are not made."""
    if name == "extra":
        return call.repo / EXTRA_PROMPTS
    if name == "broad":
        return broad_prompts(call, data, rows)
    made = data / "multi-turn-prompts.jsonl.xz"
    if not written(made):
        argv = call.study("recipes", "multi-turn", "--extra", call.repo / EXTRA_PROMPTS, "--n", rows, "--out", made)
        if until(argv, call.deadline - 30) != DONE:
            call.say("FAILED: the multi-turn prompts (python -m studies.recipes multi-turn)")
            return FAILED
    return made


def broad_prompts(call: Call, data: Path, rows: int) -> Path | int:
    """`rows` prompts of broad.KINDS written by the target through BROAD_SERVERS SGLang servers of it
    (`python -m studies.recipes broad-prompts`; its work folder DATA/broad-prompts resumes a cut call):
    the file, or AGAIN (cut at the deadline) or FAILED."""
    made = data / "broad-prompts.jsonl.xz"
    if written(made):
        return made
    call.say(f"the target writes {rows} broad prompts through {BROAD_SERVERS} SGLang servers")
    try:
        with TargetServers(
            str(call.model_dir),
            BROAD_SERVERS,
            data / "broad-servers",
            prefix=str(call.sglang_prefix),
            startup_timeout=max(call.left() - 60, 1),
        ) as servers:
            call.say(f"servers {servers.urls} ready in {servers.startup_s:.0f} s")
            argv = call.study(
                "recipes", "broad-prompts", "--model", call.model_dir, "--n", rows, "--work", data / "broad-prompts",
                "--out", made, "--concurrency", BROAD_CONCURRENCY, *(f"--base-url={u}" for u in servers.urls),
            )  # fmt: skip
            rc = until(argv, call.deadline - 30)
    except RuntimeError as exc:  # a server that did not start (its log's tail is in the message)
        call.say(f"FAILED: the servers for the broad prompts: {exc}")
        return FAILED
    if rc == DONE and written(made):
        return made
    call.say(f"broad prompts: exit {rc}")
    return AGAIN if rc in (CUT, AGAIN) else FAILED


def regenerate(call: Call, data: Path, name: str, rows: int, servers: int, concurrency: int) -> int:
    """The set's first `rows` prompts regenerated by the target through `servers` SGLang servers (`draftlab
    regenerate --serve`; its work folder DATA/<set>-work resumes a cut call), then OUT/<set>-regen.jsonl.xz.
    Progress (`draftlab monitor`) every REGEN_SHOW_S in the log."""
    work, final = data / f"{name}-work", regenerated(data, name)
    carried = call.repo / partial(name)
    if not written(final) and not work.is_dir() and carried.is_file():
        with tarfile.open(carried) as tar:
            tar.extractall(data, filter="data")
        call.say(f"resuming the regeneration from the carried {partial(name)}")
    if not written(final):
        source = prompts(call, data, name, rows)
        if not isinstance(source, Path):
            return source
        argv = call.cli(
            "regenerate",
            source,
            work,
            "--output",
            final,
            "--limit",
            rows,
            "--serve",
            call.model_dir,
            "--sglang-servers",
            servers,
            "--sglang-prefix",
            call.sglang_prefix,
            "--concurrency",
            concurrency,
            *REGEN_SAMPLING,
            "--no-progress",
        )
        call.say(f"regenerating {rows} {name} prompts through {servers} servers until {call.left() - 30} s from now")
        stop = threading.Event()
        threading.Thread(target=show_progress, args=(call, work, stop), daemon=True).start()
        rc = until(argv, call.deadline - 30)
        stop.set()
        call.say(f"regeneration: exit {rc}")
        if rc != DONE or not written(final):
            if work.is_dir():  # what is done so far, for a cold machine's next call (carry it as partial(name))
                gpu_pack.tar_gz_without(work, work.name, call.out / f"{work.name}.tar.gz", ("*.log", ".lock"))
            return AGAIN if rc in (CUT, AGAIN) else FAILED
    sent = call.out / f"{final.name}.xz"
    gpu_pack.xz_copy(final, sent, check=True)
    call.say(f"sent back {sent.name}: {gpu_pack.human(sent.stat().st_size)}")
    return DONE


def show_progress(call: Call, work: Path, stop: threading.Event) -> None:
    """`draftlab monitor WORK` (rows done, tok/s, ETA) every REGEN_SHOW_S until `stop`."""
    while not stop.wait(REGEN_SHOW_S):
        if (work / "manifest.json").is_file():  # written once the servers are up
            until(call.cli("monitor", work), min(time.time() + 30, call.deadline))
