"""The stages of a GPU call: each notebook run until the call's deadline, and the resume rules.

A stage runs as `draftlab run --profile PROFILE --run-id reference --results DL/results NN` (the
call's STAGE_COMMAND) and is stopped at the deadline with all its descendants, the notebook's
kernel included (core.process.run_until): that is a cut (exit 124). Stages 03, 04 and 07 resume
where a cut left them (03 by row id; 04 and 07 from checkpoints and finished subsets). Any other
stage cut starts again at the beginning of the next call, only as that call's first stage, and is
skipped after two cuts (said so; the caller lowers its size, e.g. P06="-p SAMPLES 32").
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

from draftlab.core.process import run_until
from ops.gpu_call import CUT, GRACE_S, Call
from ops.gpu_steps import add_seconds, stage_done

RESUMABLE = ("03", "04", "07")
DONE, FAILED, AGAIN = 0, 1, 2  # run_pending: every stage done | one failed | call again
MIN_LEFT_S = 60  # no stage starts with less than this left


def notebook_name(call: Call, nb: str) -> str:
    found = sorted((call.repo / "notebooks").glob(f"{nb}_*.py"))
    return found[0].stem if found else f"{nb}_*"


def cuts(call: Call, nb: str) -> int:
    """How many calls' deadlines cut stage `nb` so far."""
    path = call.run / "params.d" / f"{nb}.cuts"
    try:
        return int(path.read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def add_cut(call: Call, nb: str) -> int:
    path = call.run / "params.d" / f"{nb}.cuts"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{cuts(call, nb) + 1}\n")
    return cuts(call, nb)


def overrides_for(call: Call, nb: str) -> list[str]:
    """The GPU machine's own overrides for stage `nb`, then the caller's (P<NN>)."""
    extra = list(call.overrides.get(nb, []))
    if nb == "01":  # no network there: the catalog snapshot, said so
        return ["-p", "LIVE", "false", *extra]
    if nb == "05":  # no serving packages (fastapi, uvicorn) there
        return ["-p", "PROBE_SERVER", "false", *extra]
    return extra


def _exit_code(rc: int) -> int:
    return 128 - rc if rc < 0 else rc  # killed by signal N: 128 + N, as bash reports it


def run_stage(call: Call, nb: str, args: list[str]) -> int:
    """One notebook into RUN until it ends or the deadline passes (then CUT). Records its params and
    this call's wall time (a cut call's included: the runner records only calls that finish)."""
    t_start = int(time.time())
    call.say(f"stage {nb}: start ({call.left()} s left in this call)")
    argv = [
        *call.stage_command,
        "--profile",
        call.profile,
        "--run-id",
        call.run_id,
        "--results",
        str(call.results),
        nb,
        *args,
    ]

    def on_deadline(proc, kids):
        call.say(
            f"deadline: stopping pid {proc.pid} and its children {' '.join(map(str, kids))} (the next call resumes)"
        )

    # SIGTERM at the deadline, SIGKILL GRACE_S later: 04 and 07 checkpoint and exit, the next call resumes them
    rc = run_until(argv, call.deadline, grace=GRACE_S, on_deadline=on_deadline)
    rc = CUT if rc is None else _exit_code(rc)
    params_d = call.run / "params.d"
    params_d.mkdir(parents=True, exist_ok=True)
    if (call.run / "params.yaml").is_file():
        shutil.copyfile(call.run / "params.yaml", params_d / f"{nb}.yaml")
    add_seconds(params_d / f"{nb}.seconds.json", notebook_name(call, nb), int(time.time()) - t_start)
    call.say(f"stage {nb}: exit {rc}")
    return rc


def run_pending(call: Call) -> tuple[int, list[str]]:
    """The stages not done yet, in order, until the deadline: (DONE | FAILED | AGAIN, stages skipped)."""
    started_any, skipped = False, []
    for nb in call.stages:
        if stage_done(call.run, nb):
            continue
        if call.left() < MIN_LEFT_S:
            call.say(f"less than {MIN_LEFT_S} s left: stopping before {nb}")
            return AGAIN, skipped
        if nb not in RESUMABLE and cuts(call, nb) >= 1:
            if cuts(call, nb) >= 2:
                call.say(f"WARNING: stage {nb} was cut twice by the deadline: skipped (lower its size)")
                skipped.append(nb)
                continue
            if started_any:
                call.say(f"stage {nb} needs a whole call: stopping here")
                return AGAIN, skipped
        started_any = True
        rc = run_stage(call, nb, overrides_for(call, nb))
        if rc == CUT:
            add_cut(call, nb)
            return AGAIN, skipped
        if rc != 0:
            call.say(f"stage {nb} failed: see the log")
            return FAILED, skipped
        if not stage_done(call.run, nb):
            if nb == "07":
                call.say("07 ran out of its time budget: rerun step.sh to finish it")
                return AGAIN, skipped
            call.say(f"stage {nb} wrote no metrics: see the log")
            return FAILED, skipped
    return DONE, skipped


def write_skipped(path: str | Path | None, skipped: list[str]) -> None:
    """For common.sh's run_pending wrapper: SKIPPED=" 06 ..." as bash set it."""
    if path:
        Path(path).write_text("".join(f" {nb}" for nb in skipped))
