#!/usr/bin/env bash
# Restore a published draft from the commit that holds it into an ignored folder, checked by sha256.
# Why from history: every device call carries the whole working tree (64 MiB at most), so a 29 MB
# draft kept in the tree would shrink every transfer; a commit keeps it as safely.
# Usage: ops/gpu/published_draft.sh [RUN] [DEST]   (defaults: results/reference, .device/drafts/eagle3)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:-results/reference}
DEST=${2:-.device/drafts/eagle3}
commit=$(cat "$RUN/draft/eagle3.commit")
# the folder as the commit holds it: a run renamed later (h200-sglang-2026-12-01 -> reference) keeps its old path there
folder=$(git show --name-only --format= "$commit" | sed -n 's|/model.safetensors$||p' | head -1)
[ -n "$folder" ] || { echo "published_draft: commit $commit holds no model.safetensors" >&2; exit 1; }
mkdir -p "$DEST"
for f in config.json model.safetensors; do
  git show "$commit:$folder/$f" > "$DEST/$f"
done
(cd "$DEST" && sha256sum -c --quiet "$OLDPWD/$RUN/draft/eagle3.sha256") && echo "$DEST: the published draft of $RUN (commit ${commit:0:12}), sha256 ok"
