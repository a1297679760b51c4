#!/usr/bin/env bash
# Speakers on the GPU machine (issue 39), one call (wheels carried in .whl: ../shared/GPU.md; the
# synthetic call as a .npy carried in .spkbench, made here: espeak-ng is not there):
#   .venv/bin/python -c "import numpy as np; from pathlib import Path; from tests.speaker_calls import two_voice_call; \
#     np.save('.spkbench/call.npy', two_voice_call(Path('/tmp/spk-calls'))[0])"
#   bash bench/gpu_speakers.sh   # one hour of mono call audio: speech regions + embeddings + clustering
set -uo pipefail
source bench/gpu_setup.sh
python3 -u bench/speaker_cost.py --minutes 60 --device cuda --runs 3 --wave .spkbench/call.npy 2>&1 \
  | grep -v torch_complex | tee "$OUT/speakers_gpu.log"
python3 -u bench/speaker_cost.py --minutes 60 --device cuda --runs 2 --speakers 2 --wave .spkbench/call.npy 2>&1 \
  | grep -v torch_complex | tail -1 | tee -a "$OUT/speakers_gpu.log"
python3 -u bench/speaker_cost.py --minutes 10 --device cpu --runs 1 --wave .spkbench/call.npy 2>&1 \
  | grep -v torch_complex | tail -1 | tee -a "$OUT/speakers_gpu.log"
