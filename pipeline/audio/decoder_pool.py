"""Uploads decoded in separate processes.

Decoding is PyAV's per-frame work under the GIL: in the server process it competes with the event
loop and the inference thread (measured on the H200 under load: decode threads held the GIL 70 % of
the time, and HTTP throughput stopped at ~66 jobs/s with the GPU mostly idle). In decoder processes
it runs in parallel, and a decoder that crashes or hangs on a hostile file costs that upload and
that one process, never the server nor the other uploads.

Each decoder is a child started with ``python -m pipeline.audio.decode_worker`` (PyAV and numpy only:
no torch, no CUDA, no threads of the server) that serves one upload at a time over its stdin and
stdout with fixed binary headers and raw float32 samples (:mod:`pipeline.audio.decode_worker`): no
pickle, so a decoder taken over by a crafted file cannot run code in the server through its reply,
and the server checks every header field (rate, sample count within the 16 kHz budget, error
code) before it allocates or reads on. This replaced a ``ProcessPoolExecutor`` on a forkserver,
which pickled results, gave every upload in the pool the error when one process died or hung, and
left the forkserver, its workers and multiprocessing's resource tracker (~150 MB) running after
every exit of the server that was not a clean shutdown (SIGTERM, ``kill -9``, ``os._exit(3)``).

Now a decoder dies with the server however it ends: it is killed by the kernel when the thread
that started it ends (``PR_SET_PDEATHSIG``; all are started from one long-lived thread, since the
signal follows the thread, not the process), it exits at the end of its stdin, and :meth:`close`
(also run at interpreter exit) kills and reaps every one. A decode past ``timeout_s`` kills only
its process (:class:`DecodeTimeout`); a process that dies or breaks the protocol costs only its
upload (:class:`DecoderCrashed`); each is replaced. Each process limits its address space
(:func:`default_memory_limit`), so a file that needs more fails alone with
:class:`DecoderOutOfMemory` (413). ``processes=0`` decodes in the calling thread, with no
isolation, no memory limit and no timeout.
"""

from __future__ import annotations

import atexit
import fcntl
import functools
import logging
import os
import select
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from queue import SimpleQueue

import numpy as np

from pipeline.audio.decode import (
    COMMON_RATES,
    DEFAULT_MAX_SECONDS,
    DecodedAudio,
    DecodedParts,
    _check_size,
    output_budget,
)
from pipeline.audio.decode_worker import (
    ERRORS,
    HELLO,
    HELLO_MAGIC,
    MAX_CHANNELS,
    MAX_MESSAGE_BYTES,
    MAX_TARGET_BYTES,
    REPLY,
    REPLY_MAGIC,
    REQUEST,
    REQUEST_MAGIC,
    STATUS_OK,
    resolve_target,
)
from pipeline.audio.wav import Pcm16Layout, pcm16_mono_layout, read_pcm16_wav
from pipeline.domain.errors import DecoderCrashed, DecoderOutOfMemory, DecodeTimeout

logger = logging.getLogger("sensevoice.decoder")

ROOT = Path(__file__).resolve().parents[2]  # on the decoders' PYTHONPATH
DEFAULT_TARGET = "pipeline.audio.decode:decode_audio_parts"
DEFAULT_MAX_UPLOAD_BYTES = 200 * 1024 * 1024  # the default of Settings.max_upload_bytes
TASKS_PER_PROCESS = 500  # a decoder process is replaced after this many files (bounds any leak)
START_TIMEOUT_S = 60.0  # s, for a new decoder to import PyAV and numpy and say hello
PIPE_BYTES = 1 << 20  # pipe buffer asked for (Linux's default unprivileged maximum)

