#!/usr/bin/env bash
# Here (not on the GPU): split an exported draft folder into two carryable halves for
# ops/gpu/bench_draft.sh, and put the blend's held-out prompts next to them.
#   ops/gpu/prepare_draft.sh DRAFT_DIR BLEND_TEST_JSONL
# Writes .device/draft-a (first part + SHA256 + COUNT), .device/draft-b (the rest), .device/prompts.
set -euo pipefail
draft=${1:?exported draft folder (config.json + model.safetensors)}
prompts=${2:?the blend test split (RUN_DIR/data/blend/test.jsonl)}
[ -f "$draft/model.safetensors" ] && [ -f "$draft/config.json" ] || { echo "$draft: not an exported draft" >&2; exit 1; }
cd "$(dirname "$0")/../.."
rm -rf .device/draft-a .device/draft-b .device/prompts .device/draft-split
mkdir -p .device/draft-a .device/draft-b .device/prompts .device/draft-split
tar -cf .device/draft-split/draft.tar -C "$(dirname "$(realpath "$draft")")" --transform "s,^$(basename "$draft"),eagle3," "$(basename "$draft")"
(cd .device/draft-split && sha256sum draft.tar) > .device/draft-a/SHA256
split -b 15M -d -a 1 .device/draft-split/draft.tar .device/draft-split/draft.tar.part-
ls .device/draft-split/draft.tar.part-* | wc -l > .device/draft-a/COUNT
mv .device/draft-split/draft.tar.part-0 .device/draft-a/
mv .device/draft-split/draft.tar.part-* .device/draft-b/
rm -rf .device/draft-split
cp "$prompts" .device/prompts/test.jsonl
du -sh .device/draft-a .device/draft-b .device/prompts
