#!/usr/bin/env bash
# The published cost table's GPU session on one H100/H200: the shapes users serve beside the embedded
# target, and the check of the cost model against the best published draft served for real.
# Every call first stages what it carried: a part of SGLang's bundle (.device/sglang/pN, as
# `draftlab sglang bundle --part-size 36M` writes them) or a cargo chunk (CARGO=check ops/gpu/cargo.sh:
# the embedded target's GGUF, the wheels, the published drafts). Once the bundle is whole it installs
# SGLang and runs STEPS in order, each skipped once done (a marker in $DL/cost-done), each resuming
# what it measured, until BUDGET_S; a step that needs the cargo waits (is skipped) until it is whole.
# Call again until it says "all done".
#   here:  bash ops/gpu/prepare.sh; bash ops/gpu/published_draft.sh results/recipes/rows/best-data2x \
#          .device/drafts/best-data2x; CARGO=check bash ops/gpu/cargo.sh pack
#   there: BUDGET_S=540 bash ops/cost_model/session.sh   (a call carries .device/sglang/pN or .device/cargo/cN)
# Steps (STEPS, comma-separated):
#   8b, 1b, 30b  bench cost of data/configs/{llama-3.1-8b,llama-3.2-1b,qwen2.5-32b} at chain S = 6
#                with SGLang's own random weights (--weights dummy), decode graphs for the measured batches
#   check-real   `draftlab bench sglang`: the embedded target and the best-data2x draft at chain S = 6,
#                batch 1, on the first CHECK_N held-out prompts (its acceptance and speedup, measured)
#   check-cost   `bench cost` of the embedded shape on those same prompts, flags and token limit
#   tree         the embedded shape's tree3-4-8
#   capture      (the SGLang hidden-state proof, step embedded, on the real embedded target: ops/sglang_hidden)
#   suite        `draftlab bench sglang --eval-set suite`: the best-data2x draft on every set of the evaluation
#                suite (SUITE_N prompts a set, decontaminated against the draft's training files), chain S = 6
# Results: $OUT/cost-model (the bench's folder: every shape's rows), $OUT/check.tar.gz (the real measurement),
# $OUT/suite.tar.gz (the per-set study).
source "$(dirname "${BASH_SOURCE[0]}")/../gpu/common.sh"   # DL, SITE, OUT/log, PYTHONPATH, say, left, ensure_all
STEPS=${STEPS:-check-real,check-cost,1b,30b,tree,suite,8b,capture}
CHECK_N=${CHECK_N:-32}
SUITE_N=${SUITE_N:-32}
BASE_FLAGS="--attention-backend triton --sampling-backend pytorch --grammar-backend none"
GRAPHS="--cuda-graph-bs 1 4 16 64"   # decode graphs for the measured batch sizes only (a big shape starts faster)
RES=$DL/cost-model
DONE=$DL/cost-done
MODEL=$DL/cache/embedded-SmolLM2-135M-Instruct
DRAFT=$REPO/.device/drafts/best-data2x
HELD_OUT=$DL/held-out-$CHECK_N.jsonl
mkdir -p "$DONE"

bash ops/gpu/cargo.sh receive || exit 1
for d in .device/sglang/p*; do
  [ -d "$d" ] && python3 -m draftlab.sglang.install stage --parts-dir "$d" --stage "$DL/sglang-parts"
done
staged=$(ls "$DL/sglang-parts" 2>/dev/null | grep -c 'part-.*-of-')
whole=$(ls "$DL/sglang-parts" 2>/dev/null | sed -n 's/.*-of-0*\([0-9]*\)$/\1/p' | head -1)
if [ -z "$whole" ] || [ "$staged" -lt "$whole" ]; then say "bundle: $staged of ${whole:-?} parts staged; carry the next"; exit 0; fi
python3 -m draftlab.sglang.install install --stage "$DL/sglang-parts" --prefix "$DL/sglang" || exit 1
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
cargo_ready() {  # the embedded target, its wheels and the drafts, set up once
  [ -f "${CARGO_HOLD:-/tmp/cargo}/root/.complete" ] || return 1
  [ -f "$HELD_OUT" ] && return 0
  ensure_all || return 1
  xz -dc results/reference/data/blend/test.jsonl.xz | head -n "$CHECK_N" > "$HELD_OUT"
}

cost() {  # cost STEP TARGET NAME SETTINGS MEM EXTRA FLAGS: one shape's bench, resumed, within this call
  local budget=$(( $(left) - 45 ))  # a SIGTERM stops the bench within a cell; then its report and the copy
  [ "$budget" -gt 90 ] || { say "$1: no time left in this call"; return 3; }
  TARGET=$2 NAME=$3 SETTINGS=$4 MEM_FRACTION=$5 EXTRA=$6 SERVER_FLAGS=$7 BUDGET_S=$budget \
    SGLANG_PREFIX=$DL/sglang RESULTS=$RES bash ops/cost_model/run.sh
}

