"""Live captions over WebSocket: ``/api/stream`` (this server's protocol) and
``/api/stream/funasr`` (FunASR's runtime protocol; also answered at ``/``, where FunASR's own
clients connect when given only a host and a port). Both drive the same
:class:`~pipeline.serving.live.LiveSession`; README.md "Live captions" is the user's reference.

**``GET /api/stream``** (upgrade). Query: ``language`` (one of ``tags.REQUEST_LANGUAGES``),
``use_itn`` (true), ``sample_rate`` (``tags.SAMPLE_RATE_HZ``; 8000..192000, other rates are resampled),
``ban_emo_unk`` (false), ``word_timestamps`` (false: finals carry timed words when true),
``languages`` (a language allow-list, e.g. ``zh,en``: each utterance's language is detected
only among these; empty: any), ``redact`` (``pii`` or a comma list of card, phone, email, id,
digits: masked in every caption; a partial's runs of 4 digits or more too, as it may end inside an
item). The client
sends binary frames of 16-bit little-endian mono PCM, of any size, then the text frame
``{"type": "end"}``. The server sends text frames of JSON:

* ``{"type": "partial", "text", "raw_text", "start", "end", "segment", "interval"}``: the
  utterance in progress, at most every ``interval`` seconds (``live_partial_interval_s``, stretched
  up to 4x while the live lane is busy) and only when it changed (an empty partial takes back one
  that turned out not to be speech);
* ``{"type": "final", "text", "raw_text", "start", "end", "reason", "segment", "segments"}``:
  the utterance, settled, when a pause (``reason`` "pause"), the length limit ("limit") or the
  end ("end") closes it; ``segment`` is the first of ``segments`` (language, emotion, events, itn,
  text, start, end, words). After ``end`` every utterance is final and the server closes (1000);
* ``{"type": "error", "code", "message"}``, then the server closes with the error's
  ``close_code`` (``pipeline.domain.errors``). Everything received before an idle time-out,
  the stream-length limit, the stream's time limit (``stream_time_limit``: open
  ``live_max_stream_wall_s``, wall clock) or its giving way (``quiet_stream_yielded``: a quiet
  stream whose slot a new stream took while every slot was held) is finalised first.

Times are seconds from the stream's start.

**Access.** The Host/Origin guard (pipeline/web/edge.py) applies to the upgrade: a page of another
site is refused (403) before the socket opens. With an API token the stream needs one of:
``Authorization: Bearer <token>`` (or ``X-API-Key``), as for REST; the subprotocol
``bearer.<token>`` (a browser cannot set headers: ``new WebSocket(url, ["sensevoice",
"bearer." + token])``, for tokens made of letters, digits and ``-._~``); or a signed live link
``?exp=...&sig=...`` from :func:`live_query` (the UI's pages hold that, never the token). Refusals
for a bad token, bad query values, too many streams or a model not loaded are answered after the
upgrade, as an error frame and a close, so that a browser can read the reason.

**FunASR.** The first text frame is FunASR's JSON (``mode`` offline | online | 2pass, ``wav_name``,
``is_speaking``, ``itn``, ``audio_fs``, ``wav_format`` pcm, ``svs_lang`` / ``svs_itn`` as FunASR's
SenseVoice runtime reads them (``svs_lang`` also takes an allow-list: ``"zh,en"`` or
``["zh", "en"]``, the language detected only among these), ``hotwords`` (FunASR's
``{"term": weight}``, its weights around 20 divided by 10 and bounded to 0.1-10; or lines of
``term weight``: the recording is decoded with them, :mod:`pipeline.model.hotwords`), ``redact``
(this server's extension: ``"pii"`` or a list of kinds, as ``/api/stream``'s);
``chunk_size``, ``chunk_interval`` and the look-backs are accepted and ignored), then binary PCM, then ``{"is_speaking": false}``. Answers:
``{"mode", "wav_name", "text", "is_final", "timestamp"}`` plus SenseVoice's ``raw_text`` and
``segment``. Finals are its offline messages (``2pass-offline``, or ``offline``), partials its
online ones (``2pass-online``, or ``online``) whose ``text`` is, as FunASR's, the part to append:
the words two successive partials agree on, never taken back (in ``online`` mode a final is sent
as the online text it adds). ``timestamp`` is a JSON string of
``[start_ms, end_ms]`` pairs (per word on finals). ``is_final`` is false until the input ends;
then one last message ``{"text": "", "is_final": true, "is_end": true}`` closes the utterances
(FunASR's C++ server marks its last message so, its Python server sends that acknowledgement), and
the connection stays open for the next recording's JSON. Errors are
``{"is_final": false, "is_end": true, "error": message, "code": code}``, then a close.
"""

