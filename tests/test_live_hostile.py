"""Live streams that hold a slot without using it (issue 36, row 6): 64 streams from 8 addresses,
each sending 20 ms every 10 s, held every slot for as long as tried -- nothing bounded a stream's
time open (only its audio), and a quiet stream kept its slot while others were refused.

Now a stream's time open is capped (``live_max_stream_wall_s``: ``stream_time_limit``, 1008, what
arrived finalised first); while every slot is held, a new stream takes the slot of a stream that
sent almost no speech over its last ``live_quiet_window_s`` (``quiet_stream_yielded``, 1013) -- a
quiet stream on a server with free slots is left alone; and the per-client limit may count an
IPv4 client by its network (``live_client_prefix_v4``)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from dataclasses import dataclass, field

import httpx
import pytest
import websockets

from pipeline.domain.errors import QuietStreamYielded, StreamTimeLimit, TooManyStreams
from pipeline.domain.types import TranscribeOptions
from pipeline.serving.admission import client_key
from pipeline.serving.live import LiveLimits, SpeechMeter
from tests.conftest import LiveServer, make_settings
from tests.test_stream import RATE, FakeService, _stream, fake_hub, speech  # noqa: F401 (the fixture)

TRICKLE = b"\0" * 640  # 20 ms of silence
SLOTS = 3
QUIET_WINDOW_S = 5.0  # long enough that the first newcomer comes while the tricklers are young
WALL_S = 3.0


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    settings = make_settings(demo_dir, tmp_path_factory.mktemp("hostile"), ui=False,
                             segment_threshold_s=1.0, max_live_streams=SLOTS,
                             max_live_streams_per_client=8, live_quiet_window_s=QUIET_WINDOW_S)
    live = LiveServer(settings).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def capped(demo_dir, tmp_path_factory):
    settings = make_settings(demo_dir, tmp_path_factory.mktemp("capped"), ui=False,
                             segment_threshold_s=1.0, live_max_stream_wall_s=WALL_S)
    live = LiveServer(settings).start()
    yield live
    live.stop()


def ws_url(server) -> str:
    return server.url.replace("http://", "ws://") + "/api/stream"


def live_streams(server) -> float:
    text = httpx.get(server.url + "/metrics", timeout=10).text
    return float(re.search(r"^sensevoice_live_streams ([0-9.e+]+)$", text, re.M).group(1))


@dataclass
class Trickle:
    """What a trickling client saw."""

    messages: list[dict] = field(default_factory=list)
    close_code: int | None = None
    closed_after: float | None = None  # seconds after it connected

    @property
    def error(self) -> dict | None:
        return next((m for m in self.messages if m.get("type") == "error"), None)


async def trickle(url: str, stop: asyncio.Event, every: float = 0.3, for_s: float = 120.0) -> Trickle:
    """20 ms of silence every ``every`` s (the attack's 20 ms every 10 s, quicker than the idle
    time-out), until the server closes the stream or ``stop`` is set or ``for_s`` has passed
    (then it ends it)."""
    out = Trickle()
    async with websockets.connect(url, proxy=None) as ws:
        t0 = time.monotonic()
        asyncio.get_running_loop().call_later(for_s, stop.set)

        async def read():
            try:
                async for message in ws:
                    out.messages.append(json.loads(message))
            except websockets.ConnectionClosed:
                pass

        reader = asyncio.create_task(read())
        try:
            while not stop.is_set() and not reader.done():
                await ws.send(TRICKLE)
                try:
                    await asyncio.wait_for(stop.wait(), every)
                except TimeoutError:
                    pass
            if not reader.done():
                await ws.send(json.dumps({"type": "end"}))
        except websockets.ConnectionClosed:
            pass
        await asyncio.wait_for(reader, 60)
        out.close_code, out.closed_after = ws.close_code, time.monotonic() - t0
    return out


async def open_tricklers(server, n: int, stop: asyncio.Event) -> list[asyncio.Task]:
    base = live_streams(server)
    tasks = [asyncio.create_task(trickle(ws_url(server), stop)) for _ in range(n)]
    deadline = time.monotonic() + 30
    while await asyncio.to_thread(live_streams, server) < base + n:
        assert time.monotonic() < deadline, "the tricklers never got their slots"
        assert not any(t.done() for t in tasks), [t.result() for t in tasks if t.done()]
        await asyncio.sleep(0.05)
    return tasks


async def newcomer(server):
    """A real client: one second of audio at real time, then the end."""
    return await _stream(ws_url(server), b"\0" * (2 * RATE), headers=None, timeout_s=60)


async def wait_idle(server) -> None:
    deadline = time.monotonic() + 30
    while await asyncio.to_thread(live_streams, server) > 0:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.1)


# ---------------------------------------------------------------------------- quiet streams
def test_a_quiet_stream_gives_its_slot_to_a_client_refused_for_capacity(server):
    async def scenario():
        stop = asyncio.Event()
        tasks = await open_tricklers(server, SLOTS, stop)
        opened = time.monotonic()
        first = await newcomer(server)  # every slot held by streams too young to judge
        assert time.monotonic() - opened < QUIET_WINDOW_S, "too slow to test the young streams"
        assert first.error is not None and first.error["code"] == "too_many_streams", first.messages
        assert first.close_code == 1013
        attempts, admitted = 1, None
        while admitted is None:  # the client retries, as a refused one does
            await asyncio.sleep(0.5)
            run = await newcomer(server)
            attempts += 1
            if run.error is None:
                admitted = run
            else:
                assert run.error["code"] == "too_many_streams", run.messages
                assert time.monotonic() - opened < QUIET_WINDOW_S + 30, "never admitted"
        waited = time.monotonic() - opened
        assert admitted.close_code == 1000
        stop.set()
        runs = await asyncio.gather(*tasks)
        await wait_idle(server)
        return runs, attempts, waited

    runs, attempts, waited = asyncio.run(scenario())
    print(f"admitted after {attempts} attempts, {waited:.1f} s after the slots filled")
    yielded = [r for r in runs if r.error is not None]
    assert len(yielded) == 1, [r.messages for r in runs]  # one slot was needed: one gave way
    assert yielded[0].error["code"] == "quiet_stream_yielded"
    assert yielded[0].close_code == 1013
    assert yielded[0].closed_after >= QUIET_WINDOW_S  # never before it was old enough to judge
    assert all(r.close_code == 1000 for r in runs if r is not yielded[0])  # the others ended as asked


def test_a_quiet_stream_keeps_its_slot_while_a_slot_is_free(server):
    async def scenario():
        stop = asyncio.Event()
        tasks = await open_tricklers(server, SLOTS - 1, stop)
        await asyncio.sleep(QUIET_WINDOW_S + 1.0)  # quiet by now
        run = await newcomer(server)  # takes the free slot
        stop.set()
        runs = await asyncio.gather(*tasks)
        await wait_idle(server)
        return run, runs

    run, runs = asyncio.run(scenario())
    assert run.close_code == 1000 and run.error is None, run.messages
    assert all(r.error is None and r.close_code == 1000 for r in runs), [r.messages for r in runs]


def test_the_client_holding_the_most_streams_gives_way_first_and_only_when_full():
    """Hub level, on the loop's clock: three quiet streams (two of one client), one newcomer."""
    limits = LiveLimits(max_streams=3, max_streams_per_client=8, quiet_window_s=0.2,
                        quiet_share=0.05)
    hub = fake_hub(FakeService(), limits)

    async def emit(caption):
        pass

    async def scenario():
        opts = TranscribeOptions()
        async with hub.stream(opts, RATE, emit, "10.0.0.1") as a, \
                hub.stream(opts, RATE, emit, "10.0.0.2") as b1, \
                hub.stream(opts, RATE, emit, "10.0.0.2") as b2:
            with pytest.raises(TooManyStreams, match="3 live streams are open"):  # all young
                async with hub.stream(opts, RATE, emit, "10.0.0.9"):
                    pass
            await asyncio.sleep(0.3)
            now = asyncio.get_running_loop().time()
            a.speech.add(0.005, now)  # quiet: under 5 % of 0.2 s
            b1.speech.add(0.001, now)
            b2.speech.add(0.0, now)
            async with hub.stream(opts, RATE, emit, "10.0.0.9") as c:
                assert hub.open == 4  # the one giving way holds no slot any more
                stopped = [s for s in (a, b1, b2) if s.stop_due(now) is not None]
                assert stopped == [b2]  # of the client with two, the one that spoke least
                assert isinstance(b2.stop_due(now), QuietStreamYielded)
                assert c.stop_due(now) is None
                b1.speech.add(0.5, now)  # speaking now: not quiet
            assert a.stop_due(now) is None and b1.stop_due(now) is None

    asyncio.run(scenario())
    assert hub.open == 0 and hub._sessions == set() and hub._yielding == set()


