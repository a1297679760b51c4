"""One contract per port (pipeline/serving/ports.py), each run against both topologies' adapters:
the embedded broker (SQLite + this process's scheduler) and the Redis broker (a real
redis-server). Where a port lets the topologies differ it says so with a flag of its own
(``hears_every_change``, ``recovers_here``, ``workers_elsewhere``, a feeder or none), and the
contract holds each adapter to the answer its flag gives. The last tests guard the suite itself:
every member of every port is exercised by that port's contract class, and every adapter has
every member of the ports it declares."""

from __future__ import annotations

import ast
import asyncio
import inspect
import struct
import textwrap
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, replace
from typing import Callable

import pytest
import torch

from pipeline.audio.wav import pcm16_mono_layout
from pipeline.domain.errors import AudioGone, JobGone, JobNotFound, JobUnfinished, QueueFull
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions, Transcript, Word
from pipeline.model.engine import EngineOutput, as_float_wave
from pipeline.serving import ports
from pipeline.serving.broker import EmbeddedBroker
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


@dataclass
class Adapter:
    broker: ports.Broker
    other: Callable[[], ports.Broker]  # the same store opened again: a restart (embedded), another process (Redis)


@pytest.fixture(params=["embedded", "redis"])
def adapter(request, tmp_path):
    opened = []

    def open_broker() -> ports.Broker:
        scheduler = Scheduler(QUEUE_SIZE, max_batch=8, max_wait_s=0.0)
        if request.param == "embedded":
            b = EmbeddedBroker(tmp_path / "data", scheduler)
        else:
            from pipeline.serving.broker_redis import RedisBroker

            b = RedisBroker(request.getfixturevalue("redis_url"), retention_s=60, queue_size=QUEUE_SIZE,
                            visibility_timeout_s=5.0, prefix=prefix)
        opened.append(b)
        return b

    prefix = f"t{uuid.uuid4().hex[:8]}"
    a = Adapter(open_broker(), open_broker)
    yield a
    for b in opened:
        b.close()


@pytest.fixture
def broker(adapter) -> ports.Broker:
    return adapter.broker


def pcm_like(n: int) -> torch.Tensor:
    """Audio as decoding gives it from a 16-bit source (what every broker carries exactly)."""
    return torch.randint(-32768, 32768, (n,), dtype=torch.int32).float() / 32768


def new_job(n: int = 1600, lane: Lane = Lane.BULK) -> Job:
    return Job(str(uuid.uuid4()), JobState.QUEUED, OPTS, lane, time.time(), n / 16000, filename="call.wav")


def submit(broker, n: int = 1600, lane: Lane = Lane.BULK) -> tuple[Job, WorkItem]:
    job = new_job(n, lane)
    broker.create(job, b"upload-" + job.id.encode())
    item = WorkItem(job.id, lane, OPTS, n, audio=pcm_like(n))
    broker.put(item)
    return job, item


def claim_all(broker, want: int, timeout_s: float = 10.0) -> list[WorkItem]:
    got: list[WorkItem] = []
    deadline = time.monotonic() + timeout_s
    while len(got) < want and time.monotonic() < deadline:
        got += broker.claim("c1", want - len(got), block_ms=200)
    return got


def run(broker, n: int = 1600) -> Job:
    """A job submitted, claimed and marked running (what a worker does before its result)."""
    job, _ = submit(broker, n)
    claim_all(broker, 1)
    assert broker.mark_running([job.id]) == {job.id}
    return job


def result(text: str = "hello") -> Transcript:
    return Transcript(text=text, raw_text=f"<|en|><|NEUTRAL|><|Speech|><|woitn|>{text}", segments=())


def wav16(samples: list[int]) -> bytes:
    """A mono 16 kHz 16-bit PCM WAV."""
    data = struct.pack(f"<{len(samples)}h", *samples)
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", len(data)) + data
    return b"RIFF" + struct.pack("<I", len(body)) + body


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


