#!/usr/bin/env bash
# Steps B, C, ... on the GPU machine. Call B carries [.device/b, .whl]; later calls carry [.whl]
# (plus .device/state after a cold start, with A and B redone first). Each call: make sure the
# wheels, the GGUF and the converted target are there, then run the full-profile notebooks not
# done yet (00 01 02 03 04 06 05 07); with BENCHES=1 also issue 4's batch-size sweep before 03 and the
# offline-hidden and static-cache benchmarks after the last stage if time is left until this call's deadline (BUDGET_S, default 500 s); a stage
# cut by the deadline resumes in the next call (03 by row id, 04 and 07 from checkpoints and
# finished subsets). When every stage is done it packs results/reference as pack.sh does.
# Exit 0: done, $OUT/reference.tar.gz written; 3: call step.sh again; 1: failed.
source "$(dirname "$0")/common.sh"
ensure_all || { say "FAILED: set-up (see above)"; save_state; exit 1; }
# issue 4's batch-size sweep (BENCHES=1), while the GPU has nothing else to do
[ "${BENCHES:-0}" = 1 ] && ! stage_done 03 && bench_generate_sweep
[ "${BENCHES:-0}" = 1 ] && bench_train_shapes   # carry .device/bench (made by scripts/gpu/prepare.sh)
run_pending
rc=$?
report
if [ $rc -eq 0 ]; then
  # does batched generate pay cuDNN's per-shape cost too? (ATTN_CHECK=0 skips; needs ~100 s)
  [ "${ATTN_CHECK:-1}" = 1 ] && [ "$(left)" -gt 200 ] && bench_generate_attention
  if [ "${BENCHES:-0}" = 1 ]; then
    bench_train_offline                 # issue 5's offline-hidden throughput, with the time left
    bench_generate_static
  fi
  [ -n "$SKIPPED" ] && say "WARNING: packed WITHOUT stages$SKIPPED (cut twice by the deadline)"
  save_draft eagle3
  pack_reference && say "DONE${SKIPPED:+ (except$SKIPPED)}: $OUT/reference.tar.gz -> here: tar -xzf <files_at>/reference.tar.gz -C results/"
  exit $?
fi
save_state
case $rc in
  2) say "NOT DONE YET. NEXT: scripts/gpu/step.sh again (carry [.whl])"; exit 3 ;;
  *) say "FAILED (see the log above)"; exit 1 ;;
esac