from __future__ import annotations

import asyncio
import hmac
import json
from contextlib import asynccontextmanager
from dataclasses import asdict, dataclass

import orjson
from fastapi import APIRouter, WebSocket

from pipeline.audio.stream_vad import MAX_RATE, MIN_RATE
from pipeline.domain.errors import (FrameTooLarge, IdleTimeout, InvalidMessage, InvalidOption,
                                    LinkExpired, QuietStreamYielded, SenseVoiceError,
                                    StreamTimeLimit, StreamTooLong, Unauthorized, WsClose)
from pipeline.domain.tags import AUTO_LANGUAGE, REQUEST_LANGUAGES, SAMPLE_RATE_HZ
from pipeline.domain.types import Hotword, TranscribeOptions, hotwords_from_funasr
from pipeline.serving.live import Caption, LiveHub, LiveSession
from pipeline.web.auth import token_ok
from pipeline.web.auth_throttle import AUTH_FAILED
from pipeline.web.links import LIVE_SUBJECT, link_key, link_state

NATIVE_SUBPROTOCOL = "sensevoice"
FUNASR_SUBPROTOCOL = "binary"  # what FunASR's clients offer
BEARER_PREFIX = "bearer."
MAX_TEXT_FRAME = 4096  # characters; control messages are tiny
MAX_WAV_NAME = 200  # characters of a FunASR wav_name echoed back
TRUE, FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class ClientGone(ConnectionError):
    """The client left or stopped reading."""


def _flag(name: str, value: str | None, default: bool) -> bool:
    if value is None:
        return default
    v = value.strip().lower()
    if v in TRUE:
        return True
    if v in FALSE:
        return False
    raise InvalidOption(f"{name} must be true or false, not {value[:40]!r}")


def _rate(value, name: str = "sample_rate") -> int:
    try:
        rate = int(str(value).strip())
    except ValueError:
        raise InvalidOption(f"{name} must be a whole number of hertz, not "
                            f"{str(value)[:40]!r}") from None
    if not MIN_RATE <= rate <= MAX_RATE:
        raise InvalidOption(f"{name} must be between {MIN_RATE} and {MAX_RATE} Hz, not {rate}")
    return rate


def _language(value) -> str:
    if not isinstance(value, str) or value not in REQUEST_LANGUAGES:
        raise InvalidOption(f"unknown language {str(value)[:40]!r}; choose one of "
                            f"{', '.join(REQUEST_LANGUAGES)}")
    return value


def _allow_list(value) -> tuple[str, ...]:
    """A language allow-list from ``"zh,en"`` or ``["zh", "en"]``; InvalidOption names an unknown
    language (or a value of another kind)."""
    if not isinstance(value, (str, list)) or not all(isinstance(v, str) for v in value):
        raise InvalidOption(f"languages must be a comma list such as 'zh,en', not {str(value)[:40]!r}")
    return TranscribeOptions(languages=value).languages


def _funasr_language(value) -> tuple[str, tuple[str, ...]]:
    """FunASR's ``svs_lang``: one language (the prompt, as FunASR reads it), or an allow-list
    (a list, or a comma text): (language, languages)."""
    if isinstance(value, str) and "," not in value:
        return _language(value), ()
    return AUTO_LANGUAGE, _allow_list(value)


def segment_json(segment) -> dict:
    return asdict(segment)


