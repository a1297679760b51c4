"""RedisBroker against a real redis-server (tests/redis_server.py): records, TTLs, lanes, the
cluster-wide queue bound, reclaim after a worker dies, finish-once, long-job pieces, the existing
Worker running on the broker, and a Redis crash (kill -9) and restart."""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
import threading
import time
import uuid

import pytest
import redis
import torch

from pipeline.serving.broker_redis import Feeder, RedisBroker, redact_url
from pipeline.model.engine import EngineOutput, as_float_wave
from pipeline.domain.errors import AudioGone, BrokerUnavailable, JobGone, JobNotFound, QueueFull
from pipeline.serving.records import SegmentResult
from pipeline.serving.scheduler import Scheduler, WorkItem
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions, Transcript, Word
from pipeline.serving.worker import Worker
from tests.engines import EngineDouble
from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures)

OPTS = TranscribeOptions(language="en", use_itn=False)


def new_job(lane: Lane = Lane.BULK, seconds: float = 1.0, options: TranscribeOptions = OPTS) -> Job:
    return Job(str(uuid.uuid4()), JobState.QUEUED, options, lane, time.time(), seconds,
               filename="call.wav")


def pcm_like(n: int) -> torch.Tensor:
    """Audio as decoding gives it from a 16-bit source: k / 32768 (what the broker's 16-bit PCM
    carries exactly)."""
    return torch.randint(-32768, 32768, (n,), dtype=torch.int32).float() / 32768


def item_for(job: Job, n: int = 1600, **kw) -> WorkItem:
    audio = kw.pop("audio", None)
    if audio is None:
        audio = pcm_like(n)
    return WorkItem(job.id, job.lane, job.options, int(audio.shape[0]), audio=audio, **kw)


def submit(broker: RedisBroker, lane: Lane = Lane.BULK, n: int = 1600, force: bool = False):
    job = new_job(lane, n / 16000)
    broker.create(job, b"upload-" + job.id.encode())
    item = item_for(job, n)
    broker.enqueue(item, force=force)
    return job, item


@pytest.fixture
def broker(redis_url):  # noqa: F811
    b = RedisBroker(redis_url, retention_s=60, queue_size=100, visibility_timeout_s=0.3)
    yield b
    b.close()


def admin(url: str) -> redis.Redis:
    return redis.Redis.from_url(url)


# ---------------------------------------------------------------------------- records
def test_create_get_not_found_and_gone_after_retention(redis_url):  # noqa: F811
    b = RedisBroker(redis_url, retention_s=0.4, queue_size=10)
    job, _ = submit(b)
    got = b.get(job.id)
    assert (got.id, got.state, got.options, got.lane, got.filename, got.attempts) == \
        (job.id, JobState.QUEUED, OPTS, Lane.BULK, "call.wav", 0)
    assert got.created_at == job.created_at and got.audio_seconds == job.audio_seconds
    assert got.position == 1 and got.meta == {"progress": None}
    assert b.load_upload(job.id) == b"upload-" + job.id.encode()
    with pytest.raises(JobNotFound):
        b.get(str(uuid.uuid4()))
    # the poll path: the same record without the queue position (a scan inside Redis per poll)
    assert asyncio.run(b.aget(job.id)) == replace(got, position=None)

    (item,) = b.claim("w1", 10, 0)
    assert b.mark_running([job.id]) == {job.id}
    assert b.finish(job.id, Transcript("hi", "<|en|>hi")) is True
    done = b.get(job.id)
    assert done.state is JobState.DONE and done.result.text == "hi" and done.meta == {}
    ttl = admin(redis_url).pttl(f"sv:job:{job.id}")
    assert 0 < ttl <= 400  # retention from the finish
    time.sleep(0.6)
    with pytest.raises(JobGone):
        b.get(job.id)
    with pytest.raises(JobGone):
        asyncio.run(b.aget(job.id))
    with pytest.raises(AudioGone):
        b.load_upload(job.id)
    with pytest.raises(JobNotFound):
        asyncio.run(b.aget(str(uuid.uuid4())))
    assert b.purge(time.time()) == [] and b.recover() == []


def test_unfinished_record_lives_retention_plus_margin(redis_url):  # noqa: F811
    b = RedisBroker(redis_url, retention_s=0.2, queue_size=10, pending_margin_s=0.2)
    job, _ = submit(b)
    ttls = [admin(redis_url).pttl(f"sv:{k}:{job.id}") for k in ("job", "upload", "audio", "entries")]
    assert all(300 < t <= 400 for t in ttls), ttls
    assert admin(redis_url).pttl(f"sv:tomb:{job.id}") > 29 * 86400 * 1000
    time.sleep(0.5)
    with pytest.raises(JobGone):
        b.get(job.id)


