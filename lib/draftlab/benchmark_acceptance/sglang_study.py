"""`draftlab bench sglang`: the draft measured in real SGLang against SGLang's own plain decoding.

Why one command: a user with a GPU and a draft wants one table that answers "is it faster in the
server I run?" — the baseline and every speculative setting on the same prompt ids, with equal
`--max-running-requests`, started and stopped by draftlab (draftlab.sglang.live).

The plan: `baseline` (no draft) and the main chain at every concurrency level; the rest of the
chain sweep S = 1..7 at batch 1; trees (S, K, D) at batch 1 and the main concurrency list; the
same draft under the wrong `--speculative-algorithm EAGLE` at the main S, batch 1; per `--variant
NAME=FLAGS` the baseline and the main chain once more at batch 1 with those extra server flags (labels
end in [NAME]), to find what lowers the server's own cost of a cycle. `--server-flags` go to every server:
e.g. `--sleep-on-idle`, so that the servers waiting their turn do not each spin a CPU thread at 100% (SGLang's
IdleSleeper docstring) beside the one measured at batch 1, where the host's loop is most of a step.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from pathlib import Path

import pandas as pd

from draftlab.benchmark_acceptance.eval_suite import (
    add_eval_set_options,
    interleave,
    is_suite,
    plan_fields,
    prepare,
    report_sglang,
)
from draftlab.benchmark_acceptance.live import load_eval_set, sweep_plan
from draftlab.benchmark_acceptance.sglang_figures import draw_study_figures
from draftlab.benchmark_acceptance.sglang_live import PER_STREAM, Entry, measure, summarize
from draftlab.benchmark_acceptance.sglang_report import variant_table, write_summary
from draftlab.core.errors import InputError, RunFailure
from draftlab.engine import encode_prompts
from draftlab.model.target import load_tokenizer
from draftlab.sglang.install import server_env

# flags that served the embedded target on one H200 (../shared/docs/platform-notes.md): triton
# attention (the bundle drops FA3's kernels), the pytorch sampler, no grammar backend
NCCL_PORT_OFFSET = 100  # server i: HTTP on --port + i, torch.distributed's rendezvous on --port + 100 + i
DEFAULT_SERVER_FLAGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch", "--grammar-backend", "none")


def study_server_flags(
    mem_fraction_static: float, max_total_tokens: int, more: tuple[str, ...] = ()
) -> tuple[str, ...]:
    """The flags every server of a study shares: DEFAULT_SERVER_FLAGS, its KV pool and the caller's (--server-flags).
    SGLang sizes its KV pool from the memory free at its start minus (1 - fraction) of the GPU, so servers started
    together each take a high fraction and a fixed pool (--max-total-tokens)."""
    pool = ("--mem-fraction-static", str(mem_fraction_static), "--max-total-tokens", str(max_total_tokens))
    return (*DEFAULT_SERVER_FLAGS, *pool, *more)


def _ints(text: str) -> list[int]:
    return [int(x) for x in str(text).split(",") if x.strip()]


def _trees(text: str) -> list[tuple[int, int, int]]:
    """ "5x4x8,6x8x16" -> [(5, 4, 8), (6, 8, 16)] as (steps, topk, draft tokens); "none": no trees."""
    out = []
    if str(text).strip().lower() == "none":
        return out
    for item in filter(None, (t.strip() for t in str(text).split(","))):
        parts = item.lower().split("x")
        if len(parts) != 3:
            raise ValueError(f"tree {item!r}: expected STEPSxTOPKxDRAFT_TOKENS, e.g. 5x4x8")
        out.append(tuple(int(p) for p in parts))
    return out


def _variants(items: list[str]) -> list[tuple[str, tuple[str, ...]]]:
    """["no-overlap=--disable-overlap-schedule"] -> [("no-overlap", ("--disable-overlap-schedule",))]."""
    out = []
    for item in items:
        name, _, flags = item.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9._-]+", name) or not flags.strip():
            raise InputError(f"--variant {item!r}: expected NAME=FLAGS, e.g. no-overlap=--disable-overlap-schedule")
        if name in {n for n, _ in out}:
            raise InputError(f"--variant {item!r}: the name {name!r} is given twice")
        out.append((name, tuple(shlex.split(flags))))
    return out


def study_entries(
    model_path: str,
    draft_path: str,
    *,
    chain: list[int],
    main_steps: int,
    trees: list[tuple[int, int, int]],
    concurrency: list[int],
    wrong_flag: bool,
    max_running_requests: int,
    port: int,
    extra: tuple[str, ...],
    variants: list[tuple[str, tuple[str, ...]]] = (),
) -> list[Entry]:
    """The plan's servers as Entries (launch commands from draftlab.bench.sweep_plan)."""
    grid = sorted({(s, 1, s + 1) for s in chain} | {(main_steps, 1, main_steps + 1)} | set(trees))
    common = dict(max_running_requests=max_running_requests, port=port, extra=extra)
    plan = sweep_plan(model_path, draft_path, grid, **common)
    entries = []
    for p in plan:
        main = p["steps"] is None or (p["topk"] == 1 and p["steps"] == main_steps) or p["topk"] != 1
        entries.append(
            Entry(
                p["label"],
                p["command"],
                concurrency if main else [1],
                p["steps"],
                p["topk"],
                p["draft_tokens"],
                None if p["steps"] is None else "EAGLE3",
            )
        )
    if wrong_flag:
        s = main_steps
        wrong = sweep_plan(
            model_path, draft_path, [(s, 1, s + 1)], algorithm="EAGLE", **{**common, "port": port + len(plan)}
        )[1]
        entries.append(Entry(wrong["label"], wrong["command"], [1], s, 1, s + 1, "EAGLE"))
    next_port = port + len(plan) + (2 if wrong_flag else 0)  # the wrong flag's plan had its own baseline port
    for name, flags in variants:
        s = main_steps
        pair = sweep_plan(
            model_path, draft_path, [(s, 1, s + 1)], **{**common, "port": next_port, "extra": extra + flags}
        )
        next_port += len(pair)
        for p in pair:  # the baseline and chain S with the variant's flags, batch 1
            algorithm = None if p["steps"] is None else "EAGLE3"
            entries.append(
                Entry(
                    f"{p['label']} [{name}]",
                    p["command"],
                    [1],
                    p["steps"],
                    p["topk"],
                    p["draft_tokens"],
                    algorithm,
                    variant=name,
                )
            )
    for i, e in enumerate(entries):  # graphs for the batch sizes measured (capture time grows with the largest)
        e.command += f" --cuda-graph-max-bs {max(e.concurrency)}"
        # servers started together each picked a free NCCL port and two got the same (EADDRINUSE)
        e.command += f" --nccl-port {port + NCCL_PORT_OFFSET + i}"
    return entries


