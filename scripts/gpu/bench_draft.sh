#!/usr/bin/env bash
# Benchmark a trained draft in the reference engine on the GPU machine, without rerunning the
# notebooks. The draft travels as the parts `scripts/gpu/prepare_draft.sh` made (.device/draft-a,
# .device/draft-b: a call carries at most 64 MiB, and the target's GGUF already fills most of two).
# Call order, back to back (the machine stays warm 30 s between calls):
#   a_stage.sh                                    carry [.device/a]
#   bench_draft.sh                                carry [.device/b, .whl, .device/draft-a]
#   bench_draft.sh                                carry [.device/draft-b, .device/prompts]
# Each call stashes what it carried under $DL; the call that completes the set runs the benches
# at the end of this file until its deadline (BUDGET_S) and writes their JSON and log under $OUT.
source "$(dirname "$0")/common.sh"
PARTS=$DL/draft-parts
mkdir -p "$PARTS" "$DL/prompts"
for d in .device/draft-*; do
  [ -d "$d" ] && cp "$d"/* "$PARTS"/ && say "stashed $(ls "$d" | paste -sd ' ') from $d"
done
[ -d .device/prompts ] && cp .device/prompts/* "$DL/prompts"/
ensure_all || { say "FAILED: set-up (see above)"; exit 1; }

want=$(cat "$PARTS/COUNT" 2>/dev/null || echo 0)
have=$(ls "$PARTS"/draft.tar.part-* 2>/dev/null | wc -l)
if [ "$want" -eq 0 ] || [ "$have" -lt "$want" ] || [ -z "$(ls "$DL/prompts" 2>/dev/null)" ]; then
  say "NOT DONE YET: $have of $want draft parts, prompts: $(ls "$DL/prompts" | paste -sd ' '). NEXT: bench_draft.sh with the rest"
  exit 3
fi
if [ ! -f "$DL/draft/eagle3/model.safetensors" ]; then
  cat "$PARTS"/draft.tar.part-* > "$DL/draft.tar"
  (cd "$DL" && sha256sum -c "$PARTS/SHA256") || { say "FAILED: the draft parts do not match SHA256"; exit 1; }
  mkdir -p "$DL/draft" && tar -xf "$DL/draft.tar" -C "$DL/draft" || exit 1
fi
DRAFT=$DL/draft/eagle3
BLEND=$DL/prompts/test.jsonl
N=${SAMPLES:-64}

bench() {  # bench NAME ARGS...: one `draftlab bench specdec` run (blend prompts unless ARGS say), if there is time
  local name=$1; shift
  [ -s "$OUT/$name.json" ] && return 0
  if [ "$(left)" -lt "${MIN_LEFT:-60}" ]; then say "$name: skipped, $(left) s left"; return 0; fi
  say "bench $name: $*"
  timeout "$(left)" python3 -m draftlab.cli bench specdec --target embedded --draft "$DRAFT" --device cuda \
    --max-new-tokens 128 --samples "$N" --eval-set "$BLEND" --out "$OUT/$name.json" "$@" 2>&1 | grep -v "it/s\]\|s/it\]"
  say "bench $name: exit ${PIPESTATUS[0]}"
}

if [ -n "${BENCH:-}" ]; then  # one run of your own instead: BENCH="NAME ARGS..." (e.g. a repeat)
  read -r -a one <<< "$BENCH"
  bench "${one[@]}"
else  # in priority order: the graphed prefill (default) against the eager one, same draft, same prompts
  bench bf16_chain_blend       --dtype bfloat16 --steps 3,4,5,6,7
  bench bf16_chain_blend_nopad --dtype bfloat16 --steps 3,5 --prefill-bucket 0
  bench bf16_chain_humaneval   --dtype bfloat16 --steps 4,5 --eval-set humaneval
  bench fp32_chain_blend       --dtype float32 --steps 3,4,5
fi
say "DONE: $(ls "$OUT"/*.json 2>/dev/null | wc -l) result files in $OUT"
