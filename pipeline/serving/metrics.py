"""Prometheus metrics named after Triton's (prefix ``sensevoice_``), on ``prometheus_client``.

Each ``Metrics`` has its own ``CollectorRegistry`` (never the process-global one: tests build several
services in one process), served in the text format 0.0.4 (``CONTENT_TYPE``). Base units: seconds,
bytes, hertz, watts, degrees Celsius; counters end in ``_total``. The registry holds:

* counters and histograms updated from request and worker threads (``prometheus_client`` is
  thread-safe): jobs finished / failed / refused, queue and job time per lane, compute time,
  batches and items per device, audio seconds transcribed, the HTTP requests per route template
  (``observe_http``) and the event loop's lag (``observe_loop_lag``);
* gauges read at scrape time by a custom collector: the queue depth (per lane), the live workers,
  whether the broker answers, the long-recording backlog and the jobs by state, from callbacks the
  service sets;
* the GPU gauges (a custom collector over the latest NVML sample, which a daemon thread takes every
  ``nvml_interval_s``; without NVML, e.g. no driver or a CPU machine, there are no GPU series);
* ``sensevoice_build_info`` (version, torch, python, devices) and the ``process_*`` / ``python_*``
  collectors.

With sibling web processes (``--web-processes``) each sibling runs prometheus_client's multiprocess
mode (``PROMETHEUS_MULTIPROC_DIR``, a private directory of the owner's, set in its environment
before it starts): its values live in memory-mapped files there, and the owner's ``render`` adds
the families the siblings count (``SIBLING_FAMILIES``: what they answer) to its own through
``MultiProcessCollector`` (``count_siblings``); nobody scrapes a sibling.

A *rejected* request never became a job (queue full, bad input, not ready); a *failure* is an
accepted job that ended failed. Label values must come from small fixed sets (lanes, error codes,
device names, route templates), never from user input: every distinct value is a series kept for
the process's life.
"""

from __future__ import annotations

import enum
import logging
import os
import platform
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import prometheus_client
from prometheus_client import (CollectorRegistry, Counter, Gauge, GCCollector, Histogram,
                               PlatformCollector, ProcessCollector, generate_latest)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from pipeline.domain.errors import JobFailed

logger = logging.getLogger("sensevoice.metrics")

# the ``*_created`` series (one per labelled child) double the series count and no dashboard here
# uses them; the switch is process-wide in prometheus_client
prometheus_client.disable_created_metrics()

CONTENT_TYPE = CONTENT_TYPE_PLAIN_0_0_4  # what ``generate_latest`` writes
PREFIX = "sensevoice_"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # seconds (upper bounds); +Inf is implicit
DEFAULT_NVML_INTERVAL_S = 0.5  # seconds between two NVML samples
MW_PER_W = 1000  # NVML reports power in milliwatts
HZ_PER_MHZ = 1_000_000  # NVML reports clocks in MHz
GPU_LABELS = ("device", "gpu_uuid")
GPU_GAUGES = (  # name (without prefix), help; one sample per GPU, labelled GPU_LABELS
    ("gpu_memory_used_bytes", "GPU memory in use (all processes), bytes."),
    ("gpu_memory_free_bytes", "GPU memory free, bytes."),
    ("gpu_memory_total_bytes", "GPU memory in total, bytes."),
    ("gpu_temperature_celsius", "GPU core temperature, degrees Celsius."),
    ("gpu_power_watts", "GPU power draw, watts."),
    ("gpu_sm_clock_hertz", "GPU SM clock, hertz."),
    ("gpu_utilization_ratio", "Fraction of NVML's last sample period in which a kernel ran (0..1)."),
)
LOOP_LAG_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)  # seconds
LANES = ("interactive", "bulk")  # the job lanes (domain.types.Lane, lower-cased): label values
# the codes an accepted job fails with (the JobFailed classes: worker, long_audio, brokers): their
# series start at zero, so that rate() sees the first failure after a start (a series born at 1
# shows no increase)
FAILURE_CODES = tuple(sorted({c.code for c in (JobFailed, *JobFailed.__subclasses__())}))
UNMATCHED_ROUTE = "unmatched"  # the route label of a path no route answers (never the raw path)
_CODE_RE = re.compile(r"^[a-z][a-z0-9_]{0,63}$")  # an error code fit to be a label value


