"""Sibling web processes (``--web-processes``, pipeline/web/siblings.py): a sibling serves uploads
and polls over the owner's store and relays everything else to the owner.

The pair fixture runs both ends in this process on loopback (the owner's app on a port and on its
private relay socket, the sibling's app on a port of its own), so that each request's path is
known; the last test runs real processes sharing one port, killed with SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Client
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
import websockets

from pipeline.domain.errors import QueueFull, StorageError
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from pipeline.serving import sibling_wire as wire
from pipeline.serving.broker import EmbeddedBroker
from pipeline.serving.broker_sibling import SiblingBroker
from pipeline.serving.intake import new_job_id
from pipeline.serving.scheduler import Scheduler, WorkItem
from pipeline.serving.sibling_hub import SiblingHub
from pipeline.web.processes import web_processes
from pipeline.web.siblings import SiblingTrust, WebSiblings, owned, sibling_app
from tests.conftest import MODEL_CACHE, free_port, make_settings
from tests.test_reliability import wait_ready

pytest_plugins = ["tests.fixtures_media"]
ROOT = Path(__file__).resolve().parent.parent


# ---------------------------------------------------------------------------- units
def test_work_items_and_errors_cross_the_wire_unchanged():
    mono = torch.linspace(-1, 1, 1600)
    stereo = torch.stack([mono, -mono])
    for wave in (mono, stereo):
        item = WorkItem("j", Lane.INTERACTIVE, TranscribeOptions(language="en", split_channels=wave.dim() == 2),
                        int(wave.shape[-1]), audio=wave, piece=2, pieces=5, start_s=1.5, speaker="left")
        back = wire.item_from_head(json.loads(json.dumps(wire.item_head(item))),
                                   bytearray(bytes(wire.item_audio(item).cast("B"))))
        assert torch.equal(back.audio, wave)  # float32, exactly: the same tokens either way
        assert (back.job_id, back.lane, back.options, back.n_samples, back.piece, back.pieces, back.start_s,
                back.speaker) == ("j", Lane.INTERACTIVE, item.options, 1600, 2, 5, 1.5, "left")
    e = wire.error_from_head(wire.error_head(QueueFull("full", retry_after=7)))
    assert isinstance(e, QueueFull) and e.retry_after == 7 and e.message == "full"
    assert isinstance(wire.error_from_head(wire.error_head(StorageError("disk"))), StorageError)


def test_the_submits_and_the_store_reads_are_the_siblings_own():
    assert owned("POST", "/api/jobs") and owned("GET", "/api/jobs/abc") and owned("POST", "/v1/audio/transcriptions")
    for method, path in [("GET", "/api/jobs/abc/result"), ("HEAD", "/api/jobs/abc/audio"),
                         ("GET", "/api/jobs/abc/review"), ("GET", "/v1/models"), ("GET", "/v1/models/sensevoice-small")]:
        assert owned(method, path), (method, path)
    for method, path in [("GET", "/ui/"), ("GET", "/api/jobs/abc/export"), ("DELETE", "/api/jobs/abc"),
                         ("GET", "/metrics"), ("GET", "/readyz"), ("POST", "/api/batches"), ("GET", "/api/stream"),
                         ("PATCH", "/api/jobs/abc/review"), ("GET", "/api/jobs/abc/events"),
                         ("GET", "/api/jobs/abc/result/x"), ("GET", "/api/jobs/a/b/audio"), ("POST", "/v1/models")]:
        assert not owned(method, path), (method, path)


def test_web_processes_auto_is_one_on_a_cpu_host_and_never_beside_redis(tmp_path):
    assert web_processes(make_settings(tmp_path, tmp_path)) == 1
    assert web_processes(make_settings(tmp_path, tmp_path, web_processes=3)) == 3
    assert web_processes(make_settings(tmp_path, tmp_path, web_processes=3, broker="redis://x:1/0")) == 1
    assert web_processes(make_settings(tmp_path, tmp_path, web_processes=3, role="worker")) == 1


def test_per_server_limits_are_shared_out_among_the_web_processes(tmp_path):
    """Each process counts a client's failed sign-ins on its own: each gets its share of the
    configured whole (rounded up; no limit stays none); limits that are per process stay as set."""
    from pipeline.web.processes import share_limits

    s = make_settings(tmp_path, tmp_path, auth_failures_per_client=20, max_concurrent_uploads=9,
                      max_uploads_per_client=4)
    share_limits(s, 3)
    assert s.limits.auth_failures_per_client == 7
    # per process: a process's own slots (its GIL, its memory); a client's uploads land anywhere
    assert (s.limits.max_concurrent_uploads, s.limits.max_uploads_per_client) == (9, 4)
    unlimited = make_settings(tmp_path, tmp_path, auth_failures_per_client=0)
    share_limits(unlimited, 3)
    assert unlimited.limits.auth_failures_per_client == 0
    alone = make_settings(tmp_path, tmp_path, auth_failures_per_client=20)
    share_limits(alone, 1)
    assert alone.limits.auth_failures_per_client == 20


def test_a_relayed_address_is_believed_from_the_relay_socket_with_the_secret_only():
    seen = []

    async def app(scope, receive, send):
        seen.append((scope.get("client"), [k for k, _ in scope["headers"]]))

    trust = SiblingTrust(app, "s3cret")
    relayed = [(b"x-sensevoice-sibling", b"s3cret"), (b"x-sensevoice-client", b"10.1.2.3"), (b"host", b"h")]
    cases = [(None, relayed, ("10.1.2.3", 0)),  # the relay socket (no peer address), the secret
             (("127.0.0.1", 5000), relayed, ("127.0.0.1", 5000)),  # a TCP client naming itself
             (None, [(b"x-sensevoice-sibling", b"guess"), relayed[1]], None)]  # a wrong secret
    for client, headers, expected in cases:
        asyncio.run(trust({"type": "http", "client": client, "headers": headers}, None, None))
        got, names = seen.pop()
        assert got == expected
        assert b"x-sensevoice-sibling" not in names and b"x-sensevoice-client" not in names


def test_the_hub_refuses_a_connection_without_the_secret(tmp_path):
    broker = EmbeddedBroker(tmp_path, Scheduler(8))
    hub = SiblingHub(str(tmp_path / "hub.sock"), "right", broker, lambda job: None, dict)
    hub.start()
    try:
        with pytest.raises(Exception):
            SiblingBroker(tmp_path, str(tmp_path / "hub.sock"), "wrong").hub.call("state")
        assert SiblingBroker(tmp_path, str(tmp_path / "hub.sock"), "right").ping() is False  # {}: no state
    finally:
        hub.stop()


def test_a_sibling_that_stops_reading_is_cut_off_and_the_others_get_every_push(tmp_path, monkeypatch):
    """The owner's pushes go out from a thread of their own; a sibling whose socket takes nothing
    for PUSH_STALL_S (stopped, wedged) is cut off -- it restarts with nothing cached -- instead of
    holding back the other siblings' bodies and purges (a purged transcript must leave them)."""
    from pipeline.serving import sibling_hub
    from pipeline.serving.job_events import JobEvent

    monkeypatch.setattr(sibling_hub, "PUSH_STALL_S", 1)
    broker = EmbeddedBroker(tmp_path, Scheduler(8))
    body = b"x" * 100_000
    hub = SiblingHub(str(tmp_path / "hub.sock"), "s", broker, lambda job: None, dict,
                     body_of=lambda jid: body if jid.startswith("j") else None)
    hub.start()
    got, forgotten = [], []
    reading = SiblingBroker(tmp_path, str(tmp_path / "hub.sock"), "s")
    reading.hub.on_bodies, reading.hub.on_forget = got.extend, forgotten.extend
    stalled = Client(str(tmp_path / "hub.sock"), family="AF_UNIX", authkey=b"s")  # and reads nothing
    try:
        deadline = time.monotonic() + 10
        while len(hub._conns) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        n = 300  # 30 MB: far more than a socket buffer holds
        broker.feed.publish([JobEvent(f"j{i}", JobState.DONE) for i in range(n)])
        broker.feed.publish([JobEvent("gone", JobState.DONE)])  # no body held here: forgotten there
        hub.forget(["j0", "j1"])
        deadline = time.monotonic() + 60
        while len(got) < n or len(forgotten) < 3 or len(hub._conns) > 1:  # (the stalled one is cut off)
            assert time.monotonic() < deadline, (len(got), forgotten, len(hub._conns))
            time.sleep(0.05)
        assert [jid for jid, _ in got] == [f"j{i}" for i in range(n)] and got[0][1] == body
        assert forgotten == ["gone", "j0", "j1"] and not reading.hub._closed
        with pytest.raises((EOFError, OSError)):  # (cut mid-message: "got end of file during message")
            while stalled.poll(10):  # what it was sent before, then the end
                stalled.recv_bytes()
    finally:
        stalled.close()
        reading.close()
        hub.stop()


