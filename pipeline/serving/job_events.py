"""Job change notices: what a broker publishes after a write, and the fan-out to the coroutines
that stream a job.

:class:`Feed` is the broker's side: after a write commits (a job starts running, advances, finishes
or fails), the broker publishes a :class:`JobEvent` to its subscribers, in the writer's thread. The
worker writes the broker and knows no one else (it takes no callbacks from its owner); whoever
keeps state about jobs (the service's snapshots, its backlog, waiters) subscribes to the broker.
A broker publishes the writes of its own process: in the distributed topology the api processes
read the other processes' writes from Redis.

The service's threads (workers, the splitter, the start-up thread) call :meth:`JobChanges.notify`
when a job's state, queue position or progress changes; a coroutine on the event loop that streams
a job to a browser (pipeline/web/routes/events.py) holds a :class:`Watch` of it and wakes at once,
so a result reaches the page without a poll interval. Notices carry nothing: the watcher reads the
job again (the store, or the service's in-memory snapshot, stays the one source of truth).

A notice sent while nobody watches costs one dictionary look-up under a lock. A watch that misses
nothing: take it, then read the job, then wait; a notice that came in between is kept (an
``asyncio.Event`` stays set until the watcher clears it before its next read).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.domain.types import JobState, Transcript

logger = logging.getLogger("sensevoice.events")


@dataclass(frozen=True)
class JobEvent:
    """A committed change of one job: its new state, or (``state`` None) its progress text. The
    embedded store adds what it wrote (``at``: started_at of RUNNING, finished_at of DONE; the
    DONE result), so that the service's snapshot of the job need not read it back."""

    job_id: str
    state: JobState | None
    progress: str | None = None
    at: float | None = None
    result: Transcript | None = None


class Feed:
    """A broker's publisher. Subscribers run in the writing thread: they must be quick and must not
    raise (one that does is logged and the others still run)."""

    def __init__(self):
        self._subscribers: list[Callable[[JobEvent], None]] = []

    def subscribe(self, fn: Callable[[JobEvent], None]) -> None:
        self._subscribers.append(fn)

    def on_finished(self, fn: Callable[[str], None]) -> None:
        """Subscribe ``fn(job_id)`` to the jobs that finish (done or failed)."""
        self.subscribe(lambda e: fn(e.job_id) if e.state in (JobState.DONE, JobState.FAILED) else None)

    def publish(self, events: list[JobEvent]) -> None:
        for fn in self._subscribers:
            for event in events:
                try:
                    fn(event)
                except Exception:
                    logger.exception("a subscriber failed on %s", event)


class Watch:
    """One coroutine's interest in one job. Use as a context manager (or call :meth:`close`)."""

    __slots__ = ("hub", "job_id", "loop", "event")

    def __init__(self, hub: JobChanges, job_id: str):
        self.hub = hub
        self.job_id = job_id
        self.loop = asyncio.get_running_loop()
        self.event = asyncio.Event()

    def clear(self) -> None:
        """Forget notices so far: call right before reading the job."""
        self.event.clear()

    async def wait(self, timeout: float | None) -> bool:
        """Until a notice (True) or ``timeout`` seconds (False)."""
        try:
            async with asyncio.timeout(timeout):
                await self.event.wait()
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.hub._drop(self)

    def __enter__(self) -> Watch:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class JobChanges:
    """Thread-safe fan-out of "job X changed" to the event loops that watch X."""

    def __init__(self):
        self._lock = threading.Lock()
        self._watches: dict[str, set[Watch]] = {}

    def watch(self, job_id: str) -> Watch:
        """Start watching ``job_id`` (from a coroutine: the watch wakes on the running loop)."""
        w = Watch(self, job_id)
        with self._lock:
            self._watches.setdefault(job_id, set()).add(w)
        return w

    def notify(self, job_id: str) -> None:
        """``job_id`` changed (any thread)."""
        with self._lock:
            targets = list(self._watches.get(job_id, ()))
        for w in targets:
            _wake(w)

    def notify_all(self) -> None:
        """Something every watcher may show changed (the model loaded, or failed to)."""
        with self._lock:
            targets = [w for ws in self._watches.values() for w in ws]
        for w in targets:
            _wake(w)

    def watching(self) -> int:
        """How many watches are open (for tests and metrics)."""
        with self._lock:
            return sum(len(ws) for ws in self._watches.values())

    def _drop(self, w: Watch) -> None:
        with self._lock:
            ws = self._watches.get(w.job_id)
            if ws is not None:
                ws.discard(w)
                if not ws:
                    del self._watches[w.job_id]


def _wake(w: Watch) -> None:
    try:
        w.loop.call_soon_threadsafe(w.event.set)
    except RuntimeError:  # its loop has closed: the watcher is gone
        w.close()
