# Sourced by the GPU scripts (bench/gpu_load.sh, bench/gpu_http_profile.sh): install the carried
# wheels (.whl-gpu: funasr's and the serving stack's, see docs/RELIABILITY.md), build the full-size
# model once, start the real server (REST API only) and wait until it is ready.
# Sets: OUT, url, server (its pid), get URL (prints the body).
OUT=${OUT:-$(mktemp -d)}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
  .whl-gpu/*.whl && export PYTHONPATH=/tmp/site || exit 1
model=/tmp/sensevoice-full
[ -f $model/model.pt ] || python3 -m pipeline.model.demo.build_model --variant full --out $model >"$OUT/build.log" 2>&1 \
  || { tail -20 "$OUT/build.log"; exit 1; }
port=7871
url="http://127.0.0.1:$port"
python3 app_sensevoice.py --model $model --device cuda --api-only --port $port --data-dir "$(mktemp -d)" \
  >"$OUT/server.log" 2>&1 &
server=$!
get() { python3 -c "import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())" "$1"; }
for _ in $(seq 600); do
  get "$url/readyz" >/dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { tail -30 "$OUT/server.log"; exit 1; }
  sleep 0.5
done
get "$url/readyz"
