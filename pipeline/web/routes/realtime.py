"""OpenAI's realtime transcription over WebSocket: ``/v1/realtime``, a third face of the live
captions beside pipeline/web/routes/stream.py's two, over the same
:class:`~pipeline.serving.live.LiveSession` (the same admission, per-client limits, pacing, speech
detection, quiet-stream and time caps). A client written for OpenAI's realtime transcription (the
official ``openai`` package's ``client.realtime.connect(extra_query={"intent": "transcription"})``
or ``client.beta.realtime.connect(...)``, with ``base_url="http://HOST:PORT/v1"``) works
unchanged. The events are pipeline/web/realtime_events.py's; README.md "OpenAI's realtime
transcription" is the user's reference.

**Session.** On connect the server sends ``session.created`` (``transcription_session.created`` to
a beta client). ``session.update`` / ``transcription_session.update`` set the input format
(``audio/pcm`` or ``pcm16``: 16-bit PCM, 24 kHz as OpenAI's, or another ``rate`` between 8 and
192 kHz; G.711 is refused), the ``language`` (ISO-639-1, or none: detected), the transcription's
``prompt`` (hotwords when it is a list of short terms, as the OpenAI face reads it; read when the
audio starts) and ``turn_detection`` (``server_vad``, or null); each is answered ``session.updated`` with the
settings in effect (the speech detection's own pause, padding and threshold). The format and the
language are fixed once audio has been sent.

**Audio.** ``input_audio_buffer.append`` (base64 PCM16) feeds the stream; its first one asks for a
live slot (a refusal -- ``too_many_streams``, ``live_at_capacity``, ``not_ready`` -- is an
``error`` event with that code, then a close with 1013 or its error's close code). The server's
speech detection closes each utterance at a pause (so with ``turn_detection`` null too);
``input_audio_buffer.commit`` closes the one in progress at once (``error`` with code
``input_audio_buffer_commit_empty`` when none is). Per utterance, one item:
``input_audio_buffer.speech_started`` (``audio_start_ms``), then
``conversation.item.input_audio_transcription.delta`` while the person speaks (text to append:
what two successive re-decodes agree on, never taken back), then ``speech_stopped``,
``input_audio_buffer.committed`` and ``conversation.item.input_audio_transcription.completed``
with the ``transcript`` (tags removed) and, in fields of their own, ``raw_text`` and
``segments`` (language, emotion, events, itn of each block), ``start`` / ``end`` (seconds from
the first audio) and ``usage`` (``duration``). An utterance that turned out not to be speech is
completed with an empty transcript. ``input_audio_buffer.clear`` is answered ``cleared`` before
the first audio and refused after (the audio is transcribed as it arrives).

**Errors** are ``{"type": "error", "error": {"type", "code", "message", "param", "event_id"}}``
(``type`` from the error's HTTP status, as /v1's REST errors: ``invalid_request_error`` for the
client's mistakes). A malformed event (not JSON, no ``type``, bad base64, a value this server
cannot serve, an event of OpenAI's API a transcription session does not serve) gets one and the
session goes on. Those that end the stream (a frame over the limit -- ``frame_too_large``, 1009,
as on the other live routes --, the idle time-out, the stream's caps, a failed decode) come
with a close, what arrived finalised first as on the other live routes.

**Access.** The API token as ``Authorization: Bearer`` (the client's ``api_key``) or
``X-API-Key``, the subprotocol ``openai-insecure-api-key.<token>`` (OpenAI's browser form) or
``bearer.<token>``, or a live link. A wrong token is refused at the upgrade: HTTP 401 with
OpenAI's error body (the client raises on connect), counted by the sign-in throttle.
"""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import APIRouter, WebSocket
from fastapi.responses import JSONResponse

from pipeline.audio.stream_vad import MAX_RATE, MIN_RATE
from pipeline.domain.errors import (FrameTooLarge, IdleTimeout, InvalidMessage, QuietStreamYielded,
                                    SenseVoiceError, StreamTimeLimit, StreamTooLong, Unauthorized)
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import TranscribeOptions, hotwords_from_prompt
from pipeline.serving.live import Caption, LiveHub, LiveSession
from pipeline.web.realtime_events import (AudioAppend, BufferClear, BufferCommit, Cleared,
                                          ClientEvent, Committed, ErrorEvent, EventError, OtherEvent,
                                          ServerEvent, SessionConfig, SessionState, SessionUpdate,
                                          SpeechStarted, SpeechStopped, TranscriptCompleted,
                                          TranscriptDelta, new_id, parse_client_event)