def _text(value: Any) -> str:
    """A label value from a str, or an Enum's lower-case name (``Lane.BULK`` -> ``bulk``)."""
    return value.name.lower() if isinstance(value, enum.Enum) else str(value)


# what a sibling web process counts that its owner's /metrics adds up (the requests it answered,
# the submits it refused, its event loop's lag)
SIBLING_FAMILIES = frozenset(PREFIX + name for name in (
    "request_failure", "request_rejected", "event_loop_lag_seconds", "http_requests",
    "http_request_duration_seconds", "http_refusals"))


def _seconds(value: float) -> float:
    """A duration to record: negative or NaN (clock trouble) counts as 0."""
    value = float(value)
    return value if value >= 0 else 0.0


def error_code_label(code: Any) -> str:
    """An error code as a label value: our codes are short snake_case words; no code (a body
    without one, e.g. a probe's 503) is ``none``, anything else ``other``, so a client cannot mint
    series."""
    if code is None:
        return "none"
    code = _text(code)
    return code if _CODE_RE.match(code) else "other"


def build_version() -> str:
    """The distribution's version, else the checkout's pyproject.toml, else ``unknown``."""
    try:
        from importlib.metadata import version

        return version("sensevoice-app")
    except Exception:
        pass
    try:
        import tomllib

        path = Path(__file__).resolve().parents[2] / "pyproject.toml"
        return str(tomllib.loads(path.read_text())["project"]["version"])
    except Exception:
        return "unknown"


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except Exception:  # the metrics must not need torch (a bare api process, a test)
        return "none"


