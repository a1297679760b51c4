"""Never lose a job, never fall over: each test injects a fault or a bad input."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import torch

from pipeline.model.engine import EngineOutput
from pipeline.serving.broker_sqlite import JobStore
from pipeline.serving.scheduler import Scheduler, WorkItem
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from pipeline.serving.worker import Worker
from tests.engines import EngineDouble
from tests.conftest import ROOT, LiveServer, free_port, make_settings
from tests.test_api import submit, wait_done

OPTS = TranscribeOptions()


# ---------------------------------------------------------------------------- test doubles
class FakeEngine(EngineDouble):
    """Engine double: echoes the clip length; raises what a test asks for."""

    def __init__(self, oom_over: int = 10**9, poison_len: int = -1, fatal: bool = False,
                 hang_s: float = 0.0):
        self.oom_over, self.poison_len, self.fatal, self.hang_s = oom_over, poison_len, fatal, hang_s
        self.batch_sizes: list[int] = []

    def transcribe(self, waves, options):
        self.batch_sizes.append(len(waves))
        if self.hang_s:
            time.sleep(self.hang_s)
        if self.fatal:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        if len(waves) > self.oom_over or any(w.shape[0] == self.poison_len for w in waves):
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (injected)")
        return [EngineOutput((), f"<|en|><|NEUTRAL|><|Speech|><|withitn|>n={w.shape[0]}") for w in waves]


def run_worker(tmp_path, engine, lengths, enqueued_at: float | None = None, **worker_kw):
    """Queue clips of the given lengths at once, run one worker until all are finished."""
    store = JobStore(tmp_path / "store")
    sched = Scheduler(1000, max_batch=64, max_wait_s=0.05)
    done = threading.Event()
    ids = []
    finished = set()

    def on_done(jid):
        finished.add(jid)
        if len(finished) == len(ids):
            done.set()

    for n in lengths:
        jid = str(uuid.uuid4())
        store.create(Job(jid, JobState.QUEUED, OPTS, Lane.BULK, time.time(), n / 16000), b"")
        ids.append(jid)
    store.feed.on_finished(on_done)
    worker = Worker("w", engine, sched, store, **worker_kw)
    for jid, n in zip(ids, lengths):
        sched.put(WorkItem(jid, Lane.BULK, OPTS, n, audio=torch.zeros(n),
                           enqueued_at=enqueued_at or time.monotonic()))
    worker.start()
    assert done.wait(30), "worker did not finish"
    worker.stop()
    worker.join(5)
    return store, ids, worker


# ---------------------------------------------------------------------------- GPU faults
def test_oom_halves_the_batch_and_only_the_poison_job_fails(tmp_path):
    lengths = [1000 + i for i in range(16)]
    engine = FakeEngine(oom_over=4, poison_len=1005)
    store, ids, worker = run_worker(tmp_path, engine, lengths)
    states = {jid: store.get(jid) for jid in ids}
    failed = [j for j in states.values() if j.state is JobState.FAILED]
    assert len(failed) == 1 and failed[0].error.code == "out_of_memory"
    assert sum(j.state is JobState.DONE for j in states.values()) == 15
    assert engine.batch_sizes[0] == 16 and min(engine.batch_sizes) == 1  # halved down to one
    assert worker.is_alive() is False and worker.fatal is None


def test_fatal_device_error_makes_the_service_unready(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d")).start()
    try:
        for w in server.runtime.pool.workers:
            w.engine = FakeEngine(fatal=True)
        r = submit(server, clip_factory("wav", 16000, 1))
        assert r.status_code == 202
        deadline = time.monotonic() + 10
        while server.runtime.health.ready and time.monotonic() < deadline:
            time.sleep(0.05)
        ready = httpx.get(server.url + "/readyz")
        assert ready.status_code == 503 and "illegal memory access" in ready.json()["error"]
        # the accepted job is not lost: it stays running in the store, to be re-run after restart
        assert httpx.get(f"{server.url}/api/jobs/{r.json()['id']}").json()["status"] == "running"
    finally:
        server.stop()


def test_hung_worker_turns_readyz_503(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", hung_timeout_s=0.5)).start()
    try:
        for w in server.runtime.pool.workers:
            w.engine = FakeEngine(hang_s=3.0)
        submit(server, clip_factory("wav", 16000, 1))
        time.sleep(1.5)
        r = httpx.get(server.url + "/readyz")
        assert r.status_code == 503 and "hung" in r.json()["error"]
    finally:
        server.stop()


# ---------------------------------------------------------------------------- load / queue
def test_queue_timeout_fails_a_job_that_waited_too_long(tmp_path):
    store, ids, _ = run_worker(tmp_path, FakeEngine(), [1000, 2000], queue_timeout_s=5.0,
                               enqueued_at=time.monotonic() - 60)
    for jid in ids:
        job = store.get(jid)
        assert job.state is JobState.FAILED and "timed out in queue" in job.error.message


def test_duplicate_result_write_is_refused(tmp_path):
    from pipeline.domain.types import Transcript

    store = JobStore(tmp_path / "s")
    jid = str(uuid.uuid4())
    store.create(Job(jid, JobState.QUEUED, OPTS, Lane.BULK, time.time(), 1.0), b"x")
    assert store.mark_running([jid]) == {jid}
    assert store.finish(jid, Transcript("a", "a")) is True
    assert store.finish(jid, Transcript("b", "b")) is False  # state-checked
    assert store.fail(jid, "x", "y") is False
    assert store.get(jid).result.text == "a"


# ---------------------------------------------------------------------------- durability
def test_restart_recovers_queued_running_and_poison_jobs(demo_dir, tmp_path, clip_factory):
    """The store as a crash left it: queued, running (attempt 1), running for the 3rd time, a
    poison upload, a finished job. A new server runs/re-runs/fails each correctly."""
    data = tmp_path / "data"
    store = JobStore(data)
    good = clip_factory("wav", 16000, 1).read_bytes()
    ids = {k: str(uuid.uuid4()) for k in ("queued", "running", "third", "poison", "done")}
    for k, jid in ids.items():
        store.create(Job(jid, JobState.QUEUED, TranscribeOptions("zh", False), Lane.BULK,
                         time.time(), 3.0), b"garbage, not audio" if k == "poison" else good)
    for k in ("running", "third", "done"):
        store.mark_running([ids[k]])
    from pipeline.domain.types import Transcript

    store.finish(ids["done"], Transcript("kept", "<|en|>kept"))
    for _ in range(2):  # two earlier crashes while running
        store.requeue(ids["third"])
        store.mark_running([ids["third"]])
    store.close()

    server = LiveServer(make_settings(demo_dir, data)).start()
    try:
        jobs = {k: wait_done(server, jid) for k, jid in ids.items()}
    finally:
        server.stop()
    assert jobs["queued"]["status"] == "done"
    assert jobs["queued"]["result"]["raw_text"].startswith("<|zh|>")  # original options kept
    assert jobs["running"]["status"] == "done"
    assert jobs["third"]["status"] == "failed" and "3 times" in jobs["third"]["error"]["message"]
    assert jobs["poison"]["status"] == "failed"
    assert jobs["done"]["result"]["text"] == "kept"
    assert JobStore(data).get(ids["running"]).attempts == 2


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode} before it was ready")
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("server did not start")


def test_kill_9_loses_no_accepted_job(demo_dir, tmp_path, clip_factory):
    """A real process killed with SIGKILL right after accepting a burst; the restart finishes all."""
    data, port = tmp_path / "data", free_port()
    cmd = [sys.executable, str(ROOT / "app_sensevoice.py"), "--model", str(demo_dir), "--device",
           "cpu", "--port", str(port), "--data-dir", str(data)]
    url = f"http://127.0.0.1:{port}"
    clip = clip_factory("wav", 44100, 2)

    def start():
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False"})
        wait_ready(url, proc)
        return proc

    proc = start()
    ids = []
    lock = threading.Lock()

    def client():
        for _ in range(6):
            with open(clip, "rb") as f:
                r = httpx.post(url + "/api/jobs", files={"file": ("a.wav", f)}, timeout=30)
            assert r.status_code == 202
            with lock:
                ids.append(r.json()["id"])

    threads = [threading.Thread(target=client) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    proc = start()
    try:
        for jid in ids:
            deadline = time.monotonic() + 60
            while True:
                r = httpx.get(f"{url}/api/jobs/{jid}", timeout=10)
                assert r.status_code == 200, (jid, r.status_code)  # never 404
                if r.json()["status"] == "done" or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert r.json()["status"] == "done"
    finally:
        proc.terminate()
        proc.wait(10)


def test_retention_purges_result_and_audio_and_answers_410(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", retention_hours=1.0)).start()
    bodies = server.app.state.poll_bodies
    try:
        jid = submit(server, clip_factory("wav", 16000, 1)).json()["id"]
        assert wait_done(server, jid)["status"] == "done"
        assert jid in bodies._bodies  # the done job's JSON, kept for repeated polls
        server.runtime.settings.limits.retention_hours = 0.0  # the job is now past its retention
        assert server.runtime.purge_expired() == 1
        r = httpx.get(f"{server.url}/api/jobs/{jid}")
        assert r.status_code == 410 and "retention" in r.json()["error"]["message"]
        assert not server.runtime.broker.spool_path(jid).exists()
        assert jid not in bodies._bodies  # no copy of the result left in memory
    finally:
        server.stop()


def test_audio_deleted_when_done_if_configured(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", delete_audio_when_done=True)).start()
    try:
        jid = submit(server, clip_factory("wav", 16000, 1)).json()["id"]
        assert wait_done(server, jid)["status"] == "done"
        assert not server.runtime.broker.spool_path(jid).exists()
    finally:
        server.stop()


@pytest.mark.parametrize("delete_when_done", [False, True])
def test_gradio_upload_cache_copy_goes_with_its_job(demo_dir, tmp_path, clip_factory, delete_when_done):
    """A UI upload leaves a copy in Gradio's cache: it is deleted with the job (retention), or at
    once when audio is deleted as soon as jobs are done (the spool keeps the job's copy till then)."""
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", retention_hours=1.0,
                                      delete_audio_when_done=delete_when_done)).start()
    clip = tmp_path / f"call-{uuid.uuid4().hex}.wav"  # a unique name, to find Gradio's copy
    clip.write_bytes(Path(clip_factory("wav", 16000, 1)).read_bytes())
    try:
        from gradio_client import Client, handle_file

        client = Client(server.url + "/ui/", verbose=False)
        status, *_ = client.predict(handle_file(str(clip)), "auto", True, False, api_name="/submit")
        job_id = status.rsplit("job ", 1)[1]
        assert wait_done(server, job_id)["status"] == "done"
        copies = [p for p in Path(gradio_cache_dir()).rglob(clip.name)]
        if delete_when_done:
            assert copies == [] and not server.runtime.broker.spool_path(job_id).exists()
            return
        assert len(copies) == 1  # kept while the job is (the review player's fallback)
        server.runtime.settings.limits.retention_hours = 0.0
        server.runtime.purge_expired()
        assert httpx.get(f"{server.url}/api/jobs/{job_id}").status_code == 410
        assert not copies[0].exists() and not server.runtime.broker.spool_path(job_id).exists()
    finally:
        server.stop()


