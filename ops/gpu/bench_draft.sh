#!/usr/bin/env bash
# Benchmark a trained draft in the reference engine on the GPU machine, without rerunning the
# notebooks. The draft travels as the parts `ops/gpu/prepare_draft.sh` made (.device/draft-a,
# .device/draft-b: a call carries at most 64 MiB, and the target's GGUF already fills most of two).
# Call order, back to back (the machine stays warm 30 s between calls):
#   a_stage.sh                                    carry [.device/a]
#   bench_draft.sh                                carry [.device/b, .whl, .device/draft-a]
#   bench_draft.sh                                carry [.device/draft-b, .device/prompts]
# Each call stashes what it carried under $DL; the call that completes the set checks the parts against
# SHA256 and runs the benches until its deadline (BUDGET_S): $OUT/<name>.json. Knobs SAMPLES, MIN_LEFT,
# BENCH="NAME ARGS..." (one run of your own instead) and the bench list: ops.gpu_draft_bench.
# Exit 0: done; 3: call again (parts missing, or benches left for want of time); 1: failed.
source "$(dirname "$0")/common.sh"
gpu_step draft-benches