# ---------------------------------------------------------------------------------- JobStore
class TestJobStore:
    PORT = ports.JobStore

    def test_a_created_job_is_stored_queued_readable_and_counted(self, broker):
        job = new_job()
        broker.create(job, b"upload")
        got = broker.get(job.id)
        assert (got.id, got.state, got.options, got.lane, got.filename, got.attempts) == \
            (job.id, JobState.QUEUED, OPTS, Lane.BULK, "call.wav", 0)
        assert got.audio_seconds == job.audio_seconds and got.created_at == job.created_at
        assert asyncio.run(broker.aget(job.id)).state is JobState.QUEUED
        assert broker.counts()[JobState.QUEUED.value] == 1
        with pytest.raises(JobNotFound):
            broker.get(str(uuid.uuid4()))
        with pytest.raises(JobNotFound):
            asyncio.run(broker.aget(str(uuid.uuid4())))

    def test_a_discarded_job_is_gone(self, broker):
        job = new_job()
        broker.create(job, b"x")
        broker.discard(job.id)  # the submit's own clean-up: nothing of it is left
        with pytest.raises(JobNotFound):
            broker.get(job.id)

    def test_running_then_done_once_and_never_failed_after(self, broker):
        job = new_job()
        broker.create(job, b"x")
        assert broker.mark_running([job.id]) == {job.id}
        assert broker.mark_running([job.id]) == set()  # not twice
        assert broker.get(job.id).state is JobState.RUNNING
        assert broker.finish(job.id, result()) is True
        assert broker.finish(job.id, result("again")) is False  # a result is written once
        assert broker.fail(job.id, "late", "too late") is False  # a finished job never fails
        done = broker.get(job.id)
        assert done.state is JobState.DONE and done.result.text == "hello" and done.attempts == 1
        assert broker.counts()[JobState.DONE.value] == 1

    def test_fail_keeps_the_code_and_message_once(self, broker):
        job = new_job()
        broker.create(job, b"x")
        broker.mark_running([job.id])
        assert broker.fail(job.id, "decode_failed", "the device fell over") is True
        assert broker.fail(job.id, "again", "twice") is False
        failed = broker.get(job.id)
        assert failed.state is JobState.FAILED
        assert (failed.error.code, failed.error.message) == ("decode_failed", "the device fell over")

    def test_the_feed_hears_this_process_and_says_whether_that_is_all(self, adapter):
        broker = adapter.broker
        events: list[JobEvent] = []
        broker.feed.subscribe(events.append)
        job = new_job()
        broker.create(job, b"x")
        broker.mark_running([job.id])
        broker.finish(job.id, result())
        assert [(e.job_id, e.state) for e in events if e.state is not None] == \
            [(job.id, JobState.RUNNING), (job.id, JobState.DONE)]
        if broker.hears_every_change:
            return  # (the embedded topology: every writer is this process's)
        other = adapter.other()  # another process writes: its change is read, never heard here
        elsewhere = new_job()
        other.create(elsewhere, b"y")
        other.mark_running([elsewhere.id])
        other.finish(elsewhere.id, result("there"))
        assert broker.get(elsewhere.id).result.text == "there"
        assert elsewhere.id not in {e.job_id for e in events}

    def test_purge_deletes_only_finished_jobs_and_what_it_names_is_gone(self, broker):
        done, waiting = new_job(), new_job()
        for job in (done, waiting):
            broker.create(job, b"x")
        broker.mark_running([done.id])
        broker.finish(done.id, result())
        purged = broker.purge(time.time() + 1)
        assert set(purged) <= {done.id}  # (Redis: records expire by their TTL, nothing is named)
        for jid in purged:
            with pytest.raises((JobGone, JobNotFound)):
                broker.get(jid)
        assert broker.get(waiting.id).state is JobState.QUEUED  # never an unfinished job

    def test_the_calls_index_lists_and_reviews_finished_jobs(self, broker):
        job = new_job()
        broker.create(job, b"x")
        broker.mark_running([job.id])
        broker.finish(job.id, result("the parcel never came"))
        calls = broker.calls()
        (row,) = calls.rows([job.id], search="parcel")
        assert (row.id, row.state, row.filename) == (job.id, "done", "call.wav") and row.search
        _, review = calls.update_review(job.id, lambda old, j: replace(old, reviewed=True))
        assert review.reviewed and broker.get(job.id).meta["review"] == review
        assert calls.rows([job.id])[0].review == review


