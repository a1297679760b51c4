"""The one composition root: ``build_runtime(settings, role) -> Runtime``.

The web app, the batch CLI, the benchmarks and the tests get their parts here, from settings
alone; no caller wires a broker, a queue, a worker and a model by hand. The parts per role:

* ``api``    -- the broker, the job view (polls, waits), the intake (admission, decoder, long
  audio); no model.
* ``worker`` -- the broker, the worker pool (engines, workers, the feeder of a shared broker);
  no job view: a process without subscribers does no notification work.
* ``all``    -- both, in one process (``make run``: over the embedded broker).
* ``local``  -- the batch CLI's local mode: the worker pool, its scheduler and the upload decoder
  fed directly (:class:`~pipeline.serving.direct.DirectRun`); no broker, no store, no job record.

Each face takes only the part it uses: REST, OpenAI and the UI the intake and the view, the live
captions the live lane (``Runtime.live_decode``: the pool's, or in an api-only process the shared
broker's, answered by the worker processes), the probes the health.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, overload

from pipeline.audio.decode import Resampler
from pipeline.audio.decoder_pool import Decoder
from pipeline.config import Settings
from pipeline.serving.admission import Backlog, LocalLaneCapacity
from pipeline.serving.broker import Broker, connect_broker, live_decode_via
from pipeline.serving.broker_sqlite import WaveSpool
from pipeline.serving.direct import DirectRun, LocalSink
from pipeline.serving.health import Health, Janitor
from pipeline.serving.intake import Intake
from pipeline.serving.job_view import JobView
from pipeline.serving.long_audio import LongAudio
from pipeline.serving.metrics import Metrics
from pipeline.serving.scheduler import Scheduler
from pipeline.serving.speech_split import LazySegmenter, LazySpeakers
from pipeline.serving.upload_decode import UploadDecoder
from pipeline.serving.worker_pool import WorkerPool, visible_devices

if TYPE_CHECKING:
    from pipeline.model.loading import ModelSource
    from pipeline.serving.live import LiveDecode

logger = logging.getLogger("sensevoice.runtime")

MEMORY_READ_INTERVAL_S = 0.25  # the cluster's free GPU memory is read at most this often
LOCAL = "local"  # the role of the batch CLI's local mode: no broker, no store (build_runtime)


@dataclass
class Runtime:
    """What one process runs. ``start`` loads and warms up (blocking: call it from a thread, or
    ``start_background``); ``stop`` drains and closes."""

    settings: Settings
    broker: Broker
    metrics: Metrics
    health: Health
    view: JobView | None  # api side
    intake: Intake | None  # api side
    pool: WorkerPool | None  # worker side
    on_purge: list[Callable[[list[str]], None]] = field(default_factory=list)
    startup: dict[str, float] = field(default_factory=dict)
    janitor: Janitor | None = None

    @property
    def source(self) -> ModelSource | None:
        return self.pool.source if self.pool is not None else None

    @property
    def is_demo(self) -> bool:
        """The model served is the demo one (:func:`pipeline.model.loading.describe_model`)."""
        from pipeline.model.loading import describe_model

        return describe_model(self.source, self.settings)[1]

    @property
    def model_name(self) -> str:
        from pipeline.model.loading import describe_model

        return describe_model(self.source, self.settings)[0]

    @property
    def live_decode(self) -> LiveDecode | None:
        """The live lane as the live captions see it: this process's workers when it holds the
        model; else (api role) the shared broker's, answered by any worker process; else None."""
        if self.pool is not None:
            return self.pool.decode_live
        if self.broker.workers_elsewhere:
            return functools.partial(live_decode_via, self.broker, self.health.not_serving)
        return None

    @property
    def warm(self) -> bool:
        """Every model of this process compiled and its planned graphs captured (no model: True)."""
        return self.pool is None or all(w.engine.warm for w in self.pool.workers)

    @property
    def live_busy_seconds(self) -> Callable[[], float] | None:
        """The model's time so far as live admission reads it: this process's workers', or (api
        role) the worker processes' reports through the shared broker."""
        if self.pool is not None:
            return self.pool.busy_seconds
        return self.broker.busy_seconds_reader()  # (None: no worker of another process reports)

    @property
    def live_capacity(self):
        """What the live lane has left, as live admission reads it (issue 38): this process's
        workers' measured batches, or (api role) the worker processes' reports through Redis
        beside the other api processes' demand; None where no live lane is measured."""
        if self.pool is not None:
            return LocalLaneCapacity(self.pool.scheduler.live_batches)  # its workers' measured batches
        return self.broker.live_capacity_reader()

    @property
    def devices(self) -> list[str]:
        return self.pool.devices if self.pool is not None else ["cpu"]

    def start(self) -> None:
        """Load, warm up, recover the queue, start workers. Blocking; call from a thread."""
        try:
            self.health.set_state("loading")
            t0 = time.perf_counter()
            if self.broker.workers_elsewhere:
                self.health.check_broker()
                for warning in self.broker.config_warnings() if not self.health.broker_error else ():
                    logger.warning("redis: %s", warning)
            if self.pool is not None:
                self.pool.load()
                self.startup.update(self.pool.startup)
            t1 = time.perf_counter()
            if self.intake is not None:
                self.intake.uploads.warm_up()
                self.intake.recover()
            self.startup["decoder_s"] = time.perf_counter() - t1
            self.metrics.start()
            if self.pool is not None:
                self.pool.start()
            self.janitor = Janitor(self.health, self.purge_expired, self.settings.server.exit_on_fatal)
            self.janitor.start()
            self.startup["total_s"] = time.perf_counter() - t0
            self.health.set_state("ready")
            logger.info("ready (%s role%s) on %s (model %s%s) in %.1f s", self.settings.server.role,
                        f", {type(self.broker).__name__}" if self.broker.workers_elsewhere else "", ", ".join(self.devices),
                        self.source.name if self.source else "none",
                        ", DEMO" if self.is_demo else "", self.startup["total_s"])
        except Exception as e:
            self.health.set_state("failed", str(e))
            logger.exception("start-up failed")
            raise

    def start_background(self) -> threading.Thread:
        t = threading.Thread(target=self._start_quietly, name="sensevoice-startup", daemon=True)
        t.start()
        return t

    def _start_quietly(self) -> None:
        try:
            self.start()
        except Exception:
            pass  # state/error already recorded and logged

    def stop(self) -> None:
        if self.janitor is not None:
            self.janitor.stop()
        if self.intake is not None:
            self.intake.long_audio.stop()
        if self.pool is not None:
            self.pool.stop()
        self.metrics.stop()
        if self.intake is not None:
            self.intake.uploads.close()
        self.broker.close()

    def purge_expired(self) -> int:
        """Retention: delete results and audio of jobs finished longer ago than it allows."""
        purged = self.broker.purge(time.time() - self.settings.limits.retention_hours * 3600)
        for forget in self.on_purge:
            forget(purged)
        return len(purged)


