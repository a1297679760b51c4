"""The embedded topology's adapter (``make run``): :class:`EmbeddedBroker`, every port of
pipeline/serving/ports.py over the SQLite job store (durable, on this host) and this process's
:class:`~pipeline.serving.scheduler.Scheduler` as the queue. Every write of every part is
published in this process (``hears_every_change``), the workers are this process's threads
(``workers_elsewhere`` False) and the queue is recovered from the store here (``recovers_here``).

The distributed topology's adapter is :class:`~pipeline.serving.broker_redis.RedisBroker`;
:func:`connect_broker` picks the one the settings name. ``tests/test_broker_contract.py`` runs one
contract per port against both.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.domain.errors import NotReady
from pipeline.domain.types import Job, Lane, TranscribeOptions
from pipeline.serving import broker_sqlite
from pipeline.serving.ports import Broker, LiveServing, LiveSubmit
from pipeline.serving.scheduler import NoLiveServer, Scheduler, WorkItem

if TYPE_CHECKING:
    import torch


class EmbeddedBroker(broker_sqlite.JobStore):
    """The SQLite job store with this process's scheduler as its queue (one process: ``make run``).

    Claims are the scheduler's batches; the live lane is its top lane with a future as the reply."""

    hears_every_change = True  # every writer is in this process
    recovers_here = True  # the queue is this process's memory, rebuilt from the store at start
    workers_elsewhere = False  # the workers are this process's threads (the pool reads them)

    def __init__(self, data_dir: str | Path, queue: Scheduler):
        super().__init__(data_dir)
        self.queue = queue

    # -- WorkQueue
    def check_capacity(self) -> None:
        self.queue.check_capacity()

    def put(self, item: WorkItem, force: bool = False) -> None:
        self.queue.put(item, force=force)

    def claim(self, consumer: str, max_items: int, block_ms: int = 0) -> list[WorkItem]:
        """The scheduler's next batch (its batching policy; at most its ``max_batch``)."""
        return self.queue.next_batch(block_ms / 1e3)[:max(max_items, 1)]

    def position(self, job_id: str) -> int | None:
        return self.queue.position(job_id)

    def queue_depth(self) -> dict[Lane, int]:
        return self.queue.queue_depth()

    def __len__(self) -> int:
        return len(self.queue)

    # -- WorkSource: the scheduler is the queue; this process's streams put into it themselves
    def serve_live(self, scheduler: Scheduler, consumer: str, *, max_waiting: int,
                   ready: Callable[[], str | None]) -> LiveServing:
        return NoLiveServer()

    def feeder(self, scheduler: Scheduler, consumer: str, prefetch: int,
               free_memory: Callable[[], float | None],
               busy_seconds: Callable[[], float] | None = None) -> None:
        """None: nothing to feed, the workers' scheduler is this queue."""
        return None

    # -- LiveLane
    def submit_live(self, item: WorkItem) -> Future:
        if item.reply is None:
            item.reply = Future()
        self.queue.put(item)
        return item.reply

    def live_lane_stats(self) -> None:
        """None: no live lane between processes to count."""
        return None

    # -- ClusterState: no worker of another process reports here
    def ping(self) -> bool:
        return True

    def live_workers(self) -> int:
        return 0

    def free_memory_ratios(self) -> list[float]:
        return []

    def busy_seconds_reader(self) -> None:
        return None

    def live_capacity_reader(self) -> None:  # the workers are this process's: the pool measures them
        return None

    def config_warnings(self) -> list[str]:
        return []

    # -- JobStore, Uploads
    async def aget(self, job_id: str) -> Job:
        return await asyncio.to_thread(self.get, job_id)

    def upload_path(self, job_id: str) -> Path | None:
        return self.spool_path(job_id)

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


def live_decode_via(lane: LiveSubmit, not_serving: Callable[[], str | None], wave: torch.Tensor,
                    options: TranscribeOptions, final: bool = False) -> Future:
    """One re-decode of a live stream's utterance (16 kHz mono) through the live lane, answered by
    whichever worker takes it (an api-only process's live captions); NotReady while this process
    cannot serve (the broker does not answer, no worker reports). ``final`` goes ahead of partials
    in the worker's queue where the lane carries it (the embedded one)."""
    reason = not_serving()
    if reason is not None:
        raise NotReady(reason)
    return lane.submit_live(WorkItem(f"live-{uuid.uuid4().hex}", Lane.INTERACTIVE, options,
                                     int(wave.shape[-1]), audio=wave, reply=Future(), final=final))