# ---------------------------------------------------------------------------------- JobRemoval
def finished(broker, text: str = "hello") -> Job:
    job = new_job()
    broker.create(job, b"upload-" + job.id.encode())
    broker.mark_running([job.id])
    broker.finish(job.id, result(text))
    return job


class TestJobRemoval:
    PORT = ports.JobRemoval

    def test_a_removed_job_is_gone_as_a_purged_one_with_its_audio_result_and_review(self, broker):
        job, other = finished(broker, "the parcel never came"), finished(broker, "the parcel came")
        broker.calls().update_review(job.id, lambda old, j: replace(old, reviewed=True))
        broker.remove(job.id)
        with pytest.raises(JobGone):  # 410 as after retention, not 404
            broker.get(job.id)
        with pytest.raises(AudioGone):
            broker.load_upload(job.id)
        assert [r.id for r in broker.calls().rows([job.id, other.id], search="parcel")] == [other.id]
        assert [r.id for r in broker.calls().rows(None) if r.id in (job.id, other.id)] == [other.id]
        assert broker.get(other.id).result.text == "the parcel came"  # only what it names
        with pytest.raises(JobGone):
            broker.remove(job.id)  # again: already gone
        with pytest.raises(JobNotFound):
            broker.remove("no-such-job")

    def test_an_unfinished_job_is_neither_removed_nor_kept(self, broker):
        queued = new_job()
        broker.create(queued, b"x")
        for act in (lambda: broker.remove(queued.id), lambda: broker.keep(queued.id, time.time() + 60)):
            with pytest.raises(JobUnfinished):
                act()
        assert broker.get(queued.id).state is JobState.QUEUED
        assert broker.load_upload(queued.id) == b"x"

    def test_a_kept_job_outlives_its_retention_and_says_until_when(self, broker):
        job = finished(broker)
        until = time.time() + 3 * 86400
        assert broker.keep(job.id, until) == pytest.approx(until)
        assert broker.keep(job.id, until - 86400) == pytest.approx(until)  # never shortened
        assert broker.get(job.id).meta["kept_until"] == pytest.approx(until)
        assert broker.purge(time.time() + 2 * 86400) == []  # past its retention, not its keep
        assert broker.get(job.id).state is JobState.DONE
        assert broker.load_upload(job.id) == b"upload-" + job.id.encode()
        with pytest.raises(JobNotFound):
            broker.keep("no-such-job", until)


def test_a_kept_redis_job_expires_when_kept_not_at_its_retention(redis_url):
    """The distributed store keeps by TTL: the record and the upload live until the keep (the
    retention here is 60 s, the keep an hour)."""
    from pipeline.serving.broker_redis import RedisBroker

    b = RedisBroker(redis_url, retention_s=60, queue_size=QUEUE_SIZE, prefix=f"k{uuid.uuid4().hex[:8]}")
    try:
        job = finished(b)
        b.keep(job.id, time.time() + 3600)
        for kind in ("job", "upload"):
            assert 3500_000 < b.client.pttl(b.key(kind, job.id)) <= 3600_000
        assert b.client.pttl(b.key("tomb", job.id)) > 3600_000
    finally:
        b.close()


# ---------------------------------------------------------------------------------- Uploads
class TestUploads:
    PORT = ports.Uploads

    def test_an_upload_is_read_back_as_stored(self, broker):
        job = new_job()
        broker.create(job, b"upload-bytes")
        assert broker.load_upload(job.id) == b"upload-bytes"
        path = broker.upload_path(job.id)  # a file on this host, or None (bytes only)
        assert path is None or path.read_bytes() == b"upload-bytes"

    def test_a_pcm16_upload_is_its_own_samples_where_the_store_spools_them(self, broker):
        samples = [0, 1, -1, 32767, -32768, 1234] * 100
        data = wav16(samples)
        job = new_job(len(samples))
        broker.create(job, data)
        layout = pcm16_mono_layout(data, max_seconds=60)
        assert layout is not None and layout.frames == len(samples)
        if not broker.spools_pcm16:  # its samples travel in the work item's payload instead
            with pytest.raises(NotImplementedError):
                broker.spooled_audio(job.id, layout)
            return
        got = broker.spooled_audio(job.id, layout).load()
        assert got.tolist() == samples