def test_discard_forgets_a_job_that_was_never_accepted(broker, redis_url):  # noqa: F811
    job, _ = submit(broker)
    broker.discard(job.id)
    with pytest.raises(JobNotFound):
        broker.get(job.id)
    assert broker.queue_depth() == {Lane.INTERACTIVE: 0, Lane.BULK: 0}
    assert broker.counts()["queued"] == 0
    assert not admin(redis_url).keys(f"sv:*:{job.id}")


# ---------------------------------------------------------------------------- queue
def test_enqueue_claim_finish_round_trip(broker, redis_url):  # noqa: F811
    job = new_job(Lane.INTERACTIVE, options=TranscribeOptions(language="zh", word_timestamps=True))
    broker.create(job, b"raw")
    audio = pcm_like(12345)
    broker.enqueue(item_for(job, audio=audio, speaker="left", start_s=1.5))
    assert broker.queue_depth() == {Lane.INTERACTIVE: 1, Lane.BULK: 0} and len(broker) == 1
    time.sleep(0.2)
    (item,) = broker.claim("w1", 8, 0)
    assert 0.15 < time.monotonic() - item.enqueued_at < 5  # its age in the queue (Redis's clock)
    # 16-bit samples, exactly the decoded wave once scaled (the engine scales them on the device)
    assert item.audio.dtype == torch.int16 and torch.equal(as_float_wave(item.audio), audio)
    assert (item.job_id, item.lane, item.options, item.n_samples, item.speaker, item.start_s,
            item.piece, item.pieces) == (job.id, Lane.INTERACTIVE, job.options, 12345, "left", 1.5,
                                         0, 1)
    assert broker.get(job.id).position is None  # claimed: no longer waiting undelivered
    assert broker.claim("w2", 8, 0) == []
    assert broker.mark_running([job.id]) == {job.id}
    assert broker.mark_running([job.id]) == set()  # already running
    running = broker.get(job.id)
    assert running.state is JobState.RUNNING and running.attempts == 1 and running.started_at
    assert broker.counts() == {"queued": 0, "running": 1, "done": 0, "failed": 0, "purged": 0}
    t = Transcript.from_dict({"text": "ni hao", "raw_text": "<|zh|>ni hao", "segments": [
        {"language": "zh", "emotion": "NEUTRAL", "events": ["Speech"], "itn": "woitn",
         "text": "ni hao", "start": 0.0, "end": 0.8, "words": [{"text": "ni", "start": 0.1,
                                                                "end": 0.2}]}]})
    assert broker.finish_many([(job.id, t)]) == {job.id}
    assert broker.get(job.id).result == t
    assert broker.fail(job.id, "x", "y") is False  # finished: never failed afterwards
    assert broker.queue_depth() == {Lane.INTERACTIVE: 0, Lane.BULK: 0}
    r = admin(redis_url)
    assert not r.exists(f"sv:audio:{job.id}", f"sv:entries:{job.id}")
    assert r.xpending("sv:queue:interactive", "workers")["pending"] == 0
    assert broker.counts()["done"] == 1 and broker.counts()["running"] == 0


def test_claim_blocks_until_an_item_arrives(broker):
    got = []
    t = threading.Thread(target=lambda: got.extend(broker.claim("w1", 4, 2000)))
    t.start()
    time.sleep(0.2)
    job, _ = submit(broker)
    t.join(5)
    assert [i.job_id for i in got] == [job.id]
    t0 = time.monotonic()
    assert broker.claim("w1", 4, 150) == []
    assert 0.1 < time.monotonic() - t0 < 1.5


def test_interactive_lane_is_served_first(broker):
    bulk = [submit(broker, Lane.BULK)[0] for _ in range(3)]
    ui = [submit(broker, Lane.INTERACTIVE)[0] for _ in range(2)]
    assert [broker.get(j.id).position for j in ui + bulk] == [1, 2, 3, 4, 5]
    first = broker.claim("w1", 2, 0)
    assert [i.job_id for i in first] == [j.id for j in ui]
    assert broker.get(bulk[0].id).position == 1
    second = broker.claim("w1", 10, 0)
    assert [i.job_id for i in second] == [j.id for j in bulk]
    late_ui, _ = submit(broker, Lane.INTERACTIVE)
    late_bulk, _ = submit(broker, Lane.BULK)
    mixed = broker.claim("w2", 10, 0)  # one call fills spare seats from the next lane
    assert [i.job_id for i in mixed] == [late_ui.id, late_bulk.id]


def test_queue_size_bounds_the_cluster_queue(redis_url):  # noqa: F811
    b = RedisBroker(redis_url, retention_s=60, queue_size=3, retry_after_s=7)
    other = RedisBroker(redis_url, retention_s=60, queue_size=3)  # another api process
    jobs = [submit(b, Lane.BULK)[0], submit(other, Lane.INTERACTIVE)[0], submit(b)[0]]
    with pytest.raises(QueueFull) as e:
        submit(other)
    assert e.value.retry_after == 2 and e.value.code == "queue_full"
    with pytest.raises(QueueFull) as e:
        b.check_capacity()
    assert e.value.retry_after == 7 and "3 jobs waiting" in e.value.message
    submit(b, force=True)  # the later pieces of an accepted long job are never refused
    assert len(b) == 4
    (item,) = b.claim("w1", 1, 0)  # in flight still counts
    with pytest.raises(QueueFull):
        b.check_capacity()
    b.mark_running([item.job_id])
    b.finish(item.job_id, Transcript("", ""))
    b.fail(jobs[2].id, "cancelled", "cancelled by a test")
    assert len(b) == 2
    b.check_capacity()
    submit(other)


