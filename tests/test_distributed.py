"""The distributed topology end to end on loopback: a real redis-server, two api processes and a
worker process (each `python app_sensevoice.py` with its role). Submit on one api, poll on the
other; kill -9 the worker in the middle of the work, start a new one: every accepted job finishes,
once. Redis down: readyz 503 and submits answer 503 broker_unavailable; back up: served again
without a restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import redis

from tests.conftest import ROOT, free_port
from tests.redis_server import RedisServer
from tests.test_reliability import wait_ready

VISIBILITY_S = 3.0  # a dead worker's items are claimed again after this long


class Role:
    """One `app_sensevoice.py` process of the topology."""

    def __init__(self, role: str, broker: str, data_dir: Path, model_dir: Path, log: Path,
                 **env: str):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, str(ROOT / "app_sensevoice.py"), "--model", str(model_dir),
               "--device", "cpu", "--port", str(self.port), "--data-dir", str(data_dir),
               "--api-only"]
        self.log = open(log, "wb")
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self.log, stderr=self.log, env={
            **os.environ, "SENSEVOICE_ROLE": role, "SENSEVOICE_BROKER": broker,
            "SENSEVOICE_VISIBILITY_TIMEOUT_S": str(VISIBILITY_S), "SENSEVOICE_MAX_BATCH": "4",
            **env})

    def ready(self) -> "Role":
        wait_ready(self.url, self.proc)
        return self

    def kill(self) -> None:
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


@pytest.fixture
def cluster(demo_dir, tmp_path):
    redis_server = RedisServer(tmp_path / "redis").start()
    started: list[Role] = []

    def role(name: str, **env) -> Role:
        r = Role(name, redis_server.url, tmp_path / f"data-{len(started)}", demo_dir,
                 tmp_path / f"{name}-{len(started)}.log", **env)
        started.append(r)
        return r

    yield redis_server, role
    for r in started:
        r.stop()
    redis_server.stop()


def _submit(url: str, clip: Path) -> httpx.Response:
    with open(clip, "rb") as f:
        return httpx.post(url + "/api/jobs", files={"file": ("clip.wav", f)}, timeout=60)


@pytest.mark.parametrize("shared", [False, True], ids=["audio-in-redis", "shared-dir"])
def test_two_apis_and_a_worker_finish_every_job_once_through_a_worker_kill(cluster, clip_factory,
                                                                            tmp_path, shared):
    """Audio inside Redis, or (one host) in a shared directory with Redis holding file names."""
    redis_server, role = cluster
    shm = tmp_path / "shm"
    env = {"SENSEVOICE_SHARED_DIR": str(shm)} if shared else {}
    api1, api2, worker = role("api", **env), role("api", **env), role("worker", **env)
    api1.ready(), api2.ready(), worker.ready()
    clip = clip_factory("wav", 16000, 1)

    first = _submit(api1.url, clip)
    assert first.status_code == 202, first.text
    jid = first.json()["id"]
    deadline = time.monotonic() + 60
    while (job := httpx.get(f"{api2.url}/api/jobs/{jid}").json())["status"] != "done":
        assert time.monotonic() < deadline, job
        time.sleep(0.05)
    assert job["result"]["text"]  # polled on the other api process
    metrics = httpx.get(api2.url + "/metrics").text
    assert "sensevoice_workers_alive 1" in metrics  # from Redis: any api process sees the workers
    assert 'sensevoice_queue_depth_lane{lane="bulk"} 0' in metrics

    worker.kill()  # the work below waits, then a dead worker holds some of it
    ids = [jid]
    for n in range(24):
        r = _submit((api1 if n % 2 else api2).url, clip)
        assert r.status_code == 202, r.text
        ids.append(r.json()["id"])
    worker2 = role("worker", **env).ready()
    time.sleep(0.3)
    worker2.kill()  # mid-work: it claimed items and had not finished them all
    worker3 = role("worker", **env).ready()  # reclaims the dead one's items after the visibility timeout

    deadline = time.monotonic() + 120
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = {j: httpx.get(f"{api1.url}/api/jobs/{j}").json()["status"] for j in ids}
        if set(states.values()) == {"done"}:
            break
        time.sleep(0.2)
    assert set(states.values()) == {"done"}, states
    r = redis.Redis.from_url(redis_server.url)
    counts = {k.decode(): int(v) for k, v in r.hgetall("sv:counts").items()}
    assert counts.get("done") == len(ids)  # each result written once
    assert sum(r.xlen(s) for s in r.scan_iter("sv:queue:*")) == 0  # nothing left queued
    assert worker3.proc.poll() is None
    if shared:  # every job's audio file goes with its job; the uploads stay for the player
        from pipeline.serving.broker_redis import RedisBroker

        # a worker deletes a finished job's files in a background thread: a kill -9 can lose a
        # pending deletion, which the api processes' janitor sweep removes (every minute, files
        # over a minute old); here that sweep runs at once, with no age limit for audio
        janitor = RedisBroker(redis_server.url, retention_s=3600, queue_size=10, shared_dir=shm)
        janitor.payloads.sweep(janitor._still_stored, min_age_s=0, upload_min_age_s=3600)
        janitor.close()
        assert sorted(p.name for p in (shm / "uploads").iterdir()) == sorted(ids)
        assert [f for _, _, names in os.walk(shm / "audio") for f in names] == []
        assert all(len(v) < 64 for v in (r.get(f"sv:upload:{j}") for j in ids))
        assert httpx.get(f"{api2.url}/api/jobs/{ids[3]}/audio").content == clip.read_bytes()
    # the killed workers drop out of the count once idle past the visibility timeout
    deadline = time.monotonic() + VISIBILITY_S + 5
    while "sensevoice_workers_alive 1.0\n" not in (text := httpx.get(api1.url + "/metrics").text):
        assert time.monotonic() < deadline, [ln for ln in text.splitlines() if "workers" in ln]
        time.sleep(0.2)


def test_redis_outage_gives_503_and_service_resumes_without_restart(cluster, clip_factory):
    redis_server, role = cluster
    api, worker = role("api"), role("worker")
    api.ready(), worker.ready()
    clip = clip_factory("wav", 16000, 1)
    redis_server.kill()
    deadline = time.monotonic() + 15
    while httpx.get(api.url + "/readyz").status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    r = _submit(api.url, clip)
    assert r.status_code == 503 and r.json()["error"]["code"] == "broker_unavailable"
    assert "Retry-After" in r.headers
    assert api.proc.poll() is None and worker.proc.poll() is None  # nobody exited
    redis_server.restart()
    api.ready()
    worker.ready()
    r = _submit(api.url, clip)
    assert r.status_code == 202, r.text
    jid = r.json()["id"]
    deadline = time.monotonic() + 60
    while httpx.get(f"{api.url}/api/jobs/{jid}").json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)


def test_gpu_memory_admission_across_the_cluster(cluster, clip_factory):
    """The api process (no GPU) refuses new work while every live worker reports its GPU short of
    memory (workers report through Redis; here the reports are written as a worker would), and
    takes it again once one reports room."""
    redis_server, role = cluster
    r = redis.Redis.from_url(redis_server.url)
    expiry = int((time.time() + 60) * 1000)  # the registry: field -> "expiry_ms ratio"
    r.hset("sv:workers", "alive:host-a:1", str(expiry))  # a live worker (else readyz: no_worker)
    api = role("api", SENSEVOICE_MIN_FREE_MEMORY_RATIO="0.15").ready()
    clip = clip_factory("wav", 16000, 1)
    r.hset("sv:workers", mapping={"gpu:host-a:1": f"{expiry} 0.05", "gpu:host-b:2": f"{expiry} 0.10",
                                  "gpu:host-c:3": f"{int(time.time() * 1000) - 1} 0.90"})  # expired
    time.sleep(0.5)  # the api reads the reports at most every 0.25 s
    refused = _submit(api.url, clip)
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "gpu_memory_low"
    assert "Retry-After" in refused.headers
    r.hset("sv:workers", "gpu:host-b:2", f"{expiry} 0.60")
    time.sleep(0.5)
    assert _submit(api.url, clip).status_code == 202


def test_an_api_without_a_live_worker_is_not_ready_and_says_why(cluster, clip_factory):
    """Issue 19 row 9: with no worker alive the api's /readyz stayed 200. Now 503 no_worker until
    a worker reports (within the visibility time-out); a submit is still accepted and waits in the
    queue (README), and runs once a worker comes."""
    redis_server, role = cluster
    api = role("api")
    deadline = time.monotonic() + 120
    while True:
        try:
            r = httpx.get(api.url + "/readyz", timeout=2)
            break
        except httpx.HTTPError:
            assert time.monotonic() < deadline and api.proc.poll() is None
            time.sleep(0.2)
    while r.json().get("state") != "ready":  # started (the decoders warm up), still no worker
        assert time.monotonic() < deadline
        time.sleep(0.2)
        r = httpx.get(api.url + "/readyz", timeout=2)
    assert r.status_code == 503 and r.json()["code"] == "no_worker", r.text
    assert "no worker has reported" in r.json()["error"]
    accepted = _submit(api.url, clip_factory("wav", 16000, 1))
    assert accepted.status_code == 202, accepted.text
    jid = accepted.json()["id"]
    worker = role("worker").ready()
    api.ready()  # 200 again within a janitor tick of the worker's first report
    assert "code" not in httpx.get(api.url + "/readyz", timeout=2).json()
    deadline = time.monotonic() + 60
    while httpx.get(f"{api.url}/api/jobs/{jid}").json()["status"] != "done":
        assert time.monotonic() < deadline
        time.sleep(0.1)
    worker.kill()  # its report expires with the visibility time-out: not ready again
    deadline = time.monotonic() + VISIBILITY_S + 15
    while httpx.get(api.url + "/readyz", timeout=2).status_code != 503:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    assert httpx.get(api.url + "/readyz", timeout=2).json()["code"] == "no_worker"
