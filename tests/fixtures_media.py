"""Pytest fixtures for real test media; register with ``pytest_plugins = ["tests.fixtures_media"]``.

All media live in one session directory and are made once, on first use.
"""

from __future__ import annotations

from collections.abc import Callable
import os
from pathlib import Path

import pytest

from tests.media import make_clip, speech_wav

ClipFactory = Callable[[str, int, int], Path]


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's media cache directory (SENSEVOICE_TEST_MEDIA: a directory of media made
    earlier, e.g. carried to a GPU machine that has no espeak-ng or ffmpeg)."""
    made = os.environ.get("SENSEVOICE_TEST_MEDIA")
    if made:
        Path(made).mkdir(parents=True, exist_ok=True)
        return Path(made)
    return tmp_path_factory.mktemp("media")


@pytest.fixture(scope="session")
def speech_clip(media_dir: Path) -> Path:
    """Synthesised English speech, 16 kHz mono 16-bit wav."""
    return speech_wav(media_dir / "speech_16000_1ch.wav", rate=16000)


def source_speech(media_dir: Path, rate: int, channels: int) -> Path:
    """The PCM speech wav a clip of ``rate`` Hz and ``channels`` channels is encoded from."""
    return speech_wav(
        media_dir / f"speech_{rate}_{channels}ch.wav", rate=rate, stereo=channels == 2
    )


@pytest.fixture(scope="session")
def clip_factory(media_dir: Path) -> ClipFactory:
    """``clip_factory(fmt, rate, channels)``: speech encoded as ``fmt`` (a key of FORMATS)."""

    def make(fmt: str, rate: int, channels: int) -> Path:
        return make_clip(media_dir, source_speech(media_dir, rate, channels), fmt, rate, channels)

    return make


@pytest.fixture(scope="session")
def long_call(media_dir: Path, speech_clip: Path) -> Path:
    """A ~48 s stereo 'call': speech on the left, then on the right, with silences between turns
    (left channel speaks at 2-7 s, 20-25 s; right channel at 11-16 s, 32-37 s)."""
    import wave

    import numpy as np

    dst = media_dir / "long_call.wav"
    if dst.exists():
        return dst
    with wave.open(str(speech_clip)) as w:
        rate = w.getframerate()
        speech = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)
    total = int(48 * rate)
    stereo = np.zeros((total, 2), dtype=np.int16)
    for start_s, channel in ((2, 0), (11, 1), (20, 0), (32, 1)):
        s = int(start_s * rate)
        n = min(len(speech), total - s)
        stereo[s:s + n, channel] = speech[:n]
    with wave.open(str(dst), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(stereo.tobytes())
    return dst
