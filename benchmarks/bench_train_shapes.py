"""Training throughput of the real `draftlab.train_draft` loop by batch-length rounding (pad_multiple),
online or offline target states, eager or compiled.

Why: the reference run trained at ~0.4 s a step where the same step in isolation took ~0.2 s;
real batches come in a new (B, L) shape almost every step, and a GPU pays for kernel plans per
shape. Random weights in the target's shape (timing does not depend on them), the real tokenizer
and conversations, so this needs no GGUF.

Offline states (issue 18's training-speed lever): the target's forward is paid once, in the set-up
(`hidden_precompute_s`, which writes the shards), instead of in every step.

  python3 benchmarks/bench_train_shapes.py BENCH_DIR PAD_MULTIPLE STEPS OUT_JSON [--attention auto]
      [--hidden online|offline] [--compile]

BENCH_DIR holds config.json and the tokenizer files of the target, and train.jsonl.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path

import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

from draftlab.model.target import Target
from draftlab.train_draft import TrainConfig, train


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bench_dir", type=Path)
    ap.add_argument("pad_multiple", type=int)
    ap.add_argument("steps", type=int)
    ap.add_argument("out_json", type=Path)
    ap.add_argument("--attention", default="auto")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hidden", choices=("online", "offline"), default="online")
    ap.add_argument("--compile", action="store_true")
    args = ap.parse_args()
    d = args.bench_dir
    raw = json.loads((d / "config.json").read_text())
    cfg = LlamaConfig(**{k: v for k, v in raw.items() if not k.startswith("_")})
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(args.device, dtype).eval()
    tokenizer = AutoTokenizer.from_pretrained(d)
    target = Target(name="random", path=d, model=model, tokenizer=tokenizer, device=args.device, dtype=dtype)
    with tempfile.TemporaryDirectory() as tmp:
        tc = TrainConfig(
            train_file=str(d / "train.jsonl"),
            out_dir=f"{tmp}/eagle3",
            device=args.device,
            draft_vocab_size=min(16000, cfg.vocab_size),
            ttt_steps=7,
            max_len=2048,
            epochs=1,
            batch_tokens=16384,
            max_batch=64,
            eval_every=10**6,
            save_every=10**6,
            log_every=10,
            stop_after=args.steps,
            pad_multiple=args.pad_multiple,
            attention=args.attention,
            hidden=args.hidden,
            compile=args.compile,
        )
        train(tc, target=target)
        rows = list(csv.DictReader(open(f"{tmp}/eagle3/train.csv")))
        summary = json.loads(Path(f"{tmp}/eagle3/summary.json").read_text())
    # tokens_per_s and elapsed_s are cumulative: the rate after the first logged row leaves warm-up out
    if len(rows) < 2:
        raise SystemExit(f"only {len(rows)} logged row(s): raise STEPS above 2 x log_every (10)")
    first, last = rows[0], rows[-1]
    tok = lambda r: float(r["tokens_per_s"]) * float(r["elapsed_s"])  # noqa: E731
    steady = (tok(last) - tok(first)) / (float(last["elapsed_s"]) - float(first["elapsed_s"]))
    out = {
        "pad_multiple": args.pad_multiple,
        "attention": args.attention,
        "hidden": args.hidden,
        "compile": args.compile,
        "hidden_precompute_s": summary["hidden_precompute_s"],
        "steps": int(last["step"]),
        "elapsed_s": float(last["elapsed_s"]),
        "tokens_per_s_overall": float(last["tokens_per_s"]),
        "tokens_per_s_after_step_" + first["step"]: steady,
        "s_per_step_after_first_log": (float(last["elapsed_s"]) - float(first["elapsed_s"]))
        / (int(last["step"]) - int(first["step"])),
    }
    args.out_json.write_text(json.dumps(out, indent=1))
    print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
