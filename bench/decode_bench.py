#!/usr/bin/env python3
"""Decode step on the CPU: our in-process PyAV decode vs the blog recipe (ffmpeg subprocess writing a
temp 16 kHz WAV, then reading it) vs the codec's own decode time (a bare PyAV decode loop).

    python bench/decode_bench.py [--n 30]      # needs ffmpeg and espeak-ng to make the clips
Prints a table last; writes $OUT/decode.json (or a temp dir).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import wave
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import av  # noqa: E402
import numpy as np  # noqa: E402

from pipeline.audio.decode import _audio_stream, _open_container, decode_audio  # noqa: E402

FORMATS = {"mp3": ["-c:a", "libmp3lame", "-b:a", "128k"], "opus": ["-c:a", "libopus", "-b:a", "32k"],
           "m4a": ["-c:a", "aac", "-b:a", "128k"]}


def make_clip(dst: Path, fmt: str, tmp: Path) -> bytes:
    speech = tmp / "speech.wav"
    if not speech.exists():
        subprocess.run(["espeak-ng", "-w", str(speech), "This is a ten second test of the decode "
                        "step in the speech recognition service, spoken slowly and clearly by a "
                        "robot voice for the benchmark."], check=True)
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-stream_loop", "3", "-i", str(speech),
                    "-t", "10", "-ar", "48000" if fmt == "opus" else "44100", "-ac", "2", *FORMATS[fmt], str(dst)], check=True)
    return dst.read_bytes()


def blog_decode(data: bytes, suffix: str) -> np.ndarray:
    """The blog recipe: write the upload to a temp file, ffmpeg to a temp 16 kHz WAV, read it back."""
    with tempfile.TemporaryDirectory() as td:
        src, dst = Path(td) / f"in{suffix}", Path(td) / "out.wav"
        src.write_bytes(data)
        subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", str(src), "-ac", "1", "-ar", "16000",
                        str(dst)], check=True)
        with wave.open(str(dst)) as w:
            return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32) / 32768


def codec_only(data: bytes) -> None:
    """The codec's own decode time: the same bytes opened the same way as ours (same allow-list and
    I/O options, same stream), then demux + decode every frame, no conversion at all."""
    container = _open_container(io.BytesIO(data))
    try:
        for _frame in container.decode(_audio_stream(container)):
            pass
    finally:
        container.close()


def time_interleaved(fns: dict, n: int) -> dict[str, float]:
    """Median wall time (ms) of each function over ``n`` rounds that run them in turn (after one
    warm-up each), so the machine's noise falls on all of them alike."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) * 1e3 for name, ts in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=30)
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="decode-"))
    out.mkdir(parents=True, exist_ok=True)
    res = {"cpu_count": os.cpu_count(), "pyav": av.__version__, "clips": "10 s stereo, 44.1 kHz (opus: 48 kHz)"}
    with tempfile.TemporaryDirectory() as td:
        tmp = Path(td)
        for fmt in FORMATS:
            data = make_clip(tmp / f"clip.{fmt}", fmt, tmp)
            ms = time_interleaved({"ours": lambda: decode_audio(data),
                                   "blog": lambda: blog_decode(data, f".{fmt}"),
                                   "codec": lambda: codec_only(data)}, args.n)
            ours, blog, codec = ms["ours"], ms["blog"], ms["codec"]
            res[fmt] = {"ours_ms": round(ours, 2), "blog_subprocess_ms": round(blog, 2),
                        "codec_only_ms": round(codec, 2), "speedup_vs_blog": round(blog / ours, 2),
                        "overhead_vs_codec_pct": round(100 * (ours / codec - 1), 1)}
    (out / "decode.json").write_text(json.dumps(res, indent=1))
    print("\n| format | in-process (ours) ms | blog: ffmpeg subprocess + temp WAV ms | codec alone ms | "
          "ours vs blog | ours vs codec |\n|---|---|---|---|---|---|")
    for fmt in FORMATS:
        r = res[fmt]
        print(f"| {fmt} | {r['ours_ms']} | {r['blog_subprocess_ms']} | {r['codec_only_ms']} | "
              f"{r['speedup_vs_blog']}x faster | {r['overhead_vs_codec_pct']:+.1f}% |")


if __name__ == "__main__":
    main()