def test_audio_travels_as_16_bit_pcm(broker, redis_url):  # noqa: F811
    """Half the bytes of float32 through Redis's one thread; exact for 16-bit sources (above),
    within half a step for any other audio, clipped to [-1, 1]."""
    job = new_job()
    broker.create(job, b"raw")
    audio = torch.rand(16000) * 2.4 - 1.2  # beyond full scale on both sides
    broker.enqueue(item_for(job, audio=audio))
    stored = admin(redis_url).hget(f"sv:audio:{job.id}", "0")
    assert stored[:1] == b"S" and len(stored) == 1 + 2 * 16000
    (item,) = broker.claim("w1", 8, 0)
    clipped = audio.clamp(-1.0, 32767 / 32768)
    assert torch.max(torch.abs(as_float_wave(item.audio) - clipped)) <= 0.5 / 32768 + 1e-9


def test_enqueue_for_unknown_or_finished_job(broker):
    with pytest.raises(JobNotFound):
        broker.enqueue(item_for(new_job()))
    job, _ = submit(broker)
    broker.fail(job.id, "segmentation_failed", "no")
    broker.enqueue(item_for(job, piece=1, pieces=2), force=True)  # a late piece: dropped
    assert len(broker) == 0


# ---------------------------------------------------------------------------- dead workers
def test_unacked_item_is_reclaimed_and_finished_once(broker, redis_url):  # noqa: F811
    proc_b = RedisBroker(redis_url, retention_s=60, queue_size=100, visibility_timeout_s=0.3)
    job, sent = submit(broker)
    (a,) = broker.claim("worker-a", 4, 0)  # worker process a: claims, starts, goes silent
    assert broker.mark_running([job.id]) == {job.id}
    assert proc_b.reclaim("worker-b") == []  # not idle long enough
    time.sleep(0.4)
    (b,) = proc_b.reclaim("worker-b")
    assert b.job_id == job.id and torch.equal(as_float_wave(b.audio), sent.audio)
    assert time.monotonic() - b.enqueued_at < 0.2  # a fresh queue clock: no false queue_timeout
    assert proc_b.reclaim("worker-c") == []  # taken by b
    assert proc_b.mark_running([job.id]) == {job.id}  # running already: b runs it as attempt 2
    assert broker.get(job.id).attempts == 2
    # a was only slow: both finish; the first write wins, the second writes nothing
    assert broker.finish_many([(job.id, Transcript("first", "first"))]) == {job.id}
    assert proc_b.finish_many([(job.id, Transcript("second", "second"))]) == set()
    assert proc_b.fail(job.id, "x", "y") is False
    assert broker.get(job.id).result.text == "first" and broker.counts()["done"] == 1
    assert len(broker) == 0 and broker._held == {} and proc_b._held == {}
    assert admin(redis_url).xpending("sv:queue:bulk", "workers")["pending"] == 0
    time.sleep(0.4)
    assert proc_b.reclaim("worker-c") == []


def test_reclaim_by_same_broker_object_runs_again(broker):
    job, _ = submit(broker)
    broker.claim("a", 1, 0)
    broker.mark_running([job.id])
    time.sleep(0.4)
    (item,) = broker.reclaim("b")
    assert broker.mark_running([job.id]) == {job.id}  # running already, reclaimed: a new attempt
    assert broker.get(job.id).attempts == 2
    assert broker.finish(job.id, Transcript("x", "x"))


def test_heartbeat_keeps_a_busy_worker_s_claims(broker, redis_url):  # noqa: F811
    busy = RedisBroker(redis_url, retention_s=60, queue_size=100, visibility_timeout_s=0.5)
    other = RedisBroker(redis_url, retention_s=60, queue_size=100, visibility_timeout_s=0.5)
    job, _ = submit(broker)
    busy.claim("busy", 1, 0)
    for _ in range(8):
        time.sleep(0.1)
        assert busy.heartbeat("busy") == 1
        assert other.reclaim("other") == []
    time.sleep(0.6)  # the worker stops beating (it hangs, or died)
    (item,) = other.reclaim("other")
    assert item.job_id == job.id
    assert busy.heartbeat("busy") == 0  # never takes back what another reclaimed
    assert busy._held == {}
    r = admin(redis_url)
    assert [p["consumer"] for p in r.xpending_range("sv:queue:bulk", "workers", "-", "+", 10)] \
        == [b"other"]


