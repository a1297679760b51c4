"""OpenAI's realtime transcription face (issue 38; pipeline/web/routes/realtime.py over the live
sessions of pipeline/serving/live.py), driven by the official ``openai`` package's realtime API,
unchanged, against the real server on loopback with the demo model and real speech (espeak-ng
sentences with clear pauses, tests/test_stream.py's), streamed at OpenAI's 24 kHz in real time
and faster: deltas, then each utterance completed with its transcript and SenseVoice's tags in
fields of their own; and the refusals (a wrong token, capacity, malformed events, oversized
frames)."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import wave

import pytest
import websockets
from openai import AsyncOpenAI

from pipeline.domain.errors import FrameTooLarge
from pipeline.web.realtime_events import OPENAI_RATE_HZ, EventError, SessionConfig, parse_client_event
from tests.conftest import LiveServer, make_settings
from tests.media import convert
from tests.test_stream import TOKEN as TEST_STREAM_TOKEN
from tests.test_stream import SENTENCES, offline_segments, speech  # noqa: F401 (the fixture)

TOKEN = TEST_STREAM_TOKEN  # offline_segments signs in with it
AUTH = {"Authorization": f"Bearer {TOKEN}"}
MAX_FRAME = 32768  # the test server's frame limit (bytes of audio in one append)
CHUNK = OPENAI_RATE_HZ // 10 * 2  # 100 ms of 24 kHz PCM16


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    settings = make_settings(demo_dir, tmp_path_factory.mktemp("realtime"), ui=False,
                             api_token=TOKEN, segment_threshold_s=1.0, max_live_streams=2,
                             live_idle_timeout_s=5.0, live_max_frame_bytes=MAX_FRAME)
    live = LiveServer(settings).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def speech_24k(media_dir, speech) -> bytes:  # noqa: F811
    path = convert(speech.path, media_dir / "live_speech_24k.wav", rate=OPENAI_RATE_HZ, channels=1,
                   extra=["-c:a", "pcm_s16le"])
    with wave.open(str(path)) as w:
        assert w.getframerate() == OPENAI_RATE_HZ
        return w.readframes(w.getnframes())


def openai_client(server, token: str = TOKEN, **kw) -> AsyncOpenAI:
    return AsyncOpenAI(api_key=token, base_url=server.url + "/v1", max_retries=0, **kw)


GA_SESSION = {"type": "transcription",
              "audio": {"input": {"format": {"type": "audio/pcm", "rate": OPENAI_RATE_HZ},
                                  "transcription": {"model": "gpt-4o-transcribe", "language": "en"},
                                  "turn_detection": {"type": "server_vad"}}}}


async def _transcribe(conn, pcm: bytes, speed: float | None, utterances: int,
                      commit: bool = False, timeout_s: float = 90) -> list:
    """Stream ``pcm`` (24 kHz) through ``conn`` at ``speed`` x real time; every event received
    until ``utterances`` items are completed, each with its arrival time."""
    events: list = []
    t0 = time.monotonic()

    async def send():
        for i in range(0, len(pcm), CHUNK):
            await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + CHUNK]).decode())
            if speed:
                await asyncio.sleep(max(0.0, t0 + (i + CHUNK) / (2 * OPENAI_RATE_HZ) / speed
                                        - time.monotonic()))
        if commit:
            await conn.input_audio_buffer.commit()

    sender = asyncio.create_task(send())

    async def receive():
        done = 0
        async for event in conn:
            events.append((time.monotonic() - t0, event))
            if event.type == "conversation.item.input_audio_transcription.completed":
                done += 1
                if done == utterances:
                    return

    await asyncio.wait_for(receive(), timeout_s)
    await sender
    return events


def _of(events, kind: str) -> list:
    return [e for _, e in events if e.type == kind]


# ---------------------------------------------------------------------------- the official client
def test_the_official_client_transcribes_a_wav_streamed_in_real_time(server, speech, speech_24k):
    """client.realtime.connect(intent=transcription): session.created, session.updated with the
    settings in effect, then per utterance speech_started, deltas while it is spoken, then
    speech_stopped, committed and completed -- whose transcripts are the offline job's segments,
    with the tags (language, emotion, events) in fields of their own."""
    async def go():
        async with openai_client(server).realtime.connect(
                extra_query={"intent": "transcription"}) as conn:
            created = await conn.recv()
            await conn.session.update(session=GA_SESSION)
            updated = await conn.recv()
            return created, updated, await _transcribe(conn, speech_24k, 1.0, len(SENTENCES))

    created, updated, events = asyncio.run(go())
    assert created.type == "session.created" and created.session.type == "transcription"
    assert updated.type == "session.updated"
    settings = updated.session.audio.input
    assert settings.format.rate == OPENAI_RATE_HZ and settings.transcription.language == "en"
    assert settings.turn_detection.type == "server_vad" and settings.turn_detection.silence_duration_ms > 0
    assert not _of(events, "error")
    completed = _of(events, "conversation.item.input_audio_transcription.completed")
    offline = offline_segments(server, speech.path)
    assert [c.transcript for c in completed] == [s["text"] for s in offline]
    for c, s in zip(completed, offline):
        extra = c.model_extra  # SenseVoice's fields beside OpenAI's
        assert extra["raw_text"].startswith("<|en|>") and c.transcript in extra["raw_text"]
        (segment,) = extra["segments"]
        assert (segment["language"], segment["emotion"], segment["events"]) == \
            (s["language"], s["emotion"], s["events"])
        assert abs(extra["start"] - s["start"]) < 0.1 and abs(extra["end"] - s["end"]) < 0.1
        assert c.usage.type == "duration" and c.usage.seconds > 0 and c.content_index == 0
    # per item, in order: started, deltas (adding up to its transcript; the last one may follow the
    # commit), stopped, committed (chained), completed
    items = [c.item_id for c in completed]
    assert len(set(items)) == len(items)
    previous = None
    for item, c in zip(items, completed):
        of_item = [(t, e) for t, e in events if getattr(e, "item_id", None) == item]
        kinds = [e.type for _, e in of_item]
        assert kinds[0] == "input_audio_buffer.speech_started", kinds
        assert [k for k in kinds if not k.endswith(".delta")][-3:] == [
            "input_audio_buffer.speech_stopped", "input_audio_buffer.committed",
            "conversation.item.input_audio_transcription.completed"], kinds
        deltas = [e for _, e in of_item if e.type.endswith(".delta")]
        assert "".join(d.delta for d in deltas) == c.transcript
        committed = next(e for _, e in of_item if e.type == "input_audio_buffer.committed")
        assert committed.previous_item_id == previous
        previous = item
    # deltas came while the person spoke: the first sentence's (the longest, re-decoded several
    # times even when a busy lane stretches the cadence) well before its completion
    times = [(t, e.type) for t, e in events if getattr(e, "item_id", None) == items[0]]
    first_delta = min(t for t, kind in times if kind.endswith(".delta"))
    assert first_delta < max(t for t, _ in times) - 0.3, times


def test_the_beta_client_and_a_commit_close_an_utterance_at_once(server, speech, speech_24k):
    """client.beta.realtime.connect (OpenAI-Beta: realtime=v1): the transcription_session.*
    dialect; audio cut inside the first sentence and committed is transcribed at once (the
    session stays open); a commit with no speech in progress is refused by OpenAI's code."""
    cut = int(speech.spans[0][1] * OPENAI_RATE_HZ) * 2 - OPENAI_RATE_HZ  # half a second short

    async def go():
        # the beta client goes to wss:// unless told the WebSocket URL (as for any plain-HTTP server)
        beta = openai_client(server, websocket_base_url=server.url.replace("http", "ws") + "/v1")
        async with beta.beta.realtime.connect(model="gpt-4o-transcribe") as conn:
            created = await conn.recv()
            await conn.transcription_session.update(session={
                "input_audio_format": "pcm16", "turn_detection": None,
                "input_audio_transcription": {"model": "gpt-4o-transcribe", "language": "en"}})
            updated = await conn.recv()
            events = await _transcribe(conn, speech_24k[:cut], 4.0, 1, commit=True, timeout_s=60)
            await conn.input_audio_buffer.commit(event_id="again")
            refused = await asyncio.wait_for(conn.recv(), 30)
            return created, updated, events, refused

    created, updated, events, refused = asyncio.run(go())
    assert created.type == "transcription_session.created"
    assert updated.type == "transcription_session.updated"
    assert updated.session.turn_detection is None
    assert updated.session.input_audio_transcription.language == "en"
    (completed,) = _of(events, "conversation.item.input_audio_transcription.completed")
    assert completed.transcript and completed.model_extra["end"] == pytest.approx(
        cut / 2 / OPENAI_RATE_HZ, abs=0.05)
    assert refused.type == "error" and refused.error.code == "input_audio_buffer_commit_empty"
    assert refused.error.type == "invalid_request_error" and refused.error.event_id == "again"