def test_a_stream_that_speaks_is_not_quiet():
    meter = SpeechMeter(window_s=60.0)
    for t in range(0, 120, 10):  # 20 ms every 10 s, all voiced: 0.12 s a minute
        meter.add(0.02, 1000.0 + t)
    assert meter.voiced(1120.0) == pytest.approx(0.12)
    for k in range(100):  # then 10 s of speech over the next 10 s
        meter.add(0.1, 1120.0 + k * 0.1)
    assert meter.voiced(1130.0) == pytest.approx(10.0 + 0.1, abs=0.05)
    assert meter.voiced(1200.0) == pytest.approx(0.0)  # a minute later it is all forgotten


# ---------------------------------------------------------------------------- the time limit
def test_a_trickling_stream_is_closed_at_its_time_limit(capped):
    async def scenario():
        return await trickle(ws_url(capped), asyncio.Event(), for_s=WALL_S + 20)

    run = asyncio.run(scenario())
    assert run.error is not None and run.error["code"] == "stream_time_limit", run.messages
    assert "at most 3 s" in run.error["message"]
    assert run.close_code == 1008
    assert WALL_S <= run.closed_after < WALL_S + 15  # the trickle never reaches the audio limit


def test_the_time_limit_finalises_what_arrived_first(capped, speech):
    run = asyncio.run(_stream(ws_url(capped), speech.pcm, headers=None, timeout_s=60))
    assert run.error is not None and run.error["code"] == "stream_time_limit", run.messages
    assert run.close_code == 1008
    finals = run.of("final")
    kinds = [m["type"] for _, m in run.messages]
    assert finals and kinds.index("error") > kinds.index("final")  # the first sentence, settled
    assert finals[-1]["end"] <= WALL_S + 1.0  # nothing after the limit was taken


