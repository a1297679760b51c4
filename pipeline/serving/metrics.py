"""Prometheus metrics named after Triton's (prefix ``sensevoice_``), rendered by hand in the text
exposition format 0.0.4. No dependency beyond the standard library; NVML (``pynvml``) is optional.

Counters and histograms are updated from request threads and worker threads under one lock. Gauges
are read at scrape time: the queue depth and the job counts from callbacks, the GPU gauges from the
latest NVML sample, which a daemon thread takes every ``nvml_interval_s``. Without NVML (no driver,
a CPU machine) there are simply no GPU gauges.

A *rejected* request never became a job (queue full, bad input, not ready); a *failure* is an
accepted job that ended failed. Label values must come from small fixed sets (lanes, error codes,
device names), never from user input: every distinct value is a series kept for the process's life.
"""

from __future__ import annotations

import bisect
import enum
import logging
import math
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Iterator

logger = logging.getLogger("sensevoice.metrics")

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "sensevoice_"
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0, 60.0)  # seconds (upper bounds); +Inf is implicit
DEFAULT_NVML_INTERVAL_S = 0.5  # seconds between two NVML samples
US_PER_S = 1_000_000  # microseconds per second
MW_PER_W = 1000  # NVML reports power in milliwatts
GPU_LABELS = ("device", "gpu_uuid")
GPU_GAUGES = (  # name (without prefix), help; one sample per GPU, labelled GPU_LABELS
    ("gpu_memory_used_bytes", "GPU memory in use (all processes), bytes."),
    ("gpu_memory_free_bytes", "GPU memory free, bytes."),
    ("gpu_memory_total_bytes", "GPU memory in total, bytes."),
    ("gpu_temperature_celsius", "GPU core temperature, degrees Celsius."),
    ("gpu_power_watts", "GPU power draw, watts."),
    ("gpu_sm_clock_mhz", "GPU SM clock, MHz."),
    ("gpu_utilization_ratio", "Fraction of NVML's last sample period in which a kernel ran (0..1)."),
)


# ---------------------------------------------------------------------- exposition helpers
def escape_label_value(value: str) -> str:
    """Escape a label value: backslash, double quote and newline (format 0.0.4)."""
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float) -> str:
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _sample(name: str, labels: Iterable[tuple[str, str]], value: float) -> str:
    body = ",".join(f'{k}="{escape_label_value(v)}"' for k, v in labels)
    return f"{name}{{{body}}} {_number(value)}" if body else f"{name} {_number(value)}"


def _header(name: str, kind: str, help_text: str) -> list[str]:
    return [f"# HELP {name} {_escape_help(help_text)}", f"# TYPE {name} {kind}"]


def _text(value: Any) -> str:
    """A label value from a str, or an Enum's lower-case name (``Lane.BULK`` -> ``bulk``)."""
    return value.name.lower() if isinstance(value, enum.Enum) else str(value)


# ---------------------------------------------------------------------- metric families
class _Counter:
    """A counter family; series keyed by their label values. Callers hold the Metrics lock."""

    def __init__(self, name: str, help_text: str, label_names: tuple[str, ...] = ()):
        self.name, self.help, self.label_names = name, help_text, label_names
        self.values: dict[tuple[str, ...], float] = {}

    def inc(self, key: tuple[str, ...], amount: float = 1) -> None:
        self.values[key] = self.values.get(key, 0) + amount

    def lines(self) -> list[str]:
        out = _header(self.name, "counter", self.help)
        for key in sorted(self.values):
            out.append(_sample(self.name, zip(self.label_names, key), self.values[key]))
        return out


class _Series:
    __slots__ = ("buckets", "sum", "count")

    def __init__(self, n_buckets: int):
        self.buckets = [0] * (n_buckets + 1)  # per bucket, not cumulative; the last is +Inf
        self.sum = 0.0
        self.count = 0


