"""The calls index and reviews, against both job stores (real SQLite, a real redis-server): a
summary written at finish, a review kept with the job (read back by get, after a reopen of the
store), deleted with it (purge / the record's TTL), and the listing that the calls table pages."""

from __future__ import annotations

import time
import uuid

import pytest
import redis

from pipeline.domain.calls import CallsQuery, run_query
from pipeline.domain.errors import InvalidOption, JobGone, ResultNotReady
from pipeline.domain.review import ReviewPatch, apply_patch
from pipeline.domain.types import Job, JobState, Lane, Segment, TranscribeOptions, Transcript
from pipeline.serving.broker_redis import RedisBroker
from pipeline.serving.broker_sqlite import JobStore
from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures)


def call_transcript() -> Transcript:
    """A stereo call: the agent calm, the customer angry 3 s of 4, a baby crying once."""
    segs = (
        Segment("en", "NEUTRAL", ("Speech",), "withitn", "Hello, how can I help?", 0.0, 2.0, "left"),
        Segment("en", "ANGRY", ("Speech",), "withitn", "My order never came.", 2.0, 5.0, "right"),
        Segment("yue", "NEUTRAL", ("Cry",), "withitn", "唔該", 5.0, 6.0, "right"),
    )
    return Transcript(" ".join(s.text for s in segs), "<|en|>...", segs)


def new_job(name="call.wav", seconds=6.0) -> Job:
    return Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(),
               seconds, filename=name)


def finish(store, job: Job, t: Transcript | None = None) -> None:
    store.mark_running([job.id])
    assert store.finish(job.id, t or call_transcript())


@pytest.fixture(params=["sqlite", "redis"])
def store(request, tmp_path):
    if request.param == "sqlite":
        s = JobStore(tmp_path / "data")
        yield s
        s.close()
    else:
        url = request.getfixturevalue("redis_url")
        s = RedisBroker(url, retention_s=60, queue_size=100)
        yield s
        s.close()


def reopen(store, tmp_path):
    if isinstance(store, JobStore):
        return JobStore(tmp_path / "data")
    return RedisBroker(store.url, retention_s=60, queue_size=100)


def review(store, job_id, body):
    patch = ReviewPatch.from_json(body)
    return store.calls().update_review(job_id, lambda old, job: apply_patch(old, patch, job.result))


def test_summary_at_finish_and_listing(store):
    a, b, c = new_job("a.wav"), new_job("b.wav"), new_job("c.wav")
    for j in (a, b, c):
        store.create(j, b"x")
    finish(store, a)
    calm = Transcript("fine", "", (Segment("en", "HAPPY", ("Laughter",), "", "fine", 0, 3, None),))
    finish(store, b, calm)
    if not isinstance(store, JobStore):  # written by the finish itself (a listing would backfill)
        r = redis.Redis.from_url(store.url)
        for j in (a, b):
            assert r.hget(f"sv:job:{j.id}", "summary") and r.get(f"sv:search:{j.id}")
            assert 0 < r.pexpiretime(f"sv:search:{j.id}") <= r.pexpiretime(f"sv:job:{j.id}")
        assert r.hget(f"sv:job:{c.id}", "summary") is None
    rows = {r.id: r for r in store.calls().rows([a.id, b.id, c.id])}
    assert set(rows) == {a.id, b.id, c.id}
    sa = rows[a.id].summary
    assert sa.speakers == ("left", "right") and sa.languages == ("en", "yue")
    assert sa.share("right", "ANGRY") == pytest.approx(0.75) and sa.share("left", "ANGRY") == 0
    assert sa.events == {"Cry": 1}
    assert rows[c.id].state == "queued" and rows[c.id].summary is None
    angry = CallsQuery.from_json({"emotions": [{"speaker": "right", "emotion": "ANGRY", "op": ">",
                                                "share": 0.2}]})
    assert [r.id for r in run_query(list(rows.values()), angry).rows] == [a.id]
    crying = CallsQuery.from_json({"events": [{"event": "Cry"}]})
    assert [r.id for r in run_query(list(rows.values()), crying).rows] == [a.id]
    laugh = CallsQuery.from_json({"events": [{"event": "Laughter"}], "languages": ["en"]})
    assert [r.id for r in run_query(list(rows.values()), laugh).rows] == [b.id]


