"""Server push of a job (GET /api/jobs/{id}/events, pipeline/web/routes/events.py) and the change
notices behind it (pipeline/serving/job_events.py): the page learns a state the moment the service
stores it, with no poll interval between the worker and the screen."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from dataclasses import replace

import httpx
import pytest

from pipeline.domain.types import Job, JobError, JobState, Lane, TranscribeOptions
from pipeline.serving.job_events import JobChanges
from pipeline.web.links import link_key, verify
from pipeline.web.routes.events import KEEPALIVE_S
from pipeline.web.views import page_query, stage_of
from tests.conftest import LiveServer, make_settings
from tests.test_api import submit


def job(state=JobState.QUEUED, progress=None, **kw) -> Job:
    base = Job(id="j1", state=state, options=TranscribeOptions(), lane=Lane.INTERACTIVE,
               created_at=time.time(), audio_seconds=5.0, meta={"progress": progress} if progress else {})
    return replace(base, **kw)


# ---------------------------------------------------------------------------- the stages


@pytest.mark.parametrize("state,progress,model,expected,position", [
    (JobState.QUEUED, None, "ready", {"stage": "queued"}, None),
    (JobState.QUEUED, None, "loading", {"stage": "loading"}, None),
    (JobState.QUEUED, None, "starting", {"stage": "loading"}, None),
    (JobState.QUEUED, "segmenting", "ready", {"stage": "segmenting", "percent": 0}, None),
    (JobState.QUEUED, "segmenting 26%", "ready", {"stage": "segmenting", "percent": 26}, None),
    (JobState.QUEUED, "segment 0 of 17", "ready", {"stage": "transcribing", "pieces": 17,
                                                    "pieces_done": 0}, None),
    (JobState.QUEUED, "segment 0 of 17", "ready", {"stage": "queued", "pieces": 17}, 3),
    (JobState.QUEUED, "segment 0 of 17", "loading", {"stage": "loading", "pieces": 17}, 3),
    (JobState.RUNNING, "segment 3 of 17", "ready", {"stage": "transcribing", "pieces_done": 3,
                                                     "pieces": 17}, None),
    (JobState.RUNNING, None, "ready", {"stage": "transcribing", "pieces": None}, None),
    (JobState.DONE, None, "ready", {"stage": "done", "percent": None}, None),
    (JobState.FAILED, None, "ready", {"stage": "failed"}, None),
])  # fmt: skip
def test_stage_of_says_what_the_service_knows(state, progress, model, expected, position):
    got = stage_of(job(state, progress, position=position), model)
    assert {k: got[k] for k in expected} == expected


def test_page_query_is_signed_stable_and_empty_without_a_token():
    queued = job()
    assert page_query(queued, "", 24.0) == ""
    q1 = page_query(queued, "tok", 24.0)
    time.sleep(1.01)  # a second boundary passes: a value built from "now" would change
    assert page_query(queued, "tok", 24.0) == q1  # no "now" in it: the view does not churn
    exp, sig = (part.split("=", 1)[1] for part in q1.split("&"))
    assert verify(link_key("tok", "page"), "j1", exp, sig)
    assert not verify(link_key("tok", "page"), "j2", exp, sig)
    assert not verify(link_key("tok"), "j1", exp, sig)  # a page link is not a download link
    end = time.time()
    done = page_query(job(JobState.DONE, finished_at=end), "tok", 24.0)
    assert done.startswith(f"exp={int(end) + 1 + 24 * 3600}&") or done.startswith(
        f"exp={int(end) + 24 * 3600}&")


# ---------------------------------------------------------------------------- the notices


def test_a_watch_wakes_at_once_when_another_thread_notifies():
    changes = JobChanges()

    async def main():
        with changes.watch("a") as w:
            assert changes.watching() == 1
            t0 = time.perf_counter()
            threading.Timer(0.05, changes.notify, args=("a",)).start()
            assert await w.wait(5.0) is True
            woke = time.perf_counter() - t0
            w.clear()
            assert await w.wait(0.05) is False  # nothing new
            changes.notify("other-job")
            assert await w.wait(0.05) is False
            changes.notify_all()
            assert await w.wait(0.05) is True
        assert changes.watching() == 0
        return woke

    woke = asyncio.run(main())
    assert 0.04 < woke < 0.5, woke


def test_a_notice_between_read_and_wait_is_not_lost():
    changes = JobChanges()

    async def main():
        with changes.watch("a") as w:
            w.clear()
            changes.notify("a")  # as if the worker finished while the watcher read the job
            await asyncio.sleep(0)
            return await w.wait(1.0)

    assert asyncio.run(main()) is True


# ---------------------------------------------------------------------------- the route


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("events"))).start()
    yield srv
    srv.stop()


def read_events(server, job_id: str, timeout: float = 60.0, **kw) -> list[tuple[str, dict, float]]:
    """(event, data, arrival time.time()) of every event until the stream ends."""
    out = []
    name = None
    with httpx.stream("GET", f"{server.url}/api/jobs/{job_id}/events", timeout=timeout, **kw) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        assert r.headers["cache-control"] == "no-store"
        for line in r.iter_lines():
            if line.startswith("event: "):
                name = line[7:]
            elif line.startswith("data: "):
                out.append((name, json.loads(line[6:]), time.time()))
    return out


def test_events_push_each_state_and_the_result_as_it_is_stored(server, clip_factory):
    r = submit(server, clip_factory("wav", 16000, 1))
    assert r.status_code == 202
    events = read_events(server, r.json()["id"])
    names = [e for e, _, _ in events]
    assert names and set(names) == {"job"}
    stages = [d["stage"] for _, d, _ in events]
    assert stages[-1] == "done" and "done" not in stages[:-1]
    last = events[-1][1]
    assert last["result"]["text"] and last["status"] == "done"
    assert last["links"]["audio"].endswith("/audio") and last["links"]["result"].endswith("/result")
    assert last["model"] == "ready"
    # pushed when stored: not after a poll period (the stream's only timer is a 15 s keep-alive)
    lag = events[-1][2] - last["finished_at"]
    assert lag < min(1.0, KEEPALIVE_S / 10), lag


def test_events_of_a_finished_job_answer_once_and_end(server, clip_factory):
    r = submit(server, clip_factory("wav", 16000, 1))
    job_id = r.json()["id"]
    server.runtime.view.wait(job_id, timeout=60)
    t0 = time.monotonic()
    events = read_events(server, job_id)
    assert len(events) == 1 and events[0][1]["stage"] == "done"
    assert time.monotonic() - t0 < 2.0


def test_events_of_a_long_recording_say_segmenting_then_pieces(server, long_call):
    with open(long_call, "rb") as f:
        r = httpx.post(server.url + "/api/jobs", files={"file": ("call.wav", f)},
                       data={"split_channels": "true"}, timeout=60)
    assert r.status_code == 202
    events = read_events(server, r.json()["id"])
    stages = [d["stage"] for _, d, _ in events]
    seen = [s for k, s in enumerate(stages) if k == 0 or s != stages[k - 1]]
    # in this order, each at most once (pieces wait in the queue only behind other work)
    assert re.fullmatch(r"(loading )?(queued )?segmenting (queued )?(transcribing )?done",
                        " ".join(seen)), stages
    percents = [d["percent"] for _, d, _ in events if d["stage"] == "segmenting"]
    assert percents == sorted(percents)
    pieces = [d for _, d, _ in events if d["pieces"]]
    done = [d["pieces_done"] for d in pieces]
    assert done == sorted(done)  # pieces only advance
    speakers = {s["speaker"] for s in events[-1][1]["result"]["segments"]}
    assert speakers == {"left", "right"}


def test_events_of_an_unknown_job_are_a_json_404(server):
    r = httpx.get(f"{server.url}/api/jobs/no-such-job/events", timeout=10)
    assert r.status_code == 404
    assert r.json()["error"]["code"] == "job_not_found"


def test_a_failed_job_streams_its_error(server):
    from pipeline.domain.types import Job as J

    jid = "f" * 8 + "-0000-4000-8000-" + "0" * 12
    failed = J(id=jid, state=JobState.FAILED, options=TranscribeOptions(), lane=Lane.BULK,
               created_at=time.time(), audio_seconds=1.0, finished_at=time.time(),
               error=JobError("segmentation_failed", "splitting the recording failed: boom"))
    server.runtime.view.remember(failed)  # (a snapshot, as the service keeps one per job)
    events = read_events(server, jid)
    assert [d["stage"] for _, d, _ in events] == ["failed"]
    assert events[0][1]["error"]["code"] == "segmentation_failed"
    assert events[0][1]["result"] is None


def test_favicon(server):
    r = httpx.get(server.url + "/favicon.ico", timeout=10)
    assert r.status_code == 200
    assert r.headers["content-type"] == "image/x-icon"
    assert r.content[:4] == b"\x00\x00\x01\x00"  # an ICO file