# ---------------------------------------------------------------------------------- WorkQueue
class TestWorkQueue:
    PORT = ports.WorkQueue

    def test_put_then_claim_carries_the_audio_exactly_with_its_place_and_depth(self, broker):
        job, item = submit(broker, n=3200)
        assert broker.position(job.id) == 1 and len(broker) == 1
        assert broker.queue_depth()[Lane.BULK] == 1
        deadline = time.monotonic() + 10
        claimed = []
        while not claimed and time.monotonic() < deadline:  # (a worker process's feeder: at most 2)
            claimed = broker.claim("c1", 2, block_ms=200)
        (claimed,) = claimed
        assert claimed.job_id == job.id and claimed.n_samples == 3200
        assert torch.equal(as_float_wave(claimed.audio), item.audio)
        assert broker.position(job.id) is None  # claimed: no longer waiting

    def test_a_full_queue_refuses_and_force_admits(self, broker):
        for _ in range(QUEUE_SIZE):
            submit(broker)
        with pytest.raises(QueueFull) as refused:
            broker.check_capacity()
        assert refused.value.retry_after >= 1
        extra = new_job()
        broker.create(extra, b"x")
        with pytest.raises(QueueFull):
            broker.put(WorkItem(extra.id, Lane.BULK, OPTS, 1600, audio=pcm_like(1600)))
        broker.put(WorkItem(extra.id, Lane.BULK, OPTS, 1600, audio=pcm_like(1600)), force=True)
        assert len(broker) == QUEUE_SIZE + 1

    def test_the_interactive_lane_is_served_first(self, broker):
        bulk, _ = submit(broker)
        interactive, _ = submit(broker, lane=Lane.INTERACTIVE)
        assert broker.position(interactive.id) == 1 and broker.position(bulk.id) == 2
        assert broker.queue_depth() == {Lane.INTERACTIVE: 1, Lane.BULK: 1}
        assert [i.job_id for i in claim_all(broker, 1)] == [interactive.id]

    def test_accepted_work_survives_this_process_as_its_flag_says(self, adapter):
        """``recovers_here``: the store brings back what this process accepted (queued and running
        jobs, a long one's piece results forgotten: it is split again) for it to queue again;
        else the queue itself outlives the process and another one claims the work."""
        broker = adapter.broker
        running = run(broker)
        queued, _ = submit(broker)
        broker.save_segments([SegmentResult(running.id, 0, 0.0, 1.0, None, "<|en|>a", (), pieces=2)])
        other = adapter.other()
        recovered = other.recover()
        if broker.recovers_here:
            assert [j.id for j in recovered] == [running.id, queued.id]  # in submission order
            assert other.get(running.id).state is JobState.QUEUED
            assert other.segment_count(running.id) == 0
        else:
            assert recovered == []
            assert queued.id in {i.job_id for i in claim_all(other, 1)}


