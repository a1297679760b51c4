"""One contract, two brokers (pipeline/serving/broker.py): every test here runs against the
embedded broker (SQLite + this process's scheduler) and the Redis broker (a real redis-server).
What a worker and the api side rely on: submit, claim, run, finish once, fail, read, discard,
back-pressure, piece results, the events of this process's writes, and the live lane."""

from __future__ import annotations

import asyncio
import time
import uuid
from concurrent.futures import Future

import pytest
import torch

from pipeline.domain.errors import JobNotFound, QueueFull
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions, Transcript, Word
from pipeline.model.engine import EngineOutput, as_float_wave
from pipeline.serving.broker import Broker, EmbeddedBroker
from pipeline.serving.job_events import JobEvent
from pipeline.serving.records import SegmentResult
from pipeline.serving.scheduler import Scheduler, WorkItem
from tests.redis_server import running_redis

OPTS = TranscribeOptions(language="en", use_itn=False, word_timestamps=True)
QUEUE_SIZE = 4


@pytest.fixture(scope="module")
def redis_url(tmp_path_factory):
    with running_redis(tmp_path_factory.mktemp("redis")) as server:
        yield server.url


@pytest.fixture(params=["embedded", "redis"])
def broker(request, tmp_path) -> Broker:
    scheduler = Scheduler(QUEUE_SIZE, max_batch=8, max_wait_s=0.0)
    if request.param == "embedded":
        b = EmbeddedBroker(tmp_path / "data", scheduler)
    else:
        from pipeline.serving.broker_redis import RedisBroker

        b = RedisBroker(request.getfixturevalue("redis_url"), retention_s=60, queue_size=QUEUE_SIZE,
                        visibility_timeout_s=5.0, prefix=f"t{uuid.uuid4().hex[:8]}")
    assert isinstance(b, Broker)  # the protocol, checked at run time too
    yield b
    b.close()


def pcm_like(n: int) -> torch.Tensor:
    """Audio as decoding gives it from a 16-bit source (what every broker carries exactly)."""
    return torch.randint(-32768, 32768, (n,), dtype=torch.int32).float() / 32768


def submit(broker: Broker, n: int = 1600, lane: Lane = Lane.BULK) -> tuple[Job, WorkItem]:
    job = Job(str(uuid.uuid4()), JobState.QUEUED, OPTS, lane, time.time(), n / 16000,
              filename="call.wav")
    broker.create(job, b"upload-" + job.id.encode())
    item = WorkItem(job.id, lane, OPTS, n, audio=pcm_like(n))
    broker.put(item)
    return job, item


def claim_all(broker: Broker, want: int, timeout_s: float = 10.0) -> list[WorkItem]:
    got: list[WorkItem] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += broker.claim("c1", want - len(got), block_ms=200)
    return got


def result(text: str = "hello") -> Transcript:
    return Transcript(text=text, raw_text=f"<|en|><|NEUTRAL|><|Speech|><|woitn|>{text}", segments=())


def test_a_submitted_job_is_stored_queued_and_readable(broker):
    job, _ = submit(broker)
    got = broker.get(job.id)
    assert (got.id, got.state, got.options, got.lane, got.filename, got.attempts) == \
        (job.id, JobState.QUEUED, OPTS, Lane.BULK, "call.wav", 0)
    assert got.audio_seconds == job.audio_seconds and got.created_at == job.created_at
    assert broker.load_upload(job.id) == b"upload-" + job.id.encode()
    assert broker.position(job.id) == 1 and len(broker) == 1
    assert broker.queue_depth()[Lane.BULK] == 1
    assert broker.counts()[JobState.QUEUED.value] == 1
    assert asyncio.run(broker.aget(job.id)).state is JobState.QUEUED
    with pytest.raises(JobNotFound):
        broker.get(str(uuid.uuid4()))


def test_claim_run_finish_once(broker):
    job, item = submit(broker, n=3200)
    (claimed,) = claim_all(broker, 1)
    assert claimed.job_id == job.id and claimed.n_samples == 3200
    assert torch.equal(as_float_wave(claimed.audio), item.audio)  # the audio as it was queued
    assert broker.mark_running([job.id]) == {job.id}
    assert broker.mark_running([job.id]) == set()  # not twice
    assert broker.get(job.id).state is JobState.RUNNING
    assert broker.finish_many([(job.id, result())]) == {job.id}
    done = broker.get(job.id)
    assert done.state is JobState.DONE and done.result.text == "hello" and done.attempts == 1
    assert broker.finish(job.id, result("again")) is False  # a result is written once
    assert broker.fail(job.id, "late", "too late") is False  # a finished job never fails
    assert broker.get(job.id).result.text == "hello"


