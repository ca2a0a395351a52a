#!/usr/bin/env bash
# Issue 17 on the GPU machine: SGLang from the offline bundle; the blend regenerated through an SGLang
# server (and the batch backend on the same rows, side by side); the reference draft trained in the
# background; then the draft measured in SGLang (`draftlab bench sglang`) and in the engine (the oracle).
# Every call first takes the cargo chunk it carried (scripts/gpu/cargo.sh: GGUF, wheels, bundle, draft;
# .device/cargo/cN) and stages the bundle parts there are (.device/sglang/pN, made here by `draftlab
# sglang bundle --out .device/sglang`; kept in $DL while the machine is warm), then runs PHASE:
#   setup    wheels, GGUF (a_stage.sh first; carry .device/b .whl .device/state), target conversion
#   stash    nothing else (a transfer call: carry .device/cargo/cN, or bundle parts .device/sglang/pN)
#   regen    install SGLang, serve the target, notebook 03 through it, side by side on REGEN_SIDE rows,
#            then notebook 04 in the background (setsid; its log in $DL/train-bg.log)
#   after    wait for 04 (exit 3 while it runs); send the draft and the regenerated set back (once); then
#            bench sglang (a whole call), the engine's oracle runs; results packed every call.
#            With DRAFT=<a published draft> (the cargo's .device/drafts/eagle3) nothing is trained: the
#            set-up runs here, the held-out split comes from the tracked EVAL_XZ, and the engine's oracle
#            rows already published in ORACLE_FROM (same draft, prompts and samples) are reused.
#            Exit 0 when all is done, 3: call again with PHASE=after
#   notebooks  a published run (PUBLISHED, tracked) re-executed with its published draft, nothing trained:
#            the run folder and the draft become $RUN, STAGES_NOTEBOOKS (default "00 05 06") run as step.sh
#            runs them (P<NN> overrides), then packed as step.sh packs ($OUT/reference.tar.gz); exit 0, 3 or 1.
#   oracle   the oracle gap on more prompts (SAMPLES, e.g. 256): the engine (chain S=6, tree 5x4x8), then a
#            batch-1 SGLang study of the same settings, into $DL/check<SAMPLES>; the gaps in
#            $OUT/oracle_check.json. One after the other: run at once (ninth session) the engine slowed to
#            ~1 prompt/s beside SGLang and its tree run was cut. A rerun resumes the missing parts.
set -uo pipefail
source "$(dirname "$0")/common.sh"
PHASE=${PHASE:-stash}
PARTS=$DL/sglang-parts
SG=$RUN/sglang
DRAFT=${DRAFT:-$RUN/drafts/eagle3}  # a published draft instead (carry it; scripts/gpu/published_draft.sh)
EVAL_XZ=${EVAL_XZ:-results/reference/data/blend/test.jsonl.xz}  # the blend's held-out split
ORACLE_FROM=${ORACLE_FROM:-results/reference/sglang}
SAMPLES=${SAMPLES:-32}  # batch-1 prompts of the study and the oracle: the published oracle rows used 32
mkdir -p "$PARTS" "$SG"
bash scripts/gpu/cargo.sh receive || exit 1
for d in .device/sglang/p*; do  # the bundle's part folders, one or two a call (hash-checked on arrival)
  [ -d "$d" ] && python3 -m draftlab.sglang.install stage --parts-dir "$d" --stage "$PARTS"
done
say "phase $PHASE; bundle parts staged: $(ls "$PARTS" | paste -sd ' ')"

install_sglang() {
  python3 -m draftlab.sglang.install install --stage "$PARTS" --prefix "$PREFIX" || return 1  # a no-op once installed
  PYTHONPATH=$PREFIX:$PYTHONPATH python3 -c "import sglang, transformers, sgl_kernel; print(sglang.__version__)" > "$SG/version.txt" \
    && say "SGLang $(cat "$SG/version.txt") installed in $PREFIX"
}

