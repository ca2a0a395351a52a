#!/usr/bin/env bash
# Step A, on the GPU machine (carry: .device/a). Puts the first half of the target GGUF in
# /tmp/scratch (step B must follow within the 30 s the machine stays warm) and records the machine.
source "$(dirname "$0")/common.sh"
[ -f .device/a/part-aa ] || { say "ERROR: .device/a/part-aa not carried (run scripts/gpu/prepare.sh here, carry .device/a)"; exit 1; }
cp .device/a/part-aa "$SCRATCH/part-aa"
say "part-aa: $(stat -c %s "$SCRATCH/part-aa") bytes in $SCRATCH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
python3 -m pip list 2>/dev/null | grep -iE "^(pyarrow|fsspec|huggingface.hub|numpy|pandas|scipy|matplotlib|accelerate|safetensors|tokenizers|aiohttp|pyyaml) " | tr -s ' ' | paste -sd ';'
# With .device/bench carried (config, tokenizer, conversations: no weights), time the real training
# loop with random weights by batch-length rounding; the results travel with the run's bench/.
if [ -f .device/bench/config.json ] && [ "${SHAPES:-1}" = 1 ]; then
  b=$DL/bench-shapes; mkdir -p "$b" "$RUN/bench"
  cp .device/bench/*.json .device/bench/*.jinja "$b"/ && xz -dc .device/bench/tokenizer.json.xz > "$b/tokenizer.json" \
    && xz -dc .device/bench/train.jsonl.xz > "$b/train.jsonl"
  for v in ${SHAPE_VARIANTS:-1:auto 64:auto 64:efficient}; do
    timeout 120 python3 scripts/gpu/bench_train_shapes.py "$b" "${v%%:*}" "${SHAPE_STEPS:-60}" \
      "$RUN/bench/train_shapes_pad${v%%:*}_${v##*:}.json" --attention "${v##*:}" 2>&1 | grep -v "it/s\|step/s\|conv/s" \
      || say "train-shapes variant $v failed"
  done
  cat "$RUN"/bench/train_shapes_*.json > "$OUT/train_shapes.json" 2>/dev/null
fi
say "NEXT: scripts/gpu/step.sh at once, carry [.device/b, .whl, .device/state]"