check_real() {
  local out=$DL/check/sglang/study
  timeout -s TERM -k 60 $(( $(left) - 20 )) python3 -m draftlab.cli bench sglang --model-path "$MODEL" \
    --draft "$DRAFT" --eval-set "$HELD_OUT" --samples "$CHECK_N" --max-new-tokens 128 --chain 6 --main-steps 6 \
    --trees none --concurrency 1 --no-wrong-flag --repeats 3 --warmup 1 --max-running-requests 64 \
    --server-flags="$BASE_FLAGS --sleep-on-idle" --mem-fraction-static 0.3 --prefix "$DL/sglang" --out "$out" || return 1
  python3 - "$out/summary.csv" "$DL/check/check.json" <<'PY' || return 1
import json, sys
import pandas as pd
t = pd.read_csv(sys.argv[1])
t = t[t["concurrency"] == 1]
base = t[t["label"] == "baseline"].iloc[0]
spec = t[t["acceptance_length"].notna() & (t["label"] != "baseline")].iloc[0]
out = {"label": spec["label"], "acceptance": round(float(spec["acceptance_length"]), 4),
       "speedup": round(float(spec["tokens_per_s_median"] / base["tokens_per_s_median"]), 4),
       "baseline_tok_s": float(base["tokens_per_s_median"]), "tok_s": float(spec["tokens_per_s_median"])}
json.dump(out, open(sys.argv[2], "w"), indent=1)
print("check-real:", out)
PY
}

suite() {  # the best published draft per set of the evaluation suite (the prompts its training never saw)
  local train=$DL/suite-train.jsonl  # best-data2x's training files: the reference's answers and the extra ones
  [ -s "$train" ] || xz -dc results/reference/data/regen/train.jsonl.xz results/recipes/data/extra-regen.jsonl.xz \
    > "$train" || return 1
  timeout -s TERM -k 60 $(( $(left) - 20 )) python3 -m draftlab.cli bench sglang --model-path "$MODEL" \
    --draft "$DRAFT" --eval-set suite --train-data "$train" --samples "$SUITE_N" --max-new-tokens 128 --chain 6 \
    --main-steps 6 --trees none --concurrency 1 --no-wrong-flag --repeats 1 --warmup 1 --max-running-requests 64 \
    --server-flags="$BASE_FLAGS --sleep-on-idle" --mem-fraction-static 0.3 --prefix "$DL/sglang" \
    --out "$DL/suite/sglang/study"
}

run_step() {
  case $1 in
    8b) cost 8b data/configs/llama-3.1-8b llama-3.1-8b chain6 0.5 "--weights dummy --acceptances 1,4,7 --warmup 1" \
          "$BASE_FLAGS $GRAPHS" ;;
    1b) cost 1b data/configs/llama-3.2-1b llama-3.2-1b chain6 0.4 "--weights dummy --acceptances 1,4,7 --warmup 1" \
          "$BASE_FLAGS $GRAPHS" ;;
    30b) cost 30b data/configs/qwen2.5-32b qwen2.5-32b chain6 0.88 \
          "--weights dummy --acceptances 1,4,7 --warmup 1 --max-new-tokens 128" "$BASE_FLAGS $GRAPHS" ;;
    check-real) check_real ;;
    check-cost) cost check-cost data/configs/smollm2-135m smollm2-135m-check chain6 0.3 \
          "--batches 1 --acceptances 1,4,7 --warmup 1 --max-new-tokens 128 --max-running-requests 64 --prompts $HELD_OUT --tokenizer $MODEL" \
          "$BASE_FLAGS --sleep-on-idle" ;;
    tree) cost tree data/configs/smollm2-135m smollm2-135m-tree tree3-4-8 0.4 "--acceptances 1,2,4 --warmup 1" \
          "$BASE_FLAGS" ;;
    suite) suite ;;
    capture) SGLANG_PREFIX=$DL/sglang OUT=$OUT/sglang-hidden STEPS=embedded MODEL=$MODEL \
          timeout -s TERM -k 30 $(( $(left) - 20 )) bash ops/sglang_hidden/run.sh ;;
    *) say "unknown step $1"; return 2 ;;
  esac
}

publish() {  # what is measured so far into $OUT (after every step: a call killed later loses nothing)
  local report=(python3 -m draftlab.cli bench cost --out "$RES" --report-only)
  if [ -f "$DL/check/check.json" ]; then
    read -r acc spd < <(python3 -c "import json; d = json.load(open('$DL/check/check.json')); print(d['acceptance'], d['speedup'])")
    report+=(--check-acceptance "$acc" --check-speedup "$spd" --check-shape smollm2-135m-check)
  fi
  [ -f "$RES/measurements.csv" ] && "${report[@]}" 2>&1 | tail -30
  mkdir -p "$OUT/cost-model"
  for f in table.csv summary.json speedup.png commands.txt measurements.csv plan.json; do
    [ -f "$RES/$f" ] && cp "$RES/$f" "$OUT/cost-model/"
  done
  [ -d "$RES/logs" ] && tar -C "$RES" -czf "$OUT/cost-model/logs.tar.gz" logs
  [ -d "$DL/check" ] && tar -C "$DL" --exclude='*.safetensors' -czf "$OUT/check.tar.gz" check
  [ -d "$DL/suite" ] && tar -C "$DL" --exclude='*.safetensors' -czf "$OUT/suite.tar.gz" suite
  return 0
}

rc=0
for step in ${STEPS//,/ }; do
  [ -f "$DONE/$step" ] && { say "$step: done before"; continue; }
  case $step in check-*|capture|suite)
    cargo_ready || { say "$step: waits for the cargo (the target, the wheels, the drafts)"; rc=3; continue; } ;;
  esac
  say "step $step ($(left) s left)"
  run_step "$step"; s=$?
  publish
  case $s in
    0) touch "$DONE/$step"; say "$step: done" ;;
    3) say "$step: out of time in this call"; rc=3; break ;;
    *) say "$step: failed (exit $s; its log above); the next step runs"; rc=1 ;;  # e.g. a resume refused on another GPU
  esac
done
case $rc in 0) say "all done" ;; 3) say "call again (the next call resumes)" ;; *) say "a step failed" ;; esac
exit $rc
