"""``sensevoice doctor``: can this machine serve, and if not, what to do about it.

    sensevoice doctor [--model DIR|NAME | --demo] [--device cuda|cpu] [--data-dir DIR]
                      [--broker redis://...] [--role all|api|worker] [--json]

One :class:`Check` per fact, each ``ok``, ``warn`` or ``fail``, the last two with a fix:

* ``python``, ``torch``: versions (torch missing: fail);
* ``cuda``: CUDA and cuDNN versions torch was built with and whether a GPU is visible (none: warn,
  the CPU is slow; fail when ``--device cuda`` asks for one);
* ``gpu:N``: each GPU's name and free / total memory, from NVML (warn under the service's
  ``min_free_memory_ratio``, where it refuses new jobs);
* ``pyav``: PyAV and its FFmpeg version, and the decoders the service needs (one missing: fail);
* ``model``: the model directory and its files (a hub name: the local cache, else whether it can
  be downloaded; the demo: built or to be built offline);
* ``hub``: whether the model hub answers a TCP connect (only a download needs it: warn);
* ``data_dir``: writable (a real file is created and removed), and the disk space free;
* ``broker``: Redis answers PING, when ``--broker`` is set.

Each network probe is bounded: it runs in a thread joined with a deadline (:data:`PROBE_TIMEOUT_S`;
a DNS lookup has no timeout of its own), so the doctor answers within seconds offline.

/readyz shows the same report under ``details``: :class:`DoctorCache` keeps the latest one for
``ttl_s`` seconds and refreshes it on a background thread, so a probe never waits for the checks.
The CLI prints a table and exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import enum
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

if TYPE_CHECKING:
    from pipeline.config import Settings

PROBE_TIMEOUT_S = 2.0  # s, the longest one network probe (hub connect, Redis PING) may take
MIN_PYTHON = (3, 10)
# decoders of the formats people upload (mp3, m4a/aac, ogg and webm opus/vorbis, flac, wav)
DECODERS = ("mp3", "aac", "opus", "vorbis", "flac", "pcm_s16le")
LOW_DISK_BYTES = 2 * 1024**3  # under this free on the data dir's disk: warn
GIB = 1024**3
T = TypeVar("T")


class Status(str, enum.Enum):
    OK = "ok"
    WARN = "warn"
    FAIL = "fail"


@dataclass(frozen=True)
class Check:
    """One fact: ``detail`` says what was found; ``fix`` what to do (warn and fail)."""

    name: str
    status: Status
    detail: str
    fix: str = ""


@dataclass(frozen=True)
class Report:
    checks: tuple[Check, ...]
    checked_at: float  # unix seconds
    took_s: float  # seconds the checks took

    @property
    def ok(self) -> bool:
        """No check failed (warnings allowed)."""
        return all(c.status is not Status.FAIL for c in self.checks)

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checks if c.name == name), None)

    def to_dict(self) -> dict:
        return {"ok": self.ok, "checked_at": self.checked_at, "took_s": round(self.took_s, 3),
                "checks": [{**asdict(c), "status": c.status.value} for c in self.checks]}


def bounded(fn: Callable[[], T], timeout_s: float, default: T) -> T:
    """``fn()`` on a daemon thread; ``default`` when it raises or is not back within ``timeout_s``
    (a thread stuck in a DNS lookup is left to finish on its own)."""
    box: list = []

    def run():
        try:
            box.append(fn())
        except Exception:
            pass

    t = threading.Thread(target=run, name="sensevoice-doctor-probe", daemon=True)
    t.start()
    t.join(timeout_s)
    return box[0] if box else default


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------


def check_python() -> Check:
    version = platform.python_version()
    if sys.version_info[:2] < MIN_PYTHON:
        return Check("python", Status.FAIL, f"{version} ({sys.executable})",
                     f"use Python {'.'.join(map(str, MIN_PYTHON))} or newer")
    return Check("python", Status.OK, f"{version} ({sys.executable})")


def check_torch_and_cuda(settings: "Settings") -> list[Check]:
    try:
        import torch
    except ImportError as e:
        return [Check("torch", Status.FAIL, f"not importable: {e}",
                      "pip install -r requirements.txt (torch and torchaudio as pinned there)")]
    checks = [Check("torch", Status.OK, torch.__version__)]
    built = f"CUDA {torch.version.cuda or 'none (CPU-only build)'}"
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    if cudnn:
        built += f", cuDNN {cudnn // 10000}.{cudnn % 10000 // 100}.{cudnn % 100}"
    wants_gpu = settings.engine.device.startswith("cuda")
    if settings.server.role == "api":
        checks.append(Check("cuda", Status.OK, f"{built}; the api role needs no GPU"))
    elif torch.cuda.is_available():
        checks.append(Check("cuda", Status.OK, f"{built}; {torch.cuda.device_count()} GPU(s) visible"))
    else:
        fix = ("check nvidia-smi, the NVIDIA driver, CUDA_VISIBLE_DEVICES and the container's GPU "
               "access (docker --gpus all)" + ("" if wants_gpu else "; or keep the CPU (slow)"))
        if torch.version.cuda is None:
            fix = "install a CUDA build of torch (requirements.txt pins one)"
        effect = f"--device {settings.engine.device} cannot run" if wants_gpu else "runs on the CPU, slowly"
        checks.append(Check("cuda", Status.FAIL if wants_gpu else Status.WARN,
                            f"{built}; no GPU visible: {effect}", fix))
    return checks


def check_gpus(settings: "Settings") -> list[Check]:
    """Each GPU NVML sees (index, name, free / total memory); none when NVML is absent."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return []
    checks = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(handle)
            name = name.decode() if isinstance(name, bytes) else name
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            ratio = mem.free / mem.total if mem.total else 0.0
            detail = f"{name}, {mem.free / GIB:.1f} of {mem.total / GIB:.1f} GiB free ({ratio:.0%})"
            if ratio < settings.limits.min_free_memory_ratio:
                checks.append(Check(f"gpu:{i}", Status.WARN, detail,
                                    f"the service refuses new jobs under {settings.limits.min_free_memory_ratio:.0%} "
                                    "free: see who holds it with nvidia-smi, or lower "
                                    "SENSEVOICE_MIN_FREE_MEMORY_RATIO"))
            else:
                checks.append(Check(f"gpu:{i}", Status.OK, detail))
    except Exception as e:
        checks.append(Check("gpu", Status.WARN, f"NVML failed: {e}", "check nvidia-smi"))
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:
            pass
    return checks


