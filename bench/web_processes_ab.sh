#!/usr/bin/env bash
# bench/cpu_ceilings.sh's section 2 (the embedded server with sibling web processes, no-op engine,
# bench/load_test.py) for two trees in one call, interleaved: BEFORE (a tree carried in an ignored
# folder, default .cache/before) and AFTER (default this tree), each with --web-processes $PROCS (default 3), REPS
# times in turn (before, after, before, after, ...). Every server pinned to two cores (taskset -c
# 0,1), the load generator on others, as cpu_ceilings.sh does. Writes $OUT/summary.txt.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >"$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 1; }
  touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site
PIN="taskset -c 0,1" GEN="taskset -c 4-11"
export SENSEVOICE_DEVICE=cpu SENSEVOICE_MAX_CONNECTIONS_PER_CLIENT=0 SENSEVOICE_MAX_UPLOADS_PER_CLIENT=0 \
  SENSEVOICE_QUEUE_SIZE=4096
BEFORE=${BEFORE:-.cache/before} AFTER=${AFTER:-.} PROCS=${PROCS:-3} REPS=${REPS:-2}
TREES=${TREES:-"$BEFORE $AFTER"}  # (more than two: each in turn)
echo "## web processes ($PROCS), no-op engine (load_test, ${SECS:-20} s, 10 s WAV), trees: $TREES" | tee "$OUT/summary.txt"
port=7900
for rep in $(seq "$REPS"); do
  for tree in $TREES; do
    port=$((port + 1))
    (cd "$tree" && $PIN python3 bench/noop_server.py --demo --device cpu --api-only --port $port \
       --data-dir "$(mktemp -d)" --web-processes "$PROCS" >"$OUT/server-${port}.log" 2>&1) &
    for _ in $(seq 600); do python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
      http://127.0.0.1:$port/readyz 2>/dev/null && break; sleep 0.5; done
    sleep 3  # (the siblings' imports: the owner answers /readyz before they accept)
    OUT=$OUT/load-$port $GEN python3 bench/load_test.py --url http://127.0.0.1:$port --submitters ${SUBMITTERS:-32} \
      --client-processes 4 --seconds ${SECS:-20} --pollers 200 --clips 10 --finish-timeout 60 2>&1 | tail -1 \
      | sed "s|^|$tree run $rep: |" | tee -a "$OUT/summary.txt"
    curl -s http://127.0.0.1:$port/metrics >"$OUT/metrics-$port.txt" 2>/dev/null
    pkill -f "noop_server.py --demo --device cpu --api-only --port $port"; sleep 4
  done
done
