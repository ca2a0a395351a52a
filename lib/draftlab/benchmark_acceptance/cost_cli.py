"""`draftlab bench cost TARGET`: will speculation pay on this target, at these batch sizes, in SGLang?

Random weights of TARGET's shape and a random EAGLE-3 draft for it; SGLang's plain server and
speculative servers with the acceptance forced (SGLANG_SIMULATE_ACC_LEN); output tok/s at each
batch size and acceptance; the cycle cost fitted per setting; the acceptance needed to break even,
for 1.5x and 2x. Results in OUT (table.csv, summary.json, speedup.png, commands.txt).
"""

from __future__ import annotations

import argparse
import hashlib
import shlex
from pathlib import Path

from draftlab.benchmark_acceptance.cost_bench import finish, print_needed, run_job, write_commands
from draftlab.benchmark_acceptance.cost_measure import CostServer, env_prefix, measure_cell, prompt_ids
from draftlab.benchmark_acceptance.cost_plan import CostJob, ResultsFolder, parse_settings
from draftlab.benchmark_acceptance.cost_shape import (
    build_draft,
    build_target,
    config_digest,
    config_only,
    load_config,
    shape_info,
)
from draftlab.benchmark_acceptance.live import jsonl_prompts
from draftlab.core.errors import InputError, RunFailure
from draftlab.engine import encode_prompts
from draftlab.model.target import load_tokenizer
from draftlab.sglang.commands import cost_command
from draftlab.sglang.install import server_env

DEFAULT_SETTINGS = "chain6,chain3,tree3-4-8"


def _ints(text: str, flag: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"{flag} {text!r}: expected comma-separated integers") from None
    if not values or min(values) < 1:
        raise InputError(f"{flag} {text!r}: expected positive integers")
    return sorted(set(values))


def _project(text: str | None):
    if not text:
        return None
    acc, _, setting = text.partition("@")
    try:
        return float(acc), setting or "chain6"
    except ValueError:
        raise InputError(f"--project {text!r}: expected ACCEPTANCE@SETTING, e.g. 4.10@chain6") from None


def _gpu(dry_run: bool) -> str:
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    if dry_run:
        return "cpu (dry run)"
    raise RunFailure("no CUDA GPU here: bench cost measures SGLang servers on a GPU (--dry-run builds and prints)")


def make_job(args, config, name: str, gpu: str) -> CostJob:
    batches = _ints(args.batches, "--batches")
    settings = parse_settings(args.settings)
    acceptances = _ints(args.acceptances, "--acceptances") if args.acceptances else None
    job = CostJob(
        shape=name,
        config_digest=config_digest(config),
        gpu=gpu,
        settings=settings,
        batches=batches,
        windows=args.windows,
        max_new_tokens=args.max_new_tokens,
        prompt_len=args.prompt_len,
        max_running_requests=args.max_running_requests or max(batches),
        server_flags=shlex.split(args.server_flags),
        weights=args.weights,
        shape_info=shape_info(config),
        acceptances=acceptances,
    )
    for setting in settings:
        if len(job.forced(setting)) < 2:
            raise InputError(
                f"--acceptances {args.acceptances}: {setting.name} accepts 1 .. {setting.max_acceptance}; "
                "give two or more of them (the cycle cost is a line fitted over them)"
            )
    return job


def file_prompts(path: str, tokenizer_dir: str, count: int) -> tuple[list[list[int]], str]:
    """(token ids of the chat prompts in a JSONL file, "FILE sha256:..." for the plan): at least `count`."""
    file = Path(path)
    if not file.is_file():
        raise InputError(f"--prompts {path}: no such file")
    rows = jsonl_prompts(file, None)
    if len(rows) < count:
        raise InputError(f"--prompts {path}: {len(rows)} prompts, fewer than the largest batch {count}")
    try:
        tokenizer = load_tokenizer(tokenizer_dir)
    except (OSError, ValueError) as exc:
        raise InputError(
            f"--tokenizer {tokenizer_dir}: cannot load a tokenizer ({str(exc).splitlines()[0][:200]})"
        ) from None
    ids = encode_prompts(tokenizer, [r["messages"] for r in rows])
    return ids, f"{file.name} sha256:{hashlib.sha256(file.read_bytes()).hexdigest()[:16]} ({len(ids)} prompts)"