def bench_sglang(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if args.summary_only:
        print(f"wrote {write_summary(out.parents[1])}")
        if args.figures:
            for path in draw_study_figures(out.parents[1], args.main_steps):
                print(f"wrote {path}")
        return 0
    if not (args.model_path and args.draft):
        raise InputError("bench sglang: give --model-path and --draft (or --summary-only)")
    concurrency = _ints(args.concurrency)
    # concurrency c gets PER_STREAM * c prompts (sglang_live.measure_server); batch 1 the first --samples
    suite = None
    if is_suite(args.eval_set):  # --samples prompts of each set (eval_suite), all of them measured at batch 1
        sets, report = prepare(args.eval_set, args.run_dir, args.train_data, args.samples)
        prompts, suite = interleave(sets), plan_fields(sets, report)
        args.samples = len(prompts)
    else:
        prompts = load_eval_set(args.eval_set, args.run_dir, max(args.samples, PER_STREAM * max(concurrency)))
        if len(prompts) < args.samples:
            raise InputError(f"{args.eval_set}: {len(prompts)} prompts, fewer than --samples {args.samples}")
    tokenizer = load_tokenizer(args.model_path)
    ids = encode_prompts(tokenizer, [p["messages"] for p in prompts])
    server_flags = tuple(shlex.split(args.server_flags))
    extra = study_server_flags(args.mem_fraction_static, args.max_total_tokens, server_flags)
    variants = _variants(args.variant)
    entries = study_entries(
        args.model_path,
        args.draft,
        chain=_ints(args.chain),
        main_steps=args.main_steps,
        trees=_trees(args.trees),
        concurrency=concurrency,
        wrong_flag=not args.no_wrong_flag,
        max_running_requests=args.max_running_requests,
        port=args.port,
        extra=extra,
        variants=variants,
    )
    out.mkdir(parents=True, exist_ok=True)
    (out / "plan.json").write_text(
        json.dumps(
            {
                "eval_set": args.eval_set,
                "samples": args.samples,
                **(suite or {}),
                "per_stream": PER_STREAM,
                "prompt_ids": ids,
                "entries": [e.__dict__ for e in entries],
                "max_new_tokens": args.max_new_tokens,
                "warmup_windows": args.warmup,
                "repeats": args.repeats,
                "variants": {name: list(flags) for name, flags in variants},
                "server_flags": list(server_flags),
            },
            indent=1,
        )
    )
    env = server_env(args.prefix) if args.prefix else None
    measure(
        entries,
        ids,
        out,
        repeats=args.repeats,
        warmup=args.warmup,
        max_new_tokens=args.max_new_tokens,
        env=env,
        python=args.python,
        startup_timeout=args.startup_timeout,
        samples=args.samples,
    )
    if not (out / "windows.jsonl").is_file():
        raise RunFailure(f"{out}: no server was measured; why each did not start: {out / 'failures.jsonl'}")
    table = summarize(out)
    table.to_csv(out / "summary.csv", index=False)
    if suite:
        print(f"wrote {report_sglang(out)}")
    print(f"wrote {write_summary(out.parents[1])}")
    with pd.option_context("display.width", 220, "display.max_columns", 30):
        print(table.to_string(index=False))
    by = variant_table(table, args.main_steps) if variants else None
    if by is not None and not by.empty:
        by.insert(1, "flags", [" ".join(dict(variants).get(v, ())) for v in by["variant"]])
        by.to_csv(out / "variants.csv", index=False)
        print(by.to_string(index=False))
    done = set(table["label"])
    missing = [e.label for e in entries if e.label not in done]
    if missing:
        print(f"not measured yet: {', '.join(missing)} (rerun the same command to continue)", file=sys.stderr)
        return 3
    return 0


def add_bench_sglang_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sglang", help="start SGLang servers (baseline, chain, trees, wrong flag) and measure them"
    )
    p.add_argument("--model-path", help="the target's HF folder (served and tokenised)")
    p.add_argument("--draft", help="exported EAGLE-3 draft folder")
    add_eval_set_options(p)
    p.add_argument("--samples", type=int, default=64, help="prompts at batch 1 (a suite: per set, all measured)")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--chain", default="1,2,3,4,5,6,7", help="chain lengths S measured at batch 1")
    p.add_argument("--main-steps", type=int, default=6, help="the chain S also measured at every concurrency")
    p.add_argument(
        "--trees", default="5x4x8,6x8x16", help="trees as STEPSxTOPKxDRAFT_TOKENS (comma-separated), or none"
    )
    p.add_argument("--concurrency", default="1,4,16,64", help="for the baseline, the main chain and the trees")
    p.add_argument("--no-wrong-flag", action="store_true", help="skip the `--speculative-algorithm EAGLE` server")
    p.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=FLAGS (repeatable; give it as --variant=NAME=FLAGS): the baseline and the main chain once more "
        "at batch 1 with these extra SGLang flags, e.g. --variant=no-overlap=--disable-overlap-schedule; "
        "OUT/variants.csv compares them with the study's own flags",
    )
    p.add_argument(
        "--server-flags",
        default="",
        help="more SGLang flags for every server (one string; give it as --server-flags=FLAGS), e.g. "
        "--server-flags=--sleep-on-idle: idle servers then wait on their sockets instead of spinning a CPU thread",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1, help="unmeasured windows per concurrency before the repeats")
    p.add_argument("--max-running-requests", type=int, default=64, help="the same for every server")
    p.add_argument(
        "--mem-fraction-static",
        type=float,
        default=0.9,
        help="per server (all start at once: the pool is bounded by --max-total-tokens)",
    )
    p.add_argument("--max-total-tokens", type=int, default=65536, help="KV pool of each server, in tokens")
    p.add_argument("--port", type=int, default=31000)
    p.add_argument("--prefix", help="offline SGLang install (draftlab sglang install) put first on PYTHONPATH")
    p.add_argument("--python", default=None, help="interpreter that runs the servers (default: this one)")
    p.add_argument("--startup-timeout", type=float, default=900.0)
    p.add_argument(
        "--out",
        required=True,
        help="RUN/sglang/study: plan.json, windows.jsonl, outputs/, servers/*.log, "
        "summary.csv; RUN/sglang/summary.json beside it gets the run's SGLang figures",
    )
    p.add_argument(
        "--summary-only",
        action="store_true",
        help="measure nothing: write RUN/sglang/summary.json from what OUT and the oracle files hold",
    )
    p.add_argument(
        "--figures",
        action="store_true",
        help="with --summary-only: also draw RUN/figures/sglang_*.png (tok/s by concurrency, acceptance "
        "by S beside the engine's, break-even fitted to both)",
    )
    p.set_defaults(func=bench_sglang)
