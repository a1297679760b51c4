"""Deleting and keeping a call over real HTTP (issue 40; pipeline/web/routes/retention.py), in both
topologies (the embedded SQLite store, and Redis on a real redis-server): ``DELETE /api/jobs/{id}``
removes the job, its audio, its result and its review from the store, and every route of the job
answers 410 as for a purged job afterwards (the poll first: the cached snapshot is dropped too);
only the token or the job's review link may delete (a download link is 403, nothing 401); a queued
job is refused with 409 ``job_not_finished``. ``POST /api/jobs/{id}/keep`` moves the job's
``expires_at`` (its JSON, the calls table) up to ``keep_max_days``; hostile bodies are a 400."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from tests.conftest import LiveServer, make_settings
from tests.redis_server import RedisServer

TOKEN = "delete-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
KEEP_MAX_DAYS = 5.0
RETENTION_HOURS = 2.0


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def server(request, demo_dir, tmp_path_factory):
    redis = None
    extra = {}
    if request.param == "redis":
        redis = RedisServer(tmp_path_factory.mktemp("delete-redis")).start()
        extra["broker"] = redis.url
    live = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp(f"delete-{request.param}"),
                                    api_token=TOKEN, ui=False, keep_max_days=KEEP_MAX_DAYS,
                                    retention_hours=RETENTION_HOURS, auth_failures_per_client=0,
                                    **extra)).start()
    live.redis = redis
    yield live
    live.stop()
    if redis is not None:
        redis.stop()


def done_job(server, clip) -> dict:
    with open(clip, "rb") as f:
        r = httpx.post(server.url + "/api/jobs?wait=60", files={"file": ("call.wav", f)},
                       data={"language": "en"}, headers=AUTH, timeout=90)
    assert r.status_code == 200 and r.json()["status"] == "done", r.text
    return r.json()


def page_links(server, job_id: str) -> dict:
    """The links the page's view of the job carries (links.review: the page's and the desk's)."""
    return server.app.state.pages.live_view(server.runtime.view.get(job_id))["links"]


def query(link: str) -> str:
    return "?" + link.split("?", 1)[1]


