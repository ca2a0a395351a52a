"""`draftlab capture-hidden`: the training conversations' hidden states captured in SGLang, and the
function `draftlab train --hidden sglang` calls for the same work.

The conversations are tokenised exactly as training tokenises them (model.chat_data, the same
cache), the capture ids come from the target's config.json (model.capture), and one SGLang server
(the user's launch flags, any --tp-size) serves every split. Disk space for all splits is checked
before the server starts: a large target takes minutes to load.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from draftlab.core.files import atomic_write_json
from draftlab.model.chat_data import load_tokenized
from draftlab.model.hidden import check_free_disk, estimate_bytes
from draftlab.model.target import load_tokenizer, read_config, resolve_path
from draftlab.sglang.hidden_capture import capture_hidden, capture_plan, resolve_dtype, store_complete
from draftlab.sglang.hidden_server import SGLangCapture
from draftlab.sglang.install import server_env

SHARD_BYTES = 1 << 30  # a shard's size by default (18.7K tokens of a 7168-wide target in bf16): the unit of resumption
HELP = "capture the training conversations' hidden states in SGLang (any --tp-size) for draftlab train"


def capture_splits(
    target: str,
    splits: dict,
    out_dir,
    plan: dict,
    launch_args: str,
    *,
    dtype="bfloat16",
    shard_tokens: int | None = None,
    in_flight: int = 16,
    python: str | None = None,
    prefix: str | None = None,
    startup_timeout: float = 900.0,
) -> dict:
    """{split: capture summary} for splits {name: tokenised dataset} into out_dir/<name>; the server is
    started only when some split has work left."""
    out, torch_dtype = Path(out_dir), resolve_dtype(dtype)
    shard_tokens = shard_tokens or max(1024, SHARD_BYTES // estimate_bytes(1, plan["hidden_size"], True, torch_dtype))
    out.mkdir(parents=True, exist_ok=True)
    total = sum(sum(len(r) for r in ds["input_ids"]) for ds in splits.values())
    check_free_disk(out, estimate_bytes(total, plan["hidden_size"], True, torch_dtype), "all splits' hidden states",
                    "free space, or another --out")  # fmt: skip
    pending = {n: ds for n, ds in splits.items() if not store_complete(out / n, ds, plan, target, torch_dtype)}
    if not pending:
        print(f"{out}: every split's SGLang hidden states are already captured", flush=True)
        return {"target": target, "plan": plan, "sglang_command": None, "startup_s": 0.0, "splits": {}}
    env = server_env(prefix) if prefix else None
    t0 = time.time()
    with SGLangCapture(
        resolve_path(target),
        plan,
        launch_args,
        out / "sglang.log",
        python=python,
        env=env,
        in_flight=in_flight,
        startup_timeout=startup_timeout,
    ) as adapter:
        startup_s = time.time() - t0
        results = {
            name: capture_hidden(adapter, ds, out / name, plan, target, torch_dtype, shard_tokens)
            for name, ds in pending.items()
        }
        command = adapter.command
    summary = {"target": target, "plan": plan, "sglang_command": command, "startup_s": startup_s, "splits": results}
    atomic_write_json(out / "capture.json", summary, indent=1)
    return summary


def capture_for_training(target: str, launch_args: str, hidden_dir, train_ds, val_ds, layers, dtype) -> dict:
    """`draftlab train --hidden sglang`: both splits into hidden_dir/{train,val}, where training reads them."""
    plan = capture_plan(read_config(target), layers)
    splits = {"train": train_ds, **({"val": val_ds} if val_ds is not None else {})}
    return capture_splits(target, splits, hidden_dir, plan, launch_args, dtype=dtype)


def add_capture_parser(subparsers) -> argparse.ArgumentParser:
    ap = subparsers.add_parser("capture-hidden", help=HELP, description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", required=True, help="the target: a folder, a Hub id, a .gguf or embedded")
    ap.add_argument("--train-file", required=True, help="regenerated training conversations (JSONL)")
    ap.add_argument("--val-file", default="", help="validation conversations (JSONL); empty: none")
    ap.add_argument("--out", required=True, help="hidden-state folder: OUT/train, OUT/val (train's hidden_dir)")
    ap.add_argument("--sglang-args", default="", help="the target's SGLang launch flags, e.g. '--tp-size 8 ...'")
    ap.add_argument("--capture-layers", type=int, nargs=3, default=None, metavar="LAYER",
                    help="hidden_states indices (default SGLang's [2, N//2, N-3])")  # fmt: skip
    ap.add_argument("--max-len", type=int, default=2048, help="tokens per conversation (as draftlab train)")
    ap.add_argument("--overlong", default="truncate", choices=["truncate", "drop"])
    ap.add_argument("--max-train-samples", type=int, default=0, help="0: all")
    ap.add_argument("--max-val-samples", type=int, default=256)
    ap.add_argument("--token-cache", default="", help="tokenised conversations' cache (default OUT/../tokens)")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--shard-tokens", type=int, default=None, help="tokens per shard (default: about 1 GB)")
    ap.add_argument("--in-flight", type=int, default=16, help="conversations in flight (batched by SGLang)")
    ap.add_argument("--sglang-python", default=None, help="interpreter that runs SGLang (default this one)")
    ap.add_argument("--sglang-prefix", default=None, help="an offline SGLang bundle install to put first on the path")
    ap.add_argument("--startup-timeout", type=float, default=900.0, help="seconds the server may take to start")
    ap.set_defaults(func=_main)
    return ap


def _main(args) -> int:
    out = Path(args.out)
    tokenizer = load_tokenizer(args.target)
    plan = capture_plan(read_config(args.target), args.capture_layers)
    cache = Path(args.token_cache) if args.token_cache else out.parent / "tokens"
    splits = {"train": load_tokenized(args.train_file, tokenizer, args.max_len, args.overlong, cache,
                                      args.max_train_samples or None)[0]}  # fmt: skip
    if args.val_file:
        splits["val"] = load_tokenized(
            args.val_file, tokenizer, args.max_len, args.overlong, cache, args.max_val_samples or None
        )[0]
    summary = capture_splits(
        args.target,
        splits,
        out,
        plan,
        args.sglang_args,
        dtype=args.dtype,
        shard_tokens=args.shard_tokens,
        in_flight=args.in_flight,
        python=args.sglang_python,
        prefix=args.sglang_prefix,
        startup_timeout=args.startup_timeout,
    )
    for name, s in summary["splits"].items():
        rate = f"{s['tok_s']:,.0f} tok/s" if s["tok_s"] else "nothing left to capture"
        print(f"{name}: {s['samples']} conversations, {s['tokens']:,} tokens in {out / name} ({rate})")
    print(json.dumps({"capture": str(out / "capture.json")}))
    return 0
