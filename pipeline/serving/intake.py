"""The api side's way in: an upload is checked (queue, backlog, GPU memory), decoded once
(:class:`~pipeline.serving.upload_decode.UploadDecoder`), stored durably in the broker and queued --
before the submit answers. Long recordings go through
:class:`~pipeline.serving.long_audio.LongAudio`. It uses the ports of
:class:`~pipeline.serving.ports.Admission` (a job's record, the queue's way in and its places, the
stored upload); the composition root gives it its decoder and its long audio."""

from __future__ import annotations

import logging
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.domain.errors import MemoryPressure, NotReady, SenseVoiceError
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from pipeline.serving.scheduler import WorkItem
from pipeline.serving.upload_decode import SpooledUpload, frames, wave_seconds

if TYPE_CHECKING:
    import torch

    from pipeline.config import Settings
    from pipeline.serving.job_view import JobView
    from pipeline.serving.long_audio import LongAudio
    from pipeline.serving.ports import Admission, FreeMemory
    from pipeline.serving.upload_decode import UploadDecoder

logger = logging.getLogger("sensevoice.intake")


def new_job_id() -> str:
    """A full random UUID (122 random bits): unguessable."""
    return str(uuid.UUID(bytes=secrets.token_bytes(16), version=4))


class Intake:
    def __init__(self, settings: Settings, broker: Admission, view: JobView, uploads: UploadDecoder,
                 long_audio: LongAudio, free_memory: FreeMemory, failed: Callable[[], str | None],
                 rejected: Callable[[str], None] = lambda code: None,
                 check_hotwords: Callable[[tuple], None] = lambda hotwords: None):
        self.settings = settings
        self.broker = broker
        self.view = view
        self.uploads = uploads  # upload bytes -> 16 kHz waves (the decoder pool, the resampler)
        self.long_audio = long_audio
        self.free_memory = free_memory  # the free GPU memory shares admission looks at
        self.failed = failed  # why the service cannot take work at all, or None
        self.rejected = rejected  # (error code): a submit refused (metrics)
        self.check_hotwords = check_hotwords  # (a list): raises InvalidOption for a term the model cannot spell
        self._owned_files: dict[str, list[Path]] = {}  # job id -> intermediate copies to delete with it
        self._owned_lock = threading.Lock()

    # ------------------------------------------------------------------ submit
    def submit(self, data: bytes, *, filename: str = "", options: TranscribeOptions = TranscribeOptions(),
               lane: Lane = Lane.BULK) -> Job:
        """Decode, resample, persist and enqueue one upload. Blocking: call from a worker thread."""
        try:
            return self._submit(data, filename, options, lane)
        except SenseVoiceError as e:
            self.rejected(e.code)
            raise

    def _submit(self, data: bytes, filename: str, options: TranscribeOptions, lane: Lane) -> Job:
        reason = self.failed()
        if reason is not None:
            raise NotReady(f"the service is not available: {reason}")
        self.broker.check_capacity()  # cheap early answers before decoding
        self.long_audio.check(options)
        if options.hotwords:  # a term the model's vocabulary cannot spell: 400 here
            self.check_hotwords(options.hotwords)
        self._check_memory()
        # a mono 16 kHz 16-bit PCM WAV, where the broker reads a job's audio from its stored upload:
        # never converted (to float, to the GPU) here; anything else is decoded
        layout = self.uploads.pcm16_layout(data) if self.broker.spools_pcm16 else None
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

    def decode(self, data: bytes, options: TranscribeOptions) -> torch.Tensor:
        """Upload bytes -> 16 kHz wave on the device: [n] mono, or [channels, n] for split calls."""
        return self.uploads.decode(data, options)

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
            audio = SpooledUpload(self.broker, self.uploads, job.id)
            self.broker.put(WorkItem(job.id, job.lane, job.options, frames(job.audio_seconds), audio=audio),
                            force=True)
        if jobs:
            logger.info("recovered %d queued jobs from the store", len(jobs))

    def close(self) -> None:
        self.long_audio.stop()
        self.uploads.close()


def display_name(name: str, limit: int = 200) -> str:
    """The client's filename for display only: no path parts, no control characters, bounded."""
    base = Path(str(name).replace("\\", "/")).name
    clean = "".join(ch for ch in base if ch.isprintable() and ch not in "\u202e\u202d\u200f\u200e")
    return clean[:limit]
