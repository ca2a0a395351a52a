#!/usr/bin/env bash
# The batch-size sweep alone (after a_stage.sh; carry [.device/b, .whl, .device/state] where
# .device/state holds a run with data/blend/train.jsonl): output tok/s of the batch backend at
# SWEEP_SIZES, each row forced to SWEEP_NEW tokens, prompts of median length. Writes $OUT/generate_sweep.json.
source "$(dirname "$0")/common.sh"
ensure_all || { say "FAILED: set-up"; exit 1; }
if [ "${ATTN:-0}" = 1 ]; then   # ATTN=1: cuDNN's attention on vs off instead (generate_cudnn_{on,off}.json)
  bench_generate_attention
  cp "$RUN"/bench/generate_cudnn_*.json "$OUT/" 2>/dev/null
else
  bench_generate_sweep
  cp "$RUN/bench/generate_sweep.json" "$OUT/" 2>/dev/null
fi
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
