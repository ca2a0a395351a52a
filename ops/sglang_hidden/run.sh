#!/usr/bin/env bash
# The GPU proof of the SGLang hidden-state capture (ops/sglang_hidden/README.md): STEPS (default
# "embedded deepseek") in order, each writing $OUT/<step>.json; "tp" needs two GPUs.
#   SGLANG_PREFIX=/tmp/sglang OUT=$OUT bash ops/sglang_hidden/run.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
export OUT=${OUT:-results/sglang-hidden}
export NCCL_NVLS_ENABLE=0
PY=${PY:-python3}
mkdir -p "$OUT"
for step in ${STEPS:-embedded deepseek}; do
  case $step in
    embedded) $PY ops/sglang_hidden/proof.py embedded --n "${N:-64}" --model "${MODEL:-embedded}" ;;
    deepseek) $PY ops/sglang_hidden/proof.py deepseek --n "${N_DEEPSEEK:-8}" ;;
    tp) $PY ops/sglang_hidden/proof.py tp --tp "${TP:-2}" --n "${N:-64}" ;;
    *) echo "unknown step $step (embedded, deepseek, tp)" >&2; exit 2 ;;
  esac 2>&1 | tee "$OUT/$step.log"
done