def gradio_cache_dir() -> str:
    import tempfile

    return os.environ.get("GRADIO_TEMP_DIR") or str(Path(tempfile.gettempdir()) / "gradio")


# ---------------------------------------------------------------------------- hostile input
@pytest.fixture(scope="module")
def guarded(demo_dir, tmp_path_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("g"), max_upload_bytes=400_000,
                                      max_audio_seconds=5.0)).start()
    yield server
    server.stop()


def test_streaming_byte_cap_refuses_without_content_length(guarded):
    """A chunked upload with no Content-Length: the server answers 413 while the body is still
    streaming (the client has sent ~1 MB of a body it never finishes)."""
    import socket

    host, port = "127.0.0.1", guarded.settings.server.port
    head = (b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
            b"Content-Type: audio/wav\r\n\r\n")
    with socket.create_connection((host, port), timeout=15) as sock:
        sock.sendall(b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: multipart/form-data; boundary=x\r\n\r\n")
        for chunk in [head] + [b"\0" * 65536] * 16:  # 1 MB > the 400 kB cap; never terminated
            sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
        answer = b""
        while b"upload_too_large" not in answer and len(answer) < 4096:
            part = sock.recv(4096)
            if not part:
                break
            answer += part
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b"upload_too_large" in answer


def test_uploads_in_flight_are_bounded(demo_dir, tmp_path, clip_factory):
    """With one upload slot, a slow upload (a chunked body that is still coming) holds it: the next
    large upload gets 503 too_many_uploads with Retry-After at once, a small request still passes,
    and once the slow client goes away the slot is free again."""
    import socket

    server = LiveServer(make_settings(demo_dir, tmp_path / "d", max_concurrent_uploads=1)).start()
    large = clip_factory("wav", 44100, 2)  # ~0.5 MB: a counted upload
    try:
        slow = socket.create_connection(("127.0.0.1", server.settings.server.port), timeout=15)
        slow.sendall(b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\nTransfer-Encoding: chunked\r\n"
                     b"Content-Type: multipart/form-data; boundary=x\r\n\r\n5\r\n--x\r\n\r\n")
        time.sleep(0.5)  # the server has started on it
        t = time.monotonic()
        r = submit(server, large)
        assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_uploads"
        assert int(r.headers["retry-after"]) >= 1 and time.monotonic() - t < 5  # never waits
        small = httpx.post(server.url + "/api/jobs", files={"file": ("x.wav", b"RIFF")})
        assert small.status_code == 415  # a small body is not counted: it reached the decoder
        slow.close()
        deadline = time.monotonic() + 10
        while (r := submit(server, large)).status_code == 503 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert r.status_code == 202 and wait_done(server, r.json()["id"])["status"] == "done"
    finally:
        server.stop()


def test_duration_cap(guarded, clip_factory, tmp_path):
    # 8 s of quiet low-bitrate opus: a tiny file that decodes past the 5 s cap
    path = tmp_path / "long.opus"
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-f", "lavfi", "-i", "sine=f=220:d=8",
                    "-c:a", "libopus", "-b:a", "6k", str(path)], check=True)
    assert path.stat().st_size < 20_000
    r = submit(guarded, path)
    assert r.status_code == 413 and r.json()["error"]["code"] == "audio_too_long"