def test_four_times_real_time_gives_the_same_transcripts(server, speech, speech_24k):
    async def go():
        async with openai_client(server).realtime.connect(
                extra_query={"intent": "transcription"}) as conn:
            await conn.recv()
            return await _transcribe(conn, speech_24k, 4.0, len(SENTENCES))

    completed = _of(asyncio.run(go()), "conversation.item.input_audio_transcription.completed")
    assert [c.transcript for c in completed] == \
        [s["text"] for s in offline_segments(server, speech.path)]


# ---------------------------------------------------------------------------- refusals
def test_a_wrong_token_is_refused_at_the_upgrade_with_openais_error(server):
    async def go(token):
        async with openai_client(server, token).realtime.connect(
                extra_query={"intent": "transcription"}) as conn:
            return await conn.recv()

    async def bare():  # no token at all
        async with websockets.connect(server.url.replace("http", "ws") + "/v1/realtime", proxy=None):
            pass

    for attempt in (go("wrong"), bare()):
        with pytest.raises(websockets.exceptions.InvalidStatus) as refused:
            asyncio.run(attempt)
        response = refused.value.response
        assert response.status_code == 401
        error = json.loads(response.body)["error"]
        assert error["type"] == "authentication_error" and error["code"] == "unauthorized"
        assert "api_key" in error["message"]

    # a browser's form: the token as a subprotocol (OpenAI's), answered "realtime"
    async def browser():
        async with websockets.connect(
                server.url.replace("http", "ws") + "/v1/realtime?intent=transcription", proxy=None,
                subprotocols=["realtime", f"openai-insecure-api-key.{TOKEN}"]) as ws:
            return ws.subprotocol, json.loads(await ws.recv())

    subprotocol, created = asyncio.run(browser())
    assert subprotocol == "realtime" and created["type"] == "session.created"


