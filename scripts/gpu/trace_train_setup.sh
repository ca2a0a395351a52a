#!/usr/bin/env bash
# Where training's set-up goes on the GPU machine: both archs at once, as notebook 04 side by side
# runs them (benchmarks/trace_train_setup.py), with stack dumps every 20 s and `top` every 30 s.
# Carry as step.sh's call B does ([.device/b, .whl, .device/state] right after a_stage.sh).
source "$(dirname "$0")/common.sh"
ensure_all || { say "FAILED: set-up"; exit 1; }
nproc; uptime
(while sleep 30; do { date -u +%T; top -bn1 | head -20; } >> "$OUT/top.log"; done) &
sampler=$!
pids=()
for arch in eagle3 eagle1; do
  timeout "${LIMIT:-400}" python3 benchmarks/trace_train_setup.py "$RUN" "$arch" "$OUT/setup_$arch.txt" \
    > "$OUT/setup_$arch.log" 2>&1 &
  pids+=($!)
done
wait "${pids[@]}"
kill "$sampler"
grep -h "set-up" "$OUT"/setup_*.log
say "done"
