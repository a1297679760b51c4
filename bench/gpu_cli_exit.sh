#!/usr/bin/env bash
# Issue 42 on the H200: the batch CLI's exit status and time on 1,000 x 10 s WAV, three runs, one with the
# background compile on, and funasr's own AutoModel.generate(list, batch_size=64) in the same call.
# Device tool, carry .whl:  bash bench/gpu_cli_exit.sh   (OUT set by the device tool)
export PYTHONPATH=/tmp/site
if [ ! -f /tmp/site/.done ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $OUT/pip.log 2>&1 && touch /tmp/site/.done
fi
[ -f /tmp/sensevoice-full/model.pt ] || python3 -m pipeline.model.demo.build_model --variant full --out /tmp/sensevoice-full > $OUT/build.log 2>&1
[ -d /tmp/clips1k ] || python3 -c "
import numpy as np, wave, os
os.makedirs('/tmp/clips1k', exist_ok=True)
x=(np.random.default_rng(0).standard_normal(160000)*3000).astype('<i2').tobytes()
for i in range(1000):
    w=wave.open(f'/tmp/clips1k/c{i:04d}.wav','wb'); w.setnchannels(1); w.setsampwidth(2); w.setframerate(16000); w.writeframes(x); w.close()
"
cli() {  # label, env...
  local label=$1; shift
  rm -rf /tmp/o; local s=$(date +%s.%N)
  env "$@" timeout 250 python3 -m pipeline transcribe /tmp/clips1k --output-dir /tmp/o --format txt,srt --device cuda --model /tmp/sensevoice-full --quiet > $OUT/cli-$label.log 2>&1
  local rc=$? e=$(date +%s.%N)
  echo "$label rc=$rc files=$(ls /tmp/o | wc -l) wall=$(python3 -c "print(round($e-$s,1))") | $(grep 'wall time' $OUT/cli-$label.log)"
}
for k in 1 2 3; do cli default$k X=1; done
cli background SENSEVOICE_BACKGROUND_COMPILE=true
cat > /tmp/fa.py <<'EOF'
import time, glob
t0=time.time()
from funasr import AutoModel
m=AutoModel(model="/tmp/sensevoice-full", device="cuda:0", disable_update=True)
t1=time.time()
files=sorted(glob.glob('/tmp/clips1k/*.wav'))
m.generate(input=files, batch_size=64, language="auto", use_itn=True)
t2=time.time()
print(f"funasr generate(list of {len(files)}, batch_size=64): load+import {t1-t0:.1f} s + generate {t2-t1:.1f} s = {t2-t0:.1f} s")
EOF
s=$(date +%s.%N); timeout 200 python3 /tmp/fa.py > $OUT/funasr.log 2>&1; e=$(date +%s.%N)
grep "funasr generate" $OUT/funasr.log; echo "funasr process wall $(python3 -c "print(round($e-$s,1))")"