# ---------------------------------------------------------------------- the service's metrics
class Metrics:
    """All metrics of one service process, on their own registry. Every method is thread-safe.

    ``devices`` are the service's devices (``cuda:0``, ``cpu``): per-device series start at zero,
    and the CUDA ones are the GPUs the NVML sampler reads. ``nvml`` replaces the ``pynvml`` module
    (tests pass a fake); None imports ``pynvml`` at ``start``.
    """

    def __init__(self, devices: list[str], nvml_interval_s: float = DEFAULT_NVML_INTERVAL_S, *,
                 nvml: Any = None):
        self.devices = [_text(d) for d in devices]
        self._siblings_dir: str | None = None  # the siblings' multiprocess files (count_siblings)
        self.registry = r = CollectorRegistry()
        p = PREFIX
        self._success = Counter(f"{p}request_success_total",
                                "Jobs that finished with a transcript (a long recording once, "
                                "however many pieces it was split into).", ("lane",), registry=r)
        self._failure = Counter(f"{p}request_failure_total",
                                "Accepted jobs that ended failed, by error code.", ("lane", "code"),
                                registry=r)
        self._rejected = Counter(f"{p}request_rejected_total",
                                 "Submissions refused before they became a job (REST, OpenAI "
                                 "route or UI), by error code.", ("reason",), registry=r)
        self._audio = Counter(f"{p}audio_seconds_total",
                              "Audio seconds of the jobs that finished with a transcript.",
                              ("lane",), registry=r)
        self._queue = Histogram(f"{p}queue_duration_seconds",
                                "Time a job (or a piece of a long one) waited in the queue before "
                                "its batch started, by lane, seconds.", ("lane",),
                                buckets=LATENCY_BUCKETS, registry=r)
        self._job_time = Histogram(f"{p}job_duration_seconds",
                                   "Time from a job's entry into the queue to its result stored, "
                                   "by lane, seconds (a long recording: from its last piece's "
                                   "entry).", ("lane",), buckets=LATENCY_BUCKETS, registry=r)
        self._loop_lag = Histogram(f"{p}event_loop_lag_seconds",
                                   "How late the event loop's once-a-second heartbeat woke, "
                                   "seconds (a blocked loop stalls every request of the process).",
                                   buckets=LOOP_LAG_BUCKETS, registry=r)
        self._compute = Histogram(f"{p}compute_duration_seconds",
                                  "Time one batch ran on its device, seconds.", ("device",),
                                  buckets=LATENCY_BUCKETS, registry=r)
        self._inferences = Counter(f"{p}inference_count_total",
                                   "Items (clips, pieces) inferred; divide by executions for the "
                                   "mean batch size.", ("device",), registry=r)
        self._executions = Counter(f"{p}execution_count_total", "Batches executed.", ("device",),
                                   registry=r)
        self._http = Counter(f"{p}http_requests_total",
                             "HTTP requests answered, by method, route template and status.",
                             ("method", "route", "status"), registry=r)
        self._http_time = Histogram(f"{p}http_request_duration_seconds",
                                    "Time from a request's arrival to the end of its answer, "
                                    "seconds.", ("method", "route"), buckets=LATENCY_BUCKETS,
                                    registry=r)
        self._refusals = Counter(f"{p}http_refusals_total",
                                 "HTTP answers with an error status (4xx, 5xx), by route template, "
                                 "status and the error code of the JSON body.",
                                 ("route", "status", "code"), registry=r)
        build = Gauge(f"{p}build_info", "Always 1; the labels say what runs.",
                      ("version", "torch", "python", "device"), registry=r,
                      multiprocess_mode="liveall")  # (a sibling's: gone with it, mark_process_dead)
        build.labels(build_version(), _torch_version(), platform.python_version(),
                     ",".join(self.devices) or "none").set(1)
        for d in self.devices:  # per-device series start at zero
            for family in (self._compute, self._inferences, self._executions):
                family.labels(d)
        for lane in LANES:  # so do the per-lane waits and the known failures
            self._queue.labels(lane)
            self._job_time.labels(lane)
            for code in FAILURE_CODES:
                self._failure.labels(lane, code)
        ProcessCollector(registry=r)  # process_cpu_seconds_total, process_resident_memory_bytes, ...
        PlatformCollector(registry=r)  # python_info
        GCCollector(registry=r)  # python_gc_*
        self._queue_depth_fn: Callable[[], int] | None = None
        self._jobs_fn: Callable[[], dict[str, int]] | None = None
        self._backlog_fn: Callable[[], tuple[int, float]] | None = None
        self._lanes_fn: Callable[[], dict] | None = None
        self._workers_fn: Callable[[], int] | None = None
        self._broker_up_fn: Callable[[], bool] | None = None
        self._live_lane_fn: Callable[[], tuple[int, int, int] | None] | None = None
        r.register(_CallbackCollector(self))
        self._gpus = GpuSampler(self.devices, nvml_interval_s, nvml=nvml)
        r.register(self._gpus)

    # ------------------------------------------------------------------ updates
    def request_success(self, lane: str, audio_seconds: float = 0.0) -> None:
        """One job finished with a transcript (call once per job, not per piece)."""
        key = _text(lane)
        self._success.labels(key).inc()
        self._audio.labels(key).inc(_seconds(audio_seconds))

    def jobs_done(self, lane: str, audio_seconds: float, job_seconds: list[float]) -> None:
        """Jobs of one lane finished with a transcript, counted at once (a worker's batch): their
        audio in all, and each one's time from queue entry to stored result."""
        key = _text(lane)
        self._success.labels(key).inc(len(job_seconds))
        self._audio.labels(key).inc(_seconds(audio_seconds))
        hist = self._job_time.labels(key)
        for t in job_seconds:
            hist.observe(_seconds(t))

    def request_failure(self, lane: str, code: str) -> None:
        self._failure.labels(_text(lane), _text(code)).inc()

    def rejected(self, reason: str) -> None:
        self._rejected.labels(_text(reason)).inc()

    def observe_queues(self, lane: str, waits: list[float]) -> None:
        """The waits in the queue of a batch's jobs of one lane, when the batch starts (once per
        job; the series looked up once)."""
        hist = self._queue.labels(_text(lane))
        for t in waits:
            hist.observe(_seconds(t))

    def observe_job(self, seconds: float, lane: str) -> None:
        """One job's time from queue entry to stored result (call once per job)."""
        self._job_time.labels(_text(lane)).observe(_seconds(seconds))

    def observe_loop_lag(self, seconds: float) -> None:
        """How much later than asked the event loop's heartbeat woke."""
        self._loop_lag.observe(_seconds(seconds))

    def observe_compute(self, seconds: float, batch_size: int, device: str) -> None:
        """One batch of ``batch_size`` items that ran ``seconds`` on ``device``."""
        key = _text(device)
        self._compute.labels(key).observe(_seconds(seconds))
        self._inferences.labels(key).inc(int(batch_size))
        self._executions.labels(key).inc()

    def observe_http(self, method: str, route: str, status: int, seconds: float,
                     code: str | None = None) -> None:
        """One HTTP answer; ``route`` is the route template (``/api/jobs/{job_id}``), never the raw
        path. An error status (>= 400) is also counted by its error ``code``."""
        method, status_s = method.upper(), str(int(status))
        self._http.labels(method, route, status_s).inc()
        self._http_time.labels(method, route).observe(_seconds(seconds))
        if int(status) >= 400:
            self._refusals.labels(route, status_s, error_code_label(code)).inc()

    # ------------------------------------------------------------------ scrape-time gauges
    def set_queue_depth_fn(self, fn: Callable[[], int]) -> None:
        self._queue_depth_fn = fn

    def set_jobs_by_state_fn(self, fn: Callable[[], dict[str, int]]) -> None:
        self._jobs_fn = fn

    def set_lanes_fn(self, fn: Callable[[], dict]) -> None:
        """``fn() -> {lane: items waiting}`` (cluster-wide in the distributed topology)."""
        self._lanes_fn = fn

    def set_workers_fn(self, fn: Callable[[], int]) -> None:
        """``fn() -> worker processes alive`` (distributed: one that died drops out)."""
        self._workers_fn = fn

    def set_broker_up_fn(self, fn: Callable[[], bool]) -> None:
        """``fn() -> whether the broker (Redis) answered the last check`` (distributed only)."""
        self._broker_up_fn = fn

    def set_live_lane_fn(self, fn: Callable[[], tuple[int, int, int] | None]) -> None:
        """``fn() -> (workers beating on the live lane, re-decodes moved, re-decodes lost)`` as an
        api process of the distributed topology sees them (None before its first live stream)."""
        self._live_lane_fn = fn

    def set_backlog_fn(self, fn: Callable[[], tuple[int, float]]) -> None:
        """``fn() -> (jobs, audio seconds)`` of long recordings accepted and not yet finished."""
        self._backlog_fn = fn

    # ------------------------------------------------------------------ lifecycle and output
    def start(self) -> None:
        """Start the NVML sampler if a CUDA device and NVML are present; never raises for their lack."""
        self._gpus.start()

    def stop(self) -> None:
        self._gpus.stop()

    def count_siblings(self, path: str) -> None:
        """Add what the sibling web processes count in ``path`` (their PROMETHEUS_MULTIPROC_DIR)
        to this process's ``SIBLING_FAMILIES`` when rendered."""
        self._siblings_dir = path

    def sibling_gone(self, pid: int) -> None:
        """A sibling died: its live gauges go (its counters stay: what it answered was answered)."""
        if self._siblings_dir is not None:
            mark_process_dead(pid, self._siblings_dir)

    def render(self) -> str:
        """All metrics in the Prometheus text format 0.0.4 (serve with ``CONTENT_TYPE``)."""
        if self._siblings_dir is None:
            return generate_latest(self.registry).decode("utf-8")
        return generate_latest(_WithSiblings(self.registry, self._siblings_dir)).decode("utf-8")