def test_released_and_overheld_items_are_reclaimed(redis_url):  # noqa: F811
    a = RedisBroker(redis_url, retention_s=60, queue_size=100, visibility_timeout_s=0.4,
                    max_hold_s=1.2)
    b = RedisBroker(redis_url, retention_s=60, queue_size=100, visibility_timeout_s=0.4)
    dropped, _ = submit(a)
    lost, _ = submit(a)
    t0 = time.monotonic()
    a.claim("a", 2, 0)
    a.release([dropped.id])  # e.g. the worker's batch was cut short by an outage
    for _ in range(4):
        time.sleep(0.15)
        assert a.heartbeat("a") == 1  # only the one still held
    assert [i.job_id for i in b.reclaim("b")] == [dropped.id]
    assert b.mark_running([dropped.id]) == {dropped.id} and b.finish(dropped.id, Transcript("", ""))
    while a.heartbeat("a") == 1:  # until held longer than max_hold_s: the process lost track
        assert time.monotonic() - t0 < 5
        time.sleep(0.1)
    assert time.monotonic() - t0 >= 1.2
    time.sleep(0.45)
    assert [i.job_id for i in b.reclaim("b")] == [lost.id]


def test_duplicate_entries_of_a_job_are_acked_with_it(broker, redis_url):  # noqa: F811
    job, item = submit(broker)
    broker.enqueue(item)  # the same piece twice (a retried XADD whose reply was lost)
    assert len(broker) == 2
    claimed = broker.claim("w", 4, 0)
    assert [i.job_id for i in claimed] == [job.id, job.id]
    assert broker.mark_running([job.id]) == {job.id}
    assert broker.finish(job.id, Transcript("x", "x"))
    assert len(broker) == 0  # the entry the job record no longer named is acked too
    other, item2 = submit(broker)
    broker.enqueue(item2)
    first, second = broker.claim("w", 4, 0)
    broker.mark_running([other.id])
    assert broker.fail(other.id, "x", "y")
    assert len(broker) == 0 and broker._held == {}


def test_poison_job_fails_after_max_attempts(broker, redis_url):  # noqa: F811
    job, _ = submit(broker)
    ok, _ = submit(broker)
    assert len(broker.claim("w1", 1, 0)) == 1  # delivery 1
    for consumer in ("w2", "w3"):  # deliveries 2 and 3: each worker dies on it
        time.sleep(0.35)
        got = broker.reclaim(consumer)
        assert [i.job_id for i in got] == [job.id]
        broker.mark_running([job.id])
    time.sleep(0.35)
    assert broker.reclaim("w4") == []
    failed = broker.get(job.id)
    assert failed.state is JobState.FAILED and failed.error.code == "too_many_attempts"
    assert "3 times" in failed.error.message
    assert broker.queue_depth()[Lane.BULK] == 1  # only the healthy job is left
    assert [i.job_id for i in broker.claim("w5", 5, 0)] == [ok.id]
    assert broker.counts()["failed"] == 1


# ---------------------------------------------------------------------------- long jobs
def test_long_job_pieces(broker, redis_url):  # noqa: F811
    job = new_job(seconds=90)
    broker.create(job, b"long")
    starts = [0.0, 30.0, 0.0]  # two channels: piece 2 starts where piece 0 does
    for k, start in enumerate(starts):
        broker.enqueue(item_for(job, piece=k, pieces=3, start_s=start,
                                speaker="right" if k == 2 else "left"), force=True)
    items = broker.claim("w1", 10, 0)
    assert [i.piece for i in items] == [0, 1, 2] and all(i.pieces == 3 for i in items)
    assert broker.mark_running([job.id], already_running_ok=True) == {job.id}
    assert broker.mark_running([job.id], already_running_ok=True) == {job.id}
    assert broker.get(job.id).attempts == 1

    def seg(k):
        return SegmentResult(job.id, k, starts[k], starts[k] + 30, items[k].speaker, f"<|en|>p{k}",
                             (Word("w", starts[k] + 1, starts[k] + 2),))

    broker.save_segments([seg(1)])
    broker.save_segments([seg(1)])  # a piece re-run overwrites itself
    assert broker.segment_count(job.id) == 1 and len(broker) == 2
    assert broker.get(job.id).meta["progress"] == "segment 1 of 3"
    broker.save_segments([seg(2), seg(0)])
    assert broker.segment_count(job.id) == 3
    assert [s.idx for s in broker.segments(job.id)] == [0, 2, 1]  # by (start_s, idx)
    assert broker.segments(job.id)[2] == seg(1)
    # the pieces that complete the job stay pending until finish: a worker that dies here
    # leaves them to be reclaimed, never a job running forever
    assert len(broker) == 2
    time.sleep(0.4)
    again = broker.reclaim("w2")
    assert sorted(i.piece for i in again) == [0, 2]
    assert broker.finish(job.id, Transcript("p0 p2 p1", "...")) is True
    assert len(broker) == 0 and broker.segment_count(job.id) == 0
    assert not admin(redis_url).exists(f"sv:audio:{job.id}", f"sv:entries:{job.id}",
                                       f"sv:segs:{job.id}")
    broker.clear_segments(job.id)


