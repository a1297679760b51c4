"""The one format read in the server's own process: 16 kHz 16-bit PCM WAV, by far the most common
upload of API clients (and what a phone or a call-centre system exports).

Parsing it is a walk over a few RIFF chunk headers and one ``np.frombuffer``: no third-party
parser runs, nothing is allocated beyond the output, and the cost is bounded by the upload size
(already capped). It skips the round trip to a decoder process (the upload sent down a pipe, the
samples sent back: ~2x the upload in copies, a few milliseconds of an idle submit). Anything else
-- another rate, another sample format, a compressed or a malformed file, a file over the duration
cap or shorter than one fbank window -- returns None, and the decoder process handles it exactly
as before (with its error messages). The samples are bit-identical to the decoder's
(tests/test_wav_fast.py): the same channel sum and the same single scale as ``_write_mono``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from pipeline.audio.decode import MIN_AUDIO_SECONDS, DecodedAudio
from pipeline.domain.tags import SAMPLE_RATE_HZ

WAVE_FORMAT_PCM = 1
WAVE_FORMAT_EXTENSIBLE = 0xFFFE
PCM_SUBFORMAT_TAIL = b"\x00\x00\x00\x00\x10\x00\x80\x00\x00\xaa\x00\x38\x9b\x71"  # KSDATAFORMAT_SUBTYPE_PCM
MAX_CHANNELS = 2  # a split stereo call; more channels go to the decoder process
MAX_CHUNKS = 64  # chunk headers walked before the file counts as unusual (decoder's job then)


@dataclass(frozen=True)
class Pcm16Layout:
    """Where a mono 16 kHz 16-bit PCM WAV keeps its samples: ``frames`` little-endian int16 values
    from byte ``offset`` of the file. Such an upload's bytes are its audio: the spooled copy is
    read as it is (mapped), never converted (:class:`~pipeline.serving.broker_sqlite.SpooledPcm16`)."""

    offset: int
    frames: int

    @property
    def seconds(self) -> float:
        return self.frames / SAMPLE_RATE_HZ


def read_pcm16_wav(data: bytes | bytearray | memoryview, *, max_seconds: float,
                   channel: int | None = None) -> DecodedAudio | None:
    """The mono mix (or ``channel``) of a 16 kHz 16-bit PCM WAV, or None when ``data`` is not one
    this reader takes (the caller decodes it in a decoder process instead)."""
    found = _locate(data, max_seconds)
    if found is None:
        return None
    view, channels, body, frames = found
    return _samples(view[body:body + frames * 2 * channels], channels, channel)


def pcm16_mono_layout(data: bytes | bytearray | memoryview, *, max_seconds: float) -> Pcm16Layout | None:
    """Where the samples of a mono 16 kHz 16-bit PCM WAV are (the ones :func:`read_pcm16_wav`
    scales), or None for anything else (stereo too: its mix is computed)."""
    found = _locate(data, max_seconds)
    if found is None or found[1] != 1:
        return None
    return Pcm16Layout(found[2], found[3])


def _locate(data: bytes | bytearray | memoryview, max_seconds: float) -> tuple[memoryview, int, int, int] | None:
    """(view, channels, byte offset of the samples, frames) of a WAV this reader takes, or None."""
    view = memoryview(data)
    if len(view) < 12 or view[0:4] != b"RIFF" or view[8:12] != b"WAVE":
        return None
    fmt = None
    pos = 12
    for _ in range(MAX_CHUNKS):
        if pos + 8 > len(view):
            return None
        cid, size = bytes(view[pos:pos + 4]), struct.unpack_from("<I", view, pos + 4)[0]
        body = pos + 8
        if cid == b"fmt ":
            if size < 16 or body + size > len(view):
                return None
            fmt = _pcm16_format(view[body:body + size])
            if fmt is None:
                return None
        elif cid == b"data":
            if fmt is None:
                return None
            # a streamed WAV states 0 or 0xFFFFFFFF; a truncated one more than it holds: what is
            # there is what the decoder process would return too
            end = len(view) if size in (0, 0xFFFFFFFF) else min(body + size, len(view))
            frames = (end - body) // (2 * fmt)
            if frames < MIN_AUDIO_SECONDS * SAMPLE_RATE_HZ or frames > max_seconds * SAMPLE_RATE_HZ:
                return None  # the decoder process says why, in its words
            return view, fmt, body, frames
        if size & 1:  # padded to an even size by RIFF's rule, but FFmpeg refuses some of
            return None  # these: the decoder process decides, so that both paths agree
        pos = body + size
    return None


def _pcm16_format(fmt: memoryview) -> int | None:
    """The channel count of a 16 kHz 16-bit PCM ``fmt `` chunk, or None."""
    tag, channels, rate, _byte_rate, align, bits = struct.unpack_from("<HHIIHH", fmt, 0)
    if tag == WAVE_FORMAT_EXTENSIBLE:
        if len(fmt) < 40 or bytes(fmt[26:40]) != PCM_SUBFORMAT_TAIL:
            return None
        valid_bits, tag = struct.unpack_from("<H", fmt, 18)[0], struct.unpack_from("<H", fmt, 24)[0]
        if valid_bits != 16:
            return None
    if (tag != WAVE_FORMAT_PCM or bits != 16 or rate != SAMPLE_RATE_HZ
            or not 1 <= channels <= MAX_CHANNELS or align != 2 * channels):
        return None
    return channels


def _samples(pcm: memoryview, channels: int, channel: int | None) -> DecodedAudio:
    frames = len(pcm) // (2 * channels)
    columns = np.frombuffer(pcm, dtype="<i2", count=frames * channels).reshape(frames, channels)
    scale = np.float32(2.0 ** -15)
    if channel is not None:
        out = columns[:, min(channel, channels - 1)].astype(np.float32)
        out *= scale
    else:  # the decoder's arithmetic exactly: sum in float32, one multiply
        out = columns[:, 0].astype(np.float32)
        for c in range(1, channels):
            out += columns[:, c]
        out *= np.float32(1.0 / channels) * scale
    return DecodedAudio(out, SAMPLE_RATE_HZ, channels)
