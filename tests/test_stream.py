"""Live captions (issue 14): the WebSocket API (pipeline/web/routes/stream.py) and its core
(pipeline/serving/live.py, pipeline/audio/stream_vad.py), against the real server on loopback with
the demo model and real speech (espeak-ng sentences with clear pauses between them), plus the
FunASR-compatible endpoint driven by a published FunASR client (``funasr-client`` on PyPI),
unchanged.

The demo model emits one "speech" per voiced run, so its text grows with the audio: partials grow,
and a final equals the offline job's segment exactly when both decode the same samples -- which
they do, because the live endpointer cuts where the offline splitter cuts (same silero windows,
same rules) and the server under test splits any upload over 1 s (``segment_threshold_s``).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
import wave
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets

from pipeline.audio.stream_vad import Closed, Dropped, Endpointer, EndpointRules
from pipeline.audio.vad import Segmenter, _merge
from pipeline.domain.errors import LiveOverloaded, NotReady, StreamTooLong, TooManyStreams
from pipeline.domain.types import TranscribeOptions
from pipeline.model.engine import EngineOutput
from pipeline.serving.live import AudioBuffer, LiveHub, LiveLimits
from pipeline.web.links import live_query
from pipeline.web.routes.stream import agreed_prefix, spaced
from tests.conftest import LiveServer, make_settings
from tests.media import convert, speech_wav, write_pcm_wav

TOKEN = "live-s3cret"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
SENTENCES = ("hello world, this is the first sentence of the test",
             "the second sentence comes after a clear pause",
             "and this is the last one")
LEAD_S, GAP_S = 0.5, 1.2  # silence before the sentences, and after each
RATE = 16000
FRAME = 3200  # bytes: 100 ms of 16 kHz PCM
IDLE_S = 1.5  # the test server's idle time-out
MAX_FRAME = 32768  # the test server's frame limit (the WebSocket layer refuses twice this)


# ---------------------------------------------------------------------------- media
@dataclass(frozen=True)
class Speech:
    path: Path
    pcm: bytes  # s16le mono 16 kHz
    spans: tuple[tuple[float, float], ...]  # where each sentence is voiced, seconds


def _voiced(x: np.ndarray) -> tuple[int, int]:
    """First and last sample of 10 ms frames above -40 dBFS."""
    frames = x[: len(x) // 160 * 160].astype(np.float64).reshape(-1, 160) / 32768
    loud = np.flatnonzero(np.sqrt((frames ** 2).mean(axis=1)) > 0.01)
    return int(loud[0]) * 160, int(loud[-1] + 1) * 160


@pytest.fixture(scope="session")
def speech(media_dir) -> Speech:
    """Three espeak-ng sentences with 1.2 s pauses between them, 16 kHz mono PCM."""
    parts, spans, pos = [np.zeros(int(LEAD_S * RATE), np.int16)], [], int(LEAD_S * RATE)
    for k, text in enumerate(SENTENCES):
        with wave.open(str(speech_wav(media_dir / f"live_sentence_{k}.wav", text=text))) as w:
            x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
        a, b = _voiced(x)
        spans.append(((pos + a) / RATE, (pos + b) / RATE))
        parts += [x, np.zeros(int(GAP_S * RATE), np.int16)]
        pos += len(x) + int(GAP_S * RATE)
    pcm = np.concatenate(parts)  # the last pause is the recording's tail
    path = write_pcm_wav(media_dir / "live_speech.wav", pcm, RATE)
    return Speech(path, pcm.astype("<i2").tobytes(), tuple(spans))


@pytest.fixture(scope="session")
def speech_48k(media_dir, speech) -> bytes:
    path = convert(speech.path, media_dir / "live_speech_48k.wav", rate=48000, channels=1,
                   extra=["-c:a", "pcm_s16le"])
    with wave.open(str(path)) as w:
        assert w.getframerate() == 48000
        return w.readframes(w.getnframes())


# ---------------------------------------------------------------------------- the server
@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    settings = make_settings(demo_dir, tmp_path_factory.mktemp("live"), ui=False, api_token=TOKEN,
                             segment_threshold_s=1.0, max_live_streams=2,
                             live_idle_timeout_s=IDLE_S, live_max_frame_bytes=MAX_FRAME)
    live = LiveServer(settings).start()
    yield live
    live.stop()


def ws_url(server, path: str = "/api/stream", query: str = "") -> str:
    return server.url.replace("http://", "ws://") + path + (f"?{query}" if query else "")


@dataclass
class Run:
    """What a client saw: each message with its arrival time (seconds after the first frame was
    sent, at ``started`` on the monotonic clock), when ``end`` was sent, how the server closed."""

    messages: list[tuple[float, dict]] = field(default_factory=list)
    started: float = 0.0
    end_sent: float | None = None
    close_code: int | None = None
    subprotocol: str | None = None

    def of(self, kind: str) -> list[dict]:
        return [m for _, m in self.messages if m.get("type") == kind]

    @property
    def error(self) -> dict | None:
        errors = self.of("error")
        return errors[0] if errors else None


async def _stream(url: str, pcm: bytes = b"", *, rate: int = RATE, speed: float | None = 1.0,
                  frame: int = FRAME, headers=AUTH, subprotocols=None, end: bool = True,
                  after_audio_s: float = 0.0, origin=None, timeout_s: float = 60) -> Run:
    run = Run()
    async with websockets.connect(url, additional_headers=headers, subprotocols=subprotocols,
                                  origin=origin, proxy=None, max_size=None) as ws:
        run.subprotocol = ws.subprotocol
        t0 = run.started = time.monotonic()

        async def read():
            try:
                async for message in ws:
                    run.messages.append((time.monotonic() - t0, json.loads(message)))
            except websockets.ConnectionClosed:
                pass

        reader = asyncio.create_task(read())
        try:
            for i in range(0, len(pcm), frame):
                await ws.send(pcm[i:i + frame])
                if speed:
                    due = t0 + (i + frame) / (2 * rate) / speed
                    await asyncio.sleep(max(0.0, due - time.monotonic()))
            await asyncio.sleep(after_audio_s)
            if end:
                run.end_sent = time.monotonic() - t0
                await ws.send(json.dumps({"type": "end"}))
        except websockets.ConnectionClosed:
            pass
        await asyncio.wait_for(reader, timeout_s)
        run.close_code = ws.close_code
    return run


def stream(url: str, pcm: bytes = b"", **kw) -> Run:
    return asyncio.run(_stream(url, pcm, **kw))


def offline_segments(server, path: Path) -> list[dict]:
    with open(path, "rb") as f:
        r = httpx.post(server.url + "/api/jobs", params={"wait": 60}, headers=AUTH,
                       files={"file": ("speech.wav", f)}, timeout=90)
    assert r.status_code == 200, r.text
    return r.json()["result"]["segments"]


def assert_finals_match_offline(finals: list[dict], offline: list[dict]) -> None:
    """The finals, one per pause-separated utterance, are the offline job's segments: the same
    spans and the same text, tags included."""
    assert [(f["start"], f["end"]) for f in finals] == [(s["start"], s["end"]) for s in offline]
    assert [f["segment"]["text"] for f in finals] == [s["text"] for s in offline]
    assert [(f["segment"]["language"], f["segment"]["emotion"], f["segment"]["events"])
            for f in finals] == [(s["language"], s["emotion"], s["events"]) for s in offline]


def assert_finals_cover(finals: list[dict], speech: Speech) -> None:
    assert len(finals) == len(speech.spans)
    for final, (a, b) in zip(finals, speech.spans):
        assert final["start"] <= a + 0.05 and final["end"] >= b - 0.05, (final, (a, b))
        assert final["text"] and final["reason"] == "pause"


# ---------------------------------------------------------------------------- streaming
def test_real_time_stream_gets_partials_then_finals_equal_to_the_offline_job(server, speech):
    run = stream(ws_url(server), speech.pcm, speed=1.0)
    assert run.close_code == 1000 and run.error is None
    finals, partials = run.of("final"), run.of("partial")
    assert_finals_cover(finals, speech)
    assert_finals_match_offline(finals, offline_segments(server, speech.path))
    # each utterance showed partials before its final, all before the end was sent
    kinds = [(t, m["type"], m["start"]) for t, m in run.messages]
    for final in finals:
        shown = [t for t, kind, start in kinds if kind == "partial" and start == final["start"]]
        settled = next(t for t, kind, start in kinds if kind == "final" and start == final["start"])
        assert shown and max(shown) < settled
    assert max(t for t, kind, _ in kinds if kind == "partial") < run.end_sent
    # partials grow, change every time, and come at most about every live_partial_interval_s
    for a, b in zip(partials, partials[1:]):
        if a["start"] == b["start"]:
            assert b["raw_text"] != a["raw_text"] and b["end"] > a["end"]
    audio_s = len(speech.pcm) / (2 * RATE)
    assert len(partials) <= audio_s / server.settings.live.partial_interval_s + 1
    assert partials[0]["segment"]["language"] == "en" and partials[0]["raw_text"].startswith("<|en|>")
    final = finals[0]
    assert final["segments"][0] == final["segment"] and final["segment"]["start"] == final["start"]


def test_four_times_real_time_with_odd_frames_gives_the_same_finals(server, speech):
    run = stream(ws_url(server), speech.pcm, speed=4.0, frame=1999)  # odd sizes: bytes carried
    assert run.close_code == 1000
    assert run.of("partial") and run.messages[0][0] < run.end_sent  # partials before the end
    finals = run.of("final")
    assert_finals_cover(finals, speech)
    assert_finals_match_offline(finals, offline_segments(server, speech.path))


def test_a_stream_takes_a_language_allow_list(server, speech):
    finals = stream(ws_url(server, query="languages=ko,yue"), speech.pcm, speed=None).of("final")
    assert finals and {f["segment"]["language"] for f in finals} <= {"ko", "yue"}


def test_other_sample_rates_are_resampled(server, speech, speech_48k):
    run = stream(ws_url(server, query="sample_rate=48000&language=en&use_itn=false"), speech_48k,
                 rate=48000, speed=None, frame=9600)
    assert run.close_code == 1000
    finals = run.of("final")
    assert_finals_cover(finals, speech)
    assert all(f["raw_text"].startswith("<|en|>") and f["segment"]["itn"] == "woitn" for f in finals)


def test_the_end_finalises_an_utterance_still_in_progress(server, speech):
    cut = int(speech.spans[0][1] * RATE) * 2 - 8000  # stop inside the first sentence
    run = stream(ws_url(server, query="word_timestamps=true"), speech.pcm[:cut], speed=None)
    assert run.close_code == 1000
    (final,) = run.of("final")
    assert final["reason"] == "end" and final["end"] == round(cut / 2 / RATE, 3)
    assert final["segment"]["words"] and final["segment"]["words"][0]["start"] >= final["start"]


def test_live_metrics_are_counted(server, speech):
    assert stream(ws_url(server), speech.pcm, speed=None).close_code == 1000
    body = httpx.get(server.url + "/metrics", headers=AUTH).text
    assert 'sensevoice_live_captions_total{kind="final"}' in body
    finals = [line for line in body.splitlines()
              if line.startswith('sensevoice_live_captions_total{kind="final"}')]
    assert float(finals[0].split()[-1]) >= 3
    assert "sensevoice_live_streams 0.0" in body
    assert 'sensevoice_live_decode_seconds_count{kind="partial"}' in body


# ---------------------------------------------------------------------------- FunASR
def test_funasr_client_unchanged(server, speech):
    """``funasr-client`` (PyPI, unchanged) transcribes the file and merges the 2pass-offline
    messages: they hold the finals' text. (Its asyncio API: the blocking one of 0.1.6 deadlocks on
    its own lock when it closes, whatever the server.)"""
    from funasr_client import async_file_asr

    native = stream(ws_url(server, query="word_timestamps=true"), speech.pcm, speed=None).of("final")
    words = [[round(w["start"] * 1000), round(w["end"] * 1000)]
             for f in native for w in f["segment"]["words"]]
    assert words
    for path in ("/api/stream/funasr", "/"):
        uri = ws_url(server, path, live_query(TOKEN))  # a client that cannot set headers
        merged = asyncio.run(async_file_asr(speech.path, uri, mode="2pass", svs_lang="en"))
        assert merged["text"] == " ".join(f["text"] for f in native)
        assert merged["wav_name"] == speech.path.name
        assert merged["timestamp"] == words  # FunASR's JSON strings of [start_ms, end_ms], decoded


def test_funasr_client_streaming_gets_online_text_that_only_appends(server, speech):
    """The same client fed at twice real time, as its microphone mode feeds it: 2pass-online
    messages while each utterance goes on (text to append, never taken back), then its
    2pass-offline message, and one last message with is_final once the input ended."""
    from funasr_client import async_funasr_client

    messages = []
    chunk = 19200  # 600 ms: the client's own stride for chunk_size (5, 10, 5)

    async def go():
        uri = ws_url(server, "/api/stream/funasr", live_query(TOKEN))
        async with async_funasr_client(uri, mode="2pass", wav_name="mic", audio_fs=RATE,
                                       hotwords={"sense": 20}, callback=messages.append) as client:
            t0 = time.monotonic()
            for i in range(0, len(speech.pcm), chunk):
                await client.send(speech.pcm[i:i + chunk])
                await asyncio.sleep(max(0.0, t0 + (i + chunk) / (2 * RATE) / 2 - time.monotonic()))

    asyncio.run(go())
    modes = [m["mode"] for m in messages]
    assert "2pass-online" in modes and modes.count("2pass-offline") == len(SENTENCES) + 1
    assert messages[-1]["is_final"] and messages[-1]["is_end"] and messages[-1]["text"] == ""
    assert not any(m["is_final"] for m in messages[:-1])
    online = ""
    for m in messages[:-1]:
        assert m["wav_name"] == "mic" and m["segment"]["language"] in ("en", "zh", "ja", "ko", "yue")
        if m["mode"] == "2pass-online":
            online += m["text"]
        else:  # the final settles what the online messages showed
            assert m["text"].strip().startswith(online.strip()), (online, m["text"])
            online = ""


def test_funasr_offline_mode_sends_finals_only(server, speech):
    from funasr_client import async_file_asr_stream

    async def go():
        uri = ws_url(server, "/api/stream/funasr", live_query(TOKEN))
        return [m async for m in async_file_asr_stream(speech.path, uri, mode="offline", itn=False)]

    messages = asyncio.run(go())
    assert {m["mode"] for m in messages} == {"offline"}
    assert len([m for m in messages if m["text"]]) == len(SENTENCES)
    assert all(m["segment"]["itn"] == "woitn" for m in messages if m["text"])


def test_funasr_svs_lang_takes_an_allow_list(server, speech):
    """``svs_lang`` as a comma text or a list is a language allow-list (issue 39): the English
    speech, detected 'en' when any language may be, is told among the allowed languages only;
    a lone language stays the prompt, as FunASR reads it."""
    from funasr_client import async_file_asr_stream

    async def go(svs_lang):
        uri = ws_url(server, "/api/stream/funasr", live_query(TOKEN))
        return [m async for m in async_file_asr_stream(speech.path, uri, mode="offline",
                                                       svs_lang=svs_lang)]

    def languages(messages) -> set[str]:
        found = {m["segment"]["language"] for m in messages if m["text"]}
        assert found
        return found

    assert languages(asyncio.run(go("auto"))) == {"en"}
    assert languages(asyncio.run(go("ko,yue"))) <= {"ko", "yue"}
    assert languages(asyncio.run(go(["ko", "yue"]))) <= {"ko", "yue"}
    assert languages(asyncio.run(go("ja"))) == {"ja"}


def test_funasr_errors_are_in_its_shape(server):
    async def go(first):
        async with websockets.connect(ws_url(server, "/api/stream/funasr"), additional_headers=AUTH,
                                      subprotocols=["binary"], proxy=None) as ws:
            assert ws.subprotocol == "binary"
            await ws.send(first)
            answer = json.loads(await ws.recv())
            with pytest.raises(websockets.ConnectionClosed):
                await ws.recv()
            return answer, ws.close_code

    answer, code = asyncio.run(go(json.dumps({"mode": "3pass", "is_speaking": True})))
    assert answer["code"] == "invalid_option" and answer["is_end"] and not answer["is_final"]
    assert "3pass" in answer["error"] and code == 1008
    answer, code = asyncio.run(go(json.dumps({"mode": "2pass", "wav_format": "mp3"})))
    assert answer["code"] == "invalid_option" and "PCM" in answer["error"]
    for svs_lang, words in ((["zh", "xx"], "unknown language 'xx'"), ("zh,xx", "unknown language 'xx'"),
                            ({"zh": 1}, "comma list"), ([3], "comma list")):
        answer, code = asyncio.run(go(json.dumps({"mode": "2pass", "svs_lang": svs_lang})))
        assert answer["code"] == "invalid_option" and words in answer["error"] and code == 1008


def test_a_model_failure_ends_the_stream_with_a_reason(server, speech, monkeypatch):
    def broken(wave, options, final=False):  # the live lane's signature
        future = Future()
        future.set_exception(RuntimeError("the device fell over"))
        return future

    monkeypatch.setattr(server.app.state.live_hub, "decode", broken)
    error = expect_error(stream(ws_url(server), speech.pcm, speed=None), "decode_failed", 1011)
    assert "the device fell over" in error["message"]


# ---------------------------------------------------------------------------- refusals
def expect_error(run: Run, code: str, close: int) -> dict:
    assert run.error is not None, run.messages
    assert run.error["code"] == code and run.error["message"], run.error
    assert run.close_code == close
    return run.error


@pytest.mark.parametrize("query,words", [
    ("sample_rate=44k", "whole number"), ("sample_rate=1000", "between"),
    ("language=klingon", "unknown language"), ("use_itn=maybe", "use_itn"),
    ("languages=zh,xx", "unknown language 'xx'"),
])  # fmt: skip
def test_bad_query_values_are_refused(server, query, words):
    error = expect_error(stream(ws_url(server, query=query)), "invalid_option", 1008)
    assert words in error["message"]


def test_the_api_token_is_required(server, speech):
    expect_error(stream(ws_url(server), headers=None), "unauthorized", 1008)
    expect_error(stream(ws_url(server), headers={"Authorization": "Bearer wrong"}), "unauthorized",
                 1008)
    expect_error(stream(ws_url(server, query="exp=9999999999&sig=forged"), headers=None),
                 "unauthorized", 1008)
    # a browser: the subprotocol, or a live link from the server's page
    run = stream(ws_url(server), headers=None, subprotocols=["sensevoice", f"bearer.{TOKEN}"])
    assert run.close_code == 1000 and run.subprotocol == "sensevoice"
    run = stream(ws_url(server, query=live_query(TOKEN)), headers=None)
    assert run.close_code == 1000
    expired = live_query(TOKEN, now=time.time() - 7200)
    # refused by name, and not counted as a failed sign-in (tests/test_expired_links.py)
    expect_error(stream(ws_url(server, query=expired), headers=None), "link_expired", 1008)


def test_a_page_of_another_site_cannot_open_a_stream(server):
    with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
        stream(ws_url(server), origin="http://evil.example")
    assert refused.value.response.status_code == 403
    assert b"cross_site_request" in refused.value.response.body
    with pytest.raises(websockets.exceptions.InvalidStatus):
        stream(ws_url(server), headers={**AUTH, "Sec-Fetch-Site": "cross-site"})
    run = stream(ws_url(server), origin=server.url)  # this server's own page
    assert run.close_code == 1000


def test_too_many_streams_are_refused_with_a_reason(server, speech):
    async def go():
        held = [await websockets.connect(ws_url(server), additional_headers=AUTH, proxy=None)
                for _ in range(2)]
        for ws in held:
            await ws.send(speech.pcm[:FRAME])
        await asyncio.sleep(0.2)
        third = await _stream(ws_url(server), speech.pcm[:FRAME], speed=None)
        for ws in held:
            await ws.send(json.dumps({"type": "end"}))
            await ws.wait_closed()
        after = await _stream(ws_url(server), speech.pcm[:FRAME], speed=None)
        return third, after

    def counted() -> tuple[float, float]:
        body = httpx.get(server.url + "/metrics", headers=AUTH).text
        values = dict(line.rsplit(" ", 1) for line in body.splitlines() if line.startswith(
            ("sensevoice_live_streams_admitted_total ",
             'sensevoice_live_streams_refused_total{code="too_many_streams"} ')))
        return (float(values["sensevoice_live_streams_admitted_total"]),
                float(values['sensevoice_live_streams_refused_total{code="too_many_streams"}']))

    admitted, refused = counted()
    third, after = asyncio.run(go())
    error = expect_error(third, "too_many_streams", 1013)
    assert "2 live streams" in error["message"]
    assert after.close_code == 1000
    assert counted() == (admitted + 3, refused + 1)  # the two held and the one after; the third


def test_idle_streams_are_finalised_and_closed(server, speech):
    t0 = time.monotonic()
    expect_error(stream(ws_url(server), end=False), "idle_timeout", 1008)
    assert IDLE_S <= time.monotonic() - t0 < IDLE_S + 3
    first = speech.pcm[:int(speech.spans[0][1] * RATE + 4000) * 2]  # the first sentence, no pause
    run = stream(ws_url(server), first, speed=None, end=False)
    expect_error(run, "idle_timeout", 1008)
    (final,) = run.of("final")  # what arrived was finalised before the error
    assert final["reason"] == "end" and final["text"]


def test_oversize_frames_and_garbage_text_frames_are_refused(server):
    error = expect_error(stream(ws_url(server), b"\0" * (MAX_FRAME + 2), frame=MAX_FRAME + 2,
                                speed=None), "frame_too_large", 1009)
    assert str(MAX_FRAME) in error["message"]
    run = stream(ws_url(server), b"\0" * (2 * MAX_FRAME + 2), frame=2 * MAX_FRAME + 2, speed=None)
    assert run.close_code == 1009 and run.error is None  # refused by the WebSocket layer itself

    async def text(frame: str) -> Run:
        run = Run()
        async with websockets.connect(ws_url(server), additional_headers=AUTH, proxy=None) as ws:
            await ws.send(frame)
            try:
                async for message in ws:
                    run.messages.append((0.0, json.loads(message)))
            except websockets.ConnectionClosed:
                pass
        run.close_code = ws.close_code
        return run

    for frame in ("hello", "[1, 2]", '{"type": "start"}', "{" * 5000):
        expect_error(asyncio.run(text(frame)), "invalid_message", 1003)


# ---------------------------------------------------------------------------- the core, alone
def health(state: str = "ready"):
    """A real Health of a process without workers, in ``state``."""
    from pipeline.config import Settings
    from pipeline.serving.health import Health

    h = Health(Settings(), None, None)
    h.state = state
    return h


def fake_hub(fake, limits, *, decode: bool = True, state: str = "ready") -> LiveHub:
    from pipeline.config import Settings

    return LiveHub(Settings(), fake.decode_live if decode else None, health(state), limits=limits)


class FakeService:
    """decode_live answered by a timer thread after ``delay`` s (never, with None); counts how
    many decodes of the stream were in flight at once."""

    def __init__(self, delay: float | None = 0.0):
        self.delay = delay
        self.futures: list[Future] = []
        self.most_in_flight = 0
        self.sizes: list[int] = []

    def decode_live(self, wave, options, final=False):
        future: Future = Future()
        self.futures.append(future)
        self.most_in_flight = max(self.most_in_flight, sum(not f.done() for f in self.futures))
        self.sizes.append(len(wave))
        if self.delay is not None:
            raw = f"<|en|><|NEUTRAL|><|Speech|><|withitn|>{len(wave)}"

            def answer():
                if future.set_running_or_notify_cancel():
                    future.set_result(EngineOutput((), raw))

            threading.Timer(self.delay, answer).start()
        return future


async def _session_run(service, limits: LiveLimits, pcm: bytes, speed: float | None,
                       frame: int = FRAME):
    hub = fake_hub(service, limits)
    captions = []

    async def emit(caption):
        captions.append(caption)

    async with hub.stream(TranscribeOptions(), RATE, emit) as session:
        t0 = time.monotonic()
        for i in range(0, len(pcm), frame):
            await session.feed(pcm[i:i + frame])
            if speed:
                await asyncio.sleep(max(0.0, t0 + (i + frame) / (2 * RATE) / speed - time.monotonic()))
        await session.end()
        return captions, session.stats


def test_a_stream_that_falls_behind_drops_partials_never_finals(speech):
    slow = FakeService(delay=0.6)  # each decode takes longer than the partial interval
    limits = LiveLimits(partial_interval_s=0.1)
    captions, stats = asyncio.run(_session_run(slow, limits, speech.pcm, 4.0))
    finals = [c for c in captions if c.final]
    assert len(finals) == len(SENTENCES)  # every final, in order
    assert [c.start for c in finals] == sorted(c.start for c in finals)
    assert slow.most_in_flight == 1  # one decode in flight per stream, never queued twice
    # far fewer partials than the interval allows: the ones in between were skipped
    assert stats.partials + stats.partials_dropped < (len(speech.pcm) / 2 / RATE / 4.0) / 0.1 / 2


def test_the_audio_a_stream_holds_is_bounded(speech):
    stuck = FakeService(delay=None)  # the model never answers
    limits = LiveLimits(max_utterance_s=2.0, max_buffered_s=1.0, idle_timeout_s=0.5)
    with pytest.raises(LiveOverloaded):
        asyncio.run(_session_run(stuck, limits, speech.pcm * 2, None))
    with pytest.raises(StreamTooLong):
        asyncio.run(_session_run(FakeService(), LiveLimits(max_stream_s=2.0), speech.pcm, None))
    with pytest.raises(NotReady, match="has not answered"):  # a dead worker ends the stream
        asyncio.run(_session_run(FakeService(delay=None), LiveLimits(decode_timeout_s=0.3),
                                 speech.pcm, None))


def test_long_utterances_are_cut(speech):
    voiced = speech.pcm[int(speech.spans[0][0] * RATE) * 2:int(speech.spans[0][1] * RATE) * 2]
    captions, _ = asyncio.run(_session_run(FakeService(), LiveLimits(max_utterance_s=2.0),
                                           voiced * 3, None, frame=16000))
    finals = [c for c in captions if c.final]
    assert len(finals) >= 3 and all(c.end - c.start <= 2.0 for c in finals)
    assert {c.reason for c in finals[:-1]} == {"limit"}
    assert all(a.end == b.start for a, b in zip(finals, finals[1:]))  # no audio lost or doubled


def test_one_client_cannot_take_every_live_slot():
    """Per client address at most max_streams_per_client streams (a second address still gets
    one); a slot comes back when its stream ends."""
    hub = fake_hub(FakeService(), LiveLimits(max_streams=10, max_streams_per_client=2))

    async def emit(caption):
        pass

    async def scenario():
        async with hub.stream(TranscribeOptions(), RATE, emit, "10.0.0.1"), \
                hub.stream(TranscribeOptions(), RATE, emit, "10.0.0.1"):
            with pytest.raises(TooManyStreams, match="this address holds 2"):
                async with hub.stream(TranscribeOptions(), RATE, emit, "10.0.0.1"):
                    pass
            async with hub.stream(TranscribeOptions(), RATE, emit, "10.0.0.2"):
                assert hub.open == 3
        async with hub.stream(TranscribeOptions(), RATE, emit, "10.0.0.1"):
            assert hub.open == 1
        assert hub.open == 0 and hub._by_client == {}

    asyncio.run(scenario())


def test_live_needs_a_process_holding_the_model():
    with pytest.raises(NotReady, match="role all"):
        fake_hub(FakeService(), LiveLimits(), decode=False).check_ready()
    with pytest.raises(NotReady, match="still loading"):
        fake_hub(FakeService(), LiveLimits(), state="loading").check_ready()
    fake_hub(FakeService(), LiveLimits()).check_ready()  # ready: no error


def test_endpointer_cuts_where_the_offline_splitter_cuts():
    """On the same probabilities the live endpointer closes exactly the offline spans."""
    seg = Segmenter()
    rng = np.random.default_rng(7)
    for trial in range(40):
        n_windows = int(rng.integers(50, 1500))
        # bursts of speech-like and silence-like probabilities of random lengths
        probs, speaking = [], bool(rng.integers(0, 2))
        while len(probs) < n_windows:
            run = int(rng.integers(1, 60))
            level = rng.uniform(0.6, 1.0, run) if speaking else rng.uniform(0.0, 0.45, run)
            probs += level.tolist()
            speaking = not speaking
        probs = np.array(probs[:n_windows], dtype=np.float32)
        n = n_windows * 512 - int(rng.integers(0, 512))
        offline = _merge(seg._regions(probs, n), 10 ** 9, seg.merge_gap_ms * 16)
        endpointer = Endpointer(EndpointRules.of(seg, max_utterance_s=10 ** 4), lambda lo, hi: lo)
        events = []
        for k in range(0, n_windows, 7):  # in frames of any size
            events += endpointer.push(probs[k:k + 7])
        events += endpointer.finish(n)
        live = [(e.start, e.end) for e in events if isinstance(e, Closed)]
        assert live == [(s.start, s.end) for s in offline], trial
        assert all(isinstance(e, (Closed, Dropped)) for e in events)


def test_audio_buffer_views_never_change():
    buf = AudioBuffer(capacity=4)
    buf.append(np.arange(3, dtype=np.float32))
    view = buf.view(1, 3)
    buf.append(np.arange(10, dtype=np.float32))  # grows: a new array
    assert view.tolist() == [1.0, 2.0] and buf.view(1, 3).tolist() == [1.0, 2.0]
    buf.append(np.arange(200_000, dtype=np.float32))
    kept = buf.view(170_000, 170_002).tolist()
    buf.trim(100)  # too little to copy for
    assert buf.base == 0
    buf.trim(170_000)
    assert buf.base == 170_000 and buf.view(170_000, 170_002).tolist() == kept
    assert view.tolist() == [1.0, 2.0]


def test_funasr_online_text_only_appends():
    assert agreed_prefix("hello wor", "hello world") == "hello "
    assert agreed_prefix("hello world", "hello world") == "hello world"
    assert agreed_prefix("hello world and", "hello word") == "hello "
    assert agreed_prefix("你好世", "你好世界") == "你好世"
    assert agreed_prefix("", "anything") == ""
    assert spaced("first one.", "Second") == " Second" and spaced("你好", "世界") == "世界"
    assert spaced("", "Hi") == "Hi" and spaced("a ", "b") == "b"


# ---------------------------------------------------------------------------- capacity and cadence
class _Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_the_lane_load_stretches_the_cadence_and_refuses_past_its_budget():
    from pipeline.serving.live import LaneLoad

    clock = _Clock()
    load = LaneLoad(interval_s=0.4, budget_s=0.3, clock=clock)
    assert load.cadence() == 0.4 and load.refusal(0) is None  # idle: as configured, admitted
    load.observe(0.05)
    assert load.cadence() == 0.4  # a quick lane keeps the configured cadence
    load.observe(0.15)
    assert load.cadence() == 0.4  # up to half the budget: as configured
    load.observe(0.225)  # the lane slows (three quarters of the budget): the latency rises at once
    assert load.latency() == pytest.approx(0.225)
    assert load.cadence() == pytest.approx(1.0)  # stretched in proportion: 0.4 * (1 + 3 * 0.5)
    assert load.refusal(10) is None  # under the budget: still admitted
    load.observe(0.35)
    assert load.cadence() == pytest.approx(1.6)  # at the budget: 4x
    assert "at capacity" in load.refusal(10)  # over the 300 ms budget: no new stream
    load.observe(5.0)
    assert load.cadence() == pytest.approx(1.6)  # stretched at most 4x
    clock.t += 20.0  # quiet for ten half-lives: back to idle
    assert load.latency() < 0.01 and load.cadence() == 0.4 and load.refusal(10) is None


def test_a_burst_of_new_streams_is_admitted_as_their_load_is_measured():
    from pipeline.serving.live import LaneLoad

    clock = _Clock()
    load = LaneLoad(interval_s=0.4, budget_s=0.3, clock=clock)

    def offer(n: int, open_streams: int) -> list[int]:
        tokens = []
        for _ in range(n):
            if load.refusal(open_streams + len(tokens)) is None:
                tokens.append(load.admitted())
        return tokens

    first = offer(1000, 0)  # 1,000 at the same instant: only a few before any load is seen
    assert len(first) == LaneLoad.NEW_STREAMS == 4
    clock.t += 1.0
    assert offer(1000, 4) == []  # a second later no more: their load is still unknown
    for token in first:
        load.measured(token)  # their first decodes came back, the lane idle: half of them more
    second = offer(1000, 4)
    assert len(second) == 4 + 4 // 2
    load.observe(0.15)  # half the budget: half the headroom
    for token in second:
        load.measured(token)
    assert len(offer(1000, 10)) == 7  # 10 measured: while fewer than 4 + 0.5 * 10 * 0.5 = 6.5 new
    clock.t += LaneLoad.NEW_WINDOW_S + 0.1  # those 7 stayed silent: they hold no one back
    assert load.new() == 0 and load.refusal(17) is None


def test_streams_that_come_and_go_do_not_hold_admission_back(server, speech):
    """A stream that ended before a decode of its own no longer counts as unmeasured: a client
    reconnecting often on a quiet server is never refused for it."""
    from pipeline.serving.live import LaneLoad

    hub = server.app.state.live_hub
    for _ in range(LaneLoad.NEW_STREAMS + 3):
        run = stream(ws_url(server), b"\0" * 3200, speed=None)
        assert run.error is None, run.error
    assert hub.load.new() == 0


def test_a_stream_refused_for_capacity_hears_it_and_the_refusal_is_counted(server, speech):
    hub = server.app.state.live_hub
    before = hub.metrics.refused.labels("live_at_capacity")._value.get()
    hub.load.observe(10.0)  # as if the lane had just taken 10 s per re-decode
    try:
        error = expect_error(stream(ws_url(server), speech.pcm[:32000], speed=None),
                             "live_at_capacity", 1013)
        assert "at capacity" in error["message"]
    finally:
        hub.load._latency = 0.0
    assert hub.metrics.refused.labels("live_at_capacity")._value.get() == before + 1


def test_partials_say_the_cadence_in_use(server, speech):
    run = stream(ws_url(server), speech.pcm, speed=4.0)
    partials = [m for m in run.of("partial") if m["text"]]
    assert partials and all(m["interval"] >= server.runtime.settings.live.partial_interval_s
                            for m in partials)
    assert all("interval" not in m for m in run.of("final"))


def test_a_stretched_cadence_thins_the_partials_after_an_utterances_first():
    """The stretch applies once the utterance has shown a partial: its first one waits only the
    configured interval, however busy the lane (speech start -> first partial is the target)."""
    import asyncio
    from types import SimpleNamespace

    from pipeline.audio.vad import WINDOW
    from pipeline.serving.live import LaneLoad, LiveSession

    load = LaneLoad(interval_s=0.4, budget_s=0.3, clock=_Clock())  # no decay between asserts
    load.observe(0.3)  # at the budget: 4x
    assert load.cadence() == pytest.approx(1.6, rel=0.01)

    async def due(last_partial):
        now = asyncio.get_running_loop().time()
        fake = SimpleNamespace(endpointer=SimpleNamespace(start=0, triggered=True, temp_end=0),
                               buffer=SimpleNamespace(end=10 * WINDOW), _partial_upto=0,
                               _partial_started=now - 0.5, _last_partial=last_partial,
                               limits=SimpleNamespace(partial_interval_s=0.4),
                               hub=SimpleNamespace(load=load))
        return LiveSession._partial_due_in(fake)

    assert asyncio.run(due(None)) == 0.0  # no partial shown yet: 0.5 s > 0.4 s, due now
    assert asyncio.run(due("<|en|>hello")) == pytest.approx(1.1, abs=0.05)  # then the stretch
