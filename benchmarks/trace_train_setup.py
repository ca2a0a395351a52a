"""Where `draftlab train` spends its set-up on the GPU machine (the 2026-11-30 fourth session's
side-by-side children each took ~345 s before their first step; the same set-up takes 37 s on the
2-core CPU VM). Runs notebook 04's full-profile recipe for one arch, stops after STOP steps, dumps
every thread's stack every DUMP_S seconds to stderr (so a call killed at its limit still shows
where it was) and writes a cProfile table sorted by cumulative time.

  python3 benchmarks/trace_train_setup.py RUN_DIR ARCH OUT_TXT [--stop 2] [--dump-s 20] [--device cuda]
"""

from __future__ import annotations

import argparse
import cProfile
import faulthandler
import io
import pstats
import sys
from pathlib import Path

import yaml

from draftlab.train_draft import TrainConfig, train


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("arch")
    ap.add_argument("out_txt", type=Path)
    ap.add_argument("--stop", type=int, default=2)
    ap.add_argument("--dump-s", type=float, default=20.0)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    p = yaml.safe_load(Path("params/full.yaml").read_text())["04_train_draft"]
    regen = args.run_dir / "data" / "regen"
    cfg = TrainConfig(
        train_file=str(regen / "train.jsonl"),
        val_file=str(regen / "val.jsonl"),
        target="embedded",
        device=args.device,
        arch=args.arch,
        out_dir=f"/tmp/trace_train_setup/{args.arch}",
        draft_vocab_size=p["DRAFT_VOCAB_SIZE"],
        max_len=p["MAX_LEN"],
        max_val_samples=p["VAL_SAMPLES"],
        epochs=p["EPOCHS"],
        batch_tokens=p["BATCH_TOKENS"],
        max_batch=p["MAX_BATCH"],
        ttt_steps=p["TTT_STEPS"],
        lr=p["LR"],
        hidden=p["HIDDEN"],
        eval_every=10**6,
        save_every=10**6,
        log_every=1,
        stop_after=args.stop,
    )
    faulthandler.dump_traceback_later(args.dump_s, repeat=True, file=sys.stderr)
    prof = cProfile.Profile()
    prof.enable()
    try:
        train(cfg)
    finally:
        prof.disable()
        faulthandler.cancel_dump_traceback_later()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(60)
        args.out_txt.write_text(buf.getvalue())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
