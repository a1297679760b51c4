"""Whether this process serves, and why not: the start-up state, a failed or hung worker, a
frozen event loop, an unreachable broker, no worker anywhere (an api-only process). The
:class:`Janitor` thread watches these every second, runs retention, and ends the process when it
cannot recover by itself (the supervisor restarts it; the broker keeps every accepted job)."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable

from pipeline.config import Settings
from pipeline.domain.errors import NotReady, SenseVoiceError
from pipeline.serving.ports import WorkerWatch
from pipeline.serving.worker_pool import WorkerPool

logger = logging.getLogger("sensevoice.health")

JANITOR_PERIOD_S = 5.0  # how often retention runs
JANITOR_TICK_S = 1.0  # how often the watchdog and the broker watch run
LOOP_BEAT_S = 1.0  # how often the event loop proves it answers
FATAL_EXIT_CODE = 3  # process exit status after a fatal device error or a hung worker


class Health:
    def __init__(self, settings: Settings, broker: WorkerWatch, pool: WorkerPool | None,
                 on_change: Callable[[], None] = lambda: None):
        self.settings = settings
        self.broker = broker
        self.pool = pool
        self.on_change = on_change  # pages that follow a job hear of a state change
        self.state = "starting"  # starting -> loading -> ready | failed
        self.error: str | None = None
        self.broker_error: str | None = None  # the latest failure of a broker that workers report through
        self.no_worker: str | None = None  # api-only process: why no worker serves, or None
        self.loop_heartbeat: float | None = None  # monotonic; set by the event loop once it runs
        self.on_loop_lag: Callable[[float], None] = lambda seconds: None  # how late a beat woke

    def set_state(self, state: str, error: str | None = None) -> None:
        self.state = state
        if error is not None:
            self.error = error
        self.on_change()

    @property
    def ready(self) -> bool:
        if self.state != "ready" or (self.pool is not None and not self.pool.workers):
            return False
        return self.unhealthy_reason() is None and self.unready_reason() is None

    def failure(self) -> str | None:
        """Why no work can be taken at all (a failed start or a fatal device error), or None."""
        return self.error if self.state == "failed" else None

    def not_serving(self) -> str | None:
        """Why a request for the model cannot be served now, in words for the user, or None."""
        if self.state in ("starting", "loading"):
            return "the model is still loading; try again in a few seconds"
        if not self.ready:
            return f"the service is not available: {self.error or 'unhealthy'}"
        return None

    def unready_reason(self) -> str | None:
        """Why the service cannot serve right now for a reason that passes by itself (the broker
        is unreachable), or None. Unlike :meth:`unhealthy_reason` this never ends the process."""
        if self.broker_error:
            return self.broker_error
        if self.no_worker:
            return self.no_worker
        return self.pool.unready_reason() if self.pool is not None else None

    def unhealthy_reason(self) -> str | None:
        """Why the service cannot serve (a frozen loop, a dead, failed or hung worker), or None."""
        now = time.monotonic()
        beat = self.loop_heartbeat
        if beat is not None and now - beat > self.settings.server.loop_stall_timeout_s:
            return (f"the event loop has not answered for {now - beat:.0f} s (a request blocks it); "
                    "nothing is served")
        return self.pool.unhealthy_reason() if self.pool is not None else None

    async def beat_event_loop(self) -> None:
        """Runs on the server's event loop: proves every second that the loop still answers (a
        request that blocks it -- e.g. a read of /dev/zero -- froze healthz, polls and SIGTERM)."""
        while True:
            self.loop_heartbeat = time.monotonic()
            await asyncio.sleep(LOOP_BEAT_S)
            self.on_loop_lag(time.monotonic() - self.loop_heartbeat - LOOP_BEAT_S)

    def check_broker(self) -> None:
        """Where the workers run in other processes (``ClusterState.workers_elsewhere``): note
        whether the broker they report through answers (readyz says 503 while it does not), and in
        an api-only process whether any worker has reported within the visibility time-out (readyz
        says 503 no_worker while none has: its submits would only wait)."""
        if not self.broker.workers_elsewhere:
            return
        if self.broker.ping():
            if self.broker_error:
                logger.info("the broker answers again")
            self.broker_error = None
        else:
            if not self.broker_error:
                logger.warning("the broker does not answer")
            self.broker_error = "the broker (redis) does not answer"
            return
        if self.pool is None:
            self._check_workers()

    def _check_workers(self) -> None:
        try:
            alive = self.broker.live_workers()
        except SenseVoiceError:
            return  # the broker watch reports it
        if alive:
            if self.no_worker:
                logger.info("%d worker(s) report again", alive)
            self.no_worker = None
        elif not self.no_worker:
            vt = self.settings.broker.visibility_timeout_s
            logger.warning("no worker has reported for %.0f s: jobs wait in the queue", vt)
            self.no_worker = (f"no_worker: no worker has reported within the visibility time-out "
                              f"({vt:g} s); jobs are accepted and wait in the queue until one does")

    def watch_workers(self) -> None:
        """A worker that died of a fatal device error fails the service (readyz 503; the pages
        that follow a job are told at once; waiting live re-decodes are answered)."""
        fatal = self.pool.fatal() if self.pool is not None else None
        if fatal is not None and self.state != "failed":
            self.set_state("failed", f"fatal device error: {fatal}")
            self.pool.scheduler.drop_live(NotReady(f"the service is not available: {self.error}"))


class Janitor(threading.Thread):
    """Every second: the broker watch and the watchdog; every five: retention (``purge``)."""

    def __init__(self, health: Health, purge: Callable[[], int], exit_on_fatal: bool):
        super().__init__(name="sensevoice-janitor", daemon=True)
        self.health = health
        self.purge = purge
        self.exit_on_fatal = exit_on_fatal
        self._stopping = threading.Event()

    def stop(self) -> None:
        self._stopping.set()

    def run(self) -> None:
        ticks = 0
        while not self._stopping.wait(JANITOR_TICK_S):
            ticks += 1
            self.health.check_broker()
            self.health.watch_workers()
            if ticks % round(JANITOR_PERIOD_S / JANITOR_TICK_S) == 0:
                try:
                    n = self.purge()
                    if n:
                        logger.info("retention: purged %d jobs", n)
                except Exception:
                    logger.exception("retention failed")
            reason = self.health.unhealthy_reason()
            if reason and self.exit_on_fatal:
                logger.critical("exiting for a restart: %s", reason)
                logging.shutdown()
                os._exit(FATAL_EXIT_CODE)
