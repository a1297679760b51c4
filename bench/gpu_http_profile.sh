#!/usr/bin/env bash
# Where an HTTP job's time goes on the GPU machine: the real server (REST only) under load, sampled
# with py-spy (all threads, and GIL holders only); a second run with two client processes tells
# whether the load generator itself is the limit. Wheels as for bench/gpu_load.sh, plus py-spy.
set -uo pipefail
source bench/gpu_server.sh
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