def test_a_refused_submit_leaves_no_row_and_no_spooled_upload(tmp_path):
    """The owner's queue is full: the sibling's submit is refused whole (503 queue_full)."""
    broker = EmbeddedBroker(tmp_path, Scheduler(0))  # a queue that holds nothing
    hub = SiblingHub(str(tmp_path / "hub.sock"), "k", broker, lambda job: None, dict)
    hub.start()
    try:
        sib = SiblingBroker(tmp_path, str(tmp_path / "hub.sock"), "k")
        job = Job(id=new_job_id(), state=JobState.QUEUED, options=TranscribeOptions(), lane=Lane.BULK,
                  created_at=time.time(), audio_seconds=0.1, filename="a.wav")
        sib.create(job, b"RIFF upload bytes")
        assert sib.spool_path(job.id).exists()
        with pytest.raises(QueueFull):
            sib.put(WorkItem(job.id, Lane.BULK, job.options, 1600, audio=torch.zeros(1600)))
        sib.discard(job.id)  # what the intake does with a refused submit
        assert not sib.spool_path(job.id).exists()
        assert broker.counts()["queued"] == 0
    finally:
        hub.stop()


def test_the_hub_commits_submits_that_arrive_together_in_one_group(tmp_path):
    """A sibling's submits that reach the owner together are one batch: their rows in one group
    commit, each item queued or refused on its own (a full queue refuses the rest, rows gone),
    a WAV job's audio the owner's own mapping of the spool file (no payload crossed)."""
    from pipeline.audio.wav import pcm16_mono_layout
    from pipeline.serving.broker_sqlite import SpooledPcm16
    from tests.test_spooled_audio import wav

    broker = EmbeddedBroker(tmp_path, Scheduler(5))
    hub = SiblingHub(str(tmp_path / "hub.sock"), "k", broker, lambda job: None, dict)
    hub.start()
    try:
        sib = SiblingBroker(tmp_path, str(tmp_path / "hub.sock"), "k")
        data = wav(np.arange(16000, dtype=np.int16))
        layout = pcm16_mono_layout(data, max_seconds=60)
        frames = []
        for k in range(8):
            job = Job(id=new_job_id(), state=JobState.QUEUED, options=TranscribeOptions(), lane=Lane.BULK,
                      created_at=time.time(), audio_seconds=1.0, filename=f"{k}.wav")
            sib.spool(job.id, data)
            item = WorkItem(job.id, Lane.BULK, job.options, 16000, audio=sib.spooled_audio(job.id, layout))
            assert not wire.item_audio(item)  # nothing but the header crosses
            frames.append({"op": "submit", "rid": k, "job": wire.job_head(job), "item": wire.item_head(item)})
        raw = Client(str(tmp_path / "hub.sock"), family="AF_UNIX", authkey=b"k")
        groups = broker._inserts.groups
        messages = [json.dumps(f).encode() for f in frames]  # in one write: they arrive together
        os.write(raw.fileno(), b"".join(struct.pack("!i", len(m)) + m for m in messages))
        replies = []
        while len(replies) < len(frames):
            replies += json.loads(raw.recv_bytes())["replies"]
        replies.sort(key=lambda r: r["rid"])
        assert broker._inserts.groups == groups + 1  # eight rows, one transaction
        assert [("ok" in r) for r in replies] == [True] * 5 + [False] * 3
        assert {r["error"]["code"] for r in replies[5:]} == {"queue_full"}
        assert broker.counts()["queued"] == 5
        refused = [f["job"]["id"] for f in frames[5:]]
        assert not any(broker.spool_path(j).exists() for j in refused)
        items = broker.claim("t", 8)
        assert len(items) == 5 and all(isinstance(i.audio, SpooledPcm16) for i in items)
        assert items[0].audio.path == broker.spool_path(items[0].job_id)
        assert torch.equal(items[0].audio.load(), torch.arange(16000, dtype=torch.int16))
        raw.close()
    finally:
        hub.stop()


