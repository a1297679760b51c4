#!/usr/bin/env bash
# The throughput issue's CPU ceilings (no-op engine), measured on a quiet machine: each measured
# process pinned to two cores (taskset -c 0,1: "a 2-core machine"), the load generator on others.
# Before (the tree of .base/, carried, with this tree's bench/broker_worker.py copied in: the same
# no-op engine for both) and after (this tree), one call, same machine:
#   1. the worker process: bench/broker_worker.py --shared (Feeder, Scheduler, Worker, Redis; the
#      shared directory in /dev/shm, as on one host);
#   2. the embedded default: bench/noop_server.py --demo under bench/load_test.py, one process and
#      with sibling web processes (WEB_PROCS="1 2 3": --web-processes of each run);
#   3. the batch CLI's local mode: bench/cli_local.py (its own before/after in one process);
#   4. live captions: the demo model's server pinned, bench/live_load.py from other cores, streams
#      offered over --spread-s: admitted (held at the targets) and refused per row.
# SECTIONS="1 2 3 4" picks them.
# Runs where the GPU machine's wheels are (.whl) and redis as .deb (.deb); writes $OUT/*.txt.
set -uo pipefail
OUT=${OUT:-$(mktemp -d)}
mkdir -p "$OUT"  # (a caller may name a folder that is not there yet)
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >"$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 1; }
  touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site
for d in .deb/*.deb; do dpkg -x "$d" /tmp/redis; done
export LD_LIBRARY_PATH=/tmp/redis/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
ln -sf /tmp/redis/usr/bin/redis-check-rdb /tmp/redis/redis-server
export PATH=/tmp/redis:$PATH
PIN="taskset -c 0,1" GEN="taskset -c 4-11"
mkdir -p /tmp/nohiredis && echo 'raise ImportError("hiredis left out: the tree before it")' >/tmp/nohiredis/hiredis.py
pp() { [ "$1" = .base ] && echo /tmp/nohiredis:/tmp/site || echo /tmp/site; }  # "before" had no hiredis
export SENSEVOICE_DEVICE=cpu SENSEVOICE_MAX_CONNECTIONS_PER_CLIENT=0 SENSEVOICE_MAX_UPLOADS_PER_CLIENT=0 \
  SENSEVOICE_QUEUE_SIZE=4096
nproc
SECTIONS=${SECTIONS:-"1 2 3 4"}
if [[ " $SECTIONS " == *" 1 "* ]]; then
[ -d .base/bench ] && cp bench/broker_worker.py .base/bench/broker_worker.py
echo "## 1. worker process (bench/broker_worker.py --shared --jobs ${JOBS:-4000})" | tee "$OUT/summary.txt"
for tree in .base .; do
  for rep in 1 2; do
    (cd $tree && TMPDIR=/dev/shm PYTHONPATH=$(pp $tree) $PIN python3 bench/broker_worker.py --shared --jobs ${JOBS:-4000} 2>&1 | grep shared \
      | sed "s|^|$tree run $rep: |") | tee -a "$OUT/summary.txt"
  done
done
fi
if [[ " $SECTIONS " == *" 2 "* ]]; then
echo "## 2. one-process default, no-op engine (load_test, 10 s WAV)" | tee -a "$OUT/summary.txt"
port=7900
# this tree once per WEB_PROCS value (--web-processes: the owner and its sibling web processes, all
# pinned to the same two cores); .base (when carried) once
for run in ${BASE_RUN-.base:1} $(for n in ${WEB_PROCS:-1 2}; do echo .:$n; done); do
  tree=${run%%:*} procs=${run##*:}
  [ -d $tree ] || continue
  port=$((port + 1))
  web=$([ $tree = . ] && echo "--web-processes $procs")
  (cd $tree && PYTHONPATH=$(pp $tree) $PIN python3 bench/noop_server.py --demo --device cpu --api-only --port $port \
     --data-dir "$(mktemp -d)" $web >"$OUT/server-${port}.log" 2>&1) &
  for _ in $(seq 600); do python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
    http://127.0.0.1:$port/readyz 2>/dev/null && break; sleep 0.5; done
  OUT=$OUT/load-$port $GEN python3 bench/load_test.py --url http://127.0.0.1:$port --submitters ${SUBMITTERS:-32} \
    --client-processes 4 --seconds ${SECS:-20} --pollers 200 --clips 10 --finish-timeout 60 2>&1 | tail -1 \
    | sed "s|^|$tree ($web): |" | tee -a "$OUT/summary.txt"
  pkill -f "noop_server.py --demo --device cpu --api-only --port $port"; sleep 3
done
fi
if [[ " $SECTIONS " == *" 3 "* ]]; then
echo "## 3. batch CLI local mode (bench/cli_local.py --files 1000)" | tee -a "$OUT/summary.txt"
$PIN python3 bench/cli_local.py --files ${FILES:-1000} 2>&1 | grep -v "torch_complex" | tail -7 | tee -a "$OUT/summary.txt"
fi
if [[ " $SECTIONS " == *" 4 "* ]]; then
# the server of each tree in LIVE_TREES (".base ." = before and after), the client always this tree's
port=7950
for tree in ${LIVE_TREES:-.}; do
  port=$((port + 1))
  echo "## 4. live captions, demo model on 2 cores, server from $tree (bench/live_load.py --spread-s ${SPREAD:-10})" \
    | tee -a "$OUT/summary.txt"
  (cd $tree && SENSEVOICE_MAX_LIVE_STREAMS=1000 SENSEVOICE_MAX_LIVE_STREAMS_PER_CLIENT=0 PYTHONPATH=$(pp $tree) \
    $PIN python3 app_sensevoice.py --demo --device cpu --api-only --port $port --data-dir "$(mktemp -d)" \
    >"$OUT/live-server-$port.log" 2>&1) &
  for _ in $(seq 600); do python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
    http://127.0.0.1:$port/readyz 2>/dev/null && break; sleep 0.5; done
  LIVE_SPEECH_DIR=$PWD/.gpu-media/live $GEN python3 bench/live_load.py --url http://127.0.0.1:$port \
    --streams ${STREAMS:-24,48,96} --repeat ${REPEAT:-2} --spread-s ${SPREAD:-10} 2>&1 | grep "^|" \
    | tee -a "$OUT/summary.txt"
  curl -s http://127.0.0.1:$port/metrics 2>/dev/null | grep -E "^sensevoice_live_(streams_refused|partial_interval|decode_latency|lane_busy|stream_cost)" \
    >"$OUT/live-metrics-$port.txt"
  pkill -f "port $port"; sleep 2
done
fi
