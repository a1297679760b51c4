"""A batch of recordings run in this process with no broker: the batch CLI's local mode
(``build_runtime(settings, "local")``, pipeline/serving/runtime.py, makes its parts).

Each submitted recording is decoded here (the upload decoder; a short 16 kHz 16-bit WAV read as it
is), split by speech detection when long, and put straight into the scheduler that the worker pool
batches from; its transcript comes back as a future (:class:`LocalSink`, the workers' sink). No job
record, no spooled upload, no fsync per file: the caller's outputs are the record (the CLI's resume
reads them). The worker pool and its workers are the server's own: the same engine, batching, OOM
policy and results."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import Future
from typing import TYPE_CHECKING

from pipeline.domain.types import Lane, TranscribeOptions, Transcript
from pipeline.serving.scheduler import NoLiveServer, WorkItem
from pipeline.serving.speech_split import split_pieces
from pipeline.serving.upload_decode import wave_seconds

if TYPE_CHECKING:
    from collections.abc import Iterable

    import torch

    from pipeline.config import Settings
    from pipeline.serving.records import SegmentResult
    from pipeline.serving.scheduler import Scheduler
    from pipeline.serving.speech_split import SegmenterLoader, SpeakersLoader
    from pipeline.serving.upload_decode import UploadDecoder
    from pipeline.serving.worker_pool import WorkerPool


class RecordingFailed(Exception):
    """A recording the worker could not transcribe (its job's failure code and message)."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


class LocalSink:
    """Where the workers of a local run finish work (the ports WorkerSink and WorkSource): each
    recording's transcript is the result of its future; no record is kept, nothing is fed."""

    def __init__(self):
        self._ids = itertools.count()
        self._futures: dict[str, Future] = {}
        self._pieces: dict[str, dict[int, SegmentResult]] = {}
        self._lock = threading.Lock()

    def new_id(self) -> str:
        return f"file-{next(self._ids)}"

    def expect(self, job_id: str) -> Future:
        """The future of a recording's transcript, answered when its workers finish it."""
        future: Future = Future()
        with self._lock:
            self._futures[job_id] = future
        return future

    # -- WorkSource: this process's scheduler is the queue; a batch run has no live streams
    def feeder(self, scheduler, consumer: str, prefetch: int, free_memory, busy_seconds=None) -> None:
        return None

    def serve_live(self, scheduler, consumer: str, *, max_waiting: int, ready) -> NoLiveServer:
        return NoLiveServer()

    # -- WorkerSink
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


class DirectRun:
    """The worker side of this process, fed directly: ``submit`` decodes a recording and puts it
    (its pieces, when long) into the scheduler the pool batches from."""

    def __init__(self, settings: Settings, scheduler: Scheduler, pool: WorkerPool, uploads: UploadDecoder,
                 sink: LocalSink, segmenter: SegmenterLoader, speakers: SpeakersLoader | None = None):
        self.settings = settings
        self.scheduler = scheduler  # the bound is the caller's (files in flight): nothing is refused
        self.pool = pool
        self.uploads = uploads
        self.sink = sink
        self.segmenter = segmenter  # silero-vad, loaded on the first long recording
        self.speakers = speakers  # the speaker model, loaded on the first ask for speakers

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.pool.load()
        self.uploads.warm_up()
        self.pool.start()

    def stop(self) -> None:
        self.pool.stop()
        self.uploads.close()

    # ------------------------------------------------------------------ submit
    def submit(self, data: bytes, options: TranscribeOptions) -> tuple[Future, float]:
        """Decode one recording and queue it (its pieces, when long); returns the future of its
        transcript and its audio seconds. Decoding errors raise here (the recording's own)."""
        wave = self._short_pcm16(data, options)
        if wave is None:
            wave = self.uploads.decode(data, options)
        seconds = wave_seconds(wave)
        job_id = self.sink.new_id()
        if seconds > self.settings.engine.segment_threshold_s or options.split_channels or options.wants_speakers:
            items = split_pieces(job_id, Lane.BULK, options, wave, self.segmenter(), speakers=self.speakers)
            if not items:  # no speech at all: an empty transcript, not an error
                empty: Future = Future()
                empty.set_result(Transcript(text="", raw_text="", segments=()))
                return empty, seconds
        else:
            items = [WorkItem(job_id, Lane.BULK, options, int(wave.shape[-1]), audio=wave)]
        future = self.sink.expect(job_id)
        for item in items:
            self.scheduler.put(item, force=True)
        return future, seconds

    def _short_pcm16(self, data: bytes, options: TranscribeOptions) -> torch.Tensor | None:
        """A short mono 16 kHz 16-bit PCM WAV's samples as they are (int16, scaled by the engine on
        its device, as the server's spooled WAV uploads): no float copy per file; else None (decoded:
        a long recording's speech detection reads float waves)."""
        if options.split_channels:
            return None
        return self.uploads.pcm16_samples(data, self.settings.engine.segment_threshold_s)
