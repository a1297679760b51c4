"""Decoder targets for fault injection: they run inside the decoder processes (importable there)."""

from __future__ import annotations

import os

from pipeline.audio import decode_audio


def crash_on_marker(data: bytes, **kwargs):
    """Like a decoder that segfaults on a crafted file: the process dies without a word."""
    if data.startswith(b"CRASH"):
        os.abort()
    return decode_audio(data, **kwargs)


def process_id(data: bytes, **kwargs) -> int:
    return os.getpid()


def hang_on_marker(data: bytes, **kwargs):
    """Like a decoder caught in an endless loop by a crafted file."""
    if data.startswith(b"HANG"):
        import time

        time.sleep(3600)
    return decode_audio(data, **kwargs)