def test_progress_requeue_delete_spool(broker):
    job, _ = submit(broker)
    broker.set_progress(job.id, "segmenting 40%")
    assert broker.get(job.id).meta["progress"] == "segmenting 40%"
    assert broker.requeue(job.id) is False  # queued: nothing to do
    broker.claim("w", 1, 0)
    broker.mark_running([job.id])
    assert broker.requeue(job.id) is True
    assert broker.get(job.id).state is JobState.QUEUED
    assert broker.counts()["queued"] == 1 and broker.counts()["running"] == 0
    broker.delete_spool(job.id)
    with pytest.raises(AudioGone):
        broker.load_upload(job.id)
    assert broker.fail(job.id, "cancelled", "by the user") is True
    broker.set_progress(job.id, "late")  # a finished record is not written again
    assert broker.get(job.id).meta == {}


# ---------------------------------------------------------------------------- the real Worker
class FakeEngine(EngineDouble):
    """Engine double (as tests/test_reliability.py): echoes each clip's length."""

    def __init__(self):
        self.batch_sizes: list[int] = []

    def transcribe(self, waves, options):
        self.batch_sizes.append(len(waves))
        time.sleep(0.002)
        return [EngineOutput((), f"<|en|><|NEUTRAL|><|Speech|><|withitn|>n={w.shape[0]}")
                for w in waves]


def test_existing_worker_runs_against_the_broker(redis_url):  # noqa: F811
    broker = RedisBroker(redis_url, retention_s=60, queue_size=1000, visibility_timeout_s=2.0)
    writes: dict[str, int] = {}
    lock = threading.Lock()
    finish_many = broker.finish_many

    def counting_finish_many(results):
        written = finish_many(results)
        with lock:
            for jid in written:
                writes[jid] = writes.get(jid, 0) + 1
        return written

    broker.finish_many = counting_finish_many
    lengths = {}
    for k in range(40):
        job, item = submit(broker, Lane.INTERACTIVE if k % 4 == 0 else Lane.BULK, n=800 + k)
        lengths[job.id] = item.n_samples
    long_job = new_job(seconds=3.0)
    broker.create(long_job, b"long")
    for k in range(3):
        broker.enqueue(item_for(long_job, n=1000 + k, piece=k, pieces=3, start_s=float(k)),
                       force=True)

    stops = []
    for n in range(2):  # two worker processes' worth: a Scheduler, a Feeder and a Worker each
        sched = Scheduler(1000, max_batch=8, max_wait_s=0.005)
        feeder = Feeder(broker, sched, f"gpu-{n}", prefetch=8, block_ms=50)
        worker = Worker(f"w{n}", FakeEngine(), sched, broker, delete_audio_when_done=True)
        feeder.start()
        worker.start()
        stops += [feeder, worker]
    try:
        ids = [*lengths, long_job.id]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if all(broker.get(j).state is JobState.DONE for j in ids):
                break
            time.sleep(0.05)
        for jid, n in lengths.items():
            job = broker.get(jid)
            assert job.state is JobState.DONE and job.result.text == f"n={n}" and job.attempts == 1
        long = broker.get(long_job.id)
        assert long.state is JobState.DONE
        assert long.result.text == "n=1000 n=1001 n=1002"
        assert writes == {j: 1 for j in ids}  # each result written once
        assert len(broker) == 0 and broker._held == {}  # every claim acked, none kept alive
        assert broker.counts()["done"] == 41
        with pytest.raises(AudioGone):  # delete_audio_when_done reached the broker
            broker.load_upload(long_job.id)
    finally:
        for t in stops:
            t.stop()
        for t in stops:
            t.join(5)


