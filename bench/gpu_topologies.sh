#!/usr/bin/env bash
# Embedded vs distributed topology on the GPU machine, one call, same load generator, side by side:
#   1. the embedded server (one process, SQLite, in-process queue): idle latency, then saturation;
#   2. Redis (carried as .debs, unpacked with dpkg -x) + one worker process (cuda:0) + $APIS api
#      processes sharing /dev/shm (SENSEVOICE_SHARED_DIR): idle latency (submit on one api, poll
#      on another), then the same load over 4, 8, ... api processes ($API_STEPS);
#   3. faults under load: a second worker (no CUDA graphs: it starts in seconds) joins; kill -9 of
#      the first worker mid-batch, then of one api process; lost / finished-twice / reclaim time.
# Load: bench/load_test.py, 10 s WAV uploads, $SUBMITTERS submitters in $CLIENTS client processes
# + 200 pollers at 2 Hz, $SECONDS_PER_RUN s each. Needs .whl (wheels) and .deb (redis) carried.
# Writes $OUT/*.json and logs; prints one table row per run last.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
LOGS=/tmp/topology-logs; mkdir -p $LOGS  # server logs stay there: $OUT keeps the few files that matter
SUBMITTERS=${SUBMITTERS:-64} CLIENTS=${CLIENTS:-4} SECS=${SECONDS_PER_RUN:-20}
APIS=${APIS:-12} API_STEPS=${API_STEPS:-"4 8 12"} VIS=${VISIBILITY_S:-5}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
for d in .deb/*.deb; do dpkg -x "$d" /tmp/redis; done
export LD_LIBRARY_PATH=/tmp/redis/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
REDIS=/tmp/redis/usr/bin/redis-check-rdb  # redis-server is this binary under another name
ln -sf $REDIS /tmp/redis/redis-server
model=/tmp/sensevoice-full
[ -f $model/model.pt ] || python3 -m pipeline.model.demo.build_model --variant full --out $model >"$OUT/build.log" 2>&1 \
  || { tail -20 "$OUT/build.log"; exit 1; }
# the load generator is one client address with ~270 connections: lift the per-client limits
export SENSEVOICE_GRAPH_MAX_SECONDS=16 SENSEVOICE_QUEUE_SIZE=4096 \
  SENSEVOICE_MAX_CONNECTIONS_PER_CLIENT=0 SENSEVOICE_MAX_UPLOADS_PER_CLIENT=0
ready() { for _ in $(seq 900); do python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1]+'/readyz', timeout=2)" "$1" 2>/dev/null && return 0; sleep 0.3; done; return 1; }
warm() {  # /readyz answers before the background compile and the graph captures end: wait for them
  for _ in $(seq 400); do grep -q "CUDA graphs: [0-9]* captured\|serving the eager path" "$1" && return 0; sleep 0.3; done
  echo "not warm after 120 s: $1" | tee -a "$OUT/progress.txt"; }
profile() {  # name pid: 10 s of py-spy (threads, GIL holders too) in the middle of a load run
  [ -n "${PROFILE:-}" ] || return 0
  (sleep 6; /tmp/site/bin/py-spy record --pid "$2" -d 10 -r 50 --threads --nonblocking --format raw \
     -o "$OUT/$1.raw" >/dev/null 2>&1) &
}
cpu_s() {  # total user+sys CPU seconds of these pids (not their children)
  local t=0; for p in "$@"; do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done
  python3 -c "print($t / $(getconf CLK_TCK))"
}
load() {  # name urls [pids whose CPU to count]
  local name=$1 urls=$2; shift 2
  local before; before=$(cpu_s "$@")
  local TIMEFORMAT="load generator cpu: user %U s, sys %S s, wall %R s"
  { time OUT=$OUT/$name timeout 150 python3 bench/load_test.py --url "$urls" --submitters $SUBMITTERS \
      --client-processes $CLIENTS --seconds $SECS --pollers 200 --clips 10 --finish-timeout 90 \
      >"$LOGS/$name.txt" 2>&1 ; } 2>>"$LOGS/$name.txt"
  echo "server cpu: $(python3 -c "print(round($(cpu_s "$@") - $before, 1))") s" >>"$LOGS/$name.txt"
  cp "$OUT/$name/load.json" "$LOGS/$name.json" 2>/dev/null; rm -rf "$OUT/$name"
  { echo "$name: $(grep '^|' "$LOGS/$name.txt" | tail -1)"; tail -2 "$LOGS/$name.txt"; } | tee -a "$OUT/progress.txt"
}
# 1. embedded
python3 app_sensevoice.py --model $model --device cuda --api-only --port 7870 --data-dir "$(mktemp -d)" \
  >"$LOGS/embedded.log" 2>&1 &
emb=$!
ready http://127.0.0.1:7870 || { tail -30 "$LOGS/embedded.log"; exit 1; }
warm "$LOGS/embedded.log"
python3 bench/idle_latency.py --url http://127.0.0.1:7870 --runs 100 --name embedded | tee -a "$OUT/progress.txt"
profile embedded-server $emb
load embedded http://127.0.0.1:7870 $emb
kill $emb; wait $emb
# 2. distributed, audio through /dev/shm
/tmp/redis/redis-server --port 6390 --dir "$(mktemp -d)" --save '' --appendonly yes --appendfsync everysec \
  --maxmemory-policy noeviction >"$LOGS/redis.log" 2>&1 &
redis=$!
export SENSEVOICE_BROKER=redis://127.0.0.1:6390/0 SENSEVOICE_SHARED_DIR=/dev/shm/sensevoice-bench \
  SENSEVOICE_VISIBILITY_TIMEOUT_S=$VIS
SENSEVOICE_ROLE=worker python3 app_sensevoice.py --model $model --device cuda:0 --api-only --port 7880 \
  --data-dir "$(mktemp -d)" >"$LOGS/worker.log" 2>&1 &
worker=$!
apis=(); urls=()
for k in $(seq $APIS); do
  SENSEVOICE_ROLE=api SENSEVOICE_DECODE_PROCESSES=2 python3 app_sensevoice.py --model $model --device cpu \
    --api-only --port $((7880 + k)) --data-dir "$(mktemp -d)" >"$LOGS/api-$k.log" 2>&1 &
  apis+=($!); urls+=("http://127.0.0.1:$((7880 + k))")
done
for u in "${urls[@]}"; do ready "$u" || { tail -30 "$LOGS/api-1.log"; exit 1; }; done
ready http://127.0.0.1:7880 || { tail -30 "$LOGS/worker.log"; exit 1; }
warm "$LOGS/worker.log"
python3 bench/idle_latency.py --url "${urls[0]},${urls[1]}" --runs 100 --name distributed | tee -a "$OUT/progress.txt"
profile distributed-worker $worker
for n in $API_STEPS; do
  load distributed-${n}api "$(IFS=,; echo "${urls[*]:0:$n}")" $redis $worker "${apis[@]:0:$n}"
done
/tmp/redis/usr/bin/redis-cli -p 6390 info commandstats >"$LOGS/redis-commandstats.txt" 2>&1
/tmp/redis/usr/bin/redis-cli -p 6390 info cpu >>"$LOGS/redis-commandstats.txt" 2>&1
# 3. faults under load: a second worker joins (eager, starts in seconds); kill -9 worker 1 at 3 s,
#    api $APIS at 5 s; the load goes on over the other api processes; then count
SENSEVOICE_ROLE=worker SENSEVOICE_CUDA_GRAPHS=0 python3 app_sensevoice.py --model $model --device cuda:0 \
  --api-only --port 7879 --data-dir "$(mktemp -d)" >"$LOGS/worker2.log" 2>&1 &
worker2=$!
ready http://127.0.0.1:7879 || { tail -30 "$LOGS/worker2.log"; exit 1; }
done_before=$(/tmp/redis/usr/bin/redis-cli -p 6390 hget sv:counts done)
( sleep 3; kill -9 $worker; echo "worker 1 killed at $(date '+%H:%M:%S.%N')" >>"$LOGS/kills.txt"
  sleep 2; kill -9 ${apis[$((APIS - 1))]}; echo "api $APIS killed at $(date '+%H:%M:%S.%N')" >>"$LOGS/kills.txt" ) &
SECS=${FAULT_SECONDS:-8} load faults "$(IFS=,; echo "${urls[*]:0:8},${urls[$((APIS - 1))]}")"
done_after=$(/tmp/redis/usr/bin/redis-cli -p 6390 hget sv:counts done)
{ echo "results written during the fault run (sv:counts done delta): $((done_after - done_before))"
  grep -h "reclaimed" "$LOGS/worker2.log" | head -5
  cat "$LOGS/kills.txt"
  python3 - "$LOGS/faults.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print("fault run: accepted", r["accepted"], "completed", r["completed"], "failed", r["failed"],
      "lost", r["lost"], "latency ms", r["latency_ms"], "transport errors", r["transport_errors"])
PY
} >>"$OUT/progress.txt" 2>&1
kill "${apis[@]}" $worker2 2>/dev/null; wait "${apis[@]}" $worker2 2>/dev/null  # (not redis: killed next)
kill $redis
ls /dev/shm/sensevoice-bench | wc -l | sed 's/^/shared files left (uploads kept for retention): /'
{ echo "## redis"; cat "$LOGS/redis-commandstats.txt"
  echo "## worker batch sizes"; grep -o "batch=[0-9]*" "$LOGS/worker.log" | sort | uniq -c | sort -rn | head -8
  echo "## worker log tail"; grep -v "job done\|torch_complex" "$LOGS/worker.log" | tail -15
} >"$OUT/summary.txt" 2>&1
