#!/usr/bin/env bash
# On the GPU machine (after sglang.sh set up SGLang and the target): is the client the
# limit of regeneration through SGLang? The same N rows (4096, of the tracked regenerated set) through one
# SGLang server by one client at concurrency C (1024), then by two clients at C/2 each on halves, then by
# the batch backend (server stopped). Results: $OUT/regen_feed.json (wall s and summaries), after each part.
# The logic: ops.gpu_regen (`python3 -m ops.gpu_step regen-feed --help`).
source "$(dirname "$0")/common.sh"
gpu_step regen-feed
