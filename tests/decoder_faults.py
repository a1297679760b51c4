"""Decoder targets for fault injection: they run inside the decoder processes (importable there
as ``"tests.decoder_faults:NAME"``), in place of ``pipeline.audio.decode:decode_audio_parts``."""

from __future__ import annotations

import os
import pickle
import time

import numpy as np

from pipeline.audio import decode_worker
from pipeline.audio.decode import DecodedAudio, decode_audio


def crash_on_marker(data: bytes, **kwargs):
    """Like a decoder that segfaults on a crafted file: the process dies without a word."""
    if data.startswith(b"CRASH"):
        os.abort()
    return decode_audio(data, **kwargs)


def process_id(data: bytes, **kwargs) -> DecodedAudio:
    """One sample holding the decoder's pid (exact in float32 below 2**24)."""
    return DecodedAudio(np.array([os.getpid()], dtype=np.float32), 16000)


def hang_on_marker(data: bytes, **kwargs):
    """Like a decoder caught in an endless loop by a crafted file."""
    if data.startswith(b"HANG"):
        time.sleep(3600)
    return decode_audio(data, **kwargs)


class _RunsCode:
    """Unpickling this would create the file named in the upload (what a hostile pickle does)."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _header(status=0, rate=16000, channels=1, samples=1000, message=0, magic=b"SVr1") -> bytes:
    return decode_worker.REPLY.pack(magic, status, rate, channels, samples, message)


def malformed_reply(data: bytes, **kwargs):
    """Like a decoder a crafted file took over: it writes a reply of its own, chosen by the first
    word of the upload, then waits to be killed (or dies, for "short")."""
    kind, _, rest = data.partition(b" ")
    replies = {
        b"pickle": pickle.dumps(_RunsCode(rest.decode())),  # a pickle instead of a header
        b"magic": _header(magic=b"EVIL"),
        b"huge": _header(samples=1 << 40),  # 4 TiB of samples announced
        b"over_budget": _header(samples=int(kwargs["max_seconds"] * 16000) + 1),
        b"rate": _header(rate=8001),  # a rate the device would need a huge kernel for
        b"channels": _header(channels=100_000),
        b"status": _header(status=99, samples=0, rate=0, channels=0, message=5) + b"hello",
        b"long_message": _header(status=1, samples=0, rate=0, channels=0, message=1 << 30),
        b"error_with_samples": _header(status=1, samples=10, rate=0, channels=0, message=0),
        b"short": _header(samples=1000) + bytes(40),  # 10 of the 1000 samples, then exit
    }
    reply = replies[kind]
    os.write(decode_worker.REPLY_FD, reply)
    if kind == b"short":
        os._exit(0)
    time.sleep(3600)

