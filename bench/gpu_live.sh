#!/usr/bin/env bash
# Live captions at scale on the GPU machine, one call (issue 22's H200 figures):
#   1. the embedded server (--device cuda, full-size model): $STREAMS streams offered over $SPREAD s;
#   2. the distributed topology: Redis (.deb) + one worker process (cuda:0) + one api process
#      serving the same streams (their speech detection there, the re-decodes through Redis).
# Per row: admitted / refused at once (live_at_capacity, close 1013) / unmatched among the admitted,
# speech start -> first partial and pause -> final p50 / p95 (targets: 400 ms / 300 ms p95), and the
# GPU's SM busy share while the row ran (nvidia-smi dmon's "sm" %, one sample a second: mean / max),
# so a row shows how much of the GPU the admitted streams use (issue 38).
# Needs .whl (wheels), .deb (redis) and .gpu-media/live (the speech, made here once: the GPU
# machine has no espeak-ng: LIVE_SPEECH_DIR=.gpu-media/live python bench/live_load.py --streams 1).
# Writes $OUT/live-*.json and the server logs' tails; prints the tables last.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
STREAMS=${STREAMS:-500,1000,2000} SPREAD=${SPREAD:-10} CLIENTS=${CLIENTS:-10}
LOGS=/tmp/live-logs; mkdir -p $LOGS
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl/*.whl && export PYTHONPATH=/tmp/site || exit 1
model=/tmp/sensevoice-full
[ -f $model/model.pt ] || python3 -m pipeline.model.demo.build_model --variant full --out $model >"$OUT/build.log" 2>&1 \
  || { tail -20 "$OUT/build.log"; exit 1; }
# every simulated microphone shares one client address: lift the per-client limits, not the lane's
export SENSEVOICE_MAX_LIVE_STREAMS=10000 SENSEVOICE_MAX_LIVE_STREAMS_PER_CLIENT=0 \
  SENSEVOICE_MAX_CONNECTIONS_PER_CLIENT=0 LIVE_SPEECH_DIR=$PWD/.gpu-media/live
ready() { for _ in $(seq 900); do python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1]+'/readyz', timeout=2)" "$1" 2>/dev/null && return 0; sleep 0.3; done; return 1; }
warm() {  # /readyz answers before the background compile and the graph captures end: wait for them
  for _ in $(seq 400); do grep -q "CUDA graphs: [0-9]* captured\|serving the eager path" "$1" && return 0; sleep 0.3; done
  echo "not warm after 120 s: $1" | tee -a "$OUT/progress.txt"; }
run() {  # name url: a row per stream count, each with the SM busy share sampled while it ran
  mkdir -p "$OUT/$1"
  echo "## $1 (last column: SM busy % mean / max)" >>"$OUT/summary.txt"
  for n in ${STREAMS//,/ }; do
    nvidia-smi dmon -s u -d 1 >"$LOGS/$1-$n-sm.txt" 2>&1 &
    dmon=$!
    OUT=$OUT/$1 timeout 400 python3 bench/live_load.py --url "$2" --streams "$n" --repeat 1 \
      --spread-s "$SPREAD" --client-processes "$CLIENTS" >"$LOGS/$1-$n.txt" 2>&1
    kill $dmon 2>/dev/null; wait $dmon 2>/dev/null
    cp "$OUT/$1/live_load.json" "$OUT/$1/live_load-$n.json" 2>/dev/null
    sm=$(awk '$1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { s += $2; n++; if ($2 > m) m = $2 } END { if (n) printf "%.0f / %d", s / n, m; else print "-" }' "$LOGS/$1-$n-sm.txt")
    grep '^| [0-9]' "$LOGS/$1-$n.txt" | sed "s#\$# $sm |#" | tee -a "$OUT/summary.txt"
  done
  grep -h "live lane: .* batches" "$LOGS/$1.log" "$LOGS/worker.log" 2>/dev/null | tail -3 >>"$OUT/summary.txt"
}
# 1. embedded
python3 app_sensevoice.py --model $model --device cuda --api-only --port 7870 --data-dir "$(mktemp -d)" \
  >"$LOGS/embedded.log" 2>&1 &
emb=$!
ready http://127.0.0.1:7870 || { tail -30 "$LOGS/embedded.log"; exit 1; }
warm "$LOGS/embedded.log"
run embedded http://127.0.0.1:7870
python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:7870/metrics').read().decode())" \
  | grep -E '^sensevoice_live_(streams_refused|partial_interval|decode_latency)' >"$OUT/embedded-metrics.txt"
kill $emb; wait $emb
# 2. distributed
for d in .deb/*.deb; do dpkg -x "$d" /tmp/redis; done
export LD_LIBRARY_PATH=/tmp/redis/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ln -sf /tmp/redis/usr/bin/redis-check-rdb /tmp/redis/redis-server
/tmp/redis/redis-server --port 6390 --dir "$(mktemp -d)" --save '' --appendonly no \
  --maxmemory-policy noeviction >"$LOGS/redis.log" 2>&1 &
redis=$!
export SENSEVOICE_BROKER=redis://127.0.0.1:6390/0
SENSEVOICE_ROLE=worker python3 app_sensevoice.py --model $model --device cuda:0 --api-only --port 7880 \
  --data-dir "$(mktemp -d)" >"$LOGS/worker.log" 2>&1 &
worker=$!
SENSEVOICE_ROLE=api python3 app_sensevoice.py --model $model --device cpu --api-only --port 7881 \
  --data-dir "$(mktemp -d)" >"$LOGS/api.log" 2>&1 &
api=$!
ready http://127.0.0.1:7880 || { tail -30 "$LOGS/worker.log"; exit 1; }
ready http://127.0.0.1:7881 || { tail -30 "$LOGS/api.log"; exit 1; }
warm "$LOGS/worker.log"
run distributed http://127.0.0.1:7881
kill $api $worker; wait $api $worker; kill $redis
for f in embedded worker api; do tail -5 "$LOGS/$f.log" >"$OUT/$f-log-tail.txt"; done
cat "$OUT/summary.txt"