# ---------------------------------------------------------------------------------- WorkerSink
class TestWorkerSink:
    PORT = ports.WorkerSink

    def test_a_batch_runs_and_finishes_once(self, broker):
        a, b = run(broker), run(broker)
        assert broker.mark_running([a.id, b.id]) == set()
        assert broker.finish_many([(a.id, result("a")), (b.id, result("b"))]) == {a.id, b.id}
        assert broker.finish_many([(a.id, result("again"))]) == set()
        assert broker.get(a.id).result.text == "a" and broker.get(b.id).state is JobState.DONE
        assert broker.fail(a.id, "late", "too late") is False

    def test_a_job_that_fails_alone(self, broker):
        job = run(broker)
        assert broker.fail(job.id, "inference_failed", "nan") is True
        assert broker.get(job.id).error.code == "inference_failed"

    def test_piece_results_of_a_long_job(self, broker):
        job = run(broker)
        pieces = [SegmentResult(job.id, k, 10.0 * k, 10.0 * k + 5, None, f"<|en|>piece {k}",
                                (Word(f"w{k}", 10.0 * k, 10.0 * k + 1),), pieces=3) for k in (1, 0)]
        broker.save_segments(pieces)
        assert broker.segment_count(job.id) == 2
        stored = broker.segments(job.id)
        assert [s.idx for s in stored] == [0, 1]  # in time order
        assert stored[1].raw_text == "<|en|>piece 1" and stored[1].words == (Word("w1", 10.0, 11.0),)
        broker.save_segments([SegmentResult(job.id, 2, 30.0, 31.0, "left", "<|en|>end", (), pieces=3)])
        assert broker.segment_count(job.id) == 3 and broker.segments(job.id)[2].speaker == "left"

    def test_a_pieces_scores_round_trip(self, broker):
        """Issue 39: a piece's confidence and tag scores come back as saved (a long job's JSON has
        them); a piece without scores reads back with none."""
        job = run(broker)
        words = (Word("refund", 10.0, 10.5, 0.875), Word("please", 10.5, 11.0, 0.25))
        tags = (("en", 0.9375), ("ANGRY", 0.5), ("Speech", 0.75))
        scored = SegmentResult(job.id, 0, 10.0, 12.0, None, "<|en|><|ANGRY|><|Speech|><|woitn|>refund please",
                               words, pieces=2, avg_logprob=-0.125, tag_probs=tags)
        bare = SegmentResult(job.id, 1, 12.0, 13.0, None, "<|en|>ok", (Word("ok", 12.0, 12.5),), pieces=2)
        broker.save_segments([scored, bare])
        got, got_bare = broker.segments(job.id)
        assert got == replace(scored, pieces=0) and got.words[1].probability == 0.25  # (not stored)
        assert got_bare == replace(bare, pieces=0) and got_bare.avg_logprob is None and got_bare.words[0].probability is None

    def test_a_released_claim_is_not_lost(self, broker):
        """A batch cut short (a broker outage) hands its claims back: the job is untouched and
        whichever worker takes it later still finishes it once."""
        job = run(broker)
        broker.release([job.id])
        broker.release([str(uuid.uuid4())])  # never raises
        assert broker.get(job.id).state is JobState.RUNNING
        assert broker.finish_many([(job.id, result())]) == {job.id}

    def test_a_deleted_spool_leaves_the_result(self, broker):
        job = run(broker)
        broker.finish_many([(job.id, result())])
        broker.delete_spool(job.id)  # audio deleted when done (the setting)
        with pytest.raises(AudioGone):
            broker.load_upload(job.id)
        assert broker.get(job.id).result.text == "hello"


# ---------------------------------------------------------------------------------- WorkSource
class TestWorkSource:
    PORT = ports.WorkSource

    def test_a_feeder_brings_queued_work_to_the_workers_scheduler(self, broker):
        """Where the queue lives outside this process a feeder claims into the worker's scheduler;
        where the worker's scheduler is the queue there is none (claims are its batches)."""
        local = Scheduler(QUEUE_SIZE, max_batch=8, max_wait_s=0.0)
        feeder = broker.feeder(local, "c1", prefetch=4, free_memory=lambda: None)
        job, _ = submit(broker)
        if feeder is None:
            assert [i.job_id for i in broker.claim("c1", 1, block_ms=200)] == [job.id]
            return
        feeder.start()
        try:
            wait_for(lambda: len(local) == 1)
            assert [i.job_id for i in local.next_batch(1.0)] == [job.id] and feeder.error is None
        finally:
            feeder.stop()

    def test_a_live_server_starts_and_stops_empty(self, broker):
        scheduler = Scheduler(QUEUE_SIZE, max_batch=8, max_wait_s=0.0)
        server = broker.serve_live(scheduler, "w1", max_waiting=4, ready=lambda: None)
        server.start()
        server.stop()
        assert scheduler.live_depth() == 0