def test_fail_keeps_the_code_and_message(broker):
    job, _ = submit(broker)
    claim_all(broker, 1)
    broker.mark_running([job.id])
    assert broker.fail(job.id, "decode_failed", "the device fell over") is True
    failed = broker.get(job.id)
    assert failed.state is JobState.FAILED
    assert (failed.error.code, failed.error.message) == ("decode_failed", "the device fell over")


def test_this_process_hears_its_own_writes(broker):
    events: list[JobEvent] = []
    broker.feed.subscribe(events.append)
    job, _ = submit(broker)
    claim_all(broker, 1)
    broker.mark_running([job.id])
    broker.finish(job.id, result())
    assert [(e.job_id, e.state) for e in events if e.state is not None] == \
        [(job.id, JobState.RUNNING), (job.id, JobState.DONE)]


def test_a_full_queue_refuses_and_a_discarded_job_is_gone(broker):
    jobs = [submit(broker)[0] for _ in range(QUEUE_SIZE)]
    with pytest.raises(QueueFull) as refused:
        broker.check_capacity()
    assert refused.value.retry_after >= 1
    extra = Job(str(uuid.uuid4()), JobState.QUEUED, OPTS, Lane.BULK, time.time(), 0.1)
    broker.create(extra, b"x")
    with pytest.raises(QueueFull):
        broker.put(WorkItem(extra.id, Lane.BULK, OPTS, 1600, audio=pcm_like(1600)))
    broker.discard(extra.id)  # the submit's own clean-up: nothing of it is left
    with pytest.raises(JobNotFound):
        broker.get(extra.id)
    assert broker.counts()[JobState.QUEUED.value] == len(jobs)


def test_the_interactive_lane_is_served_first(broker):
    bulk, _ = submit(broker)
    interactive, _ = submit(broker, lane=Lane.INTERACTIVE)
    assert broker.position(interactive.id) == 1 and broker.position(bulk.id) == 2
    first = claim_all(broker, 1)
    assert [i.job_id for i in first] == [interactive.id]


def test_piece_results_of_a_long_job(broker):
    job, _ = submit(broker)
    claim_all(broker, 1)
    broker.mark_running([job.id])
    pieces = [SegmentResult(job.id, k, 10.0 * k, 10.0 * k + 5, None, f"<|en|>piece {k}",
                            (Word(f"w{k}", 10.0 * k, 10.0 * k + 1),), pieces=3) for k in (1, 0)]
    broker.save_segments(pieces)
    assert broker.segment_count(job.id) == 2
    stored = broker.segments(job.id)
    assert [s.idx for s in stored] == [0, 1]  # in time order
    assert stored[1].raw_text == "<|en|>piece 1" and stored[1].words == (Word("w1", 10.0, 11.0),)
    broker.clear_segments(job.id)
    assert broker.segment_count(job.id) == 0


def test_the_live_lane(broker):
    """Both brokers carry a live re-decode to a worker's scheduler, above every job lane, and its
    output back to the future the stream holds: in-process (embedded: the future itself), or
    through Redis (a stream held by any api process; the worker process's live server puts it in
    its local scheduler and sends the engine's output back). The audio arrives exactly."""
    scheduler = Scheduler(QUEUE_SIZE, max_batch=8, max_wait_s=0.0) if broker.shared else broker.queue
    job, _ = submit(broker)
    if broker.shared:  # the worker's local queue already holds a job
        scheduler.put_many(claim_all(broker, 1))
    server = broker.serve_live(scheduler, "w1", max_waiting=4, ready=lambda: None)
    server.start()
    try:
        wave = pcm_like(1600)
        item = WorkItem(f"live-{uuid.uuid4().hex}", Lane.INTERACTIVE, OPTS, 1600, audio=wave,
                        reply=Future())
        reply = broker.submit_live(item)
        deadline = time.monotonic() + 10
        while not scheduler.live_depth():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        batch = scheduler.next_batch(1.0)
        live = batch[0]  # first, whatever waited before it
        assert live.reply is not None and [i.job_id for i in batch[1:]] == [job.id]
        assert live.options == OPTS and torch.equal(as_float_wave(live.audio), wave)
        assert live.reply.set_running_or_notify_cancel()
        live.reply.set_result(EngineOutput((7, 8), "<|en|>hi there", (Word("hi", 0.0, 0.12),)))
        out = reply.result(timeout=10)
        assert out.raw_text == "<|en|>hi there" and out.words == (Word("hi", 0.0, 0.12),)
    finally:
        server.stop()
