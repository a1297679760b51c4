#!/usr/bin/env bash
# The engine issue's measurements on the GPU machine, one call each (wheels carried in .whl: see
# ../shared/GPU.md and docs/BENCHMARKS.md):
#   bash bench/gpu_engine.sh bench      # bench/gpu_bench.py: eager vs fused, through the worker,
#                                       # fidelity, one hour (GPU speech detection); $OUT/results.json
#   bash bench/gpu_engine.sh startup    # bench/gpu_startup.py (cold and warm compile cache) and the
#                                       # CUDA-only tests (tests -m requires_cuda; their espeak-ng
#                                       # media made here and carried in .gpu-media)
#   bash bench/gpu_engine.sh fp8        # bench/gpu_fp8.py: fp8 (e4m3) GEMMs vs 16-bit, 512 x 10 s clips/s,
#                                       # token agreement vs fp32, per-layer errors ($OUT/fp8.json), then
#                                       # the CUDA-only fp8 tests (tests/test_fp8.py; FP8_TESTS=0: not)
# The full-size model (random weights) is built once per machine under /tmp.
set -uo pipefail
source bench/gpu_setup.sh
gpu_full_model
case "${1:-bench}" in
  bench)
    python3 -u bench/gpu_bench.py --model-dir $model --budget-s "${BUDGET_S:-470}" --n "${N:-20}" \
      --cache-dir /tmp/sv-inductor ${BENCH_ARGS:-} 2>&1 | grep -v "torch_complex" >"$OUT/bench.log"
    tail -60 "$OUT/bench.log";;
  startup)
    python3 -u bench/gpu_startup.py --model-dir $model 2>&1 | grep -v "torch_complex" >"$OUT/startup.log"
    tail -25 "$OUT/startup.log"
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest*.whl .whl/pluggy*.whl \
      .whl/iniconfig*.whl >/dev/null 2>&1
    SENSEVOICE_TEST_MEDIA=$PWD/.gpu-media python3 -m pytest -q -p no:cacheprovider -m requires_cuda \
      tests/test_engine.py tests/test_vad.py tests/test_cli_cuda.py 2>&1 \
      | grep -v torch_complex | tail -15;;
  fp8)
    python3 -u bench/gpu_fp8.py --model-dir $model --cache-dir /tmp/sv-inductor --budget-s "${BUDGET_S:-240}" \
      ${BENCH_ARGS:-} 2>&1 \
      | grep -v "torch_complex" >"$OUT/fp8.log"
    tail -40 "$OUT/fp8.log"
    [ "${FP8_TESTS:-1}" = 0 ] && exit 0
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest*.whl .whl/pluggy*.whl \
      .whl/iniconfig*.whl >/dev/null 2>&1
    SENSEVOICE_TEST_MEDIA=$PWD/.gpu-media timeout 180 python3 -m pytest -q -p no:cacheprovider -m requires_cuda \
      tests/test_fp8.py 2>&1 | grep -v torch_complex | tail -15;;
esac
