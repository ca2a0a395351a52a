#!/usr/bin/env bash
# Steps B, C, ... on the GPU machine. Call B carries [.device/b, .whl]; later calls carry [.whl]
# (plus .device/state after a cold start, with A and B redone first). Each call: make sure the
# wheels, the GGUF and the converted target are there, then run the full-profile notebooks not
# done yet (STAGES, default 00 01 02 03 04 06 05 07) until this call's deadline (BUDGET_S, default
# 500 s); a stage cut there resumes in the next call. When every stage is done it packs
# results/reference as pack.sh does. BENCHES=1 adds the generation and offline-training benchmarks; ATTN_CHECK=0
# skips the cuDNN check. The logic: ops.gpu_step (`python3 -m ops.gpu_step --help`).
# Exit 0: done, $OUT/reference.tar.gz written; 3: call step.sh again; 1: failed.
source "$(dirname "$0")/common.sh"
gpu_step step --stages "${STAGES[*]}"
