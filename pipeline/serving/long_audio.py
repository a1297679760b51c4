"""Long recordings (and split stereo calls): split by speech detection into pieces that the
workers batch like any job. Where this process recovers its queue (``WorkQueue.recovers_here``:
the embedded topology) a long upload is accepted at once (counted in the backlog, its decoded audio
left on disk) and split in the background; else it is split before the submit answers, so that no
accepted job depends on this process staying up. It uses the ports of
:class:`~pipeline.serving.ports.Admission` (JobWrites, WorkQueue, Uploads)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from pipeline.domain.errors import SegmentationFailed, SenseVoiceError
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import Job, Lane, TranscribeOptions, Transcript
from pipeline.serving.admission import Backlog
from pipeline.serving.broker_sqlite import WaveSpool
from pipeline.serving.scheduler import WorkItem

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.serving.ports import Admission
    from pipeline.serving.job_view import JobView

logger = logging.getLogger("sensevoice.long_audio")

CHANNEL_NAMES = ("left", "right")  # speaker labels of a split stereo call (e.g. agent, customer)


class LongAudio:
    def __init__(self, settings: Settings, broker: Admission, view: JobView,
                 decode: Callable[[bytes, TranscribeOptions], torch.Tensor], speech_device: str,
                 on_failed: Callable[[Job, str], None] = lambda job, code: None):
        self.settings = settings
        self.on_failed = on_failed  # (job, error code): a job this class failed (metrics)
        self.broker = broker
        self.view = view
        self.decode = decode
        self.speech_device = speech_device
        self.backlog = Backlog(settings.limits.segment_backlog_jobs, settings.limits.segment_backlog_hours * 3600)
        self.waves = WaveSpool(settings.server.data_dir / "waves")
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sensevoice-vad")
        self._segmenter = None  # silero-vad, loaded on the first long recording
        self._segmenter_lock = threading.Lock()
        view.on_finished.append(self._finished)

    def is_long(self, seconds: float, options: TranscribeOptions) -> bool:
        return seconds > self.settings.engine.segment_threshold_s or options.split_channels

    def check(self, options: TranscribeOptions) -> None:
        """A cheap early answer (BacklogFull) before a split call is decoded."""
        if options.split_channels:
            self.backlog.check()

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
                self._segmenter = load_segmenter(self.settings.engine.max_segment_s, self.speech_device)
            return self._segmenter

    def _finished(self, job_id: str) -> None:
        """A job finished: free its backlog seat and its decoded audio."""
        if self.backlog.release(job_id):
            self.waves.delete(job_id)  # pieces already queued keep their memory map

    def _pieces(self, job: Job, wave: torch.Tensor) -> list[WorkItem]:
        return split_pieces(job.id, job.lane, job.options, wave, self.segmenter(),
                            lambda f: self.view.set_progress(job.id, f"segmenting {f:.0%}"))

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


def load_segmenter(max_segment_s: float, device: str):
    """silero-vad, loaded (on the first long recording: short ones never need it)."""
    from pipeline.audio.vad import Segmenter

    return Segmenter(max_segment_s=max_segment_s, device=device).load()


def split_pieces(job_id: str, lane: Lane, options: TranscribeOptions, wave: torch.Tensor, segmenter,
                 progress: Callable[[float], None] = lambda f: None) -> list[WorkItem]:
    """VAD-split a long recording (``[n]``, or ``[channels, n]``: one speaker per channel) into
    work items in time order; ``progress`` hears the share split so far."""
    channels = [(None, wave)] if wave.dim() == 1 else \
        [(name, wave[c]) for c, name in zip(range(wave.shape[0]), CHANNEL_NAMES)]
    spans = []
    for k, (speaker, ch) in enumerate(channels):
        def on_progress(f, k=k):
            progress((k + f) / len(channels))

        spans += [(span, speaker, ch) for span in segmenter.split(ch, on_progress=on_progress)]
    spans.sort(key=lambda t: (t[0].start, t[1] or ""))
    return [WorkItem(job_id, lane, options, span.end - span.start, audio=ch[span.start:span.end],
                     piece=n, pieces=len(spans), start_s=span.start / SAMPLE_RATE_HZ,
                     speaker=speaker)
            for n, (span, speaker, ch) in enumerate(spans)]
