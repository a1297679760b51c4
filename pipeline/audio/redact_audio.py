"""The recording of a redacted job as the service serves it back (``redact_audio``, issue 41): the
masked items' time spans silenced or replaced by a 1 kHz tone, as a 16-bit WAV of the source's
channels (at most two) at its decoded rate. The spans are the job's list of what was masked
(pipeline/domain/redaction.py: each item's words' times, else its segment's), widened by
``PAD_S`` on each side (the words' CTC times are 60 ms frames)."""

from __future__ import annotations

import io
import logging
import math
import wave
from collections.abc import Iterable

import numpy as np

from pipeline.audio.decode import AudioSource, decode_audio

logger = logging.getLogger("sensevoice.redact_audio")

PAD_S = 0.1  # seconds added before and after each span
BEEP_HZ = 1000.0
BEEP_LEVEL = 0.3  # of full scale
MAX_CHANNELS = 2


def mask_spans(samples: np.ndarray, rate: int, spans: Iterable[tuple[float, float]],
               mode: str) -> np.ndarray:
    """``samples`` (float, 1-D) with each (start, end) span in seconds silenced (``silence``) or
    replaced by a tone (``beep``); spans are padded, clipped to the audio, non-finite ones skipped."""
    out = np.array(samples, dtype=np.float32, copy=True)
    n = out.size
    for start, end in spans:
        if not (math.isfinite(start) and math.isfinite(end)) or end < start:
            continue
        a = max(0, int((start - PAD_S) * rate))
        b = min(n, int(math.ceil((end + PAD_S) * rate)))
        if a >= b:
            continue
        if mode == "beep":
            t = np.arange(a, b, dtype=np.float32) / rate
            out[a:b] = BEEP_LEVEL * np.sin(2 * np.pi * BEEP_HZ * t)
        else:
            out[a:b] = 0.0
    return out


def wav_bytes(channels: list[np.ndarray], rate: int) -> bytes:
    """16-bit PCM WAV of equal-length float channels in [-1, 1]."""
    n = min(c.size for c in channels)
    frames = np.stack([np.clip(c[:n], -1.0, 1.0) for c in channels], axis=1)
    pcm = (frames * 32767.0).round().astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(len(channels))
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def redacted_recording(source: AudioSource, spans: list[tuple[float, float]], mode: str, *,
                       max_seconds: float, max_bytes: int | None = None) -> bytes:
    """The recording decoded (each of its first two channels), ``spans`` masked, as WAV bytes."""
    first = decode_audio(source, max_seconds=max_seconds, max_bytes=max_bytes, channel=0)
    decoded = [first]
    for ch in range(1, min(first.channels, MAX_CHANNELS)):
        decoded.append(decode_audio(source, max_seconds=max_seconds, max_bytes=max_bytes,
                                    channel=ch))
    masked = [mask_spans(d.samples, first.sample_rate, spans, mode) for d in decoded]
    logger.debug("served a redacted recording: %d spans, %d channels, %.1f s", len(spans),
                 len(masked), first.seconds)
    return wav_bytes(masked, first.sample_rate)
