"""Where tokenising conversations for training spends its time: cProfile over the first N rows.

Why: on the H200 machine (2026-12-01) `draftlab train` tokenised the regenerated set at 20-60
conversations/s against ~750/s on the 2-core VM, so a 21.6K-row set took 6 minutes per process.

  python3 benchmarks/tokenize_profile.py MODEL_DIR TRAIN_JSONL [N] [TARGET DEVICE]

With TARGET and DEVICE (e.g. embedded cuda) the target is loaded first, as `draftlab train` does.
"""

import cProfile
import io
import pstats
import sys
import time
from itertools import islice

import transformers

from draftlab.core.records import read_jsonl
from draftlab.model.chat_data import tokenize_rows
from draftlab.model.target import load_target, load_tokenizer


def main() -> int:
    model_dir, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 300
    if len(sys.argv) > 5:
        tok = load_target(sys.argv[4], device=sys.argv[5]).tokenizer
    else:
        tok = load_tokenizer(model_dir)
    print(f"transformers {transformers.__version__}, {type(tok).__name__}, fast={getattr(tok, 'is_fast', None)}")
    rows = list(islice(read_jsonl(path), n))
    prof = cProfile.Profile()
    t = time.perf_counter()
    prof.enable()
    tokenize_rows(rows, tok, 2048)
    prof.disable()
    dt = time.perf_counter() - t
    print(f"{len(rows)} conversations in {dt:.1f} s: {len(rows) / dt:.0f} conv/s")
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(25)
    print(s.getvalue()[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
