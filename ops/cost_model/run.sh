#!/usr/bin/env bash
# `draftlab bench cost` on one H100/H200 where SGLang 0.5.17 is installed from the carried bundle
# (draftlab sglang install --prefix $SGLANG_PREFIX: transformers 5.12.1 first on the servers' path).
# One call runs for BUDGET_S seconds, then stops the bench with SIGTERM (the cell being measured
# finishes, the server is stopped) and writes the report; the next call resumes where it stopped.
# Results: $OUT/cost-model/ (table.csv, summary.json, speedup.png, commands.txt, measurements.csv,
# plan.json, logs/). Knobs (env): TARGET, NAME, SETTINGS, BATCHES, BUDGET_S, SGLANG_PREFIX, RESULTS,
# RESUME_FROM, MEM_FRACTION, SERVER_FLAGS, EXTRA (more `bench cost` flags).
# Exit 0: every cell measured and fitted; 3: call again (stopped for time); 1: failed.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/cost-model.log") 2>&1

TARGET=${TARGET:-data/configs/smollm2-135m}      # a config.json folder, a model folder or a Hub id
NAME=${NAME:-$(basename "$TARGET")}
SETTINGS=${SETTINGS:-chain6,chain3,tree3-4-8}      # run order: the chain the best draft was measured at first
BATCHES=${BATCHES:-1,4,16,64}
BUDGET_S=${BUDGET_S:-480}                          # the bench's share of a 10-minute call
SGLANG_PREFIX=${SGLANG_PREFIX:-/tmp/dl/sglang}     # ops/gpu_call.py's default install
RESULTS=${RESULTS:-/tmp/dl/cost-model}             # kept between calls while the machine stays warm
RESUME_FROM=${RESUME_FROM:-results/cost-model}     # a carried results folder, used when RESULTS is empty
MEM_FRACTION=${MEM_FRACTION:-0.4}
SERVER_FLAGS=${SERVER_FLAGS:---attention-backend triton --sampling-backend pytorch --grammar-backend none}
export PYTHONPATH=$REPO/lib:${SITE:-/tmp/site}${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 MPLBACKEND=Agg TOKENIZERS_PARALLELISM=false

say() { echo "[$(date -u +%H:%M:%S)] $*"; }
if [ ! -d "$SGLANG_PREFIX" ]; then
  say "error: no SGLang install at $SGLANG_PREFIX (set SGLANG_PREFIX)"; exit 1
fi
if [ ! -f "$RESULTS/measurements.csv" ] && [ -f "$RESUME_FROM/measurements.csv" ]; then
  mkdir -p "$RESULTS"
  cp "$RESUME_FROM/measurements.csv" "$RESUME_FROM/plan.json" "$RESULTS/"
  [ -f "$RESUME_FROM/commands.txt" ] && cp "$RESUME_FROM/commands.txt" "$RESULTS/"
  say "resuming from $RESUME_FROM ($(($(wc -l < "$RESULTS/measurements.csv") - 1)) cells measured)"
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
say "bench cost $TARGET as $NAME: settings $SETTINGS, batches $BATCHES, for ${BUDGET_S}s"

# shellcheck disable=SC2086  # EXTRA is a list of flags
timeout -s TERM -k 90 "$BUDGET_S" python3 -m draftlab.cli bench cost "$TARGET" --name "$NAME" --out "$RESULTS" \
  --prefix "$SGLANG_PREFIX" --settings "$SETTINGS" --batches "$BATCHES" --mem-fraction-static "$MEM_FRACTION" \
  --server-flags "$SERVER_FLAGS" ${EXTRA:-}
rc=$?
say "bench cost exited $rc"
python3 -m draftlab.cli bench cost --out "$RESULTS" --report-only >/dev/null 2>&1 || true  # the report, also after a kill

mkdir -p "$OUT/cost-model"
for f in table.csv summary.json speedup.png commands.txt measurements.csv plan.json; do
  [ -f "$RESULTS/$f" ] && cp "$RESULTS/$f" "$OUT/cost-model/"
done
[ -d "$RESULTS/logs" ] && tar -C "$RESULTS" -czf "$OUT/cost-model/logs.tar.gz" logs
case $rc in
  0) exit 0 ;;
  124|137|143) say "stopped for time: call again (the next call resumes)"; exit 3 ;;
  *) exit 1 ;;
esac
