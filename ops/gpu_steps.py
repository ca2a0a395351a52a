"""The records of the resumable GPU run: whether a stage is done, the wall time of each call, and
the benchmark records. The call's control flow (set-up, stages until the deadline, benchmarks,
state and packing) is ops.gpu_step's; ops/gpu/common.sh's stage_done calls this one.

    python3 -m ops.gpu_steps stage-done RUN NN           exit 0 when notebook NN is done
    python3 -m ops.gpu_steps add-seconds FILE NAME S     add S seconds to NAME in FILE
    python3 -m ops.gpu_steps offline-summary DIR OUT     the offline-hidden benchmark's record
    python3 -m ops.gpu_steps merge-json OUT FILE...      a JSON list of the files' objects
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

from draftlab.core.files import atomic_write_json


def stage_done(run_dir, nb: str) -> bool:
    """Notebook `nb`'s metrics are in RUN/metrics.json (07: and its study is complete)."""
    path = Path(run_dir) / "metrics.json"
    metrics = json.loads(path.read_text()) if path.is_file() else {}
    key = next((k for k in metrics if k.split("_")[0] == nb), None)
    return key is not None and (nb != "07" or metrics[key].get("complete", False))


def add_seconds(path, name: str, seconds: int) -> dict:
    """This call's wall time of a stage, a cut call's included (the runner records only calls that finish)."""
    path = Path(path)
    old = json.loads(path.read_text()) if path.is_file() else {}
    old[name] = old.get(name, 0) + int(seconds)
    atomic_write_json(path, old)
    return old


def offline_summary(bench_dir, out) -> dict:
    """The offline-hidden benchmark: last training row, summary, bytes of the shards."""
    d = Path(bench_dir)
    rows = list(csv.DictReader(open(d / "eagle3" / "train.csv")))
    summary_path = d / "eagle3" / "summary.json"
    record = {
        "train_csv_last": rows[-1] if rows else None,
        "summary": json.loads(summary_path.read_text()) if summary_path.is_file() else {},
        "hidden_bytes": sum(f.stat().st_size for f in (d / "hidden").rglob("*") if f.is_file()),
        "note": "offline hidden states, embedded target, bf16 shards",
    }
    Path(out).write_text(json.dumps(record, indent=1))
    return record


def merge_json(out, files) -> list:
    """One JSON list of the objects in `files` (the training-shape variants)."""
    merged = [json.loads(Path(f).read_text()) for f in files]
    Path(out).write_text(json.dumps(merged, indent=1))
    return merged


def main(argv: list[str]) -> int:
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    if command == "stage-done" and len(args) == 2:
        return 0 if stage_done(*args) else 1
    if command == "add-seconds" and len(args) == 3:
        add_seconds(args[0], args[1], int(args[2]))
        return 0
    if command == "offline-summary" and len(args) == 2:
        print(json.dumps(offline_summary(*args), indent=1))
        return 0
    if command == "merge-json" and len(args) >= 2:
        print(json.dumps(merge_json(args[0], args[1:]), indent=1))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
