#!/usr/bin/env bash
# Where training's set-up goes on the GPU machine: both archs at once, as notebook 04 side by side
# runs them (benchmarks/trace_train_setup.py), with stack dumps every 20 s and `top` every 30 s, each
# stopped after LIMIT s (400): $OUT/setup_<arch>.txt/.log, $OUT/top.log (ops.gpu_bench.trace_setup).
# Carry as step.sh's call B does ([.device/b, .whl, .device/state] right after a_stage.sh).
source "$(dirname "$0")/common.sh"
gpu_step trace-setup