def test_review_kept_with_the_job_and_survives_a_reopen(store, tmp_path):
    job = new_job()
    store.create(job, b"x")
    finish(store, job)
    got, rev = review(store, job.id, {"reviewed": True, "segments": [
        {"index": 1, "text": "My order never arrived."},
        {"index": 2, "flagged": True, "note": "<script>alert(1)</script> baby?"}]})
    assert rev.reviewed and rev.corrected == 1 and rev.flagged == 1
    again = reopen(store, tmp_path)
    job2 = again.get(job.id)
    r = job2.meta["review"]
    assert r.reviewed and r.segments[1].text == "My order never arrived."
    assert r.segments[2].note == "<script>alert(1)</script> baby?"  # escaped where it is shown
    assert job2.result.segments[1].text == "My order never came."  # the model's, unchanged
    rows = again.calls().rows([job.id], search="arrived")
    assert rows[0].review.flagged == 1 and rows[0].search  # the correction is searched
    assert again.calls().rows([job.id], search="baby")[0].search  # and the note
    assert again.calls().rows([job.id], search="never came")[0].search  # the model's text too
    assert again.calls().rows([job.id], search="refund")[0].search == ""
    flagged = CallsQuery.from_json({"flagged": True, "reviewed": True, "q": "ARRIVED"})
    assert len(run_query(rows, flagged).rows) == 1
    # back to the model's text, unflagged: nothing left but the reviewed mark
    _, rev = review(again, job.id, {"segments": [{"index": 1, "text": None},
                                                 {"index": 2, "flagged": False}]})
    assert rev.corrected == 0 and rev.flagged == 0 and rev.reviewed


def test_review_checks_the_job_and_the_index(store):
    queued = new_job()
    store.create(queued, b"x")
    with pytest.raises(ResultNotReady):
        review(store, queued.id, {"reviewed": True})
    done = new_job()
    store.create(done, b"x")
    finish(store, done)
    for bad in ({"segments": [{"index": 3, "text": "x"}]}, {"segments": [{"index": -1, "flagged": True}]}):
        with pytest.raises(InvalidOption):
            review(store, done.id, bad)
    assert "review" not in store.get(done.id).meta  # nothing half-written


def test_review_is_deleted_with_the_job(store, tmp_path):
    job = new_job()
    store.create(job, b"x")
    finish(store, job)
    review(store, job.id, {"segments": [{"index": 0, "text": "Hi, how can I help?"}]})
    if isinstance(store, JobStore):
        assert store.purge(time.time() + 1) == [job.id]
        for table in ("calls", "calls_search"):
            assert store._conn().execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0] == 0
    else:  # the review lives in the record: it has the record's TTL, the search text too
        r = redis.Redis.from_url(store.url)
        ttl = r.pttl(f"sv:job:{job.id}")
        assert 0 < ttl <= 60_000 and 0 < r.pttl(f"sv:search:{job.id}") <= ttl
        r.delete(f"sv:job:{job.id}")  # what the TTL does
    with pytest.raises(JobGone):
        store.get(job.id)
    assert store.calls().rows([job.id]) == []


def test_listing_summarises_jobs_finished_without_a_summary(store):
    job = new_job()
    store.create(job, b"x")
    finish(store, job)
    if isinstance(store, JobStore):  # a job finished before the index existed
        store._conn().execute("DELETE FROM calls")
        store._conn().execute("DELETE FROM calls_search")
    else:
        redis.Redis.from_url(store.url).hdel(f"sv:job:{job.id}", "summary")
    rows = store.calls().rows(None, search="never came")
    assert [r.id for r in rows] == [job.id] and rows[0].summary.events == {"Cry": 1}
    assert rows[0].search


def test_the_desks_quick_filters_and_tag_columns_are_queries_the_server_takes():
    """static/desk.js sends these as they are: each must parse, and each column must sort."""
    from pipeline.domain.calls import QUICK_FILTERS, TAG_COLUMNS, desk_table

    for _key, fragment in QUICK_FILTERS:
        q = CallsQuery.from_json(fragment)
        assert q != CallsQuery(), fragment  # it filters something
    for sort in TAG_COLUMNS.values():
        assert CallsQuery.from_json({"sort": sort}).sort == sort
    assert desk_table()["quick"][0][0] == QUICK_FILTERS[0][0]
