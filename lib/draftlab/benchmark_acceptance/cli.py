"""`draftlab bench live`, `bench specdec` and `bench sglang`: live servers, the reference engine, and
SGLang servers started and measured by draftlab (benchmark_acceptance.sglang_study)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

import torch

from draftlab.benchmark_acceptance.cost_cli import add_bench_cost_parser  # noqa: F401 (the command table)
from draftlab.benchmark_acceptance.eval_suite import (
    add_eval_set_options,
    format_table,
    is_suite,
    per_set_results,
    prepare,
)
from draftlab.benchmark_acceptance.live import (
    compare_live,
    load_eval_set,
    run_sweep,
    sweep_grid,
    sweep_plan,
)
from draftlab.benchmark_acceptance.sglang_study import add_bench_sglang_parser  # noqa: F401 (the command table)
from draftlab.core.records import RecordError, write_jsonl
from draftlab.core.serve import require_reachable
from draftlab.engine import (
    MODES,
    TREE_ATTENTION,
    SpecConfig,
    chain_sweep,
    compare,
    encode_prompts,
    public,
)
from draftlab.model.draft import load_draft
from draftlab.model.target import load_target

# --------------------------------------------------------------------------- CLI


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _eval_prompts(name: str, run_dir, limit) -> list[dict]:
    """The evaluation set's prompts, or a RecordError naming the file (`draftlab` prints one line, exit 2).

    Called before any model or server is touched, so a mistyped path costs no model load.
    """
    path = Path(name)
    if name not in ("humaneval", "blend") and not is_suite(name) and not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise RecordError(f"--eval-set {name}: {what}; use humaneval, blend, or a canonical .jsonl file")
    try:
        return load_eval_set(name, run_dir, limit)
    except (FileNotFoundError, ValueError) as exc:
        raise RecordError(f"--eval-set {name}: {exc}") from exc


def _eval_groups(args) -> tuple[list[tuple[str, list]], list | None]:
    """[(set name, prompts)]: the one set, or each set of a suite (eval_suite: decontaminated against
    --train-data, --samples prompts per set); and the suite's sets (None for a single set)."""
    if not is_suite(args.eval_set):
        return [
            (args.eval_set, [p["messages"] for p in _eval_prompts(args.eval_set, args.run_dir, args.samples)])
        ], None
    try:
        sets, _ = prepare(args.eval_set, args.run_dir, args.train_data, args.samples)
    except (FileNotFoundError, ValueError) as exc:
        raise RecordError(f"--eval-set {args.eval_set}: {exc}") from exc
    return [(s.name, [p["messages"] for p in s.prompts]) for s in sets], sets


