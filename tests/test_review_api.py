"""The reviewer's desk over real HTTP on loopback (the real app, the demo model, real audio): a
review written with PATCH, carried by the job's JSON (the poll path too), its exports (SRT, VTT,
TXT, JSON) and after a server restart; hostile values refused with a clear 400; the calls table
(listing what the caller holds, filters, sort, paging, CSV) and its access rules with a token."""

from __future__ import annotations

import csv
import io
import json
from urllib.parse import parse_qs, urlsplit

import httpx
import pytest

from pipeline.domain.review import MAX_NOTE_CHARS, MAX_TEXT_CHARS
from tests.conftest import LiveServer, make_settings
from tests.test_api import submit, wait_done

TOKEN = "desk-token"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("desk")


@pytest.fixture(scope="module")
def server(demo_dir, data_dir):
    srv = LiveServer(make_settings(demo_dir, data_dir)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def done_job(server, clip_factory):
    r = submit(server, clip_factory("wav", 16000, 1), name="=SUM(1+1)*cmd.wav", language="en")
    assert r.status_code == 202, r.text
    body = wait_done(server, r.json()["id"])
    assert body["status"] == "done" and body["result"]["segments"], body
    return body


def patch(server, job_id, body, **kw):
    return httpx.patch(f"{server.url}/api/jobs/{job_id}/review", json=body, timeout=30, **kw)


def export(server, job_id, fmt):
    r = httpx.get(f"{server.url}/api/jobs/{job_id}/result?format={fmt}", timeout=30)
    assert r.status_code == 200, r.text
    return r.text


def test_edit_flag_reviewed_appear_in_the_job_and_every_export(server, done_job):
    jid = done_job["id"]
    model = done_job["result"]["segments"][0]["text"]
    assert done_job["result"]["segments"][0]["corrected"] is False
    r = patch(server, jid, {"reviewed": True, "segments": [
        {"index": 0, "text": "Corrected words here", "flagged": True, "note": "check <b>this</b>"}]})
    assert r.status_code == 200, r.text
    assert r.json()["review"]["reviewed"] and r.json()["model_texts"][0] == model
    # the job's JSON (the in-memory poll path): both texts, the marks
    job = httpx.get(f"{server.url}/api/jobs/{jid}", timeout=10).json()
    seg = job["result"]["segments"][0]
    assert (seg["text"], seg["model_text"], seg["corrected"], seg["flagged"], seg["note"]) == \
        ("Corrected words here", model, True, True, "check <b>this</b>")
    assert job["review"]["reviewed"] is True and job["review"]["corrected"] == 1
    assert job["result"]["text"] == "Corrected words here" and job["result"]["model_text"] == done_job["result"]["text"]
    _check_exports(server, jid, model)


def _check_exports(server, jid, model):
    srt, vtt = export(server, jid, "srt"), export(server, jid, "vtt")
    txt, doc = export(server, jid, "txt"), json.loads(export(server, jid, "json"))
    for body in (srt, vtt, txt):
        assert "Corrected words here" in body and model not in body
    assert "[FLAGGED: check <b>this</b>]" in txt
    assert "NOTE reviewed" in vtt and "NOTE flagged" in vtt and "check &lt;b&gt;" not in vtt
    seg = doc["result"]["segments"][0]
    assert seg["text"] == "Corrected words here" and seg["model_text"] == model and seg["corrected"]
    assert doc["review"]["reviewed"] is True


@pytest.mark.parametrize("body,what", [
    ({"segments": [{"index": 99, "text": "x"}]}, "out of range"),
    ({"segments": [{"index": "0", "text": "x"}]}, "integer index"),
    ({"segments": [{"index": 0, "text": "x" * (MAX_TEXT_CHARS + 1)}]}, "characters long"),
    ({"segments": [{"index": 0, "note": "n" * (MAX_NOTE_CHARS + 1)}]}, "characters long"),
    ({"segments": [{"index": 0, "flagged": "yes"}]}, "true or false"),
    ({"segments": [{"index": 0, "path": "../../etc"}]}, "unknown segment field"),
    ({"reviewed": 1}, "true or false"),
    ([1, 2], "JSON object"),
    ({"segments": [{"index": 0}] * 501}, "at most 500"),
])
def test_hostile_review_values_are_refused(server, done_job, body, what):
    r = patch(server, done_job["id"], body)
    assert r.status_code == 400 and what in r.json()["error"]["message"], r.text


def test_review_of_unknown_or_unfinished_jobs(server):
    r = patch(server, "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d", {"reviewed": True})
    assert r.status_code == 404
    r = httpx.patch(f"{server.url}/api/jobs/x/review", content=b"{not json", timeout=10)
    assert r.status_code == 400 and "not valid JSON" in r.text
    r = httpx.patch(f"{server.url}/api/jobs/x/review", content=b"[" * 2_000_000, timeout=30)
    assert r.status_code == 400 and "larger than" in r.text


def test_calls_table_lists_filters_sorts_and_exports_csv(server, done_job, clip_factory):
    ids = [done_job["id"]]
    for fmt in ("mp3", "opus"):
        r = submit(server, clip_factory(fmt, 16000, 1), name=f"call-{fmt}.{fmt}", language="en")
        ids.append(r.json()["id"])
        wait_done(server, ids[-1])
    jobs = [{"id": i} for i in ids] + [{"id": "not-a-job"}]

    def calls(query=None, **kw):
        r = httpx.post(f"{server.url}/api/calls", json={"jobs": jobs, "query": query or {}, **kw},
                       timeout=30)
        assert r.status_code == 200, r.text
        return r

    page = calls().json()
    assert page["total"] == 3 and {row["id"] for row in page["rows"]} == set(ids)
    row = next(r for r in page["rows"] if r["id"] == ids[0])
    assert row["languages"] == ["en"] and row["emotion_shares"] == {"": {"NEUTRAL": 1.0}}
    assert row["links"]["audio"].endswith(f"/api/jobs/{ids[0]}/audio")
    by_name = calls({"sort": "name", "desc": False}).json()["rows"]
    assert [r["filename"] for r in by_name] == sorted(r["filename"] for r in by_name)
    paged = calls({"per_page": 2, "page": 2}).json()
    assert paged["total"] == 3 and len(paged["rows"]) == 1
    assert calls({"reviewed": True}).json()["total"] == 1  # the one reviewed above (any order)
    assert calls({"name": "opus"}).json()["rows"][0]["id"] == ids[2]
    assert calls({"emotions": [{"emotion": "NEUTRAL", "op": ">", "share": 0.5}]}).json()["total"] == 3
    assert calls({"events": [{"event": "Cry"}]}).json()["total"] == 0
    text = calls(format="csv").content.decode("utf-8-sig")
    table = list(csv.reader(io.StringIO(text)))
    assert table[0][:3] == ["id", "name", "state"] and len(table) == 4
    hostile = next(r for r in table if r[0] == ids[0])
    assert hostile[1].startswith("'=SUM")  # never a formula in a spreadsheet
    for bad in ({"sort": "__class__"}, {"per_page": 10_000}, {"emotions": [{"emotion": "RAGE"}]},
                {"languages": ["klingon"]}, {"q": "x" * 500}, {"page": 0}):
        r = httpx.post(f"{server.url}/api/calls", json={"jobs": jobs, "query": bad}, timeout=10)
        assert r.status_code == 400, (bad, r.text)


def test_calls_with_a_token_list_only_signed_jobs(demo_dir, tmp_path, clip_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path / "d", api_token=TOKEN,
                                   auth_failures_per_client=0)).start()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    try:
        with open(clip_factory("wav", 16000, 1), "rb") as f:
            r = httpx.post(srv.url + "/api/jobs?wait=30", files={"file": ("a.wav", f)},
                           headers=auth, timeout=60)
        job = r.json()
        assert job["status"] == "done"
        r = httpx.post(srv.url + "/api/calls", json={"all": True}, headers=auth, timeout=10)
        assert r.json()["total"] == 1
        signed = r.json()["rows"][0]["links"]["audio"]
        q = parse_qs(urlsplit(signed).query)
        entry = {"id": job["id"], "exp": q["exp"][0], "sig": q["sig"][0]}
        # a browser: its signed links, no token
        r = httpx.post(srv.url + "/api/calls", json={"jobs": [entry]}, timeout=10)
        assert r.json()["total"] == 1
        r = httpx.post(srv.url + "/api/calls", json={"jobs": [{"id": job["id"]}]}, timeout=10)
        assert r.json()["total"] == 0  # an id alone is not enough with a token
        forged = {**entry, "sig": "A" * 43}
        assert httpx.post(srv.url + "/api/calls", json={"jobs": [forged]}, timeout=10).json()["total"] == 0
        assert httpx.post(srv.url + "/api/calls", json={"all": True}, timeout=10).status_code == 401
        link = f"?exp={entry['exp']}&sig={entry['sig']}"
        # the download link reads the review but never edits it (issue 36): 403 with a clear error
        r = httpx.patch(f"{srv.url}/api/jobs/{job['id']}/review{link}", json={"reviewed": True},
                        timeout=10)
        assert r.status_code == 403 and r.json()["error"]["code"] == "read_only_link", r.text
        assert "review link" in r.json()["error"]["message"]
        # the browser's listing (no token) hands out no review link; the page's view does
        assert "review" not in httpx.post(srv.url + "/api/calls", json={"jobs": [entry]},
                                          timeout=10).json()["rows"][0]["links"]
        view = srv.app.state.pages.live_view(srv.runtime.view.get(job["id"]))
        review_link = view["links"]["review"]
        assert review_link.startswith(f"/api/jobs/{job['id']}/review?exp=") and entry["sig"] not in review_link
        r = httpx.patch(srv.url + review_link, json={"reviewed": True}, timeout=10)
        assert r.status_code == 200 and r.json()["review"]["reviewed"]
        # a review link opens the review only: not the audio, the result nor the page's stream
        rq = review_link.split("?", 1)[1]
        for path in ("audio", "result", "events"):
            r = httpx.get(f"{srv.url}/api/jobs/{job['id']}/{path}?{rq}", timeout=10)
            assert r.status_code == 403 and r.json()["error"]["code"] == "read_only_link", (path, r.text)
        # nor does the download link open the page's stream, which carries links.review (issue 36)
        r = httpx.get(f"{srv.url}/api/jobs/{job['id']}/events{link}", timeout=10)
        assert r.status_code == 403 and r.json()["error"]["code"] == "read_only_link", r.text
        assert "review" not in r.text
        r = httpx.patch(f"{srv.url}/api/jobs/{job['id']}/review", json={"reviewed": False}, timeout=10)
        assert r.status_code == 401
        assert httpx.get(f"{srv.url}/api/jobs/{job['id']}/review{link}", timeout=10).json()["review"]["reviewed"]
        assert httpx.get(srv.url + review_link, timeout=10).json()["review"]["reviewed"]
    finally:
        srv.stop()


def test_review_survives_a_restart(server, done_job, demo_dir, data_dir):  # last: stops the server
    jid = done_job["id"]
    model = done_job["result"]["segments"][0]["text"]
    server.stop()
    again = LiveServer(make_settings(demo_dir, data_dir)).start()
    try:
        job = httpx.get(f"{again.url}/api/jobs/{jid}", timeout=10).json()
        assert job["result"]["segments"][0]["text"] == "Corrected words here"
        assert job["review"]["flagged"] == 1 and job["review"]["reviewed"] is True
        _check_exports(again, jid, model)
    finally:
        again.stop()