def check_pyav() -> Check:
    try:
        import av
        from av.codec import Codec
    except ImportError as e:
        return Check("pyav", Status.FAIL, f"not importable: {e}", "pip install -r requirements.txt")
    missing = []
    for name in DECODERS:
        try:
            Codec(name, "r")
        except Exception:
            missing.append(name)
    detail = (f"PyAV {av.__version__}, FFmpeg {getattr(av, 'ffmpeg_version_info', '?')}, "
              f"libavcodec {'.'.join(map(str, av.library_versions.get('libavcodec', ())))}")
    if missing:
        return Check("pyav", Status.FAIL, f"{detail}; missing decoders: {', '.join(missing)}",
                     "install PyAV's wheel from PyPI, which bundles FFmpeg with these decoders "
                     "(pip install --force-reinstall av), not a build on the system's FFmpeg")
    return Check("pyav", Status.OK, f"{detail}; decoders {', '.join(DECODERS)}")


def _files(path: Path) -> str:
    from pipeline.model.loading import REQUIRED_FILES

    sizes = []
    for name in REQUIRED_FILES:
        size = (path / name).stat().st_size
        sizes.append(f"{name} {size / 1024**2:.0f} MB" if size > 1024**2 else name)
    return ", ".join(sizes)


def check_model(settings: "Settings", hub_ok: Callable[[], bool]) -> Check:
    from pipeline.model.loading import HUB_HOST, REQUIRED_FILES, _hub_cache_candidates

    try_demo = "or try the app offline with --demo"
    if settings.server.role == "api":
        return Check("model", Status.OK, "the api role holds no model (workers do)")
    if settings.engine.demo:
        path = Path(settings.server.cache_dir).expanduser() / "models" / "sensevoice-demo-s0"
        if all((path / f).exists() for f in REQUIRED_FILES):
            return Check("model", Status.OK, f"demo (hand-set weights, not a real model) at {path}")
        return Check("model", Status.OK, f"demo: built offline on first start, cached in {path}")
    path = Path(settings.engine.model).expanduser()
    if path.exists():
        missing = [f for f in REQUIRED_FILES if not (path / f).exists()]
        if missing:
            return Check("model", Status.FAIL, f"{path}: missing {', '.join(missing)}",
                         f"point --model (SENSEVOICE_MODEL) at a SenseVoiceSmall directory holding "
                         f"{', '.join(REQUIRED_FILES)}, {try_demo}")
        return Check("model", Status.OK, f"{path} ({_files(path)})")
    for cached in _hub_cache_candidates(settings.engine.model):
        if all((cached / f).exists() for f in REQUIRED_FILES):
            return Check("model", Status.OK, f"{settings.engine.model}, cached at {cached} ({_files(cached)})")
    if "/" not in settings.engine.model:
        return Check("model", Status.FAIL, f"{settings.engine.model!r}: no such directory and not a hub name",
                     f"pass --model DIR (a local SenseVoiceSmall directory) or a hub name such as "
                     f"iic/SenseVoiceSmall, {try_demo}")
    if hub_ok():
        return Check("model", Status.WARN, f"{settings.engine.model}: not cached; downloaded from "
                     f"{HUB_HOST} (about 900 MB) on first start",
                     "start once with the internet, or copy the model directory and pass --model DIR")
    return Check("model", Status.FAIL, f"{settings.engine.model}: not cached, and {HUB_HOST} is unreachable",
                 f"connect to the internet once, or copy the model directory here and pass "
                 f"--model DIR (SENSEVOICE_MODEL=DIR), {try_demo}")


