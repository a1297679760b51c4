"""Uploads decoded in separate processes.

Decoding is PyAV's per-frame work under the GIL: in the server process it competes with the event
loop and the inference thread (measured on the H200 under load: decode threads held the GIL 70 % of
the time, and HTTP throughput stopped at ~66 jobs/s with the GPU mostly idle). In a pool of
processes it runs in parallel, and a decoder that crashes on a hostile file costs one process
(rebuilt at once) and that upload's answer, never the server.

Processes are forked from a forkserver that has imported only :mod:`pipeline.audio` (PyAV, numpy:
no torch, no CUDA, no threads of the server). A decode that runs past ``timeout_s`` is refused and
the pool's processes are killed and replaced (other uploads decoding at that moment get the same
answer: rare, and better than a decoder stuck for good). ``processes=0`` decodes in the calling
thread, with no crash isolation and no timeout.
"""

from __future__ import annotations

import logging
import multiprocessing
import threading
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures.process import BrokenProcessPool

from .audio import DecodedAudio, decode_audio
from .errors import DecoderCrashed, DecodeTimeout

logger = logging.getLogger("sensevoice.decoder")

TASKS_PER_PROCESS = 500  # a decoder process is replaced after this many files (bounds any leak)


class Decoder:
    """``decoder(data, **decode_audio_kwargs) -> DecodedAudio``, thread-safe."""

    def __init__(self, processes: int, target: Callable[..., DecodedAudio] = decode_audio,
                 timeout_s: float = 600.0):
        self.processes = processes
        self.target = target  # what runs in the process (tests inject a crash here)
        self.timeout_s = timeout_s  # a file that keeps a decoder busy longer is refused
        self._pool: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def __call__(self, data: bytes, **kwargs) -> DecodedAudio:
        if self.processes <= 0:
            return self.target(data, **kwargs)
        pool = self._current_pool()
        try:
            return pool.submit(self.target, data, **kwargs).result(timeout=self.timeout_s)
        except FutureTimeout:
            self._replace(pool, kill=True)  # the stuck process is killed, not waited for
            logger.error("decoding an upload (%d bytes) took over %g s; pool rebuilt",
                         len(data), self.timeout_s)
            raise DecodeTimeout(f"decoding this file took longer than {self.timeout_s:g} s; it "
                                "is damaged or crafted, and was not accepted") from None
        except BrokenProcessPool:
            self._replace(pool)
            logger.error("a decoder process died on an upload (%d bytes); pool rebuilt", len(data))
            # every upload in the pool at that moment gets this answer: the pool cannot tell which
            # file killed the process
            raise DecoderCrashed("the audio decoder crashed on this upload (a damaged or crafted "
                                 "file; if it plays fine, try again)") from None

    def warm_up(self) -> None:
        """Start the processes now, not on the first upload."""
        if self.processes > 0:
            pool = self._current_pool()
            for f in [pool.submit(_noop) for _ in range(self.processes)]:
                f.result()

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def _current_pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._pool is None:
                ctx = multiprocessing.get_context("forkserver")
                ctx.set_forkserver_preload(["pipeline.audio"])
                self._pool = ProcessPoolExecutor(self.processes, mp_context=ctx,
                                                 max_tasks_per_child=TASKS_PER_PROCESS)
            return self._pool

    def _replace(self, broken: ProcessPoolExecutor, kill: bool = False) -> None:
        with self._lock:
            if self._pool is broken:  # other threads saw the same break: rebuild once
                self._pool = None
        if kill:  # the executor has no public way to stop a running task (3.14 adds one)
            for proc in list((broken._processes or {}).values()):
                proc.kill()
        broken.shutdown(wait=False, cancel_futures=True)


def _noop() -> None:
    return None
