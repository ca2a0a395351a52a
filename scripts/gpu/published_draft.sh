#!/usr/bin/env bash
# Restore a published draft from the commit that holds it into an ignored folder, checked by sha256.
# Why from history: every device call carries the whole working tree (64 MiB at most), so a 29 MB
# draft kept in the tree would shrink every transfer; a commit keeps it as safely.
# Usage: scripts/gpu/published_draft.sh [RUN] [DEST]   (defaults: results/reference, .device/drafts/eagle3)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:-results/reference}
DEST=${2:-.device/drafts/eagle3}
commit=$(cat "$RUN/draft/eagle3.commit")
mkdir -p "$DEST"
for f in config.json model.safetensors; do
  git show "$commit:$RUN/draft/eagle3/$f" > "$DEST/$f"
done
(cd "$DEST" && sha256sum -c --quiet "$OLDPWD/$RUN/draft/eagle3.sha256") && echo "$DEST: the published draft of $RUN (commit ${commit:0:12}), sha256 ok"