def check_hub(reachable: bool) -> Check:
    from pipeline.model.loading import HUB_HOST, HUB_PORT

    if reachable:
        return Check("hub", Status.OK, f"{HUB_HOST}:{HUB_PORT} reachable")
    return Check("hub", Status.WARN, f"{HUB_HOST}:{HUB_PORT} unreachable (within {PROBE_TIMEOUT_S:g} s)",
                 "only a model download needs it: use a local or cached model, or allow the "
                 "connection (proxy, firewall)")


def check_data_dir(settings: "Settings") -> Check:
    path = Path(settings.server.data_dir).expanduser()
    fix = "set --data-dir (SENSEVOICE_DATA_DIR) to a writable folder"
    if path.exists():
        if not path.is_dir():
            return Check("data_dir", Status.FAIL, f"{path} is not a folder", fix)
        try:
            with tempfile.TemporaryFile(dir=path):
                pass
        except OSError as e:
            return Check("data_dir", Status.FAIL, f"{path} is not writable: {e.strerror or e}", fix)
        free = shutil.disk_usage(path).free
        detail = f"{path.resolve()} writable, {free / GIB:.1f} GiB free"
        if free < LOW_DISK_BYTES:
            return Check("data_dir", Status.WARN, detail,
                         "free disk space: uploads and results are kept for the retention period")
        return Check("data_dir", Status.OK, detail)
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        return Check("data_dir", Status.FAIL, f"{path} cannot be created ({parent} is not a "
                     "writable folder)", fix)
    return Check("data_dir", Status.OK, f"{path.absolute()} does not exist yet; created on start "
                 f"(in {parent}, writable)")