def test_delete_removes_the_job_its_audio_result_and_review_everywhere(server, clip_factory):
    job = done_job(server, clip_factory("wav", 16000, 1))
    jid = job["id"]
    r = httpx.patch(f"{server.url}/api/jobs/{jid}/review", headers=AUTH, timeout=10, json={
        "reviewed": True, "segments": [{"index": 0, "note": "a note that must go"}]})
    assert r.status_code == 200, r.text
    links = page_links(server, jid)
    assert httpx.get(f"{server.url}/api/jobs/{jid}", headers=AUTH, timeout=10).status_code == 200  # cached now
    # who may delete: the review link or the token; a download link no, nothing no
    r = httpx.delete(f"{server.url}/api/jobs/{jid}{query(links['audio'])}", timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "read_only_link", r.text
    assert "review link" in r.json()["error"]["message"]
    assert httpx.delete(f"{server.url}/api/jobs/{jid}", timeout=10).status_code == 401
    assert httpx.get(f"{server.url}/api/jobs/{jid}", headers=AUTH, timeout=10).status_code == 200  # still there
    r = httpx.delete(f"{server.url}{links['review'].replace('/review?', '?')}", timeout=10)
    assert r.status_code == 200 and r.json() == {"id": jid, "deleted": True}, r.text

    # every route of the job now answers as for a purged job
    for path in ("", "/result?format=srt", "/review"):
        r = httpx.get(f"{server.url}/api/jobs/{jid}{path}", headers=AUTH, timeout=10)
        assert r.status_code == 410 and r.json()["error"]["code"] == "job_purged", (path, r.text)
    r = httpx.get(f"{server.url}/api/jobs/{jid}/audio", headers=AUTH, timeout=10)
    assert r.status_code == 410, r.text
    r = httpx.get(f"{server.url}/api/jobs/{jid}/events", headers=AUTH, timeout=10)  # a follower
    assert r.status_code == 410 and r.json()["error"]["code"] == "job_purged", r.text
    r = httpx.post(server.url + "/api/calls", json={"all": True}, headers=AUTH, timeout=10)
    assert jid not in [row["id"] for row in r.json()["rows"]]
    r = httpx.patch(f"{server.url}/api/jobs/{jid}/review", headers=AUTH, json={"reviewed": False}, timeout=10)
    assert r.status_code == 410, r.text
    # and in the store itself: nothing of it is left but the tombstone
    if server.redis is not None:
        import redis

        client = redis.Redis.from_url(server.redis.url)
        left = {k.decode() for k in client.scan_iter(f"*{jid}*")}
        assert left == {f"{server.runtime.broker.prefix}:tomb:{jid}"}, left
        assert client.zscore(f"{server.runtime.broker.prefix}:calls", jid) is None
    else:
        store = server.runtime.broker
        assert not store.spool_path(jid).exists()
        conn = store._conn()
        assert conn.execute("SELECT result, filename, state FROM jobs WHERE id=?", (jid,)).fetchone()[:] == \
            (None, "", "purged")
        assert conn.execute("SELECT COUNT(*) FROM calls WHERE job_id=?", (jid,)).fetchone()[0] == 0
    # deleting again: gone; an unknown id: not found
    assert httpx.delete(f"{server.url}/api/jobs/{jid}", headers=AUTH, timeout=10).status_code == 410
    r = httpx.delete(f"{server.url}/api/jobs/{uuid.uuid4()}", headers=AUTH, timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found"


def test_a_queued_job_is_neither_deleted_nor_kept(server):
    """A job stored and never queued stays queued: the routes refuse it with a clear 409."""
    job = Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(), 1.0,
              filename="waiting.wav")
    store = server.runtime.broker
    store.create(job, b"RIFF-not-really")
    try:
        for method, path in (("DELETE", ""), ("POST", "/keep")):
            r = httpx.request(method, f"{server.url}/api/jobs/{job.id}{path}", headers=AUTH, timeout=10)
            assert r.status_code == 409, r.text
            assert r.json()["error"]["code"] == "job_not_finished" and "queued" in r.json()["error"]["message"]
        assert store.get(job.id).state is JobState.QUEUED and store.load_upload(job.id) == b"RIFF-not-really"
    finally:
        store.discard(job.id)


def test_keep_moves_expires_at_up_to_the_cap(server, clip_factory):
    job = done_job(server, clip_factory("wav", 16000, 1))
    jid = job["id"]
    retention_end = job["finished_at"] + RETENTION_HOURS * 3600
    assert abs(job["expires_at"] - retention_end) <= 1, job
    r = httpx.post(server.url + "/api/calls", json={"all": True}, headers=AUTH, timeout=10)
    (row,) = [row for row in r.json()["rows"] if row["id"] == jid]
    assert abs(row["expires_at"] - retention_end) <= 1
    for hostile in ({"days": "10"}, {"days": -1}, {"days": 0}, {"days": True}, {"weeks": 1}, [1], "x"):
        r = httpx.post(f"{server.url}/api/jobs/{jid}/keep", headers=AUTH, json=hostile, timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_option", (hostile, r.text)
    r = httpx.post(f"{server.url}/api/jobs/{jid}/keep", headers=AUTH, json={"days": 1}, timeout=10)
    assert r.status_code == 200, r.text
    asked = time.time() + 86400
    assert abs(r.json()["expires_at"] - asked) < 60, r.json()
    # the review link keeps too; beyond the cap is the cap
    links = page_links(server, jid)
    r = httpx.post(f"{server.url}{links['review'].replace('/review?', '/keep?')}", json={"days": 1000},
                   timeout=10)
    assert r.status_code == 200, r.text
    capped = time.time() + KEEP_MAX_DAYS * 86400
    assert abs(r.json()["expires_at"] - capped) < 60, r.json()
    body = httpx.get(f"{server.url}/api/jobs/{jid}", headers=AUTH, timeout=10).json()
    assert body["expires_at"] == r.json()["expires_at"] and body["status"] == "done"
    listed = httpx.post(server.url + "/api/calls", json={"all": True}, headers=AUTH, timeout=10).json()["rows"]
    assert [row["expires_at"] for row in listed if row["id"] == jid] == [body["expires_at"]]  # the table too
    # a shorter keep afterwards never shortens it; an empty body is the longest keep
    r = httpx.post(f"{server.url}/api/jobs/{jid}/keep", headers=AUTH, json={"days": 1}, timeout=10)
    assert r.json()["expires_at"] == body["expires_at"]
    r = httpx.post(f"{server.url}/api/jobs/{jid}/keep", headers=AUTH, timeout=10)
    assert r.status_code == 200 and r.json()["expires_at"] >= body["expires_at"]
    # retention passes: the kept job stays (the embedded store's purge; Redis: its TTLs, see the contract)
    server.runtime.broker.purge(time.time() + RETENTION_HOURS * 3600 + 60)
    assert httpx.get(f"{server.url}/api/jobs/{jid}/audio", headers=AUTH, timeout=10).status_code == 200
