"""TranscriptionService: the one place the UI, the REST API and the CLI talk to.

submit: decode (PyAV, in the caller's thread) -> resample on the device -> spool + store (on disk)
-> enqueue. Workers (one per device) run batches and write results to the store; get/wait read it.

Two topologies of the same code (``Settings.broker``):

* embedded (the default): the store is SQLite (:class:`JobStore`) and the queue is this process's
  :class:`Scheduler`, which the workers batch from;
* distributed (``redis://...``): store and queue are one :class:`RedisBroker`. A process with the
  ``api`` role decodes and enqueues (no model); one with the ``worker`` role runs a :class:`Feeder`
  that claims items into its local Scheduler, and its workers write results to the broker. Any
  api process answers a poll of any job. ``all`` runs both roles in one process.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from pipeline.serving.admission import Backlog
from pipeline.audio.decode import Resampler
from pipeline.config import Settings
from pipeline.audio.decoder_pool import Decoder
from pipeline.domain.errors import MemoryPressure, NotReady, SenseVoiceError
from pipeline.serving.broker_sqlite import JobStore, WaveSpool
from pipeline.serving.job_events import JobChanges, JobEvent
from pipeline.serving.metrics import Metrics
from pipeline.model.loading import ModelSource, load_automodel, resolve_model
from pipeline.serving.scheduler import SAMPLE_RATE, Scheduler, WorkItem
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions, Transcript

logger = logging.getLogger("sensevoice.service")

RECENT_JOBS = 20_000  # job snapshots kept in memory so that polls never touch the disk
CHANNEL_NAMES = ("left", "right")  # speaker labels of a split stereo call (e.g. agent, customer)
JANITOR_PERIOD_S = 5.0  # how often retention runs
JANITOR_TICK_S = 1.0  # how often the watchdog and the broker watch run
MEMORY_READ_INTERVAL_S = 0.25  # GPU admission reads free memory at most this often per device
LOOP_BEAT_S = 1.0  # how often the event loop proves it answers
FATAL_EXIT_CODE = 3  # process exit status after a fatal device error or a hung worker
WAIT_POLL_S = 0.02  # distributed: how often wait() reads a job from the broker


def new_job_id() -> str:
    """A full random UUID (122 random bits): unguessable."""
    return str(uuid.UUID(bytes=secrets.token_bytes(16), version=4))


def connect_store(settings: Settings):
    """The job store of the topology: SQLite on this host, or the Redis broker."""
    if not settings.broker:
        return JobStore(settings.data_dir)
    from pipeline.serving.broker_redis import RedisBroker

    return RedisBroker(settings.broker, settings.retention_hours * 3600, settings.queue_size,
                       settings.visibility_timeout_s, retry_after_s=settings.retry_after_s,
                       shared_dir=settings.shared_dir or None)


def visible_devices(device: str) -> list[str]:
    if device == "cuda":
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [device]


class TranscriptionService:
    def __init__(self, settings: Settings, source: ModelSource | None = None):
        self.settings = settings
        self.source = source
        self.distributed = bool(settings.broker)
        self.serves_api = settings.role in ("all", "api")
        self.serves_worker = settings.role in ("all", "worker")
        # an api-only process holds no model: it resamples on the CPU and needs no GPU
        self.devices = visible_devices(settings.resolved_device()) if self.serves_worker else ["cpu"]
        self.store = connect_store(settings)
        self.waves = WaveSpool(settings.data_dir / "waves")
        # embedded: the queue itself; distributed: this worker process's local batch queue
        self.scheduler = Scheduler(
            settings.queue_size, settings.max_batch, settings.max_wait_ms / 1e3,
            settings.max_batch_seconds, settings.retry_after_s)
        self.queue = self.store if self.distributed else self.scheduler  # where submits go
        self.feeder = None
        self.broker_error: str | None = None  # the latest broker failure (distributed), or None
        self.no_worker: str | None = None  # distributed api role: why no worker serves, or None
        self.resampler = Resampler(self.devices[0])
        self._decode_slots = threading.BoundedSemaphore(settings.decode_concurrency or os.cpu_count() or 2)
        processes = settings.decode_processes
        self.decoder = Decoder(min(os.cpu_count() or 2, 8) if processes < 0 else processes,
                               timeout_s=settings.decode_timeout_s, **Decoder.limits(settings))
        self.metrics = Metrics(self.devices)
        self.metrics.set_queue_depth_fn(lambda: len(self.queue))
        self.metrics.set_lanes_fn(self.queue.queue_depth)
        if self.distributed:
            self.metrics.set_workers_fn(self.store.live_workers)
        self.metrics.set_jobs_by_state_fn(self.store.counts)
        self.backlog = Backlog(settings.segment_backlog_jobs, settings.segment_backlog_hours * 3600)
        self.metrics.set_backlog_fn(self.backlog.snapshot)
        self.workers: list = []
        self.state = "starting"  # starting -> loading -> ready | failed
        self.error: str | None = None
        self.startup: dict[str, float] = {}
        self._done = threading.Condition()
        self._segment_pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="sensevoice-vad")
        self._segmenter = None  # silero-vad, loaded on the first long recording
        self._segmenter_lock = threading.Lock()
        self._progress: dict[str, str] = {}  # job id -> "segmenting 40%" / "segment 12 of 90"
        self.changes = JobChanges()  # wakes whoever streams a job (state, progress, model state)
        self.store.feed.subscribe(self._on_job_event)  # what the workers (and we) wrote
        self._recent: OrderedDict[str, Job] = OrderedDict()  # id -> latest snapshot (bounded)
        self._recent_lock = threading.Lock()
        self._owned_files: dict[str, list[Path]] = {}  # job id -> intermediate copies to delete with it
        self.on_purge: list[Callable[[list[str]], None]] = []  # caches that must forget purged jobs
        # device (or "cluster") -> (read at, free ratio or the workers' ratios)
        self._free_memory: dict[str, tuple[float, object]] = {}
        self._stopping = threading.Event()
        self._janitor: threading.Thread | None = None
        self.loop_heartbeat: float | None = None  # monotonic; set by the event loop once it runs

    # ------------------------------------------------------------------ lifecycle
    @property
    def is_demo(self) -> bool:
        return bool(self.source and self.source.is_demo)

    @property
    def ready(self) -> bool:
        if self.state != "ready" or (self.serves_worker and not self.workers):
            return False
        return self.unhealthy_reason() is None and self.unready_reason() is None

    def unready_reason(self) -> str | None:
        """Why the service cannot serve right now for a reason that passes by itself (the broker
        is unreachable), or None. Unlike :meth:`unhealthy_reason` this never ends the process."""
        if self.broker_error:
            return self.broker_error
        if self.no_worker:
            return self.no_worker
        if self.feeder is not None and self.feeder.error is not None:
            return f"the worker cannot reach the broker: {self.feeder.error}"
        return None

    def unhealthy_reason(self) -> str | None:
        """Why the service cannot serve (a dead, failed or hung worker), or None."""
        now = time.monotonic()
        beat = self.loop_heartbeat
        if beat is not None and now - beat > self.settings.loop_stall_timeout_s:
            return (f"the event loop has not answered for {now - beat:.0f} s (a request blocks it); "
                    "nothing is served")
        for w in self.workers:
            if w.fatal is not None:
                return f"{w.name}: fatal error: {w.fatal}"
            if not w.is_alive():
                return f"{w.name} is not running"
            if now - w.heartbeat > self.settings.hung_timeout_s:
                return f"{w.name} is hung (no heartbeat for {now - w.heartbeat:.0f} s)"
        return None

    async def beat_event_loop(self) -> None:
        """Runs on the server's event loop: proves every second that the loop still answers (a
        request that blocks it -- e.g. a read of /dev/zero -- froze healthz, polls and SIGTERM)."""
        import asyncio

        while True:
            self.loop_heartbeat = time.monotonic()
            await asyncio.sleep(LOOP_BEAT_S)

    def start(self) -> None:
        """Load, warm up, recover the queue, start workers. Blocking; call from a thread."""
        try:
            self.state = "loading"
            t0 = time.perf_counter()
            if self.distributed:
                self._check_broker()
                for warning in self.store.config_warnings() if not self.broker_error else ():
                    logger.warning("redis: %s", warning)
            if self.serves_worker:
                self._start_engines()
            t1 = time.perf_counter()
            if self.serves_api:
                self.decoder.warm_up()
            self.startup["decoder_s"] = time.perf_counter() - t1
            if not self.distributed:
                self._recover()
            self.metrics.start()
            for w in self.workers:
                w.start()
            if self.serves_worker and self.distributed:
                from pipeline.serving.broker_redis import Feeder

                self.feeder = Feeder(self.store, self.scheduler,
                                     consumer=f"{socket.gethostname()}:{os.getpid()}",
                                     prefetch=2 * self.settings.max_batch,
                                     free_memory=self._local_free_memory)
                self.feeder.start()
            self._janitor = threading.Thread(target=self._janitor_loop, name="sensevoice-janitor",
                                             daemon=True)
            self._janitor.start()
            self.startup["total_s"] = time.perf_counter() - t0
            self.state = "ready"
            self.changes.notify_all()
            logger.info("ready (%s role%s) on %s (model %s%s) in %.1f s", self.settings.role,
                        ", redis broker" if self.distributed else "", ", ".join(self.devices),
                        self.source.name if self.source else "none",
                        ", DEMO" if self.is_demo else "", self.startup["total_s"])
        except Exception as e:
            self.state = "failed"
            self.error = str(e)
            self.changes.notify_all()
            logger.exception("start-up failed")
            raise

    def _start_engines(self) -> None:
        """Load the model once, then one engine (warmed up, eager) and worker per device; each
        worker compiles the fused encoder and captures its graphs when idle."""
        from pipeline.model.engine import SenseVoiceEngine
        from pipeline.serving.worker import Worker

        t0 = time.perf_counter()
        if self.source is None:
            self.source = resolve_model(self.settings)
        am = None  # funasr's AutoModel, loaded only when an engine needs its modules
        for n, dev in enumerate(self.devices):
            engine = None
            if dev.startswith("cuda") and self.settings.fused_encoder:  # no funasr import (~15 s)
                engine = SenseVoiceEngine.from_model_dir_fast(
                    self.source.path, dev, self.settings.dtype,
                    fp32_residual=self.settings.fp32_residual, cache_dir=self.settings.cache_dir)
            if engine is None:
                if am is None:
                    am = load_automodel(self.source.path, self.devices[0])
                engine = SenseVoiceEngine.from_automodel(
                    am, dev, self.settings.dtype, fp32_residual=self.settings.fp32_residual,
                    fused=dev.startswith("cuda") and self.settings.fused_encoder,
                    cache_dir=self.settings.cache_dir)
            self.startup.setdefault("load_s", time.perf_counter() - t0)
            if self.settings.cuda_graphs:  # captured by the worker when idle, after the compile
                sizes = [int(b) for b in self.settings.graph_batch_sizes.split(",") if b.strip()]
                engine.plan_graphs(sizes, self.settings.graph_max_seconds)
            engine.warmup()  # eager: the service is ready now; compiled kernels and graphs follow
            self.startup.update({f"{k}_s[{dev}]": v for k, v in engine.startup_seconds.items()})
            self.workers.append(Worker(f"sensevoice-worker-{n}", engine, self.scheduler,
                                       self.store, queue_timeout_s=self.settings.queue_timeout_s,
                                       metrics=self.metrics,
                                       cpu_threads=self.settings.cpu_threads,
                                       delete_audio_when_done=self.settings.delete_audio_when_done))

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
        self._stopping.set()
        self._segment_pool.shutdown(wait=False, cancel_futures=True)
        if self.feeder is not None:
            self.feeder.stop()
        self.scheduler.close()
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(timeout=10)
        self.metrics.stop()
        self.decoder.close()
        if self.distributed:
            self.store.close()

    def _watch_workers(self) -> None:
        """A worker that died of a fatal device error fails the service (readyz 503; the pages
        that follow a job are told at once)."""
        fatal = next((w.fatal for w in self.workers if w.fatal is not None), None)
        if fatal is not None and self.state != "failed":
            self.state = "failed"
            self.error = f"fatal device error: {fatal}"
            self.changes.notify_all()
            self.scheduler.drop_live(NotReady(f"the service is not available: {self.error}"))

    def purge_expired(self) -> int:
        cutoff = time.time() - self.settings.retention_hours * 3600
        purged = self.store.purge(cutoff)
        with self._recent_lock:  # polls take this lock on the event loop: no disk I/O under it
            for jid in purged:
                self._recent.pop(jid, None)
            owned = [p for jid in purged for p in self._owned_files.pop(jid, ())]
        for path in owned:
            path.unlink(missing_ok=True)
        for forget in self.on_purge:
            forget(purged)
        return len(purged)

    def _check_broker(self) -> None:
        """Distributed: note whether the broker answers (readyz says 503 while it does not), and
        in an api-only process whether any worker has reported within the visibility time-out
        (readyz says 503 no_worker while none has: its submits would only wait)."""
        if self.store.ping():
            if self.broker_error:
                logger.info("the broker answers again")
            self.broker_error = None
        else:
            if not self.broker_error:
                logger.warning("the broker does not answer")
            self.broker_error = "the broker (redis) does not answer"
            return
        if not self.serves_worker:
            self._check_workers()

    def _check_workers(self) -> None:
        try:
            alive = self.store.live_workers()
        except SenseVoiceError:
            return  # the broker watch reports it
        if alive:
            if self.no_worker:
                logger.info("%d worker(s) report again", alive)
            self.no_worker = None
        elif not self.no_worker:
            logger.warning("no worker has reported for %.0f s: jobs wait in the queue",
                           self.settings.visibility_timeout_s)
            self.no_worker = (f"no_worker: no worker has reported within the visibility time-out "
                              f"({self.settings.visibility_timeout_s:g} s); jobs are accepted and "
                              "wait in the queue until one does")

    def _janitor_loop(self) -> None:
        """Retention, broker watch, and the watchdog: a fatal or hung worker ends the process (the
        supervisor restarts it and the queue resumes from the store)."""
        ticks = 0
        while not self._stopping.wait(JANITOR_TICK_S):
            ticks += 1
            if self.distributed:
                self._check_broker()
            self._watch_workers()
            if ticks % round(JANITOR_PERIOD_S / JANITOR_TICK_S) == 0:
                try:
                    n = self.purge_expired()
                    if n:
                        logger.info("retention: purged %d jobs", n)
                except Exception:
                    logger.exception("retention failed")
            reason = self.unhealthy_reason()
            if reason and self.settings.exit_on_fatal:
                logger.critical("exiting for a restart: %s", reason)
                logging.shutdown()
                os._exit(FATAL_EXIT_CODE)

    def _on_job_event(self, event: JobEvent) -> None:
        """The broker committed a change (in the writer's thread: a worker, the splitter, a
        request): keep the snapshot that polls read, free what a finished job held, wake waiters."""
        if event.state is JobState.RUNNING:
            self._mark_running_cached(event.job_id)
        elif event.state in (JobState.DONE, JobState.FAILED):
            self._notify(event.job_id)
        elif event.progress is not None:
            self._progress[event.job_id] = event.progress
            self.changes.notify(event.job_id)

    def _notify(self, job_id: str) -> None:
        """A job finished: refresh its snapshot, free its backlog seat, wake waiters."""
        self._progress.pop(job_id, None)
        if self.backlog.release(job_id):
            self.waves.delete(job_id)  # pieces already queued keep their memory map
        try:
            self._remember(self.store.get(job_id))
        except SenseVoiceError:
            pass
        with self._done:
            self._done.notify_all()
        self.changes.notify(job_id)

    def _remember(self, job: Job) -> None:
        with self._recent_lock:
            self._recent[job.id] = job
            self._recent.move_to_end(job.id)
            while len(self._recent) > RECENT_JOBS:
                self._recent.popitem(last=False)

    def _mark_running_cached(self, job_id: str) -> None:
        with self._recent_lock:
            job = self._recent.get(job_id)
            if job is not None:
                self._recent[job_id] = replace(job, state=JobState.RUNNING, started_at=time.time(),
                                               attempts=job.attempts + 1)
        self.changes.notify(job_id)

    async def poll(self, job_id: str) -> Job | None:
        """A poll on the event loop: the in-memory snapshot (embedded), or the broker read with
        its asyncio client (distributed); None when only the route can answer (not cached, or an
        error to report)."""
        if not self.distributed:
            return self.get_cached(job_id)
        try:
            return await self.store.aget(job_id)
        except SenseVoiceError:
            return None

    def get_cached(self, job_id: str) -> Job | None:
        """The job from memory, without I/O (for polling on the event loop); None if not cached
        (always, in the distributed topology: another process may have changed it)."""
        if self.distributed:
            return None
        with self._recent_lock:
            job = self._recent.get(job_id)
        return None if job is None else self._with_live_fields(job)

    def _with_live_fields(self, job: Job) -> Job:
        """Add what only memory knows about an unfinished job: its place in the queue, progress
        (the broker's records carry both already)."""
        if self.distributed or job.state not in (JobState.QUEUED, JobState.RUNNING):
            return job
        return replace(job, position=self.scheduler.position(job.id),
                       meta={**job.meta, "progress": self._progress.get(job.id)})

    def _recover(self) -> None:
        """Put jobs that a previous process accepted back on the queue (long ones are split again)."""
        jobs = self.store.recover()
        self.waves.keep_only({j.id for j in jobs})
        for job in jobs:
            if self._is_long(job.audio_seconds, job.options):
                self.store.clear_segments(job.id)
                self.backlog.admit(job.id, job.audio_seconds, force=True)
                self._segment_pool.submit(self._split_and_enqueue, job)
                continue
            n = int(job.audio_seconds * SAMPLE_RATE)
            audio = SpooledUpload(self.store, self.decoder, self.resampler, job.id,
                                  self.settings.max_audio_seconds)
            self.scheduler.put(WorkItem(job.id, job.lane, job.options, n, audio=audio), force=True)
        if jobs:
            logger.info("recovered %d queued jobs from the store", len(jobs))

    # ------------------------------------------------------------------ the API
    def submit(self, data: bytes, *, filename: str = "", options: TranscribeOptions = TranscribeOptions(),
               lane: Lane = Lane.BULK) -> Job:
        """Decode, resample, persist and enqueue one upload. Blocking: call from a worker thread."""
        try:
            return self._submit(data, filename, options, lane)
        except SenseVoiceError as e:
            self.metrics.rejected(e.code)
            raise

    def _submit(self, data: bytes, filename: str, options: TranscribeOptions, lane: Lane) -> Job:
        if self.state == "failed":
            raise NotReady(f"the service is not available: {self.error}")
        self.queue.check_capacity()  # cheap early answers before decoding
        if options.split_channels:
            self.backlog.check()
        self._check_memory()
        wave = self._decode(data, options)
        job = Job(id=new_job_id(), state=JobState.QUEUED, options=options, lane=lane,
                  created_at=time.time(), audio_seconds=wave.shape[-1] / SAMPLE_RATE,
                  filename=_display_name(filename))
        if self._is_long(job.audio_seconds, options):
            return self._accept_long(job, data, wave)
        self.store.create(job, data)
        try:
            self.queue.put(WorkItem(job.id, lane, options, int(wave.shape[-1]), audio=wave))
        except SenseVoiceError:
            self.store.discard(job.id)
            raise
        self._remember(job)
        return replace(job, position=self.queue.position(job.id))

    def decode_live(self, wave: torch.Tensor, options: TranscribeOptions) -> Future:
        """Queue one re-decode of a live stream's utterance (16 kHz mono) ahead of every job lane,
        batched with whatever the workers run; the future gets the engine's output. Nothing is
        stored. Only a process that holds the model (role ``all``, the default) serves it."""
        if not self.serves_worker:
            raise NotReady("live captions need a process that holds the model (role all); "
                           "this one has the api role")
        if self.state != "ready" or not self.workers:
            raise NotReady("the model is still loading; try again in a few seconds"
                           if self.state in ("starting", "loading") else
                           f"the service is not available: {self.error}")
        reply: Future = Future()
        self.scheduler.put(WorkItem(f"live-{uuid.uuid4().hex}", Lane.INTERACTIVE, options,
                                    int(wave.shape[-1]), audio=wave, reply=reply))
        return reply

    def _accept_long(self, job: Job, data: bytes, wave: torch.Tensor) -> Job:
        """Count a long job in the backlog (or BacklogFull), store it, and leave its decoded audio
        on disk for the splitter: waiting jobs hold no memory."""
        if self.distributed:  # split now: an accepted job is in the broker as its pieces
            return self._accept_split(job, data, wave.float().cpu())
        self.backlog.admit(job.id, job.audio_seconds)
        try:
            self.store.create(job, data)
            try:
                self.waves.save(job.id, wave.float().cpu().numpy())
            except SenseVoiceError:
                self.store.discard(job.id)
                raise
        except BaseException:
            self.backlog.release(job.id)
            raise
        del wave
        self._progress[job.id] = "segmenting"
        self._remember(job)
        self._segment_pool.submit(self._split_and_enqueue, job)
        return job

    def own_file(self, job_id: str, path: str | Path) -> None:
        """Tie an intermediate copy of a job's upload (Gradio's upload cache) to the job: deleted
        now if audio is deleted when jobs are done (the spool holds the job's own copy), else when
        the job is purged. (Gradio's ``delete_cache`` sweep is the backstop across restarts.)"""
        path = Path(path)
        if self.settings.delete_audio_when_done:
            path.unlink(missing_ok=True)
            return
        with self._recent_lock:
            self._owned_files.setdefault(job_id, []).append(path)

    # ------------------------------------------------------------------ long recordings
    def _is_long(self, seconds: float, options: TranscribeOptions) -> bool:
        return seconds > self.settings.segment_threshold_s or options.split_channels

    @property
    def speech_device(self) -> str:
        """Where speech detection runs (offline splits and live captions): this process's first
        GPU when it has one, else the CPU."""
        return self.devices[0] if self.devices[0].startswith("cuda") else "cpu"

    def segmenter(self):
        from pipeline.audio.vad import Segmenter

        with self._segmenter_lock:
            if self._segmenter is None:
                self._segmenter = Segmenter(max_segment_s=self.settings.max_segment_s,
                                            device=self.speech_device).load()
            return self._segmenter

    def _pieces(self, job: Job, wave: torch.Tensor) -> list[WorkItem]:
        """VAD-split a long recording (per channel when asked) into work items in time order."""
        channels = [(None, wave)] if wave.dim() == 1 else \
            [(name, wave[c]) for c, name in zip(range(wave.shape[0]), CHANNEL_NAMES)]
        spans = []
        for k, (speaker, ch) in enumerate(channels):
            def progress(f, k=k):
                self._progress[job.id] = f"segmenting {(k + f) / len(channels):.0%}"
                self.changes.notify(job.id)

            spans += [(span, speaker, ch) for span in self.segmenter().split(ch, on_progress=progress)]
        spans.sort(key=lambda t: (t[0].start, t[1] or ""))
        return [WorkItem(job.id, job.lane, job.options, span.end - span.start,
                         audio=ch[span.start:span.end], piece=n, pieces=len(spans),
                         start_s=span.start / SAMPLE_RATE, speaker=speaker)
                for n, (span, speaker, ch) in enumerate(spans)]

    def _queue_pieces(self, job: Job, items: list[WorkItem], accepted: bool = True) -> None:
        """Queue the pieces of a long job. An ``accepted`` job's pieces all go in whatever the
        queue holds (it is never dropped for back-pressure); one not yet accepted needs room for
        its first piece (a full queue refuses it)."""
        if not items:  # no speech at all: an empty transcript, not an error
            self.store.mark_running([job.id])
            self.store.finish(job.id, Transcript(text="", raw_text="", segments=()))
            return
        self._progress[job.id] = f"segment 0 of {len(items)}"
        self.changes.notify(job.id)
        for n, item in enumerate(items):
            self.queue.put(item, force=accepted or n > 0)

    def _accept_split(self, job: Job, data: bytes, wave: torch.Tensor) -> Job:
        """Distributed: split before answering, then store the job and queue its pieces, so that
        no accepted job depends on this process staying alive (the split runs in the request's
        thread, bounded by the uploads in flight; the queue bounds what waits)."""
        self.queue.check_capacity()
        items = self._pieces(job, wave)
        self.store.create(job, data)
        try:
            self._queue_pieces(job, items, accepted=False)
        except SenseVoiceError:
            self.store.discard(job.id)
            raise
        finally:
            self._progress.pop(job.id, None)
        return job

    def _split_and_enqueue(self, job: Job) -> None:
        """Background: VAD-split a long job and queue its pieces. The audio is memory-mapped
        from disk: pieces waiting in the queue are pages of that file."""
        try:
            samples = self.waves.load(job.id)
            if samples is None:  # recovered after a restart: decode the spooled upload again
                decoded = self._decode(self.store.load_upload(job.id), job.options)
                self.waves.save(job.id, decoded.float().cpu().numpy())
                del decoded
                samples = self.waves.load(job.id)
            self._queue_pieces(job, self._pieces(job, torch.from_numpy(samples)))
        except Exception as e:
            logger.exception("segmenting job %s failed", job.id)
            self.store.fail(job.id, "segmentation_failed", f"splitting the recording failed: {e}")

    def progress(self, job_id: str) -> str | None:
        return self._progress.get(job_id)

    def _check_memory(self) -> None:
        """GPU admission control: refuse new work while every device is short of free memory
        (distributed: every live worker's GPU, as the workers report it through the broker)."""
        if self.settings.min_free_memory_ratio <= 0:
            return
        ratios = self._cluster_free_memory() if self.distributed else self._local_free_ratios()
        if ratios and max(ratios) < self.settings.min_free_memory_ratio:
            raise MemoryPressure(
                f"the GPU is short of memory ({max(ratios):.0%} free); try again in a few seconds")

    def _local_free_ratios(self) -> list[float]:
        """Free memory shares of this process's GPUs (none on a CPU)."""
        return [r for d in self.devices if (r := self.free_memory_ratio(d)) is not None]

    def _local_free_memory(self) -> float | None:
        """The best free share among this process's GPUs (what its feeder reports), or None."""
        return max(self._local_free_ratios(), default=None)

    def _cluster_free_memory(self) -> list[float]:
        """The workers' reported free GPU memory shares, read at most every
        ``MEMORY_READ_INTERVAL_S`` (not a Redis scan per submit)."""
        now = time.monotonic()
        last = self._free_memory.get("cluster")
        if last is None or now - last[0] > MEMORY_READ_INTERVAL_S:
            last = self._free_memory["cluster"] = (now, self.store.free_memory_ratios())
        return last[1]

    def free_memory_ratio(self, device: str) -> float | None:
        """Free share of a CUDA device's memory (as the driver sees it, all processes); None for CPU.
        Read at most every ``MEMORY_READ_INTERVAL_S`` per device, not on every submit."""
        if not device.startswith("cuda"):
            return None
        now = time.monotonic()
        last = self._free_memory.get(device)
        if last is None or now - last[0] > MEMORY_READ_INTERVAL_S:
            free, total = torch.cuda.mem_get_info(torch.device(device))
            last = self._free_memory[device] = (now, free / total)
        return last[1]

    def _decode(self, data: bytes, options: TranscribeOptions) -> torch.Tensor:
        """Upload bytes -> 16 kHz wave on the device: [n] mono, or [channels, n] for split calls."""
        caps = {"max_seconds": self.settings.max_audio_seconds, "max_bytes": self.settings.max_upload_bytes}
        with self._decode_slots:
            if options.split_channels:  # [2, n]: one speaker per channel; a mono file stays [n]
                left = self.decoder(data, channel=0, **caps)
                wave = self.resampler(left)
                if left.channels > 1:
                    right = self.resampler(self.decoder(data, channel=1, **caps))
                    n = min(wave.shape[-1], right.shape[-1])
                    wave = torch.stack([wave[:n], right[:n]])
            else:
                wave = self.resampler(self.decoder(data, **caps))
            if wave.is_cuda:
                torch.cuda.current_stream(wave.device).synchronize()  # ready before other threads read it
        return wave

    def get(self, job_id: str) -> Job:
        return self._with_live_fields(self.store.get(job_id))

    def wait(self, job_id: str, timeout: float = 60.0) -> Job:
        deadline = time.monotonic() + timeout
        with self._done:
            while True:
                job = self.get(job_id)
                left = deadline - time.monotonic()
                if job.state in (JobState.DONE, JobState.FAILED) or left <= 0:
                    return job
                # workers of other processes notify nobody here: poll the broker
                self._done.wait(min(left, WAIT_POLL_S if self.distributed else 0.5))


@dataclass(frozen=True)
class SpooledUpload:
    """A recovered job's audio: its spooled upload, decoded and resampled when a worker takes it
    (waiting jobs hold no decoded audio)."""

    store: JobStore
    decoder: Decoder
    resampler: Resampler
    job_id: str
    max_seconds: float

    def load(self) -> torch.Tensor:
        return self.resampler(self.decoder(self.store.load_upload(self.job_id),
                                           max_seconds=self.max_seconds))


def _display_name(name: str, limit: int = 200) -> str:
    """The client's filename for display only: no path parts, no control characters, bounded."""
    base = Path(str(name).replace("\\", "/")).name
    clean = "".join(ch for ch in base if ch.isprintable() and ch not in "\u202e\u202d\u200f\u200e")
    return clean[:limit]
