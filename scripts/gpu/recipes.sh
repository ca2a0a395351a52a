#!/usr/bin/env bash
# Issue 18 on the GPU machine: the recipe study (draftlab recipes; lib/draftlab/data_scaling/recipes.py).
# Every call first takes the cargo chunk it carried (scripts/gpu/cargo.sh) and runs PHASE:
#   stash    nothing else (a transfer call: carry .device/cargo/cN)
#   train    set-up; once per machine the training-speed check (SPEED_STEPS steps of the reference recipe:
#            the objective of OLDLIB, carried, beside this tree's, with and without recomputing the head);
#            then `draftlab recipes train` of ROWS, PARALLEL at a time, until the deadline (exit 3: call again)
#   speed    set-up, benchmarks/tokenize_profile.py on 300 rows, the speed check on SPEED_SAMPLES rows
#   measure  SGLang from the bundle, then `draftlab recipes measure` of every trained row (and `base`, the
#            published draft) on the held-out split and HumanEval; the report
# Results: $OUT/recipes.tar.gz (no weights) every call; $OUT/log.
set -uo pipefail
source "$(dirname "$0")/common.sh"
PHASE=${PHASE:-stash}
ROWS=${ROWS:-epochs10,fcnorm,vocab32k,eagle1}
PARALLEL=${PARALLEL:-4}
STUDY=$DL/recipes
MODEL_DIR=$DRAFTLAB_CACHE/embedded-SmolLM2-135M-Instruct  # the embedded target, converted by ensure_all
PREFIX=${PREFIX:-$DL/sglang}                             # SGLang, installed from the offline bundle
DATA=$STUDY/data
mkdir -p "$DATA"
bash scripts/gpu/cargo.sh receive || exit 1
for d in .device/sglang/p*; do
  [ -d "$d" ] && python3 -m draftlab.sglang.install stage --parts-dir "$d" --stage "$DL/sglang-parts"
done
say "phase $PHASE"

data() {  # the reference run's regenerated set and held-out split, and its published draft as row `base`
  for f in results/reference/data/regen/train results/reference/data/regen/val results/reference/data/blend/test; do
    [ -s "$DATA/$(basename "$f").jsonl" ] || xz -dc "$f.jsonl.xz" > "$DATA/$(basename "$f").jsonl" || return 1
  done
  if [ ! -f "$STUDY/base/draft/model.safetensors" ]; then
    mkdir -p "$STUDY/base/train" && cp -rL .device/drafts/eagle3 "$STUDY/base/draft" \
      && cp results/reference/train/summary.json "$STUDY/base/train/" || return 1
  fi
}

speed() {  # SPEED_STEPS steps of the reference recipe by each objective, one after the other: tok/s
  grep -q tok_s "$STUDY/speed.json" 2>/dev/null && return 0  # once per machine
  local n=${SPEED_STEPS:-30} v lib extra
  mkdir -p "$STUDY/speed"
  for v in ${SPEED_VARIANTS:-new old}; do  # the first tokenises into $STUDY/speed/tokens, the others read it
    lib=$REPO/lib; extra=()
    [ "$v" = old ] && lib=$REPO/.device/oldlib/lib
    [ "$v" = new_keep_head ] && extra=(--recompute-head false)
    rm -rf "$STUDY/speed/$v"
    PYTHONPATH=$lib:$SITE timeout 240 python3 -m draftlab.cli train --train-file "$DATA/train.jsonl" --target embedded \
      --val-file "$DATA/val.jsonl" --max-val-samples 256 --device cuda --epochs 5 --draft-vocab-size 16000 --lr 5e-4 --batch-tokens 16384 --max-batch 64 \
      --stop-after "$n" --max-train-samples "${SPEED_SAMPLES:-0}" --log-every 10 --save-every 100000 --out-dir "$STUDY/speed/$v" "${extra[@]}" \
      > "$STUDY/speed/$v.log" 2>&1
    say "speed $v: exit $? $(tail -c 300 "$STUDY/speed/$v.log" | tr '\r' '\n' | grep -v '^$' | tail -1)"
  done
  python3 - "$STUDY/speed" "$STUDY/speed.json" <<'PY'
import csv, json, sys
from pathlib import Path
d = Path(sys.argv[1]); res = {}
for v in ("old", "new", "new_keep_head"):
    rows = list(csv.DictReader(open(d / v / "train.csv"))) if (d / v / "train.csv").is_file() else []
    if len(rows) >= 3:  # the rate over the steps after the first logged window (warm-up)
        a, b = rows[0], rows[-1]
        toks = float(b["tokens_per_s"]) * float(b["elapsed_s"]) - float(a["tokens_per_s"]) * float(a["elapsed_s"])
        res[v] = {"steps": int(b["step"]), "tok_s_after_warmup": toks / (float(b["elapsed_s"]) - float(a["elapsed_s"])),
                  "tok_s_cumulative": float(b["tokens_per_s"])}
res["note"] = "draftlab train, reference recipe (16K vocab, 16,384-token batches, TTT 7), real regenerated data, one process each, H200"
Path(sys.argv[2]).write_text(json.dumps(res, indent=1)); print(json.dumps(res))
PY
  cp "$STUDY/speed.json" "$OUT/"
}

