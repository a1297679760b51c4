"""Issue 38: live admission from what the lane has left -- re-decodes per second it can batch
within the latency budget (measured batch sizes and times, the queue's age) against the open
streams' demand (their speech times a cost per voiced second learned from the lane), the same
rule in both topologies -- and the live lane's gathered batches. Fake clocks, no sleeps (the
gathering test waits a few ms of real time and asserts only what the window guarantees)."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import Future

import pytest
import torch

from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.serving.admission import (BatchProfile, LiveAdmission, LocalLaneCapacity, StreamLoad,
                                        rate_of, report_rate)
from pipeline.serving.scheduler import Scheduler, WorkItem


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


BUDGET = 0.15


def gpu_like(profile: BatchProfile) -> None:
    """The H200's figures (issue 38): one re-decode 4.5 ms, 64 of them 23 ms."""
    profile.batch(1, 0.0045)
    profile.batch(4, 0.0056)
    profile.batch(64, 0.023)


# ---------------------------------------------------------------------------- the lane's capacity
def test_a_cpu_lanes_capacity_is_its_time_per_item():
    """A CPU batch costs the sum of its items: 8 ms a re-decode is 125 re-decodes/s, whatever
    the batch sizes seen."""
    profile = BatchProfile(max_batch=64, clock=Clock())
    assert profile.rate(BUDGET) is None  # nothing measured: no figure
    for size in (1, 2, 4, 8):
        profile.batch(size, 0.008 * size)
    assert profile.rate(BUDGET) == pytest.approx(125, rel=0.02)


def test_a_gpu_lanes_capacity_counts_its_batches_not_its_busy_time():
    """Batches of a few hold the GPU's timeline ~5 ms each at low occupancy: the busy share says
    full at ~200 re-decodes/s, the batch profile says the lane batches 64 in 23 ms."""
    profile = BatchProfile(max_batch=64, clock=Clock())
    profile.batch(4, 0.005)
    assert profile.rate(BUDGET) == pytest.approx(4 / 0.005)  # 4 in 5 ms: 800/s (busy: full at 200)
    profile.batch(1, 0.0045)  # a line through both: batches of 8 predicted, twice the largest seen
    assert profile.rate(BUDGET) == pytest.approx(8 / (0.0045 + (0.0005 / 3) * 7), rel=0.01)
    gpu_like(profile)
    assert profile.rate(BUDGET) > 2500  # 64 in ~23 ms: ~2,800/s, 14x the "busy" figure
    profile.lanes = 2  # two GPUs batching from one queue
    assert profile.rate(BUDGET) > 5000


def test_batches_over_half_the_budget_do_not_count():
    """A re-decode may wait for the batch in flight, then run in its own: the largest batch
    counted takes at most half the budget."""
    fixed, per_item = 0.010, 0.004  # 16 take 74 ms, under 75; 32 would not
    points = [(b, fixed + per_item * b) for b in (1, 16, 32)]
    assert rate_of(points, 64, BUDGET) == pytest.approx(16 / (fixed + 16 * per_item))


def test_noisy_batches_only_lower_the_figure():
    """Times taken on a CPU shared with other work (a size of 1 slower than one of 4 per item,
    a fixed part larger than the quickest batch): no line is trusted to predict larger batches,
    and none within half the budget: the best measured."""
    points = [(1, 0.13), (4, 0.32), (16, 0.30)]
    assert rate_of(points, 64, BUDGET) == pytest.approx(16 / 0.30)


def test_the_queues_age_is_recent_and_a_lane_behind_admits_no_one():
    clock = Clock()
    profile = BatchProfile(clock=clock)
    for size in (1, 8):
        profile.batch(size, 0.002 * size, waited_s=0.2)  # re-decodes waited 200 ms for a batch
    assert profile.queue_age() == pytest.approx(0.2, rel=0.1)  # over the 150 ms budget
    admission = LiveAdmission(0.4, BUDGET, clock=clock)
    assert admission.room(profile.rate(BUDGET), [], profile.queue_age()) == 0
    clock.t += 10 * BatchProfile.AGE_HALF_LIFE_S  # it caught up: the age falls back
    assert admission.room(profile.rate(BUDGET), [], profile.queue_age()) > 0


