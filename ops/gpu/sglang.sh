#!/usr/bin/env bash
# On the GPU machine: SGLang from the offline bundle, the blend regenerated through it, the draft
# trained in the background, then measured in SGLang and in the engine (the oracle). Every call first
# takes the cargo chunk it carried (ops/gpu/cargo.sh; .device/cargo/cN) and stages the bundle parts
# there are (.device/sglang/pN, from `draftlab sglang bundle --out .device/sglang --machine-packages
# ops/gpu_machine_packages.txt`), then runs PHASE:
#   setup | stash (a transfer call) | regen | after | notebooks | oracle
# What each phase does, and their knobs (DRAFT, SAMPLES, STUDY_ARGS, STUDY_MIN_S, EVAL_XZ, ORACLE_FROM,
# ORACLE_CHAIN, PUBLISHED, STAGES_NOTEBOOKS, REGEN_SIDE, REGEN_CONCURRENCY, P<NN>, BUDGET_S): the docstring
# of ops.gpu_sglang. Exit 0: done; 3: call again with the same PHASE (regen: 2, as before); 1: failed.
#   e.g. DRAFT=/tmp/cargo/root/.device/drafts/eagle3 PHASE=after bash ops/gpu/sglang.sh
source "$(dirname "$0")/common.sh"
PHASE=${PHASE:-stash}
PARTS=$DL/sglang-parts
mkdir -p "$PARTS"
bash ops/gpu/cargo.sh receive || exit 1
for d in .device/sglang/p*; do  # the bundle's part folders, one or two a call (hash-checked on arrival)
  [ -d "$d" ] && python3 -m draftlab.sglang.install stage --parts-dir "$d" --stage "$PARTS"
done
say "phase $PHASE; bundle parts staged: $(ls "$PARTS" | paste -sd ' ')"
gpu_step sglang "$PHASE"
