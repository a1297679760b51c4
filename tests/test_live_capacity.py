"""Issue 22's CPU capacity work, each part alone on fake clocks (no sleeps, no timing asserts):
admission from a per-stream cost (the lane's busy share per stream, learned from the streams
old enough to carry their load), finals ahead of partials in the scheduler (alone in their batch
on a CPU), a running partial no longer awaited once its utterance's final is due, no re-decode
when nothing was voiced since the last partial, and the speech scorer's gathered rounds."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import Future
from types import SimpleNamespace

import pytest
import torch

from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.model.engine import EngineOutput
from pipeline.serving.live import LaneLoad, LiveLimits
from pipeline.serving.scheduler import LIVE_FINAL_RANK, LIVE_RANK, Scheduler, WorkItem
from tests.test_stream import FRAME, RATE, FakeService, fake_hub, speech  # noqa: F401 (the fixture)


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def _hold_busy(load: LaneLoad, clock: Clock, share: float, seconds: float, step: float = 0.1) -> None:
    """The lane has a re-decode in hand ``share`` of each ``step`` for ``seconds``."""
    for _ in range(round(seconds / step)):
        load.begin()
        clock.t += share * step
        load.end()
        clock.t += (1 - share) * step


# ---------------------------------------------------------------------------- the cost model
def test_the_busy_share_follows_the_lane_and_falls_back_when_it_goes_quiet():
    clock = Clock()
    load = LaneLoad(interval_s=0.4, budget_s=0.15, clock=clock)
    assert load.busy() == 0.0
    _hold_busy(load, clock, 0.5, 20.0)  # many time constants: the average has settled
    assert load.busy() == pytest.approx(0.5, abs=0.05)
    clock.t += 10 * LaneLoad.BUSY_TAU_S
    assert load.busy() < 0.01


def test_admission_predicts_the_load_of_young_streams_before_it_arrives():
    """10 streams old enough to carry their load keep the lane 30 % busy: 3 % each. Streams
    just admitted bring nothing yet, but each is counted at 3 %: the lane is full at 20
    streams (60 %), whatever their load shows now."""
    clock = Clock()
    load = LaneLoad(interval_s=0.4, budget_s=0.15, clock=clock)
    tokens = [load.admitted() for _ in range(10)]
    for t in tokens:
        load.measured(t)
    clock.t += LaneLoad.RAMP_S
    _hold_busy(load, clock, 0.3, 15.0)
    assert load.stream_cost() == pytest.approx(0.03, rel=0.15)
    admitted = 10
    while load.refusal(admitted) is None and admitted < 100:
        load.measured(load.admitted())  # measured at once: the burst guard is not what stops it
        admitted += 1
    assert 17 <= admitted <= 21  # the lane busy 30 % now: the young ones are predicted
    assert "expected to keep the model" in load.refusal(admitted)
    assert load.busy() < 0.35  # the refusal came before their load did


def test_the_learned_cost_rises_at_once_and_is_forgotten_slowly():
    clock = Clock()
    load = LaneLoad(interval_s=0.4, budget_s=0.15, clock=clock)
    tokens = [load.admitted() for _ in range(10)]
    clock.t += LaneLoad.RAMP_S
    _hold_busy(load, clock, 0.4, 15.0)
    peak = load.stream_cost()
    assert peak == pytest.approx(0.04, rel=0.15)
    _hold_busy(load, clock, 0.0, 3.0)  # a lull: nobody speaks for 3 s
    assert load.stream_cost() > 0.8 * peak  # remembered: the streams open will speak again
    clock.t += 10 * LaneLoad.COST_HALF_LIFE_S
    assert load.stream_cost() < 0.01 * peak
    for t in tokens:
        load.ended(t)
    assert load.predicted() == pytest.approx(load.busy() + load.stream_cost())


def test_streams_just_admitted_do_not_teach_the_cost():
    """A stream's load is expected to grow over its first RAMP_S: streams a second old carry a
    quarter of theirs, too little to learn a cost from; the burst guard holds the door."""
    clock = Clock()
    load = LaneLoad(interval_s=0.4, budget_s=0.15, clock=clock)
    for _ in range(3):
        load.admitted()
    _hold_busy(load, clock, 0.5, 1.0)
    assert load.stream_cost() == 0.0


def test_the_cadence_stretches_with_the_busy_share_too():
    clock = Clock()
    load = LaneLoad(interval_s=0.4, budget_s=0.15, clock=clock)
    _hold_busy(load, clock, 0.2, 20.0)  # a third of the target: as configured
    assert load.cadence() == pytest.approx(0.4)
    _hold_busy(load, clock, LaneLoad.TARGET_BUSY, 20.0)  # at the target: stretched (to ~4x)
    assert load.cadence() > 1.2


# ---------------------------------------------------------------------------- the scheduler
def _live(n: int, final: bool = False) -> WorkItem:
    return WorkItem(f"live-{n}-{final}", Lane.INTERACTIVE, TranscribeOptions(), 16000,
                    audio=torch.zeros(16000), reply=Future(), final=final)


def test_finals_go_before_partials_queued_earlier():
    s = Scheduler(100, max_batch=1)
    s.put(_live(1))
    s.put(_live(2))
    s.put(_live(3, final=True))
    assert _live(3, final=True).rank == LIVE_FINAL_RANK < _live(1).rank == LIVE_RANK
    assert [i.job_id for i in s.next_batch(0)] == ["live-3-True"]
    assert [i.job_id for i in s.next_batch(0)] == ["live-1-False"]


@pytest.mark.parametrize("alone", [True, False])
def test_on_a_cpu_a_batch_of_finals_takes_no_partials(alone):
    s = Scheduler(100, max_batch=8, max_wait_s=0.0, finals_alone=alone)
    for n in range(4):
        s.put(_live(n))
    s.put(_live(8, final=True))
    s.put(_live(9, final=True))
    first = s.next_batch(0)
    assert {i.job_id for i in first[:2]} == {"live-8-True", "live-9-True"}
    assert len(first) == (2 if alone else 6)
    if alone:
        assert len(s.next_batch(0)) == 4  # the partials: the next batch, together


# ---------------------------------------------------------------------------- the session
def _due(temp_end: int, partial_upto: int, end: int) -> float | None:
    from pipeline.serving.live import LiveSession

    load = LaneLoad(interval_s=0.4, budget_s=0.3, clock=Clock())

    async def go():
        now = asyncio.get_running_loop().time()
        fake = SimpleNamespace(endpointer=SimpleNamespace(start=0, triggered=True, temp_end=temp_end),
                               buffer=SimpleNamespace(end=end), _partial_upto=partial_upto,
                               _partial_started=now - 1.0, _last_partial="<|en|>hi",
                               limits=SimpleNamespace(partial_interval_s=0.4),
                               hub=SimpleNamespace(load=load))
        return LiveSession._partial_due_in(fake)

    return asyncio.run(go())


def test_no_partial_when_nothing_was_voiced_since_the_last_one():
    from pipeline.audio.vad import WINDOW

    assert _due(temp_end=0, partial_upto=10 * WINDOW, end=20 * WINDOW) == 0.0  # still speaking
    assert _due(temp_end=12 * WINDOW, partial_upto=10 * WINDOW, end=20 * WINDOW) == 0.0  # spoke on
    assert _due(temp_end=8 * WINDOW, partial_upto=10 * WINDOW, end=20 * WINDOW) is None  # silence


class _RunningLane:
    """decode_live whose futures start running at once (as a worker's batch does): finals are
    answered at once, partials only when the test says so; records what was submitted. A final
    is told from a partial by its options (the session asks finals with word timestamps, its
    partials without); ``urgent`` records which were queued as finals are (final=True)."""

    def __init__(self):
        self.calls: list[tuple[bool, Future]] = []  # (a final, its future)
        self.urgent: list[bool] = []

    def decode_live(self, wave, options, final=False):
        f: Future = Future()
        f.set_running_or_notify_cancel()
        self.calls.append((options.word_timestamps, f))
        self.urgent.append(final)
        if options.word_timestamps:
            f.set_result(EngineOutput((), "<|en|><|NEUTRAL|><|Speech|><|withitn|>words"))
        return f


def test_a_final_is_queued_without_waiting_for_its_utterances_running_partial(speech):
    """The partial's batch is still running when the pause closes the utterance: the final is
    submitted at once, not after that batch comes back (it may never, here)."""
    lane = _RunningLane()
    hub = fake_hub(lane, LiveLimits())
    captions = []

    async def emit(caption):
        captions.append(caption)

    async def go():
        first = speech.pcm[:int((speech.spans[0][1] + 1.0) * RATE) * 2]  # a sentence, a pause
        async with hub.stream(TranscribeOptions(word_timestamps=True), RATE, emit) as session:
            for i in range(0, len(first), FRAME):
                await session.feed(first[i:i + FRAME])
                await asyncio.sleep(0)  # the driver's turn
            for _ in range(200):  # the final's caption, once the driver got to it
                if any(c.final for c in captions):
                    break
                await asyncio.sleep(0.01)
            partials = [f for final, f in lane.calls if not final]
            assert partials and not partials[0].done()  # the partial's batch is still running
            session.abort()
            for f in partials:
                f.set_result(EngineOutput((), ""))

    asyncio.run(go())
    assert [c.final for c in captions] == [True] and captions[0].reason == "pause"
    kinds = [final for final, _ in lane.calls]
    assert kinds.index(True) > 0 and kinds.count(True) == 1
    assert lane.urgent[kinds.index(True)]  # the final is queued ahead of partials


def test_an_utterances_first_partial_is_queued_as_a_final_is_and_the_later_ones_are_not(speech):
    """What a person waits for is the caption appearing: an utterance's first partial goes
    ahead of the partials of other streams' utterances (final=True: the live lane's top rank,
    and through Redis a request of the final kind), the partials refining it do not; after a
    final, the next utterance's first partial is urgent again."""
    service = FakeService(delay=0.0)
    asked: list[tuple[bool, bool]] = []  # (a final, queued as one)
    decode = service.decode_live

    def recording(wave, options, final=False):
        asked.append((options.word_timestamps, final))
        return decode(wave, options, final=final)

    service.decode_live = recording
    hub = fake_hub(service, LiveLimits(partial_interval_s=0.1))

    async def go():
        async def emit(caption):
            pass

        async with hub.stream(TranscribeOptions(word_timestamps=True), RATE, emit) as session:
            t0 = time.monotonic()
            for i in range(0, len(speech.pcm), FRAME):
                await session.feed(speech.pcm[i:i + FRAME])
                await asyncio.sleep(max(0.0, t0 + (i + FRAME) / (2 * RATE) / 4 - time.monotonic()))
            await session.end()

    asyncio.run(go())
    finals = [k for k, (final, _) in enumerate(asked) if final]
    assert len(finals) == len(speech.spans)  # one final per sentence
    assert all(asked[k][1] for k in finals)  # finals are urgent
    runs, run = [], []  # each utterance's partials, in the order asked
    for final, urgent in asked:
        if final:
            runs.append(run)
            run = []
        else:
            run.append(urgent)
    assert len(runs) == len(speech.spans) and all(len(r) >= 2 for r in runs)
    assert all(r == [True] + [False] * (len(r) - 1) for r in runs)