@overload
def build_runtime(settings: Settings | None, role: Literal["local"], *, resolve: bool = False,
                  source: ModelSource | None = None, broker: None = None) -> DirectRun: ...


@overload
def build_runtime(settings: Settings | None = None, role: str | None = None, *, resolve: bool = False,
                  source: ModelSource | None = None, broker: Broker | None = None) -> Runtime: ...


def build_runtime(settings: Settings | None = None, role: str | None = None, *, resolve: bool = False,
                  source: ModelSource | None = None, broker: Broker | None = None) -> Runtime | DirectRun:
    """Compose the process that ``settings`` describe (``role`` defaults to ``settings.server.role``).
    Nothing heavy happens here: the model loads in ``Runtime.start``. ``resolve=True`` finds the
    model now (a missing local directory or an unreachable hub raises
    :class:`~pipeline.domain.errors.ModelUnavailable` before a server starts). ``broker``: one
    made by the caller (a sibling web process's, pipeline/web/siblings.py).

    ``role="local"``: the batch CLI's local mode, a :class:`~pipeline.serving.direct.DirectRun`
    (the worker pool, its scheduler and the upload decoder, fed directly; no broker, no store)."""
    settings = settings or Settings()
    role = role or settings.server.role
    if role == LOCAL:
        run = _direct_run(settings, source)
        if resolve:
            run.pool.resolve()
        return run
    serves_api, serves_worker = role in ("all", "api"), role in ("all", "worker")
    # an api-only process holds no model: it resamples on the CPU and needs no GPU
    devices = visible_devices(settings.engine.resolved_device()) if serves_worker else ["cpu"]
    # the embedded broker's queue, or (shared broker) the local queue a feeder fills
    scheduler = Scheduler(settings.limits.queue_size, settings.engine.max_batch, settings.engine.max_wait_ms / 1e3,
                          settings.engine.max_batch_seconds, settings.limits.retry_after_s,
                          finals_alone=not devices[0].startswith("cuda"),
                          live_gather_s=settings.live.gather_ms / 1e3 if devices[0].startswith("cuda") else 0.0)
    if broker is None:  # (a sibling web process brings its own; a broker's len() is its queue)
        broker = connect_broker(settings, scheduler)
    metrics = Metrics(devices)
    pool = WorkerPool(settings, broker, broker, scheduler, metrics, devices, source) if serves_worker else None
    if pool is not None and resolve:
        pool.resolve()
    view = JobView(broker) if serves_api else None
    health = Health(settings, broker, pool, on_change=view.changes.notify_all if view else lambda: None)
    runtime = Runtime(settings, broker, metrics, health, view, None, pool)
    metrics.set_queue_depth_fn(lambda: len(broker))
    metrics.set_lanes_fn(broker.queue_depth)
    metrics.set_jobs_by_state_fn(broker.counts)
    if broker.workers_elsewhere:
        metrics.set_workers_fn(broker.live_workers)
        metrics.set_broker_up_fn(lambda: not health.broker_error)
        metrics.set_live_lane_fn(broker.live_lane_stats)
    elif pool is not None:  # embedded: this process's worker threads
        metrics.set_workers_fn(lambda: sum(w.is_alive() for w in pool.workers))
    health.on_loop_lag = metrics.observe_loop_lag
    if pool is not None:
        pool.live_ready = lambda: health.not_serving()
    if serves_api:
        intake = _intake(settings, broker, view, metrics, runtime.devices[0], _free_memory(broker, pool),
                         health.failure, pool.speech_device if pool is not None else "cpu")
        metrics.set_backlog_fn(intake.long_audio.backlog.snapshot)
        runtime.intake = intake
        runtime.on_purge += [view.forget, intake.forget]
    return runtime


