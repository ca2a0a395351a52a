#!/usr/bin/env bash
# On the GPU machine (after sglang.sh installed SGLang in an earlier warm call): does
# regeneration through SGLang scale with servers on the one GPU? K graph-sized servers
# (sglang.server.regeneration_commands) stay up while one client over their URLs regenerates the same
# first N rows through 1, 2 .. K of them, then the whole train split (FULL=1) through all K.
# Knobs: K (4), N (4096), CONCURRENCY per server (512), MEM (--mem-fraction-static, 0.5), FULL (1).
# Results: $OUT/regen_servers.json after each run, running.txt, servers-logs.tar.xz.
# The logic: ops.gpu_regen (`python3 -m ops.gpu_step regen-servers --help`).
source "$(dirname "$0")/common.sh"
gpu_step regen-servers
