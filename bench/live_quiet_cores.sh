#!/usr/bin/env bash
# Issue 38's CPU rows on quiet cores (the GPU host's CPU, through the device tool): the server pinned
# to cores 0-1 (the demo model on the CPU), bench/live_load.py on cores 2-7; trees interleaved, a
# fresh server per row. TREES: directories holding app_sensevoice.py, pipeline/ and bench/ (e.g. two
# worktrees copied into an ignored folder and carried); needs .whl there and the speech in
# LIVE_SPEECH_DIR (made once where espeak-ng is: python bench/live_load.py --streams 1).
#   TREES="$PWD/.gpu-media/t/before $PWD/.gpu-media/t/after" SPREADS="10 1" bash bench/live_quiet_cores.sh
set -u
OUT=${OUT:-$(mktemp -d)}
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.done; } || exit 1
export PYTHONPATH=/tmp/site
for spread in ${SPREADS:-10 1}; do for t in $TREES; do
  port=$((7900 + RANDOM % 90)); log=$OUT/server-$(basename "$t")-$spread.log
  (cd "$t" && SENSEVOICE_MAX_LIVE_STREAMS=65 SENSEVOICE_MAX_LIVE_STREAMS_PER_CLIENT=0 SENSEVOICE_LIVE_PAUSE_S=0.7 \
    exec taskset -c 0,1 python3 app_sensevoice.py --demo --device cpu --api-only --port $port \
    --data-dir "$(mktemp -d)" >"$log" 2>&1) &
  srv=$!
  for _ in $(seq 900); do python3 -c "import sys,urllib.request; urllib.request.urlopen(sys.argv[1], timeout=2)" \
    http://127.0.0.1:$port/readyz 2>/dev/null && break; sleep 0.2; done
  echo "== $t spread $spread $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  (cd "$t" && taskset -c 2-7 python3 bench/live_load.py --url http://127.0.0.1:$port --streams 64 --repeat 2 \
    --spread-s "$spread" | tail -1)
  grep -h "live lane:" "$log" | tail -1 | cut -c1-200
  kill $srv; wait $srv 2>/dev/null
done; done
