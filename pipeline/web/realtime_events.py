"""The events of OpenAI's realtime transcription API, as typed dataclasses: what a client sends
(:func:`parse_client_event`), the session's configuration (:class:`SessionConfig`) and what the
server sends (:class:`ServerEvent` and its kinds). pipeline/web/routes/realtime.py drives them over
a live session; README.md "OpenAI's realtime transcription" is the user's reference.

Two dialects of the same events: the current one (``session.update`` with ``session.type
"transcription"`` and the settings under ``audio.input``; answered ``session.created`` /
``session.updated``) and the beta one (``transcription_session.update`` with
``input_audio_format``, ``input_audio_transcription`` and ``turn_detection`` at the top; answered
``transcription_session.created`` / ``.updated``; a client sending ``OpenAI-Beta:
realtime=v1``). Both are read, and each is answered in its own words.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass, field, fields, replace
from typing import Any, ClassVar

from pipeline.domain.errors import FrameTooLarge, InvalidMessage, SenseVoiceError
from pipeline.domain.tags import AUTO_LANGUAGE
from pipeline.domain.types import Segment
from pipeline.web.errors import error_type
from pipeline.web.routes.openai import MODELS, InvalidParam, sensevoice_language

OPENAI_RATE_HZ = 24000  # OpenAI's PCM16 ("pcm16", "audio/pcm"): 24 kHz mono little-endian
PCM_FORMATS = ("audio/pcm", "pcm16")  # the current dialect's name, the beta one's


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(10)}"


class EventError(Exception):
    """A client event refused (an ``error`` event; the session goes on): ``error`` says why,
    ``event_id`` is the client's (echoed), ``param`` the field at fault."""

    def __init__(self, error: SenseVoiceError, event_id: str | None = None, param: str | None = None):
        super().__init__(error.message)
        self.error, self.event_id = error, event_id
        self.param = param or getattr(error, "param", None)


# ---------------------------------------------------------------------------- client events
@dataclass(frozen=True)
class SessionUpdate:
    event_id: str | None
    session: dict
    beta: bool  # transcription_session.update (answered transcription_session.updated)


@dataclass(frozen=True)
class AudioAppend:
    event_id: str | None
    audio: bytes  # PCM16 little-endian mono at the session's rate


@dataclass(frozen=True)
class BufferCommit:
    event_id: str | None


@dataclass(frozen=True)
class BufferClear:
    event_id: str | None


@dataclass(frozen=True)
class OtherEvent:
    """A client event of OpenAI's API that a transcription session does not serve."""

    event_id: str | None
    type: str


ClientEvent = SessionUpdate | AudioAppend | BufferCommit | BufferClear | OtherEvent