def test_a_worker_process_reports_what_an_api_process_reads():
    profile = BatchProfile(max_batch=64, lanes=1, clock=Clock())
    assert profile.report() == "" and report_rate("", BUDGET) is None
    gpu_like(profile)
    rate, age = report_rate(profile.report(), BUDGET)
    assert rate == pytest.approx(profile.rate(BUDGET)) and age == 0.0


def test_a_size_not_run_lately_no_longer_counts():
    """The lane's figure is what its batches cost now: a batch size measured while the machine
    was idle (16 re-decodes in 64 ms) stops counting once the lane has run for FRESH_S without
    it, under a load that makes one re-decode take 50 ms -- 20/s, not the idle 250/s. A lane
    gone quiet keeps the figures of its last busy seconds."""
    clock = Clock()
    profile = BatchProfile(max_batch=64, clock=clock)
    profile.batch(16, 0.064)
    profile.batch(1, 0.05)
    assert profile.rate(BUDGET) >= 250  # the idle size still counts (and predicts larger batches)
    clock.t += BatchProfile.FRESH_S + 1
    profile.batch(1, 0.05)
    assert profile.points() == [(1, pytest.approx(0.05))]
    assert profile.rate(BUDGET) == pytest.approx(20)
    rate, _ = report_rate(profile.report(), BUDGET)  # what a worker reports to the api processes
    assert rate == pytest.approx(20)
    clock.t += 600  # quiet for ten minutes: the last figures stand
    assert profile.rate(BUDGET) == pytest.approx(20)


# ---------------------------------------------------------------------------- the streams' demand
def talking(n: int, age: float = 20.0, share: float = 0.6) -> list[StreamLoad]:
    return [StreamLoad(age, share * age) for _ in range(n)]


def test_a_burst_is_admitted_up_to_the_predicted_capacity_not_a_fixed_few():
    """64 microphones open within one second on a lane measured at 200 re-decodes/s: each new
    stream is expected to ask 2.9 re-decodes per voiced second (a partial per 0.4 s, a final per
    2.5 s) x 0.6 voiced = 1.74/s, so 0.8 x 200 / 1.74 = 91 fit -- every one of the 64 is
    admitted at once (the guard for young streams let in 4), and no more than the 91."""
    clock = Clock()
    admission = LiveAdmission(0.4, BUDGET, share=0.8, clock=clock)
    assert admission.stream_cost([]) == pytest.approx((1 / 0.4 + 1 / 2.5) * 0.6)
    open_streams: list[StreamLoad] = []
    admitted = 0
    for _ in range(64):
        if admission.room(200.0, open_streams):
            open_streams.append(StreamLoad(0.0, 0.0))  # just opened: no speech yet
            admitted += 1
    assert admitted == 64
    while admission.room(200.0, open_streams):  # the rest of the capacity, then no more
        open_streams.append(StreamLoad(0.0, 0.0))
    assert len(open_streams) == int(0.8 * 200 / admission.stream_cost([])) == 91


def test_young_streams_are_counted_at_the_streams_mean_before_they_speak():
    """10 streams 20 s old speak 30 % of the time; 10 just opened have said nothing yet but are
    counted at 30 % too, not at nothing."""
    admission = LiveAdmission(0.4, BUDGET, clock=Clock())
    old = talking(10, share=0.3)
    young = [StreamLoad(0.5, 0.0)] * 10
    assert admission.demand(old + young) == pytest.approx(2 * admission.demand(old))
    assert admission.stream_cost(old) == pytest.approx(admission.k * 0.3)


def test_a_quiet_stream_costs_little_once_old_enough_to_show_it():
    admission = LiveAdmission(0.4, BUDGET, clock=Clock())
    quiet = [StreamLoad(30.0, 0.0)] * 10
    assert admission.demand(quiet) == pytest.approx(10 * admission.k * LiveAdmission.MIN_SHARE)


