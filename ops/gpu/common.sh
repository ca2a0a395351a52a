# Sourced by every ops/gpu/*.sh step on the GPU machine (one H200, python3 3.12, no network).
# State that must outlive one call lives under /tmp (kept while the machine stays warm, 30 s
# between calls); what a cold machine needs again comes from carried folders (.device/a, .device/b,
# .whl, .device/state).  Every step logs to $OUT/log.
# The step logic (set-up, stages until the deadline, resume and cut rules, benchmarks, state and
# packing, sglang.sh's and recipes.sh's phases, bench_draft.sh's benches, the regeneration servers) is Python:
# ops.gpu_step and the modules it names (gpu_call, gpu_stages, gpu_bench, gpu_pack, gpu_sglang,
# gpu_recipes, gpu_draft_bench, gpu_regen, gpu_compile_cache);
# the functions below call it with this call's deadline (GPU_CALL_T0, GPU_CALL_DEADLINE), so `left`
# here and there agree.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO"
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log") 2>&1

T0=$(date +%s)
BUDGET_S=${BUDGET_S:-500}            # this call's own deadline: stages stop here; packing follows (< 9 min in all)
DEADLINE=$((T0 + BUDGET_S))
DL=${DL:-/tmp/dl}                    # persistent work folder on the device
SITE=${SITE:-/tmp/site}              # carried wheels installed here
SCRATCH=${SCRATCH:-/tmp/scratch}     # step A leaves the first GGUF part here
PROFILE=${PROFILE:-full}
RUN_ID=reference
RESULTS=$DL/results
RUN=$RESULTS/$RUN_ID
mkdir -p "$DL" "$RESULTS" "$SCRATCH"
export OUT DL SITE SCRATCH PROFILE GPU_CALL_T0=$T0 GPU_CALL_DEADLINE=$DEADLINE
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DRAFTLAB_CACHE=$DL/cache DRAFTLAB_EMBEDDED_GGUF=$DL/model.gguf
export PYTHONPATH=$REPO/lib:$REPO:$SITE${PYTHONPATH:+:$PYTHONPATH}  # the product, ops, the carried wheels
# no MPLBACKEND here: notebooks keep ipykernel's inline backend, so executed notebooks embed their figures
# (Agg showed `PosixPath(...)` where the plots belong); scripts without a display fall back to Agg anyway
EMBEDDED_SHA256=$(sed -n 's/^EMBEDDED_SHA256 = "\([0-9a-f]*\)"/\1/p' lib/draftlab/model/target.py)
# Stage order: 07 last, because it is time-boxed and resumable and absorbs what time is left.
# STAGES="..." (env) runs another list; P<NN>="-p KEY VALUE ..." adds overrides to stage NN.
read -r -a STAGES <<< "${STAGES:-00 01 02 03 04 06 05 07}"

say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE - $(date +%s) )); }
gpu_step() {  # gpu_step COMMAND [ARGS]: ops.gpu_step with this shell's P<NN> (exported or not)
  local v over=()
  for v in ${!P@}; do [[ $v =~ ^P[0-9][0-9]$ ]] && over+=("--p${v#P}" "${!v}"); done
  RESULTS=$RESULTS RUN_ID=$RUN_ID python3 -m ops.gpu_step "$1" "${over[@]}" "${@:2}"
}

# set-up (ops.gpu_call): the carried wheels, the GGUF from its two parts, the converted
# target, and after a cold start the state earlier calls sent back (.device/state/)
ensure_wheels() { gpu_step ensure-wheels; }
ensure_gguf() { gpu_step ensure-gguf; }
ensure_target() { gpu_step ensure-target; }
restore_state() { gpu_step restore-state; }
ensure_all() { gpu_step ensure-all; }

# stages (ops.gpu_stages): each stopped at the deadline with its kernel; 03 04 07 resume,
# any other stage cut restarts as a call's first stage and is skipped after two cuts
stage_done() {  # 0 when notebook $1's metrics are in metrics.json (07: and it is complete)
  python3 -m ops.gpu_steps stage-done "$RUN" "$1"
}
run_stage() { gpu_step run-stage "$@"; }  # run_stage NN [-p KEY VALUE ...]: exit 124 when cut
run_pending() {  # the stages of STAGES not done yet, in order, until the deadline: 0 done, 1 failed, 2 call again
  local skipped rc
  skipped=$(mktemp)
  gpu_step run-pending --stages "${STAGES[*]}" --skipped-file "$skipped"
  rc=$?
  SKIPPED=$(cat "$skipped" 2>/dev/null); rm -f "$skipped"
  return $rc
}

# extra benchmarks (ops.gpu_bench), each once per run: $RUN/bench/<name>.json
bench_generate() { gpu_step bench generate "$@"; }  # bench_generate NAME CACHE SIZES
bench_generate_sweep() { gpu_step bench sweep; }
bench_generate_attention() { gpu_step bench attention; }
bench_generate_static() { gpu_step bench static; }
bench_train_offline() { gpu_step bench offline; }
bench_train_shapes() { gpu_step bench shapes; }

# what comes back (ops.gpu_pack)
save_state() { gpu_step save-state; }  # the run for a cold start, no weights: $OUT/state-run.tar.xz[.part-N]
save_draft() { gpu_step save-draft "${1:-eagle3}"; }  # the exported draft: $OUT/draft-ARCH.tar.part-N
pack_reference() { gpu_step pack-reference; }  # results/reference for the commit: $OUT/reference.tar.gz
report() { gpu_step report --stages "${STAGES[*]}"; }