class _WithSiblings:
    """A registry's families with the siblings' samples of ``SIBLING_FAMILIES`` added: the same
    series summed, a series only a sibling has appended (``generate_latest`` reads ``collect``)."""

    def __init__(self, registry: CollectorRegistry, path: str):
        self.registry, self.path = registry, path

    def collect(self) -> Iterator[Metric]:
        try:
            theirs = {m.name: m for m in MultiProcessCollector(None, self.path).collect()
                      if m.name in SIBLING_FAMILIES}
        except Exception:  # a file being written (or gone): this scrape shows this process only
            logger.warning("the sibling web processes' metrics could not be read", exc_info=True)
            theirs = {}
        for family in self.registry.collect():
            other = theirs.get(family.name)
            yield family if other is None else _summed(family, other)


def _summed(own: Metric, other: Metric) -> Metric:
    """``own`` with ``other``'s samples added to those of the same name and labels."""
    at: dict[tuple, int] = {}
    samples = list(own.samples)
    for i, sample in enumerate(samples):
        at[(sample.name, tuple(sorted(sample.labels.items())))] = i
    for sample in other.samples:
        key = (sample.name, tuple(sorted(sample.labels.items())))
        i = at.get(key)
        if i is None:
            at[key] = len(samples)
            samples.append(sample)
        else:
            samples[i] = samples[i]._replace(value=samples[i].value + sample.value)
    out = Metric(own.name, own.documentation, own.type, own.unit)
    out.samples = samples
    return out


