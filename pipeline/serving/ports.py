"""The ports: small Protocols between the parts of the serving floor and the topologies that
carry jobs. This module imports no implementation (only the standard library at run time; the
types it names are imported for annotations only), so a part that needs one port depends on that
port alone, not on SQLite, Redis or torch.

=============  ===============================================================  ======================
port           what it does                                                     who uses it
=============  ===============================================================  ======================
JobStore       job records: JobReads (read, counts, the calls index: reviews and    job view, routes,
               listing; the feed of this process's writes) + JobWrites          intake, long audio
               (create, discard, running, finish, fail, purge)
JobRemoval     a finished job removed now, or kept longer, by a person          the job routes
Uploads        a job's stored upload (bytes, file, the samples of a PCM WAV)    intake, job view
WorkQueue      lanes: capacity, put, claim, position, depth, recover            intake, long audio
WorkerSink     what a worker needs to finish work (running, pieces, results)    worker
WorkSource     what a worker process's scheduler takes besides its own puts:    worker pool
               the queue's feeder, the live lane's serving end
LiveLane       a live stream's re-decode, submitted from any web process        runtime (live)
ClusterState   whether the workers run in other processes; if so, those         health, runtime
               workers alive, their free GPU memory and busy time, warnings
=============  ===============================================================  ======================

Each topology is one adapter implementing all of them (:class:`Broker`): the embedded one
(pipeline/serving/broker.py: SQLite + this process's scheduler) and the distributed one
(pipeline/serving/broker_redis.py: Redis Streams); tests/test_broker_contract.py runs one contract
class per port against both. A flag says which answer a port gives where topologies differ, so
that no caller asks "which broker is this": ``JobStore.hears_every_change`` (a waiter re-reads,
or the feed tells it), ``WorkQueue.recovers_here`` (a long upload may be split after its submit
answered) and ``ClusterState.workers_elsewhere`` (the workers are read through the store's
reports, or are this process's own).

Each port is composed of smaller ones (``JobLookup``, ``JobRecords``, ``QueueIn``, ``WorkerWatch``
...), and a part takes the composition it uses: ``Admission`` (the intake), ``LongJobs`` (long
audio), ``ViewedJobs`` (the job view), ``WorkerSink`` (a worker), ``WorkSource`` (the worker pool),
``WorkerWatch`` (health), ``LiveSubmit`` (an api process's live captions), ``CallsIndex`` (the calls
routes). tests/test_ports.py holds every port to twelve members at most and every part to using at
least 60 % of each port it takes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from pipeline.audio.wav import Pcm16Layout
    from pipeline.domain.calls import CallRow
    from pipeline.domain.review import Review
    from pipeline.domain.types import Job, Lane, Transcript
    from pipeline.serving.job_events import Feed
    from pipeline.serving.records import SegmentResult
    from pipeline.serving.scheduler import DeferredAudio, Scheduler, WorkItem

FreeMemory = Callable[[], list[float]]  # the free GPU memory shares admission looks at
Patch = Callable[["Review", "Job"], "Review"]  # (the review now, the job) -> the review to store


class Running(Protocol):
    """A thread a port hands out (a live server, a feeder), between ``start`` and ``stop``."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


class LiveServing(Running, Protocol):
    """A worker process's end of the live lane: takes live re-decodes into its scheduler (the top
    lane) and answers them, between ``start`` and ``stop``."""


class QueueFeeder(Running, Protocol):
    """Keeps a worker process's scheduler supplied from a queue that lives elsewhere; ``error``:
    its latest failure to reach that queue (None once it works again)."""

    error: BaseException | None


class CallsIndex(Protocol):
    """What the calls table and the reviewer's desk keep with each job (pipeline/serving/calls_index.py)."""

    def update_review(self, job_id: str, patch: Patch) -> tuple[Job, Review]: ...
    def rows(self, ids: list[str] | None, search: str = "") -> list[CallRow]: ...


# -- the job store, in the parts its consumers take
class JobLookup(Protocol):
    """A job as stored now, and this process's writes as they commit."""

    feed: Feed  # this process's committed writes (subscribe)
    hears_every_change: bool  # the feed hears every write (False: other processes write too; re-read)

    def get(self, job_id: str) -> Job: ...
    async def aget(self, job_id: str) -> Job: ...  # get() for the event loop