class Socket:
    """One WebSocket: sends serialised by a lock and bounded in time (a client that stops reading
    is dropped after ``idle_s``), receives raced against the session's failure, error frames."""

    def __init__(self, ws: WebSocket, idle_s: float):
        self.ws = ws
        self.idle_s = idle_s
        self.closed = False
        self._lock = asyncio.Lock()

    async def send(self, body: dict) -> None:
        text = orjson.dumps(body).decode()
        async with self._lock:
            if self.closed:
                raise ClientGone("the socket is closed")
            try:
                async with asyncio.timeout(self.idle_s):
                    await self.ws.send_text(text)
            except TimeoutError:
                self.closed = True
                raise ClientGone(f"the client read nothing for {self.idle_s:g} s") from None
            except Exception as e:  # disconnect: starlette, uvicorn and websockets each raise theirs
                self.closed = True
                raise ClientGone(f"the client left: {e!r}") from None

    async def close(self, code: int = WsClose.NORMAL, reason: str = "") -> None:
        async with self._lock:
            if self.closed:
                return
            self.closed = True
            try:
                await self.ws.close(code=code, reason=reason.encode()[:123].decode("utf-8", "ignore"))
            except Exception:  # already gone
                pass

    async def receive(self) -> dict:
        """The next message; IdleTimeout after ``idle_s`` of silence."""
        try:
            async with asyncio.timeout(self.idle_s):
                return await self.ws.receive()
        except TimeoutError:
            raise self.idle() from None

    def idle(self) -> IdleTimeout:
        return IdleTimeout(f"nothing arrived for {self.idle_s:g} s; the stream is closed")

    async def receive_for(self, session: LiveSession) -> dict:
        """The next message of ``session``'s stream; IdleTimeout after ``idle_s`` of silence, or
        the error ``session`` must end with (its time open is over, or it was asked to stop: a
        wait for the client is cut short at once, with no task per frame)."""
        loop = asyncio.get_running_loop()
        stop = session.stop_due(loop.time())
        if stop is not None:
            raise stop
        try:
            async with asyncio.timeout_at(min(loop.time() + self.idle_s, session.deadline)) as scope:
                def wake() -> None:
                    if not scope.expired():  # expiring: the stop is read below all the same
                        scope.reschedule(loop.time())

                session.on_stop = wake
                try:
                    return await self.ws.receive()
                finally:
                    session.on_stop = None
        except TimeoutError:
            raise session.stop_due(loop.time()) or self.idle() from None


@asynccontextmanager
async def failing_with(session: LiveSession):
    """Inside the block, the session's failure (a decode, the model, the client gone) interrupts
    whatever the route awaits and is raised there: a receive waits on the socket alone (no task
    per frame), yet the route learns a failure at once."""
    task = asyncio.current_task()
    active = True

    def interrupt(_failed) -> None:
        if active:
            task.cancel()

    session.failed.add_done_callback(interrupt)
    try:
        yield
    except asyncio.CancelledError:
        if not session.failed.done():
            raise  # the server is stopping
        task.uncancel()
        raise session.failed.result() from None
    finally:
        active = False
        session.failed.remove_done_callback(interrupt)


def client_of(ws: WebSocket) -> str:
    """The peer's address (the per-client stream limit counts it by LiveHub.client_key)."""
    return ws.client.host if ws.client else ""


def authorized(ws: WebSocket, token: str, prefixes: tuple[str, ...] = (BEARER_PREFIX,)) -> bool:
    """The API token as a header or a ``bearer.<token>`` subprotocol (or another of
    ``prefixes``), or a live link. A refusal is counted against the client (auth_throttle); an
    expired live link this server signed is refused with link_expired and not counted (it is no
    guess)."""
    if token_ok(ws.headers.get, token):
        return True
    for offered in ws.scope.get("subprotocols") or ():
        for prefix in prefixes:
            if offered.startswith(prefix) and hmac.compare_digest(
                    offered[len(prefix):].encode(), token.encode()):
                return True
    q = ws.query_params
    state = link_state(link_key(token), LIVE_SUBJECT, q.get("exp"), q.get("sig"))
    if state == "expired":
        raise LinkExpired("this live link has expired; ask the page for a new one (Start again)")
    if state != "valid":
        ws.scope[AUTH_FAILED] = True
    return state == "valid"


def choose_subprotocol(ws: WebSocket, preferred: str) -> str | None:
    """The subprotocol the server answers (a browser that offers some needs one of them back)."""
    offered = list(ws.scope.get("subprotocols") or ())
    for name in (preferred, NATIVE_SUBPROTOCOL, FUNASR_SUBPROTOCOL):
        if name in offered:
            return name
    return next((p for p in offered if p.startswith(BEARER_PREFIX)), None)


def parse_text(text: str, limit: int = MAX_TEXT_FRAME) -> dict:
    if len(text) > limit:
        raise InvalidMessage(f"a text frame holds at most {limit} characters")
    try:
        message = json.loads(text)
    except ValueError:
        raise InvalidMessage("a text frame must be JSON") from None
    if not isinstance(message, dict):
        raise InvalidMessage("a text frame must be a JSON object")
    return message