def commands_for(job: CostJob, target_dir: Path, draft_dir: Path, args) -> dict:
    """{(setting, acceptance): launch line} of every server of the job (acceptance None: plain)."""
    kw = dict(
        max_running_requests=job.max_running_requests,
        port=args.port,
        mem_fraction_static=args.mem_fraction_static,
        dummy_weights=job.weights == "dummy",
        extra=tuple(job.server_flags),
    )
    out = {}
    for s in job.settings:
        out[(s.name, None)] = cost_command(str(target_dir), **kw)
        spec = cost_command(
            str(target_dir), str(draft_dir), num_steps=s.steps, topk=s.topk, num_draft_tokens=s.draft_tokens, **kw
        )
        for tau in job.forced(s):
            out[(s.name, tau)] = spec
    return out


def bench_cost(args: argparse.Namespace) -> int:
    """`draftlab bench cost`: build, measure what is missing, fit, report."""
    folder = ResultsFolder(args.out)
    check = _check(args)
    if args.report_only:
        return _report(folder, args, check)
    if args.windows < 3 and not args.dry_run:
        raise InputError(f"--windows {args.windows}: at least 3 windows per cell (the median and its spread)")
    if not args.target:
        raise InputError("TARGET missing: a Hugging Face id, a model folder or a config.json")
    config, default_name = load_config(args.target)
    name = args.name or default_name
    job = make_job(args, config, name, _gpu(args.dry_run))
    real = file_prompts(args.prompts, args.tokenizer or args.target, max(job.batches)) if args.prompts else None
    if real:
        job.prompts = real[1]  # part of the job: a rerun with other prompts is refused
    folder.claim(job, record=not args.dry_run)  # refused here, before any model is built
    work = Path(args.work or folder.out / "models") / name
    device = "cuda" if job.gpu != "cpu (dry run)" else "cpu"
    print(f"{name}: {job.shape_info['parameters'] / 1e9:.2f}B parameters; building random models in {work}", flush=True)
    target_dir = (
        config_only(config, work / "target")
        if job.weights == "dummy"
        else build_target(config, work / "target", device=device, source=args.target)
    )
    draft_dir = build_draft(config, work / "draft", device=device)
    commands = commands_for(job, target_dir, draft_dir, args)
    write_commands(
        folder.out / "commands.txt",
        [f"# {name} on {job.gpu}: {s} acceptance {t or 'plain'}\n{env_prefix(t)}{c}" for (s, t), c in commands.items()],
    )
    if args.dry_run:
        print(f"dry run: models in {work}, launch lines in {folder.out / 'commands.txt'}; no server started")
        return 0
    prompts = real[0] if real else prompt_ids(max(job.batches), job.prompt_len, job.shape_info["vocab_size"])
    env = server_env(args.prefix) if args.prefix else None
    logs = folder.out / "logs" / name

    def server_for(setting, tau):
        log = logs / f"{setting.name}-{'plain' if tau is None else f'acc{tau}'}.log"
        command = commands[(setting.name, tau)]
        return CostServer(command, log, acceptance=tau, env=env, python=args.python, timeout=args.startup_timeout)

    def measure(url, batch):
        return measure_cell(
            url,
            batch,
            prompts,
            windows=job.windows,
            max_new_tokens=job.max_new_tokens,
            warmup=args.warmup,
            every_prompt=real is not None,
        )

    try:
        run_job(job, folder, server_for=server_for, measure=measure)
    except BaseException:
        _report(folder, args, check, quiet=True)  # what was measured is reported before the one line
        raise
    return _report(folder, args, check)


def run_bench_cost(target: str, out, **options) -> int:
    """The command from Python (notebook 06): `draftlab bench cost TARGET --out OUT`, options by their
    flag names with underscores (batches="1,4", settings="chain6", server_flags="...")."""
    parser = argparse.ArgumentParser(prog="draftlab bench")
    add_bench_cost_parser(parser.add_subparsers())
    args = parser.parse_args(["cost", str(target), "--out", str(out)])
    for key, value in options.items():
        if not hasattr(args, key) or key == "func":
            raise InputError(f"bench cost: no option --{key.replace('_', '-')}")
        setattr(args, key, value)
    return bench_cost(args)