def test_the_cost_per_voiced_second_is_learned_from_the_lane():
    clock = Clock()
    admission = LiveAdmission(0.4, BUDGET, clock=clock)
    prior = admission.k
    assert prior == pytest.approx(1 / 0.4 + 1 / 2.5)
    for _ in range(50):  # 10 s: 1 s of speech and 2 re-decodes every 0.2 s
        clock.t += 0.2
        admission.voiced(1.0)
        admission.decoded(2)
    assert admission.learned and admission.k == pytest.approx(2.0, rel=0.05)
    clock.t += 1.0
    admission.decoded()  # a window with too little speech teaches nothing
    clock.t += LiveAdmission.LEARN_WINDOW_S
    admission.decoded()
    assert admission.k == pytest.approx(2.0, rel=0.05)


def test_the_distributed_rule_counts_the_other_api_processes_streams():
    """The same rule where the capacity is the workers' and other api processes hold streams:
    their demand leaves less room here."""
    admission = LiveAdmission(0.4, BUDGET, share=0.8, clock=Clock())
    streams = talking(10)
    alone = admission.room(1000.0, streams)
    assert admission.room(1000.0, streams, others=400.0) == alone - int(400 / admission.stream_cost(streams)) \
        or admission.room(1000.0, streams, others=400.0) == alone - int(400 / admission.stream_cost(streams)) - 1
    assert admission.room(1000.0, streams, others=800.0) == 0


def test_the_embedded_lane_reserves_by_the_same_arithmetic():
    local = LocalLaneCapacity(BatchProfile())
    assert not local.shared and local.others() == 0.0
    assert local.reserve(10.0, 10.0) and not local.reserve(10.5, 10.0)


# ---------------------------------------------------------------------------- the hub
def test_the_hub_admits_from_the_measured_capacity_and_refuses_past_it():
    """A hub whose lane is measured: streams are admitted while they fit (at once, none of them
    measured yet), and the refusal says what the lane batches (live_at_capacity)."""
    from pipeline.config import Settings
    from pipeline.domain.errors import LiveAtCapacity
    from pipeline.serving.live import LiveHub, LiveLimits
    from tests.test_stream import FakeService, health

    profile = BatchProfile(max_batch=64)
    profile.batch(1, 0.1)  # 10 re-decodes/s: 0.8 x 10 / (2.9 x 0.6) = 4.6 talking streams
    hub = LiveHub(Settings(), FakeService().decode_live, health(), limits=LiveLimits(),
                  capacity=LocalLaneCapacity(profile))

    async def go():
        async def emit(caption):
            pass

        held, refusal = [], ""
        try:
            for _ in range(20):
                cm = hub.stream(TranscribeOptions(), 16000, emit)
                held.append(await cm.__aenter__())
                held[-1].cm = cm
        except LiveAtCapacity as e:
            refusal = str(e)
        n = len(held)
        for s in held:
            s.abort()
            await s.cm.__aexit__(None, None, None)
        return n, refusal

    n, refusal = asyncio.run(go())
    expected = int(0.8 * 10 / (LiveAdmission(0.4, BUDGET).k * LiveAdmission.PRIOR_VOICED_SHARE))
    assert n == expected and "re-decodes/s" in refusal and "budget" in refusal


class _ProbedLane:
    """decode_live answered at once; records each re-decode's audio length, and as a worker
    would, times the probe's batch into the profile when the test says so."""

    def __init__(self):
        self.sizes: list[int] = []

    def decode_live(self, wave, options, final=False):
        from pipeline.model.engine import EngineOutput

        self.sizes.append(int(wave.shape[-1]))
        f: Future = Future()
        f.set_result(EngineOutput((), ""))
        return f


async def _open(hub, n: int) -> list:
    async def emit(caption):
        pass

    held = []
    for _ in range(n):
        cm = hub.stream(TranscribeOptions(), 16000, emit)
        held.append(await cm.__aenter__())
        held[-1].cm = cm
    return held


