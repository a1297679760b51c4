"""One job's server-sent events shared by all its subscribers (``GET /api/jobs/{id}/events``).

Issue 19 measured the route as it was: every subscriber re-read the job, re-built its view and
re-encoded it, the final event carried the whole result (97-387 KB for a 136-min recording), and
2,400 subscribers that never read stalled the event loop 31 s when the job finished (the watchdog
then exited the process). Now:

* one :class:`Channel` per job watched in this process: a single producer task reads the job,
  builds its view and encodes the event once per change (``events.py`` gives it the function);
  each subscriber sends the same bytes object. A subscriber's per-change cost is one wake-up and
  one socket write, each its own event-loop step;
* subscribers never queue events: one that is still sending (its client reads slowly, or not at
  all) sends only the latest event when its send returns. What it holds is the socket's and the
  transport's buffers (the transport stops taking writes above its high-water mark) plus one
  event; the connection guard disconnects a client that reads nothing for its write-stall
  deadline (pipeline/web/edge.py);
* subscribers are bounded per job (``max_event_streams_per_job``: 503 ``event_streams_full``) and
  per client address over all jobs (``max_event_streams_per_client``: 429
  ``too_many_event_streams_from_client``).

Only touched on the event loop: no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from pipeline.domain.errors import ClientEventStreamLimit, EventStreamsFull

logger = logging.getLogger("sensevoice.events")

KEEPALIVE = b": keep-alive\n\n"


@dataclass(frozen=True)
class Published:
    """One encoded event of a job; ``final`` ends every subscriber's stream after it."""

    version: int
    data: bytes
    final: bool


# producer(channel): publishes the job's events until its final one (or it is cancelled)
Producer = Callable[["Channel"], Awaitable[None]]


@dataclass(eq=False)
class Channel:
    """The latest event of one job, a keep-alive tick, and the subscribers waiting for either.

    Waking many waiters at once (an ``asyncio.Event``, or as many timers due together) runs
    them all in one event-loop iteration: 1,200 subscribers made one 385 ms iteration here.
    Waiters are woken ``WAKE_BATCH`` per iteration instead, and the keep-alives are the
    channel's ticks (no timer per subscriber)."""

    job_id: str
    latest: Published | None = None
    ticks: int = 0
    last_sent: float = 0.0  # monotonic time of the last event or tick
    published_at: float = 0.0  # monotonic time of the last event
    subscribers: int = 0
    task: asyncio.Task | None = None
    _waiters: list[asyncio.Future] = field(default_factory=list)
    _wakers: set[asyncio.Task] = field(default_factory=set)

    def publish(self, data: bytes, final: bool = False) -> None:
        version = self.latest.version + 1 if self.latest else 1
        self.latest = Published(version, data, final)
        self._wake()
        self.published_at = self.last_sent

    def tick(self) -> None:
        """A keep-alive for every subscriber (a quiet stream is not closed by proxies)."""
        self.ticks += 1
        self._wake()

    def stopped(self) -> None:
        """The producer ended: wake the subscribers so that they end too."""
        self._wake()

    async def next(self) -> None:
        """Until the next event, tick or stop."""
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        await future

    def _wake(self) -> None:
        self.last_sent = time.monotonic()
        waiters, self._waiters = self._waiters, []
        if waiters:
            task = asyncio.get_running_loop().create_task(_wake_in_batches(waiters))
            self._wakers.add(task)
            task.add_done_callback(self._wakers.discard)


WAKE_BATCH = 32  # subscribers woken per event-loop iteration (~0.3 ms each on this machine)


async def _wake_in_batches(waiters: list[asyncio.Future]) -> None:
    for start in range(0, len(waiters), WAKE_BATCH):
        for future in waiters[start:start + WAKE_BATCH]:
            if not future.done():  # (a subscriber that left was cancelled)
                future.set_result(None)
        await asyncio.sleep(0)  # the woken run in the next iteration, before the next batch


class EventFanout:
    """The channels of the jobs watched in this process, and the subscriber counts."""

    def __init__(self, per_job: int, per_client: int):
        self.per_job = per_job  # 0 = no limit
        self.per_client = per_client  # 0 = no limit
        self.channels: dict[str, Channel] = {}
        self.by_client: dict[str, int] = {}

    def subscribers(self) -> int:
        return sum(c.subscribers for c in self.channels.values())

    def check(self, job_id: str, client: str | None) -> None:
        """Raise when one more subscriber of ``job_id`` from ``client`` is over a limit."""
        channel = self.channels.get(job_id)
        if self.per_job and channel is not None and channel.subscribers >= self.per_job:
            raise EventStreamsFull(f"job {job_id} already has {channel.subscribers} event streams, "
                                   "the most one job may have; poll GET /api/jobs/{id} instead")
        if self.per_client and client is not None and self.by_client.get(client, 0) >= self.per_client:
            raise ClientEventStreamLimit(
                f"client {client} already has {self.by_client[client]} event streams open, the "
                "most one client may have; close some first")

    def open(self, job_id: str, first: bytes, final: bool, producer: Producer) -> Channel:
        """The channel of ``job_id``: the one open already, else a new one that publishes
        ``first`` and (unless it is ``final``) starts ``producer``."""
        channel = self.channels.get(job_id)
        if channel is None:
            channel = self.channels[job_id] = Channel(job_id)
            channel.publish(first, final)
            if not final:
                channel.task = asyncio.create_task(self._run(channel, producer))
        return channel

    def join(self, channel: Channel, client: str | None) -> None:
        """Count one subscriber of ``channel`` for ``client`` (refused beyond a limit; a channel
        left without subscribers by the refusal is closed)."""
        try:
            self.check(channel.job_id, client)
        except (EventStreamsFull, ClientEventStreamLimit):
            if channel.subscribers <= 0:
                self._close(channel)
            raise
        channel.subscribers += 1
        if client is not None:
            self.by_client[client] = self.by_client.get(client, 0) + 1

    def leave(self, channel: Channel, client: str | None) -> None:
        channel.subscribers -= 1
        if client is not None:
            n = self.by_client.get(client, 0) - 1
            if n > 0:
                self.by_client[client] = n
            else:
                self.by_client.pop(client, None)
        if channel.subscribers <= 0:
            self._close(channel)

    def _close(self, channel: Channel) -> None:
        if self.channels.get(channel.job_id) is channel:
            del self.channels[channel.job_id]
        if channel.task is not None:
            channel.task.cancel()

    async def _run(self, channel: Channel, producer: Producer) -> None:
        try:
            await producer(channel)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("the event producer of job %s failed", channel.job_id)
        finally:
            # a later subscriber starts afresh (a new producer) instead of a channel nobody feeds
            if self.channels.get(channel.job_id) is channel and not (
                    channel.latest is not None and channel.latest.final):
                del self.channels[channel.job_id]
            channel.stopped()  # its subscribers see that it stopped


async def follow(channel: Channel, deadline: float) -> AsyncIterator[bytes]:
    """One subscriber's stream: the latest event whenever it changes (events published while
    this subscriber was still sending are skipped for the newest), the channel's keep-alive
    ticks, until the final event, the producer's end or ``deadline`` (monotonic; checked at each
    event or tick)."""
    seen = ticks = 0
    while True:
        latest = channel.latest
        if latest is not None and latest.version != seen:
            seen, ticks = latest.version, channel.ticks
            yield latest.data
            if latest.final:
                return
            continue
        if channel.ticks != ticks:
            ticks = channel.ticks
            yield KEEPALIVE
        if time.monotonic() > deadline or (channel.task is not None and channel.task.done()):
            return
        await channel.next()
