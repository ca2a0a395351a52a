"""Prompt-lookup acceptance on regenerated conversations (their answers are the target's greedy
output, re-tokenised from text: close to, not exactly, the decoded tokens).

  .venv/bin/python benchmarks/lookup_baseline.py RUN/data/regen/val.jsonl
      [--rows 200] [--max-tokens 128] [--steps 1,3,6]
"""

import argparse
import json

from draftlab.benchmark_acceptance.lookup import lookup_acceptance
from draftlab.core.records import read_jsonl
from draftlab.model.target import load_tokenizer, render_chat


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("regen_jsonl")
    ap.add_argument("--rows", type=int, default=200)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--steps", default="1,3,6")
    ap.add_argument("--target", default="embedded")
    args = ap.parse_args()
    tok = load_tokenizer(args.target)
    prompts, answers = [], []
    for row in read_jsonl(args.regen_jsonl):
        if len(prompts) == args.rows:
            break
        msgs = row["messages"]
        text = render_chat(tok, msgs[:-1], add_generation_prompt=True)
        prompts.append(tok(text, add_special_tokens=False)["input_ids"])
        answers.append(tok(msgs[-1]["content"], add_special_tokens=False)["input_ids"][: args.max_tokens])
    for s in map(int, args.steps.split(",")):
        print(json.dumps(lookup_acceptance(prompts, answers, s)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
