#!/usr/bin/env bash
# Step A, on the GPU machine (carry: .device/a). Puts the first half of the target GGUF in
# /tmp/scratch (step B must follow within the 30 s the machine stays warm) and records the machine.
source "$(dirname "$0")/common.sh"
[ -f .device/a/part-aa ] || { say "ERROR: .device/a/part-aa not carried (run ops/gpu/prepare.sh here, carry .device/a)"; exit 1; }
cp .device/a/part-aa "$SCRATCH/part-aa"
say "part-aa: $(stat -c %s "$SCRATCH/part-aa") bytes in $SCRATCH"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'transformers', transformers.__version__)"
python3 -m pip list 2>/dev/null | grep -iE "^(pyarrow|fsspec|huggingface.hub|numpy|pandas|scipy|matplotlib|accelerate|safetensors|tokenizers|aiohttp|pyyaml) " | tr -s ' ' | paste -sd ';'
say "NEXT: ops/gpu/step.sh at once, carry [.device/b, .whl, .device/state]"
