#!/usr/bin/env bash
# Final step on the GPU machine (carry [.whl]): results/reference for the commit (params, metrics,
# summary.json, README.md, figures, executed notebooks; no weights, no data) as
# $OUT/reference.tar.gz, and summary.json beside it. Here: tar -xzf <files_at>/reference.tar.gz -C results/
source "$(dirname "$0")/common.sh"
[ -f "$RUN/metrics.json" ] || { say "ERROR: no $RUN/metrics.json (the machine started cold? run step.sh first)"; exit 1; }
report
pack_reference
