#!/usr/bin/env bash
# The load test on the GPU machine: the real server (full-size model, random weights, CUDA graphs,
# REST API only) under N submitters and 200 pollers at 2 Hz, twice, against one server start.
#   bash bench/gpu_load.sh            # wheels in .whl-gpu (funasr's + serving: see docs/RELIABILITY.md)
# Writes $OUT/run-<N>/load.json, $OUT/metrics-<N>.txt, $OUT/server.log; prints the tables last.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl-gpu/*.whl && export PYTHONPATH=/tmp/site || exit 1
model=/tmp/sensevoice-full
[ -f $model/model.pt ] || python3 -m pipeline.testing.build_model --variant full --out $model >"$OUT/build.log" 2>&1 \
  || { tail -20 "$OUT/build.log"; exit 1; }
port=7871
python3 app_sensevoice.py --model $model --device cuda --api-only --port $port --data-dir /tmp/load-data \
  >"$OUT/server.log" 2>&1 &
server=$!
get() { python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$1"; }
for _ in $(seq 600); do
  get "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { tail -30 "$OUT/server.log"; exit 1; }
  sleep 0.5
done
get "http://127.0.0.1:$port/readyz"
for n in ${SUBMITTERS:-16 64}; do
  OUT=$OUT/run-$n python3 bench/load_test.py --url "http://127.0.0.1:$port" --submitters "$n" \
    --seconds "${SECONDS_PER_RUN:-45}" --pollers 200 >"$OUT/run-$n.txt" 2>&1
  get "http://127.0.0.1:$port/metrics" >"$OUT/metrics-$n.txt"
done
kill $server; wait $server
for n in ${SUBMITTERS:-16 64}; do tail -3 "$OUT/run-$n.txt"; done