# ---------------------------------------------------------------------------------- LiveLane
class TestLiveLane:
    PORT = ports.LiveLane

    def test_a_re_decode_goes_above_every_job_and_its_answer_comes_back(self, broker):
        """Both adapters carry a live re-decode to a worker's scheduler, above every job lane, and
        its output back to the future the stream holds: in-process (embedded: the future itself),
        or through Redis (a stream held by any api process; the worker process's live server puts
        it in its local scheduler and sends the engine's output back). The audio arrives exactly."""
        local = Scheduler(QUEUE_SIZE, max_batch=8, max_wait_s=0.0)
        feeder = broker.feeder(local, "w1", prefetch=4, free_memory=lambda: None)
        scheduler = broker.queue if feeder is None else local  # where the workers batch from
        job, _ = submit(broker)
        if feeder is not None:  # the worker's local queue already holds a job
            scheduler.put_many(claim_all(broker, 1))
        assert broker.live_lane_stats() is None  # before its first re-decode
        server = broker.serve_live(scheduler, "w1", max_waiting=4, ready=lambda: None)
        server.start()
        try:
            wave = pcm_like(1600)
            item = WorkItem(f"live-{uuid.uuid4().hex}", Lane.INTERACTIVE, OPTS, 1600, audio=wave,
                            reply=Future())
            reply = broker.submit_live(item)
            wait_for(lambda: scheduler.live_depth() > 0)
            batch = scheduler.next_batch(1.0)
            live = batch[0]  # first, whatever waited before it
            assert live.reply is not None and [i.job_id for i in batch[1:]] == [job.id]
            assert live.options == OPTS and torch.equal(as_float_wave(live.audio), wave)
            assert live.reply.set_running_or_notify_cancel()
            live.reply.set_result(EngineOutput((7, 8), "<|en|>hi there", (Word("hi", 0.0, 0.12),)))
            out = reply.result(timeout=10)
            assert out.raw_text == "<|en|>hi there" and out.words == (Word("hi", 0.0, 0.12),)
            stats = broker.live_lane_stats()  # (workers on the lane, moved, lost): None in-process
            assert stats is None or (len(stats) == 3 and stats[0] >= 1 and stats[2] == 0)
        finally:
            server.stop()


# ---------------------------------------------------------------------------------- ClusterState
class TestClusterState:
    PORT = ports.ClusterState

    def test_workers_are_known_where_they_report(self, broker):
        """``workers_elsewhere``: the workers are other processes that report through the store
        (alive, free GPU memory, model time); else they are this process's own and none reports
        here."""
        assert broker.ping() is True
        warnings = broker.config_warnings()
        assert isinstance(warnings, list) and all(isinstance(w, str) for w in warnings)
        if not broker.workers_elsewhere:
            assert (broker.live_workers(), broker.free_memory_ratios(), broker.busy_seconds_reader(),
                    broker.live_capacity_reader()) == (0, [], None, None)  # (the pool measures its own)
            assert warnings == []
            return
        capacity = broker.live_capacity_reader()  # no worker has reported a live lane yet: no rate
        assert capacity is broker.live_capacity_reader() and capacity.rate(0.5) is None
        assert broker.live_workers() == 0 and broker.free_memory_ratios() == []
        local = Scheduler(QUEUE_SIZE, max_batch=8, max_wait_s=0.0)
        feeder = broker.feeder(local, "gpu-0", prefetch=4, free_memory=lambda: 0.42,
                               busy_seconds=lambda: 1.5)
        feeder.start()
        try:
            wait_for(lambda: broker.live_workers() == 1 and broker.free_memory_ratios() == [0.42])
            busy = broker.busy_seconds_reader()
            assert busy is not None and busy() >= 0.0
        finally:
            feeder.stop()


# ---------------------------------------------------------------------------------- the suite's guards
CONTRACTS = [TestJobStore, TestJobRemoval, TestUploads, TestWorkQueue, TestWorkerSink, TestWorkSource, TestLiveLane,
             TestClusterState]


