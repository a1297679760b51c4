"""Bounded lane queue with dynamic batch formation (Triton-style): live re-decodes first, then the
interactive and bulk job lanes.

``put`` never blocks: a full queue raises QueueFull at once. ``next_batch`` waits for a first item,
then up to ``max_wait`` for more -- but only while arrivals are dense (the previous one came less than
``max_wait`` before): a lone request on an idle server is dispatched at once, and batches still form
from bursts and from whatever queues up while the device is busy. It picks a batch around the
oldest item of the most urgent lane, preferring items of similar length to cut padding, filling spare
seats from the other lane, within ``max_batch`` items and ``max_batch_seconds`` of padded audio.

Several workers (one per GPU) may share one scheduler: a worker that waited for a batch to fill may
find the queue emptied by another and goes back to waiting (two H200 workers once woke for one item
and the loser called ``min()`` on an empty queue).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Optional, Protocol, Union

import torch

from pipeline.domain.errors import NotReady, QueueFull
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.serving.admission import BatchProfile

LIVE_RANK = -1  # live captions' re-decodes go before every job lane (they are never stored jobs)
LIVE_FINAL_RANK = -2  # a live utterance's final goes before every partial (finals are never delayed)
POSITION_TTL_S = 0.25  # the serving order that position reads use is sorted at most this often


class DeferredAudio(Protocol):
    """Audio that is read when the worker needs it (a WAV upload's spooled samples, mapped; a
    recovered job's spooled upload, decoded)."""

    def load(self) -> torch.Tensor: ...


@dataclass(eq=False)
class WorkItem:
    job_id: str
    lane: Lane
    options: TranscribeOptions
    n_samples: int  # 16 kHz samples
    audio: Union[torch.Tensor, DeferredAudio, None] = None  # the 16 kHz wave, or how to read it
    enqueued_at: float = field(default_factory=time.monotonic)
    seq: int = 0
    piece: int = 0  # index of this piece (VAD segment / channel) within a long job
    pieces: int = 1  # how many pieces the job has; 1 = the whole clip in one item
    start_s: float = 0.0  # where the piece starts in the recording, seconds
    speaker: Optional[str] = None  # channel label when a stereo call is split
    reply: Optional[Future] = None  # a live re-decode: no job in the store; the output goes here
    final: bool = False  # a live re-decode that is an utterance's final (not a partial)

    @property
    def rank(self) -> int:
        """Serving priority, lower first: live finals, live partials, then the job lanes."""
        if self.reply is None:
            return int(self.lane)
        return LIVE_FINAL_RANK if self.final else LIVE_RANK


class NoLiveServer:
    """A live lane with no server to run: the embedded broker's (its live re-decodes are put
    into this scheduler and the worker answers each future itself) and a batch run's (no live
    streams at all)."""

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


class Scheduler:
    def __init__(self, maxsize: int, max_batch: int = 64, max_wait_s: float = 0.002,
                 max_batch_seconds: float = 1200.0, retry_after_s: int = 2,
                 finals_alone: bool = False, live_gather_s: float = 0.0):
        """``finals_alone``: a batch of live finals takes nothing else (on a CPU a batch costs
        the sum of its items: a final batched with 40 partials waited for all of them; on a GPU
        they cost what the final alone costs and ride along). ``live_gather_s``: while live
        re-decodes arrive closer together than this, a batch waits for more of them up to this
        long after the oldest came (issue 38: on the H200 re-decodes ran in batches of a few,
        each holding the GPU ~5 ms where 64 took 23 ms); 0 on a CPU, where a batch costs the sum
        of its items. ``live_batches``: what the live lane's batches cost (the workers record
        them; live admission reads it)."""
        self.maxsize = maxsize
        self.live_gather_s = live_gather_s
        self.live_batches = BatchProfile(max_batch=max_batch)
        self._last_live = 0.0  # monotonic time of the latest live arrival
        self._live_gap = float("inf")  # seconds between the two latest live arrivals
        self.finals_alone = finals_alone
        self.max_batch = max_batch
        self.max_wait_s = max_wait_s
        self.max_batch_samples = int(max_batch_seconds * SAMPLE_RATE_HZ)
        self.retry_after_s = retry_after_s
        self._items: list[WorkItem] = []
        self._cond = threading.Condition()
        self._seq = 0
        self._closed = False
        self._last_put = 0.0  # monotonic time of the latest arrival
        self._gap_before_last = float("inf")  # seconds between the two latest arrivals
        # position reads: the serving order as last sorted (job -> place, first piece's), when,
        # the last seq it holds, the items of each rank then; jobs taken since (not queued)
        self._order: dict[str, int] = {}
        self._order_at = -float("inf")
        self._order_seq = 0
        self._rank_counts: list[tuple[int, int]] = []
        self._taken: set[str] = set()

    def __len__(self) -> int:
        with self._cond:
            return len(self._items)

    def queue_depth(self) -> dict[Lane, int]:
        """Items waiting per lane."""
        with self._cond:
            return {lane: sum(1 for i in self._items if i.lane == lane and i.reply is None)
                    for lane in Lane}

    def live_depth(self) -> int:
        """Live re-decodes waiting (bounded by the live streams, one each at most)."""
        with self._cond:
            return sum(1 for i in self._items if i.reply is not None)

    def check_capacity(self) -> None:
        """Raise QueueFull now if a put would be refused (a cheap answer before any work)."""
        with self._cond:
            self._check_capacity()

    def _check_capacity(self) -> None:
        if len(self._items) >= self.maxsize:
            raise QueueFull(
                f"the server is busy ({len(self._items)} jobs waiting); "
                f"try again in {self.retry_after_s} s", retry_after=self.retry_after_s)

    def put(self, item: WorkItem, force: bool = False) -> None:
        """Enqueue or raise QueueFull. ``force`` admits recovered jobs beyond the bound; live
        re-decodes are bounded by the live streams instead (one in flight per stream)."""
        with self._cond:
            if not force and item.reply is None:
                self._check_capacity()
            self._seq += 1
            item.seq = self._seq
            now = time.monotonic()
            self._gap_before_last = now - self._last_put
            self._last_put = now
            if item.reply is not None:
                self._live_gap, self._last_live = now - self._last_live, now
            self._items.append(item)
            self._taken.discard(item.job_id)  # queued again (a retry)
            self._cond.notify()

    def put_many(self, items: list[WorkItem]) -> None:
        """Enqueue items already accepted elsewhere (claimed from a shared broker, recovered):
        beyond the bound, one lock and one wake-up for all of them."""
        if not items:
            return
        with self._cond:
            now = time.monotonic()
            for item in items:
                self._seq += 1
                item.seq = self._seq
            self._gap_before_last = now - self._last_put if len(items) == 1 else 0.0
            self._last_put = now
            self._items.extend(items)
            self._taken.difference_update(i.job_id for i in items)
            self._cond.notify_all()

    def position(self, job_id: str) -> int | None:
        """1-based place in serving order (lane, then age), or None when not queued. Every poll
        of an unfinished job and every submit reads it: the order is sorted at most every
        ``POSITION_TTL_S`` (a sort of the 4,096 waiting items per read was a quarter of the
        embedded server's event loop under the H200 load), so a place may be that old; a job
        queued since the sort is placed after every item of its rank then and before it since."""
        with self._cond:
            now = time.monotonic()
            if now - self._order_at > POSITION_TTL_S:
                self._sort_order(now)
            place = self._order.get(job_id)
            if place is not None or job_id in self._taken:
                return place
            tail = []  # queued since the sort: the items are in seq order, so at the end
            for it in reversed(self._items):
                if it.seq <= self._order_seq:
                    break
                tail.append(it)
            item = next((it for it in reversed(tail) if it.job_id == job_id), None)
            if item is None:
                return None
            ahead = sum(n for rank, n in self._rank_counts if rank <= item.rank)
            return ahead + sum(1 for it in tail if (it.rank, it.seq) <= (item.rank, item.seq))

    def _sort_order(self, now: float) -> None:
        self._order, self._taken, counts = {}, set(), {}
        for n, it in enumerate(sorted(self._items, key=lambda i: (i.rank, i.seq)), 1):
            self._order.setdefault(it.job_id, n)
            counts[it.rank] = counts.get(it.rank, 0) + 1
        self._rank_counts = sorted(counts.items())
        self._order_at, self._order_seq = now, self._seq

    def _left(self, items: list[WorkItem]) -> None:
        """These items left the queue: their jobs are no longer placed (until the next sort)."""
        for it in items:
            if self._order.pop(it.job_id, None) is not None:
                self._taken.add(it.job_id)

    def remove(self, job_id: str) -> bool:
        with self._cond:
            for i, it in enumerate(self._items):
                if it.job_id == job_id:
                    del self._items[i]
                    self._left([it])
                    return True
        return False

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.drop_live(NotReady("the server is stopping"))

    def drop_live(self, error: BaseException) -> int:
        """Fail the live re-decodes still waiting (no worker will run them: the server stops, or
        its worker died); their streams report ``error``. Returns how many there were."""
        with self._cond:
            live = [i for i in self._items if i.reply is not None]
            self._items = [i for i in self._items if i.reply is None]
        for item in live:
            if not item.reply.done():
                item.reply.set_exception(error)
        return len(live)

    def next_batch(self, timeout: float) -> list[WorkItem]:
        """Block up to ``timeout`` for work; return a batch (possibly empty)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                while not self._items and not self._closed:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return []
                    self._cond.wait(left)
                if self._closed:
                    return []
                idle = len(self._items) == 1 and self._gap_before_last > self.max_wait_s
                fill_until = time.monotonic() + (0.0 if idle else self.max_wait_s)
                while 0 < len(self._items) < self.max_batch and not self._closed:
                    left = fill_until - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)  # releases the lock: other workers may take items
                self._gather_live()
                if self._items and not self._closed:
                    break
                # another worker took everything while this one waited for the batch to fill
            batch = self._select()
            chosen = set(map(id, batch))
            self._items = [i for i in self._items if id(i) not in chosen]
            self._left(batch)
            if self._items:
                self._cond.notify()  # what is left is another worker's next batch
            return batch

    def _gather_live(self) -> None:
        """Live re-decodes first in line and arriving densely: wait for more of them, up to
        ``live_gather_s`` after the oldest was queued (lock held by the caller; waiting releases it)."""
        if self.live_gather_s <= 0 or self._live_gap > self.live_gather_s:
            return
        live = [i for i in self._items if i.reply is not None]
        if not live:
            return
        until = min(i.enqueued_at for i in live) + self.live_gather_s
        while not self._closed:
            n = sum(1 for i in self._items if i.reply is not None)
            left = until - time.monotonic()
            if n == 0 or n >= self.max_batch or left <= 0:
                return
            self._cond.wait(left)

    def _select(self) -> list[WorkItem]:
        anchor = min(self._items, key=lambda i: (i.rank, i.seq))
        # same lane first, closest in length; then the other lanes' items, by lane, closest in length
        def key(i: WorkItem):
            return (i.rank != anchor.rank, i.rank, abs(i.n_samples - anchor.n_samples), i.seq)

        batch = [anchor]
        longest = anchor.n_samples
        alone = self.finals_alone and anchor.rank == LIVE_FINAL_RANK
        for it in sorted((i for i in self._items if i is not anchor), key=key):
            if alone and it.rank != LIVE_FINAL_RANK:
                break  # sorted by rank first: no more finals
            if len(batch) >= self.max_batch:
                break
            new_longest = max(longest, it.n_samples)
            if new_longest * (len(batch) + 1) > self.max_batch_samples:
                continue
            batch.append(it)
            longest = new_longest
        return batch