def test_playlist_is_refused(guarded, clip_factory, tmp_path):
    wav = clip_factory("wav", 16000, 1)
    m3u8 = tmp_path / "list.m3u8"
    m3u8.write_text(f"#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:10,\n{wav}\n#EXT-X-ENDLIST\n")
    concat = tmp_path / "list.ffconcat"
    concat.write_text(f"ffconcat version 1.0\nfile '{wav}'\n")
    for p in (m3u8, concat):
        r = submit(guarded, p)
        assert r.status_code == 415, (p.name, r.text)


@pytest.mark.parametrize("name", ["a\x00b.wav", "x\r\nSet-Cookie: y.wav", "../../etc/passwd.wav",
                                  "n" * 9000 + ".wav", "\u202egnp.exe.wav", "<img src=x onerror=1>.wav"])
def test_hostile_filenames_are_stored_under_server_names(guarded, clip_factory, name):
    r = submit(guarded, clip_factory("wav", 16000, 1), name=name)
    if r.status_code == 400:  # the multipart parser may refuse a monstrous header: a clear 4xx
        assert r.json()["error"]["code"] == "invalid_request"
        return
    assert r.status_code == 202, r.text
    job = wait_done(guarded, r.json()["id"])
    shown = job["filename"]
    assert len(shown) <= 200 and "/" not in shown and "\x00" not in shown and "\r" not in shown
    assert "\u202e" not in shown
    spool = {p.name for p in guarded.runtime.broker.spool_dir.iterdir()}
    assert all(n.endswith(".upload") and uuid.UUID(n[:-7]) for n in spool)