# ---------------------------------------------------------------------------- Redis outages
def test_redis_killed_then_restarted(redis_server):  # noqa: F811
    b = RedisBroker(redis_server.url, retention_s=60, queue_size=100, visibility_timeout_s=0.3)
    jobs = [submit(b)[0] for _ in range(3)]
    (claimed,) = b.claim("w1", 1, 0)
    b.mark_running([claimed.job_id])
    time.sleep(1.5)  # appendfsync everysec: what is older than ~1 s is on disk
    redis_server.kill()

    some = jobs[1].id
    seg = SegmentResult(some, 0, 0.0, 1.0, None, "x")
    calls = {
        "create": lambda: b.create(new_job(), b"x"),
        "enqueue": lambda: b.enqueue(item_for(new_job())),
        "check_capacity": b.check_capacity,
        "queue_depth": b.queue_depth,
        "len": lambda: len(b),
        "claim": lambda: b.claim("w1", 4, 100),
        "reclaim": lambda: b.reclaim("w2"),
        "heartbeat": lambda: b.heartbeat("w1"),
        "mark_running": lambda: b.mark_running([some]),
        "save_segments": lambda: b.save_segments([seg]),
        "segment_count": lambda: b.segment_count(some),
        "segments": lambda: b.segments(some),
        "clear_segments": lambda: b.clear_segments(some),
        "finish_many": lambda: b.finish_many([(some, Transcript("", ""))]),
        "finish": lambda: b.finish(some, Transcript("", "")),
        "fail": lambda: b.fail(some, "x", "y"),
        "requeue": lambda: b.requeue(some),
        "set_progress": lambda: b.set_progress(some, "p"),
        "get": lambda: b.get(some),
        "position": lambda: b.position(some),
        "counts": b.counts,
        "discard": lambda: b.discard(some),
        "delete_spool": lambda: b.delete_spool(some),
        "load_upload": lambda: b.load_upload(some),
        "config_warnings": b.config_warnings,
        "aget": lambda: asyncio.run(b.aget(some)),
    }
    for name, call in calls.items():
        t0 = time.monotonic()
        with pytest.raises(BrokerUnavailable) as e:
            call()
        assert e.value.status == 503 and e.value.code == "broker_unavailable", name
        assert redis_server.url in e.value.message and e.value.retry_after == 5, name
        assert time.monotonic() - t0 < 2, name
    assert b.ping() is False

    redis_server.start()  # same port and directory: the AOF is loaded
    assert b.ping() is True
    assert {j.id: b.get(j.id).state for j in jobs} == {
        j.id: JobState.RUNNING if j.id == claimed.job_id else JobState.QUEUED for j in jobs}
    assert b.load_upload(jobs[0].id) == b"upload-" + jobs[0].id.encode()
    rest = b.claim("w1", 10, 0)  # the consumer group survived in the AOF
    assert sorted(i.job_id for i in rest) == sorted(j.id for j in jobs if j.id != claimed.job_id)
    for item in rest:
        assert b.mark_running([item.job_id]) == {item.job_id}
        assert b.finish(item.job_id, Transcript("ok", "ok"))
    time.sleep(0.4)
    (again,) = b.reclaim("w2")  # the claim held when Redis died is still pending
    assert again.job_id == claimed.job_id
    assert b.mark_running([again.job_id]) == {again.job_id}
    assert b.finish(again.job_id, Transcript("ok", "ok"))
    assert len(b) == 0
    assert asyncio.run(b.aget(jobs[0].id)).state is JobState.DONE


def test_lost_consumer_groups_are_created_again(broker, redis_url):  # noqa: F811
    submit(broker)
    assert len(broker.claim("w1", 1, 0)) == 1
    admin(redis_url).flushall()  # Redis came back empty (no AOF)
    assert broker.claim("w1", 1, 0) == []
    assert broker.reclaim("w1") == [] and broker.heartbeat("w1") == 0
    job, _ = submit(broker)
    assert [i.job_id for i in broker.claim("w1", 1, 0)] == [job.id]