def _sibling_submit(tmp_path, broker, fsync):
    """A sibling's submit (create + put, as the intake runs them) against a real hub over the
    owner's ``broker``, the spool file's fsync preceded by ``fsync(job_id)``; returns (job, error)."""
    import pipeline.serving.broker_sqlite as store_module

    hub = SiblingHub(str(tmp_path / "hub.sock"), "k", broker, lambda job: None, dict)
    hub.start()
    job = Job(id=new_job_id(), state=JobState.QUEUED, options=TranscribeOptions(), lane=Lane.BULK,
              created_at=time.time(), audio_seconds=0.1, filename="a.wav")
    real_fsync, error = os.fsync, None
    try:
        sib = SiblingBroker(tmp_path, str(tmp_path / "hub.sock"), "k")
        store_module.os.fsync = lambda fd: fsync(job.id) or real_fsync(fd)
        sib.create(job, b"RIFF upload bytes")
        try:
            sib.put(WorkItem(job.id, Lane.BULK, job.options, 1600, audio=torch.zeros(1600)))
        except StorageError as e:
            error = e
            sib.discard(job.id)  # what the intake does with a failed submit
    finally:
        store_module.os.fsync = real_fsync
        hub.stop()
    return job, error


def test_a_siblings_spool_file_is_synced_while_the_owner_commits_the_row(tmp_path):
    """The two fsyncs of a submit (the upload's spool file here, the row's WAL commit in the
    owner) run at once, not in series (idle submit -> done counts both): the row is committed
    while the spool file's fsync is under way, with the upload's size (recovery's check)."""
    broker, seen = EmbeddedBroker(tmp_path, Scheduler(8)), {}

    def fsync(job_id):
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "row" not in seen:
            try:
                seen["row"] = broker.get(job_id).state
            except Exception:
                time.sleep(0.005)

    job, error = _sibling_submit(tmp_path, broker, fsync)
    assert error is None and seen.get("row") is JobState.QUEUED  # committed before the fsync ended
    assert broker._conn().execute("SELECT upload_bytes FROM jobs WHERE id=?", (job.id,)).fetchone()[0] == 17
    assert broker.counts()["queued"] == 1


