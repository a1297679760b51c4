#!/usr/bin/env bash
# Hotwords on the GPU machine (issue 41), one call (wheels carried in .whl: ../shared/GPU.md):
#   bash bench/gpu_hotwords.sh      # 512 x 10 s, 100 hotwords per clip (a different list each)
#                                   # vs none, through the engine as the worker launches batches
# The full-size model (random weights) is built once per machine under /tmp. BENCH_ARGS adds
# arguments to bench/hotwords_bench.py (e.g. "--batch 256 --rounds 2").
set -uo pipefail
source bench/gpu_setup.sh
gpu_full_model
python3 -u bench/hotwords_bench.py throughput --model-dir $model --device cuda --batch 512 --seconds 10 \
  --hotwords 100 --batches 6 --rounds 3 ${BENCH_ARGS:-} 2>&1 | grep -v "torch_complex" | tee "$OUT/hotwords.log" | tail -20
# the CUDA tests the head's new output touches (graphs and fp16 vs fp32 tokens) and the search
# on the GPU against the CPU's decisions
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/pytest*.whl .whl/pluggy*.whl \
  .whl/iniconfig*.whl >/dev/null 2>&1
python3 -m pytest -q -p no:cacheprovider -m requires_cuda tests/test_engine.py tests/test_hotwords.py 2>&1 \
  | grep -v torch_complex | tail -15
