#!/usr/bin/env python3
"""Decode of a long compressed recording (issue 13: must not become the next wall once VAD and the
engine are fast). One hour of speech-like audio per format, through the service's own path
(``Decoder``: a child process decodes, the samples come back, then the 16 kHz resample) against
the codec's own decode time (a bare PyAV loop over the same bytes, no conversion).

    python bench/long_decode.py [--minutes 60] [--formats mp3,opus,m4a,flac]
Prints a table last; needs ffmpeg and espeak-ng to make the recordings.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.decode_bench import codec_only  # noqa: E402
from pipeline.audio.decode import Resampler  # noqa: E402
from pipeline.audio.decoder_pool import Decoder  # noqa: E402
from pipeline.domain.tags import SAMPLE_RATE_HZ  # noqa: E402

CODECS = {"mp3": ["-c:a", "libmp3lame", "-b:a", "64k", "-ar", "44100"],
          "opus": ["-c:a", "libopus", "-b:a", "32k", "-ar", "48000"],
          "m4a": ["-c:a", "aac", "-b:a", "96k", "-ar", "44100"],
          "flac": ["-c:a", "flac", "-ar", "16000"]}


def make_recording(tmp: Path, fmt: str, minutes: float) -> bytes:
    speech = tmp / "speech.wav"
    if not speech.exists():
        subprocess.run(["espeak-ng", "-w", str(speech), "A caller asks about an invoice, the "
                        "agent answers slowly, and both pause between sentences."], check=True)
    dst = tmp / f"long.{fmt}"
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-stream_loop", "-1", "-i", str(speech),
                    "-t", str(minutes * 60), "-ac", "1", *CODECS[fmt], str(dst)], check=True)
    return dst.read_bytes()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=60.0)
    ap.add_argument("--formats", default="mp3,opus,m4a,flac")
    args = ap.parse_args()
    decoder = Decoder(1, timeout_s=600, max_seconds=4 * 3600, max_bytes=2 << 30)
    resampler = Resampler("cpu")
    rows = []
    with tempfile.TemporaryDirectory() as td:
        for fmt in args.formats.split(","):
            data = make_recording(Path(td), fmt, args.minutes)
            t = time.perf_counter()
            codec_only(data)
            codec_s = time.perf_counter() - t
            t = time.perf_counter()
            audio = decoder(data, max_seconds=4 * 3600)
            decode_s = time.perf_counter() - t
            t = time.perf_counter()
            wave = resampler(audio)
            resample_s = time.perf_counter() - t
            rows.append((fmt, len(data) / 2**20, wave.shape[-1] / SAMPLE_RATE_HZ / 60, codec_s, decode_s,
                         resample_s))
            print(f"{fmt}: done", flush=True)
    decoder.close()
    print("\n| format | MB | minutes | codec alone (s) | service decode (s) | resample (s) | "
          "decode + resample, x real time |")
    print("|---|---|---|---|---|---|---|")
    for fmt, mb, minutes, codec_s, decode_s, resample_s in rows:
        print(f"| {fmt} | {mb:.1f} | {minutes:.1f} | {codec_s:.2f} | {decode_s:.2f} | "
              f"{resample_s:.2f} | {minutes * 60 / (decode_s + resample_s):.0f}x |")


if __name__ == "__main__":
    main()