class _Histogram:
    """A histogram family; ``le`` is inclusive, as Prometheus defines it. Callers hold the lock."""

    def __init__(self, name: str, help_text: str, label_names: tuple[str, ...] = (),
                 bounds: tuple[float, ...] = LATENCY_BUCKETS):
        self.name, self.help, self.label_names, self.bounds = name, help_text, label_names, bounds
        self.series: dict[tuple[str, ...], _Series] = {}

    def _get(self, key: tuple[str, ...]) -> _Series:
        s = self.series.get(key)
        if s is None:
            s = self.series[key] = _Series(len(self.bounds))
        return s

    def observe(self, key: tuple[str, ...], value: float) -> None:
        s = self._get(key)
        s.buckets[bisect.bisect_left(self.bounds, value)] += 1
        s.sum += value
        s.count += 1

    def lines(self) -> list[str]:
        out = _header(self.name, "histogram", self.help)
        for key in sorted(self.series):
            s, labels = self.series[key], list(zip(self.label_names, key))
            running = 0
            for bound, n in zip((*self.bounds, math.inf), s.buckets):
                running += n
                out.append(_sample(f"{self.name}_bucket", [*labels, ("le", _number(bound))], running))
            out.append(_sample(f"{self.name}_sum", labels, s.sum))
            out.append(_sample(f"{self.name}_count", labels, s.count))
        return out


def _seconds(value: float) -> float:
    """A duration to record: negative or NaN (clock trouble) counts as 0."""
    value = float(value)
    return value if value >= 0 else 0.0