def test_a_failed_spool_fsync_fails_the_submit_and_leaves_no_row(tmp_path):
    """The owner took the row and the item, then the sibling's fsync of the upload failed (an I/O
    error): the submit answers 503 storage_error and the intake's discard removes row and file."""
    import errno

    def fsync(job_id):
        raise OSError(errno.EIO, "Input/output error")

    broker = EmbeddedBroker(tmp_path, Scheduler(8))
    job, error = _sibling_submit(tmp_path, broker, fsync)
    assert isinstance(error, StorageError)
    assert not broker.spool_path(job.id).exists()
    with pytest.raises(Exception):
        broker.get(job.id)


# ---------------------------------------------------------------------------- both ends, one process
class Served:
    def __init__(self, app, sockets):
        import uvicorn

        from pipeline.web.edge import uvicorn_options

        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", **uvicorn_options(app_settings(app))))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": sockets}, daemon=True)
        self.thread.start()

    def stop(self):
        self.server.should_exit = True
        self.thread.join(15)


def app_settings(app):
    inner = getattr(app, "local", None) or getattr(app, "app", None) or app
    return inner.state.runtime.settings


def tcp_listener() -> tuple[socket.socket, str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    return sock, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def pair(demo_dir, tmp_path_factory):
    from pipeline.web.app import create_app

    data = tmp_path_factory.mktemp("siblings")
    settings = make_settings(demo_dir, data, segment_threshold_s=8.0)
    owner_app = create_app(settings)
    runtime = owner_app.state.runtime
    owner_sock, owner_url = tcp_listener()
    siblings = WebSiblings(settings, runtime, 1, [], owner_sock,  # the hub and the relay, no process
                           bodies=owner_app.state.poll_bodies)
    siblings.start()
    owner = Served(SiblingTrust(owner_app, siblings.secret), [owner_sock, siblings.relay])
    sib_settings = make_settings(demo_dir, data, segment_threshold_s=8.0, role="api", ui=False)
    sib_sock, sib_url = tcp_listener()
    siblings.front = sibling_app(sib_settings, siblings.dir)  # (the tests read both ends' state)
    siblings.owner_runtime = runtime
    sibling = Served(siblings.front, [sib_sock])
    for url in (owner_url, sib_url):
        deadline = time.monotonic() + 120
        while httpx.get(url + "/readyz", timeout=5).status_code != 200:
            assert time.monotonic() < deadline, "not ready"
            time.sleep(0.2)
    yield owner_url, sib_url, siblings
    sibling.stop()
    owner.stop()
    siblings.stop()


def submit(url: str, path: Path, **params) -> httpx.Response:
    with open(path, "rb") as f:
        return httpx.post(url + "/api/jobs", files={"file": (path.name, f)}, params=params, timeout=90)


def test_a_siblings_job_gives_the_owners_tokens(pair, speech_clip):
    owner, sib, siblings = pair
    env = siblings.sibling_env()  # a sibling counts the owner's shares of the per-server limits
    assert env["SENSEVOICE_AUTH_FAILURES_PER_CLIENT"] == str(siblings.settings.limits.auth_failures_per_client)
    before = siblings.hub.accepted
    direct = submit(owner, speech_clip, wait=60)
    via = submit(sib, speech_clip)
    assert via.status_code == 202 and via.json()["status"] == "queued"
    assert siblings.hub.accepted == before + 1  # the sibling took it, the owner queued it
    jid = via.json()["id"]
    deadline = time.monotonic() + 60
    while (job := httpx.get(f"{sib}/api/jobs/{jid}", timeout=10).json())["status"] != "done":
        assert time.monotonic() < deadline, job
        time.sleep(0.1)
    assert job["result"]["raw_text"] == direct.json()["result"]["raw_text"] != ""
    assert httpx.get(f"{owner}/api/jobs/{jid}", timeout=10).json()["result"] == job["result"]
    # ?wait= and the OpenAI route wait in the sibling for the owner's worker
    waited = submit(sib, speech_clip, wait=60)
    assert waited.status_code == 200 and waited.json()["result"]["raw_text"] == job["result"]["raw_text"]
    with open(speech_clip, "rb") as f:
        r = httpx.post(sib + "/v1/audio/transcriptions", files={"file": ("a.wav", f)},
                       data={"model": "sensevoice-small", "response_format": "text"}, timeout=90)
    assert r.status_code == 200 and r.text.strip() == direct.json()["result"]["text"].strip()


def test_a_long_recording_is_split_by_the_sibling_and_finished_by_the_owner(pair, long_call):
    owner, sib, siblings = pair
    r = submit(sib, long_call, wait=120)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "done" and len(r.json()["result"]["segments"]) >= 2


def test_a_sibling_answers_the_store_reads_itself(pair, speech_clip):
    """Exports, the recording, the review and the models are read from the store by the sibling
    (counted on its own metrics, never on the owner's), the same bytes as the owner answers."""
    owner, sib, siblings = pair
    mine, theirs = siblings.front.local.state.runtime.metrics.registry, siblings.owner_runtime.metrics.registry

    def count(registry, route: str) -> float:
        return registry.get_sample_value("sensevoice_http_requests_total",
                                         {"method": "GET", "route": route, "status": "200"}) or 0.0

    jid = submit(sib, speech_clip, wait=60).json()["id"]
    routes = ["/api/jobs/{job_id}/result", "/api/jobs/{job_id}/audio", "/api/jobs/{job_id}/review", "/v1/models"]
    before = [(count(mine, r), count(theirs, r)) for r in routes]
    export = httpx.get(f"{sib}/api/jobs/{jid}/result", params={"format": "srt"}, timeout=30)
    assert export.status_code == 200 and "-->" in export.text
    assert export.content == httpx.get(f"{owner}/api/jobs/{jid}/result", params={"format": "srt"}, timeout=30).content
    assert httpx.get(f"{sib}/api/jobs/{jid}/audio", timeout=30).content == speech_clip.read_bytes()
    review = httpx.get(f"{sib}/api/jobs/{jid}/review", timeout=30)
    assert review.status_code == 200 and review.json() == httpx.get(f"{owner}/api/jobs/{jid}/review", timeout=30).json()
    assert httpx.get(f"{sib}/v1/models", timeout=30).json() == httpx.get(f"{owner}/v1/models", timeout=30).json()
    after = [(count(mine, r), count(theirs, r)) for r in routes]
    # the sibling answered each once; the owner only its own direct requests (export, review, models)
    assert [a[0] - b[0] for a, b in zip(after, before)] == [1, 1, 1, 1], (before, after)
    assert [a[1] - b[1] for a, b in zip(after, before)] == [1, 0, 1, 1], (before, after)
    missing = httpx.get(f"{sib}/api/jobs/{new_job_id()}/result", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"


def test_everything_else_is_relayed_to_the_owner(pair, speech_clip):
    owner, sib, _ = pair
    assert httpx.get(sib + "/ui/", timeout=30).status_code == 200
    jid = submit(sib, speech_clip, wait=60).json()["id"]
    with httpx.stream("GET", f"{sib}/api/jobs/{jid}/events", timeout=30) as events:  # the owner's stream
        assert events.status_code == 200 and events.headers["content-type"].startswith("text/event-stream")
        assert '"done"' in next(events.iter_text())
    assert "sensevoice_" in httpx.get(sib + "/metrics", timeout=30).text
    # a guard of the owner answers the same through the relay
    refused = httpx.post(sib + "/api/batches", headers={"Origin": "http://evil.example"}, timeout=30)
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "cross_site_request"
    missing = httpx.get(f"{sib}/api/jobs/{new_job_id()}", timeout=30)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "job_not_found"


def test_live_captions_are_relayed_to_the_owner(pair, speech_clip):
    _, sib, _ = pair
    import wave

    with wave.open(str(speech_clip)) as w:
        pcm = w.readframes(w.getnframes())

    async def run():
        url = sib.replace("http://", "ws://") + "/api/stream"
        async with websockets.connect(url, proxy=None, max_size=None) as ws:
            for i in range(0, len(pcm), 6400):
                await ws.send(pcm[i:i + 6400])
            await ws.send(json.dumps({"type": "end"}))
            messages = [json.loads(m) async for m in ws]
            return messages, ws.close_code

    messages, code = asyncio.run(run())
    assert code == 1000 and any(m.get("type") == "final" and m.get("text") for m in messages), messages
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        asyncio.run(websockets.connect(sib.replace("http://", "ws://") + "/api/stream", proxy=None,
                                       origin="http://evil.example").__aenter__())
    assert refused.value.response.status_code == 403


def test_a_finished_jobs_body_is_sent_to_the_sibling_as_it_would_read_it(pair, speech_clip):
    """The owner sends each finished job's poll body to its siblings, so that their polls of it
    read neither SQLite nor a thread: byte for byte the body the sibling would make from the
    store; a reviewer's edit sends the new one; a purge takes it back (the transcript does not
    outlive retention in a sibling's memory). Runs last of the pair's tests: it purges the store."""
    from pipeline.web.views import job_body

    owner, sib, siblings = pair
    local = siblings.front.local
    bodies, store = local.state.poll_bodies, local.state.runtime.broker

    def pushed_when(check, what: str) -> bytes | None:
        deadline = time.monotonic() + 10
        while not check(body := bodies.pushed(jid)):
            assert time.monotonic() < deadline, what
            time.sleep(0.02)
        return body

    jid = submit(sib, speech_clip, wait=60).json()["id"]
    body = pushed_when(lambda b: b is not None, "the finished job's body never reached the sibling")
    assert body == job_body(store.get(jid), bodies.retention_hours)  # what the sibling would answer from SQLite, exactly
    assert httpx.get(f"{sib}/api/jobs/{jid}", timeout=10).content == body
    assert json.loads(body)["status"] == "done" and json.loads(body)["result"]["text"]

    r = httpx.patch(f"{sib}/api/jobs/{jid}/review", json={"reviewed": True, "segments": [
        {"index": 0, "text": "Corrected words here"}]}, timeout=30)  # (relayed to the owner)
    assert r.status_code == 200, r.text
    edited = pushed_when(lambda b: b != body, "the reviewer's edit never reached the sibling")
    assert edited == job_body(store.get(jid), bodies.retention_hours) and json.loads(edited)["review"]["reviewed"] is True
    assert httpx.get(f"{sib}/api/jobs/{jid}", timeout=10).json()["result"]["segments"][0]["text"] == \
        "Corrected words here"

    owner_runtime = siblings.owner_runtime  # retention runs there; its purge reaches the sibling
    kept, owner_runtime.settings.limits.retention_hours = owner_runtime.settings.limits.retention_hours, 0
    try:
        assert owner_runtime.purge_expired() >= 1
    finally:
        owner_runtime.settings.limits.retention_hours = kept
    pushed_when(lambda b: b is None, "a purged job's body stayed in the sibling's memory")
    gone = httpx.get(f"{sib}/api/jobs/{jid}", timeout=10)
    assert gone.status_code == 410 and "Corrected" not in gone.text


def test_pushed_bodies_cross_the_wire_unchanged_and_are_bounded():
    from multiprocessing import Pipe

    from pipeline.web.views import PollBodies

    a, b = Pipe()
    sender, reader = wire.Wire(a), wire.Wire(b)
    pushes = [("bodies", [("a", b'{"x":1}'), ("b", b"")]), ("forget", ["c"]), ("bodies", [("d", b"\x00" * 70_000)])]
    threading.Thread(target=sender.push, args=(pushes,), daemon=True).start()
    got = [reader.recv() for _ in range(3)]
    sender.close()
    reader.close()
    assert wire.pushed_bodies(*got[0]) == [("a", b'{"x":1}'), ("b", b"")]
    assert got[1][0] == {"op": "forget", "ids": ["c"]}
    assert wire.pushed_bodies(*got[2]) == [("d", b"\x00" * 70_000)]
    with pytest.raises(ValueError):
        wire.pushed_bodies({"ids": ["a"], "sizes": [5]}, b"abc")
    bodies = PollBodies(pushed_size=3)
    bodies.push([(str(i), b"x" * 10) for i in range(5)])
    assert [bodies.pushed(str(i)) for i in range(5)] == [None, None, b"x" * 10, b"x" * 10, b"x" * 10]
    bodies.forget(["3"])
    assert bodies.pushed("3") is None and bodies._pushed_bytes == 20
    bodies.PUSHED_BYTES = 25
    bodies.push([("5", b"y" * 10)])  # over the bytes bound: the oldest goes
    assert bodies.pushed("2") is None and bodies.pushed("5") == b"y" * 10 and bodies._pushed_bytes == 20


# ---------------------------------------------------------------------------- real processes, one port
def start_owner(demo_dir, tmp_path, port: int, log, processes: int = 2, **env) -> subprocess.Popen:
    """The app with ``processes`` web processes on ``port`` (the demo model on the CPU), ready."""
    cmd = [sys.executable, str(ROOT / "app_sensevoice.py"), "--model", str(demo_dir), "--device", "cpu",
           "--port", str(port), "--data-dir", str(tmp_path / "data"), "--web-processes", str(processes)]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env={**os.environ, "SENSEVOICE_CACHE_DIR": str(MODEL_CACHE), **env})
    wait_ready(f"http://127.0.0.1:{port}", proc)
    return proc


def siblings_on(port: int) -> list[int]:
    out = subprocess.run(["pgrep", "-f", f"port {port} .*sibling-dir"], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def wait_siblings(port: int, timeout_s: float = 60) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while not (found := siblings_on(port)):
        assert time.monotonic() < deadline, "no sibling web process started"
        time.sleep(0.2)
    return found


def test_siblings_share_the_port_and_come_back_after_sigkill(demo_dir, tmp_path, speech_clip):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "owner.log", "w+")
    proc = start_owner(demo_dir, tmp_path, port, log)

    try:
        first = wait_siblings(port)

        def burst(n: int) -> list[str]:
            ids = []
            for _ in range(n):  # a connection each: the kernel hands each to one of the processes
                r = submit(url, speech_clip)
                assert r.status_code == 202, r.text
                ids.append(r.json()["id"])
            return ids

        ids = burst(24)
        os.kill(first[0], signal.SIGKILL)
        deadline = time.monotonic() + 60
        while not (siblings_on(port) and siblings_on(port) != first):
            assert time.monotonic() < deadline, "the sibling was not started again"
            time.sleep(0.2)
        wait_ready(url, proc)
        ids += burst(12)
        for jid in ids:
            deadline = time.monotonic() + 60
            while (r := httpx.get(f"{url}/api/jobs/{jid}", timeout=10)).json()["status"] != "done":
                assert r.status_code == 200 and time.monotonic() < deadline, r.text
                time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    deadline = time.monotonic() + 15
    while siblings_on(port):  # the siblings stop with the owner: none keeps the port
        assert time.monotonic() < deadline, "a sibling outlived its owner"
        time.sleep(0.2)
    log.seek(0)
    text = log.read()
    accepted = int(text.split("sibling web processes accepted ")[1].split()[0])
    assert accepted > 0, text[-2000:]


def test_beside_two_siblings_the_owner_takes_no_public_connection(demo_dir, tmp_path, speech_clip):
    """3 web processes (the auto choice on a GPU host): every upload is taken by a sibling (the
    owner keeps the GPU loop and the store), the UI and exports still answer through the relay."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "owner.log", "w+")
    proc = start_owner(demo_dir, tmp_path, port, log, processes=3, SENSEVOICE_AUTH_FAILURES_PER_CLIENT="20")
    try:
        found = wait_siblings(port)
        assert len(found) == 2
        for pid in found:  # each counts its share of the per-server limits: ceil(20 / 3)
            env = dict(kv.split("=", 1) for kv in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in kv)
            assert env["SENSEVOICE_AUTH_FAILURES_PER_CLIENT"] == "7"
        ids = []
        for _ in range(16):  # a connection each
            r = submit(url, speech_clip)
            assert r.status_code == 202, r.text
            ids.append(r.json()["id"])
        for jid in ids:
            deadline = time.monotonic() + 60
            while (r := httpx.get(f"{url}/api/jobs/{jid}", timeout=10)).json()["status"] != "done":
                assert r.status_code == 200 and time.monotonic() < deadline, r.text
                time.sleep(0.1)
        assert httpx.get(url + "/ui/", timeout=30).status_code == 200
        assert "-->" in httpx.get(f"{url}/api/jobs/{ids[0]}/result", params={"format": "srt"}, timeout=30).text
        # nobody scrapes a sibling: what they answered is counted on the owner's /metrics (their
        # prometheus multiprocess files), at once -- every upload and this 404 were theirs
        assert httpx.get(f"{url}/api/jobs/{new_job_id()}", timeout=30).status_code == 404
        text = httpx.get(url + "/metrics", timeout=30).text  # (relayed to the owner)
        assert sample(text, 'sensevoice_http_requests_total{method="POST",route="/api/jobs",status="202"}') == len(ids)
        assert sample(text, 'sensevoice_http_refusals_total{code="job_not_found",route="/api/jobs/{job_id}",'
                            'status="404"}') == 1
        assert text.count("# TYPE sensevoice_http_requests_total counter") == 1  # one family, summed
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    log.seek(0)
    text = log.read()
    assert int(text.split("sibling web processes accepted ")[1].split()[0]) == len(ids), text[-2000:]


def sample(text: str, series: str) -> float:
    """The value of one series in a /metrics text (0 when it is not there)."""
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_the_owner_accepts_beside_one_sibling_only_unless_told(tmp_path):
    from pipeline.web.processes import owner_accepts

    auto = make_settings(tmp_path, tmp_path)
    assert owner_accepts(auto, 2) and not owner_accepts(auto, 3) and not owner_accepts(auto, 5)
    assert owner_accepts(make_settings(tmp_path, tmp_path, web_owner_accepts=True), 3)
    assert not owner_accepts(make_settings(tmp_path, tmp_path, web_owner_accepts=False), 2)


def test_a_relay_without_its_owner_answers_503_not_ready(tmp_path):
    from pipeline.web.siblings import OwnerRelay

    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    relay = OwnerRelay(str(tmp_path / "gone.sock"), "k")
    scope = {"type": "http", "method": "GET", "path": "/ui/", "raw_path": b"/ui/", "query_string": b"",
             "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 1)}
    asyncio.run(relay.http(scope, receive, send))
    assert sent[0]["status"] == 503
    assert json.loads(sent[1]["body"])["error"]["code"] == "not_ready"


def test_a_sibling_stops_when_its_owner_is_killed(demo_dir, tmp_path):
    """SIGKILL of the main process: its sibling hears the hub close and stops; the port is free."""
    port = free_port()
    proc = start_owner(demo_dir, tmp_path, port, subprocess.DEVNULL)
    try:
        kids = wait_siblings(port)
    finally:
        proc.kill()
        proc.wait(10)
    def alive(pid: int) -> bool:
        try:
            return "sibling-dir" in Path(f"/proc/{pid}/cmdline").read_text(errors="replace")
        except OSError:  # gone
            return False

    # a sibling still starting (its imports, then up to 30 s for its owner's hub: sibling_app)
    # when its owner was killed stops once that wait is over; a connected one at once
    deadline = time.monotonic() + 30 + 30
    while any(alive(k) for k in kids):
        assert time.monotonic() < deadline, "a sibling outlived its killed owner"
        time.sleep(0.2)
    with socket.socket() as s:  # nothing listens on the port any more
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))


def test_an_owner_that_does_not_accept_leaves_every_upload_to_its_siblings(demo_dir, tmp_path, speech_clip):
    """SENSEVOICE_WEB_OWNER_ACCEPTS=false: the public port is the siblings' alone (the owner runs
    the GPU loop and the store), and what they relay still reaches it (the UI)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "owner.log", "w+")
    proc = start_owner(demo_dir, tmp_path, port, log, SENSEVOICE_WEB_OWNER_ACCEPTS="false")
    try:
        for _ in range(6):
            r = submit(url, speech_clip, wait=60)
            assert r.status_code == 200 and r.json()["status"] == "done", r.text
        assert httpx.get(url + "/ui/", timeout=30).status_code == 200
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)
    log.seek(0)
    assert "sibling web processes accepted 6 jobs" in log.read()
