#!/usr/bin/env bash
# The embedded default's CPU proxy, before and after interleaved (a lent host's speed drifts): before
# (.base, one process) and this tree (--web-processes 3, the CUDA host's auto; 1, a CPU host's), the
# server pinned to cores 0-1, the load on 4-11; jobs done in 20 s and the server's CPU per job (all
# its processes, /proc).   device tool, carry .whl .base:  bash bench/cpu_interleaved.sh
# (RUNS="tree:procs ..." picks the runs; a tree other than .base, e.g. an earlier commit's archive
# in .prev, runs with its --web-processes)
set -uo pipefail
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl >$OUT/pip.log 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 SENSEVOICE_DEVICE=cpu SENSEVOICE_MAX_CONNECTIONS_PER_CLIENT=0 \
  SENSEVOICE_MAX_UPLOADS_PER_CLIENT=0 SENSEVOICE_QUEUE_SIZE=4096
mkdir -p /tmp/nohiredis && echo 'raise ImportError("hiredis left out")' >/tmp/nohiredis/hiredis.py
cpu() { local t=0; for p in "$@"; do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $t; }
port=7930
for run in ${RUNS:-.:3 .base:1 .:3 .base:1 .:1}; do
  tree=${run%%:*} procs=${run##*:}; port=$((port + 1))
  web=$([ $tree != .base ] && echo "--web-processes $procs")  # (.base had no such option)
  pp=$([ $tree = .base ] && echo /tmp/nohiredis:/tmp/site || echo /tmp/site)
  data=$(mktemp -d)  # ~2 GB of spooled uploads a run: removed after it (a local run filled a disk)
  (cd $tree && PYTHONPATH=$pp exec taskset -c 0,1 python3 bench/noop_server.py --demo --device cpu --api-only --port $port \
     --data-dir "$data" $web >"$OUT/server-$port.log" 2>&1) &
  srv=$!
  for _ in $(seq 600); do python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
    http://127.0.0.1:$port/readyz 2>/dev/null && break; sleep 0.5; done
  sleep 2
  pids="$srv $(pgrep -f "port $port .*sibling-dir" | tr '\n' ' ')"
  c0=$(cpu $pids)
  line=$(OUT=/tmp/load-$port taskset -c 4-11 python3 bench/load_test.py --url http://127.0.0.1:$port --submitters 32 \
    --client-processes 4 --seconds 20 --pollers 200 --clips 10 --finish-timeout 60 2>&1 | tail -1)
  n=$(python3 -c "import json; print(json.load(open('/tmp/load-$port/load.json'))['completed'])")
  echo "$tree ($web) server cpu us/job $(( ($(cpu $pids) - c0) * 10000 / (n > 0 ? n : 1) )): $line" | tee -a $OUT/summary.txt
  kill $srv; wait $srv 2>/dev/null; pkill -f "port $port"; sleep 2; rm -rf "$data" /tmp/load-$port
done
