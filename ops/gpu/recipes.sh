#!/usr/bin/env bash
# On the GPU machine: the recipe study (python -m studies.recipes; studies/recipes/study.py).
# Every call first takes the cargo chunk it carried (ops/gpu/cargo.sh) and runs PHASE:
#   stash    nothing else (a transfer call: carry .device/cargo/cN)
#   train    set-up; once per machine the training-speed check (`python -m studies.recipes speed`: SPEED_STEPS steps
#            of the reference recipe by each objective variant of SPEED_VARIANTS, e.g. eager and compiled);
#            then `python -m studies.recipes train` of ROWS, PARALLEL at a time, until the deadline sends it SIGTERM (exit 3: call again)
#   speed    set-up, benchmarks/tokenize_profile.py on 300 rows, the speed check on SPEED_SAMPLES rows
#   regen    SGLang from the bundle, then REGEN_SET's prompts (extra; multi-turn: made there from the extra
#            prompts; broad: written there by the target through SGLang servers) regenerated through REGEN_SERVERS servers (3: call again, carrying OUT/<set>-work.tar.gz
#            back as .device/<set>-work.tar.gz); sends back OUT/<set>-regen.jsonl.xz (commit it as
#            results/recipes/data/<set>-regen.jsonl.xz; ops.gpu_recipes_regen)
#   measure  SGLang from the bundle, then `python -m studies.recipes measure` of every trained row (and `base`, the
#            published draft) on the held-out split and HumanEval; the report
#   suite    SGLang from the bundle, then every draft of PUBLISHED and ROWS on each set of the evaluation suite
#            (ops.gpu_recipes_suite): recipes.tar.gz holds suite/summary.json (results/eval-suite/summary.json)
# PHASE may name several, run in order within the call: PHASE="regen train".
# Results: $OUT/recipes.tar.gz (no weights) every call; $OUT/log.
# The phases and their knobs (ROWS, PARALLEL, SPEED_STEPS, SPEED_SAMPLES, SPEED_VARIANTS, TRAIN_SET, SAMPLES,
# HUMANEVAL, RECIPES_TARGET, CHAIN, CHAIN_ROWS, CONCURRENCY, REPEATS, SERVER_FLAGS, PUBLISHED, SEND_DRAFTS, REGEN_SET,
# REGEN_ROWS, REGEN_SERVERS, REGEN_CONCURRENCY, SUITE_SAMPLES, PREFIX, BUDGET_S): the docstring of ops.gpu_recipes.
# SEND_COMPILE_CACHE=1: the compilers' caches come back too (ops.gpu_compile_cache; the next cargo carries them).
# Exit 0: done; 3: call again with the same PHASE; 1: failed; 2: an unknown PHASE.
source "$(dirname "$0")/common.sh"
PHASE=${PHASE:-stash}
PARTS=$DL/sglang-parts
mkdir -p "$PARTS"
bash ops/gpu/cargo.sh receive || exit 1
for d in .device/sglang/p*; do  # the bundle's part folders (hash-checked on arrival)
  [ -d "$d" ] && python3 -m draftlab.sglang.install stage --parts-dir "$d" --stage "$PARTS"
done
say "phase $PHASE"
gpu_step recipes "$PHASE"
