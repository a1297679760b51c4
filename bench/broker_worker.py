#!/usr/bin/env python3
"""The distributed worker's own ceiling: jobs/s through Redis with a no-op engine.

    python bench/broker_worker.py [--jobs 2000] [--shared]

Starts a redis-server (Debian's, on a free port), submits ``--jobs`` 10 s clips as an api process
would (record + 16-bit audio, inline or in a shared directory with ``--shared``), then runs the
worker side exactly as a worker process does (Feeder -> Scheduler -> Worker with ``store=broker``)
around an engine that only gathers each batch's audio into one padded host buffer, as the real
engine does before its transfer: what is measured is everything but the GPU.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions  # noqa: E402
from pipeline.model.engine import EngineOutput  # noqa: E402
from pipeline.serving.broker_redis import Feeder, RedisBroker  # noqa: E402
from pipeline.serving.scheduler import Scheduler, WorkItem  # noqa: E402
from pipeline.serving.worker import Worker  # noqa: E402
from tests.engines import EngineDouble  # noqa: E402
from tests.redis_server import RedisServer  # noqa: E402


class NoOpEngine(EngineDouble):
    """The engine's host side only: the batch's 16-bit waves copied into the rows of one reused
    host buffer (what the CUDA engine does into its cached pinned memory before its one transfer,
    ``SenseVoiceEngine._gather_pinned``), no model."""

    def __init__(self):
        self.buffer = torch.empty(0, dtype=torch.int16)

    def transcribe(self, waves, options):
        n = max(int(w.shape[0]) for w in waves)
        if self.buffer.numel() < len(waves) * n:
            self.buffer = torch.empty(len(waves) * n, dtype=torch.int16)
        rows = self.buffer[:len(waves) * n].view(len(waves), n).numpy()
        for row, wave in zip(rows, waves):  # as pipeline.model.engine.gather_rows (here too
            row[:wave.shape[0]] = wave.numpy()  # for the tree before it, run with this script)
            row[wave.shape[0]:] = 0
        return [EngineOutput((), "<|en|><|NEUTRAL|><|Speech|><|withitn|>Hello there.") for _ in waves]


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--shared", action="store_true", help="audio and uploads in a shared directory")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    tmp = Path(tempfile.mkdtemp(prefix="broker-worker-"))
    server = RedisServer(tmp / "redis").start()
    shared = tmp / "shm" if args.shared else None
    try:
        api = RedisBroker(server.url, retention_s=600, queue_size=10**6, shared_dir=shared)
        audio = torch.randint(-32768, 32768, (160_000,)).float() / 32768
        t0 = time.perf_counter()
        for _ in range(args.jobs):
            job = Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(), 10.0)
            api.create(job, b"\0" * 320_000)
            api.enqueue(WorkItem(job.id, job.lane, job.options, audio.numel(), audio=audio))
        submit_s = time.perf_counter() - t0
        broker = RedisBroker(server.url, retention_s=600, queue_size=10**6, shared_dir=shared)
        sched = Scheduler(10**6, max_batch=64, max_wait_s=0.002)
        done: list[str] = []
        broker.feed.on_finished(done.append)
        worker = Worker("w", NoOpEngine(), sched, broker)
        feeder = Feeder(broker, sched, "bench", prefetch=128)
        t1 = time.perf_counter()
        cpu1, redis_cpu1 = time.process_time(), cpu_seconds(server.proc.pid)
        feeder.start()
        worker.start()
        while len(done) < args.jobs and time.perf_counter() - t1 < 300:
            time.sleep(0.005)
        work_s = time.perf_counter() - t1
        cpu_us = (time.process_time() - cpu1) / max(1, len(done)) * 1e6
        redis_us = (cpu_seconds(server.proc.pid) - redis_cpu1) / max(1, len(done)) * 1e6
        feeder.stop()
        worker.stop()
        worker.join(5)
        feeder.join(5)
        where = "shared directory" if args.shared else "inside Redis"
        print("| audio | jobs | api side jobs/s (one thread) | worker side jobs/s "
              "| worker process CPU us/job | Redis CPU us/job |")
        print("|---|---|---|---|---|---|")
        print(f"| {where} | {len(done)} | {args.jobs / submit_s:.0f} | {len(done) / work_s:.0f} "
              f"| {cpu_us:.0f} | {redis_us:.0f} |")
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # ~0.5 MB of shared audio per job
    return 0


if __name__ == "__main__":
    sys.exit(main())
