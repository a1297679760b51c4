"""Typed values that cross module boundaries. Frozen dataclasses, never bare dicts."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field, fields, is_dataclass

import orjson

# (hotwords_from_funasr, hotwords_from_prompt: re-exported, the routes read options from here)
from pipeline.domain.hotwords import Hotword, hotwords_from_funasr, hotwords_from_prompt, parse_hotwords  # noqa: F401
from pipeline.domain.redact_kinds import parse_redact, parse_redact_audio
from pipeline.domain.tags import AUTO_LANGUAGE, LANGUAGES, NO_SPEECH, REQUEST_LANGUAGES

ALLOWED_LANGUAGES = tuple(code for code in LANGUAGES if code != NO_SPEECH)  # what an allow-list may name


class Lane(enum.IntEnum):
    """Scheduling lane: lower value is served first."""

    INTERACTIVE = 0  # UI jobs
    BULK = 1  # API / CLI jobs


class JobState(str, enum.Enum):
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    PURGED = "purged"  # result and audio deleted after the retention period


@dataclass(frozen=True)
class TranscribeOptions:
    """What the caller asks for. Hashable: it can key a batch group."""

    language: str = AUTO_LANGUAGE  # one of REQUEST_LANGUAGES
    use_itn: bool = True  # inverse text normalisation (punctuation, digits)
    ban_emo_unk: bool = False  # never emit <|EMO_UNKNOWN|>
    split_channels: bool = False  # stereo call: transcribe each channel as its own speaker
    word_timestamps: bool = False  # per-word times from the CTC alignment (60 ms frames)
    # the language allow-list: the model's language decision is taken only among these (and
    # "no speech"); () = any. A comma-separated text ("zh,en") is accepted and normalised.
    languages: tuple[str, ...] = ()
    # words or phrases the decoder favours (pipeline/domain/hotwords.py); a list or a text is
    # accepted and normalised. Per job: the engine decodes each row of a batch with its own list
    hotwords: tuple[Hotword, ...] = ()
    # speakers on a mono recording (pipeline/audio/diarize.py): on when ``diarize`` is set or a
    # count or a bound is given; ``speakers`` the count (None: found, within min/max); 0 = off.
    # A form's text ("2", "") is accepted and normalised
    diarize: bool = False
    speakers: int | None = None
    min_speakers: int | None = None
    max_speakers: int | None = None
    # personal data masked in the result before it is stored (pipeline/domain/redaction.py): the
    # kinds, from "pii" (all) or a comma list such as "card,phone"; () = none
    redact: tuple[str, ...] = ()
    # the recording served back (GET /api/jobs/{id}/audio) with those items' spans "silence"d or
    # "beep"ed; "" = as uploaded. Given alone, it masks every kind ("pii"); it turns word times on
    redact_audio: str = ""

    @property
    def wants_speakers(self) -> bool:
        return bool(self.diarize or self.speakers or self.min_speakers or self.max_speakers)

    def __post_init__(self) -> None:
        from pipeline.domain.errors import InvalidOption

        _check_speakers(self, InvalidOption)

        if self.hotwords and not (isinstance(self.hotwords, tuple)
                                  and all(isinstance(h, Hotword) for h in self.hotwords)):
            object.__setattr__(self, "hotwords", parse_hotwords(self.hotwords))
        elif not self.hotwords:
            object.__setattr__(self, "hotwords", ())

        if self.redact:
            object.__setattr__(self, "redact", parse_redact(self.redact))
        elif self.redact != ():
            object.__setattr__(self, "redact", ())
        if self.redact_audio:
            object.__setattr__(self, "redact_audio", parse_redact_audio(self.redact_audio))
            if not self.redact:
                object.__setattr__(self, "redact", parse_redact("pii"))
            object.__setattr__(self, "word_timestamps", True)  # the spans are the words' times
        elif self.redact_audio != "":
            object.__setattr__(self, "redact_audio", "")

        if self.language not in REQUEST_LANGUAGES:
            raise InvalidOption(
                f"unknown language {self.language!r}; choose one of {', '.join(REQUEST_LANGUAGES)}"
            )
        if not isinstance(self.languages, tuple):
            object.__setattr__(self, "languages", parse_languages(self.languages))
        for code in self.languages:
            if code not in ALLOWED_LANGUAGES:
                raise InvalidOption(f"unknown language {code!r} in languages; choose among "
                                    f"{', '.join(ALLOWED_LANGUAGES)}")


MAX_SPEAKERS = 16  # the largest speaker count a caller may give or bound


def _check_speakers(o: "TranscribeOptions", invalid: type[Exception]) -> None:
    """Counts are whole numbers 1..MAX_SPEAKERS; ``speakers=0`` means off, refused beside an ask
    for speakers (``diarize`` or a bound); min <= speakers <= max."""
    for name in ("speakers", "min_speakers", "max_speakers"):
        v = getattr(o, name)
        if isinstance(v, str):  # a form's text: "" is none, else a whole number
            text = v.strip()
            if text and not (text.isascii() and text.isdigit() and len(text) <= 3):
                raise invalid(f"{name} must be a whole number, got {v[:20]!r}")
            v = int(text) if text else None
            object.__setattr__(o, name, v)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            raise invalid(f"{name} must be a whole number, got {v!r}")
        if name == "speakers" and v == 0:
            if o.diarize or o.min_speakers or o.max_speakers:
                raise invalid("speakers=0 turns speakers off, but speakers were asked for "
                              "(diarize or min/max_speakers): give a count of 1 or more, or none")
            object.__setattr__(o, "speakers", None)
            continue
        if not 1 <= v <= MAX_SPEAKERS:
            raise invalid(f"{name}={v}: a speaker count must be within 1..{MAX_SPEAKERS}")
    low, high = o.min_speakers or 1, o.max_speakers or MAX_SPEAKERS
    if low > high:
        raise invalid(f"min_speakers={low} is above max_speakers={high}")
    if o.speakers is not None and not low <= o.speakers <= high:
        raise invalid(f"speakers={o.speakers} is outside min_speakers..max_speakers ({low}..{high})")


def parse_languages(value) -> tuple[str, ...]:
    """An allow-list from a comma-separated text or a list ("zh, en" -> ("zh", "en")); "auto"
    or nothing means any language (()). Names are checked by :class:`TranscribeOptions`."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else [str(v) for v in value]
    codes = []
    for item in (v.strip() for v in items):
        if item and item != AUTO_LANGUAGE and item not in codes:
            codes.append(item)
    return tuple(codes)


