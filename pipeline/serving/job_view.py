"""What the api side knows about jobs: one snapshot per recent job kept from the store's events, so
that polls on the event loop never touch the disk (when this process hears every write: the
embedded topology), or a read of the store (when other processes write it: Redis). It also wakes
whoever waits for a job (``wait``, the event streams through ``changes``). It reads the ports of
:class:`~pipeline.serving.ports.ViewedJobs` (JobReads, Uploads, the queue's positions)."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.domain.errors import SenseVoiceError
from pipeline.domain.types import Job, JobState
from pipeline.serving.job_events import JobChanges, JobEvent

if TYPE_CHECKING:
    from pipeline.serving.ports import ViewedJobs

logger = logging.getLogger("sensevoice.jobs")

RECENT_JOBS = 20_000  # job snapshots kept in memory so that polls never touch the disk
LOCAL_REREAD_S = 0.5  # s: a waiter re-reads its job this often when this process sees every change
SHARED_REREAD_S = 0.02  # s: ... and this often when other processes finish jobs (no event here)


class JobView:
    def __init__(self, broker: ViewedJobs):
        self.broker = broker
        self.changes = JobChanges()  # wakes whoever streams a job (state, progress, model state)
        self.on_finished: list[Callable[[str], None]] = []  # e.g. the long-audio backlog's seats
        self._done = threading.Condition()
        self._recent: OrderedDict[str, Job] = OrderedDict()  # id -> latest snapshot (bounded)
        self._recent_lock = threading.Lock()
        self._progress: dict[str, str] = {}  # job id -> "segmenting 40%" / "segment 12 of 90"
        broker.feed.subscribe(self._on_event)  # what this process's parts wrote

    @property
    def hears_every_change(self) -> bool:
        """Every change of a job is heard here (else: re-read the store, other processes write it)."""
        return self.broker.hears_every_change

    @property
    def reread_s(self) -> float:
        """How often a waiter must read the store itself (often when it hears only this process's writes)."""
        return LOCAL_REREAD_S if self.hears_every_change else SHARED_REREAD_S

    # ------------------------------------------------------------------ reads
    def get(self, job_id: str) -> Job:
        return self._with_live_fields(self.broker.get(job_id))

    def get_cached(self, job_id: str) -> Job | None:
        """The job from memory, without I/O (for polling on the event loop); None if not cached
        (always, when other processes write the store: one may have changed it)."""
        if not self.hears_every_change:
            return None
        with self._recent_lock:
            job = self._recent.get(job_id)
        return None if job is None else self._with_live_fields(job)

    async def poll(self, job_id: str) -> Job | None:
        """A poll on the event loop: the in-memory snapshot, or the broker read with its asyncio
        client (other processes write the store); None when only the route can answer (not cached,
        or an error)."""
        if self.hears_every_change:
            return self.get_cached(job_id)
        try:
            return await self.broker.aget(job_id)
        except SenseVoiceError:
            return None

    def wait(self, job_id: str, timeout: float = 60.0) -> Job:
        deadline = time.monotonic() + timeout
        with self._done:
            while True:
                job = self.get(job_id)
                left = deadline - time.monotonic()
                if job.state in (JobState.DONE, JobState.FAILED) or left <= 0:
                    return job
                self._done.wait(min(left, self.reread_s))

    def upload(self, job_id: str) -> Path | bytes:
        """A job's upload as stored: a file on this host (embedded), else its bytes (Redis)."""
        path = self.broker.upload_path(job_id)
        return path if path is not None else self.broker.load_upload(job_id)

    def masked_upload(self, job: Job, max_seconds: float, max_bytes: int | None = None) -> bytes:
        """The recording of a ``redact_audio`` job as a WAV with its masked items' spans silenced
        or bleeped (pipeline/audio/redact_audio.py); only once its result says where they are."""
        from pipeline.audio.redact_audio import redacted_recording
        from pipeline.domain.errors import AudioGone, ResultNotReady
        from pipeline.domain.redaction import redactions_of

        if job.result is None:
            raise ResultNotReady(f"job {job.id} is {job.state.value}: its recording is served with "
                                 "the personal data masked once the job is done")
        source = self.upload(job.id)
        if not isinstance(source, bytes) and not source.exists():
            raise AudioGone(f"the audio of job {job.id} is no longer kept")
        spans = [(r.start, r.end) for r in redactions_of(job.result)
                 if r.start is not None and r.end is not None]
        return redacted_recording(source if isinstance(source, bytes) else str(source), spans,
                                  job.options.redact_audio, max_seconds=max_seconds,
                                  max_bytes=max_bytes)

    def progress(self, job_id: str) -> str | None:
        return self._progress.get(job_id)

    def _with_live_fields(self, job: Job) -> Job:
        """Add what only memory knows about an unfinished job: its place in the queue, progress
        (records other processes write carry both already)."""
        if not self.hears_every_change or job.state not in (JobState.QUEUED, JobState.RUNNING):
            return job
        return replace(job, position=self.broker.position(job.id),
                       meta={**job.meta, "progress": self._progress.get(job.id)})

    # ------------------------------------------------------------------ writes (this process)
    def remember(self, job: Job) -> None:
        with self._recent_lock:
            self._recent[job.id] = job
            self._recent.move_to_end(job.id)
            while len(self._recent) > RECENT_JOBS:
                self._recent.popitem(last=False)

    def set_progress(self, job_id: str, text: str | None) -> None:
        if text is None:
            self._progress.pop(job_id, None)
        else:
            self._progress[job_id] = text
        self.changes.notify(job_id)

    def forget(self, job_ids: Iterable[str]) -> None:
        """Purged jobs: drop their snapshots (polls take this lock on the event loop: no I/O here)."""
        with self._recent_lock:
            for jid in job_ids:
                self._recent.pop(jid, None)

    # ------------------------------------------------------------------ the broker's events
    def _on_event(self, event: JobEvent) -> None:
        """A committed change (in the writer's thread: a worker, the splitter, a request): keep the
        snapshot that polls read, wake waiters."""
        if event.state is JobState.RUNNING:
            self._mark_running(event.job_id, event.at)
        elif event.state in (JobState.DONE, JobState.FAILED):
            self._finished(event)
        elif event.progress is not None:
            self._progress[event.job_id] = event.progress
            self.changes.notify(event.job_id)

    def _finished(self, event: JobEvent) -> None:
        job_id = event.job_id
        self._progress.pop(job_id, None)
        for fn in self.on_finished:
            fn(job_id)
        with self._recent_lock:
            known = self._recent.get(job_id)
        if event.result is not None and known is not None:  # what the store wrote, not read back
            self.remember(replace(known, state=JobState.DONE, result=event.result,
                                  finished_at=event.at, error=None))
        else:
            try:
                self.remember(self.broker.get(job_id))
            except SenseVoiceError:
                pass
        with self._done:
            self._done.notify_all()
        self.changes.notify(job_id)

    def _mark_running(self, job_id: str, at: float | None = None) -> None:
        with self._recent_lock:
            job = self._recent.get(job_id)
            if job is not None:
                self._recent[job_id] = replace(job, state=JobState.RUNNING, started_at=at or time.time(),
                                               attempts=job.attempts + 1)
        self.changes.notify(job_id)