# ---------------------------------------------------------------------------- the scorer
def test_the_scorer_gathers_a_round_only_while_many_streams_are_open():
    from pipeline.audio.stream_vad import GATHER_STREAMS, StreamScorer

    clock = Clock()
    scorer = StreamScorer(clock=clock, gather_s=0.02)
    scorer._first_at = clock.t
    scorer._queues = {object(): None}  # one stream's frame waits
    assert scorer.gather_wait() == 0.0  # a lone stream is never held back
    scorer._seen = {k: clock.t for k in range(GATHER_STREAMS)}  # many scored lately
    assert scorer.gather_wait() == pytest.approx(0.02)
    clock.t += 0.015
    assert scorer.gather_wait() == pytest.approx(0.005)
    scorer._queues = {k: None for k in range(GATHER_STREAMS)}  # every one of them is here
    assert scorer.gather_wait() == 0.0
    scorer._queues = {object(): None}
    clock.t += 0.01
    assert scorer.gather_wait() == 0.0  # waited long enough


def test_a_scorer_with_many_streams_scores_them_in_fewer_calls(speech):
    """16 streams' frames arriving one by one are scored in fewer silero calls than one per
    window per stream, and each stream gets the probabilities it gets alone."""
    from pipeline.audio.stream_vad import StreamAudio, StreamScorer

    silence, frame = b"\0" * FRAME, speech.pcm[16000:16000 + FRAME]
    alone, audio = StreamScorer(gather_s=0.0), StreamAudio(RATE)
    alone.score(audio, silence).result(timeout=60)
    expected = alone.score(audio, frame).result(timeout=60).probs
    gathered = StreamScorer(gather_s=0.05)
    streams = [StreamAudio(RATE) for _ in range(16)]
    for audio in streams:  # each scored once: the scorer now knows 16 streams
        gathered.score(audio, silence).result(timeout=60)
    calls = gathered.calls
    futures = [gathered.score(audio, frame) for audio in streams]
    probs = [f.result(timeout=60).probs for f in futures]
    assert gathered.calls - calls < 16 * len(expected)  # not one call per window per stream
    for p in probs:
        assert p.tolist() == pytest.approx(expected.tolist(), abs=1e-4)


