"""The worker side of a process: the model loaded once, one engine and one
:class:`~pipeline.serving.worker.Worker` per device, batching from a local
:class:`~pipeline.serving.scheduler.Scheduler` -- the embedded broker's own queue, or one the
broker's feeder keeps supplied (``WorkSource.feeder``: Redis). It also serves the live lane
(re-decodes of live streams, above every job lane). It takes two ports: the
:class:`~pipeline.serving.ports.WorkerSink` its workers finish work in, and the
:class:`~pipeline.serving.ports.WorkSource` (the feeder of a queue elsewhere, the live lane's end)."""

from __future__ import annotations

import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from typing import TYPE_CHECKING

import torch

from pipeline.domain.errors import NotReady
from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.model.loading import load_automodel, load_engine, resolve_model
from pipeline.serving.scheduler import WorkItem

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.model.loading import ModelSource
    from pipeline.serving.metrics import Metrics
    from pipeline.serving.ports import QueueFeeder, WorkerSink, WorkSource
    from pipeline.serving.scheduler import Scheduler

logger = logging.getLogger("sensevoice.workers")

MEMORY_READ_INTERVAL_S = 0.25  # free GPU memory is read at most this often per device


def visible_devices(device: str) -> list[str]:
    if device == "cuda":
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return [device]


