#!/usr/bin/env bash
# Embedded vs distributed topology on the GPU machine, one call, same load generator, side by side:
#   1. the embedded server (one process, SQLite, in-process queue) at saturation;
#   2. Redis (carried as .debs, unpacked with dpkg -x) + one worker process (cuda:0) + 8 api
#      processes; the same load spread over the first 4, then over all 8 api processes.
# Load: bench/load_test.py, 10 s WAV uploads, $SUBMITTERS submitters in $CLIENTS client processes
# + 200 pollers at 2 Hz, $SECONDS_PER_RUN s each. Needs .whl-gpu (wheels) and .deb (redis) carried.
# Writes $OUT/*.json and logs; prints one table row per run last.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
LOGS=/tmp/topology-logs; mkdir -p $LOGS  # server logs stay there: $OUT keeps the few files that matter
SUBMITTERS=${SUBMITTERS:-64} CLIENTS=${CLIENTS:-4} SECS=${SECONDS_PER_RUN:-20}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl-gpu/*.whl && export PYTHONPATH=/tmp/site || exit 1
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
profile() {  # name pid: 10 s of py-spy (threads, GIL holders too) in the middle of a load run
  [ -n "${PROFILE:-}" ] || return 0
  (sleep 6; /tmp/site/bin/py-spy record --pid "$2" -d 10 -r 50 --threads --nonblocking --format raw \
     -o "$OUT/$1.raw" >/dev/null 2>&1) &
}
load() {  # name urls
  OUT=$OUT/$1 python3 bench/load_test.py --url "$2" --submitters $SUBMITTERS --client-processes $CLIENTS \
    --seconds $SECS --pollers 200 --clips 10 --finish-timeout 60 >"$OUT/$1.txt" 2>&1
  echo "$1: $(tail -1 "$OUT/$1.txt")"
}
# 1. embedded
python3 app_sensevoice.py --model $model --device cuda --api-only --port 7870 --data-dir "$(mktemp -d)" \
  >"$LOGS/embedded.log" 2>&1 &
emb=$!
ready http://127.0.0.1:7870 || { tail -30 "$LOGS/embedded.log"; exit 1; }
profile embedded-server $emb
load embedded http://127.0.0.1:7870
kill $emb; wait $emb
# 2. distributed
/tmp/redis/redis-server --port 6390 --dir "$(mktemp -d)" --save '' --appendonly yes --appendfsync everysec \
  --maxmemory-policy noeviction >"$LOGS/redis.log" 2>&1 &
redis=$!
export SENSEVOICE_BROKER=redis://127.0.0.1:6390/0
SENSEVOICE_ROLE=worker python3 app_sensevoice.py --model $model --device cuda:0 --api-only --port 7880 \
  --data-dir "$(mktemp -d)" >"$LOGS/worker.log" 2>&1 &
worker=$!
apis=(); urls=()
for k in 1 2 3 4 5 6 7 8; do
  SENSEVOICE_ROLE=api SENSEVOICE_DECODE_PROCESSES=2 python3 app_sensevoice.py --model $model --device cpu \
    --api-only --port $((7880 + k)) --data-dir "$(mktemp -d)" >"$LOGS/api-$k.log" 2>&1 &
  apis+=($!); urls+=("http://127.0.0.1:$((7880 + k))")
done
for u in "${urls[@]}"; do ready "$u" || { tail -30 "$LOGS/api-1.log"; exit 1; }; done
ready http://127.0.0.1:7880 || { tail -30 "$LOGS/worker.log"; exit 1; }
four=$(IFS=,; echo "${urls[*]:0:4}"); eight=$(IFS=,; echo "${urls[*]}")
profile distributed-worker $worker
load distributed-4api "$four"
load distributed-8api "$eight"
{ echo "## redis commandstats"; /tmp/redis/usr/bin/redis-cli -p 6390 info commandstats
  echo "## redis cpu"; /tmp/redis/usr/bin/redis-cli -p 6390 info cpu
  echo "## worker batch sizes (count batch=N over all job lines)"
  grep -o "batch=[0-9]*" "$LOGS/worker.log" | sort | uniq -c | sort -rn | head -12
  echo "## embedded batch sizes"; grep -o "batch=[0-9]*" "$LOGS/embedded.log" | sort | uniq -c | sort -rn | head -12
  echo "## worker log (not job lines)"; grep -v "job done\|torch_complex" "$LOGS/worker.log" | tail -20
} >"$OUT/summary.txt" 2>&1
kill "${apis[@]}" $worker; wait "${apis[@]}" $worker 2>/dev/null
kill $redis
echo "| run | $(head -1 "$OUT/embedded.txt" >/dev/null; echo table below) |"
for r in embedded distributed-4api distributed-8api; do tail -1 "$OUT/$r.txt"; done