@dataclass(frozen=True)
class Word:
    """A word (merged SentencePiece pieces) with its CTC-aligned time span."""

    text: str
    start: float  # seconds
    end: float  # seconds
    probability: float | None = None  # the mean of its pieces' CTC probabilities (0-1)


@dataclass(frozen=True)
class Segment:
    """One block of rich text: <|lang|><|EMO|><|Event|>...<|itn|>text."""

    language: str
    emotion: str
    events: tuple[str, ...]
    itn: str
    text: str
    start: float | None = None  # seconds
    end: float | None = None  # seconds
    speaker: str | None = None  # e.g. "left"/"right" channel of a stereo call; None when mono
    words: tuple[Word, ...] = ()  # when word timestamps were asked for
    # confidence from the model's CTC posteriors (None where not computed)
    avg_logprob: float | None = None  # mean log probability of the text's tokens (Whisper's field)
    language_probability: float | None = None  # of the language tag, among the (allowed) languages
    emotion_probability: float | None = None  # of the emotion tag, among the emotions
    event_probability: float | None = None  # of the (first) event tag, among the events


@dataclass(frozen=True)
class Transcript:
    text: str  # plain text, tags removed
    raw_text: str  # exactly what the model emitted, tags included
    segments: tuple[Segment, ...] = ()

    def to_dict(self) -> dict:
        return _plain(self)

    def to_json(self) -> str:
        """``to_dict`` as JSON (UTF-8 text kept as it is), serialised by orjson straight from the
        dataclasses: ~0.5 us where json.dumps of to_dict took ~13 (a finished batch encodes
        every transcript)."""
        return orjson.dumps(self).decode()

    @classmethod
    def from_dict(cls, d: dict) -> "Transcript":
        known = Segment.__dataclass_fields__  # a reviewed result's extra keys (corrected, ...) are not
        segs = tuple(
            Segment(**{**{k: v for k, v in s.items() if k in known},
                       "events": tuple(s.get("events", ())),
                       "words": tuple(Word(**w) for w in s.get("words", ()))})
            for s in d.get("segments", ())
        )
        return cls(text=d["text"], raw_text=d["raw_text"], segments=segs)


@dataclass(frozen=True)
class JobError:
    code: str
    message: str


@dataclass(frozen=True)
class Job:
    id: str
    state: JobState
    options: TranscribeOptions
    lane: Lane
    created_at: float  # unix seconds
    audio_seconds: float
    filename: str = ""  # the client's name, for display only (never used as a path)
    started_at: float | None = None
    finished_at: float | None = None
    attempts: int = 0
    result: Transcript | None = None
    error: JobError | None = None
    position: int | None = None  # place in queue (1 = next), when queued
    meta: dict = field(default_factory=dict, compare=False)

    @property
    def duration_s(self) -> float | None:
        """Compute time (start to finish), seconds."""
        if self.started_at is None or self.finished_at is None:
            return None
        return self.finished_at - self.started_at


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _plain(obj):
    """``dataclasses.asdict`` without its deep copies (a finished batch encodes every transcript:
    asdict was most of that time): dataclasses to dicts, tuples kept as tuples, the rest as is."""
    cls = type(obj)
    if cls is tuple:
        return tuple(_plain(v) for v in obj)
    names = _FIELD_NAMES.get(cls)
    if names is None:
        if not is_dataclass(cls):
            return obj
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return {n: _plain(getattr(obj, n)) for n in names}