class JobCounts(Protocol):
    def counts(self) -> dict[str, int]: ...  # jobs per state


class CallsSource(Protocol):
    def calls(self) -> CallsIndex: ...  # reviews and the calls listing, kept with the jobs


@runtime_checkable
class JobReads(JobLookup, JobCounts, CallsSource, Protocol):
    """What is known about jobs, and this process's writes as they commit."""


class JobRecords(Protocol):
    """A submit's own record."""

    def create(self, job: Job, upload: bytes) -> None: ...  # durable before the submit answers
    def discard(self, job_id: str) -> None: ...  # a submit's own clean-up: nothing of it is left


class JobOutcomes(Protocol):
    """A job's way to its end: running, then done or failed, each once."""

    def mark_running(self, job_ids: Iterable[str], already_running_ok: bool = False) -> set[str]: ...
    def finish(self, job_id: str, result: Transcript) -> bool: ...  # running -> done, once
    def fail(self, job_id: str, code: str, message: str) -> bool: ...  # queued|running -> failed, once


class Retention(Protocol):
    def purge(self, finished_before: float) -> list[str]: ...  # retention: the ids deleted


@runtime_checkable
class JobRemoval(Protocol):
    """A finished job's retention changed by a person (``DELETE /api/jobs/{id}``, ``POST
    /api/jobs/{id}/keep``): removed now as retention removes it (its audio, result and review;
    the id then answers 410 as a purged one), or kept until a later time. A queued or running job
    is refused (JobUnfinished, 409); an unknown id JobNotFound, a purged one JobGone."""

    def remove(self, job_id: str) -> None: ...
    def keep(self, job_id: str, until: float) -> float: ...  # kept until max(its end, until): that


@runtime_checkable
class JobWrites(JobRecords, JobOutcomes, Retention, Protocol):
    """A job's life: queued -> running -> done | failed, every transition once."""


@runtime_checkable
class JobStore(JobReads, JobWrites, Protocol):
    """The truth about jobs (its two halves: a part that only reads takes :class:`JobReads`)."""


# -- a job's upload as stored
class UploadBytes(Protocol):
    def load_upload(self, job_id: str) -> bytes: ...


class UploadFiles(Protocol):
    def upload_path(self, job_id: str) -> Path | None: ...  # a file on this host, or None (bytes only)


class SpooledUploads(Protocol):
    """A mono 16-bit WAV upload's samples, read from the stored upload when a worker takes them."""

    spools_pcm16: bool  # a mono 16-bit WAV upload's job reads its samples from the stored upload

    def spooled_audio(self, job_id: str, layout: Pcm16Layout) -> DeferredAudio: ...  # (spools_pcm16)


@runtime_checkable
class Uploads(UploadBytes, UploadFiles, SpooledUploads, Protocol):
    """A job's upload as stored."""


# -- the work queue
class QueueIn(Protocol):
    """The api side's way into the lanes (live > interactive > bulk)."""

    recovers_here: bool  # recover() in this process queues again what it accepted (a long upload may
    #                      be split after its submit answered); False: split and queue it before

    def check_capacity(self) -> None: ...  # QueueFull now, before an upload is decoded
    def put(self, item: WorkItem, force: bool = False) -> None: ...  # force: past the bound


class QueuePlaces(Protocol):
    def position(self, job_id: str) -> int | None: ...  # 1-based among the unclaimed, or None


class QueueDepth(Protocol):
    def queue_depth(self) -> dict[Lane, int]: ...  # waiting + in flight, per lane
    def __len__(self) -> int: ...


class Claims(Protocol):
    def claim(self, consumer: str, max_items: int, block_ms: int = 0) -> list[WorkItem]: ...


class QueueRecovery(Protocol):
    def recover(self) -> list[Job]: ...  # after a restart: the accepted jobs to queue again


@runtime_checkable
class WorkQueue(QueueIn, QueuePlaces, QueueDepth, Claims, QueueRecovery, Protocol):
    """The lanes (live > interactive > bulk): the api side puts work in, a worker process claims."""