def test_the_busy_share_is_the_models_compute_where_the_process_has_it():
    """In-process workers report the seconds their batches took: the busy share is that over
    the wall clock, not the time a re-decode is in hand (hand-overs are not the model's)."""
    clock = Clock()
    computed = [0.0]
    load = LaneLoad(interval_s=0.4, budget_s=0.15, clock=clock, busy_seconds=lambda: computed[0])
    for _ in range(200):  # a re-decode in hand 80 % of the time, the model computing 20 %
        load.begin()
        clock.t += 0.08
        computed[0] += 0.02
        load.end()
        clock.t += 0.02
    assert load.busy() == pytest.approx(0.2, abs=0.03)


def test_the_busy_target_is_a_setting(monkeypatch):
    """SENSEVOICE_LIVE_TARGET_BUSY reaches the lane's admission (and is bounded)."""
    from pipeline.config import Settings
    from pipeline.serving.live import LiveLimits

    monkeypatch.setenv("SENSEVOICE_LIVE_TARGET_BUSY", "0.8")
    limits = LiveLimits.from_settings(Settings())
    assert limits.target_busy == 0.8
    assert LaneLoad(0.4, 0.15, target_busy=limits.target_busy).TARGET_BUSY == 0.8
    monkeypatch.setenv("SENSEVOICE_LIVE_TARGET_BUSY", "1.5")
    with pytest.raises(Exception, match="target_busy"):
        Settings()