def test_a_stream_past_its_time_limit_is_due_to_stop():
    limits = LiveLimits(max_stream_wall_s=7200.0)
    hub = fake_hub(FakeService(), limits)

    async def emit(caption):
        pass

    async def scenario():
        async with hub.stream(TranscribeOptions(), RATE, emit, "10.0.0.1") as s:
            assert s.stop_due(s.opened + 7199.0) is None
            error = s.stop_due(s.opened + 7200.0)
            assert isinstance(error, StreamTimeLimit) and "at most 2 h" in error.message

    asyncio.run(scenario())


# ---------------------------------------------------------------------------- clients by network
def test_client_keys_by_prefix():
    assert client_key("192.0.2.7") == "192.0.2.7"
    assert client_key("192.0.2.7", 24) == client_key("192.0.2.200", 24) == "192.0.2.0/24"
    assert client_key("192.0.3.7", 24) != client_key("192.0.2.7", 24)
    assert client_key("::ffff:192.0.2.7", 24) == "192.0.2.0/24"  # a dual-stack socket's v4 peer
    assert client_key("2001:db8:1:2::1", 32, 64) == client_key("2001:db8:1:2:ffff::9", 32, 64)
    assert client_key("2001:db8:1:3::1", 32, 64) != client_key("2001:db8:1:2::1", 32, 64)
    assert client_key("2001:db8::1", 32, 128) == "2001:db8::1"
    assert client_key("fe80::1%eth0", 32, 64) == "fe80::/64"
    for odd in ("", "testclient", "not an address", "999.1.1.1"):
        assert client_key(odd, 24, 64) == odd  # not an address: its own key


def test_two_addresses_of_one_network_are_one_client_when_counted_by_it():
    async def emit(caption):
        pass

    async def scenario(prefix: int) -> bool:
        hub = fake_hub(FakeService(), LiveLimits(max_streams=10, max_streams_per_client=1,
                                                 client_prefix_v4=prefix))
        async with hub.stream(TranscribeOptions(), RATE, emit, "10.0.0.1"):
            try:
                async with hub.stream(TranscribeOptions(), RATE, emit, "10.0.0.2"):
                    return True
            except TooManyStreams as e:
                assert "this network (10.0.0.0/24) holds 1" in e.message
                return False

    assert asyncio.run(scenario(32)) is True
    assert asyncio.run(scenario(24)) is False
