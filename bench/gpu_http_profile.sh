#!/usr/bin/env bash
# Where an HTTP job's time goes on the GPU machine: the real server (REST only) under load, sampled
# with py-spy (all threads, and GIL holders only); a second run with two client processes tells
# whether the load generator itself is the limit. Wheels as for bench/gpu_load.sh, plus py-spy.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl-gpu/*.whl && export PYTHONPATH=/tmp/site || exit 1
model=/tmp/sensevoice-full
[ -f $model/model.pt ] || python3 -m pipeline.testing.build_model --variant full --out $model >"$OUT/build.log" 2>&1
port=7871
python3 app_sensevoice.py --model $model --device cuda --api-only --port $port --data-dir /tmp/prof-data \
  >"$OUT/server.log" 2>&1 &
server=$!
get() { python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$1"; }
for _ in $(seq 600); do get "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && break; sleep 0.5; done
url="http://127.0.0.1:$port"
OUT=$OUT/one python3 bench/load_test.py --url $url --submitters 32 --seconds 25 --pollers 200 >"$OUT/one.txt" 2>&1 &
one=$!
sleep 6
/tmp/site/bin/py-spy record --pid $server --duration 12 --rate 200 --format raw --threads --nonblocking -o "$OUT/all.txt" >"$OUT/pyspy1.log" 2>&1
/tmp/site/bin/py-spy record --pid $server --duration 6 --rate 200 --format raw --threads --gil --nonblocking -o "$OUT/gil.txt" >"$OUT/pyspy2.log" 2>&1
wait $one
get "$url/metrics" >"$OUT/metrics-one.txt"
OUT=$OUT/twoA python3 bench/load_test.py --url $url --submitters 16 --seconds 25 --pollers 100 >"$OUT/twoA.txt" 2>&1 &
a=$!
OUT=$OUT/twoB python3 bench/load_test.py --url $url --submitters 16 --seconds 25 --pollers 100 >"$OUT/twoB.txt" 2>&1 &
b=$!
wait $a $b
get "$url/metrics" >"$OUT/metrics-two.txt"
kill $server; wait $server
for f in one twoA twoB; do tail -n 1 "$OUT/$f.txt"; done; rm -rf "$OUT"/one "$OUT"/twoA "$OUT"/twoB
