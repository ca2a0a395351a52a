"""`draftlab regenerate`, `draftlab monitor`, `draftlab bench client` and `draftlab bench generate`."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Iterable

from draftlab.core.errors import InputError, RunFailure, run_command
from draftlab.core.options import interruptible, number, one_line_errors
from draftlab.core.serve import LocalServer
from draftlab.model.target import load_target, resolve_path
from draftlab.regenerate import monitor
from draftlab.regenerate.batch import regenerate_batch, sweep_batch_sizes
from draftlab.regenerate.bench import bench_client
from draftlab.regenerate.client import check_base_url
from draftlab.regenerate.config import (
    SYSTEM_POLICIES,
    TRUNCATION_POLICIES,
    RegenConfig,
    load_conversations,
)
from draftlab.regenerate.monitor import format_summary, plot_throughput, summarize
from draftlab.regenerate.outputs import finalize
from draftlab.regenerate.stage import regenerate
from draftlab.sglang.server import serve_target

# ------------------------------------------------------------------ CLI


def _add_sampling_args(p: argparse.ArgumentParser) -> None:
    d = RegenConfig()
    g = p.add_argument_group("sampling and policies (recorded on every row)")
    g.add_argument("--max-tokens", type=number(int, 1), default=d.max_tokens)
    g.add_argument("--temperature", type=number(float, 0), default=d.temperature)
    g.add_argument("--top-p", type=number(float, 0, above=True, high=1), default=d.top_p)
    g.add_argument("--stop", action="append", default=None, help="stop string (repeatable)")
    g.add_argument("--seed", type=number(int, 0, hint="leave it out for no seed"), default=None)
    g.add_argument("--system-policy", choices=SYSTEM_POLICIES, default=d.system_policy)
    g.add_argument("--system-prompt", default="", help="the system prompt for --system-policy set")
    g.add_argument(
        "--truncation",
        choices=TRUNCATION_POLICIES,
        default=d.truncation,
        help="what to do with answers cut at max-tokens (finish_reason=length)",
    )
    g.add_argument("--max-assistant-turns", type=number(int, 0), default=0, help="0: all turns")


def add_regenerate_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "regenerate",
        help="answer every prompt again with the target (resumable)",
        description="Regenerate conversations with the target: a local/remote OpenAI-compatible "
        "server (--base-url, or --serve to start transformers serve) or the static "
        "batch backend (--backend batch, the GPU path). Rerun the same command to "
        "resume after any crash.",
    )
    p.add_argument("input", help="canonical conversations, JSONL")
    p.add_argument("work", help="work folder (shards, errors, manifest); resume state lives here")
    p.add_argument("--output", default=None, help="final JSONL in input order (written at the end)")
    p.add_argument("--backend", choices=("server", "batch"), default="server")
    p.add_argument("--base-url", action="append", default=[], help="server base URL (repeatable)")
    p.add_argument(
        "--serve",
        default=None,
        metavar="TARGET",
        help="start `transformers serve` for this target spec or folder on loopback",
    )
    p.add_argument(
        "--sglang-servers",
        type=number(int, 0),
        default=0,
        metavar="K",
        help="with --serve: start K SGLang servers of TARGET on this GPU instead of transformers serve "
        "(one scheduler does not keep a small target's GPU busy; logs in --log-dir)",
    )
    p.add_argument("--sglang-prefix", default=None, help="offline SGLang install (`draftlab sglang install`)")
    p.add_argument("--model", default=None, help="model field of requests (default: the served folder)")
    p.add_argument("--model-name", default="", help="name recorded on rows")
    p.add_argument("--concurrency", type=number(int, 1), default=8, help="in-flight requests per server")
    p.add_argument("--timeout", type=number(float, 0, above=True), default=120.0, help="seconds per request")
    p.add_argument("--max-retries", type=number(int, 0), default=5)
    p.add_argument(
        "--max-outage",
        type=number(float, 0),
        default=RegenConfig.max_outage,
        help="seconds with no server reachable before the run stops (resumable; default %(default)s)",
    )
    p.add_argument("--limit", type=number(int, 0), default=0, help="only the first N input rows")
    p.add_argument("--shard-rows", type=number(int, 1), default=10000)
    p.add_argument("--no-retry-errors", action="store_true", help="on resume, skip ids in errors.jsonl")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--log-dir", default=None, help="where --serve writes serve.log (default: work)")
    g = p.add_argument_group("batch backend (--backend batch) and --serve")
    g.add_argument("--target", default="embedded", help="target spec for the batch backend")
    g.add_argument("--device", default="auto", help="auto | cpu | cuda (batch backend, --serve)")
    g.add_argument("--dtype", default=None, help="default: bfloat16 on CUDA, float32 on CPU")
    g.add_argument("--batch-size", type=number(int, 1), default=1024)
    g.add_argument(
        "--batch-tokens",
        type=number(int, 0),
        default=0,
        help="padded tokens (rows x (longest prompt + max tokens)) per generate call at most; 0: no limit",
    )
    g.add_argument(
        "--cache",
        choices=("dynamic", "static"),
        default="dynamic",
        help="KV cache of generate; static lets transformers compile the step on CUDA",
    )
    _add_sampling_args(p)
    one_line_errors(p)
    p.set_defaults(func=interruptible(_regenerate_cli, _kept))


def config_from_args(args: argparse.Namespace, model: str) -> RegenConfig:
    return RegenConfig(
        model=model,
        model_name=args.model_name,
        temperature=args.temperature,
        top_p=args.top_p,
        max_tokens=args.max_tokens,
        stop=args.stop,
        seed=args.seed,
        system_policy=args.system_policy,
        system_prompt=args.system_prompt,
        truncation=args.truncation,
        max_assistant_turns=args.max_assistant_turns,
        concurrency=args.concurrency,
        request_timeout=args.timeout,
        max_retries=args.max_retries,
        max_outage=args.max_outage,
        shard_rows=args.shard_rows,
        retry_errors=not args.no_retry_errors,
    )


def _check_args(args: argparse.Namespace) -> None:
    """The flag errors a run would otherwise meet late (or never, waiting): InputError at once."""
    if args.backend == "server" and not args.serve and (not args.base_url or not args.model):
        missing = " and ".join(x for x, v in (("--base-url URL", args.base_url), ("--model NAME", args.model)) if not v)
        raise InputError(f"regenerate: give {missing}, or --serve TARGET")
    args.base_url = [check_base_url(url) for url in args.base_url]
    if args.output and Path(args.output).is_dir():
        raise InputError(f"--output {args.output}: is a folder; give the final JSONL file's path")
    if args.output and _blocked(Path(args.output).parent):
        raise InputError(f"--output {args.output}: {_blocked(Path(args.output).parent)} is a file, not a folder")
    if args.log_dir and (Path(args.log_dir).is_file() or _blocked(Path(args.log_dir))):
        raise InputError(f"--log-dir {args.log_dir}: is a file (or under one); give a folder")
    if args.limit < 0:
        raise InputError(f"--limit {args.limit}: must be >= 0 (0: every row)")
    if args.sglang_servers < 0 or (args.sglang_servers and not args.serve):
        raise InputError(f"--sglang-servers {args.sglang_servers}: needs --serve TARGET and a count >= 1")


def _blocked(folder: Path) -> Path | None:
    """The first existing non-folder on the way to `folder` (where it could never be created)."""
    for part in [*reversed(folder.parents), folder]:
        if part.exists() and not part.is_dir():
            return part
    return None


def _kept(args: argparse.Namespace) -> str:
    return f"the rows finished so far are kept in {args.work}: rerun the same command to resume"


def _say_failed(summary: dict, work: Path) -> None:
    """One line on stderr when rows failed: how many, why, where they are (the summary has the counts)."""
    n = summary["rows_error"]
    if n:
        why = ", ".join(f"{k} x{v}" for k, v in sorted(summary["error_reasons"].items(), key=lambda kv: -kv[1]))
        print(
            f"error: {n} of {summary['rows_total']} rows failed ({why}); see {work / 'errors.jsonl'}; "
            "a rerun of the same command retries them",
            file=sys.stderr,
            flush=True,
        )


def _regenerate_cli(args: argparse.Namespace) -> int:
    _check_args(args)
    config_from_args(args, model=args.model or "")  # flag values are checked before any work
    rows = load_conversations(args.input, args.limit)
    if not rows:
        raise InputError(f"{args.input}: no conversations in the file (it is empty or blank)")
    work = Path(args.work)
    if args.backend == "batch":
        config = config_from_args(args, model=args.target)
        summary = regenerate_batch(
            rows,
            work,
            config,
            target=args.target,
            device=args.device,
            dtype=args.dtype,
            batch_size=args.batch_size,
            input_path=args.input,
            progress=not args.no_progress,
            cache=args.cache,
            batch_tokens=args.batch_tokens,
        )
    elif args.serve:
        log_dir = Path(args.log_dir or work)
        servers = serve_target(
            args.serve, log_dir, sglang_servers=args.sglang_servers, prefix=args.sglang_prefix, device=args.device
        )
        with servers:
            urls = servers.urls
            print(f"servers {urls} ready in {servers.startup_s:.1f} s (logs in {log_dir})", flush=True)
            config = config_from_args(args, model=args.model or servers.model)
            config.model_name = args.model_name or Path(servers.model).name
            summary = regenerate(
                rows,
                work,
                [*urls, *args.base_url],
                config,
                input_path=args.input,
                progress=not args.no_progress,
                children=getattr(servers, "servers", [servers]),
            )
    else:
        config = config_from_args(args, model=args.model)
        summary = regenerate(rows, work, args.base_url, config, input_path=args.input, progress=not args.no_progress)
    if args.output:
        summary["final"] = finalize(work, args.output, rows)
    print(json.dumps(summary, indent=1))
    _say_failed(summary, work)
    kept = summary["final"]["rows_kept"] if args.output else summary["rows_done"] + summary["rows_skipped_resume"]
    if not kept and not summary["rows_error"]:
        raise RunFailure(
            f"no rows kept: {summary['rows_dropped_truncated']} answers were cut at --max-tokens "
            f"{args.max_tokens} and dropped (--truncation drop); raise --max-tokens or use --truncation keep_flag"
        )
    return 0 if summary["rows_error"] == 0 else 1


def add_bench_client_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "client",
        help="client overhead: draftlab regenerate vs bare openai-SDK gather",
        description="Side by side against the same server at the same concurrency; prints "
        "tokens/s of each and their ratio (>= 1.0 means no client overhead).",
    )
    p.add_argument("--base-url", default=None, help="an existing server")
    p.add_argument("--model", default=None, help="model field of requests")
    p.add_argument(
        "--serve", default=None, metavar="TARGET", help="start transformers serve for this target (default: embedded)"
    )
    p.add_argument("--n", type=int, default=64, help="requests per round")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--device", default="cpu", help="device of the --serve server")
    p.add_argument("--json", default=None, help="also write the result here")
    p.set_defaults(func=_bench_client_cli)


def _bench_client_cli(args: argparse.Namespace) -> int:
    kw = dict(n=args.n, concurrency=args.concurrency, max_tokens=args.max_tokens, rounds=args.rounds)
    if args.base_url:
        if not args.model:
            raise SystemExit("bench client: --base-url needs --model")
        res = bench_client(args.base_url, args.model, **kw)
    else:
        import tempfile

        folder = resolve_path(args.serve or "embedded")
        log = Path(tempfile.mkdtemp(prefix="draftlab-bench-")) / "serve.log"
        with LocalServer(folder, log_path=log, device=args.device) as srv:
            res = bench_client(srv.base_url, srv.model, **kw)
    res["target"] = args.serve or args.model
    text = json.dumps(res, indent=1)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m draftlab.regenerate")
    sub = parser.add_subparsers(dest="command", required=True)
    add_regenerate_parser(sub)
    add_bench_client_parser(sub)
    args = parser.parse_args(argv)
    return run_command(args.func, args)


def add_bench_generate_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "generate",
        help="batch backend: output tokens/s of generate by batch size",
        description="Decode throughput of the regeneration batch backend at several batch sizes on "
        "real prompts (each row forced to --new-tokens); prints one JSON line per size.",
    )
    p.add_argument("prompts", help="canonical conversations (.jsonl), e.g. RUN/data/blend/train.jsonl")
    p.add_argument("--target", default="embedded")
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default=None, help="default: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--batch-sizes", default="512,1024,2048,4096,8192")
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--cache", choices=["dynamic", "static"], default="dynamic")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--json", default=None, help="also write the rows here")
    p.set_defaults(func=_bench_generate_cli)


def _bench_generate_cli(args) -> int:
    sizes = [int(x) for x in args.batch_sizes.split(",") if x.strip()]
    rows = load_conversations(args.prompts)  # all: the batches are taken around the median length
    target = load_target(args.target, device=args.device, dtype=args.dtype)
    res = sweep_batch_sizes(target, [r["messages"] for r in rows], sizes, args.new_tokens, args.cache, args.repeats)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"target": target.name, "device": str(target.device), "dtype": str(target.dtype), "rows": res}, indent=1
            )
        )
    return 0


def add_monitor_parser(subparsers) -> None:
    p = subparsers.add_parser("monitor", help="progress of a regeneration work folder", description=monitor.__doc__)
    p.add_argument("work", help="the work folder given to `draftlab regenerate`")
    p.add_argument("--window", type=number(float, 0, above=True), default=5.0, help="minutes for the recent rates")
    p.add_argument("--watch", type=number(float, 0), default=0.0, help="refresh every N seconds (0: once)")
    p.add_argument(
        "--plot",
        nargs="?",
        const="",
        default=None,
        metavar="PNG",
        help="draw throughput over time (default file: WORK/throughput.png)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    one_line_errors(p)
    p.set_defaults(func=interruptible(_monitor_cli, lambda args: f"{args.work} was only read"))


def _monitor_cli(args: argparse.Namespace) -> int:
    plot = None
    if args.plot is not None:
        plot = Path(args.plot) if args.plot else Path(args.work) / "throughput.png"
        if args.plot and (plot.is_dir() or not plot.parent.is_dir()):
            raise InputError(f"--plot {args.plot}: give a PNG file path in an existing folder")
    while True:
        s = summarize(args.work, window_s=args.window * 60)
        print(json.dumps(s, indent=1) if args.json else format_summary(s), flush=True)
        if plot is not None:
            import matplotlib

            matplotlib.use("Agg")
            fig = plot_throughput(args.work)
            fig.savefig(plot, dpi=100)
            print(f"plot: {plot}")
        if s["damaged"]:
            raise RunFailure(
                f"{s['damaged'][0]}: not valid JSON mid-file ({len(s['damaged'])} such line(s)); the folder is "
                "not complete: remove the line (its row is redone on resume)"
            )
        if not args.watch or (s["left"] == 0 and not s["writer_alive"]):
            return 0
        time.sleep(args.watch)
        print()
