"""One scheduler shared by several workers (one per GPU): race-free, and a worker's own bug is not a
device fault. Reproduces the two-H200 crash: two workers woke for one item and the loser called
``min()`` on an empty queue, which the worker took for a fatal error (the service exited)."""

from __future__ import annotations

import random
import threading
import time
import uuid

import torch

from pipeline.serving.broker_sqlite import JobStore
from pipeline.serving.scheduler import Scheduler, WorkItem
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from pipeline.serving.worker import Worker
from tests.test_reliability import FakeEngine

OPTS = TranscribeOptions()


def test_many_workers_share_one_scheduler_without_losing_or_doubling_items():
    """Bare scheduler, 12 consumer threads, 4 producers trickling items (the batch-fill wait is
    where the race was): every item is served exactly once, no consumer raises."""
    sched = Scheduler(100_000, max_batch=8, max_wait_s=0.003)
    n_items, served, errors = 4000, [], []
    lock = threading.Lock()
    stop = threading.Event()

    def consume():
        while not stop.is_set():
            try:
                batch = sched.next_batch(timeout=0.05)
            except Exception as e:  # the bug: ValueError from min() of an empty queue
                errors.append(e)
                return
            assert len(batch) <= 8
            with lock:
                served.extend(i.job_id for i in batch)

    def produce(k: int):
        rng = random.Random(k)
        for n in range(n_items // 4):
            sched.put(WorkItem(f"{k}-{n}", Lane(rng.choice([0, 1])), OPTS, rng.randint(1, 50_000)))
            if rng.random() < 0.3:
                time.sleep(rng.random() * 0.002)  # bursts and gaps, as real arrivals come

    consumers = [threading.Thread(target=consume) for _ in range(12)]
    producers = [threading.Thread(target=produce, args=(k,)) for k in range(4)]
    for t in consumers + producers:
        t.start()
    for t in producers:
        t.join()
    deadline = time.monotonic() + 20
    while len(served) < n_items and time.monotonic() < deadline and not errors:
        time.sleep(0.01)
    stop.set()
    for t in consumers:
        t.join(5)
    assert not errors, errors[:1]
    assert len(served) == n_items and len(set(served)) == n_items
    assert len(sched) == 0


def test_several_workers_with_one_scheduler_finish_every_job(tmp_path):
    """Real Worker threads (fake engine) around one scheduler and one store: all jobs done, once."""
    store = JobStore(tmp_path / "store")
    sched = Scheduler(10_000, max_batch=16, max_wait_s=0.002)
    done, lock = [], threading.Lock()
    all_done = threading.Event()
    n_jobs = 600

    def on_done(jid):
        with lock:
            done.append(jid)
            if len(done) >= n_jobs:
                all_done.set()

    store.feed.on_finished(on_done)
    workers = [Worker(f"w{k}", FakeEngine(), sched, store) for k in range(6)]
    for w in workers:
        w.start()
    ids = []
    for n in range(n_jobs):
        jid = str(uuid.uuid4())
        length = 1600 + (n % 7) * 800
        store.create(Job(jid, JobState.QUEUED, OPTS, Lane.BULK, time.time(), length / 16000), b"")
        sched.put(WorkItem(jid, Lane.BULK, OPTS, length, audio=torch.zeros(length)))
        ids.append(jid)
        if n % 5 == 0:
            time.sleep(0.001)
    try:
        assert all_done.wait(60), f"{len(done)} of {n_jobs} finished"
    finally:
        for w in workers:
            w.stop()
        for w in workers:
            w.join(5)
    assert all(w.fatal is None for w in workers)
    assert sorted(done) == sorted(ids)  # each job reported once
    assert all(store.get(j).state is JobState.DONE for j in ids)


class _BuggyScheduler(Scheduler):
    """A scheduler with a bug in batch selection (raises once), to see how the worker takes it."""

    def __init__(self):
        super().__init__(100, max_batch=4, max_wait_s=0.0)
        self.raised = False

    def next_batch(self, timeout):
        if not self.raised and len(self):
            self.raised = True
            raise ValueError("min() iterable argument is empty")
        return super().next_batch(timeout)


def test_a_worker_bug_is_not_a_fatal_device_error(tmp_path):
    store = JobStore(tmp_path / "store")
    sched = _BuggyScheduler()
    finished = threading.Event()
    store.feed.on_finished(lambda jid: finished.set())
    worker = Worker("w", FakeEngine(), sched, store)
    jid = str(uuid.uuid4())
    store.create(Job(jid, JobState.QUEUED, OPTS, Lane.BULK, time.time(), 0.1), b"")
    sched.put(WorkItem(jid, Lane.BULK, OPTS, 1600, audio=torch.zeros(1600)))
    worker.start()
    try:
        assert finished.wait(10)
    finally:
        worker.stop()
        worker.join(5)
    assert sched.raised and worker.fatal is None  # still healthy: the job ran after the bug
    assert store.get(jid).state is JobState.DONE


def test_live_redecodes_go_first_and_never_touch_the_store(tmp_path):
    """A live stream's re-decode is no job: it is served before both job lanes, batched with them,
    its output comes back on its future, and the store never hears of it (nothing to poll,
    nothing to purge). It does not count against the job queue's bound."""
    from concurrent.futures import Future

    sched = Scheduler(2, max_batch=3, max_wait_s=0.0)
    store = JobStore(tmp_path / "store")
    jobs = []
    for n in range(2):
        jid = str(uuid.uuid4())
        store.create(Job(jid, JobState.QUEUED, OPTS, Lane.INTERACTIVE, time.time(), 0.1), b"")
        sched.put(WorkItem(jid, Lane.INTERACTIVE, OPTS, 1600, audio=torch.zeros(1600)))
        jobs.append(jid)
    replies = [Future() for _ in range(2)]
    for n, reply in enumerate(replies):  # the job queue is full: live items still go in
        sched.put(WorkItem(f"live-{n}", Lane.INTERACTIVE, OPTS, 3200, audio=torch.zeros(3200),
                           reply=reply))
    assert sched.queue_depth()[Lane.INTERACTIVE] == 2 and sched.live_depth() == 2
    first = sched.next_batch(timeout=1)
    assert [i.job_id for i in first[:2]] == ["live-0", "live-1"] and len(first) == 3
    sched = Scheduler(2, max_batch=3, max_wait_s=0.0)  # a fresh queue for the worker
    sched.put(WorkItem("live-x", Lane.INTERACTIVE, OPTS, 3200, audio=torch.zeros(3200),
                       reply=replies[0]))
    sched.put(WorkItem(jobs[0], Lane.INTERACTIVE, OPTS, 1600, audio=torch.zeros(1600)))
    cancelled = Future()
    cancelled.cancel()  # a stream that closed meanwhile: dropped, nothing breaks
    sched.put(WorkItem("live-gone", Lane.INTERACTIVE, OPTS, 3200, audio=torch.zeros(3200),
                       reply=cancelled))
    done = threading.Event()
    store.feed.on_finished(lambda jid: done.set())
    worker = Worker("w", FakeEngine(), sched, store)
    worker.start()
    try:
        out = replies[0].result(timeout=10)
        assert done.wait(10)
    finally:
        worker.stop()
        worker.join(5)
    assert out.raw_text == FakeEngine().transcribe([torch.zeros(3200)], [OPTS])[0].raw_text
    assert store.get(jobs[0]).state is JobState.DONE and worker.fatal is None
    assert {j.id for j in store.recover()} == {jobs[1]}  # only real jobs were ever stored


def test_the_worker_writes_the_broker_and_the_broker_tells_subscribers(tmp_path):
    """No callbacks into the worker's owner: whoever keeps state about jobs subscribes to the
    broker's feed, which reports each committed change once: a long job's start, its pieces'
    progress and its end; a failed job's end; nothing for a write that changed nothing."""
    import inspect

    from pipeline.serving.job_events import JobEvent

    params = set(inspect.signature(Worker.__init__).parameters) - {"self"}
    assert params == {"name", "engine", "scheduler", "store", "queue_timeout_s",
                      "delete_audio_when_done", "metrics", "cpu_threads", "background_work"}
    store = JobStore(tmp_path / "store")
    events: list[JobEvent] = []
    store.feed.subscribe(events.append)
    sched = Scheduler(100, max_batch=1, max_wait_s=0.0)  # one piece per batch: two progress steps
    long_id, poison_id = str(uuid.uuid4()), str(uuid.uuid4())
    store.create(Job(long_id, JobState.QUEUED, OPTS, Lane.BULK, time.time(), 2.0), b"")
    store.create(Job(poison_id, JobState.QUEUED, OPTS, Lane.BULK, time.time(), 0.1), b"")
    for k in range(2):
        sched.put(WorkItem(long_id, Lane.BULK, OPTS, 16000, audio=torch.zeros(16000), piece=k,
                           pieces=2, start_s=float(k)))
    sched.put(WorkItem(poison_id, Lane.BULK, OPTS, 777, audio=torch.zeros(777)))
    finished = threading.Event()
    ends = []
    store.feed.on_finished(lambda jid: (ends.append(jid), len(ends) == 2 and finished.set()))
    worker = Worker("w", FakeEngine(poison_len=777), sched, store)
    worker.start()
    try:
        assert finished.wait(10)
    finally:
        worker.stop()
        worker.join(5)
    mine = [(e.state, e.progress) for e in events if e.job_id == long_id]
    assert mine == [(JobState.RUNNING, None), (None, "segment 1 of 2"), (None, "segment 2 of 2"),
                    (JobState.DONE, None)]
    assert [(e.state, e.progress) for e in events if e.job_id == poison_id] == [
        (JobState.RUNNING, None), (JobState.FAILED, None)]
    assert store.get(long_id).state is JobState.DONE
    assert not store.fail(long_id, "late", "a late failure of a finished job")  # changes nothing
    assert store.finish_many([(poison_id, store.get(long_id).result)]) == set()
    assert len([e for e in events if e.job_id in (long_id, poison_id)]) == 6


def test_live_redecodes_never_hang_when_no_worker_will_run_them(tmp_path):
    """A live stream waits on its future: a server that stops, or a worker that dies of a device
    error, fails the re-decodes it will never run (NotReady), queued or in the fatal batch."""
    from concurrent.futures import Future

    from pipeline.domain.errors import NotReady

    sched = Scheduler(10, max_batch=4, max_wait_s=0.0)
    queued = Future()
    sched.put(WorkItem("live-q", Lane.INTERACTIVE, OPTS, 1600, audio=torch.zeros(1600), reply=queued))
    sched.close()
    assert isinstance(queued.exception(timeout=1), NotReady) and sched.live_depth() == 0

    sched = Scheduler(10, max_batch=4, max_wait_s=0.0)
    in_batch = Future()
    sched.put(WorkItem("live-b", Lane.INTERACTIVE, OPTS, 1600, audio=torch.zeros(1600), reply=in_batch))
    worker = Worker("w", FakeEngine(fatal=True), sched, JobStore(tmp_path / "store"))
    worker.start()
    try:
        assert isinstance(in_batch.exception(timeout=10), NotReady)
    finally:
        worker.stop()
        worker.join(5)
    assert worker.fatal is not None


# ---------------------------------------------------------------- queue positions (polls read them)
def _exact_positions(sched: Scheduler) -> dict[str, int]:
    order = sorted(sched._items, key=lambda i: (i.rank, i.seq))
    out: dict[str, int] = {}
    for n, it in enumerate(order, 1):
        out.setdefault(it.job_id, n)
    return out


def _item(lane: Lane) -> WorkItem:
    return WorkItem(str(uuid.uuid4()), lane, OPTS, 16000)


def test_positions_are_the_serving_order_and_new_jobs_are_placed_exactly(monkeypatch):
    """Placed by lane, then age: jobs queued after the order was sorted are placed among
    themselves and after everything of their lane (nothing has left the queue meanwhile)."""
    rng = random.Random(7)
    sched = Scheduler(100_000)
    for _ in range(300):
        sched.put(_item(rng.choice(list(Lane))))
    monkeypatch.setattr("pipeline.serving.scheduler.POSITION_TTL_S", 3600.0)
    at_sort = _exact_positions(sched)
    first = sched._items[0].job_id
    assert sched.position(first) == at_sort[first]  # sorts now, then keeps the order a while
    for _ in range(40):  # queued after the sort: placed without sorting again
        sched.put(_item(rng.choice(list(Lane))))
    exact = _exact_positions(sched)
    new = {i.job_id for i in sched._items} - set(at_sort)
    assert len(new) == 40 and {j: sched.position(j) for j in new} == {j: exact[j] for j in new}
    assert {j: sched.position(j) for j in at_sort} == at_sort  # as sorted (up to the TTL old)
    assert sched.position("not-queued") is None


def test_a_job_taken_for_a_batch_has_no_place_and_a_retried_one_has_one_again(monkeypatch):
    monkeypatch.setattr("pipeline.serving.scheduler.POSITION_TTL_S", 3600.0)
    sched = Scheduler(100_000, max_batch=4)
    items = [_item(Lane.BULK) for _ in range(10)]
    for it in items:
        sched.put(it)
    assert sched.position(items[9].job_id) == 10
    batch = sched.next_batch(timeout=0.1)
    assert [sched.position(i.job_id) for i in batch] == [None] * 4  # at once, not after the TTL
    sched.put(WorkItem(batch[0].job_id, Lane.BULK, OPTS, 16000))  # a retry
    assert sched.position(batch[0].job_id) == 11  # after the 10 the sort saw (6 queued now)
    monkeypatch.setattr("pipeline.serving.scheduler.POSITION_TTL_S", 0.0)
    assert sched.position(batch[0].job_id) == 7  # re-sorted: exact again


def test_position_reads_sort_the_queue_at_most_once_per_ttl(monkeypatch):
    """A poll of a queued job no longer sorts the whole queue: 2,000 reads of a 4,096-deep queue
    within the TTL sort it once."""
    monkeypatch.setattr("pipeline.serving.scheduler.POSITION_TTL_S", 3600.0)
    sched = Scheduler(100_000)
    items = [_item(Lane.BULK) for _ in range(4096)]
    for it in items:
        sched.put(it)
    sorts = []
    real = sched._sort_order
    monkeypatch.setattr(sched, "_sort_order", lambda now: (sorts.append(now), real(now)))
    rng = random.Random(1)
    for _ in range(2000):
        k = rng.randrange(4096)
        assert sched.position(items[k].job_id) == k + 1
    assert len(sorts) == 1


class _CompilingEngine(FakeEngine):
    """A double with background work always pending (a compile to start, graphs to capture)."""

    def __init__(self):
        super().__init__()
        self.steps = 0

    @property
    def has_idle_work(self) -> bool:
        return True

    def idle_step(self) -> bool:
        self.steps += 1
        return True


def test_a_worker_without_background_work_never_starts_the_engines(tmp_path):
    """Issue 42: the batch CLI's workers start no compile or graph capture (a compile cannot be
    cancelled: the CLI's exit waited for it, or before close() aborted); a server's do."""
    from pipeline.config import Settings
    from pipeline.serving.runtime import build_runtime

    for background, expect_steps in ((False, False), (True, True)):
        engine = _CompilingEngine()
        worker = Worker("w", engine, Scheduler(8, max_batch=4, max_wait_s=0.0), JobStore(tmp_path / str(background)),
                        background_work=background)
        worker.start()
        time.sleep(0.5)  # idle: a worker with background work steps every few ms
        worker.stop()
        worker.join(10)
        assert (engine.steps > 0) is expect_steps, (background, engine.steps)
    # the CLI's local mode: off unless asked for; a server's pool: on unless turned off
    assert build_runtime(Settings(device="cpu", demo=True), "local").pool.background_work is False
    assert build_runtime(Settings(device="cpu", demo=True, background_compile=True), "local").pool.background_work is True
