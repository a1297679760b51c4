#!/usr/bin/env python3
"""The real server (``app_sensevoice.main``, any arguments) with an engine that answers at once:
what a load test then measures is everything but the model -- HTTP, decoding, admission, the
broker, batching, storing and polling -- the ceiling the Python around a GPU can feed it at.

    python bench/noop_server.py --demo --device cpu --port 7871   # (bench/load_test.py --noop)
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import app_sensevoice  # noqa: E402
from pipeline.model.engine import EngineOutput, SenseVoiceEngine  # noqa: E402

RAW = "<|en|><|NEUTRAL|><|Speech|><|withitn|>Hello there."


class _Done:
    def __init__(self, n: int):
        self.n = n

    def result(self):
        return [EngineOutput((), RAW) for _ in range(self.n)]


def main(argv: list[str]) -> int:
    clean = SenseVoiceEngine.transcribe_async

    def transcribe_async(self, waves, options):
        if not threading.current_thread().name.startswith("sensevoice-worker"):
            return clean(self, waves, options)  # the start-up warm-up runs the real model
        return _Done(len(waves))

    SenseVoiceEngine.transcribe_async = transcribe_async
    return app_sensevoice.main(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
