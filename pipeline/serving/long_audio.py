"""Long recordings (and split stereo calls): split by speech detection into pieces that the
workers batch like any job. Where this process recovers its queue (``WorkQueue.recovers_here``:
the embedded topology) a long upload is accepted at once (counted in the backlog, its decoded audio
left on disk) and split in the background; else it is split before the submit answers, so that no
accepted job depends on this process staying up. It uses the ports of
:class:`~pipeline.serving.ports.LongJobs` (a job's record and outcome, the queue's way in, the stored
upload); the composition root gives it its backlog, its wave spool and its segmenter."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from pipeline.domain.errors import SegmentationFailed, SenseVoiceError
from pipeline.domain.types import Job, TranscribeOptions, Transcript
from pipeline.serving.speech_split import SegmenterLoader, SpeakersLoader, split_pieces

if TYPE_CHECKING:
    from pipeline.serving.admission import Backlog
    from pipeline.serving.broker_sqlite import WaveSpool
    from pipeline.serving.job_view import JobView
    from pipeline.serving.ports import LongJobs
    from pipeline.serving.scheduler import WorkItem

logger = logging.getLogger("sensevoice.long_audio")


class LongAudio:
    def __init__(self, broker: LongJobs, view: JobView, decode: Callable[[bytes, TranscribeOptions], torch.Tensor],
                 *, threshold_s: float, backlog: Backlog, waves: WaveSpool, load_segmenter: SegmenterLoader,
                 on_failed: Callable[[Job, str], None] = lambda job, code: None,
                 load_speakers: SpeakersLoader | None = None):
        self.threshold_s = threshold_s  # longer than this (s): split by speech detection
        self.on_failed = on_failed  # (job, error code): a job this class failed (metrics)
        self.broker = broker
        self.view = view
        self.decode = decode
        self.backlog = backlog  # the long jobs accepted and not yet split (seats, hours)
        self.waves = waves  # their decoded audio on disk until split
        self._load_segmenter = load_segmenter
        self._load_speakers = load_speakers  # the speaker model, loaded on the first ask for speakers
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sensevoice-vad")
        self._segmenter = None  # silero-vad, loaded on the first long recording
        self._segmenter_lock = threading.Lock()
        view.on_finished.append(self._finished)

    def is_long(self, seconds: float, options: TranscribeOptions) -> bool:
        return seconds > self.threshold_s or options.split_channels or options.wants_speakers

    def check(self, options: TranscribeOptions) -> None:
        """A cheap early answer (BacklogFull) before a split call is decoded; an ask for speakers
        loads the speaker model first (ModelUnavailable, e.g. an unreachable hub, answers the submit)."""
        if options.split_channels or options.wants_speakers:
            self.backlog.check()
        if options.wants_speakers and self._load_speakers is not None:
            self._load_speakers()

    def accept(self, job: Job, data: bytes, wave: torch.Tensor) -> Job:
        """Store a long job and queue (or schedule) its pieces."""
        if not self.broker.recovers_here:
            return self._accept_split(job, data, wave.float().cpu())
        self.backlog.admit(job.id, job.audio_seconds)
        try:
            self.broker.create(job, data)
            try:
                self.waves.save(job.id, wave.float().cpu().numpy())
            except SenseVoiceError:
                self.broker.discard(job.id)
                raise
        except BaseException:
            self.backlog.release(job.id)
            raise
        del wave
        self.view.set_progress(job.id, "segmenting")
        self.view.remember(job)
        self._pool.submit(self._split_and_enqueue, job)
        return job

    def recover(self, job: Job) -> None:
        """A long job a previous process accepted: split it again (its pieces were in memory; the
        store's ``recover`` forgot its piece results)."""
        self.backlog.admit(job.id, job.audio_seconds, force=True)
        self._pool.submit(self._split_and_enqueue, job)

    def keep_only(self, job_ids: set[str]) -> None:
        self.waves.keep_only(job_ids)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def segmenter(self):
        with self._segmenter_lock:
            if self._segmenter is None:
                self._segmenter = self._load_segmenter()
            return self._segmenter

    def _finished(self, job_id: str) -> None:
        """A job finished: free its backlog seat and its decoded audio."""
        if self.backlog.release(job_id):
            self.waves.delete(job_id)  # pieces already queued keep their memory map

    def _pieces(self, job: Job, wave: torch.Tensor) -> list[WorkItem]:
        return split_pieces(job.id, job.lane, job.options, wave, self.segmenter(),
                            lambda f: self.view.set_progress(job.id, f"segmenting {f:.0%}"), self._load_speakers)

    def _queue_pieces(self, job: Job, items: list[WorkItem], accepted: bool = True) -> None:
        """Queue the pieces of a long job. An ``accepted`` job's pieces all go in whatever the
        queue holds (it is never dropped for back-pressure); one not yet accepted needs room for
        its first piece (a full queue refuses it)."""
        if not items:  # no speech at all: an empty transcript, not an error
            self.broker.mark_running([job.id])
            self.broker.finish(job.id, Transcript(text="", raw_text="", segments=()))
            return
        self.view.set_progress(job.id, f"segment 0 of {len(items)}")
        for n, item in enumerate(items):
            self.broker.put(item, force=accepted or n > 0)

    def _accept_split(self, job: Job, data: bytes, wave: torch.Tensor) -> Job:
        """A queue this process does not recover: split before answering, then store the job and
        queue its pieces (the split runs in the request's thread, bounded by the uploads in flight)."""
        self.broker.check_capacity()
        items = self._pieces(job, wave)
        self.broker.create(job, data)
        try:
            self._queue_pieces(job, items, accepted=False)
        except SenseVoiceError:
            self.broker.discard(job.id)
            raise
        finally:
            self.view.set_progress(job.id, None)
        return job

    def _split_and_enqueue(self, job: Job) -> None:
        """Background: VAD-split a long job and queue its pieces. The audio is memory-mapped
        from disk: pieces waiting in the queue are pages of that file."""
        try:
            samples = self.waves.load(job.id)
            if samples is None:  # recovered after a restart: decode the spooled upload again
                decoded = self.decode(self.broker.load_upload(job.id), job.options)
                self.waves.save(job.id, decoded.float().cpu().numpy())
                del decoded
                samples = self.waves.load(job.id)
            self._queue_pieces(job, self._pieces(job, torch.from_numpy(samples)))
        except Exception as e:
            logger.exception("segmenting job %s failed", job.id)
            message = f"splitting the recording failed: {e}"
            if self.broker.fail(job.id, SegmentationFailed.code, message) is not False:
                self.on_failed(job, SegmentationFailed.code)

