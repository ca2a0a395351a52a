"""The evaluation suite on the GPU machine (recipes.sh PHASE=suite): each draft of PUBLISHED and ROWS served by
SGLang at chain S = 6, batch 1, greedy, 128 new tokens, on every set of draftlab's evaluation suite (`draftlab
bench sglang --eval-set suite`, SUITE_SAMPLES prompts a set). Every draft meets the same prompts: the sets are
decontaminated against every measured row's training file that is here. Then STUDY/suite/summary.json in the
shape of results/eval-suite/summary.json: sglang_version, gpu, the prompts' decontamination, and per draft its
sets (kind, n, acceptance) and mean_general. A cut call resumes (each row's `bench sglang` continues its own).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from draftlab.core.files import atomic_write_json
from ops import gpu_sglang
from ops.gpu_call import CUT, Call, until
from studies.recipes.rows import ROWS, row_train_file

DONE, AGAIN, FAILED = 0, 3, 1
# as the published SGLang figures were measured: chain S = 6, batch 1, 128 new tokens, one server at a time
BENCH = ("--max-new-tokens", "128", "--chain", "6", "--main-steps", "6", "--trees", "none", "--concurrency", "1")
WINDOWS = ("--no-wrong-flag", "--repeats", "1", "--warmup", "1")  # acceptance is the aim: one measured window
MEM_FRACTION = "0.3"  # the embedded target: two servers (baseline, draft) of a 135M model at once


def suite_rows(call: Call, rows: list[str], study: Path, data: Path, samples: int, server_flags: str) -> int:
    """`draftlab bench sglang --eval-set suite` of each row's draft (STUDY/<row>/draft) into STUDY/suite/<row>,
    until 30 s before the deadline; then STUDY/suite/summary.json. DONE, AGAIN (cut) or FAILED."""
    missing = [r for r in rows if not (study / r / "draft/model.safetensors").is_file()]
    if missing or not rows:
        call.say(f"FAILED: suite: no draft here for {', '.join(missing) or 'any row (PUBLISHED, ROWS)'}")
        return FAILED
    train = data / "train.jsonl"
    files = sorted({row_train_file(r, str(train)) for r in rows if r in ROWS} | {str(train)})
    files = [f for f in files if Path(f).is_file()]
    for row in rows:
        out = study / "suite" / row / "sglang" / "study"
        argv = call.cli(
            "bench", "sglang", "--model-path", call.model_dir, "--draft", study / row / "draft", "--eval-set",
            "suite", *(f"--train-data={f}" for f in files), "--samples", samples, *BENCH, *WINDOWS,
            f"--server-flags={server_flags}", "--mem-fraction-static", MEM_FRACTION, "--prefix", call.sglang_prefix,
            "--out", out,
        )  # fmt: skip
        call.say(f"suite: {row} ({call.left()} s left)")
        rc = until(argv, call.deadline - 30, quiet=True)
        if rc != DONE:
            call.say(f"suite: {row}: exit {rc}")
            return AGAIN if rc in (CUT, AGAIN) else FAILED
    summary = write_summary(study / "suite", rows, files, gpu_sglang.sglang_dir(call) / "version.txt")
    call.say(f"suite: wrote {summary}")
    return DONE


def write_summary(suite: Path, rows: list[str], train_files: list[str], version_file: Path) -> Path:
    """SUITE/summary.json from each row's SUITE/<row>/sglang/study/eval_suite.json (its draft's server);
    SGLang's version as gpu_sglang.install_sglang recorded it in `version_file`."""
    drafts = {}
    for row in rows:
        per_label = json.loads((suite / row / "sglang/study/eval_suite.json").read_text())
        spec = [label for label in per_label if label != "baseline"]
        if len(spec) != 1:
            raise RuntimeError(f"{suite / row}: expected one speculative server, found {spec}")
        drafts[row] = {"server": spec[0], **per_label[spec[0]]}
    summary = {
        "sglang_version": version_file.read_text().strip() if version_file.is_file() else "unknown (not recorded)",
        "gpu": _gpu(),
        "settings": "chain S = 6, batch 1, greedy, 128 new tokens",
        "decontaminated_against": [Path(f).name for f in train_files],
        "drafts": drafts,
    }
    path = suite / "summary.json"
    atomic_write_json(path, summary, indent=1)
    return path


def _gpu() -> str:
    try:
        argv = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
        run = subprocess.run(argv, capture_output=True, text=True)
    except OSError:
        return "unknown (no nvidia-smi)"
    return run.stdout.strip().splitlines()[0] if run.stdout.strip() else "unknown"