class _CallbackCollector:
    """The gauges read from the service's callbacks when Prometheus scrapes (no thread)."""

    def __init__(self, metrics: Metrics):
        self._m = metrics

    def describe(self) -> list:
        return []  # names vary with the callbacks set; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        m, p = self._m, PREFIX
        depth = _call(m._queue_depth_fn, "queue depth")
        if depth is not None:
            yield GaugeMetricFamily(f"{p}queue_depth", "Jobs waiting in the queue.", value=int(depth))
        lanes = _call(m._lanes_fn, "queue depth per lane")
        if lanes is not None:
            g = GaugeMetricFamily(f"{p}queue_depth_lane", "Jobs waiting in the queue, by lane.",
                                  labels=("lane",))
            for k, n in sorted(lanes.items(), key=lambda kv: _text(kv[0])):
                g.add_metric([_text(k)], int(n))
            yield g
        workers = _call(m._workers_fn, "live workers")
        if workers is not None:
            yield GaugeMetricFamily(f"{p}workers_alive", "Worker processes that claimed work "
                                    "within the visibility timeout (shared broker), or this "
                                    "process's worker threads alive (embedded).", value=int(workers))
        up = _call(m._broker_up_fn, "broker state")
        if up is not None:
            yield GaugeMetricFamily(f"{p}broker_up", "1 while the broker (Redis) answers this "
                                    "process, else 0.", value=1 if up else 0)
        lane = _call(m._live_lane_fn, "live lane")
        if lane is not None:
            workers, moved, lost = lane
            yield GaugeMetricFamily(f"{p}live_lane_workers", "Worker processes beating on the live "
                                    "lane, as this api process last saw them.", value=int(workers))
            yield CounterMetricFamily(f"{p}live_redecodes_moved", "Live re-decodes moved to another "
                                      "worker because the one holding them stopped beating.",
                                      value=int(moved))
            yield CounterMetricFamily(f"{p}live_redecodes_lost", "Live re-decodes whose worker "
                                      "stopped with no other to take them (live_worker_lost).",
                                      value=int(lost))
        backlog = _call(m._backlog_fn, "backlog")
        if backlog is not None:
            yield GaugeMetricFamily(f"{p}backlog_jobs", "Long recordings accepted and not yet "
                                    "finished (splitting or running).", value=int(backlog[0]))
            yield GaugeMetricFamily(f"{p}backlog_audio_seconds", "Audio seconds of the long "
                                    "recordings in the backlog.", value=float(backlog[1]))
        jobs = _call(m._jobs_fn, "jobs by state")
        if jobs is not None:
            g = GaugeMetricFamily(f"{p}jobs", "Jobs in the store, by state.", labels=("state",))
            for s, n in sorted(jobs.items(), key=lambda kv: _text(kv[0])):
                g.add_metric([_text(s)], int(n))
            yield g


