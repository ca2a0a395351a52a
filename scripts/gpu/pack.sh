#!/usr/bin/env bash
# Final step on the GPU machine (carry [.whl]): results/reference for the commit (params, metrics,
# summary.json, README.md, figures, executed notebooks; no weights, no data) as
# $OUT/reference.tar.gz, and summary.json beside it. Here: tar -xzf <files_at>/reference.tar.gz -C results/
source "$(dirname "$0")/common.sh"
[ -f "$RUN/metrics.json" ] || { say "ERROR: no $RUN/metrics.json (the machine started cold? run step.sh first)"; exit 1; }
report
python3 scripts/gpu/summary.py "$RUN" || exit 1
STAGE=$DL/pack/$RUN_ID
rm -rf "$DL/pack" && mkdir -p "$STAGE"
cp "$RUN"/params.yaml "$RUN"/metrics.json "$RUN"/summary.json "$RUN"/README.md "$STAGE"/
cp -r "$RUN"/figures "$RUN"/executed "$STAGE"/
tar -czf "$OUT/reference.tar.gz" -C "$DL/pack" "$RUN_ID"
cp "$RUN/summary.json" "$OUT/summary.json"
say "packed: $(du -h "$OUT/reference.tar.gz" | cut -f1) ($(tar -tzf "$OUT/reference.tar.gz" | wc -l) entries)"
tar -tzvf "$OUT/reference.tar.gz" | awk '{print $3, $6}' | sort -k2
cat "$OUT/summary.json"
