"""The api side's way in: an upload is checked (queue, backlog, GPU memory), decoded (PyAV, in a
process pool) and resampled once, stored durably in the broker and queued -- before the submit
answers. Long recordings go through :class:`~pipeline.serving.long_audio.LongAudio`. It uses the
ports of :class:`~pipeline.serving.ports.Admission` (JobWrites, WorkQueue, Uploads)."""

from __future__ import annotations

import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from pipeline.audio.decode import Resampler
from pipeline.audio.decoder_pool import Decoder
from pipeline.audio.wav import Pcm16Layout
from pipeline.domain.errors import MemoryPressure, NotReady, SenseVoiceError
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from pipeline.serving.long_audio import LongAudio
from pipeline.serving.scheduler import WorkItem

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.serving.ports import Admission, FreeMemory
    from pipeline.serving.job_view import JobView
    from pipeline.serving.metrics import Metrics

logger = logging.getLogger("sensevoice.intake")


def new_job_id() -> str:
    """A full random UUID (122 random bits): unguessable."""
    return str(uuid.UUID(bytes=secrets.token_bytes(16), version=4))


class Intake:
    def __init__(self, settings: Settings, broker: Admission, view: JobView, metrics: Metrics,
                 device: str, free_memory: FreeMemory, failed: Callable[[], str | None],
                 speech_device: str = "cpu"):
        self.settings = settings
        self.broker = broker
        self.view = view
        self.metrics = metrics
        self.free_memory = free_memory  # the free GPU memory shares admission looks at
        self.failed = failed  # why the service cannot take work at all, or None
        self.resampler = Resampler(device)
        limits = settings.limits  # (machine-derived defaults already resolved by Settings)
        self._decode_slots = threading.BoundedSemaphore(limits.decode_concurrency)
        self.decoder = Decoder(limits.decode_processes,
                               timeout_s=settings.limits.decode_timeout_s, **Decoder.limits(settings))
        self.long_audio = LongAudio(settings, broker, view, self.decode, speech_device,
                                    on_failed=lambda job, code: metrics.request_failure(job.lane, code))
        self._owned_files: dict[str, list[Path]] = {}  # job id -> intermediate copies to delete with it
        self._owned_lock = threading.Lock()

    # ------------------------------------------------------------------ submit
    def submit(self, data: bytes, *, filename: str = "", options: TranscribeOptions = TranscribeOptions(),
               lane: Lane = Lane.BULK) -> Job:
        """Decode, resample, persist and enqueue one upload. Blocking: call from a worker thread."""
        try:
            return self._submit(data, filename, options, lane)
        except SenseVoiceError as e:
            self.metrics.rejected(e.code)
            raise

    def _submit(self, data: bytes, filename: str, options: TranscribeOptions, lane: Lane) -> Job:
        reason = self.failed()
        if reason is not None:
            raise NotReady(f"the service is not available: {reason}")
        self.broker.check_capacity()  # cheap early answers before decoding
        self.long_audio.check(options)
        self._check_memory()
        layout = self._pcm16_layout(data)
        wave = self.decode(data, options) if layout is None else None
        job = Job(id=new_job_id(), state=JobState.QUEUED, options=options, lane=lane,
                  created_at=time.time(), audio_seconds=layout.seconds if wave is None else wave_seconds(wave),
                  filename=display_name(filename))
        if self.long_audio.is_long(job.audio_seconds, options):
            return self.long_audio.accept(job, data, self.decode(data, options) if wave is None else wave)
        self.broker.create(job, data)
        try:
            if wave is None:  # the spooled upload's own samples, read when the worker takes them
                item = WorkItem(job.id, lane, options, layout.frames, audio=self.broker.spooled_audio(job.id, layout))
            else:
                item = WorkItem(job.id, lane, options, int(wave.shape[-1]), audio=wave)
            self.broker.put(item)
        except SenseVoiceError:
            self.broker.discard(job.id)
            raise
        self.view.remember(job)
        return replace(job, position=self.broker.position(job.id))

    def _check_memory(self) -> None:
        """GPU admission control: refuse new work while every device is short of free memory."""
        if self.settings.limits.min_free_memory_ratio <= 0:
            return
        ratios = self.free_memory()
        if ratios and max(ratios) < self.settings.limits.min_free_memory_ratio:
            raise MemoryPressure(
                f"the GPU is short of memory ({max(ratios):.0%} free); try again in a few seconds")

    def _pcm16_layout(self, data: bytes) -> Pcm16Layout | None:
        """A mono 16 kHz 16-bit PCM WAV's samples in the upload, when the broker reads a job's
        audio from its stored upload: such an upload is never converted (to float, to the GPU)
        here; anything else is decoded (None)."""
        return self.decoder.pcm16_layout(data) if self.broker.spools_pcm16 else None

    def decode(self, data: bytes, options: TranscribeOptions) -> torch.Tensor:
        """Upload bytes -> 16 kHz wave on the device: [n] mono, or [channels, n] for split calls."""
        with self._decode_slots:
            return decode_upload(self.decoder, self.resampler, data, options, self.settings.limits)

    # ------------------------------------------------------------------ files tied to jobs
    def own_file(self, job_id: str, path: str | Path) -> None:
        """Tie an intermediate copy of a job's upload (Gradio's upload cache) to the job: deleted
        now if audio is deleted when jobs are done (the spool holds the job's own copy), else when
        the job is purged. (Gradio's ``delete_cache`` sweep is the backstop across restarts.)"""
        path = Path(path)
        if self.settings.limits.delete_audio_when_done:
            path.unlink(missing_ok=True)
            return
        with self._owned_lock:
            self._owned_files.setdefault(job_id, []).append(path)

    def forget(self, job_ids: list[str]) -> None:
        """Purged jobs: delete the intermediate copies tied to them."""
        with self._owned_lock:
            owned = [p for jid in job_ids for p in self._owned_files.pop(jid, ())]
        for path in owned:
            path.unlink(missing_ok=True)

    # ------------------------------------------------------------------ restart
    def recover(self) -> None:
        """Put the jobs a previous process accepted back on the queue (the embedded broker's queue
        lives in memory; one that outlives this process keeps its own and returns none)."""
        jobs = self.broker.recover()
        self.long_audio.keep_only({j.id for j in jobs})
        for job in jobs:
            if self.long_audio.is_long(job.audio_seconds, job.options):
                self.long_audio.recover(job)
                continue
            n = int(job.audio_seconds * SAMPLE_RATE_HZ)
            audio = SpooledUpload(self, job.id)
            self.broker.put(WorkItem(job.id, job.lane, job.options, n, audio=audio), force=True)
        if jobs:
            logger.info("recovered %d queued jobs from the store", len(jobs))

    def close(self) -> None:
        self.long_audio.stop()
        self.decoder.close()


def wave_seconds(wave: torch.Tensor) -> float:
    """Seconds of a decoded wave (``[n]`` or ``[channels, n]`` at ``SAMPLE_RATE_HZ``)."""
    return wave.shape[-1] / SAMPLE_RATE_HZ


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
    """A recovered job's audio: its spooled upload, decoded and resampled when a worker takes it
    (waiting jobs hold no decoded audio)."""

    intake: Intake
    job_id: str

    def load(self) -> torch.Tensor:
        i = self.intake
        return i.resampler(i.decoder(i.broker.load_upload(self.job_id),
                                     max_seconds=i.settings.limits.max_audio_seconds))


def display_name(name: str, limit: int = 200) -> str:
    """The client's filename for display only: no path parts, no control characters, bounded."""
    base = Path(str(name).replace("\\", "/")).name
    clean = "".join(ch for ch in base if ch.isprintable() and ch not in "\u202e\u202d\u200f\u200e")
    return clean[:limit]
