"""A batch of recordings run in this process with no broker: the batch CLI's local mode.

Each submitted recording is decoded here (the decoder pool; 16 kHz 16-bit WAV read in-process),
split by speech detection when long, and put straight into the scheduler that the worker pool
batches from; its transcript comes back as a future. No job record, no spooled upload, no fsync
per file: the caller's outputs are the record (the CLI's resume reads them). The worker pool and
its workers are the server's own: the same engine, batching, OOM policy and results."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

import numpy as np
import torch

from pipeline.audio.decode import Resampler
from pipeline.audio.decoder_pool import Decoder
from pipeline.domain.types import Lane, TranscribeOptions, Transcript
from pipeline.serving.intake import decode_upload, wave_seconds
from pipeline.serving.long_audio import load_segmenter, split_pieces
from pipeline.serving.metrics import Metrics
from pipeline.serving.scheduler import NoLiveServer, Scheduler, WorkItem
from pipeline.serving.worker_pool import WorkerPool, visible_devices

if TYPE_CHECKING:
    from collections.abc import Iterable

    from pipeline.config import Settings
    from pipeline.model.loading import ModelSource
    from pipeline.serving.records import SegmentResult


class RecordingFailed(Exception):
    """A recording the worker could not transcribe (its job's failure code and message)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class DirectRun:
    """The worker side of this process, fed directly; it is also the results' sink the workers
    write to (the broker methods a :class:`~pipeline.serving.worker.Worker` calls)."""

    def feeder(self, scheduler, consumer: str, prefetch: int, free_memory, busy_seconds=None) -> None:
        """(For the worker pool:) no feeder, this process's scheduler is the queue."""
        return None

    def __init__(self, settings: Settings, source: ModelSource | None = None):
        self.settings = settings
        e = settings.engine
        # the bound is the caller's (files in flight), not a queue size: nothing is refused
        self.scheduler = Scheduler(1 << 30, e.max_batch, e.max_wait_ms / 1e3, e.max_batch_seconds)
        devices = visible_devices(e.resolved_device())
        # no background compile unless asked for: a run ends before it pays, and it cannot be
        # cancelled (the CLI waited for it at exit; before, it aborted the exit: issue 42)
        self.pool = WorkerPool(settings, self, self.scheduler, Metrics(devices), devices, source,
                               background_work=bool(e.background_compile))
        self.resampler = Resampler(devices[0])
        limits = settings.limits
        self.decoder = Decoder(limits.decode_processes, timeout_s=limits.decode_timeout_s,
                               **Decoder.limits(settings))
        self._segmenter = None
        self._segmenter_lock = threading.Lock()
        self._ids = itertools.count()
        self._futures: dict[str, Future] = {}
        self._pieces: dict[str, dict[int, SegmentResult]] = {}
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.pool.load()
        self.decoder.warm_up()
        self.pool.start()

    def stop(self) -> None:
        self.pool.stop()
        self.decoder.close()

    # ------------------------------------------------------------------ submit
    def submit(self, data: bytes, options: TranscribeOptions) -> tuple[Future, float]:
        """Decode one recording and queue it (its pieces, when long); returns the future of its
        transcript and its audio seconds. Decoding errors raise here (the recording's own)."""
        wave = self._short_pcm16(data, options)
        if wave is None:
            wave = decode_upload(self.decoder, self.resampler, data, options, self.settings.limits)
        seconds = wave_seconds(wave)
        job_id = f"file-{next(self._ids)}"
        future: Future = Future()
        if seconds > self.settings.engine.segment_threshold_s or options.split_channels:
            items = split_pieces(job_id, Lane.BULK, options, wave, self._segmenter_for_long())
            if not items:  # no speech at all: an empty transcript, not an error
                future.set_result(Transcript(text="", raw_text="", segments=()))
                return future, seconds
        else:
            items = [WorkItem(job_id, Lane.BULK, options, int(wave.shape[-1]), audio=wave)]
        with self._lock:
            self._futures[job_id] = future
        for item in items:
            self.scheduler.put(item, force=True)
        return future, seconds

    def _short_pcm16(self, data: bytes, options: TranscribeOptions) -> torch.Tensor | None:
        """A short mono 16 kHz 16-bit PCM WAV's samples as they are (int16, scaled by the engine on
        its device, as the server's spooled WAV uploads): no float copy per file; else None (decoded:
        a long recording's speech detection reads float waves)."""
        if options.split_channels:
            return None
        layout = self.decoder.pcm16_layout(data)
        if layout is None or layout.seconds > self.settings.engine.segment_threshold_s:
            return None
        return torch.from_numpy(np.frombuffer(data, dtype="<i2", count=layout.frames, offset=layout.offset).copy())

    def _segmenter_for_long(self):
        with self._segmenter_lock:
            if self._segmenter is None:
                self._segmenter = load_segmenter(self.settings.engine.max_segment_s,
                                                 self.pool.speech_device)
            return self._segmenter

    # ------------------------------------------------------------------ the workers' sink
    def serve_live(self, scheduler, consumer: str, *, max_waiting: int, ready) -> NoLiveServer:
        """The worker pool starts a broker's live lane at start: a batch run has no live streams."""
        return NoLiveServer()

    def mark_running(self, job_ids: Iterable[str], already_running_ok: bool = False) -> set[str]:
        with self._lock:
            return {j for j in job_ids if j in self._futures}

    def finish_many(self, results: Iterable[tuple[str, Transcript]]) -> set[str]:
        written = set()
        for job_id, transcript in results:
            with self._lock:
                future = self._futures.pop(job_id, None)
                self._pieces.pop(job_id, None)
            if future is not None:
                future.set_result(transcript)
                written.add(job_id)
        return written

    def fail(self, job_id: str, code: str, message: str) -> bool:
        with self._lock:
            future = self._futures.pop(job_id, None)
            self._pieces.pop(job_id, None)
        if future is None:
            return False
        future.set_exception(RecordingFailed(code, message))
        return True

    def save_segments(self, results: Iterable[SegmentResult]) -> None:
        with self._lock:
            for r in results:
                self._pieces.setdefault(r.job_id, {})[r.idx] = r

    def segment_count(self, job_id: str) -> int:
        with self._lock:
            return len(self._pieces.get(job_id, ()))

    def segments(self, job_id: str) -> list[SegmentResult]:
        with self._lock:
            return sorted(self._pieces.get(job_id, {}).values(), key=lambda r: (r.start_s, r.idx))

    def get(self, job_id: str):
        raise LookupError(job_id)  # no records: a long job's seconds come from its pieces

    def release(self, job_ids: Iterable[str]) -> None:
        """Nothing is held for another worker."""

    def delete_spool(self, job_id: str) -> None:
        """Nothing is spooled."""
