#!/usr/bin/env bash
# The training-speed lever: the target's states online (a forward every step) vs offline (stored once,
# in the set-up), eager and compiled, in the real training loop with random weights in the embedded target's
# shape (benchmarks/bench_train_shapes.py: timing does not depend on the weights, so no GGUF travels).
#   here:  BENCH_DATA=<a regenerated train.jsonl> ops/gpu/prepare.sh   (-> .device/bench, 3,000 conversations)
#   there: bash ops/gpu/offline_speed.sh [STEPS]   (carry .device/bench and .whl)
#          -> $OUT/{online,offline}[-compiled].{json,log}; each run bounded by its own timeout
source "$(dirname "$0")/common.sh"  # OUT, SITE, PYTHONPATH (lib + SITE), offline hub settings, ensure_wheels
STEPS=${1:-40}
BENCH=/tmp/offline-speed/bench
mkdir -p "$BENCH"
ensure_wheels || exit 1
cp .device/bench/*.json .device/bench/*.jinja "$BENCH"/
xz -dc .device/bench/tokenizer.json.xz > "$BENCH/tokenizer.json"
xz -dc .device/bench/train.jsonl.xz > "$BENCH/train.jsonl"
for run in "online --compile:90" "offline --compile:90" "offline:60" "online:60"; do
  args=${run%:*} limit=${run##*:} name=$(echo "${run%:*}" | sed 's/ --compile/-compiled/')
  # shellcheck disable=SC2086  # args holds the mode and maybe --compile
  timeout "$limit" python3 benchmarks/bench_train_shapes.py "$BENCH" 1 "$STEPS" \
    "$OUT/$name.json" --hidden $args > "$OUT/$name.log" 2>&1
  echo "$name: rc=$? $(cat "$OUT/$name.json" 2>/dev/null | tr -d '\n ')"
done