def _check_draft(folder: str) -> None:
    """An exported draft folder (config.json that parses, model.safetensors), checked before the target loads."""
    path = Path(folder)
    if not path.is_dir():
        raise RecordError(
            f"--draft {folder}: {'is a file' if path.exists() else 'does not exist'}; expected an "
            "exported draft folder (config.json + model.safetensors, from draftlab export)"
        )
    for name in ("config.json", "model.safetensors"):
        if not (path / name).is_file():
            raise RecordError(f"--draft {folder}: no {name}; is it an exported draft (draftlab export)?")
    try:
        json.loads((path / "config.json").read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecordError(f"--draft {folder}: config.json is not JSON ({exc})") from None


def bench_live(args: argparse.Namespace) -> int:
    """`draftlab bench live`: print a sweep plan, or benchmark a baseline and speculative URLs."""
    if args.sweep_commands:
        if not (args.model_path and args.draft_path):
            raise SystemExit("--sweep-commands needs --model-path and --draft-path")
        plan = sweep_plan(
            args.model_path,
            args.draft_path,
            sweep_grid(_ints(args.steps), _ints(args.topk), _ints(args.draft_tokens)),
            max_running_requests=args.max_running_requests,
            port=args.port,
            algorithm=args.algorithm,
        )
        for entry in plan:
            print(f"# {entry['label']}  ({entry['url']})\n{entry['command']}")
        if args.plan:
            Path(args.plan).write_text(json.dumps(plan, indent=2))
            print(f"wrote {args.plan}")
        return 0
    groups, sets = _eval_groups(args)
    if args.plan and not args.baseline:
        try:
            plan = json.loads(Path(args.plan).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise RecordError(f"--plan {args.plan}: not a JSON plan ({exc})") from None
        for entry in plan:
            require_reachable(entry["url"])
    elif args.baseline:
        for url in [args.baseline, *(s.split("=", 1)[-1] for s in args.spec)]:
            require_reachable(url)
    kw = dict(
        model=args.model,
        concurrency=_ints(args.concurrency),
        repeats=args.repeats,
        warmup=args.warmup,
        max_tokens=args.max_tokens,
        meta_info=not args.no_meta_info,
    )
    if not (args.plan or args.baseline):
        raise SystemExit("give --baseline URL (and --spec LABEL=URL ...), or --plan plan.json")
    import pandas as pd

    tables, windows = [], []
    for name, prompts in groups:
        if args.plan and not args.baseline:
            table, got = run_sweep(plan, prompts, eval_set=name, **kw)
        else:
            specs = dict(s.split("=", 1) if "=" in s else (s, s) for s in args.spec)
            table, got = compare_live(args.baseline, specs, prompts, eval_set=name, **kw)
        tables.append(table)
        windows += got
    table = pd.concat(tables, ignore_index=True)
    if sets is not None:
        for (label, conc), g in table.groupby(["label", "concurrency"], sort=False):
            print(format_table(per_set_results(g.to_dict("records"), sets), f"{label} c={conc}"))

    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(table.to_string(index=False))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        table.to_csv(args.out, index=False)
        write_jsonl(Path(args.out).with_suffix(".windows.jsonl"), (asdict(w) for w in windows))
        print(f"wrote {args.out}")
    return 0


def add_bench_live_parser(subparsers) -> None:
    p = subparsers.add_parser("live", help="tokens/s and acceptance length of live SGLang endpoints; sweep commands")
    p.add_argument("--baseline", help="URL of the plain target server (same --max-running-requests)")
    p.add_argument("--spec", action="append", default=[], help="LABEL=URL of a speculative server (repeatable)")
    p.add_argument("--model", default="default", help="the `model` field of requests")
    add_eval_set_options(p)
    p.add_argument("--samples", type=int, default=None, help="first N prompts of the set (suite: of each set)")
    p.add_argument("--concurrency", default="1,8,32")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--no-meta-info", action="store_true", help="do not send return_meta_info (non-SGLang servers)")
    p.add_argument("--out", help="CSV of the summary table (windows beside it as .windows.jsonl)")
    p.add_argument("--sweep-commands", action="store_true", help="print SGLang launch commands for a grid")
    p.add_argument("--plan", help="with --sweep-commands: write the plan here; else benchmark the plan's URLs")
    p.add_argument("--model-path")
    p.add_argument("--draft-path")
    p.add_argument("--algorithm", default="EAGLE3", choices=("EAGLE3", "EAGLE"))
    p.add_argument("--steps", default="1,3,5,7")
    p.add_argument("--topk", default="1,4,8")
    p.add_argument("--draft-tokens", default="8,16,32")
    p.add_argument("--max-running-requests", type=int, default=48)
    p.add_argument("--port", type=int, default=30000)
    p.set_defaults(func=bench_live)


# --------------------------------------------------------------------------- CLI


def bench_specdec(args: argparse.Namespace) -> int:
    """`draftlab bench specdec`: engine greedy vs speculative, chain S=1..7, lossless check.

    The draft folder and the evaluation set are checked first: loading the target takes seconds
    to minutes, and a mistyped path should not cost them."""
    _check_draft(args.draft)
    groups, sets = _eval_groups(args)
    torch.set_num_threads(args.threads)
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    draft = load_draft(args.draft, target)
    steps = [int(s) for s in args.steps.split(",")]
    rows = []
    graphs = {"auto": None, "on": True, "off": False}[args.cuda_graphs]
    for name, prompts in groups:
        ids = encode_prompts(target, prompts)
        if args.topk == 1:
            rows += chain_sweep(
                target,
                draft,
                ids,
                steps,
                args.mode,
                args.max_new_tokens,
                name,
                cuda_graphs=graphs,
                prefill_bucket=args.prefill_bucket,
            )
        else:
            for s in steps:
                cfg = SpecConfig(
                    mode=args.mode,
                    num_steps=s,
                    topk=args.topk,
                    num_draft_tokens=args.num_draft_tokens,
                    max_new_tokens=args.max_new_tokens,
                    cuda_graphs=graphs,
                    prefill_bucket=args.prefill_bucket,
                    draft_tree_attention=args.draft_tree_attention,
                )
                rows.append(public(compare(target, draft, ids, cfg, name)))
    for r in rows:
        print(
            f"{r['eval_set']} n={r['samples']} {r['mode']} S={r['num_steps']} K={r['topk']} "
            f"D={r['num_draft_tokens']}: "
            f"acceptance {r['acceptance_length']:.3f}, greedy {r['greedy']['tokens_per_s']:.1f} tok/s, "
            f"spec {r['speculative']['tokens_per_s']:.1f} tok/s, speedup {r['speedup']:.3f}x "
            f"(decode {r['decode_speedup']:.3f}x), lossless {r['identical_outputs']}/{r['samples']}",
            flush=True,
        )
    for s in dict.fromkeys(r["num_steps"] for r in rows) if sets is not None else ():
        print(format_table(per_set_results([r for r in rows if r["num_steps"] == s], sets), f"S={s}"))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2, default=str))
        print(f"wrote {args.out}")
    return 0 if all(r["lossless"] for r in rows) else 1


def add_bench_specdec_parser(subparsers) -> None:
    p = subparsers.add_parser("specdec", help="reference engine: acceptance length and speedup over its own greedy")
    p.add_argument("--target", default="embedded", help="target spec (embedded, tiny, folder, hub id)")
    p.add_argument("--draft", required=True, help="exported draft folder (RUN_DIR/drafts/eagle3)")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="float32", help="float32 (default: the lossless check is exact) or bfloat16")
    p.add_argument("--cuda-graphs", default="auto", choices=("auto", "on", "off"), help="auto: on with CUDA")
    p.add_argument(
        "--prefill-bucket",
        type=int,
        default=None,
        help="pad prompts to a multiple of this for graphed prefills (default: 64 on CUDA, 0 elsewhere)",
    )
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (2 only on a quiet CPU)")
    p.add_argument("--mode", default="EAGLE3", choices=MODES)
    p.add_argument("--steps", default="1,2,3,4,5,6,7", help="comma-separated chain lengths S")
    p.add_argument("--topk", type=int, default=1)
    p.add_argument("--num-draft-tokens", type=int, default=None)
    p.add_argument(
        "--draft-tree-attention",
        default="sglang",
        choices=TREE_ATTENTION,
        help="trees: what a draft beam attends to, SGLang's per-slot KV (default) or its own ancestors",
    )
    add_eval_set_options(p)
    p.add_argument("--samples", type=int, default=20)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--out", default=None, help="write the rows as JSON here")
    p.set_defaults(func=bench_specdec)