def _raw(server, frames: list, *, expect: int, headers=AUTH) -> tuple[list[dict], int | None]:
    """Send ``frames`` after session.created; the next ``expect`` events, and the close code
    if the server closed."""
    async def go():
        async with websockets.connect(server.url.replace("http", "ws") + "/v1/realtime",
                                      additional_headers=headers, proxy=None, max_size=None) as ws:
            assert json.loads(await ws.recv())["type"] == "session.created"
            for frame in frames:
                await ws.send(frame)
            out = []
            try:
                for _ in range(expect):
                    out.append(json.loads(await asyncio.wait_for(ws.recv(), 20)))
                await asyncio.wait_for(ws.recv(), 0.5 if expect else 20)
            except (websockets.ConnectionClosed, TimeoutError):
                pass
            return out, ws.close_code

    return asyncio.run(go())


def test_malformed_events_get_an_error_and_the_session_goes_on(server):
    frames = ["hello", "[1, 2]", json.dumps({"event_id": "e1"}),
              json.dumps({"type": "input_audio_buffer.append", "audio": "not base64!",
                          "event_id": "e2"}),
              json.dumps({"type": "input_audio_buffer.append", "audio": 42}),
              json.dumps({"type": "session.update", "event_id": "e3",
                          "session": {"type": "transcription",
                                      "audio": {"input": {"format": {"type": "audio/pcmu"}}}}}),
              json.dumps({"type": "session.update",
                          "session": {"type": "transcription", "audio": {"input": {
                              "transcription": {"language": "klingon"}}}}}),
              json.dumps({"type": "response.create", "event_id": "e4"}),
              b"\0\0" * 100,  # binary: not how this API sends audio
              json.dumps({"type": "session.update", "session": {
                  "type": "transcription", "audio": {"input": {"transcription": {"language": "en"}}}}})]
    events, code = _raw(server, frames, expect=len(frames))
    errors, last = events[:-1], events[-1]
    assert code is None  # still open
    assert [e["type"] for e in errors] == ["error"] * (len(frames) - 1)
    assert all(e["error"]["type"] == "invalid_request_error" and e["error"]["message"] for e in errors)
    assert [e["error"]["event_id"] for e in errors] == [None, None, "e1", "e2", None, "e3", None,
                                                         "e4", None]
    assert [e["error"]["param"] for e in errors][2:6] == ["type", "audio", "audio",
                                                          "audio.input.format"]
    assert "klingon" in errors[6]["error"]["message"] and "response.create" in errors[7]["error"]["message"]
    assert last["type"] == "session.updated"
    assert last["session"]["audio"]["input"]["transcription"]["language"] == "en"