pack() {
  tar -czf "$OUT/recipes.tar.gz" -C "$DL" --exclude='*.safetensors' --exclude='ckpt-*' --exclude=data --exclude=tokens \
    --exclude=tb recipes
  say "packed $(du -h "$OUT/recipes.tar.gz" | cut -f1)"
}

case $PHASE in
  stash) ;;
  speed)  # the tokeniser's profile on this machine and the speed check alone (SPEED_SAMPLES rows)
    ensure_all && data || exit 1
    timeout 120 python3 benchmarks/tokenize_profile.py "$MODEL_DIR" "$DATA/train.jsonl" 300 2>&1 | grep -v "conv/s\]" \
      | tee "$OUT/tokenize_profile.txt" | head -40
    timeout 120 python3 benchmarks/tokenize_profile.py "$MODEL_DIR" "$DATA/train.jsonl" 300 embedded cuda 2>&1 \
      | grep -v "conv/s\]" | tee "$OUT/tokenize_profile_after_target.txt" | head -30
    speed; pack ;;
  train)
    ensure_all && data || exit 1
    speed
    mkdir -p "$STUDY/speed/tokens"  # a link to a missing folder fails train's mkdir ("File exists", 2026-12-01)
    for r in ${ROWS//,/ }; do  # one tokenised cache for every row (train reads OUT_DIR/../tokens)
      mkdir -p "$STUDY/$r"; [ -e "$STUDY/$r/tokens" ] || ln -sfn "$STUDY/speed/tokens" "$STUDY/$r/tokens"
    done
    python3 -m draftlab.cli recipes train --rows "$ROWS" --train-file "$DATA/train.jsonl" --val-file "$DATA/val.jsonl" \
      --out "$STUDY" --parallel "$PARALLEL" --budget-s $(( $(left) - 15 )) --set device cuda --set save_every 100 \
      --set eval_every 500 ${TRAIN_SET:-}
    rc=$?
    for r in ${ROWS//,/ }; do say "$r: $(tail -c 400 "$STUDY/$r/train.log" 2>/dev/null | tr '\r' '\n' | grep -v '^$' | tail -1)"; done
    pack; exit $rc ;;
  measure)
    ensure_all && data || exit 1
    python3 -m draftlab.sglang.install install --stage "$DL/sglang-parts" --prefix "$PREFIX" || exit 1
    python3 -m draftlab.cli recipes measure --rows "base,$ROWS" --out "$STUDY" --model-path "$MODEL_DIR" \
      --held-out "$DATA/test.jsonl" --samples "${SAMPLES:-64}" --humaneval "${HUMANEVAL:-32}" --prefix "$PREFIX" \
      --budget-s $(( $(left) - 30 )) 2>&1 | grep -v "it/s\]"
    rc=${PIPESTATUS[0]}
    pack; exit $rc ;;
  *) say "unknown PHASE $PHASE"; exit 2 ;;
esac