def _direct_run(settings: Settings, source: ModelSource | None) -> DirectRun:
    """The batch CLI's local mode: the server's worker pool and decoder, no broker, no job record."""
    e, limits = settings.engine, settings.limits
    devices = visible_devices(e.resolved_device())
    # the bound is the caller's (files in flight), not a queue size: nothing is refused
    scheduler = Scheduler(1 << 30, e.max_batch, e.max_wait_ms / 1e3, e.max_batch_seconds)
    sink = LocalSink()
    # no background compile unless asked for: a run ends before it pays, and it cannot be
    # cancelled (the CLI waited for it at exit; before, it aborted the exit: issue 42)
    pool = WorkerPool(settings, sink, sink, scheduler, Metrics(devices), devices, source,
                      background_work=bool(e.background_compile))
    uploads = UploadDecoder(Decoder(limits.decode_processes, timeout_s=limits.decode_timeout_s,
                                    **Decoder.limits(settings)),
                            Resampler(devices[0]), limits, concurrency=None)  # the CLI bounds files in flight
    return DirectRun(settings, scheduler, pool, uploads, sink, LazySegmenter(e.max_segment_s, pool.speech_device),
                     LazySpeakers(settings, pool.speech_device))


def _intake(settings: Settings, broker: Broker, view: JobView, metrics: Metrics, device: str,
            free_memory: Callable[[], list[float]], failed: Callable[[], str | None], speech_device: str) -> Intake:
    """The api side's way in and its parts: the decoder pool and the resampler, the long audio
    (its backlog, its wave spool, its segmenter, loaded on the first long recording)."""
    limits = settings.limits  # (machine-derived defaults already resolved by Settings)
    uploads = UploadDecoder(Decoder(limits.decode_processes, timeout_s=limits.decode_timeout_s,
                                    **Decoder.limits(settings)),
                            Resampler(device), limits, limits.decode_concurrency)
    long_audio = LongAudio(broker, view, uploads.decode, threshold_s=settings.engine.segment_threshold_s,
                           backlog=Backlog(limits.segment_backlog_jobs, limits.segment_backlog_hours * 3600),
                           waves=WaveSpool(settings.server.data_dir / "waves"),
                           load_segmenter=LazySegmenter(settings.engine.max_segment_s, speech_device),
                           on_failed=lambda job, code: metrics.request_failure(job.lane, code),
                           load_speakers=LazySpeakers(settings, speech_device))
    from pipeline.model.loading import hotword_checker

    return Intake(settings, broker, view, uploads, long_audio, free_memory=free_memory, failed=failed,
                  rejected=metrics.rejected, check_hotwords=hotword_checker(settings))


def _free_memory(broker: Broker, pool: WorkerPool | None) -> Callable[[], list[float]]:
    """Where admission reads free GPU memory: the reports of workers in other processes (read at
    most every ``MEMORY_READ_INTERVAL_S``, not a Redis scan per submit), or this process's GPUs."""
    if not broker.workers_elsewhere:
        return pool.local_free_ratios if pool is not None else list
    last: list = [0.0, []]

    def read() -> list[float]:
        now = time.monotonic()
        if now - last[0] > MEMORY_READ_INTERVAL_S:
            last[:] = [now, broker.free_memory_ratios()]
        return last[1]

    return read