async def _close(held: list) -> None:
    for s in held:
        s.abort()
        await s.cm.__aexit__(None, None, None)


def test_a_cold_lane_is_probed_when_streams_come_not_calibrated_at_start_up():
    """No live batch has run: the first stream is admitted by the guard for young streams and
    the lane is probed with one batch of PROBE_SIZE re-decodes of PROBE_AUDIO_S (through the
    live lane, as a stream's are), once per PROBE_EVERY_S while no figure has come; once the
    lane has a figure, admission reads it and probes no more."""
    from pipeline.config import Settings
    from pipeline.serving.live import LiveHub, LiveLimits
    from tests.test_stream import health

    clock = Clock()
    profile = BatchProfile(max_batch=64, clock=clock)
    lane = _ProbedLane()
    hub = LiveHub(Settings(), lane.decode_live, health(), limits=LiveLimits(),
                  capacity=LocalLaneCapacity(profile), clock=clock)
    probe = [int(LiveHub.PROBE_AUDIO_S * 16000)] * LiveHub.PROBE_SIZE

    async def go():
        held = await _open(hub, 2)
        assert lane.sizes == probe  # the first admission probed; the second, 0 s later, did not
        clock.t += LiveHub.PROBE_EVERY_S
        held += await _open(hub, 1)
        assert lane.sizes == probe * 2  # still no figure: probed again
        profile.batch(LiveHub.PROBE_SIZE, LiveHub.PROBE_SIZE / 100)  # the worker timed the probe: 100/s
        clock.t += LiveHub.PROBE_EVERY_S
        held += await _open(hub, 20)  # 0.8 x 100 / 1.74 = 45 fit: the 20 at once, no probe
        assert lane.sizes == probe * 2
        await _close(held)

    asyncio.run(go())


# ---------------------------------------------------------------------------- gathered batches
def _live(n: int) -> WorkItem:
    return WorkItem(f"live-{n}", Lane.INTERACTIVE, TranscribeOptions(), 16000,
                    audio=torch.zeros(16000), reply=Future())


def test_dense_live_redecodes_wait_for_each_other_within_the_gathering_window():
    s = Scheduler(100, max_batch=64, max_wait_s=0.0, live_gather_s=0.2)
    s.put(_live(0))
    s.put(_live(1))  # dense: a gap under the window

    def later():
        time.sleep(0.02)
        for k in range(2, 6):
            s.put(_live(k))

    t = threading.Thread(target=later)
    t.start()
    batch = s.next_batch(1.0)
    t.join()
    assert len(batch) == 6  # gathered, not the two that were there


def test_without_a_window_or_on_a_lone_redecode_nothing_waits():
    s = Scheduler(100, max_batch=64, max_wait_s=0.0, live_gather_s=0.0)
    s.put(_live(0))
    s.put(_live(1))
    t0 = time.monotonic()
    assert len(s.next_batch(1.0)) == 2 and time.monotonic() - t0 < 0.15
    lone = Scheduler(100, max_batch=64, max_wait_s=0.0, live_gather_s=5.0)
    lone.put(_live(0))  # the first live arrival: no gap yet, nothing to wait for
    t0 = time.monotonic()
    assert len(lone.next_batch(1.0)) == 1 and time.monotonic() - t0 < 2.5


def test_a_worker_records_its_live_batches_for_admission():
    from pipeline.serving.worker import Worker
    from tests.engines import EngineDouble

    scheduler = Scheduler(100, max_batch=8, max_wait_s=0.0)
    worker = Worker("w", EngineDouble(), scheduler, store=None)
    items = [_live(k) for k in range(3)]
    worker._live_batch(items + [WorkItem("job", Lane.INTERACTIVE, TranscribeOptions(), 16000)],
                       0.012, time.monotonic())
    assert scheduler.live_batches.points() == [(3, 0.012)]
    assert scheduler.live_batches.take_sizes() == {3: 1}