def test_the_cost_follows_a_busy_lane_down_as_batching_makes_streams_cheaper():
    """10 streams keep the lane 40 % busy (4 % each); 30 streams keep it 60 % busy (2 % each,
    batched): the cost learned from the first ten must not hold the thirty's figure at 4 %, or
    admission stops at ~15 streams where the lane serves 30."""
    clock = Clock()
    load = LaneLoad(interval_s=0.4, budget_s=0.15, clock=clock)
    tokens = [load.admitted() for _ in range(10)]
    clock.t += LaneLoad.RAMP_S
    _hold_busy(load, clock, 0.4, 15.0)
    assert load.stream_cost() == pytest.approx(0.04, rel=0.15)
    tokens += [load.admitted() for _ in range(20)]
    clock.t += LaneLoad.RAMP_S
    _hold_busy(load, clock, 0.6, 15.0)
    assert load.stream_cost() == pytest.approx(0.02, rel=0.15)
    _hold_busy(load, clock, 0.0, 3.0)  # a lull: the cost only fades
    assert load.stream_cost() > 0.8 * 0.02


def test_an_api_process_reads_the_workers_busy_share_as_model_seconds():
    """ClusterBusy: the mean of the live workers' reported shares, integrated over time (read by
    its own thread: the event loop never waits on Redis); no report reads as idle."""
    from pipeline.serving.live_redis import ClusterBusy

    now, shares = [0.0], [[]]
    busy = ClusterBusy(lambda: shares[0], clock=lambda: now[0])
    busy._thread = object()  # no reading thread: the test steps it
    busy.update()
    now[0] = 2.0
    assert busy() == 0.0
    shares[0] = [0.2, 0.6]
    busy.update()
    now[0] = 4.0
    assert busy() == pytest.approx(0.8)  # 2 s at a mean share of 0.4
    busy.shares = lambda: (_ for _ in ()).throw(ConnectionError("redis down"))
    busy.update()  # keeps the last share
    now[0] = 5.0
    assert busy() == pytest.approx(1.2)


def test_the_busy_reader_thread_stops_with_the_runtime():
    from pipeline.serving.live_redis import ClusterBusy

    reads = []
    busy = ClusterBusy(lambda: reads.append(1) or [0.5])
    busy.READ_EVERY_S = 0.01
    busy()  # the first read starts the thread
    deadline = time.monotonic() + 10
    while len(reads) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    busy.stop()
    busy._thread.join(5)
    assert len(reads) >= 3 and not busy._thread.is_alive()