def test_oversized_frames_are_refused_as_on_the_other_live_routes(server):
    big = base64.b64encode(b"\0" * (MAX_FRAME + 3)).decode()  # more audio than a frame may hold
    events, code = _raw(server, [json.dumps({"type": "input_audio_buffer.append", "audio": big})],
                        expect=1)
    assert events[0]["type"] == "error" and events[0]["error"]["code"] == "frame_too_large"
    assert code == 1009
    # past twice the frame limit the WebSocket layer refuses it itself
    events, code = _raw(server, ["x" * (2 * MAX_FRAME + 2)], expect=0)
    assert code == 1009 and events == []


def test_capacity_refusals_are_error_events_with_a_code_then_a_close(server, speech_24k):
    """Two streams held (max_live_streams 2): the third client's first audio gets an error event
    named too_many_streams, then a close with 1013 (the client may retry later)."""
    async def go():
        held = []
        for _ in range(2):
            ws = await websockets.connect(server.url.replace("http", "ws") + "/v1/realtime",
                                          additional_headers=AUTH, proxy=None)
            await ws.recv()
            await ws.send(json.dumps({"type": "input_audio_buffer.append",
                                      "audio": base64.b64encode(speech_24k[:CHUNK]).decode()}))
            held.append(ws)
        await asyncio.sleep(0.3)
        async with openai_client(server).realtime.connect(
                extra_query={"intent": "transcription"}) as conn:
            await conn.recv()
            await conn.input_audio_buffer.append(audio=base64.b64encode(speech_24k[:CHUNK]).decode())
            error = await asyncio.wait_for(conn.recv(), 20)
            with pytest.raises(websockets.ConnectionClosed) as closed:
                await asyncio.wait_for(conn.recv(), 20)
        for ws in held:
            await ws.close()
        return error, closed.value.rcvd.code

    hub = server.app.state.live_hub
    before = hub.metrics.refused.labels("too_many_streams")._value.get()
    error, code = asyncio.run(go())
    assert error.type == "error" and error.error.code == "too_many_streams"
    assert "2 live streams" in error.error.message and code == 1013
    assert hub.metrics.refused.labels("too_many_streams")._value.get() == before + 1
    deadline = time.monotonic() + 10
    while hub.open and time.monotonic() < deadline:  # the held streams' slots come back
        time.sleep(0.1)
    assert hub.open == 0


def test_the_route_is_the_live_captions_only_under_v1():
    """/v1/realtime answers only upgrades (a plain GET is not a page)."""
    from fastapi.routing import APIWebSocketRoute

    from pipeline.web.routes.live import build_live_router

    paths = {r.path for r in build_live_router(None).routes if isinstance(r, APIWebSocketRoute)}
    assert {"/api/stream", "/api/stream/funasr", "/", "/v1/realtime"} == paths


# ---------------------------------------------------------------------------- the events alone
def test_client_events_are_read_strictly():
    audio = base64.b64encode(b"\1\2" * 10).decode()
    assert parse_client_event({"type": "input_audio_buffer.append", "audio": audio}, 100).audio == \
        b"\1\2" * 10
    for limit in (10, 19):  # over by the base64 length, or only once decoded
        with pytest.raises(FrameTooLarge, match=f"at most {limit} bytes"):
            parse_client_event({"type": "input_audio_buffer.append", "audio": audio}, limit)
    with pytest.raises(EventError) as refused:
        parse_client_event({"type": "session.update", "event_id": "x"}, 100)
    assert refused.value.param == "session" and refused.value.event_id == "x"


def test_session_updates_in_both_dialects():
    config = SessionConfig()
    assert config.rate == OPENAI_RATE_HZ and config.server_vad and config.sensevoice_language == "auto"
    beta = config.updated({"input_audio_format": "pcm16", "turn_detection": None,
                           "input_audio_transcription": {"language": "en-US"}}, True, 8000, 192000)
    assert beta.beta and not beta.server_vad and beta.sensevoice_language == "en"
    described = beta.describe(0.7, 0.2, 0.5)
    assert described["input_audio_format"] == "pcm16" and described["turn_detection"] is None
    ga = config.updated({"type": "transcription", "audio": {"input": {
        "format": {"type": "audio/pcm", "rate": 48000}}}}, False, 8000, 192000)
    assert ga.rate == 48000 and ga.describe(0.7, 0.2, 0.5)["audio"]["input"]["turn_detection"] == \
        {"type": "server_vad", "threshold": 0.5, "prefix_padding_ms": 200, "silence_duration_ms": 700}
    with pytest.raises(Exception, match="transcription sessions only"):
        config.updated({"type": "realtime"}, False, 8000, 192000)
    with pytest.raises(Exception, match="between"):
        config.updated({"audio": {"input": {"format": {"type": "audio/pcm", "rate": 1000}}}},
                       False, 8000, 192000)
