# Sourced by bench/gpu_*.sh on the GPU machine: the carried wheels installed once per machine into
# /tmp/site (../shared/GPU.md), and (gpu_full_model) the full-size model with random weights built
# once under /tmp/sensevoice-full. Sets OUT, PYTHONPATH and model.
OUT=${OUT:-$(mktemp -d)}
export PYTHONUNBUFFERED=1
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl >"$OUT/pip.log" 2>&1 || { tail -5 "$OUT/pip.log"; exit 1; }
  touch /tmp/site/.done
fi
export PYTHONPATH=/tmp/site
model=/tmp/sensevoice-full
gpu_full_model() {
  [ -f $model/model.pt ] || python3 -m pipeline.model.demo.build_model --variant full --out $model >"$OUT/build.log" 2>&1 \
    || { tail -20 "$OUT/build.log"; exit 1; }
}