def _frame(message: dict, limit: int) -> tuple[bytes | None, str | None]:
    """The binary or text payload of a received message (FrameTooLarge past ``limit``)."""
    data, text = message.get("bytes"), message.get("text")
    if data is not None and len(data) > limit:
        raise FrameTooLarge(f"a frame holds at most {limit} bytes; this one held {len(data)}")
    return data, text


async def feed_until_text(sock: Socket, session: LiveSession, limit: int) -> dict:
    """Feed the binary frames the client sends to ``session`` until a text frame comes; return
    that frame's JSON. The audio that arrived is finalised before an idle time-out, the stream
    limit, the time limit or a stop (LiveSession.stop) ends the stream; a client that leaves
    raises ClientGone. Both protocols read this way."""
    while True:
        try:
            message = await sock.receive_for(session)
        except (IdleTimeout, StreamTimeLimit, QuietStreamYielded):
            await session.end()  # what arrived is finalised before the error
            raise
        if message["type"] == "websocket.disconnect":
            raise ClientGone("the client closed the stream")
        data, text = _frame(message, limit)
        if data is None:
            return parse_text(text or "")
        try:
            await session.feed(data)
        except StreamTooLong:
            await session.end()
            raise


# ---------------------------------------------------------------------------- native protocol
class NativeStream:
    """``/api/stream``: see the module docstring."""

    def __init__(self, hub: LiveHub, ws: WebSocket):
        self.hub, self.ws = hub, ws
        self.sock = Socket(ws, hub.limits.idle_timeout_s)

    def options(self) -> tuple[TranscribeOptions, int]:
        q = self.ws.query_params
        options = TranscribeOptions(
            language=_language(q.get("language", AUTO_LANGUAGE)),
            use_itn=_flag("use_itn", q.get("use_itn"), True),
            ban_emo_unk=_flag("ban_emo_unk", q.get("ban_emo_unk"), False),
            word_timestamps=_flag("word_timestamps", q.get("word_timestamps"), False),
            languages=_allow_list(q.get("languages", "")), redact=q.get("redact", ""))
        return options, _rate(q.get("sample_rate", str(SAMPLE_RATE_HZ)))

    async def serve(self) -> None:
        await self.ws.accept(subprotocol=choose_subprotocol(self.ws, NATIVE_SUBPROTOCOL))
        try:
            if not authorized(self.ws, self.hub.settings.server.token):
                raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer "
                                   "<token>', the subprotocol 'bearer.<token>' or a live link)")
            options, rate = self.options()
            async with self.hub.stream(options, rate, self.emit, client_of(self.ws)) as session, \
                    failing_with(session):
                await self.pump(session)
        except SenseVoiceError as e:
            await self.fail(e)
        except ClientGone:
            pass

    async def pump(self, session: LiveSession) -> None:
        request = await feed_until_text(self.sock, session, self.hub.limits.max_frame_bytes)
        if request.get("type") != "end":
            raise InvalidMessage('expected binary frames of 16-bit PCM or the text frame '
                                 '{"type": "end"}')
        await session.end()
        await self.sock.close(WsClose.NORMAL)

    async def emit(self, caption: Caption) -> None:
        body = {"type": "final" if caption.final else "partial", "text": caption.text,
                "raw_text": caption.raw_text, "start": caption.start, "end": caption.end,
                "segment": segment_json(caption.segments[0]) if caption.segments else None}
        if caption.final:
            body["reason"] = caption.reason
            body["segments"] = [segment_json(s) for s in caption.segments]
        elif caption.interval is not None:
            body["interval"] = caption.interval  # the cadence in use (stretched when busy)
        await self.sock.send(body)

    async def fail(self, e: SenseVoiceError) -> None:
        try:
            await self.sock.send({"type": "error", "code": e.code, "message": e.message})
        except ClientGone:
            return
        await self.sock.close(e.close_code, e.message)


# ---------------------------------------------------------------------------- FunASR protocol
FUNASR_MODES = ("offline", "online", "2pass")
ONLINE_MODE = {"2pass": "2pass-online", "online": "online", "offline": None}
OFFLINE_MODE = {"2pass": "2pass-offline", "online": "online", "offline": "offline"}


