"""`python -m studies.recipes`: the recipe study's steps (studies.recipes.study), each resumable;
SIGTERM/SIGINT stops a step cleanly (exit 128 + the signal) and the same command resumes it."""

from __future__ import annotations

import argparse
import json
import shlex
from pathlib import Path

from draftlab.core.errors import InputError, run_command
from draftlab.core.records import read_jsonl
from draftlab.data_scaling.fits import completion_tokens
from draftlab.engine import encode_prompts
from draftlab.model.target import load_tokenizer
from draftlab.sglang.install import server_env
from draftlab.train_draft import TrainConfig
from studies.recipes.broad import broad_prompts
from studies.recipes.calibration import calibrate
from studies.recipes.rows import EXTRA_ROWS, MULTI_TURN_SKIP, ROWS
from studies.recipes.size_curve import sglang_size_curve
from studies.recipes.speed import SPEED_VARIANTS, check_speed
from studies.recipes.study import (
    MEASURED_CONCURRENCY,
    measure_rows,
    prompt_sets,
    train_rows,
    write_combined,
    write_report,
)
from studies.recipes.volume import extra_prompts, grow_rows, multi_turn_held_out, multi_turn_prompts


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m studies.recipes",
        description="the recipe study: one draft per recipe row, all measured in SGLang",
    )
    sub = p.add_subparsers(dest="step", required=True)
    rows_help = f"comma-separated rows of {', '.join(ROWS)}"

    t = sub.add_parser("train", help="train the rows not trained yet (resumes cut ones)")
    t.add_argument("--rows", required=True, help=rows_help)
    t.add_argument("--train-file", required=True, help="regenerated conversations (JSONL)")
    t.add_argument("--val-file", required=True)
    t.add_argument("--out", required=True, help="the study folder: OUT/<row>/{train,draft,train.log}")
    t.add_argument("--target", default="embedded")
    t.add_argument("--parallel", type=int, default=1, help="rows trained at once on the one device")
    t.add_argument(
        "--set",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="a TrainConfig setting for every row that does not change the recipe (e.g. save_every 100)",
    )
    t.set_defaults(func=_train)

    s = sub.add_parser("speed", help="the reference recipe by each objective variant for a few steps: OUT/speed.json")
    s.add_argument("--variants", default="eager,compiled", help=f"comma-separated, of {', '.join(SPEED_VARIANTS)}")
    s.add_argument("--train-file", required=True)
    s.add_argument("--val-file", required=True)
    s.add_argument("--out", required=True, help="the study folder: OUT/speed/<variant>, OUT/speed.json")
    s.add_argument("--target", default="embedded")
    s.add_argument("--steps", type=int, default=30, help="steps per variant (rates from the 2nd logged window on)")
    s.add_argument("--samples", type=int, default=0, help="training conversations at most (0: all)")
    s.add_argument("--per-variant-s", type=float, default=240, help="each variant's run at most")
    s.add_argument(
        "--set",
        nargs=2,
        action="append",
        default=[],
        metavar=("KEY", "VALUE"),
        help="a TrainConfig setting for every variant (e.g. device cuda)",
    )
    s.set_defaults(func=_speed)

    m = sub.add_parser("measure", help="every trained row's draft and SGLang's baseline, on the same prompt ids")
    m.add_argument("--rows", required=True, help=rows_help)
    m.add_argument("--out", required=True)
    m.add_argument("--model-path", required=True, help="the target's HF folder (served and tokenised)")
    m.add_argument("--held-out", required=True, help="the blend's held-out split (canonical JSONL)")
    m.add_argument("--samples", type=int, default=64, help="held-out prompts")
    m.add_argument("--humaneval", type=int, default=32, help="HumanEval prompts after them (0: none)")
    m.add_argument("--multi-turn", help="held-out multi-turn prompts (recipes multi-turn-held-out), after those")
    m.add_argument("--multi-turn-samples", type=int, default=0, help="of --multi-turn (0: none)")
    m.add_argument("--steps", type=int, default=6, help="chain length S of every row's main server")
    m.add_argument("--chain", default="", help="more chain lengths S, a server each per row (e.g. 1,2,3,4,5,6,7)")
    m.add_argument("--chain-rows", default="", help="the rows that get the --chain servers (default: all)")
    m.add_argument(
        "--concurrency",
        default=",".join(map(str, MEASURED_CONCURRENCY)),
        help="comma-separated; acceptance per prompt comes from the first",
    )
    m.add_argument(
        "--repeats", type=int, default=3, help="rounds of measured windows over every server (the table: their median)"
    )
    m.add_argument(
        "--server-flags", default="", help="more SGLang flags for every server (--server-flags=--sleep-on-idle)"
    )
    m.add_argument("--prefix", help="offline SGLang install put first on PYTHONPATH")
    m.set_defaults(func=_measure)

    r = sub.add_parser("report", help="OUT/table.csv and OUT/recipes.png from what OUT holds")
    r.add_argument("--out", required=True)
    r.set_defaults(func=_report)

    c = sub.add_parser("combine", help="one table and plot across study folders, each row against its study's base")
    c.add_argument("--studies", required=True, help="comma-separated study folders, oldest first (the last wins)")
    c.add_argument("--out", required=True, help="folder for table.csv and recipes.png")
    c.set_defaults(func=_combine)

    k = sub.add_parser(
        "calibrate",
        help="SGLang acceptance against the training's validation over a combined table's rows; "
        "estimates for rows trained but not measured: OUT/calibration.json, .csv and .png",
    )
    k.add_argument("--table", required=True, help="the study's combine table.csv")
    k.add_argument(
        "--predict",
        action="append",
        default=[],
        metavar="ROW=TRAIN_DIR",
        help="a row's train folder (OUT/<row>/train, its summary.json): estimated, not measured",
    )
    k.add_argument("--out", required=True)
    k.set_defaults(func=_calibrate)

    z = sub.add_parser(
        "size-curve",
        help="the data-size rows' SGLang acceptance vs conversations, fits and the "
        "extrapolation: OUT/size_curve.json and .png",
    )
    z.add_argument("--studies", required=True, help="comma-separated study folders, oldest first (the last wins)")
    z.add_argument("--out", required=True)
    z.add_argument(
        "--regen-tok-s",
        type=float,
        required=True,
        help="measured output tok/s of regenerating with the target (e.g. recipes.sh PHASE=regen's log)",
    )
    z.add_argument("--regen-source", required=True, help="where that rate was measured (kept in the JSON)")
    z.add_argument(
        "--regenerated",
        default="results/reference/data/regen/train.jsonl.xz",
        help="a regenerated set: its mean answer tokens per conversation",
    )
    z.add_argument("--factor", type=float, default=10.0, help="extrapolate to FACTOR x the largest set")
    z.set_defaults(func=_size_curve)

    e = sub.add_parser(
        "extra-prompts", help="the data-volume row's prompts: a larger blend's that the reference has not seen"
    )
    e.add_argument("--blend-train", required=True, help="the larger blend's train split (blend-offline-large.yaml)")
    e.add_argument("--seen", required=True, help="comma-separated JSONL(.xz) files whose prompts are left out")
    e.add_argument("--n", type=int, required=True, help="prompts to write (the blend's shuffled order)")
    e.add_argument("--out", required=True, help=".jsonl.xz")
    e.set_defaults(func=_extra)

    g = sub.add_parser(
        "grow", help="the data-volume rows' own train files: the train file and regenerated extra prompts"
    )
    g.add_argument("--rows", required=True, help=f"comma-separated; those of {', '.join(EXTRA_ROWS)} get a file")
    g.add_argument("--train-file", required=True, help="the study's train file; the rows' files are written beside it")
    g.add_argument(
        "--regenerated",
        required=True,
        action="append",
        help="SET=FILE: a set of prompts regenerated by the target (JSONL(.xz)); SET extra, multi-turn or broad, "
        "a bare FILE is extra; repeat for each",
    )
    g.set_defaults(func=_grow)

    m = sub.add_parser(
        "multi-turn", help="two-turn prompts from the extra prompts not yet regenerated (the data2x-mt row's)"
    )
    m.add_argument("--extra", required=True, help="the extra prompts (the extra-prompts step), .jsonl.xz")
    m.add_argument("--skip", type=int, default=MULTI_TURN_SKIP, help="leave out the first SKIP (already regenerated)")
    m.add_argument("--n", type=int, required=True, help="two-turn prompts to write")
    m.add_argument("--out", required=True, help=".jsonl.xz")
    m.set_defaults(func=_multi_turn)

    b = sub.add_parser("broad-prompts", help="the best-broad row's prompts: five kinds written by the target itself")
    b.add_argument("--base-url", action="append", required=True, help="a server of the target (repeatable)")
    b.add_argument("--model", required=True, help="the `model` field of requests and the tokenizer's folder")
    b.add_argument("--n", type=int, required=True, help="prompts over every kind (broad.KINDS' shares)")
    b.add_argument("--work", required=True, help="each kind's prompts as they are made (resumes)")
    b.add_argument("--out", required=True, help=".jsonl.xz")
    b.add_argument("--concurrency", type=int, default=64, help="requests in flight over the servers")
    b.add_argument("--seed", type=int, default=0)
    b.set_defaults(func=_broad)

    h = sub.add_parser(
        "multi-turn-held-out", help="held-out multi-turn prompts: a regenerated val conversation and a follow-up"
    )
    h.add_argument("--val", required=True, help="the regenerated held-out conversations (the target's answers)")
    h.add_argument("--skip", type=int, default=256, help="leave out the first SKIP (the training's validation)")
    h.add_argument("--n", type=int, required=True, help="prompts to write")
    h.add_argument("--out", required=True, help=".jsonl (recipes measure --multi-turn)")
    h.set_defaults(func=_multi_turn_held_out)
    return p