def _used_members(cls: type) -> set[str]:
    """The members a contract class's tests use (attributes read, ``len()`` for ``__len__``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    if any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "len"
           for n in ast.walk(tree)):
        used.add("__len__")
    return used


def test_every_port_has_a_contract_and_every_member_is_exercised():
    assert {c.PORT for c in CONTRACTS} == set(ports.PORTS)
    missing = {c.PORT.__name__: sorted(ports.members(c.PORT) - _used_members(c)) for c in CONTRACTS}
    assert missing == {name: [] for name in missing}


def test_the_guard_sees_a_member_left_out():
    class Partial:
        PORT = ports.LiveLane

        def test_only_submit(self, broker):
            broker.submit_live(None)

    assert ports.members(ports.LiveLane) - _used_members(Partial) == {"live_lane_stats"}


def test_each_adapter_is_every_port(broker):
    assert all(isinstance(broker, port) for port in ports.PORTS)
    assert isinstance(broker, ports.Broker)


def test_the_other_adapters_have_the_ports_they_declare():
    """The sibling web process's broker and the batch CLI's sink implement only some ports (the
    sibling claims nothing and serves no live lane; the CLI's run keeps no records)."""
    from pipeline.serving.broker_sibling import SiblingBroker
    from pipeline.serving.direct import LocalSink

    declared = {SiblingBroker: (ports.JobStore, ports.Uploads, ports.LiveLane, ports.ClusterState),
                LocalSink: (ports.WorkerSink, ports.WorkSource)}
    for cls, its_ports in declared.items():
        instance_attrs = {"feed"}  # set by the store's __init__
        for port in its_ports:
            lacking = {m for m in ports.members(port) if not hasattr(cls, m)} - instance_attrs
            assert lacking == set(), (cls.__name__, port.__name__, lacking)
    assert not hasattr(SiblingBroker, "claim") and not hasattr(SiblingBroker, "serve_live")


# ------------------------------------------------------------ piece rows of the previous release
def test_a_sqlite_piece_row_of_the_previous_release_reads_without_scores(tmp_path):
    """A store written before issue 39 (no ``scores`` column) is migrated when opened and its piece
    rows read back with no scores; a new row in it keeps its scores."""
    from pipeline.serving.broker_sqlite import JobStore

    store = JobStore(tmp_path / "data")
    with store._write() as c:  # the previous release's table
        c.execute("DROP TABLE segments")
        c.execute("CREATE TABLE segments (job_id TEXT NOT NULL, idx INTEGER NOT NULL, start_s REAL NOT NULL,"
                  " end_s REAL NOT NULL, speaker TEXT, raw_text TEXT NOT NULL, words TEXT NOT NULL DEFAULT"
                  " '[]', PRIMARY KEY (job_id, idx))")
        c.execute("INSERT INTO segments VALUES ('j', 0, 0.0, 1.0, NULL, '<|en|>hi', '[[\"hi\", 0.1, 0.4]]')")
    store.close()
    store = JobStore(tmp_path / "data")
    try:
        (old,) = store.segments("j")
        assert old.words == (Word("hi", 0.1, 0.4),) and old.avg_logprob is None and old.tag_probs == ()
        new = SegmentResult("j", 1, 1.0, 2.0, None, "<|en|>yes", (Word("yes", 1.1, 1.4, 0.5),),
                            avg_logprob=-0.5, tag_probs=(("en", 0.75),))
        store.save_segments([new])
        assert store.segments("j")[1] == new
    finally:
        store.close()


def test_a_redis_piece_row_of_the_previous_release_reads_without_scores(redis_url):
    """A piece hash value of the previous release, ``[start, end, speaker, raw_text, words]``,
    reads back with no scores."""
    import json

    from pipeline.serving.broker_redis import RedisBroker

    broker = RedisBroker(redis_url, retention_s=60, queue_size=QUEUE_SIZE, prefix=f"t{uuid.uuid4().hex[:8]}")
    try:
        broker._r.hset(broker._k("segs", "j"), "0", json.dumps([0.0, 1.0, "left", "<|en|>hi", [["hi", 0.1, 0.4]]]))
        (old,) = broker.segments("j")
        assert old == SegmentResult("j", 0, 0.0, 1.0, "left", "<|en|>hi", (Word("hi", 0.1, 0.4),))
    finally:
        broker.close()