@runtime_checkable
class WorkerSink(Protocol):
    """What a worker needs to finish work (pipeline/serving/worker.py)."""

    def mark_running(self, job_ids: Iterable[str], already_running_ok: bool = False) -> set[str]: ...
    def save_segments(self, results: Iterable[SegmentResult]) -> None: ...  # a long job's pieces
    def segments(self, job_id: str) -> list[SegmentResult]: ...  # in time order
    def segment_count(self, job_id: str) -> int: ...
    def finish_many(self, results: Iterable[tuple[str, Transcript]]) -> set[str]: ...  # those written
    def fail(self, job_id: str, code: str, message: str) -> bool: ...
    def release(self, job_ids: Iterable[str]) -> None: ...
    def delete_spool(self, job_id: str) -> None: ...  # the upload, when audio goes with the job
    def get(self, job_id: str) -> Job: ...


@runtime_checkable
class WorkSource(Protocol):
    """Where a worker process's scheduler gets work besides this process's own puts."""

    def feeder(self, scheduler: Scheduler, consumer: str, prefetch: int,
               free_memory: Callable[[], float | None],
               busy_seconds: Callable[[], float] | None = None) -> QueueFeeder | None: ...
    #   claims into the scheduler in a thread of its own (None: the scheduler is the queue itself)
    def serve_live(self, scheduler: Scheduler, consumer: str, *, max_waiting: int,
                   ready: Callable[[], str | None]) -> LiveServing: ...  # other processes' streams


# -- the live lane
class LiveSubmit(Protocol):
    def submit_live(self, item: WorkItem) -> Future: ...  # the reply a future


@runtime_checkable
class LiveLane(LiveSubmit, Protocol):
    """A live stream's re-decodes, above every job lane, the reply a future."""

    def live_lane_stats(self) -> tuple[int, int, int] | None: ...  # (workers, moved, lost) or None


# -- the cluster
class WorkerWatch(Protocol):
    """Whether the workers run elsewhere, and if so whether they and the store answer (health)."""

    workers_elsewhere: bool  # they run in other processes and report through the store (else: ours)

    def ping(self) -> bool: ...  # the store answers
    def live_workers(self) -> int: ...  # worker processes that reported within the visibility time-out


class ClusterReadings(Protocol):
    """What the workers of other processes report (admission, metrics, start-up warnings)."""

    def free_memory_ratios(self) -> list[float]: ...  # their GPUs' free memory shares
    def busy_seconds_reader(self) -> Callable[[], float] | None: ...  # their model time so far
    def live_capacity_reader(self) -> object | None: ...  # their live lane's room (admission), or None
    def config_warnings(self) -> list[str]: ...  # what in the store's configuration endangers jobs


@runtime_checkable
class ClusterState(WorkerWatch, ClusterReadings, Protocol):
    """The workers as this process can know them."""


# -- what each part takes (composed from the parts above; tests/test_ports.py: each part uses
#    at least 60 % of what it takes)
class Admission(JobRecords, QueueIn, QueuePlaces, QueueRecovery, SpooledUploads, UploadBytes, Protocol):
    """The api side's way in (pipeline/serving/intake.py): a job stored and queued, its place, and
    the accepted jobs queued again after a restart."""


class LongJobs(JobRecords, JobOutcomes, QueueIn, UploadBytes, Protocol):
    """A long recording's (pipeline/serving/long_audio.py): stored, its pieces queued, an empty or
    failed split ended here."""


class ViewedJobs(JobLookup, UploadBytes, UploadFiles, QueuePlaces, Protocol):
    """What the job view reads (pipeline/serving/job_view.py): records, uploads, queue places."""


@runtime_checkable
class Broker(JobStore, JobRemoval, Uploads, WorkQueue, WorkerSink, WorkSource, LiveLane, ClusterState,
             Protocol):
    """Every port at once: what one topology's adapter implements, and what only the composition
    root (pipeline/serving/runtime.py) holds. A part takes the ports it uses, not this."""

    def close(self) -> None: ...


PORTS: tuple[type, ...] = (JobStore, JobRemoval, Uploads, WorkQueue, WorkerSink, WorkSource, LiveLane,
                           ClusterState)


def members(port: type) -> set[str]:
    """The members a port declares itself and through its bases (attributes and methods)."""
    out: set[str] = set()
    for cls in port.__mro__:
        if cls in (Protocol, object) or not getattr(cls, "_is_protocol", False):
            continue
        out |= set(getattr(cls, "__annotations__", {}))
        out |= {k for k, v in vars(cls).items() if callable(v) and (not k.startswith("_") or k == "__len__")
                and k not in ("_is_protocol",)}
    return out
