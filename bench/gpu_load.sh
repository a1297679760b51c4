#!/usr/bin/env bash
# The load test on the GPU machine: the real server (full-size model, random weights, CUDA graphs,
# REST API only) under N submitters and 200 pollers at 2 Hz, twice, against one server start.
#   bash bench/gpu_load.sh            # wheels in .whl-gpu (funasr's + serving: see docs/RELIABILITY.md)
# Writes $OUT/run-<N>/load.json, $OUT/metrics-<N>.txt, $OUT/server.log; prints the tables last.
set -uo pipefail
source bench/gpu_server.sh
for n in ${SUBMITTERS:-16 64}; do
  OUT=$OUT/run-$n python3 bench/load_test.py --url "$url" --submitters "$n" \
    --seconds "${SECONDS_PER_RUN:-45}" --pollers 200 >"$OUT/run-$n.txt" 2>&1
  get "$url/metrics" >"$OUT/metrics-$n.txt"
done
kill $server; wait $server
for n in ${SUBMITTERS:-16 64}; do tail -3 "$OUT/run-$n.txt"; done
