"""Uploads decoded and stored at once (``limits.submit_threads``): more wait for a thread, every one
of them is still answered; the default does not grow with the machine's cores (one GIL)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from pipeline.config import Settings
from tests.conftest import LiveServer, make_settings


def test_the_default_is_the_same_on_any_machine(monkeypatch):
    from pipeline.config import DEFAULT_SUBMIT_THREADS

    for cores in (2, 16, 128):  # 2 a core made 32 threads on a 16-core GPU host: poll p99 838 ms
        monkeypatch.setattr("os.cpu_count", lambda: cores)
        monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(cores)), raising=False)
        assert Settings().limits.submit_threads == DEFAULT_SUBMIT_THREADS == 8
    assert Settings(submit_threads=3).limits.submit_threads == 3


def test_submits_beyond_the_thread_limit_wait_and_are_all_accepted(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", submit_threads=2,
                                      max_uploads_per_client=0)).start()
    intake = server.runtime.intake
    real_submit, lock, now, peak = intake.submit, threading.Lock(), [0], [0]

    def counted_submit(*args, **kwargs):
        with lock:
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        try:
            time.sleep(0.1)  # long enough that the six requests overlap
            return real_submit(*args, **kwargs)
        finally:
            with lock:
                now[0] -= 1

    intake.submit = counted_submit
    try:
        clip = clip_factory("wav", 16000, 1).read_bytes()

        def post(i):
            return httpx.post(server.url + "/api/jobs", files={"file": (f"c{i}.wav", clip)}, timeout=60)

        with ThreadPoolExecutor(6) as pool:
            answers = list(pool.map(post, range(6)))
        assert [r.status_code for r in answers] == [202] * 6
        assert 1 <= peak[0] <= 2
    finally:
        server.stop()