def _call(fn: Callable[[], Any] | None, what: str) -> Any:
    if fn is None:
        return None
    try:
        return fn()
    except Exception as e:  # a scrape must not fail because one gauge could not be read
        logger.warning("metrics: could not read %s: %s", what, e)
        return None


# ---------------------------------------------------------------------- NVML
@dataclass(frozen=True, eq=False)  # hashed by identity: NVML handles are ctypes pointers
class _Gpu:
    device: str  # the service's name, e.g. cuda:0
    uuid: str
    handle: Any


def cuda_ordinal(device: str) -> int | None:
    """0 for ``cuda``, N for ``cuda:N``, None for any other device."""
    kind, _, index = device.partition(":")
    if kind != "cuda":
        return None
    return int(index) if index else 0


def nvml_ids(devices: Iterable[str], cuda_visible: str | None) -> list[tuple[str, int | str]]:
    """The NVML index (int) or UUID (str) of each CUDA device, honouring ``CUDA_VISIBLE_DEVICES``.

    Assumes CUDA numbers GPUs in NVML's (PCI bus) order, which holds with
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` or identical GPUs. Devices that cannot be mapped are left out.
    """
    visible = [v.strip() for v in cuda_visible.split(",")] if cuda_visible is not None else None
    out: list[tuple[str, int | str]] = []
    for device in devices:
        n = cuda_ordinal(device)
        if n is None:
            continue
        if visible is None:
            out.append((device, n))
        elif n < len(visible) and visible[n]:
            entry = visible[n]
            out.append((device, int(entry) if entry.isdigit() else entry))
        else:
            logger.info("metrics: %s is not in CUDA_VISIBLE_DEVICES=%r; no GPU gauges for it",
                        device, cuda_visible)
    return out


