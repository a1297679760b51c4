#!/usr/bin/env python3
"""The live speech detector's cost per stream frame (issue 38): N streams' 100 ms frames of the
live test's speech scored in rounds by one :class:`~pipeline.audio.stream_vad.StreamScorer`, the
process's CPU seconds per frame (silero and the Python around it), for the scorer in this tree
and, with ``--against FILE``, another version of stream_vad.py (e.g. ``git show
HEAD~1:pipeline/audio/stream_vad.py > /tmp/old.py``), interleaved.

    python bench/live_vad_rounds.py --streams 64 --rounds 60 --against /tmp/old.py
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live_load import FRAME_S, speech  # noqa: E402
from pipeline.domain.tags import SAMPLE_RATE_HZ  # noqa: E402


def load(path: str | None):
    if path is None:
        from pipeline.audio import stream_vad
        return stream_vad
    spec = importlib.util.spec_from_file_location("stream_vad_other", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run(module, pcm: bytes, streams: int, rounds: int) -> float:
    """CPU seconds per stream frame."""
    scorer = module.StreamScorer(gather_s=0.0)
    audios = [module.StreamAudio(SAMPLE_RATE_HZ) for _ in range(streams)]
    frame = int(FRAME_S * SAMPLE_RATE_HZ) * 2
    scorer.score(audios[0], pcm[:frame]).result(timeout=120)  # silero loaded
    t0 = time.process_time()
    for r in range(rounds):
        at = (r * frame * 7) % (len(pcm) - frame)  # each round a frame of speech or pause
        futures = [scorer.score(a, pcm[at:at + frame]) for a in audios]
        for f in futures:
            f.result(timeout=120)
    return (time.process_time() - t0) / (streams * rounds)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--against", help="another stream_vad.py to compare with")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        pcm, _ = speech(Path(work))
    trees = {"this tree": load(None)}
    if args.against:
        trees["against"] = load(args.against)
    times: dict[str, list[float]] = {k: [] for k in trees}
    for _ in range(args.repeat):
        for name, module in trees.items():
            times[name].append(run(module, pcm, args.streams, args.rounds))
    for name, xs in times.items():
        print(f"{name}: {statistics.median(xs) * 1e6:.0f} us CPU per stream frame "
              f"(median of {len(xs)}: {', '.join(f'{x * 1e6:.0f}' for x in xs)}), "
              f"{args.streams} streams, 100 ms frames")
    return 0


if __name__ == "__main__":
    sys.exit(main())
