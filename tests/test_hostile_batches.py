"""Hostile batches (issue 36): POST /api/batches costs what its recordings cost, not what its body
weighs. A batch's body takes an upload slot whatever its size and, once unpacked, holds a slot per
``batch_recordings_per_slot`` recordings until every one is submitted; its recordings go through
the submit limiter that POST /api/jobs uses (polls, results and reviews are answered meanwhile);
one client's batches in progress are bounded (429 too_many_batches_from_client)."""

from __future__ import annotations

import io
import threading
import time
import wave
import zipfile
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import LiveServer, make_settings
from tests.test_api import wait_done
from tests.test_edge import upload_limit


def silence_wav(seconds: float = 0.5) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(bytes(int(seconds * 16000) * 2))
    return buf.getvalue()


def small_zip(n: int, prefix: str = "b-") -> bytes:
    """``n`` recordings of silence, deflated: a few kilobytes (under the 64 KiB of a "small" body)."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for i in range(n):
            z.writestr(f"{prefix}{i:03d}.wav", silence_wav())
    return buf.getvalue()


class Gate:
    """Holds ``intake.submit`` for the recordings named ``b-*`` until opened; counts them."""

    def __init__(self, intake):
        self.real, self.open_, self.lock = intake.submit, threading.Event(), threading.Lock()
        self.now = self.peak = 0
        intake.submit = self.submit

    def submit(self, data, *, filename="", **kw):
        if not filename.startswith("b-"):
            return self.real(data, filename=filename, **kw)
        with self.lock:
            self.now += 1
            self.peak = max(self.peak, self.now)
        try:
            assert self.open_.wait(60), "the gate was never opened"
            return self.real(data, filename=filename, **kw)
        finally:
            with self.lock:
                self.now -= 1

    def wait_for(self, n: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while self.now < n:
            assert time.monotonic() < deadline, f"{self.now} submits held, {n} expected"
            time.sleep(0.02)


@pytest.fixture
def server_factory(demo_dir, tmp_path):
    servers = []

    def start(**kw) -> LiveServer:
        server = LiveServer(make_settings(demo_dir, tmp_path / f"d{len(servers)}", **kw)).start()
        servers.append(server)
        return server

    yield start
    for s in servers:
        s.stop()


def post_batch(server, body: bytes, name: str = "calls.zip", **kw) -> httpx.Response:
    return httpx.post(server.url + "/api/batches", files=[("files", (name, body))], timeout=120, **kw)


def test_a_small_batch_holds_its_upload_weight_until_every_recording_is_submitted(server_factory):
    server = server_factory(max_concurrent_uploads=8, max_uploads_per_client=4,
                            batch_recordings_per_slot=10)
    gate, limit = Gate(server.runtime.intake), upload_limit(server)
    body = small_zip(40)
    assert len(body) < 64 * 1024  # a "small" body, which took no upload slot at all before
    with ThreadPoolExecutor(1) as pool:
        batch = pool.submit(post_batch, server, body)
        try:
            gate.wait_for(1)
            # 40 recordings / 10 a slot = 4 slots (half of the 8, the client's 4), held while submitting
            assert limit.in_flight == 4 and list(limit.per_client.values()) == [4]
            assert list(limit.batches_per_client.values()) == [1]
            other = httpx.post(server.url + "/api/jobs", files={"file": ("x.wav", silence_wav(3))},
                               timeout=30)
            assert other.status_code == 429, other.text
            assert other.json()["error"]["code"] == "too_many_uploads_from_client"
            assert not batch.done()
        finally:
            gate.open_.set()
        answer = batch.result(timeout=120)
    assert answer.status_code == 200, answer.text
    assert len([j for j in answer.json()["jobs"] if "id" in j]) == 40
    deadline = time.monotonic() + 10
    while limit.in_flight and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (limit.in_flight, limit.per_client, limit.batches_per_client) == (0, {}, {})
    assert gate.peak <= 2  # SUBMITS_AT_ONCE


def test_results_are_answered_while_many_batches_are_submitted(server_factory, clip_factory):
    server = server_factory(submit_threads=4, max_batches_per_client=0, max_uploads_per_client=0,
                            max_concurrent_uploads=400)
    clip = clip_factory("wav", 16000, 1).read_bytes()
    job = httpx.post(server.url + "/api/jobs", files={"file": ("done.wav", clip)}, timeout=60).json()
    assert wait_done(server, job["id"])["status"] == "done"
    gate = Gate(server.runtime.intake)
    body = small_zip(5)
    with ThreadPoolExecutor(45) as pool:  # 45 batches, more than the shared thread pool's 40 threads
        batches = [pool.submit(post_batch, server, body) for _ in range(45)]
        try:
            gate.wait_for(4)
            time.sleep(1.0)  # the other batches have arrived and wait for a submit thread
            t0 = time.monotonic()
            for path in ("/result", "/review", ""):
                r = httpx.get(f"{server.url}/api/jobs/{job['id']}{path}", timeout=10)
                assert r.status_code == 200, (path, r.text)
            assert time.monotonic() - t0 < 8  # (a few ms unloaded; before: no answer at all)
            assert gate.peak <= 4  # the submit limiter's threads, not the shared pool's
        finally:
            gate.open_.set()
        answers = [b.result(timeout=300) for b in batches]
    assert [a.status_code for a in answers] == [200] * 45


def test_a_client_may_have_max_batches_per_client_in_progress(server_factory):
    server = server_factory(max_batches_per_client=1)
    gate = Gate(server.runtime.intake)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(post_batch, server, small_zip(3))
        try:
            gate.wait_for(1)
            second = post_batch(server, small_zip(3))
            assert second.status_code == 429, second.text
            assert second.json()["error"]["code"] == "too_many_batches_from_client"
            assert int(second.headers["retry-after"]) >= 1
            # another client address (loopback 127.0.0.2) is not counted against this one
            transport = httpx.HTTPTransport(local_address="127.0.0.2")
            with httpx.Client(transport=transport, timeout=120) as other_client:
                other = pool.submit(other_client.post, server.url + "/api/batches",
                                    files=[("files", ("o.zip", small_zip(3)))])
                gate.wait_for(2)
                gate.open_.set()
                assert other.result(timeout=120).status_code == 200
        finally:
            gate.open_.set()
        assert first.result(timeout=120).status_code == 200
    # once it is answered, the client may send the next one
    assert post_batch(server, small_zip(3)).status_code == 200