def _check(args):
    if args.check_acceptance is None and args.check_speedup is None:
        return None
    if args.check_acceptance is None or args.check_speedup is None:
        raise InputError("--check-acceptance and --check-speedup go together (a real draft's measured figures)")
    return {
        "acceptance": args.check_acceptance,
        "measured": args.check_speedup,
        "setting": args.check_setting,
        "batch": args.check_batch,
        "shape": args.check_shape,
    }


def _report(folder: ResultsFolder, args, check, quiet: bool = False) -> int:
    if not folder.rows():
        if quiet:
            return 1
        raise RunFailure(f"{folder.csv_path}: nothing measured yet")
    fits, errors, summary = finish(folder, project=_project(args.project), check=check)
    if quiet:
        return 0
    print_needed(fits)
    for p in summary.get("projection", []):
        print(f"{p['shape']} batch {p['batch']}: acceptance {p['acceptance']} at {p['setting']} -> {p['speedup']}x")
    if "embedded_prediction_error" in summary:
        print(
            f"embedded check: predicted {summary['embedded_predicted_speedup']}x, measured "
            f"{summary['embedded_measured_speedup']}x (error {summary['embedded_prediction_error']:+.1%})"
        )
    print(f"wrote {folder.out}/table.csv, summary.json, speedup.png")
    if errors:
        raise RunFailure(f"{len(errors)} fit(s) refused; first: {errors[0]}")
    return 0


def add_bench_cost_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "cost", help="SGLang's speculative cycle cost on a target's shape (random weights, forced acceptance)"
    )
    p.add_argument("target", nargs="?", help="a Hugging Face id, a model folder or a config.json (no weights needed)")
    p.add_argument("--name", help="the shape's name in the table (default: the folder or id)")
    p.add_argument("--out", default="results/cost-model", help="results folder (several shapes may share it)")
    p.add_argument("--settings", default=DEFAULT_SETTINGS, help="chainS and treeS-K-D settings, in run order")
    p.add_argument("--batches", default="1,4,16,64", help="batch sizes (requests in flight)")
    p.add_argument("--windows", type=int, default=3, help="measured windows per cell (median, min, max)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured windows per cell first (Triton compiles)")
    p.add_argument("--max-new-tokens", type=int, default=256, help="new tokens per request (ignore_eos)")
    p.add_argument("--prompt-len", type=int, default=32, help="random prompt ids per request")
    p.add_argument("--max-running-requests", type=int, help="the same for all servers (default: the largest batch)")
    p.add_argument(
        "--acceptances",
        help="forced acceptances to measure, e.g. 1,4,7 (default: every one, 1 .. S + 1; two or more per setting)",
    )
    p.add_argument(
        "--prompts",
        help="a JSONL of chat prompts (as bench sglang's --eval-set FILE) instead of random ids; "
        "a window then sends all of them, BATCH in flight (the check of a real draft on its own prompts)",
    )
    p.add_argument("--tokenizer", help="with --prompts: the tokenizer's folder (default: TARGET's)")
    p.add_argument(
        "--weights",
        default="files",
        choices=("files", "dummy"),
        help="files: random safetensors; "
        "dummy: SGLang's --load-format dummy (nothing on disk; for shapes larger than the disk)",
    )
    p.add_argument("--work", help="where the random models are built (default OUT/models)")
    p.add_argument("--server-flags", default="", help="extra SGLang flags for every server (quoted)")
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--port", type=int, default=31500)
    p.add_argument("--prefix", help="offline SGLang install (draftlab sglang install) put first on PYTHONPATH")
    p.add_argument("--python", default=None, help="interpreter that runs the servers (default: this one)")
    p.add_argument("--startup-timeout", type=float, default=900.0, help="seconds a server may take to answer")
    p.add_argument("--project", default="4.10@chain6", help="ACCEPTANCE@SETTING: its predicted speedup per shape")
    p.add_argument("--check-acceptance", type=float, help="embedded check: a real draft's measured acceptance")
    p.add_argument("--check-speedup", type=float, help="embedded check: its measured speedup (same flags, batch)")
    p.add_argument("--check-setting", default="chain6")
    p.add_argument("--check-batch", type=int, default=1)
    p.add_argument("--check-shape", default="smollm2-135m", help="the shape name of the embedded target")
    p.add_argument("--dry-run", action="store_true", help="build the models and write commands.txt; no servers")
    p.add_argument("--report-only", action="store_true", help="table, summary and plot from OUT's measurements")
    p.set_defaults(func=bench_cost)