def main(argv: list[str] | None = None) -> int:
    """Bad input: one line, exit 2; a stop by SIGTERM/SIGINT: one line, exit 128 + the signal."""
    args = build_parser().parse_args(argv)
    return run_command(args.func, args)


def _rows(text: str) -> list[str]:
    return [r for r in text.split(",") if r]


def _train(args: argparse.Namespace) -> int:
    status = train_rows(
        _rows(args.rows),
        args.train_file,
        args.val_file,
        Path(args.out),
        target=args.target,
        parallel=args.parallel,
        extra=TrainConfig.from_text(args.set),
    )
    return 0 if all(v == "done" for v in status.values()) else 1


def _speed(args: argparse.Namespace) -> int:
    res = check_speed(
        _rows(args.variants),
        args.train_file,
        args.val_file,
        Path(args.out),
        target=args.target,
        steps=args.steps,
        samples=args.samples,
        per_variant_s=args.per_variant_s,
        extra=TrainConfig.from_text(args.set),
    )
    return 0 if len(res) > 1 else 1


def _measure(args: argparse.Namespace) -> int:
    prompts, sets = prompt_sets(args.held_out, args.samples, args.humaneval, args.multi_turn, args.multi_turn_samples)
    ids = encode_prompts(load_tokenizer(args.model_path), [p["messages"] for p in prompts])
    levels = [int(c) for c in args.concurrency.split(",") if c]
    measure_rows(
        _rows(args.rows),
        Path(args.out),
        args.model_path,
        ids,
        sets,
        steps=args.steps,
        chain=[int(s) for s in args.chain.split(",") if s],
        chain_rows=_rows(args.chain_rows) or None,
        concurrency=levels,
        env=server_env(args.prefix) if args.prefix else None,
        repeats=args.repeats,
        server_flags=tuple(shlex.split(args.server_flags)),
    )
    return _report(args)