side_by_side() {  # the same first N train rows through SGLang (server up) or the batch backend (server gone)
  local n=${REGEN_SIDE:-4096} d=$DL/side which=$1
  mkdir -p "$d" "$RUN/bench"
  head -n "$n" "$RUN/data/blend/train.jsonl" > "$d/rows.jsonl"
  local common=(--max-tokens "${MAX_TOKENS:-256}" --temperature 0 --truncation keep_flag --no-progress)
  rm -rf "${d:?}/$which"
  if [ "$which" = sglang ]; then  # an empty prefix cache: 03 just sent the same prompts
    flush_server "$(cat "$DL/ready")"
    date +%s.%N > "$d/sglang.s"
    python3 -m draftlab.cli regenerate "$d/rows.jsonl" "$d/sglang" --base-url "$(cat "$DL/ready")" --model "$MODEL_DIR" \
      --concurrency "${REGEN_CONCURRENCY:-1024}" --timeout 600 "${common[@]}" > "$d/sglang.json"
  else
    date +%s.%N > "$d/batch.s"
    python3 -m draftlab.cli regenerate "$d/rows.jsonl" "$d/batch" --backend batch --device cuda --batch-size 4096 \
      --batch-tokens 3000000 "${common[@]}" > "$d/batch.json"
  fi
  date +%s.%N >> "$d/$which.s"
  python3 - "$d" "$RUN/bench/regen_side_by_side.json" "$n" <<'PY'
import json, sys
from pathlib import Path
d, out, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
res = {"rows": n, "note": "first N rows of the blend's train split, max_tokens as 03, greedy; wall from start to end of the command"}
for k in ("sglang", "batch"):
    if (d / f"{k}.json").is_file() and len((d / f"{k}.s").read_text().split()) == 2:
        t0, t1 = (float(x) for x in (d / f"{k}.s").read_text().split())
        res[k] = {"wall_s": t1 - t0, "summary": json.loads((d / f"{k}.json").read_text())}
out.write_text(json.dumps(res, indent=1))
print(json.dumps({k: v["wall_s"] for k, v in res.items() if isinstance(v, dict)}))
PY
}

train_in_background() {
  [ -f "$DL/train-bg.pid" ] && kill -0 "$(cat "$DL/train-bg.pid")" 2>/dev/null && return 0
  stage_done 04 && return 0
  say "04 in the background (setsid): log $DL/train-bg.log"
  OUT=$DL/train-bg-out BUDGET_S=1500 STAGES="04" ATTN_CHECK=0 \
    P04="-p ARCHS [eagle3] -p SIDE_BY_SIDE false -p EPOCHS 5.0" \
    setsid nohup bash -c "echo \$\$ > '$DL/train-bg.pid'; exec bash scripts/gpu/step.sh" > "$DL/train-bg.log" 2>&1 < /dev/null &
  sleep 2
  say "04 running as pid $(cat "$DL/train-bg.pid")"
}

wait_training() {  # 0 when 04 is done; 3 when it still runs at the deadline
  while ! stage_done 04; do
    if ! kill -0 "$(cat "$DL/train-bg.pid" 2>/dev/null || echo 0)" 2>/dev/null; then
      say "FAILED: 04 is not running and not done"; tail -40 "$DL/train-bg.log"; return 1
    fi
    [ "$(left)" -lt 30 ] && { say "04 still training: $(grep -o 'step [0-9]*' "$RUN"/train/eagle3/train.log 2>/dev/null | tail -1)"; return 3; }
    sleep 10
  done
  say "04 done: $(python3 -c "import json; m=json.load(open('$RUN/metrics.json')); print({k: v for k, v in m['04_train_draft'].items() if not isinstance(v, (dict, list))})" 2>/dev/null)"
}


study_missing() {  # labels of the plan not measured yet (empty: the study is complete)
  [ -f "$SG/study/plan.json" ] || { echo "no plan"; return; }
  python3 -c "
import json, sys
plan = json.load(open('$SG/study/plan.json'))
done = set()
try:
    done = {json.loads(l)['label'] for l in open('$SG/study/windows.jsonl') if l.strip()}
except OSError:
    pass
failed = set()
try:
    failed = {json.loads(l)['label'] for l in open('$SG/study/failures.jsonl') if l.strip()}
except OSError:
    pass
print(' '.join(sorted(e['label'].replace(' ', '_') for e in plan['entries'] if e['label'] not in done | failed)))"
}