@pytest.mark.parametrize("target", ["/etc/passwd", "{data}/jobs.sqlite3", "{data}/spool"])
def test_gradio_file_routes_cannot_read_files(guarded, target):
    path = target.format(data=Path(guarded.settings.server.data_dir).resolve())
    for route in (f"/ui/gradio_api/file={path}", f"/ui/file={path}", f"/gradio_api/file={path}"):
        r = httpx.get(guarded.url + route)
        assert r.status_code in (403, 404), (route, r.status_code)
        assert "root:" not in r.text and "SQLite" not in r.text


@pytest.mark.parametrize("origin,allowed", [("https://evil.example", False), ("null", False),
                                            ("http://127.0.0.1", True)])
def test_ui_cors_is_strict_on_loopback(guarded, origin, allowed):
    """Gradio's strict CORS (the default we keep): a page from another site, or a sandboxed 'null'
    origin, cannot drive the UI's API on loopback (CSRF); the UI's own origin can."""
    r = httpx.options(guarded.url + "/ui/gradio_api/queue/join", headers={
        "Origin": origin, "Access-Control-Request-Method": "POST"})
    assert (r.headers.get("access-control-allow-origin") == origin) is allowed


def test_ui_says_busy_when_the_queue_is_full(demo_dir, tmp_path, clip_factory):
    from gradio_client import Client, handle_file

    server = LiveServer(make_settings(demo_dir, tmp_path / "d", retry_after_s=3)).start()
    sched = server.runtime.pool.scheduler
    try:
        client = Client(server.url + "/ui/", verbose=False)
        sched.maxsize = 0
        status, *_ = client.predict(handle_file(str(clip_factory("wav", 16000, 1))), "auto", True,
                                    False, api_name="/submit")  # (the job-id State is not returned)
        assert status == "busy, try again in 3 s" and len(sched) == 0
    finally:
        server.stop()