# Address space of a decoder process when no limit is configured: a base, the output and the
# upload. Measured (VmPeak of the decoder; PyAV 18 / FFmpeg 8.1, OPENBLAS_NUM_THREADS=1, with
# bench/hostile_costs.py and the FLAC builder of tests/media.py): 205 MiB after start-up; 30 min
# of 48 kHz FLAC to 16 kHz 329 MiB; 1 h of Opus in a live WebM (no duration) 439 MiB; the 3.89 h
# 48 kHz FLAC 1,074 MiB; the longest a 4 h cap allows: 4 h at 48 kHz with no declared duration
# 1,101 MiB, 4 h of 96 kHz stereo whose header claims 10 s (kept at 96 kHz, then converted)
# 1,130 MiB, for 878 MiB of output. So the decoder's own needs stay under ~260 MiB besides the
# output; the upload (held while decoding, up to max_bytes) comes on top. The base leaves about
# twice that: a 4 h cap with 200 MiB uploads gives 1,591 MiB, against 1,330 measured at most.
MEMORY_BASE_BYTES = 512 * 1024 * 1024


def default_memory_limit(max_seconds: float = DEFAULT_MAX_SECONDS,
                         max_bytes: int | None = DEFAULT_MAX_UPLOAD_BYTES) -> int:
    """Bytes of address space a decoder process needs for ``max_seconds`` of audio (the 16 kHz
    budget, float32) from an upload of ``max_bytes``: 4 h and 200 MiB give 1,591 MiB."""
    upload = DEFAULT_MAX_UPLOAD_BYTES if max_bytes is None else max_bytes
    return MEMORY_BASE_BYTES + 4 * output_budget(max_seconds) + upload


class _Timeout(Exception):
    """The decoder did not answer before the deadline."""


class _Broken(Exception):
    """The decoder died, closed its pipe, or broke the protocol."""


def _target_name(target: str | Callable) -> str:
    """``"module:function"`` for a target given by name or as a module-level function."""
    if callable(target):
        target = f"{target.__module__}:{target.__qualname__}"
    if not isinstance(target, str) or len(target.encode()) > MAX_TARGET_BYTES:
        raise ValueError(f"a decoder target is a 'module:function' string, got {target!r}")
    resolve_target(target)  # fail here, not in every decoder process
    return target


class _Spawner:
    """Starts decoder processes from one long-lived thread. PR_SET_PDEATHSIG fires when the thread
    that forked the child ends, not its process: children forked from request threads, which
    come and go, would be killed with them."""

    def __init__(self) -> None:
        self._jobs: SimpleQueue = SimpleQueue()
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="sensevoice-decoder-spawner",
                                        daemon=True)
        self._thread.start()

    def spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen:
        future: Future = Future()
        with self._lock:
            if self._stopped:
                raise RuntimeError("the decoder was closed")
            self._jobs.put((argv, env, future))
        return future.result()

    def stop(self) -> None:
        """End the thread (after the starts already asked for) and wait for it, so a closed decoder
        leaves no thread behind (the CLI's exit: tests/test_cli_threads.py); its children get SIGKILL."""
        with self._lock:
            self._stopped = True
            self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(10)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            argv, env, future = job
            try:
                future.set_result(subprocess.Popen(
                    argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, cwd=ROOT,
                    close_fds=True))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)