@dataclass
class FunAsrConfig:
    """What a FunASR client's JSON frames set (the keys it may send, read leniently as FunASR's
    servers read them; unknown keys are ignored)."""

    mode: str = "2pass"
    wav_name: str = "microphone"
    itn: bool = True
    language: str = AUTO_LANGUAGE
    languages: tuple[str, ...] = ()  # the allow-list (svs_lang as a list); () = any
    audio_fs: int = SAMPLE_RATE_HZ
    hotwords: tuple[Hotword, ...] = ()  # FunASR's {"term": weight} (pipeline/domain/hotwords.py)
    redact: tuple[str, ...] = ()  # personal data masked (an extension: "pii" or a list of kinds)

    def update(self, message: dict) -> None:
        if "mode" in message and message["mode"] is not None:
            if message["mode"] not in FUNASR_MODES:
                raise InvalidOption(f"unsupported mode {str(message['mode'])[:40]!r}; choose one "
                                    f"of {', '.join(FUNASR_MODES)}")
            self.mode = message["mode"]
        if message.get("wav_name"):
            self.wav_name = str(message["wav_name"])[:MAX_WAV_NAME]
        for key in ("itn", "svs_itn"):  # svs_itn: FunASR's SenseVoice runtime
            if message.get(key) is not None:
                self.itn = _flag(key, str(message[key]), True)
        if message.get("svs_lang") is not None:
            self.language, self.languages = _funasr_language(message["svs_lang"])
        if message.get("audio_fs") is not None:
            self.audio_fs = _rate(message["audio_fs"], "audio_fs")
        if message.get("hotwords"):
            self.hotwords = hotwords_from_funasr(message["hotwords"])
        if message.get("redact") is not None:
            self.redact = TranscribeOptions(redact=message["redact"]).redact
        fmt = message.get("wav_format")
        if fmt is not None and str(fmt).lower() != "pcm":
            raise InvalidOption(f"this server takes PCM streams only (wav_format 'pcm'), not "
                                f"{str(fmt)[:40]!r}")


def _wordy(ch: str) -> bool:
    """A character that joins its neighbours into a word (letters and digits of scripts written
    with spaces); CJK characters and kana stand alone."""
    return ch.isalnum() and not ("\u2e80" <= ch <= "\u9fff" or "\uf900" <= ch <= "\ufaff")


def agreed_prefix(previous: str, latest: str) -> str:
    """What two successive hypotheses agree on, not ending inside a word (LocalAgreement, as
    whisper_streaming commits text): a FunASR online message may only append."""
    n = 0
    for a, b in zip(previous, latest):
        if a != b:
            break
        n += 1
    prefix = latest[:n]
    if n and _wordy(prefix[-1]) and any(n < len(t) and _wordy(t[n]) for t in (previous, latest)):
        while prefix and _wordy(prefix[-1]):
            prefix = prefix[:-1]
    return prefix


def spaced(tail: str, text: str) -> str:
    """``text`` with a space in front when it continues words written with spaces (FunASR's
    clients concatenate messages as they come)."""
    if tail and text and _wordy(tail[-1]) and _wordy(text[0]):
        return " " + text
    if tail and text and tail[-1] in ".,!?;:" and _wordy(text[0]):
        return " " + text
    return text


def stamps(pairs) -> str:
    return "[" + ",".join(f"[{int(round(a * 1000))},{int(round(b * 1000))}]" for a, b in pairs) + "]"