from pipeline.web.routes.openai import InvalidParam
from pipeline.web.routes.stream import (BEARER_PREFIX, MAX_TEXT_FRAME, ClientGone, Socket,
                                        agreed_prefix, authorized, choose_subprotocol, client_of,
                                        failing_with, parse_text)

REALTIME_PATH = "/v1/realtime"
REALTIME_SUBPROTOCOL = "realtime"  # what OpenAI's browser clients offer
OPENAI_KEY_PREFIX = "openai-insecure-api-key."  # their token, as a subprotocol
BETA_SUBPROTOCOL = "openai-beta.realtime-v1"


@dataclass
class Item:
    """The utterance in progress: its item, where it starts, the text its deltas said."""

    item_id: str
    start: float
    previous: str = ""  # the latest partial's text
    sent: str = ""  # the deltas so far


def _beta(ws: WebSocket) -> bool:
    """A client of OpenAI's beta realtime API (answered in its dialect)."""
    return "realtime=v1" in (ws.headers.get("openai-beta") or "") or \
        BETA_SUBPROTOCOL in (ws.scope.get("subprotocols") or ())


class RealtimeStream:
    """``/v1/realtime``: see the module docstring."""

    def __init__(self, hub: LiveHub, ws: WebSocket):
        self.hub, self.ws = hub, ws
        self.sock = Socket(ws, hub.limits.idle_timeout_s)
        self.config = SessionConfig(beta=_beta(ws))
        max_audio = hub.limits.max_frame_bytes
        self.max_audio = max_audio
        self.max_text = 4 * -(-max_audio // 3) + MAX_TEXT_FRAME  # base64 of a frame + the event
        self.item: Item | None = None
        self.last_item: str | None = None

    # ------------------------------------------------------------------ the connection
    async def serve(self) -> None:
        try:
            if not authorized(self.ws, self.hub.settings.server.token,
                              (BEARER_PREFIX, OPENAI_KEY_PREFIX)):
                raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer "
                                   "<token>': the client's api_key)")
        except SenseVoiceError as e:
            return await self.deny(e)
        await self.ws.accept(subprotocol=choose_subprotocol(self.ws, REALTIME_SUBPROTOCOL))
        try:
            await self.send(SessionState(self.describe(), self.config.beta, created=True))
            first = await self.configure()
            options = TranscribeOptions(language=self.config.sensevoice_language,  # the prompt: as OpenAI's
                                        hotwords=hotwords_from_prompt(self.config.prompt))  # (README)
            async with self.hub.stream(options, self.config.rate, self.emit,
                                       client_of(self.ws)) as session, failing_with(session):
                await self.pump(session, first)
        except SenseVoiceError as e:
            await self.fail(e)
        except ClientGone:
            pass

    async def deny(self, e: SenseVoiceError) -> None:
        """Refused before the upgrade, with OpenAI's error body (a browser without the denial
        extension: after it, as an error event and a close)."""
        if "websocket.http.response" in self.ws.scope.get("extensions", {}):
            body = ErrorEvent.of(e).error
            del body["event_id"]
            await self.ws.send_denial_response(JSONResponse({"error": body}, status_code=e.status))
            return
        await self.ws.accept(subprotocol=choose_subprotocol(self.ws, REALTIME_SUBPROTOCOL))
        await self.fail(e)

    async def configure(self) -> AudioAppend:
        """The client's events until its first audio (which the stream starts with)."""
        while True:
            event = await self.next_event(await self.sock.receive())
            if isinstance(event, AudioAppend):
                return event
            if event is not None:
                await self.handle(event, None)

    async def pump(self, session: LiveSession, first: AudioAppend) -> None:
        """The client's events while its stream is open; what arrived is finalised before an
        idle time-out, the stream's caps or its giving way end it."""
        event: ClientEvent | None = first
        while True:
            if event is not None:
                await self.handle(event, session)
            try:
                message = await self.sock.receive_for(session)
            except (IdleTimeout, StreamTimeLimit, QuietStreamYielded):
                await session.end()
                raise
            event = await self.next_event(message)

    async def next_event(self, message: dict) -> ClientEvent | None:
        """The client event ``message`` holds; None when it was refused (an error event was sent;
        the session goes on). ClientGone when the client left, FrameTooLarge past the limit."""
        if message["type"] == "websocket.disconnect":
            raise ClientGone("the client closed the session")
        data, text = message.get("bytes"), message.get("text")
        try:
            if data is not None:
                if len(data) > self.max_audio:
                    raise FrameTooLarge(f"a frame holds at most {self.max_audio} bytes")
                raise EventError(InvalidMessage("this endpoint takes JSON events; send audio as "
                                                "input_audio_buffer.append (base64 of 16-bit PCM)"))
            if len(text or "") > self.max_text:
                raise FrameTooLarge(f"an event holds at most {self.max_text} characters (an "
                                    f"append at most {self.max_audio} bytes of audio)")
            try:
                request = parse_text(text or "", self.max_text)
            except InvalidMessage as e:
                raise EventError(e) from None
            return parse_client_event(request, self.max_audio)
        except EventError as e:
            await self.send(ErrorEvent.of(e.error, e.event_id, e.param))
            return None

    async def handle(self, event: ClientEvent, session: LiveSession | None) -> None:
        try:
            if isinstance(event, SessionUpdate):
                await self.update(event, session)
            elif isinstance(event, AudioAppend):
                try:
                    await session.feed(event.audio)
                except StreamTooLong:
                    await session.end()
                    raise
            elif isinstance(event, BufferCommit):
                if session is None or not session.cut():
                    raise InvalidParam("the input audio buffer holds no speech to commit",
                                       param=None, code="input_audio_buffer_commit_empty")
            elif isinstance(event, BufferClear):
                if session is not None:
                    raise InvalidParam("the audio is transcribed as it arrives: once sent it "
                                       "cannot be cleared (commit ends the utterance)", param=None)
                await self.send(Cleared())
            elif isinstance(event, OtherEvent):
                raise InvalidParam(f"{event.type!r} is not served here: this is a transcription "
                                   "session (session.update, input_audio_buffer.append, "
                                   "input_audio_buffer.commit)", param="type",
                                   code=InvalidMessage.code)
        except InvalidParam as e:
            await self.send(ErrorEvent.of(e, event.event_id))

    async def update(self, event: SessionUpdate, session: LiveSession | None) -> None:
        new = self.config.updated(event.session, event.beta or self.config.beta, MIN_RATE, MAX_RATE)
        if session is not None and (new.rate, new.sensevoice_language) != \
                (self.config.rate, self.config.sensevoice_language):
            raise InvalidParam("the audio format and the language are fixed once audio has been "
                               "sent; open a new session to change them", param="session")
        self.config = new
        await self.send(SessionState(self.describe(), new.beta))

    def describe(self) -> dict:
        rules = self.hub.rules
        return self.config.describe(rules.close_gap / SAMPLE_RATE_HZ, rules.pad / SAMPLE_RATE_HZ,
                                    rules.threshold)

    # ------------------------------------------------------------------ captions out
    async def emit(self, caption: Caption) -> None:
        item = self.item
        if item is not None and caption.start != item.start:  # taken back; another one began
            await self.complete(item, None)
            item = None
        if not caption.final:
            if not caption.text:
                if item is not None:  # what was shown turned out not to be speech
                    await self.complete(item, None)
                return
            if item is None:
                item = await self.open(caption)
            agreed = agreed_prefix(item.previous, caption.text)
            item.previous = caption.text
            if agreed.startswith(item.sent) and len(agreed) > len(item.sent):
                delta, item.sent = agreed[len(item.sent):], agreed
                await self.send(TranscriptDelta(item.item_id, delta))
            return
        if item is None:
            if not caption.text:
                return
            item = await self.open(caption)
        await self.complete(item, caption)

    async def open(self, caption: Caption) -> Item:
        self.item = Item(new_id("item"), caption.start)
        await self.send(SpeechStarted(self.item.item_id, round(caption.start * 1000)))
        return self.item

    async def complete(self, item: Item, caption: Caption | None) -> None:
        """The item's end: its final (``caption``), or nothing (not speech after all)."""
        self.item = None
        end = caption.end if caption is not None else item.start
        await self.send(SpeechStopped(item.item_id, round(end * 1000)))
        await self.send(Committed(item.item_id, self.last_item))
        self.last_item = item.item_id
        text = caption.text if caption is not None else ""
        if text.startswith(item.sent) and len(text) > len(item.sent):
            await self.send(TranscriptDelta(item.item_id, text[len(item.sent):]))
        await self.send(TranscriptCompleted(
            item.item_id, text, {"type": "duration", "seconds": round(end - item.start, 3)},
            caption.raw_text if caption is not None else "",
            caption.segments if caption is not None else (), item.start, end))

    async def send(self, event: ServerEvent) -> None:
        await self.sock.send(event.body())

    async def fail(self, e: SenseVoiceError) -> None:
        try:
            await self.send(ErrorEvent.of(e))
        except ClientGone:
            return
        await self.sock.close(e.close_code, e.message)


def build_realtime_router(hub: LiveHub) -> APIRouter:
    """OpenAI's realtime transcription over one :class:`LiveHub` (the process's streams)."""
    router = APIRouter()

    @router.websocket(REALTIME_PATH)
    async def realtime(ws: WebSocket):
        await RealtimeStream(hub, ws).serve()

    return router
