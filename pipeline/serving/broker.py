"""The broker: the one contract between the api side (which accepts jobs) and the workers (which
run them). Two implementations:

* :class:`EmbeddedBroker` -- ``make run``'s: the SQLite job store (durable, on this host) and this
  process's :class:`~pipeline.serving.scheduler.Scheduler` as the queue; every write of every part
  is published in this process (``shared`` is False).
* :class:`~pipeline.serving.broker_redis.RedisBroker` -- the distributed topology's: job records,
  results and lane queues (Redis Streams) that any api or worker process reads (``shared`` True:
  a change made by another process is seen by reading the broker, not by an event here).

``tests/test_broker_contract.py`` runs one suite against both.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch

from pipeline.audio.wav import Pcm16Layout
from pipeline.domain.errors import NotReady
from pipeline.domain.types import Job, Lane, TranscribeOptions, Transcript
from pipeline.serving.broker_sqlite import JobStore
from pipeline.serving.job_events import Feed
from pipeline.serving.records import SegmentResult
from pipeline.serving.scheduler import DeferredAudio, NoLiveServer, Scheduler, WorkItem


class LiveServing(Protocol):
    """A worker process's end of the live lane: takes live re-decodes into its scheduler (the top
    lane) and answers them, between ``start`` and ``stop``."""

    def start(self) -> None: ...
    def stop(self) -> None: ...


@runtime_checkable
class Broker(Protocol):
    """Submit, claim, finish, fail, get, subscribe -- and the live lane: ``submit_live`` on the
    side of the stream (any api process), ``serve_live`` on the side of the model (each worker
    process), the reply a future."""

    shared: bool  # other processes read and write it too (no local event for their changes)
    feed: Feed  # this process's committed writes (subscribe)
    spools_pcm16: bool  # a mono 16-bit WAV upload's job reads its samples from the stored upload

    # -- accept (api side)
    def create(self, job: Job, upload: bytes) -> None: ...
    def discard(self, job_id: str) -> None: ...
    def check_capacity(self) -> None: ...
    def put(self, item: WorkItem, force: bool = False) -> None: ...
    def submit_live(self, item: WorkItem) -> Future: ...  # the live lane: the reply is the future

    # -- run (worker side)
    def claim(self, consumer: str, max_items: int, block_ms: int = 0) -> list[WorkItem]: ...
    def mark_running(self, job_ids: Iterable[str], already_running_ok: bool = False) -> set[str]: ...
    def save_segments(self, results: Iterable[SegmentResult]) -> None: ...
    def segments(self, job_id: str) -> list[SegmentResult]: ...
    def segment_count(self, job_id: str) -> int: ...
    def clear_segments(self, job_id: str) -> None: ...
    def finish(self, job_id: str, result: Transcript) -> bool: ...
    def finish_many(self, results: Iterable[tuple[str, Transcript]]) -> set[str]: ...
    def fail(self, job_id: str, code: str, message: str) -> bool: ...
    def release(self, job_ids: Iterable[str]) -> None: ...
    def requeue(self, job_id: str) -> bool: ...
    def delete_spool(self, job_id: str) -> None: ...
    def serve_live(self, scheduler: Scheduler, consumer: str, *, max_waiting: int,
                   ready: Callable[[], str | None]) -> LiveServing: ...

    # -- read
    def get(self, job_id: str) -> Job: ...
    async def aget(self, job_id: str) -> Job: ...
    def position(self, job_id: str) -> int | None: ...
    def load_upload(self, job_id: str) -> bytes: ...
    def upload_path(self, job_id: str) -> Path | None: ...
    def spooled_audio(self, job_id: str, layout: Pcm16Layout) -> DeferredAudio: ...  # (spools_pcm16)
    def counts(self) -> dict[str, int]: ...
    def queue_depth(self) -> dict[Lane, int]: ...
    def __len__(self) -> int: ...

    # -- keep
    def recover(self) -> list[Job]: ...
    def purge(self, finished_before: float) -> list[str]: ...
    def ping(self) -> bool: ...
    def close(self) -> None: ...


class EmbeddedBroker(JobStore):
    """The SQLite job store with this process's scheduler as its queue (one process: ``make run``).

    Claims are the scheduler's batches; the live lane is its top lane with a future as the reply."""

    shared = False

    def __init__(self, data_dir: str | Path, queue: Scheduler):
        super().__init__(data_dir)
        self.queue = queue

    # -- the queue
    def check_capacity(self) -> None:
        self.queue.check_capacity()

    def put(self, item: WorkItem, force: bool = False) -> None:
        self.queue.put(item, force=force)

    def submit_live(self, item: WorkItem) -> Future:
        if item.reply is None:
            item.reply = Future()
        self.queue.put(item)
        return item.reply

    def serve_live(self, scheduler: Scheduler, consumer: str, *, max_waiting: int,
                   ready: Callable[[], str | None]) -> LiveServing:
        return NoLiveServer()

    def claim(self, consumer: str, max_items: int, block_ms: int = 0) -> list[WorkItem]:
        """The scheduler's next batch (its batching policy; at most its ``max_batch``)."""
        return self.queue.next_batch(block_ms / 1e3)[:max(max_items, 1)]

    def position(self, job_id: str) -> int | None:
        return self.queue.position(job_id)

    def queue_depth(self) -> dict[Lane, int]:
        return self.queue.queue_depth()

    def __len__(self) -> int:
        return len(self.queue)

    # -- reads
    async def aget(self, job_id: str) -> Job:
        return await asyncio.to_thread(self.get, job_id)

    def upload_path(self, job_id: str) -> Path | None:
        return self.spool_path(job_id)

    # -- keep
    def ping(self) -> bool:
        return True

    def close(self) -> None:
        self.queue.close()


def connect_broker(settings, queue: Scheduler) -> Broker:
    """The broker the settings name: Redis (``settings.broker.url``) or the embedded one."""
    if not settings.broker.url:
        return EmbeddedBroker(settings.server.data_dir, queue)
    from pipeline.serving.broker_redis import RedisBroker

    return RedisBroker(settings.broker.url, settings.limits.retention_hours * 3600, settings.limits.queue_size,
                       settings.broker.visibility_timeout_s, retry_after_s=settings.limits.retry_after_s,
                       shared_dir=settings.broker.shared_dir or None,
                       live_lost_after_s=settings.broker.live_lost_after_s)


def live_decode_via(broker: Broker, not_serving: Callable[[], str | None], wave: torch.Tensor,
                    options: TranscribeOptions, final: bool = False) -> Future:
    """One re-decode of a live stream's utterance (16 kHz mono) through the broker's live lane,
    answered by whichever worker takes it (an api-only process's live captions); NotReady while
    this process cannot serve (the broker does not answer, no worker reports). ``final`` goes
    ahead of partials in the worker's queue where the broker carries it (the embedded one)."""
    reason = not_serving()
    if reason is not None:
        raise NotReady(reason)
    return broker.submit_live(WorkItem(f"live-{uuid.uuid4().hex}", Lane.INTERACTIVE, options,
                                       int(wave.shape[-1]), audio=wave, reply=Future(), final=final))


FreeMemory = Callable[[], list[float]]