class GpuSampler:
    """Samples the service's GPUs through NVML on a daemon thread; a custom collector: ``collect``
    yields the latest sample as gauges (none before ``start``, after ``stop`` or without NVML)."""

    def __init__(self, devices: list[str], interval_s: float = DEFAULT_NVML_INTERVAL_S, *,
                 nvml: Any = None):
        self.devices = devices
        self.interval_s = interval_s
        self._nvml = nvml
        self._gpus: list[_Gpu] = []
        self._latest: dict[_Gpu, dict[str, float]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._initialised = False
        self._told: set[str] = set()  # messages already logged once

    def _once(self, level: int, key: str, msg: str, *args: Any) -> None:
        if key not in self._told:
            self._told.add(key)
            logger.log(level, msg, *args)

    def start(self) -> None:
        if self._thread is not None and self._thread.is_alive():
            return
        ids = nvml_ids(self.devices, os.environ.get("CUDA_VISIBLE_DEVICES"))
        if not ids:
            return
        if not self._init():
            return
        self._gpus = self._handles(ids)
        if not self._gpus:
            self._shutdown()
            return
        self._sample()  # the first scrape after start already has GPU data
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sensevoice-nvml", daemon=True)
        self._thread.start()
        logger.info("metrics: sampling %s every %.2f s",
                    ", ".join(g.device for g in self._gpus), self.interval_s)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 5)
            self._thread = None
        self._shutdown()
        with self._lock:
            self._latest = {}

    def _init(self) -> bool:
        try:
            if self._nvml is None:
                import pynvml

                self._nvml = pynvml
            self._nvml.nvmlInit()
        except Exception as e:  # ImportError, NVMLError (no driver / library): no GPU gauges
            self._once(logging.INFO, "init", "metrics: NVML not available, no GPU gauges (%s)", e)
            return False
        self._initialised = True
        return True

    def _shutdown(self) -> None:
        if self._initialised:
            self._initialised = False
            try:
                self._nvml.nvmlShutdown()
            except Exception as e:
                logger.debug("metrics: nvmlShutdown failed: %s", e)

    def _handles(self, ids: list[tuple[str, int | str]]) -> list[_Gpu]:
        nvml, out = self._nvml, []
        for device, ident in ids:
            try:
                handle = (nvml.nvmlDeviceGetHandleByIndex(ident) if isinstance(ident, int)
                          else nvml.nvmlDeviceGetHandleByUUID(ident))
                uuid = nvml.nvmlDeviceGetUUID(handle)
            except Exception as e:
                self._once(logging.INFO, f"handle {device}",
                           "metrics: NVML cannot find %s (%r): %s", device, ident, e)
                continue
            out.append(_Gpu(device, uuid.decode() if isinstance(uuid, bytes) else str(uuid), handle))
        return out

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._sample()
            except Exception:  # the sampler must outlive a bad reading
                self._once(logging.WARNING, "sample", "metrics: NVML sampling failed", exc_info=True)

    def _sample(self) -> None:
        latest = {gpu: self._read(gpu) for gpu in self._gpus}
        with self._lock:
            self._latest = latest

    def _read(self, gpu: _Gpu) -> dict[str, float]:
        """One GPU's gauges; a reading the GPU does not support (MIG, some boards) is left out."""
        nvml, h, out = self._nvml, gpu.handle, {}
        mem = self._try(gpu, "memory", nvml.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            out.update(gpu_memory_used_bytes=int(mem.used), gpu_memory_free_bytes=int(mem.free),
                       gpu_memory_total_bytes=int(mem.total))
        temp = self._try(gpu, "temperature", nvml.nvmlDeviceGetTemperature, h,
                         getattr(nvml, "NVML_TEMPERATURE_GPU", 0))
        power = self._try(gpu, "power", nvml.nvmlDeviceGetPowerUsage, h)
        clock = self._try(gpu, "clock", nvml.nvmlDeviceGetClockInfo, h,
                          getattr(nvml, "NVML_CLOCK_SM", 1))
        util = self._try(gpu, "utilization", nvml.nvmlDeviceGetUtilizationRates, h)
        for name, value in (("gpu_temperature_celsius", temp),
                            ("gpu_sm_clock_hertz", None if clock is None else clock * HZ_PER_MHZ),
                            ("gpu_power_watts", None if power is None else power / MW_PER_W),
                            ("gpu_utilization_ratio", None if util is None else util.gpu / 100)):
            if value is not None:
                out[name] = value
        return out

    def _try(self, gpu: _Gpu, what: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except Exception as e:
            self._once(logging.INFO, f"{gpu.device} {what}",
                       "metrics: %s: NVML cannot read %s (%s); gauge left out", gpu.device, what, e)
            return None

    def describe(self) -> list:
        return []  # the GPU series come and go with NVML; nothing to check at registration

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            latest = self._latest
        for name, help_text in GPU_GAUGES:
            rows = [(gpu, values[name]) for gpu, values in latest.items() if name in values]
            if not rows:
                continue
            g = GaugeMetricFamily(PREFIX + name, help_text, labels=GPU_LABELS)
            for gpu, value in rows:
                g.add_metric([gpu.device, gpu.uuid], value)
            yield g
