"""An upload's bytes -> a 16 kHz wave, once, on the api side: the decoder pool (PyAV in processes)
and the resampler, within the upload limits and a bound on decodes at once. The intake, the long
audio's recovery and the batch CLI's local mode decode through it; the composition root
(pipeline/serving/runtime.py) makes the pool and the resampler it holds."""

from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import TranscribeOptions

if TYPE_CHECKING:
    from pipeline.audio.decode import Resampler
    from pipeline.audio.decoder_pool import Decoder
    from pipeline.audio.wav import Pcm16Layout
    from pipeline.config import LimitsSettings
    from pipeline.serving.ports import UploadBytes


class UploadDecoder:
    """Decodes uploads (``decode``), at most ``concurrency`` at once (None: the caller bounds them);
    ``pcm16_layout`` finds a mono 16 kHz 16-bit WAV's samples, which need no decoding."""

    def __init__(self, decoder: Decoder, resampler: Resampler, limits: LimitsSettings, concurrency: int | None):
        self.decoder = decoder  # the PyAV process pool
        self.resampler = resampler
        self.limits = limits  # max audio seconds, max upload bytes
        self._slots = contextlib.nullcontext() if concurrency is None else \
            threading.BoundedSemaphore(max(concurrency, 1))

    def decode(self, data: bytes, options: TranscribeOptions) -> torch.Tensor:
        """Upload bytes -> 16 kHz wave on the resampler's device: [n] mono, or [channels, n] for
        split calls. Blocking: call from a worker thread."""
        with self._slots:
            return decode_upload(self.decoder, self.resampler, data, options, self.limits)

    def decode_mono(self, data: bytes) -> torch.Tensor:
        """A stored upload decoded again (a recovered job's): mono, within the seconds limit."""
        return self.resampler(self.decoder(data, max_seconds=self.limits.max_audio_seconds))

    def pcm16_layout(self, data: bytes) -> Pcm16Layout | None:
        return self.decoder.pcm16_layout(data)

    def pcm16_samples(self, data: bytes, max_seconds: float) -> torch.Tensor | None:
        """A mono 16 kHz 16-bit PCM WAV of at most ``max_seconds``: its samples as they are (int16,
        scaled by the engine on its device), no float copy; else None (decode it)."""
        layout = self.decoder.pcm16_layout(data)
        if layout is None or layout.seconds > max_seconds:
            return None
        return torch.from_numpy(np.frombuffer(data, dtype="<i2", count=layout.frames, offset=layout.offset).copy())

    def warm_up(self) -> None:
        self.decoder.warm_up()

    def close(self) -> None:
        self.decoder.close()


def wave_seconds(wave: torch.Tensor) -> float:
    """Seconds of a decoded wave (``[n]`` or ``[channels, n]`` at ``SAMPLE_RATE_HZ``)."""
    return wave.shape[-1] / SAMPLE_RATE_HZ


def frames(seconds: float) -> int:
    """Samples in ``seconds`` of 16 kHz audio."""
    return int(seconds * SAMPLE_RATE_HZ)


def decode_upload(decoder: Decoder, resampler: Resampler, data: bytes, options: TranscribeOptions,
                  limits) -> torch.Tensor:
    """Upload bytes -> 16 kHz wave on the resampler's device: ``[n]`` mono, or ``[channels, n]``
    for split calls (a mono file stays ``[n]``), within ``limits`` (max audio seconds, bytes)."""
    caps = {"max_seconds": limits.max_audio_seconds, "max_bytes": limits.max_upload_bytes}
    if options.split_channels:  # [2, n]: one speaker per channel
        left = decoder(data, channel=0, **caps)
        wave = resampler(left)
        if left.channels > 1:
            right = resampler(decoder(data, channel=1, **caps))
            n = min(wave.shape[-1], right.shape[-1])
            wave = torch.stack([wave[:n], right[:n]])
    else:
        wave = resampler(decoder(data, **caps))
    if wave.is_cuda:
        torch.cuda.current_stream(wave.device).synchronize()  # ready before other threads read it
    return wave


@dataclass(frozen=True)
class SpooledUpload:
    """A recovered job's audio: its stored upload, decoded and resampled when a worker takes it
    (waiting jobs hold no decoded audio)."""

    uploads: UploadBytes
    decoder: UploadDecoder
    job_id: str

    def load(self) -> torch.Tensor:
        return self.decoder.decode_mono(self.uploads.load_upload(self.job_id))