publish_run() {  # PHASE=notebooks/oracle: the published run and its draft as $RUN (once while warm)
  [ -f "$RUN/.published" ] && return 0
  local from=${PUBLISHED:-results/reference} xz dir
  rm -rf "$RUN" && mkdir -p "$RUN/drafts" && cp -r "$from"/. "$RUN"/ || return 1
  for xz in "$RUN"/data/*/*.jsonl.xz; do  # the run's splits travel compressed
    xz -dc "$xz" > "${xz%.xz}" || return 1
  done
  cp -rL "$DRAFT" "$RUN/drafts/eagle3" && touch "$RUN/.published"
  say "published run $from in $RUN: $(ls "$RUN" | paste -sd ' '); draft $(du -sh "$RUN/drafts/eagle3" | cut -f1)"
}

oracle_check() {  # PHASE=oracle: engine, then SGLang, acceptance on the same SAMPLES prompt ids
  local chk=$DL/check$SAMPLES spec name args
  mkdir -p "$chk/sglang"
  for spec in "chain6 --steps 6" "tree548 --steps 5 --topk 4 --num-draft-tokens 8"; do
    read -r name args <<< "$spec"
    [ -s "$chk/sglang/oracle_$name.json" ] && continue
    # shellcheck disable=SC2086
    timeout "$(( $(left) - 30 ))" python3 -m draftlab.cli bench specdec --target embedded --draft "$DRAFT" \
      --device cuda --dtype bfloat16 --eval-set "$RUN/data/blend/test.jsonl" --samples "$SAMPLES" \
      --max-new-tokens 128 --out "$chk/sglang/oracle_$name.json" $args > "$chk/engine_$name.log" 2>&1
    say "oracle check: engine $name exit $?"
  done
  timeout "$(( $(left) - 20 ))" python3 -m draftlab.cli bench sglang --model-path "$MODEL_DIR" --draft "$DRAFT" \
    --eval-set "$RUN/data/blend/test.jsonl" --samples "$SAMPLES" --max-new-tokens 128 --prefix "$PREFIX" \
    --python python3 --chain 6 --trees 5x4x8 --concurrency 1 --no-wrong-flag --repeats 1 --warmup 0 \
    --budget-s $(( $(left) - 60 )) --out "$chk/sglang/study" 2>&1 | grep -v "it/s\]"
  say "oracle check: SGLang study exit ${PIPESTATUS[0]}"
  python3 - "$chk" "$SAMPLES" "$OUT/oracle_check.json" <<'PY'
import json, sys
from draftlab.benchmark_acceptance.sglang_report import oracle_gaps
gaps = oracle_gaps(sys.argv[1])
note = "the engine, then SGLang, on the same prompt ids: acceptance per setting"
json.dump({"samples": int(sys.argv[2]), "note": note, "gaps": gaps}, open(sys.argv[3], "w"), indent=1)
for g in gaps:
    print(g["setting"], "engine", round(g["engine"], 4), "sglang", round(g["sglang"], 4), f"gap {100 * g['gap']:+.2f}%")
PY
  tar -czf "$OUT/oracle-check.tar.gz" -C "$DL" --exclude='*.safetensors' "check$SAMPLES"
}

ORACLE=("chain --steps ${ORACLE_CHAIN:-1,3,6}" "tree548 --steps 5 --topk 4 --num-draft-tokens 8"
        "tree6816 --steps 6 --topk 8 --num-draft-tokens 16" "wrongflag --steps 6 --mode EAGLE")
oracle_done() { for spec in "${ORACLE[@]}"; do [ -s "$SG/oracle_${spec%% *}.json" ] || return 1; done; }

oracle() {  # the engine on the same prompt ids (same eval file, same first N) and the same draft
  local spec name args
  for spec in "${ORACLE[@]}"; do
    read -r name args <<< "$spec"
    [ -s "$SG/oracle_$name.json" ] && continue
    [ "$(left)" -lt 90 ] && { say "oracle $name: left for the next call ($(left) s left)"; return 0; }
    # shellcheck disable=SC2086
    timeout "$(( $(left) - 30 ))" python3 -m draftlab.cli bench specdec --target embedded --draft "$DRAFT" \
      --device cuda --dtype bfloat16 --eval-set "$RUN/data/blend/test.jsonl" --samples "$SAMPLES" \
      --max-new-tokens 128 --out "$SG/oracle_$name.json.tmp" $args 2>&1 | grep -v "it/s\]\|s/it\]"
    [ -s "$SG/oracle_$name.json.tmp" ] && mv "$SG/oracle_$name.json.tmp" "$SG/oracle_$name.json"
  done
}

send_back_once() {  # the trained draft and the regenerated set: what a later session needs (never re-trained)
  [ -f "$DL/sent-back" ] && return 0
  save_draft eagle3
  xz -T0 -9 -c "$RUN/data/regen/train.jsonl" > "$OUT/regen-train.jsonl.xz"
  xz -T0 -9 -c "$RUN/data/regen/val.jsonl" > "$OUT/regen-val.jsonl.xz"
  touch "$DL/sent-back"
  say "sent back: $(ls "$OUT" | paste -sd ' ')"
}

pack_results() {  # this run's results so far (no weights, no data): small, every call
  tar -czf "$OUT/sglang-results.tar.gz" -C "$RESULTS" --exclude='*.safetensors' --exclude='ckpt-*' --exclude=tokens \
    --exclude=hidden --exclude=data --exclude=drafts --exclude='*.pt' "$RUN_ID"
  say "packed $(du -h "$OUT/sglang-results.tar.gz" | cut -f1)"
}

case $PHASE in
  setup) ensure_all || exit 1 ;;
  stash) ;;
  regen)
    ensure_all && install_sglang || exit 1
    serve_target "$SG/regen-server.log" "$DL/ready" || exit 1
    STAGES=(03)
    P03="-p BACKEND server -p BASE_URLS [\"$(cat "$DL/ready")\"] -p SERVED_MODEL $MODEL_DIR -p CONCURRENCY ${REGEN_CONCURRENCY:-1024} -p REQUEST_TIMEOUT 600.0" run_pending
    rc=$?
    [ $rc -eq 0 ] && [ "${REGEN_SIDE:-4096}" -gt 0 ] && side_by_side sglang
    kill -TERM $SERVER_PID 2>/dev/null; wait $SERVER_PID 2>/dev/null
    [ $rc -eq 0 ] || exit $rc
    [ "${REGEN_SIDE:-4096}" -gt 0 ] && side_by_side batch
    train_in_background ;;
  after)  # whatever is still to do, in priority order, with the time this call has left
    if [ "$DRAFT" = "$RUN/drafts/eagle3" ]; then  # this run's own training
      wait_training; rc=$?; [ $rc -eq 0 ] || exit $rc
      send_back_once
    else  # a published draft: a measurement-only session
      ensure_all || exit 1
      if [ ! -s "$RUN/data/blend/test.jsonl" ]; then
        mkdir -p "$RUN/data/blend" && xz -dc "$EVAL_XZ" > "$RUN/data/blend/test.jsonl" || exit 1
      fi
      for f in "$ORACLE_FROM"/oracle_*.json; do [ -e "$SG/$(basename "$f")" ] || cp "$f" "$SG/"; done
    fi
    [ -f "$DRAFT/model.safetensors" ] || { say "FAILED: no draft at $DRAFT"; exit 1; }
    install_sglang || exit 1
    if [ ! -s "$SG/study/summary.csv" ] || [ -n "$(study_missing)" ]; then
      if [ "$(left)" -lt "${STUDY_MIN_S:-330}" ]; then say "study needs a fresh call ($(left) s left)"; pack_results; exit 3; fi
      # shellcheck disable=SC2086
      timeout "$(( $(left) - 20 ))" python3 -m draftlab.cli bench sglang --model-path "$MODEL_DIR" \
        --draft "$DRAFT" --eval-set "$RUN/data/blend/test.jsonl" --samples "$SAMPLES" \
        --max-new-tokens 128 --prefix "$PREFIX" --python python3 --budget-s $(( $(left) - 60 )) \
        --out "$SG/study" ${STUDY_ARGS:-} 2>&1 | grep -v "it/s\]"
      say "study: exit ${PIPESTATUS[0]}"
    fi
    oracle
    python3 -m draftlab.cli bench sglang --summary-only --out "$SG/study"  # RUN/sglang/summary.json for run.summary
    pack_results
    [ -z "$(study_missing)" ] && oracle_done && { say "DONE"; exit 0; }
    say "NOT DONE YET: PHASE=after again"; exit 3 ;;
  notebooks)
    publish_run && ensure_all || exit 1
    read -r -a STAGES <<< "${STAGES_NOTEBOOKS:-00 05 06}"
    run_pending; rc=$?
    report
    # what ran, whatever pack_reference makes of it (it rebuilds summary.json and README.md)
    tar -czf "$OUT/notebooks.tar.gz" -C "$RUN" --exclude='*.safetensors' executed figures metrics.json params.yaml \
      $(cd "$RUN" && ls -d params.d run.json 2>/dev/null)
    [ $rc -eq 0 ] && { pack_reference; exit $?; }
    [ $rc -eq 2 ] && { say "NOT DONE YET: PHASE=notebooks again"; exit 3; }
    exit 1 ;;
  oracle)
    publish_run && ensure_all && install_sglang || exit 1
    oracle_check ;;
  *) say "unknown PHASE $PHASE"; exit 2 ;;
esac