class _Child:
    """One decoder process and its two pipes (non-blocking on this side)."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc
        self.pid = proc.pid
        self.tasks = 0
        self.ready = False  # said hello
        self._to, self._from = proc.stdin.fileno(), proc.stdout.fileno()
        for fd in (self._to, self._from):
            os.set_blocking(fd, False)
            try:
                fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, PIPE_BYTES)
            except OSError:
                pass  # a lower pipe-max-size: the default 64 KiB works, a little slower
        self._readable, self._writable = select.poll(), select.poll()
        self._readable.register(self._from, select.POLLIN)
        self._writable.register(self._to, select.POLLOUT)

    def greet(self, deadline: float) -> None:
        head = bytearray(HELLO.size)
        self.recv_into(memoryview(head), deadline)
        magic, pid = HELLO.unpack(head)
        if magic != HELLO_MAGIC or pid != self.pid:
            raise _Broken("a malformed hello")
        self.ready = True

    def send(self, chunks: list[bytes | memoryview], deadline: float) -> None:
        for chunk in chunks:
            view = memoryview(chunk).cast("B")
            while view:
                try:
                    view = view[os.write(self._to, view):]
                except BlockingIOError:
                    self._wait(self._writable, deadline)
                except (BrokenPipeError, ConnectionResetError):
                    raise _Broken("it closed its input") from None

    def recv_into(self, view: memoryview, deadline: float) -> None:
        got = 0
        while got < len(view):
            try:
                n = os.readv(self._from, [view[got:]])
            except BlockingIOError:
                self._wait(self._readable, deadline)
                continue
            if n == 0:
                raise _Broken("it ended its output")
            got += n

    @staticmethod
    def _wait(poller: select.poll, deadline: float) -> None:
        left = deadline - time.monotonic()
        if left <= 0 or not poller.poll(max(1, int(left * 1000))):
            if time.monotonic() >= deadline:
                raise _Timeout

    def kill(self) -> None:
        """SIGKILL the process, nothing more: safe from any thread, while another uses the pipes
        (it then reads the end of them, and stops the process)."""
        try:
            self.proc.kill()
        except OSError:
            pass

    def stop(self) -> None:
        """Kill and reap the process and close the pipes; by the thread that holds it (closing
        a descriptor another thread reads could hand that number to a new file). Idempotent."""
        self.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:  # unkillable (in the kernel): leave it to the OS
            logger.error("decoder process %d did not die after SIGKILL", self.pid)


class Decoder:
    """``decoder(data, *, max_seconds, max_bytes, channel=None) -> DecodedAudio``, thread-safe.

    ``processes``: decoder processes at most (0: decode in the calling thread). ``target``: what a
    decoder runs, a ``"module:function"`` string or a module-level function (tests inject faults
    here). ``timeout_s``: a file that keeps a decoder busy longer is refused and its process
    killed. ``memory_mb``: address-space limit of each process (0: :func:`default_memory_limit`
    of ``max_seconds`` and ``max_bytes``, the largest allowed audio and upload).
    """

    def __init__(self, processes: int, target: str | Callable = DEFAULT_TARGET,
                 timeout_s: float = 600.0, memory_mb: int = 0,
                 max_seconds: float = DEFAULT_MAX_SECONDS,
                 max_bytes: int | None = DEFAULT_MAX_UPLOAD_BYTES,
                 tasks_per_process: int = TASKS_PER_PROCESS, fast_wav: bool = True):
        self.processes = processes
        self.fast_wav = fast_wav  # 16 kHz 16-bit PCM WAV read in this process (pipeline/audio/wav.py)
        self.max_seconds, self.max_bytes = max_seconds, max_bytes  # (pcm16_layout's caps)
        self.target = target
        self.timeout_s = timeout_s
        self.memory_limit = (memory_mb * 1024 * 1024 if memory_mb > 0
                             else default_memory_limit(max_seconds, max_bytes))  # bytes
        self.tasks_per_process = tasks_per_process
        self._idle: list[_Child] = []
        self._children: set[_Child] = set()  # every live process, idle or busy
        self._starting = 0  # processes being started (counted against `processes`)
        self._spawner: _Spawner | None = None
        self._cond = threading.Condition()
        self._at_exit = functools.partial(_close_at_exit, weakref.ref(self))

    @staticmethod
    def limits(settings) -> dict:
        """The keyword arguments a :class:`~pipeline.config.Settings` gives: the address-space
        limit and the largest audio and upload it must make room for."""
        return {"memory_mb": settings.limits.decoder_memory_mb, "max_seconds": settings.limits.max_audio_seconds,
                "max_bytes": settings.limits.max_upload_bytes}

    @property
    def target(self) -> str:
        return self._target

    @target.setter
    def target(self, target: str | Callable) -> None:
        self._target = _target_name(target)

    def pcm16_layout(self, data: bytes) -> Pcm16Layout | None:
        """Where a mono 16 kHz 16-bit PCM WAV upload keeps the samples this decoder would return
        (scaled), within the decoder's caps, or None: any other upload is decoded (``__call__``)."""
        if not (self.fast_wav and self.target == DEFAULT_TARGET):
            return None
        _check_size(len(data), self.max_bytes)
        return pcm16_mono_layout(data, max_seconds=self.max_seconds)

    def __call__(self, data: bytes, *, max_seconds: float = DEFAULT_MAX_SECONDS,
                 max_bytes: int | None = None, channel: int | None = None) -> DecodedAudio:
        if not max_seconds > 0:
            raise ValueError(f"max_seconds must be positive, got {max_seconds}")
        if self.fast_wav and self.target == DEFAULT_TARGET:
            _check_size(len(data), max_bytes)
            fast = read_pcm16_wav(data, max_seconds=max_seconds, channel=channel)
            if fast is not None:  # 16 kHz 16-bit PCM WAV: read here, no round trip to a child
                return fast
        if self.processes <= 0:
            result = resolve_target(self.target)(data, max_seconds=max_seconds,
                                                 max_bytes=max_bytes, channel=channel)
            return result.joined() if isinstance(result, DecodedParts) else result
        _check_size(len(data), max_bytes)  # before sending it anywhere
        child = self._acquire()
        keep = False
        try:
            if not child.ready:
                self._greet(child, time.monotonic() + START_TIMEOUT_S)
            child.tasks += 1
            deadline = time.monotonic() + self.timeout_s
            target = self.target.encode()
            child.send([REQUEST.pack(REQUEST_MAGIC, float(max_seconds),
                                     -1 if max_bytes is None else max_bytes,
                                     -1 if channel is None else channel, len(target), len(data)),
                        target, data], deadline)
            result = self._reply(child, output_budget(max_seconds), deadline)
            # after an allocation failed, the process's heap is suspect: replace it
            keep = not isinstance(result, DecoderOutOfMemory)
        except _Timeout:
            logger.error("decoding an upload (%d bytes) took over %g s; decoder %d killed",
                         len(data), self.timeout_s, child.pid)
            raise DecodeTimeout(f"decoding this file took longer than {self.timeout_s:g} s; it "
                                "is damaged or crafted, and was not accepted") from None
        except _Broken as e:
            code = child.proc.poll()
            logger.error("decoder %d failed on an upload (%d bytes): %s (exit status %s)",
                         child.pid, len(data), e, code)
            raise DecoderCrashed("the audio decoder crashed on this file (a damaged or crafted "
                                 "file)") from None
        finally:
            self._release(child, keep)
        if isinstance(result, Exception):
            if isinstance(result, DecoderCrashed):
                logger.error("decoder %d failed: %s", child.pid, result)
            raise result
        return result

    def _reply(self, child: _Child, budget: int, deadline: float) -> DecodedAudio | Exception:
        """Read and check one reply: the audio, or the error it reports (returned, not raised)."""
        head = bytearray(REPLY.size)
        child.recv_into(memoryview(head), deadline)
        magic, status, rate, channels, n, message_len = REPLY.unpack(head)
        if magic != REPLY_MAGIC:
            raise _Broken("a reply without the magic")
        if status == STATUS_OK:
            if message_len or rate not in COMMON_RATES or not 1 <= channels <= MAX_CHANNELS:
                raise _Broken(f"a malformed reply header (rate {rate}, channels {channels})")
            if not 1 <= n <= budget:
                raise _Broken(f"a reply of {n} samples (the budget is {budget})")
            samples = np.empty(n, dtype="<f4")
            child.recv_into(memoryview(samples).cast("B"), deadline)
            return DecodedAudio(samples, rate, channels)
        error = ERRORS.get(status)
        if error is None or rate or channels or n or message_len > MAX_MESSAGE_BYTES:
            raise _Broken(f"a malformed error reply (status {status})")
        message = bytearray(message_len)
        child.recv_into(memoryview(message), deadline)
        text = message.decode("utf-8", "replace")
        if error is DecoderCrashed:
            return DecoderCrashed(f"the audio decoder failed on this file ({text})")
        if error is DecoderOutOfMemory:
            logger.warning("decoder %d ran out of memory on an upload: %s", child.pid, text)
            return DecoderOutOfMemory(
                "decoding this file needs more memory than a decoder may use "
                f"({self.memory_limit >> 20} MiB); it was not accepted")
        return error(text)

    def warm_up(self) -> None:
        """Start the processes now and wait until each is ready, not on the first upload.
        Raises ``RuntimeError`` when one cannot start (a memory limit too small, say)."""
        if self.processes <= 0:
            return
        started: list[_Child] = []
        try:
            while (child := self._start(reserve=True)) is not None:
                started.append(child)
            deadline = time.monotonic() + START_TIMEOUT_S
            for child in started:
                self._greet(child, deadline)
        except BaseException:
            for child in started:
                self._release(child, keep=False)
            raise
        for child in started:
            self._release(child, keep=True)

    def _greet(self, child: _Child, deadline: float) -> None:
        """Wait for a new process's hello. A process that cannot start is the server's failure,
        not the upload's: ``RuntimeError`` (a 500), not a decoder error."""
        try:
            child.greet(deadline)
        except (_Broken, _Timeout):
            raise RuntimeError(
                f"a decoder process did not start (exit status {child.proc.poll()}; "
                f"address-space limit {self.memory_limit >> 20} MiB)") from None

    def close(self) -> None:
        """Kill and reap every decoder process (those decoding too: their uploads fail)."""
        with self._cond:
            idle, busy = self._idle, self._children.difference(self._idle)
            self._children, self._idle = set(), []
            spawner, self._spawner = self._spawner, None
            self._cond.notify_all()
        for child in idle:
            child.stop()
        for child in busy:  # their threads see the end of the pipes and stop them
            child.kill()
        if spawner is not None:
            spawner.stop()
        atexit.unregister(self._at_exit)

    def pids(self) -> list[int]:
        """The decoder processes alive now."""
        with self._cond:
            return sorted(child.pid for child in self._children)

    def _acquire(self) -> _Child:
        """An idle process, or a new one while there are fewer than ``processes``; else wait."""
        with self._cond:
            while not self._idle and len(self._children) + self._starting >= self.processes:
                self._cond.wait()
            if self._idle:
                return self._idle.pop()
            self._starting += 1
        return self._start()

    def _start(self, reserve: bool = False) -> _Child | None:
        """Start a process and register it as live. The caller has counted it in ``_starting``,
        or ``reserve`` does, and then returns ``None`` when ``processes`` are already live."""
        with self._cond:
            if reserve:
                if len(self._children) + self._starting >= self.processes:
                    return None
                self._starting += 1
            if self._spawner is None:
                self._spawner = _Spawner()
                atexit.register(self._at_exit)  # a normal exit closes them too
            spawner = self._spawner
        env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
               "MKL_NUM_THREADS": "1", "MALLOC_ARENA_MAX": "2"}  # address space: no idle pools
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
        argv = [sys.executable, "-m", "pipeline.audio.decode_worker",
                "--memory", str(self.memory_limit), "--parent", str(os.getpid())]
        try:
            child = _Child(spawner.spawn(argv, env))
        except BaseException:
            with self._cond:
                self._starting -= 1
                self._cond.notify()
            raise
        with self._cond:
            self._starting -= 1
            self._children.add(child)
        return child

    def _release(self, child: _Child, keep: bool) -> None:
        """Back to the idle list, or killed (a failure, or its share of tasks done)."""
        with self._cond:
            live = child in self._children
            keep = keep and live and child.tasks < self.tasks_per_process
            if keep:
                self._idle.append(child)
            else:
                self._children.discard(child)
            self._cond.notify()
        if not keep:
            child.stop()


def _close_at_exit(ref: weakref.ref) -> None:
    decoder = ref()
    if decoder is not None:
        decoder.close()
