#!/usr/bin/env bash
# Issue 17 part 6 on the GPU machine (after sglang.sh set up SGLang and the target): is the client the
# limit of regeneration through SGLang? The same N rows (regenerated set, tracked) through one SGLang
# server by one client at concurrency C, then by two clients at C/2 each on halves, then by the batch
# backend (server stopped). Results: $OUT/regen_feed.json (wall s and summaries), written after each part.
source "$(dirname "$0")/common.sh"
N=${N:-4096}; C=${C:-1024}
d=$DL/feed; rm -rf "$d"; mkdir -p "$d"
xz -dc results/reference/data/regen/train.jsonl.xz | head -n "$N" > "$d/rows.jsonl"
head -n $((N / 2)) "$d/rows.jsonl" > "$d/half1.jsonl"; tail -n +$((N / 2 + 1)) "$d/rows.jsonl" > "$d/half2.jsonl"
common=(--max-tokens 256 --temperature 0 --truncation keep_flag --no-progress)
serve_target "$d/server.log" "$d/ready" || exit 1
URL=$(cat "$d/ready")
timed() { local name=$1; shift; local t0; t0=$(date +%s.%N); "$@"; echo "$name $(python3 -c "import time; print(time.time() - $t0)")" >> "$d/walls"; }
report() { python3 - "$d" "$OUT/regen_feed.json" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1]); res = {"rows": sum(1 for _ in open(d / "rows.jsonl"))}
for line in (d / "walls").read_text().splitlines() if (d / "walls").is_file() else []:
    name, wall = line.split()
    res[name] = {"wall_s": float(wall)}
    for f in sorted(d.glob(f"{name}*.json")):
        try: res[name][f.stem] = json.loads(f.read_text())
        except ValueError: pass
Path(sys.argv[2]).write_text(json.dumps(res, indent=1)); print(json.dumps({k: v.get("wall_s") for k, v in res.items() if isinstance(v, dict)}))
PY
}
flush_server "$URL"; timed one python3 -m draftlab.cli regenerate "$d/rows.jsonl" "$d/one" --base-url "$URL" --model "$MODEL_DIR" --concurrency "$C" --timeout 600 "${common[@]}" > "$d/one.json"; report
flush_server "$URL"; timed two bash -c "python3 -m draftlab.cli regenerate '$d/half1.jsonl' '$d/two1' --base-url '$URL' --model '$MODEL_DIR' --concurrency $((C / 2)) --timeout 600 ${common[*]} > '$d/two_1.json' &
  python3 -m draftlab.cli regenerate '$d/half2.jsonl' '$d/two2' --base-url '$URL' --model '$MODEL_DIR' --concurrency $((C / 2)) --timeout 600 ${common[*]} > '$d/two_2.json'; wait"; report
grep -o "#running-req: [0-9]*" "$d/server.log" | awk '{print $2}' | sort -n | awk '{a[NR]=$1} END {print "server running requests: median", a[int(NR/2)+1], "max", a[NR], "samples", NR}' | tee -a "$d/running.txt"
kill -TERM $SERVER_PID; wait $SERVER_PID 2>/dev/null
timed batch python3 -m draftlab.cli regenerate "$d/rows.jsonl" "$d/batch" --backend batch --device cuda --batch-size 4096 --batch-tokens 3000000 "${common[@]}" > "$d/batch.json"; report
xz -c "$d/server.log" > "$OUT/feed-server.log.xz"; cp "$d/running.txt" "$OUT/" 2>/dev/null; say "done"
