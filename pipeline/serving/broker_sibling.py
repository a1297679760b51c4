"""The embedded store as a sibling web process sees it (``--web-processes``): the owner process
writes what changes, this one reads SQLite to see it (``hears_every_change`` False).

A submit is decoded and its upload spooled here; the job's row and its work item go to the owner in
one message (:class:`~pipeline.serving.sibling_hub.SiblingHub`), which inserts the row and queues the
item, or refuses both (a full queue: 503, the spool file removed). The spool file's fsync runs here
while the owner commits the row (both done before the submit answers; the row records the upload's
size, so that recovery fails a job whose file a power cut left short). Polls of a finished job are
answered from the body the owner sent as it finished (``HubClient.on_bodies``: the web layer's
cache, dropped again at purge through ``on_forget``); other polls read the job from SQLite here
(WAL: never waiting on the writer) and ask the owner only for a queued job's place in its queue."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import replace
from pathlib import Path

from pipeline.domain.errors import BrokerUnavailable, NotReady, QueueFull
from pipeline.domain.types import Job, JobState, Lane, Transcript
from pipeline.serving import sibling_wire as wire
from pipeline.serving.broker_sqlite import JobStore, UnsyncedSpool
from pipeline.serving.scheduler import WorkItem

logger = logging.getLogger("sensevoice.siblings")

STATE_TTL_S = 0.1  # the owner's queue and health, as admission and probes read them, this fresh
PLACED_KEPT = 1024  # submit answers' places kept until read (a long recording's is never read)
CALL_TIMEOUT_S = 60.0  # a request the owner has not answered in this long fails (503)


class HubClient:
    """One connection to the owner's hub, shared by this process's threads: requests carry ids,
    a reader thread hands each reply to its caller. A lost connection fails every waiting call
    with BrokerUnavailable and calls ``on_lost`` (the sibling then stops: the owner is gone).
    OSError when no owner listens on ``path``; AuthenticationError when it does not know ``secret``."""

    def __init__(self, path: str, secret: str, on_lost=None):
        self.on_lost = on_lost
        # what the owner sends unasked (SiblingHub._push): finished jobs' bodies, purged jobs
        self.on_bodies: Callable[[list[tuple[str, bytes]]], None] | None = None
        self.on_forget: Callable[[list[str]], None] | None = None
        self._wire = wire.Wire.connect(path, secret)
        self._ids = itertools.count(1)
        self._waiting: dict[int, Future] = {}
        self._lock = threading.Lock()
        self._closed = False
        self._reader = threading.Thread(target=self._read, name="sensevoice-hub-client", daemon=True)
        self._reader.start()

    def call(self, op: str, payload: bytes | memoryview = b"", **fields):
        return self.begin(op, payload, **fields)()

    def begin(self, op: str, payload: bytes | memoryview = b"", **fields) -> Callable[[], object]:
        """Send a request now; the function returned waits for its answer (what ``call``
        returns or raises), so that the caller can do something else meanwhile."""
        rid = next(self._ids)
        fut: Future = Future()
        with self._lock:
            if self._closed:
                raise BrokerUnavailable("the server's main process does not answer; try again")
            self._waiting[rid] = fut

        def forget() -> None:
            with self._lock:
                self._waiting.pop(rid, None)

        try:
            self._wire.send({"op": op, "rid": rid, **fields}, payload)
        except OSError as e:
            forget()
            raise _unavailable(e) from None

        def answer():
            try:
                reply = fut.result(CALL_TIMEOUT_S)
            except (OSError, TimeoutError) as e:
                raise _unavailable(e) from None
            finally:
                forget()
            if "error" in reply:
                raise wire.error_from_head(reply["error"])
            return reply.get("ok")
        return answer

    def _read(self) -> None:
        try:
            while True:
                head, payload = self._wire.recv()
                replies = head.get("replies")
                if replies is None:
                    self._pushed(head, payload)
                    continue
                for reply in replies:
                    with self._lock:
                        fut = self._waiting.get(reply.get("rid"))
                    if fut is not None and not fut.done():
                        fut.set_result(reply)
        except wire.WireClosed:
            pass
        except Exception:  # a pushed message this side cannot take: what it caches could be wrong
            logger.exception("a message from the server's main process could not be taken")
        with self._lock:
            was_open, self._closed = not self._closed, True
            waiting = list(self._waiting.values())
        for fut in waiting:
            if not fut.done():
                fut.set_exception(OSError("the hub connection closed"))
        if was_open and self.on_lost is not None:
            self.on_lost()

    def _pushed(self, head: dict, payload: bytes) -> None:
        op = head.get("op")
        if op == "bodies" and self.on_bodies is not None:
            self.on_bodies(wire.pushed_bodies(head, payload))
        elif op == "forget" and self.on_forget is not None:
            self.on_forget([str(x) for x in head["ids"]])

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._wire.close()


def _unavailable(e: BaseException) -> BrokerUnavailable:
    return BrokerUnavailable(f"the server's main process does not answer ({type(e).__name__}); try again")


class SiblingBroker(JobStore):
    """A sibling web process's broker: reads from the store, writes through the owner. Of the
    ports (pipeline/serving/ports.py) it implements JobStore, Uploads, LiveLane (which refuses:
    live captions are the owner's) and ClusterState; not WorkQueue (no ``claim``: it only puts,
    through the owner) nor WorkSource (no worker here)."""

    hears_every_change = False  # the owner writes: a change is seen by reading SQLite again
    recovers_here = False  # the queue is the owner's: a long upload is queued whole before it answers
    workers_elsewhere = True  # the workers are the owner's, read through its state

    def __init__(self, data_dir: str | Path, hub_path: str, secret: str, on_lost=None):
        super().__init__(data_dir, owner=False)
        self.hub = HubClient(hub_path, secret, on_lost)
        self._pending: dict[str, tuple[Job, UnsyncedSpool]] = {}  # the row goes with the first item
        self._pending_lock = threading.Lock()
        self._state: tuple[float, dict] = (0.0, {})
        self._placed: dict[str, int | None] = {}  # a submit's place as the owner answered it

    # -- accept
    def create(self, job: Job, upload: bytes) -> None:
        spooled = self.spool_unsynced(job.id, upload)  # synced while the owner commits the row
        with self._pending_lock:
            self._pending[job.id] = (job, spooled)

    def _take_pending(self, job_id: str) -> tuple[Job, UnsyncedSpool] | None:
        with self._pending_lock:
            return self._pending.pop(job_id, None)

    def put(self, item: WorkItem, force: bool = False) -> None:
        """A new job's first item: its row and item to the owner, the spool file's fsync here
        meanwhile, then the owner's answer; the submit answers once both are done. A failed fsync
        fails the submit after the owner took it (the intake's discard then deletes row and file)."""
        pending = self._take_pending(item.job_id)
        if pending is None:
            self.hub.call("put", wire.item_audio(item), item=wire.item_head(item), force=force)
            return
        job, spooled = pending
        try:
            answer = self.hub.begin("submit", wire.item_audio(item), job=wire.job_head(job),
                                    item=wire.item_head(item), force=force, upload_bytes=spooled.size)
        except BaseException:
            spooled.close()
            with self._pending_lock:  # never sent: the caller discards it (the spool file goes)
                self._pending[job.id] = pending
            raise
        synced: BaseException | None = None
        try:
            spooled.sync()
        except BaseException as e:  # (raised once the owner has answered)
            synced = e
        try:
            placed = answer()
        except BaseException:
            with self._pending_lock:  # refused: the owner removed row and file; the discard is local
                self._pending[job.id] = pending
            raise
        if synced is not None:
            raise synced  # the owner took it: the caller's discard removes row and file there
        with self._pending_lock:  # read once, by the submit's answer (position)
            self._placed[job.id] = placed["position"]
            if len(self._placed) > PLACED_KEPT:  # (a long job's submit reads none)
                self._placed.pop(next(iter(self._placed)))

    def _flush(self, job_id: str) -> None:
        pending = self._take_pending(job_id)
        if pending is not None:
            job, spooled = pending
            spooled.sync()
            self.hub.call("insert", job=wire.job_head(job), upload_bytes=spooled.size)

    def discard(self, job_id: str) -> None:
        pending = self._take_pending(job_id)
        if pending is not None:
            pending[1].close()
            self.delete_spool(job_id)  # never sent: the owner has no row of it
        else:
            self.hub.call("discard", job_id=job_id)

    def check_capacity(self) -> None:
        """The owner answers a full queue at the submit itself; this is the early answer from its
        last reported state (before decoding)."""
        if self._owner_state().get("full"):
            raise QueueFull("the queue is full; try again shortly")

    def mark_running(self, job_ids, already_running_ok: bool = False) -> set[str]:
        """Only a long recording without speech is marked here, just before its empty result."""
        ids = list(job_ids)
        for job_id in ids:
            self._flush(job_id)
        return set(ids)

    def finish(self, job_id: str, result: Transcript) -> bool:
        if result.segments or result.raw_text:
            raise NotImplementedError("a sibling web process finishes no transcribed job")
        return bool(self.hub.call("finish_empty", job_id=job_id)["finished"])

    def submit_live(self, item: WorkItem) -> Future:
        raise NotReady("live captions are served by the server's main process")

    # -- read
    def get(self, job_id: str) -> Job:
        job = super().get(job_id)
        if job.state is JobState.QUEUED:
            return replace(job, position=self.position(job_id))
        return job

    async def aget(self, job_id: str) -> Job:
        return await asyncio.to_thread(self.get, job_id)

    def position(self, job_id: str) -> int | None:
        with self._pending_lock:
            if job_id in self._placed:
                return self._placed.pop(job_id)
        try:
            return self.hub.call("position", job_id=job_id)["position"]
        except BrokerUnavailable:
            return None

    def upload_path(self, job_id: str) -> Path | None:
        return self.spool_path(job_id)

    def _owner_state(self) -> dict:
        at, state = self._state
        now = time.monotonic()
        if now - at > STATE_TTL_S:
            try:
                state = self.hub.call("state")
            except BrokerUnavailable:
                state = {}
            self._state = (now, state)
        return state

    def queue_depth(self) -> dict[Lane, int]:
        return {Lane(int(k)): v for k, v in self._owner_state().get("lanes", {}).items()}

    def __len__(self) -> int:
        return int(self._owner_state().get("depth", 0))

    def free_memory_ratios(self) -> list[float]:
        return list(self._owner_state().get("free", []))

    def live_workers(self) -> int:
        return 1 if self._owner_state().get("serving") else 0

    def live_lane_stats(self):
        return None

    def busy_seconds_reader(self):
        return lambda: 0.0

    def live_capacity_reader(self) -> None:  # live streams are the owner's (relayed to it)
        return None

    def config_warnings(self) -> list[str]:
        return []

    def ping(self) -> bool:
        return bool(self._owner_state())

    # -- keep: the owner recovers the queue and keeps retention
    def recover(self) -> list[Job]:
        return []

    def purge(self, finished_before: float) -> list[str]:
        return []

    def close(self) -> None:
        self.hub.close()
        super().close()


def stop_self() -> None:
    """The owner is gone: stop this sibling as SIGTERM would (uvicorn's graceful shutdown)."""
    import signal

    logger.warning("the server's main process is gone: this web process stops")
    os.kill(os.getpid(), signal.SIGTERM)