def test_no_monitoring_route(guarded):
    assert httpx.get(guarded.url + "/ui/monitoring").status_code in (403, 404)


def test_api_token(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", api_token="s3cret")).start()
    try:
        assert submit(server, clip_factory("wav", 16000, 1)).status_code == 401
        with open(clip_factory("wav", 16000, 1), "rb") as f:
            r = httpx.post(server.url + "/api/jobs", files={"file": ("a.wav", f)},
                           headers={"Authorization": "Bearer s3cret"}, timeout=30)
        assert r.status_code == 202
        poll = f"{server.url}/api/jobs/{r.json()['id']}"
        assert httpx.get(poll).status_code == 401
        assert httpx.get(poll, headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(poll, headers={"Authorization": "Bearer s3cret"}).status_code == 200
        assert httpx.get(server.url + "/healthz").status_code == 200  # probes stay open
    finally:
        server.stop()


def test_memory_admission_threshold_setting_is_respected(demo_dir, tmp_path, clip_factory):
    """On CPU there is no device memory to guard: the check must not refuse work."""
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", min_free_memory_ratio=0.99)).start()
    try:
        assert submit(server, clip_factory("wav", 16000, 1)).status_code == 202
    finally:
        server.stop()


def test_memory_admission_refuses_until_memory_recovers(demo_dir, tmp_path, clip_factory):
    """Free device memory is injected (the NVML/driver reading replaced): under the threshold new
    jobs get 503 gpu_memory_low with Retry-After; once memory recovers they are accepted again."""
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", min_free_memory_ratio=0.15)).start()
    pool = server.runtime.pool
    clip = clip_factory("wav", 16000, 1)
    try:
        pool.free_memory_ratio = lambda device: 0.05  # a GPU with 5 % free
        r = submit(server, clip)
        assert r.status_code == 503 and r.json()["error"]["code"] == "gpu_memory_low"
        assert int(r.headers["retry-after"]) >= 1 and "5% free" in r.json()["error"]["message"]
        assert len(pool.scheduler) == 0  # nothing was queued
        pool.free_memory_ratio = lambda device: 0.40  # recovered
        r = submit(server, clip)
        assert r.status_code == 202
        assert wait_done(server, r.json()["id"])["status"] == "done"
    finally:
        server.stop()


def test_polls_take_no_queue_slots_and_work_while_the_queue_is_full(live_server, clip_factory):
    job_id = submit(live_server, clip_factory("wav", 16000, 1)).json()["id"]
    sched = live_server.runtime.pool.scheduler
    old, sched.maxsize = sched.maxsize, 0  # full: submits are refused from here on
    try:
        depth = len(sched)
        with httpx.Client(base_url=live_server.url) as client:
            assert all(client.get(f"/api/jobs/{job_id}").status_code == 200 for _ in range(200))
        assert len(sched) <= depth  # 200 polls added nothing (the worker may take the job meanwhile)
        assert submit(live_server, clip_factory("wav", 16000, 1)).status_code == 503
    finally:
        sched.maxsize = old
    assert wait_done(live_server, job_id)["status"] == "done"


@pytest.mark.requires_cuda
def test_memory_admission_refuses_when_gpu_memory_is_low(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", device="cuda",
                                      min_free_memory_ratio=1.01)).start()
    try:
        r = submit(server, clip_factory("wav", 16000, 1))
        assert r.status_code == 503 and r.json()["error"]["code"] == "gpu_memory_low"
    finally:
        server.stop()



@pytest.mark.parametrize("fault", ["fatal", "hang"])
def test_device_fault_exits_3_and_the_supervisor_resumes_the_jobs(demo_dir, tmp_path, clip_factory,
                                                                  fault):
    """The real server under the shipped ``supervise`` loop, with a fatal CUDA error (or a hang)
    injected into its engine: /readyz turns 503, the process exits 3, the supervisor restarts it,
    and every accepted job finishes. SIGTERM to the supervisor then stops both."""
    port, log = free_port(), tmp_path / "supervisor.log"
    url = f"http://127.0.0.1:{port}"
    server_cmd = [sys.executable, str(ROOT / "tests" / "fault_server.py"), fault,
                  str(tmp_path / "injected"), "--model", str(demo_dir), "--device", "cpu",
                  "--port", str(port), "--data-dir", str(tmp_path / "data")]
    code = f"import sys; from app_sensevoice import supervise; sys.exit(supervise({server_cmd!r}))"
    env = {**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "SENSEVOICE_HUNG_TIMEOUT_S": "1"}
    with open(log, "wb") as out:
        sup = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=out, stderr=out)
    try:
        wait_ready(url, sup)
        clip = clip_factory("wav", 16000, 1)
        ids = [submit(SimpleNamespace(url=url), clip).json()["id"] for _ in range(3)]
        saw_unready = False
        deadline = time.monotonic() + 120
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                saw_unready |= httpx.get(url + "/readyz", timeout=2).status_code == 503
                polls = [httpx.get(f"{url}/api/jobs/{j}", timeout=2) for j in ids]
                # the restarted server answers 503 "starting" before its app is built (pipeline/web/early.py)
                if not any(p.status_code == 503 and p.json()["error"]["code"] == "starting" for p in polls):
                    states = {j: p.json()["status"] for j, p in zip(ids, polls)}
            except httpx.HTTPError:
                pass  # between the exit and the restart nothing listens
            if b"restarting" in log.read_bytes() and set(states.values()) == {"done"}:
                break
            time.sleep(0.2)
        text = log.read_text(errors="replace")
        assert saw_unready, text
        assert "server exited with 3; restarting" in text, text
        assert states == {j: "done" for j in ids}, (states, text)
        assert sup.poll() is None  # the supervisor keeps running the restarted server
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/healthz", timeout=2)  # the server went with it
    finally:
        if sup.poll() is None:  # SIGTERM first: the supervisor takes its server down with it
            sup.terminate()     # (a SIGKILL left the server running on as an orphan)
            try:
                sup.wait(30)
            except subprocess.TimeoutExpired:
                sup.kill()
