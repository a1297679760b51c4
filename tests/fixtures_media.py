"""Pytest fixtures for real test media; register with ``pytest_plugins = ["tests.fixtures_media"]``.

All media live in one session directory and are made once, on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.media import make_clip, speech_wav

ClipFactory = Callable[[str, int, int], Path]


@pytest.fixture(scope="session")
def media_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's media cache directory."""
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