def test_unavailable_message_hides_the_password():
    b = RedisBroker("redis://user:s3cret@127.0.0.1:1/0", retention_s=1, queue_size=1)
    with pytest.raises(BrokerUnavailable) as e:
        b.get("x")
    assert "s3cret" not in e.value.message and "redis://user:***@127.0.0.1:1/0" in e.value.message
    assert redact_url("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"
    assert b.ping() is False


def test_config_warnings(broker, redis_url):  # noqa: F811
    assert broker.config_warnings() == []
    admin(redis_url).config_set("maxmemory-policy", "allkeys-lru")
    assert any("noeviction" in w for w in broker.config_warnings())


def test_feeder_rides_out_an_outage(redis_server):  # noqa: F811
    broker = RedisBroker(redis_server.url, retention_s=60, queue_size=100, visibility_timeout_s=1.0)
    sched = Scheduler(100, max_batch=8, max_wait_s=0.005)
    feeder = Feeder(broker, sched, "gpu-0", prefetch=8, block_ms=50, error_backoff_s=0.1)
    worker = Worker("w0", FakeEngine(), sched, broker)
    feeder.start()
    worker.start()
    try:
        first, _ = submit(broker, n=500)
        deadline = time.monotonic() + 10
        while broker.get(first.id).state is not JobState.DONE and time.monotonic() < deadline:
            time.sleep(0.02)
        redis_server.kill()
        deadline = time.monotonic() + 5
        while feeder.error is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert isinstance(feeder.error, BrokerUnavailable) and feeder.is_alive()
        redis_server.start()
        second, _ = submit(broker, n=700)
        deadline = time.monotonic() + 10
        while broker.get(second.id).state is not JobState.DONE and time.monotonic() < deadline:
            time.sleep(0.02)
        assert broker.get(second.id).result.text == "n=700"
        assert feeder.error is None and worker.fatal is None
    finally:
        feeder.stop()
        worker.stop()
        feeder.join(5)
        worker.join(5)


def test_workers_report_free_gpu_memory_and_liveness(redis_server):  # noqa: F811
    """A worker's feeder reports its free GPU memory share (for the api processes' admission),
    its model time (for their live admission) and its liveness; they expire with the worker."""
    broker = RedisBroker(redis_server.url, retention_s=60, queue_size=100, visibility_timeout_s=1.0)
    sched = Scheduler(100, max_batch=8, max_wait_s=0.005)
    feeder = Feeder(broker, sched, "gpu-0", prefetch=8, block_ms=50, free_memory=lambda: 0.42,
                    busy_seconds=lambda: 7.5)
    feeder.start()
    try:
        deadline = time.monotonic() + 5
        while ((broker.free_memory_ratios() != [0.42] or "busy:gpu-0" not in broker._live_fields())
               and time.monotonic() < deadline):
            time.sleep(0.02)
        assert broker.free_memory_ratios() == [0.42] and broker.live_workers() == 1
        assert float(broker._live_fields()["busy:gpu-0"].split()[0]) == 7.5
    finally:
        feeder.stop()
        feeder.join(5)
    deadline = time.monotonic() + 5  # the worker is gone: its reports expire (each its own stamp)
    while (broker.live_workers() or broker.free_memory_ratios()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert broker.live_workers() == 0 and broker.free_memory_ratios() == []


def test_workers_report_their_model_time_and_api_processes_read_its_share(redis_server, monkeypatch):  # noqa: F811
    """Each worker reports its model seconds so far, stamped; a reader gets each live worker's
    share of time between its last two reports (none after one report), clipped to [0, 1];
    a worker whose reports expire drops out."""
    clock = [1000.0]
    monkeypatch.setattr("pipeline.serving.broker_redis.time.time", lambda: clock[0])
    broker = RedisBroker(redis_server.url, retention_s=60, queue_size=100, visibility_timeout_s=30.0)
    api = RedisBroker(redis_server.url, retention_s=60, queue_size=100, visibility_timeout_s=30.0)
    broker.report_busy("gpu-0", 5.0)
    broker.report_busy("gpu-1", 1.0)
    assert api.busy_shares() == []
    clock[0] += 2.0
    broker.report_busy("gpu-0", 5.5)  # 0.5 s of model time in 2 s
    broker.report_busy("gpu-1", 4.0)  # 3 s in 2 s: more than the clock (overlapping batches)
    assert sorted(api.busy_shares()) == [0.25, 1.0]
    assert sorted(api.busy_shares()) == [0.25, 1.0]  # no new report: the last shares hold
    clock[0] += 31.0  # both reports expired
    assert api.busy_shares() == []


def test_an_api_process_has_one_busy_reader_which_stops_with_the_broker(redis_server):  # noqa: F811
    broker = RedisBroker(redis_server.url, retention_s=60, queue_size=100, visibility_timeout_s=30.0)
    reader = broker.busy_seconds_reader()
    assert broker.busy_seconds_reader() is reader
    assert reader() == 0.0  # starts its thread
    broker.close()
    reader._thread.join(5)
    assert not reader._thread.is_alive()


# ---------------------------------------------------------------------------- shared directory
def test_shared_dir_keeps_the_bytes_out_of_redis(redis_url, tmp_path):  # noqa: F811
    """With a shared directory, Redis holds file names; the files live as long as their values:
    a finished job's audio file goes with it, an upload file once its record expired."""
    shared = tmp_path / "shm"
    b = RedisBroker(redis_url, retention_s=60, queue_size=100, shared_dir=shared)
    worker_side = RedisBroker(redis_url, retention_s=60, queue_size=100, shared_dir=shared)
    r = admin(redis_url)
    try:
        job, sent = submit(b, n=16000)
        audio_value = r.hget(f"sv:audio:{job.id}", "0")
        upload_value = r.get(f"sv:upload:{job.id}")
        assert audio_value == b"F" + f"audio/{job.id}/0".encode()  # a name, not 32 KB of audio
        assert upload_value == b"F" + f"uploads/{job.id}".encode()
        def files() -> list[str]:  # os.walk: a folder the background deleter removes meanwhile is skipped
            return sorted(os.path.relpath(os.path.join(d, f), shared)
                          for d, _, names in os.walk(shared) for f in names)
        assert files() == [f"audio/{job.id}/0", f"uploads/{job.id}"]
        (item,) = worker_side.claim("w1", 8, 0)
        assert torch.equal(as_float_wave(item.audio), sent.audio)
        assert worker_side.mark_running([job.id]) == {job.id}
        assert worker_side.finish(job.id, Transcript("hi", "hi"))
        deadline = time.monotonic() + 5  # deleted by a background thread, off the worker's path
        while files() != [f"uploads/{job.id}"] and time.monotonic() < deadline:
            time.sleep(0.01)
        assert files() == [f"uploads/{job.id}"]  # audio gone with the job
        assert b.load_upload(job.id) == b"upload-" + job.id.encode()  # any api process reads it

        # the record expires (TTL): the janitor's sweep removes the orphaned upload file
        r.delete(f"sv:upload:{job.id}")
        assert b.payloads.sweep(b._still_stored, min_age_s=0, upload_min_age_s=60) == 0  # young
        assert b.payloads.sweep(b._still_stored, min_age_s=0, upload_min_age_s=0) == 1
        assert files() == []

        # a file whose value never reached Redis (its writer died): swept once old enough
        orphan = shared / "audio" / str(uuid.uuid4()) / "0"
        orphan.parent.mkdir()
        orphan.write_bytes(b"S\x00\x00")
        assert b.payloads.sweep(b._still_stored) == 0  # young: its command may still come
        assert b.payloads.sweep(b._still_stored, min_age_s=0) == 1 and not orphan.exists()
        b.payloads.sweep(b._still_stored, min_age_s=0)
        assert not orphan.parent.exists()  # its emptied folder too
    finally:
        b.close()
        worker_side.close()


def test_a_claimed_job_is_finished_and_listed_by_one_script(broker, redis_url, monkeypatch):  # noqa: F811
    """The worker's finish writes the result and the job's calls-listing row (summary, search
    text with the file's name in lower case) in one round trip: what the row needs was read by
    the claim. A job finished without a claim here is listed by the fallback."""
    r = admin(redis_url)
    jobs = [replace(new_job(seconds=0.1), filename=name) for name in ("warm.wav", "Été Call.WAV")]
    for job in jobs:
        broker.create(job, b"x")
        broker.enqueue(item_for(job))
    assert len(broker.claim("w1", 8, 0)) == 2
    assert broker.mark_running([j.id for j in jobs]) == {j.id for j in jobs}
    assert broker.finish(jobs[0].id, Transcript("warm", "warm"))  # the script is loaded by now
    sent = []
    real = redis.connection.AbstractConnection.send_packed_command
    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command",
                        lambda self, *a, **k: (sent.append(a), real(self, *a, **k))[1])
    job = jobs[1]
    assert broker.finish(job.id, Transcript("Bonjour là", "<|fr|>Bonjour là"))
    monkeypatch.undo()
    assert len(sent) == 1  # one command: the finish script
    assert r.get(f"sv:search:{job.id}") == "été call.wav\nbonjour là".encode()
    assert r.hget(f"sv:job:{job.id}", "summary")
    assert 0 < r.pexpiretime(f"sv:search:{job.id}") <= r.pexpiretime(f"sv:job:{job.id}")
    assert broker._listing == {} and broker._held_by_job == {}  # nothing kept once finished

    other, _ = submit(broker)  # never claimed by this process: listed after the script
    assert broker.mark_running([other.id]) == {other.id}
    assert broker.finish(other.id, Transcript("hi", "hi"))
    assert r.get(f"sv:search:{other.id}") == b"call.wav\nhi"


def test_a_missing_shared_file_fails_its_job_clearly(redis_url, tmp_path):  # noqa: F811
    b = RedisBroker(redis_url, retention_s=60, queue_size=100, shared_dir=tmp_path / "shm")
    try:
        job, _ = submit(b)
        (tmp_path / "shm" / "audio" / job.id / "0").unlink()  # e.g. /dev/shm lost in a host crash
        assert b.claim("w1", 8, 0) == []
        got = b.get(job.id)
        assert got.state is JobState.FAILED and got.error.code == "audio_lost"
        assert len(b) == 0
    finally:
        b.close()


def test_a_process_without_the_shared_dir_says_so(redis_url, tmp_path):  # noqa: F811
    writer = RedisBroker(redis_url, retention_s=60, queue_size=100, shared_dir=tmp_path / "shm")
    reader = RedisBroker(redis_url, retention_s=60, queue_size=100)
    try:
        job, _ = submit(writer)
        with pytest.raises(ValueError, match="set the same shared_dir on every process"):
            reader.load_upload(job.id)
    finally:
        writer.close()
        reader.close()


def test_a_damaged_shared_audio_file_fails_its_job_and_not_the_claim(redis_url, tmp_path):  # noqa: F811
    """A shared audio file damaged after its submit (issue 36): the claim raised AudioUnreadable,
    so the feeder's claim failed whole and the entry came back on every claim (a poison item that
    also held up the good job beside it). Now that job fails audio_lost and the other is served."""
    shared = tmp_path / "shm"
    b = RedisBroker(redis_url, retention_s=60, queue_size=100, shared_dir=shared)
    try:
        bad, _ = submit(b, n=16000)
        good, sent = submit(b, n=16000)
        (shared / "audio" / bad.id / "0").write_bytes(b"Xnot samples")
        (item,) = b.claim("w1", 8, 0)
        assert item.job_id == good.id and torch.equal(as_float_wave(item.audio), sent.audio)
        failed = b.get(bad.id)
        assert failed.state == JobState.FAILED and failed.error.code == "audio_lost"
        assert b.claim("w1", 8, 0) == []  # acked: never claimed again
    finally:
        b.close()