def _redacted(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{':' + str(parts.port) if parts.port else ''}{parts.path}"


def check_broker(settings: "Settings") -> Check | None:
    if not settings.broker.url:
        return None  # embedded: SQLite in the data dir (checked there)
    shown = _redacted(settings.broker.url)

    def ping() -> str:
        import redis

        client = redis.Redis.from_url(settings.broker.url, socket_connect_timeout=PROBE_TIMEOUT_S,
                                      socket_timeout=PROBE_TIMEOUT_S)
        try:
            client.ping()
            return str(client.info("server").get("redis_version", "?"))
        finally:
            client.close()

    version = bounded(ping, PROBE_TIMEOUT_S + 0.5, None)
    if version is None:
        return Check("broker", Status.FAIL, f"{shown} does not answer PING",
                     "start Redis, or fix --broker / SENSEVOICE_BROKER (redis://HOST:PORT/DB)")
    return Check("broker", Status.OK, f"{shown}, Redis {version}")


def run_checks(settings: "Settings") -> Report:
    """Every check, bounded in time; nothing is loaded, downloaded or left behind."""
    from pipeline.model.loading import hub_reachable

    t0 = time.monotonic()
    timeout = min(PROBE_TIMEOUT_S, settings.engine.hub_timeout_s)
    hub: list[bool] = []

    def hub_ok() -> bool:  # probed once, when first needed
        if not hub:
            hub.append(bounded(lambda: hub_reachable(timeout), timeout + 0.5, False))
        return hub[0]

    checks = [check_python(), *check_torch_and_cuda(settings), *check_gpus(settings),
              check_pyav(), check_model(settings, hub_ok), check_hub(hub_ok()),
              check_data_dir(settings)]
    broker = check_broker(settings)
    if broker is not None:
        checks.append(broker)
    return Report(tuple(checks), checked_at=time.time(), took_s=time.monotonic() - t0)


class DoctorCache:
    """The latest report, refreshed on a background thread once older than ``ttl_s``: ``latest``
    never blocks (None until the first report is in)."""

    def __init__(self, settings: "Settings", ttl_s: float = 60.0):
        self.settings, self.ttl_s = settings, ttl_s
        self._report: Report | None = None
        self._fetched = 0.0  # monotonic
        self._running = False
        self._lock = threading.Lock()

    def latest(self) -> Report | None:
        with self._lock:
            stale = self._report is None or time.monotonic() - self._fetched > self.ttl_s
            if stale and not self._running:
                self._running = True
                threading.Thread(target=self._refresh, name="sensevoice-doctor",
                                 daemon=True).start()
            return self._report

    def details(self) -> dict:
        """What /readyz shows: the report, or that the first one is being made."""
        report = self.latest()
        return report.to_dict() if report is not None else {"checking": True}

    def _refresh(self) -> None:
        try:
            report = run_checks(self.settings)
        except Exception as e:  # a check that raises must not kill the cache for good
            report = Report((Check("doctor", Status.WARN, f"checks failed: {e!r}"),),
                            checked_at=time.time(), took_s=0.0)
        with self._lock:
            self._report, self._fetched, self._running = report, time.monotonic(), False


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------


def format_table(report: Report) -> str:
    rows = [(c.name, c.status.value.upper(), c.detail) for c in report.checks]
    w_name = max(len(r[0]) for r in rows)
    lines = [f"{'check':<{w_name}}  status  detail"]
    for check, (name, status, detail) in zip(report.checks, rows):
        lines.append(f"{name:<{w_name}}  {status:<6}  {detail}")
        if check.fix and check.status is not Status.OK:
            lines.append(f"{'':<{w_name}}  {'':<6}  -> {check.fix}")
    failed = sum(c.status is Status.FAIL for c in report.checks)
    warned = sum(c.status is Status.WARN for c in report.checks)
    lines.append(f"{failed} failed, {warned} warning(s), {len(report.checks)} checks in "
                 f"{report.took_s:.1f} s")
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="sensevoice doctor", description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="local model directory or hub name (default: SENSEVOICE_MODEL "
                    "or iic/SenseVoiceSmall)")
    ap.add_argument("--demo", action="store_true", help="check for the offline demo model")
    ap.add_argument("--device", help="cuda, cuda:N or cpu")
    ap.add_argument("--data-dir")
    ap.add_argument("--broker", help="redis://HOST:PORT/DB")
    ap.add_argument("--role", choices=("all", "api", "worker"))
    ap.add_argument("--json", action="store_true", help="the report as JSON")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    """Print the report; 0 when no check failed, 1 otherwise."""
    from pipeline.config import Settings

    args = parse_args(argv)
    overrides = {k: v for k, v in {"model": args.model, "device": args.device,
                                   "data_dir": args.data_dir, "broker": args.broker,
                                   "role": args.role}.items() if v is not None}
    if args.demo:
        overrides["demo"] = True
    report = run_checks(Settings(**overrides))
    print(json.dumps(report.to_dict(), indent=2) if args.json else format_table(report))
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