def parse_client_event(message: dict, max_audio_bytes: int) -> ClientEvent:
    """One client event from its JSON object; EventError if it is not one (the session goes on),
    FrameTooLarge for more audio than a live frame may hold (the stream ends)."""
    event_id = message.get("event_id")
    event_id = str(event_id)[:200] if event_id is not None else None
    kind = message.get("type")
    if not isinstance(kind, str) or not kind:
        raise EventError(InvalidMessage("an event needs a 'type' (e.g. input_audio_buffer.append)"),
                         event_id, "type")
    if kind in ("session.update", "transcription_session.update"):
        session = message.get("session")
        if not isinstance(session, dict):
            raise EventError(InvalidMessage(f"{kind} needs a 'session' object"), event_id, "session")
        return SessionUpdate(event_id, session, kind == "transcription_session.update")
    if kind == "input_audio_buffer.append":
        audio = message.get("audio")
        if not isinstance(audio, str):
            raise EventError(InvalidMessage("input_audio_buffer.append needs 'audio': base64 of "
                                            "16-bit PCM"), event_id, "audio")
        too_large = FrameTooLarge(f"an append holds at most {max_audio_bytes} bytes of audio, as "
                                  "a binary frame of the other live routes; send smaller chunks")
        if len(audio) > 4 * -(-max_audio_bytes // 3):
            raise too_large
        try:
            data = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise EventError(InvalidMessage("'audio' is not valid base64"), event_id, "audio") from None
        if len(data) > max_audio_bytes:
            raise too_large
        return AudioAppend(event_id, data)
    if kind == "input_audio_buffer.commit":
        return BufferCommit(event_id)
    if kind == "input_audio_buffer.clear":
        return BufferClear(event_id)
    return OtherEvent(event_id, kind[:80])


# ---------------------------------------------------------------------------- the session
def _get(d: dict, *path: str) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


@dataclass(frozen=True)
class SessionConfig:
    """A transcription session's settings, as OpenAI names them (``language`` as the client gave
    it, read as a SenseVoice language by :attr:`sensevoice_language`)."""

    id: str = field(default_factory=lambda: new_id("sess"))
    rate: int = OPENAI_RATE_HZ
    model: str = MODELS[0]
    language: str | None = None
    prompt: str = ""
    server_vad: bool = True  # turn_detection server_vad (null: the client commits its turns)
    beta: bool = False  # answered in the beta dialect

    @property
    def sensevoice_language(self) -> str:
        return sensevoice_language(self.language) if self.language else AUTO_LANGUAGE

    def updated(self, session: dict, beta: bool, min_rate: int, max_rate: int) -> SessionConfig:
        """These settings with ``session``'s (either dialect's keys) applied; InvalidParam for a
        value this server cannot serve. Keys it has no use for (noise reduction, logprobs, the
        prompt's content) are accepted."""
        kind = session.get("type")
        if kind not in (None, "transcription"):
            raise InvalidParam("this server serves transcription sessions only: set session.type "
                               "to 'transcription' (connect with ?intent=transcription)",
                               param="session.type")
        ga = _get(session, "audio", "input") or {}
        fmt = ga.get("format") if "format" in ga else session.get("input_audio_format")
        transcription = ga.get("transcription") if "transcription" in ga else \
            session.get("input_audio_transcription")
        vad_given = "turn_detection" in ga or "turn_detection" in session
        vad = ga.get("turn_detection") if "turn_detection" in ga else session.get("turn_detection")
        out = replace(self, beta=beta)
        if fmt is not None:
            name = fmt.get("type") if isinstance(fmt, dict) else fmt
            if name not in PCM_FORMATS:
                raise InvalidParam(f"this server takes 16-bit PCM audio ('audio/pcm', or 'pcm16'), "
                                   f"not {str(name)[:40]!r}", param="audio.input.format")
            rate = fmt.get("rate") if isinstance(fmt, dict) else None
            if rate is not None:
                if not isinstance(rate, int) or not min_rate <= rate <= max_rate:
                    raise InvalidParam(f"the audio rate must be a whole number of hertz between "
                                       f"{min_rate} and {max_rate} ({OPENAI_RATE_HZ}: OpenAI's)",
                                       param="audio.input.format.rate")
                out = replace(out, rate=rate)
            elif name == "pcm16":
                out = replace(out, rate=OPENAI_RATE_HZ)
        if isinstance(transcription, dict):
            if transcription.get("model"):
                out = replace(out, model=str(transcription["model"])[:80])
            if "language" in transcription:
                language = transcription["language"]
                out = replace(out, language=str(language)[:40] if language else None)
                out.sensevoice_language  # noqa: B018 (refused here when it names none)
            if isinstance(transcription.get("prompt"), str):
                out = replace(out, prompt=transcription["prompt"][:1000])
        if vad_given:
            if vad is not None and (not isinstance(vad, dict) or vad.get("type") not in
                                    (None, "server_vad", "semantic_vad")):
                raise InvalidParam("turn_detection must be server_vad or null",
                                   param="audio.input.turn_detection")
            out = replace(out, server_vad=vad is not None)
        return out

    def describe(self, pause_s: float, pad_s: float, threshold: float) -> dict:
        """The session as OpenAI's ``session`` object of its dialect (the speech detection rules
        are the server's: ``pause_s``, ``pad_s`` and ``threshold``)."""
        vad = {"type": "server_vad", "threshold": threshold,
               "prefix_padding_ms": round(pad_s * 1000),
               "silence_duration_ms": round(pause_s * 1000)} if self.server_vad else None
        transcription = {"model": self.model, "language": self.language, "prompt": self.prompt}
        if self.beta:
            return {"id": self.id, "object": "realtime.transcription_session",
                    "modalities": ["text"], "input_audio_format": "pcm16",
                    "input_audio_transcription": transcription, "turn_detection": vad,
                    "input_audio_noise_reduction": None, "include": None}
        return {"type": "transcription", "object": "realtime.transcription_session", "id": self.id,
                "audio": {"input": {"format": {"type": "audio/pcm", "rate": self.rate},
                                    "transcription": transcription, "noise_reduction": None,
                                    "turn_detection": vad}},
                "include": []}


# ---------------------------------------------------------------------------- server events
@dataclass
class ServerEvent:
    """An event the server sends: its fields, plus ``type`` and a fresh ``event_id``."""

    TYPE: ClassVar[str] = ""

    def body(self) -> dict:
        out = {"type": self.type, "event_id": new_id("event")}
        out.update((f.name, getattr(self, f.name)) for f in fields(self))
        return out

    @property
    def type(self) -> str:
        return self.TYPE


@dataclass
class SessionState(ServerEvent):
    """``session.created`` / ``session.updated`` (``transcription_session.*`` in beta)."""

    session: dict
    beta: bool = False
    created: bool = False

    def body(self) -> dict:
        prefix = "transcription_session" if self.beta else "session"
        return {"type": f"{prefix}.{'created' if self.created else 'updated'}",
                "event_id": new_id("event"), "session": self.session}


@dataclass
class ErrorEvent(ServerEvent):
    """``error``: OpenAI's error shape (``type`` from the HTTP status, as for /v1's REST errors;
    ``code`` this server's stable code)."""

    TYPE: ClassVar[str] = "error"
    error: dict

    @classmethod
    def of(cls, e: SenseVoiceError, event_id: str | None = None, param: str | None = None) -> ErrorEvent:
        return cls({"type": error_type(e.status), "code": e.code, "message": e.message,
                    "param": param or getattr(e, "param", None), "event_id": event_id})


@dataclass
class SpeechStarted(ServerEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.speech_started"
    item_id: str
    audio_start_ms: int


@dataclass
class SpeechStopped(ServerEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.speech_stopped"
    item_id: str
    audio_end_ms: int


@dataclass
class Committed(ServerEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.committed"
    item_id: str
    previous_item_id: str | None


@dataclass
class Cleared(ServerEvent):
    TYPE: ClassVar[str] = "input_audio_buffer.cleared"


@dataclass
class TranscriptDelta(ServerEvent):
    TYPE: ClassVar[str] = "conversation.item.input_audio_transcription.delta"
    item_id: str
    delta: str
    content_index: int = 0


@dataclass
class TranscriptCompleted(ServerEvent):
    """The utterance's text (tags removed), and SenseVoice's reading of it in fields of their
    own: ``raw_text`` (the model's output, tags included) and ``segments`` (language, emotion,
    events, itn, text, start, end of each block), ``start`` / ``end`` seconds from the session's
    first audio."""

    TYPE: ClassVar[str] = "conversation.item.input_audio_transcription.completed"
    item_id: str
    transcript: str
    usage: dict
    raw_text: str
    segments: tuple[Segment, ...]
    start: float
    end: float
    content_index: int = 0
