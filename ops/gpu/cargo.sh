#!/usr/bin/env bash
# What a measurement session carries to the GPU machine (the target GGUF, the notebooks' wheels, the
# SGLang bundle, the published draft) as one tar stream cut into equal chunks, one chunk a call.
# Why: a call carries 64 MiB together with the working tree (19 MiB on 2026-12-01); items of uneven
# sizes (a 56 MiB GGUF part, 55 MiB bundle parts, a 27 MiB draft) each took a call of their own and
# some no longer fit beside the tree.
#   here:  ops/gpu/cargo.sh pack [CHUNK]   -> .device/cargo/c1 .. cN, each one chunk + its sha256
#          (CHUNK default: 62 MiB less the working tree, e.g. 43M beside a 19 MiB tree; the items:
#          ops/gpu/prepare.sh, published_draft.sh (the reference draft into .device/drafts/eagle3;
#          more, e.g. `published_draft.sh results/recipes/rows/fcnorm .device/drafts/fcnorm`,
#          for recipes.sh's PUBLISHED), `draftlab sglang bundle --out .device/sglang
#          --machine-packages ops/gpu_machine_packages.txt`)
#   there: ops/gpu/cargo.sh receive       -> keeps each carried chunk (checked) in /tmp/cargo; once
#          all N are there, unpacks them into /tmp/cargo/root and links its folders into the repo copy
#          (every call again: the links are part of the repo copy, the unpacked files of /tmp)
# Call N carries .device/cargo/cN; chunks may come in any order; a chunk carried twice is a no-op.
# .device/compile-cache/compile-cache.tar.xz, when a session sent its compilers' caches back (SEND_COMPILE_CACHE=1,
# ops.gpu_compile_cache), travels with either kind and is unpacked by the call's set-up.
# CARGO=check packs the target, the wheels and the published drafts, not the bundle: ops/cost_model/session.sh
# takes the bundle's parts as they are, so that its shapes are measured before the rest has come.
# CARGO=train packs only what training needs (the target, the wheels, the reference draft that recipes.sh
# stages as row `base`): 5 chunks instead of 14, for a session that trains and sends drafts back but does
# not start SGLang (2026-12-02: a machine taken back mid-call cost the whole cargo).
set -euo pipefail
cd "$(dirname "$0")/../.."
TARGET=(.device/a/part-aa .device/b/part-ab .device/b/model.gguf.sha256 .whl)  # the embedded target, the wheels
case ${CARGO:-all} in
  all) ITEMS=("${TARGET[@]}" .device/sglang/p* .device/drafts) ;;  # every bundle part there is
  train) ITEMS=("${TARGET[@]}" .device/drafts/eagle3) ;;
  check) ITEMS=("${TARGET[@]}" .device/drafts) ;;  # the bundle's parts carried on their own (cost_model/session.sh)
  *) echo "cargo: CARGO=${CARGO} (expected all, train or check)" >&2; exit 2 ;;
esac
# the compilers' caches a session sent back (ops.gpu_compile_cache), when there: both kinds carry them
[ -f .device/compile-cache/compile-cache.tar.xz ] && ITEMS+=(.device/compile-cache)
LINKS=(.device/a .device/b .whl .device/sglang .device/drafts .device/compile-cache)
HOLD=${CARGO_HOLD:-/tmp/cargo}

tree_mib() {  # what every call carries besides its chunk: the tracked and untracked-unignored files, in MiB
  (git ls-files; git ls-files --others --exclude-standard) | xargs -d '\n' du -cb 2>/dev/null | tail -1 \
    | awk '{print int($1 / 1048576) + 1}'
}

pack() {  # CHUNK default: what is left of a call's 64 MiB beside the working tree, less 2 MiB
  local size=${1:-$(( 62 - $(tree_mib) ))M} tmp=.device/cargo.tmp
  for item in "${ITEMS[@]}"; do [ -e "$item" ] || { echo "cargo: $item missing (see this script's header)" >&2; exit 1; }; done
  rm -rf .device/cargo "$tmp"; mkdir -p "$tmp"
  tar -cf - "${ITEMS[@]}" | split -b "$size" -d -a 2 - "$tmp/chunk."
  local n i=0
  n=$(ls "$tmp" | wc -l)
  for f in "$tmp"/chunk.*; do
    i=$((i + 1))
    mkdir -p ".device/cargo/c$i"
    mv "$f" ".device/cargo/c$i/"
    (cd ".device/cargo/c$i" && sha256sum chunk.* > SHA256 && echo "$n" > COUNT)
  done
  rmdir "$tmp"
  du -sh .device/cargo/c* | paste -sd ' '
  echo "cargo: $n chunks; carry .device/cargo/c1 .. c$n, one a call, and run ops/gpu/cargo.sh receive"
}

receive() {
  mkdir -p "$HOLD"
  local d n got
  for d in .device/cargo/c*; do
    [ -f "$HOLD/root/.complete" ] && break
    [ -f "$d/SHA256" ] || continue
    (cd "$d" && sha256sum -c --quiet SHA256) || { echo "cargo: $d is damaged (sha256); carry it again" >&2; exit 1; }
    for f in "$d"/chunk.*; do [ -e "$HOLD/${f##*/}" ] || cp "$f" "$HOLD/"; done  # (cp --update=none: coreutils 9.3+)
    cp "$d/COUNT" "$HOLD/COUNT"
  done
  [ -f "$HOLD/COUNT" ] || { echo "cargo: no chunk here yet (carry .device/cargo/cN)"; return 0; }
  n=$(cat "$HOLD/COUNT")
  got=$(find "$HOLD" -maxdepth 1 -name 'chunk.*' | wc -l)  # (none once unpacked)
  if [ ! -f "$HOLD/root/.complete" ]; then
    if [ "$got" -lt "$n" ]; then echo "cargo: $got of $n chunks held in $HOLD"; return 0; fi
    rm -rf "$HOLD/root"; mkdir -p "$HOLD/root"
    cat "$HOLD"/chunk.* | tar -xf - -C "$HOLD/root"
    touch "$HOLD/root/.complete"
    rm -f "$HOLD"/chunk.*
    echo "cargo: all $n chunks unpacked into $HOLD/root"
  fi
  mkdir -p .device
  for l in "${LINKS[@]}"; do
    [ -e "$HOLD/root/$l" ] || continue  # (CARGO=train: no SGLang bundle; no compile cache sent back yet)
    if [ -e "$l" ] && [ ! -L "$l" ]; then echo "cargo: $l is already here (carried?): kept"; continue; fi
    ln -sfn "$HOLD/root/$l" "$l"
  done
}

case ${1:-} in
  pack) pack "${2:-}" ;;
  receive) receive ;;
  *) echo "usage: ops/gpu/cargo.sh pack [CHUNK] | receive" >&2; exit 2 ;;
esac