def _report(args: argparse.Namespace) -> int:
    df = write_report(Path(args.out))
    print(df.to_string(index=False))
    return 0


def _combine(args: argparse.Namespace) -> int:
    df = write_combined([Path(s) for s in _rows(args.studies)], Path(args.out))
    print(df.to_string(index=False))
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    predict = {}
    for item in args.predict:
        row, sep, train_dir = item.partition("=")
        if not (sep and row and train_dir):
            raise InputError(f"recipes calibrate: --predict {item!r}: expected ROW=TRAIN_DIR")
        predict[row] = Path(train_dir)
    result = calibrate(Path(args.table), predict, Path(args.out))
    for prompts, line in result["lines"].items():
        print(
            f"{prompts}: sglang = {line['intercept']:.3f} + {line['slope']:.3f} x sim over {len(line['rows'])} rows, "
            f"r {line['r']:.4f}, residual sd {line['residual_sd']:.3f}, leave-one-out rmse "
            f"{line['leave_one_out_rmse']:.3f} (worst {line['leave_one_out_worst']['row']} "
            f"{line['leave_one_out_worst']['miss']:+.3f})"
        )
    for e in result["estimates"]:
        print(
            f"{e['row']} {e['prompts']}: predicted {e['predicted']:.2f} ({e['low_95']:.2f}-{e['high_95']:.2f}, 95%) "
            f"from sim {e['sim']:.3f} at step {e['at_step']} (not measured)"
        )
    return 0


def _grow(args: argparse.Namespace) -> int:
    sets = dict(item.split("=", 1) if "=" in item else ("extra", item) for item in args.regenerated)
    print(json.dumps(grow_rows(_rows(args.rows), args.train_file, sets)))
    return 0


def _multi_turn(args: argparse.Namespace) -> int:
    print(json.dumps(multi_turn_prompts(Path(args.extra), args.skip, args.n, Path(args.out))))
    return 0


def _broad(args: argparse.Namespace) -> int:
    result = broad_prompts(
        args.base_url, args.model, args.n, Path(args.work), Path(args.out), concurrency=args.concurrency, seed=args.seed
    )
    print(json.dumps(result))
    return 0


def _multi_turn_held_out(args: argparse.Namespace) -> int:
    print(json.dumps(multi_turn_held_out(Path(args.val), args.skip, args.n, Path(args.out))))
    return 0


def _size_curve(args: argparse.Namespace) -> int:
    tokens = completion_tokens(list(read_jsonl(args.regenerated)))
    regeneration = {
        "tok_s": args.regen_tok_s,
        "tok_s_source": args.regen_source,
        "mean_completion_tokens": sum(tokens) / len(tokens),
        "tokens_source": args.regenerated,
    }
    sglang_size_curve(_rows(args.studies), Path(args.out), regeneration, factor=args.factor)
    return 0


def _extra(args: argparse.Namespace) -> int:
    print(extra_prompts(Path(args.blend_train), [Path(p) for p in _rows(args.seen)], args.n, Path(args.out)))
    return 0
