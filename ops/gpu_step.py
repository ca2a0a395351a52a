"""A step of the resumable reference run on the GPU machine (ops/gpu/step.sh), and the commands
that ops/gpu/common.sh's functions call.

    python3 -m ops.gpu_step step [--budget-s S] [--stages "00 01 ..."] [--p06 "-p SAMPLES 32"]
        set-up (wheels, GGUF, target, state), then the stages not done yet until the deadline; when
        all are done, the extra benchmarks with the time left, the draft and results/reference packed.
        Exit 0: done, OUT/reference.tar.gz written; 3: call again (OUT/state-run.tar.xz*); 1: failed.
    python3 -m ops.gpu_step ensure-all | ensure-wheels | ensure-gguf | ensure-target | restore-state
    python3 -m ops.gpu_step run-stage NN [-p KEY VALUE ...]      exit: the stage's, 124 when cut
    python3 -m ops.gpu_step run-pending [--skipped-file F]       exit 0 done, 1 failed, 2 call again
    python3 -m ops.gpu_step save-state | save-draft [ARCH] | pack-reference | report
    python3 -m ops.gpu_step bench sweep|attention|static|offline|shapes
    python3 -m ops.gpu_step bench generate NAME CACHE SIZES
    python3 -m ops.gpu_step sglang [PHASE]      sglang.sh's phases (ops.gpu_sglang; PHASE env)
    python3 -m ops.gpu_step recipes [PHASE]     recipes.sh's phases (ops.gpu_recipes; PHASE env)
    python3 -m ops.gpu_step draft-benches       bench_draft.sh's call (ops.gpu_draft_bench)
    python3 -m ops.gpu_step trace-setup [--limit S]   trace_train_setup.sh (gpu_bench.trace_setup)
    python3 -m ops.gpu_step regen-servers [--k K --n N --concurrency C --mem F --full|--no-full]
    python3 -m ops.gpu_step regen-feed [--n N --c C]       the regeneration measurements (gpu_regen)
Knobs: the environment as ops.gpu_call reads it (OUT, DL, SITE, SCRATCH, PROFILE, BUDGET_S,
STAGES, P<NN>); BENCHES=1 adds the benchmarks of issues 4 and 5; ATTN_CHECK=0 skips the cuDNN check;
regen-servers reads K, N, CONCURRENCY, MEM, FULL, regen-feed N, C, draft-benches SAMPLES, MIN_LEFT,
BENCH and trace-setup LIMIT as their scripts did. Every command first unpacks a carried compile cache
(ops.gpu_compile_cache); SEND_COMPILE_CACHE=1 sends the call's back after a sglang or recipes phase.
The options win over the environment.
"""

from __future__ import annotations

import argparse
import os
import sys

from ops import (
    gpu_bench,
    gpu_call,
    gpu_compile_cache,
    gpu_draft_bench,
    gpu_pack,
    gpu_recipes,
    gpu_regen,
    gpu_sglang,
    gpu_stages,
)
from ops.gpu_call import Call

DONE, AGAIN, FAILED = 0, 3, 1  # step's exit codes


def step(call: Call, *, benches: bool = False, attn_check: bool = True, setup=gpu_call.ensure_all) -> int:
    """What step.sh does: one call's share of the run, then the state or the packed results in OUT."""
    if not setup(call):
        call.say("FAILED: set-up (see above)")
        gpu_pack.save_state(call)
        return FAILED
    if benches:  # while the GPU has nothing else to do (carry .device/bench for the training shapes)
        gpu_bench.benches_before(call)
    rc, skipped = gpu_stages.run_pending(call)
    gpu_pack.report(call)
    if rc == gpu_stages.DONE:
        if attn_check and call.left() > 200:  # does batched generate pay cuDNN's per-shape cost too?
            gpu_bench.bench_generate_attention(call)
        if benches:
            gpu_bench.bench_train_offline(call)  # the offline-hidden throughput, with the time left
            gpu_bench.bench_generate_static(call)
        missing = "".join(f" {nb}" for nb in skipped)
        if skipped:
            call.say(f"WARNING: packed WITHOUT stages{missing} (cut twice by the deadline)")
        gpu_pack.save_draft(call, "eagle3")
        if gpu_pack.pack_reference(call) != 0:
            return FAILED
        call.say(
            f"DONE{f' (except{missing})' if skipped else ''}: {call.out / 'reference.tar.gz'} -> here: "
            f"tar -xzf <files_at>/reference.tar.gz -C results/"
        )
        return DONE
    gpu_pack.save_state(call)
    if rc == gpu_stages.AGAIN:
        call.say("NOT DONE YET. NEXT: ops/gpu/step.sh again (carry [.whl])")
        return AGAIN
    call.say("FAILED (see the log above)")
    return FAILED


SETUP = {
    "ensure-all": gpu_call.ensure_all,
    "ensure-wheels": gpu_call.ensure_wheels,
    "ensure-gguf": gpu_call.ensure_gguf,
    "ensure-target": gpu_call.ensure_target,
    "restore-state": gpu_call.restore_state,
}


def parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    common.add_argument("--budget-s", type=int, help="this call's deadline, s after its start (default: BUDGET_S)")
    common.add_argument("--deadline", type=int, help="this call's deadline, epoch s (common.sh's)")
    common.add_argument("--stages", help='the stages, in order (default: STAGES, else "00 01 02 03 04 06 05 07")')
    for nn in range(10):
        common.add_argument(
            f"--p{nn:02d}",
            metavar="ARGS",
            help=f"stage {nn:02d}'s overrides (default: P{nn:02d})" if nn == 0 else argparse.SUPPRESS,
        )
    p = argparse.ArgumentParser(
        prog="python3 -m ops.gpu_step",
        description=__doc__,
        allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("step", parents=[common], help="one call of the reference run (step.sh)")
    s.add_argument("--benches", action=argparse.BooleanOptionalAction, default=os.environ.get("BENCHES", "0") == "1")
    s.add_argument(
        "--attn-check", action=argparse.BooleanOptionalAction, default=os.environ.get("ATTN_CHECK", "1") == "1"
    )
    for name in SETUP:
        sub.add_parser(name, parents=[common])
    s = sub.add_parser("run-stage", parents=[common])
    s.add_argument("nb")
    s.add_argument("args", nargs=argparse.REMAINDER)
    sub.add_parser("run-pending", parents=[common]).add_argument("--skipped-file")
    for name in ("save-state", "pack-reference", "report"):
        sub.add_parser(name, parents=[common])
    sub.add_parser("save-draft", parents=[common]).add_argument("arch", nargs="?", default="eagle3")
    s = sub.add_parser("bench", parents=[common])
    s.add_argument("name", choices=[*gpu_bench.BENCHES, "generate"])
    s.add_argument("generate", nargs="*", metavar="NAME CACHE SIZES", help="for `bench generate`")
    # a knob's string default is converted by `type` only when its command is the one run: recipes.sh's
    # CONCURRENCY=1,16 is not regen-servers' integer
    env = os.environ.get
    s = sub.add_parser("sglang", parents=[common], help="a phase of ops/gpu/sglang.sh")
    s.add_argument("phase", nargs="?", default=env("PHASE") or "stash")
    s = sub.add_parser("recipes", parents=[common], help="a phase of ops/gpu/recipes.sh")
    s.add_argument("phase", nargs="?", default=env("PHASE") or "stash")
    sub.add_parser("draft-benches", parents=[common], help="ops/gpu/bench_draft.sh")
    s = sub.add_parser("trace-setup", parents=[common], help="ops/gpu/trace_train_setup.sh")
    s.add_argument("--limit", type=float, default=env("LIMIT") or "400", help="each arch's s (LIMIT, else 400)")
    s = sub.add_parser("regen-servers", parents=[common], help="ops/gpu/regen_servers.sh")
    s.add_argument("--k", type=int, default=env("K") or "4", help="servers (default: K, else 4)")
    s.add_argument("--n", type=int, default=env("N") or "4096", help="rows (default: N, else 4096)")
    s.add_argument("--concurrency", type=int, default=env("CONCURRENCY") or "512", help="per server")
    s.add_argument("--mem", type=float, default=env("MEM") or "0.5", help="--mem-fraction-static")
    s.add_argument(
        "--full",
        action=argparse.BooleanOptionalAction,
        default=(env("FULL") or "1") == "1",
        help="then the whole train split through all K (default: FULL, else 1)",
    )
    s = sub.add_parser("regen-feed", parents=[common], help="ops/gpu/regen_feed.sh")
    s.add_argument("--n", type=int, default=env("N") or "4096", help="rows (default: N, else 4096)")
    s.add_argument("--c", type=int, default=env("C") or "1024", help="in flight (default: C, else 1024)")
    return p


def call_from(args) -> Call:
    overrides = {
        f"{nn:02d}": getattr(args, f"p{nn:02d}").split() for nn in range(10) if getattr(args, f"p{nn:02d}") is not None
    }
    return Call.from_env(
        budget_s=args.budget_s, deadline=args.deadline, stages=args.stages, overrides=overrides
    ).enter()


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    call = call_from(args)
    gpu_compile_cache.restore(call)  # before anything compiles; once per machine
    if args.command == "step":
        return step(call, benches=args.benches, attn_check=args.attn_check)
    if args.command in SETUP:
        return 0 if SETUP[args.command](call) else 1
    if args.command == "run-stage":
        return gpu_stages.run_stage(call, args.nb, args.args[1:] if args.args[:1] == ["--"] else args.args)
    if args.command == "run-pending":
        rc, skipped = gpu_stages.run_pending(call)
        gpu_stages.write_skipped(args.skipped_file, skipped)
        return rc
    if args.command == "bench":
        if args.name == "generate":
            return gpu_bench.bench_generate(call, *args.generate) if len(args.generate) == 3 else 2
        return gpu_bench.BENCHES[args.name](call)
    if args.command in ("sglang", "recipes"):
        rc = (gpu_sglang if args.command == "sglang" else gpu_recipes).run_phase(call, args.phase)
        if os.environ.get("SEND_COMPILE_CACHE") == "1":
            gpu_compile_cache.send(call)
        return rc
    if args.command == "draft-benches":
        return gpu_draft_bench.run(call)
    if args.command == "trace-setup":
        return gpu_bench.trace_setup(call, limit=args.limit)
    if args.command == "regen-servers":
        return gpu_regen.regen_servers(
            call, k=args.k, n=args.n, concurrency=args.concurrency, mem=args.mem, full=args.full
        )
    if args.command == "regen-feed":
        return gpu_regen.regen_feed(call, n=args.n, concurrency=args.c)
    if args.command == "report":
        gpu_pack.report(call)
        return 0
    if args.command == "save-draft":
        return gpu_pack.save_draft(call, args.arch)
    return {"save-state": gpu_pack.save_state, "pack-reference": gpu_pack.pack_reference}[args.command](call)


if __name__ == "__main__":
    sys.exit(main())