class WorkerPool:
    def __init__(self, settings: Settings, sink: WorkerSink, work: WorkSource, scheduler: Scheduler,
                 metrics: Metrics, devices: list[str], source: ModelSource | None = None,
                 background_work: bool = True):
        self.settings = settings
        self.sink = sink  # where its workers finish work
        self.work = work  # the feeder of a queue elsewhere, the live lane's serving end
        self.scheduler = scheduler  # what the workers batch from
        self.metrics = metrics
        self.source = source
        self.devices = devices
        # the engines' background compile and graph captures (engine.background_compile; unset: on)
        self.background_work = settings.engine.background_compile is not False and background_work
        self.workers: list = []
        self.feeder: QueueFeeder | None = None  # claims from a queue outside this process
        self.live_server = None  # takes live re-decodes from the broker (other processes' streams)
        self.startup: dict[str, float] = {}
        self.live_ready: Callable[[], str | None] = lambda: None  # why live re-decodes wait, or None
        self._free_memory: dict[str, tuple[float, float]] = {}  # device -> (read at, free share)

    @property
    def speech_device(self) -> str:
        """Where speech detection runs (offline splits and live captions): this process's first
        GPU when it has one, else the CPU."""
        return self.devices[0] if self.devices[0].startswith("cuda") else "cpu"

    # ------------------------------------------------------------------ lifecycle
    def resolve(self) -> ModelSource:
        """Find the model now (a missing local directory or an unreachable hub raises
        ModelUnavailable before a server starts)."""
        if self.source is None:
            self.source = resolve_model(self.settings)
        return self.source

    def load(self) -> None:
        """Load the model once, then one engine (warmed up, eager) and worker per device; each
        worker compiles the fused encoder and captures its graphs when idle."""
        from pipeline.serving.worker import Worker

        t0 = time.perf_counter()
        self.resolve()
        s = self.settings
        automodel = functools.cache(lambda: load_automodel(self.source.path, self.devices[0]))  # funasr's, once if needed
        for n, dev in enumerate(self.devices):
            engine = load_engine(self.source.path, dev, s.engine.dtype, fp32_residual=s.engine.fp32_residual,
                                 fused=s.engine.fused_encoder, cache_dir=s.server.cache_dir, automodel=automodel)
            self.startup.setdefault("load_s", time.perf_counter() - t0)
            engine.use_fp8(s.engine.fp8_gemm)  # 'off' (the default): nothing changes
            if s.engine.cuda_graphs:  # captured by the worker when idle, after the compile
                sizes = [int(b) for b in s.engine.graph_batch_sizes.split(",") if b.strip()]
                engine.plan_graphs(sizes, s.engine.graph_max_seconds)
            engine.warmup()  # eager: the service is ready now; compiled kernels and graphs follow
            self.startup.update({f"{k}_s[{dev}]": v for k, v in engine.startup_seconds.items()})
            self.workers.append(Worker(f"sensevoice-worker-{n}", engine, self.scheduler, self.sink,
                                       queue_timeout_s=s.limits.queue_timeout_s, metrics=self.metrics,
                                       cpu_threads=s.engine.cpu_threads, background_work=self.background_work,
                                       delete_audio_when_done=s.limits.delete_audio_when_done))
        self.scheduler.live_batches.lanes = len(self.workers)

    def start(self) -> None:
        for w in self.workers:
            w.start()
        consumer = f"{socket.gethostname()}:{os.getpid()}"
        # live re-decodes of streams held by any api process, into the top lane of the scheduler
        self.live_server = self.work.serve_live(self.scheduler, consumer,
                                                  max_waiting=self.settings.engine.max_batch,
                                                  ready=lambda: self.live_ready())
        self.live_server.start()
        self.feeder = self.work.feeder(  # None where the scheduler is the queue itself
            self.scheduler, consumer=consumer,
            prefetch=2 * self.settings.engine.max_batch,
            free_memory=lambda: max(self.local_free_ratios(), default=None),
            busy_seconds=self.busy_seconds)
        if self.feeder is not None:
            self.feeder.start()

    def stop(self) -> None:
        if self.live_server is not None:  # first: the api processes move its streams at once
            self.live_server.stop()
        if self.feeder is not None:
            self.feeder.stop()
        self.scheduler.close()
        for w in self.workers:
            w.stop()
        for w in self.workers:
            w.join(timeout=10)
        for w in self.workers:  # then their engines' background work (a compile in progress)
            w.engine.close()

    # ------------------------------------------------------------------ health
    def fatal(self) -> BaseException | None:
        return next((w.fatal for w in self.workers if w.fatal is not None), None)

    def unhealthy_reason(self) -> str | None:
        """A dead, failed or hung worker, or None."""
        now = time.monotonic()
        for w in self.workers:
            if w.fatal is not None:
                return f"{w.name}: fatal error: {w.fatal}"
            if not w.is_alive():
                return f"{w.name} is not running"
            if now - w.heartbeat > self.settings.server.hung_timeout_s:
                return f"{w.name} is hung (no heartbeat for {now - w.heartbeat:.0f} s)"
        return None

    def unready_reason(self) -> str | None:
        if self.feeder is not None and self.feeder.error is not None:
            return f"the worker cannot reach the broker: {self.feeder.error}"
        return None

    # ------------------------------------------------------------------ the live lane
    def busy_seconds(self) -> float:
        """Seconds this process's workers have spent on batches so far, per worker (its change
        over a second is the share of time the model is busy: the live lane's cost model)."""
        return sum(w.busy_s for w in self.workers) / max(len(self.workers), 1)

    def decode_live(self, wave: torch.Tensor, options: TranscribeOptions, final: bool = False) -> Future:
        """Queue one re-decode of a live stream's utterance (16 kHz mono) ahead of every job lane
        (``final``: ahead of every partial too), batched with whatever the workers run; the future
        gets the engine's output. Nothing is stored."""
        reason = self.live_ready()
        if reason is not None:
            raise NotReady(reason)
        item = WorkItem(f"live-{uuid.uuid4().hex}", Lane.INTERACTIVE, options, int(wave.shape[-1]),
                        audio=wave, reply=Future(), final=final)
        self.scheduler.put(item)  # this pool's scheduler (the embedded broker's queue is it too)
        return item.reply

    # ------------------------------------------------------------------ GPU memory
    def local_free_ratios(self) -> list[float]:
        """Free memory shares of this process's GPUs (none on a CPU)."""
        return [r for d in self.devices if (r := self.free_memory_ratio(d)) is not None]

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
