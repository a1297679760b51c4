"""What speakers cost on a mono call: speech regions (silero) + CAM++ embeddings + clustering.

    .venv/bin/python bench/speaker_cost.py --minutes 10 --device cpu           # the CPU row
    .venv/bin/python bench/speaker_cost.py --minutes 60 --device cuda --runs 3 # the H200 row

The call is the tests' synthetic two-voice call (tests/speaker_calls.py: espeak-ng, en-us and
en-us+f3, eight turns, ~43 s) repeated to the length asked (or --wave FILE.npy, a float32 16 kHz
mono wave, on a machine without espeak-ng). The weights do not change the cost: the demo weights are
used unless --speaker-model DIR names real ones. Each run times the three steps apart (the GPU
synchronised between them) after one warm-up run; prints one JSON line per run and a summary.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipeline.audio.diarize import SpeakerCount, cluster, gather, turns, windows  # noqa: E402
from pipeline.audio.vad import Segmenter  # noqa: E402
from pipeline.domain.tags import SAMPLE_RATE_HZ  # noqa: E402
from pipeline.model.speaker import SpeakerEmbedder, load_campplus, weights_file  # noqa: E402


def call_wave(minutes: float, wave_file: str | None) -> np.ndarray:
    if wave_file:
        base = np.load(wave_file).astype(np.float32)
    else:
        from tests.speaker_calls import two_voice_call

        base, _ = two_voice_call(Path(tempfile.gettempdir()) / "sensevoice-speaker-calls")
    n = int(minutes * 60 * SAMPLE_RATE_HZ)
    return np.resize(base, n).astype(np.float32)


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def run_once(wave: np.ndarray, segmenter: Segmenter, embedder: SpeakerEmbedder, device: str,
             count: SpeakerCount) -> dict:
    t0 = time.perf_counter()
    spans = segmenter.split(torch.from_numpy(wave))
    t1 = time.perf_counter()
    window = round(1.5 * SAMPLE_RATE_HZ)
    wins = windows(spans, window)
    emb = embedder.embed(gather(wave, wins, window))
    sync(device)
    t2 = time.perf_counter()
    labels = cluster(emb, count)
    found = turns(wave, spans, wins, labels)
    t3 = time.perf_counter()
    return {"audio_s": round(len(wave) / SAMPLE_RATE_HZ, 1), "spans": len(spans), "windows": len(wins),
            "turns": len(found), "speakers": len({t.speaker for t in found}),
            "speech_s": round(t1 - t0, 3), "embed_s": round(t2 - t1, 3), "cluster_s": round(t3 - t2, 3),
            "total_s": round(t3 - t0, 3)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--batch", type=int, default=256, help="windows per embedding batch")
    ap.add_argument("--speakers", type=int, default=0, help="the count given (0: found)")
    ap.add_argument("--speaker-model", default="", help="a CAM++ directory (default: demo weights)")
    ap.add_argument("--wave", default="", help="a float32 16 kHz mono .npy instead of espeak-ng")
    args = ap.parse_args(argv)

    if args.speaker_model:
        weights = weights_file(Path(args.speaker_model))
    else:
        from pipeline.model.demo.build_speaker import ensure_speaker_dir

        weights = weights_file(ensure_speaker_dir(Path(tempfile.gettempdir()) / "sensevoice-speaker-demo"))
    embedder = SpeakerEmbedder(load_campplus(weights, args.device), args.device, batch_size=args.batch)
    segmenter = Segmenter(device=args.device).load()
    count = SpeakerCount(exact=args.speakers or None)
    wave = call_wave(args.minutes, args.wave or None)
    run_once(wave[: 60 * SAMPLE_RATE_HZ], segmenter, embedder, args.device, count)  # warm-up
    rows = []
    for _ in range(args.runs):
        row = run_once(wave, segmenter, embedder, args.device, count)
        print(json.dumps(row), flush=True)
        rows.append(row)
    best = min(rows, key=lambda r: r["total_s"])
    print(json.dumps({"summary": "best of runs", "device": args.device, "threads": torch.get_num_threads(),
                      **best}))
    segmenter.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
