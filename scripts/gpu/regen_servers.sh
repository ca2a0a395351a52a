#!/usr/bin/env bash
# Issue 17 part 6 on the GPU machine (after sglang.sh installed SGLang in an earlier warm call): does
# regeneration through SGLang scale with servers on the one GPU? On this 135M target one server's
# scheduler, not the GPU, sets the pace (regen_feed.sh: 15.4K tok/s with 651 running requests), so
# K servers (sglang.server.regeneration_commands: 512 running, graphs up to 512, a fixed KV pool, own ports)
# are fed by one client over all their URLs (`draftlab regenerate --base-url U1 --base-url U2 ...`,
# CONCURRENCY in flight per server). The same first N rows with 1, 2 .. K servers, then the whole
# train split (FULL=1) with all K. Results: $OUT/regen_servers.json, written after each part.
source "$(dirname "$0")/common.sh"
K=${K:-4}; N=${N:-4096}; CONCURRENCY=${CONCURRENCY:-512}; MEM=${MEM:-0.5}; FULL=${FULL:-1}
d=$DL/servers; rm -rf "$d"; mkdir -p "$d"
xz -dc results/reference/data/regen/train.jsonl.xz > "$d/train.jsonl"
head -n "$N" "$d/train.jsonl" > "$d/rows.jsonl"
common=(--model "$MODEL_DIR" --concurrency "$CONCURRENCY" --timeout 600 --max-tokens 256 --temperature 0
        --truncation keep_flag --no-progress)
server_command() {  # server_command I: the regeneration server I of K (sglang.server.regeneration_commands)
  python3 -c "
from draftlab.sglang.server import regeneration_commands
print(regeneration_commands('$MODEL_DIR', $K, mem_fraction_static=$MEM)[$1])"
}
PIDS=()
trap 'kill -TERM "${PIDS[@]}" 2>/dev/null; wait "${PIDS[@]}"' EXIT
for i in $(seq 0 $((K - 1))); do  # all at once: graph capture overlaps
  python3 -m draftlab.sglang.server --launch "$(server_command "$i")" --log "$d/server$i.log" --prefix "$PREFIX" \
    --ready-file "$d/ready$i" --startup-timeout 300 &
  PIDS+=($!)
done
for i in $(seq 0 $((K - 1))); do
  while [ ! -s "$d/ready$i" ]; do
    kill -0 "${PIDS[$i]}" 2>/dev/null || { say "FAILED: server $i did not start"; tail -30 "$d/server$i.log"; exit 1; }
    sleep 2
  done
done
say "$K SGLang servers ready: $(cat "$d"/ready* | paste -sd ' ')"
urls() { local i; for i in $(seq 0 $(($1 - 1))); do printf -- '--base-url %s ' "$(cat "$d/ready$i")"; done; }
measure() {  # measure NAME SERVERS ROWS: one client over the first SERVERS servers, empty prefix caches
  local name=$1 k=$2 rows=$3 i t0
  for i in $(seq 0 $((k - 1))); do flush_server "$(cat "$d/ready$i")" > /dev/null; done
  t0=$(date +%s.%N)
  # shellcheck disable=SC2046
  python3 -m draftlab.cli regenerate "$rows" "$d/$name" $(urls "$k") "${common[@]}" > "$d/$name.json" \
    || say "$name: regenerate exit $?"
  echo "$name $k $(python3 -c "import time; print(time.time() - $t0)")" >> "$d/walls"
  python3 - "$d" "$OUT/regen_servers.json" "$CONCURRENCY" "$MEM" <<'PY'
import json, sys
from pathlib import Path
d = Path(sys.argv[1])
res = {"concurrency_per_server": int(sys.argv[3]), "mem_fraction_static": float(sys.argv[4]),
       "max_running_requests": 512, "cuda_graph_max_bs": 512, "runs": {}}
for line in (d / "walls").read_text().splitlines():
    name, k, wall = line.split()
    summary = json.loads((d / f"{name}.json").read_text() or "{}")
    res["runs"][name] = {"servers": int(k), "wall_s": float(wall), "summary": summary}
Path(sys.argv[2]).write_text(json.dumps(res, indent=1))
print({n: (r["servers"], round(r["wall_s"], 1), r["summary"].get("tok_s")) for n, r in res["runs"].items()})
PY
}
k=1
while [ "$k" -le "$K" ]; do measure "n${N}_k$k" "$k" "$d/rows.jsonl"; k=$((k * 2)); done
[ "$FULL" = 1 ] && [ "$(left)" -gt 200 ] && measure "train_k$K" "$K" "$d/train.jsonl"
for i in $(seq 0 $((K - 1))); do
  grep -o "#running-req: [0-9]*" "$d/server$i.log" | awk '{print $2}' | sort -n \
    | awk -v s="$i" '{a[NR]=$1} END {print "server", s, "running requests: median", a[int(NR/2)+1], "max", a[NR], "samples", NR}'
done | tee "$OUT/running.txt"
tar -cJf "$OUT/servers-logs.tar.xz" -C "$d" $(cd "$d" && ls server*.log)
say "done"