# ---------------------------------------------------------------------- the service's metrics
class Metrics:
    """All metrics of one service process. Every method is thread-safe.

    ``devices`` are the service's devices (``cuda:0``, ``cpu``): per-device series start at zero,
    and the CUDA ones are the GPUs the NVML sampler reads. ``nvml`` replaces the ``pynvml`` module
    (tests pass a fake); None imports ``pynvml`` at ``start``.
    """

    def __init__(self, devices: list[str], nvml_interval_s: float = DEFAULT_NVML_INTERVAL_S, *,
                 nvml: Any = None):
        self.devices = [_text(d) for d in devices]
        self._lock = threading.Lock()
        p = PREFIX
        self._success = _Counter(f"{p}request_success_total",
                                 "Jobs that finished with a transcript.", ("lane",))
        self._failure = _Counter(f"{p}request_failure_total",
                                 "Accepted jobs that ended failed, by error code.", ("lane", "code"))
        self._rejected = _Counter(f"{p}request_rejected_total",
                                  "Requests refused before they became a job.", ("reason",))
        self._queue = _Histogram(f"{p}queue_duration_seconds",
                                 "Time a job waited in the queue before its batch started, seconds.")
        self._queue_us = _Counter(f"{p}queue_duration_us_total",
                                  "Cumulative time jobs waited in the queue, microseconds.")
        self._compute = _Histogram(f"{p}compute_duration_seconds",
                                   "Time one batch ran on its device, seconds.", ("device",))
        self._compute_us = _Counter(f"{p}compute_duration_us_total",
                                    "Cumulative batch compute time, microseconds.", ("device",))
        self._inferences = _Counter(f"{p}inference_count_total",
                                    "Items (clips) inferred; divide by executions for the mean "
                                    "batch size.", ("device",))
        self._executions = _Counter(f"{p}execution_count_total",
                                    "Batches executed.", ("device",))
        self._families = (self._success, self._failure, self._rejected, self._queue, self._queue_us,
                          self._compute, self._compute_us, self._inferences, self._executions)
        self._queue_us.inc((), 0.0)
        for d in self.devices:
            self._compute._get((d,))
            for family in (self._compute_us, self._inferences, self._executions):
                family.inc((d,), 0)
        self._queue_depth_fn: Callable[[], int] | None = None
        self._jobs_fn: Callable[[], dict[str, int]] | None = None
        self._backlog_fn: Callable[[], tuple[int, float]] | None = None
        self._lanes_fn: Callable[[], dict] | None = None
        self._workers_fn: Callable[[], int] | None = None
        self._gpus = GpuSampler(self.devices, nvml_interval_s, nvml=nvml)

    # ------------------------------------------------------------------ updates
    def request_success(self, lane: str) -> None:
        with self._lock:
            self._success.inc((_text(lane),))

    def request_failure(self, lane: str, code: str) -> None:
        with self._lock:
            self._failure.inc((_text(lane), _text(code)))

    def rejected(self, reason: str) -> None:
        with self._lock:
            self._rejected.inc((_text(reason),))

    def observe_queue(self, seconds: float) -> None:
        """One job's wait in the queue (call once per job, when its batch starts)."""
        seconds = _seconds(seconds)
        with self._lock:
            self._queue.observe((), seconds)
            self._queue_us.inc((), seconds * US_PER_S)

    def observe_compute(self, seconds: float, batch_size: int, device: str) -> None:
        """One batch of ``batch_size`` items that ran ``seconds`` on ``device``."""
        seconds, key = _seconds(seconds), (_text(device),)
        with self._lock:
            self._compute.observe(key, seconds)
            self._compute_us.inc(key, seconds * US_PER_S)
            self._inferences.inc(key, int(batch_size))
            self._executions.inc(key, 1)

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

    def set_backlog_fn(self, fn: Callable[[], tuple[int, float]]) -> None:
        """``fn() -> (jobs, audio seconds)`` of long recordings accepted and not yet finished."""
        self._backlog_fn = fn

    def _callback_lines(self) -> list[str]:
        out: list[str] = []
        depth = _call(self._queue_depth_fn, "queue depth")
        if depth is not None:
            out += _header(f"{PREFIX}queue_depth", "gauge", "Jobs waiting in the queue.")
            out.append(_sample(f"{PREFIX}queue_depth", (), int(depth)))
        lanes = _call(self._lanes_fn, "queue depth per lane")
        if lanes is not None:
            out += _header(f"{PREFIX}queue_depth_lane", "gauge", "Jobs waiting in the queue, by lane.")
            out += [_sample(f"{PREFIX}queue_depth_lane", [("lane", _text(k))],
                            int(n)) for k, n in sorted(lanes.items())]
        workers = _call(self._workers_fn, "live workers")
        if workers is not None:
            out += _header(f"{PREFIX}workers_alive", "gauge",
                           "Worker processes that claimed work within the visibility timeout.")
            out.append(_sample(f"{PREFIX}workers_alive", (), int(workers)))
        backlog = _call(self._backlog_fn, "backlog")
        if backlog is not None:
            out += _header(f"{PREFIX}backlog_jobs", "gauge",
                           "Long recordings accepted and not yet finished (splitting or running).")
            out.append(_sample(f"{PREFIX}backlog_jobs", (), int(backlog[0])))
            out += _header(f"{PREFIX}backlog_audio_seconds", "gauge",
                           "Audio seconds of the long recordings in the backlog.")
            out.append(_sample(f"{PREFIX}backlog_audio_seconds", (), float(backlog[1])))
        jobs = _call(self._jobs_fn, "jobs by state")
        if jobs is not None:
            out += _header(f"{PREFIX}jobs", "gauge", "Jobs in the store, by state.")
            out += [_sample(f"{PREFIX}jobs", [("state", _text(s))], int(n))
                    for s, n in sorted(jobs.items(), key=lambda kv: _text(kv[0]))]
        return out

    # ------------------------------------------------------------------ lifecycle and output
    def start(self) -> None:
        """Start the NVML sampler if a CUDA device and NVML are present; never raises for their lack."""
        self._gpus.start()

    def stop(self) -> None:
        self._gpus.stop()

    def render(self) -> str:
        """All metrics in the Prometheus text format 0.0.4 (serve with ``CONTENT_TYPE``)."""
        with self._lock:
            lines = [line for family in self._families for line in family.lines()]
        lines += self._callback_lines()  # outside the lock: callbacks may be slow (SQLite)
        lines += self._gpus.lines()
        return "\n".join(lines) + "\n"


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
    """Samples the service's GPUs through NVML on a daemon thread; ``lines`` renders the latest."""

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
        for name, value in (("gpu_temperature_celsius", temp), ("gpu_sm_clock_mhz", clock),
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

    def lines(self) -> list[str]:
        with self._lock:
            latest = self._latest
        return list(_gpu_lines(latest))


def _gpu_lines(latest: dict[_Gpu, dict[str, float]]) -> Iterator[str]:
    for name, help_text in GPU_GAUGES:
        rows = [(gpu, values[name]) for gpu, values in latest.items() if name in values]
        if not rows:
            continue
        yield from _header(PREFIX + name, "gauge", help_text)
        for gpu, value in rows:
            yield _sample(PREFIX + name, zip(GPU_LABELS, (gpu.device, gpu.uuid)), value)
