#!/usr/bin/env bash
# H200: the embedded server (full-size model, CUDA graphs) per WEBS entry "N:ACCEPTS" (--web-processes N,
# SENSEVOICE_WEB_OWNER_ACCEPTS=ACCEPTS; "0:auto" = both left to the server): idle latency (bench/idle_latency.py), then 64 submitters + 200
# pollers for 15 s (bench/load_test.py), the server's CPU; optionally (PROXY_WEBS) the 2-core CPU proxy.
#   device tool, carry .whl .deb .gpu-media:  WEBS="2:true 3:false 2:false" bash bench/gpu_embedded.sh
#   an earlier tree in the same call (git archive into an ignored folder, carried):
#   (cd .prev && WEBS="0:auto" OUT=$OUT/prev bash ../bench/gpu_embedded.sh)
set -uo pipefail
mkdir -p "$OUT"
T0=$(date +%s); say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a $OUT/progress.txt; }
# (a second run in the same call, e.g. of an earlier tree from its folder, reuses the wheels and the model)
[ -f /tmp/site/.done ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl >$OUT/pip.log 2>&1 && touch /tmp/site/.done || exit 1; }
export PYTHONPATH=/tmp/site
model=/tmp/sensevoice-full
[ -f $model/.built ] || { python3 -m pipeline.model.demo.build_model --variant full --out $model >"$OUT/build.log" 2>&1 \
  && touch $model/.built || { tail -20 $OUT/build.log; exit 1; }; }
say "model ready"
export SENSEVOICE_GRAPH_MAX_SECONDS=16 SENSEVOICE_QUEUE_SIZE=4096 SENSEVOICE_MAX_CONNECTIONS_PER_CLIENT=0 \
  SENSEVOICE_MAX_UPLOADS_PER_CLIENT=0 PYTHONUNBUFFERED=1
cpu() { local t=0; for p in "$@"; do [ -r /proc/$p/stat ] && t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $t; }
port=7870
for CFG in ${WEBS:-2:true 3:false}; do
  W=${CFG%%:*}; ACC=${CFG##*:}
  port=$((port + 1))
  accepts=$([ "$ACC" = auto ] || echo "SENSEVOICE_WEB_OWNER_ACCEPTS=$ACC")  # "0:auto": the defaults
  env $accepts python3 app_sensevoice.py --model $model --device cuda --api-only --port $port --data-dir "$(mktemp -d)" \
    --web-processes $W >$OUT/emb-$W.log 2>&1 &
  emb=$!
  for _ in $(seq 600); do grep -q "CUDA graphs: [0-9]* captured\|serving the eager path" $OUT/emb-$W.log && break; sleep 0.3; done
  for _ in $(seq 100); do python3 -c "import urllib.request,sys; urllib.request.urlopen(sys.argv[1], timeout=2)" http://127.0.0.1:$port/readyz 2>/dev/null && break; sleep 0.3; done
  sleep 2; say "W=$W owner-accepts=$ACC warm"
  timeout 60 python3 bench/idle_latency.py --url http://127.0.0.1:$port --runs 100 --name "embedded-w$W-$ACC" 2>&1 | tail -2 | tee -a $OUT/progress.txt
  pids="$emb $(pgrep -f "port $port .*sibling-dir" | tr '\n' ' ')"
  c0=$(cpu $pids)
  (sleep 8; top -H -b -n 1 -w 200 | head -40 > $OUT/top-$W.txt) &
  OUT=/tmp/load-$W timeout 120 python3 bench/load_test.py --url http://127.0.0.1:$port --submitters 64 --client-processes 4 \
    --seconds 15 --pollers 200 --clips 10 --finish-timeout 60 2>&1 | tail -1 | sed "s/^/W=$W owner-accepts=$ACC /" | tee -a $OUT/progress.txt
  say "W=$W server cpu $(python3 -c "print(($(cpu $pids) - $c0) / $(getconf CLK_TCK))") s (pids $pids)"
  for p in $pids; do echo "W=$W pid $p cpu $(awk '{print $14, $15}' /proc/$p/stat) threads $(ls /proc/$p/task | wc -l)"; done | tee -a $OUT/progress.txt
  kill $emb; wait $emb
  grep -c "Traceback" $OUT/emb-$W.log | sed "s/^/W=$W tracebacks: /" | tee -a $OUT/progress.txt
  grep -v "torch_complex\|^INFO" $OUT/emb-$W.log | tail -15 > $OUT/emb-$W-tail.txt; gzip -f $OUT/emb-$W.log
done
say "gpu done"
[ -n "${PROXY_WEBS:-}" ] && SECTIONS="2" WEB_PROCS="${PROXY_WEBS:-1 2 3}" BASE_RUN="" SECS=20 OUT=$OUT/proxy timeout 250 bash bench/cpu_ceilings.sh 2>&1 | grep "web-processes" | tee -a $OUT/progress.txt
say "all done"