class FunAsrStream:
    """``/api/stream/funasr`` (and ``/``): see the module docstring."""

    def __init__(self, hub: LiveHub, ws: WebSocket):
        self.hub, self.ws = hub, ws
        self.sock = Socket(ws, hub.limits.idle_timeout_s)
        self.config = FunAsrConfig()
        self._reset()

    def _reset(self) -> None:
        self.previous = ""  # the latest partial's text (this utterance)
        self.committed = ""  # online text sent for this utterance
        self.shown = ""  # all text the client has appended so far (its tail decides spacing)
        self.settled = ""  # offline text sent so far

    async def serve(self) -> None:
        await self.ws.accept(subprotocol=choose_subprotocol(self.ws, FUNASR_SUBPROTOCOL))
        try:
            if not authorized(self.ws, self.hub.settings.server.token):
                raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer "
                                   "<token>' or the subprotocol 'bearer.<token>')")
            while True:  # one recording after another, until the client closes
                message = await self.sock.receive()
                if message["type"] == "websocket.disconnect":
                    return
                data, text = _frame(message, self.hub.limits.max_frame_bytes)
                if text is not None:
                    request = parse_text(text)
                    self.config.update(request)
                    if request.get("is_speaking") is False:  # nothing streamed: acknowledge
                        await self.finished()
                        continue
                await self.run(data)
        except SenseVoiceError as e:
            await self.fail(e)
        except ClientGone:
            pass

    async def run(self, data: bytes | None) -> None:
        """One recording: from its first frame (or JSON) to ``is_speaking: false``."""
        self._reset()
        options = TranscribeOptions(language=self.config.language, use_itn=self.config.itn,
                                    word_timestamps=True, languages=self.config.languages,
                                    hotwords=self.config.hotwords, redact=self.config.redact)
        async with self.hub.stream(options, self.config.audio_fs, self.emit,
                                   client_of(self.ws)) as session, \
                failing_with(session):
            if data:
                await session.feed(data)
            while True:
                request = await feed_until_text(self.sock, session,
                                                self.hub.limits.max_frame_bytes)
                if request.get("is_speaking") is False:
                    await session.end()
                    await self.finished()
                    return
                # another configuration mid-stream (FunASR's clients resend hotwords): ignored
                # (the recording's hotwords are those its first configuration gave)

    async def emit(self, caption: Caption) -> None:
        mode = self.config.mode
        if not caption.final:
            if ONLINE_MODE[mode] is None or not caption.text:
                return  # offline mode sends no online text; an empty partial takes nothing back
            agreed = agreed_prefix(self.previous, caption.text)
            self.previous = caption.text
            if not agreed.startswith(self.committed) or len(agreed) <= len(self.committed):
                return
            text = agreed[len(self.committed):]
            if not self.committed:
                text = spaced(self.settled if mode == "2pass" else self.shown, text)
            self.committed = agreed
            self.shown += text
            await self.sock.send(self._message(ONLINE_MODE[mode], text, caption,
                                               [(caption.start, caption.end)]))
            return
        if mode == "online":  # what the online messages have not said yet
            text = caption.text
            if text.startswith(self.committed):
                text = text[len(self.committed):]
            else:
                text = text[len(agreed_prefix(self.committed, text)):]
            if not self.committed:
                text = spaced(self.shown, text)
        else:
            text = spaced(self.settled, caption.text)
            self.settled += text
        self.shown += text
        self.previous = self.committed = ""
        pairs = [(w.start, w.end) for w in caption.words] or [(caption.start, caption.end)]
        await self.sock.send(self._message(OFFLINE_MODE[mode], text, caption, pairs))

    def _message(self, mode: str, text: str, caption: Caption, pairs) -> dict:
        return {"mode": mode, "wav_name": self.config.wav_name, "text": text, "is_final": False,
                "timestamp": stamps(pairs), "raw_text": caption.raw_text,
                "segment": segment_json(caption.segments[0]) if caption.segments else None}

    async def finished(self) -> None:
        """The end of a recording: every utterance has been sent."""
        await self.sock.send({"mode": OFFLINE_MODE[self.config.mode], "wav_name": self.config.wav_name,
                              "text": "", "is_final": True, "is_end": True})

    async def fail(self, e: SenseVoiceError) -> None:
        try:
            await self.sock.send({"mode": OFFLINE_MODE[self.config.mode],
                                  "wav_name": self.config.wav_name, "text": "", "is_final": False,
                                  "is_end": True, "error": e.message, "code": e.code})
        except ClientGone:
            return
        await self.sock.close(e.close_code, e.message)


def build_stream_router(hub: LiveHub) -> APIRouter:
    """The live caption endpoints over one :class:`LiveHub` (the process's streams)."""
    router = APIRouter()

    @router.websocket("/api/stream")
    async def stream(ws: WebSocket):
        await NativeStream(hub, ws).serve()

    @router.websocket("/api/stream/funasr")
    async def stream_funasr(ws: WebSocket):
        await FunAsrStream(hub, ws).serve()

    @router.websocket("/")
    async def stream_funasr_root(ws: WebSocket):  # FunASR's clients given only host and port
        await FunAsrStream(hub, ws).serve()

    return router
