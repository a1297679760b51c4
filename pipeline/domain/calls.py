"""The calls table: one summary per finished job, and the query (filter, sort, page, CSV) over them.

:func:`summarize` runs once, when a job finishes (the stores keep its :class:`CallSummary` beside
the job: pipeline/serving/calls_index.py), so that a listing never parses a transcript: per speaker
(``""`` for a one-speaker recording, ``left``/``right`` for a split stereo call) the seconds of
speech and the seconds per emotion, the events counted (Laughter, Cry, Cough, ...), the languages
by their share of speech. A listing joins it with the job's record (name, date, state) and its
:class:`~pipeline.domain.review.Review` (flags, corrections, reviewed) into :class:`CallRow` s, and
:func:`run_query` filters, sorts and pages them in memory (10,000 rows: docs/BENCHMARKS.md).

:class:`CallsQuery` is built from a client's values (hostile: bounded lists, bounded strings,
names checked against the vocabulary, numbers finite): ``emotions`` such as
``("right", "ANGRY", ">", 0.2)`` ("the customer is angry more than 20 % of their speaking time";
speaker ``"*"`` is anyone), ``events`` such as ``("Cry", 1)`` ("has crying").
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, field
from typing import Any

from pipeline.domain.errors import InvalidOption
from pipeline.domain.review import Review
from pipeline.domain.tags import EMOTIONS, EVENTS, LANGUAGES
from pipeline.domain.types import JobState, Transcript

MAX_PER_PAGE = 500
MAX_FILTERS = 16  # emotion or event conditions in one query
MAX_SEARCH_CHARS = 200
SORT_KEYS = ("created_at", "name", "audio_seconds", "languages", "speakers", "flags",
             "corrected", "reviewed", "state")  # and "event:<Event>", "emotion:<speaker>:<EMO>"
STATES = tuple(s.value for s in JobState if s is not JobState.PURGED)
SPEAKER_MAX_CHARS = 40


@dataclass(frozen=True)
class CallSummary:
    """What the table shows of a finished transcript (seconds are of speech, per speaker)."""

    languages: tuple[str, ...] = ()  # by share of speech, largest first
    speakers: tuple[str, ...] = ()  # "" for one unnamed speaker
    speech_s: dict[str, float] = field(default_factory=dict)  # speaker -> seconds
    emotions: dict[str, dict[str, float]] = field(default_factory=dict)  # speaker -> EMO -> s
    events: dict[str, int] = field(default_factory=dict)  # event -> segments that carry it
    segments: int = 0

    def share(self, speaker: str, emotion: str) -> float:
        """The share (0..1) of ``speaker``'s speech with ``emotion``; ``"*"``: the largest share
        any speaker has."""
        if speaker == "*":
            return max((self.share(s, emotion) for s in self.speech_s), default=0.0)
        total = self.speech_s.get(speaker, 0.0)
        return self.emotions.get(speaker, {}).get(emotion, 0.0) / total if total > 0 else 0.0

    def to_dict(self) -> dict:
        return {"languages": list(self.languages), "speakers": list(self.speakers),
                "speech_s": self.speech_s, "emotions": self.emotions, "events": self.events,
                "segments": self.segments}

    @classmethod
    def from_dict(cls, d: dict) -> "CallSummary":
        return cls(languages=tuple(d.get("languages", ())), speakers=tuple(d.get("speakers", ())),
                   speech_s=dict(d.get("speech_s", {})), emotions=dict(d.get("emotions", {})),
                   events=dict(d.get("events", {})), segments=int(d.get("segments", 0)))


def summarize(transcript: Transcript, audio_seconds: float | None = None) -> CallSummary:
    """The summary of a finished transcript. A segment's time is its span as the subtitles time
    it (the rich-text segments of one VAD piece share the piece by characters; untimed segments
    share ``audio_seconds``); a segment with no time counts its characters' reading time, so an
    untimed transcript still has shares."""
    from pipeline.domain.exports import segment_spans

    segs = transcript.segments
    try:
        spans = segment_spans(transcript, audio_seconds)
    except Exception:  # never let a summary fail a finish: shares by characters instead
        spans = [(0.0, len(s.text) / 15.0) for s in segs]
    speech: dict[str, float] = {}
    emotions: dict[str, dict[str, float]] = {}
    langs: dict[str, float] = {}
    events: dict[str, int] = {}
    for seg, (a, b) in zip(segs, spans):
        seconds = max(b - a, 0.0) or len(seg.text) / 15.0
        spk = seg.speaker or ""
        speech[spk] = speech.get(spk, 0.0) + seconds
        if seg.emotion:
            per = emotions.setdefault(spk, {})
            per[seg.emotion] = per.get(seg.emotion, 0.0) + seconds
        if seg.language and seg.language != "nospeech":
            langs[seg.language] = langs.get(seg.language, 0.0) + seconds
        for ev in set(seg.events):
            if ev != "Speech":
                events[ev] = events.get(ev, 0) + 1
    r = lambda x: round(x, 3)  # noqa: E731
    return CallSummary(
        languages=tuple(sorted(langs, key=lambda k: -langs[k])),
        speakers=tuple(sorted(speech)),
        speech_s={k: r(v) for k, v in speech.items()},
        emotions={s: {e: r(v) for e, v in per.items()} for s, per in emotions.items()},
        events=events, segments=len(segs))


def search_text(transcript: Transcript | None, review: Review | None, filename: str = "") -> str:
    """What a text search looks in (lower case): the name, the model's text, the reviewer's
    corrections and notes."""
    parts = [filename]
    if transcript is not None:
        parts.append(transcript.text)
    if review is not None:
        for s in review.segments.values():
            parts += [s.text or "", s.note]
    return "\n".join(p for p in parts if p).lower()


_NO_REVIEW = Review()
SUMMARY_CACHE_SIZE = 50_000  # parsed summaries kept (a job's summary never changes once written)
_summaries: dict[str, CallSummary] = {}


def parsed_summary(job_id: str, raw: bytes | str | None) -> CallSummary | None:
    """The summary stored as ``raw`` JSON, parsed once per job (listings of 10,000 jobs read the
    same summaries again and again: parsing them all took most of a listing's time)."""
    if not raw:
        return None
    hit = _summaries.get(job_id)
    if hit is None:
        import orjson

        hit = CallSummary.from_dict(orjson.loads(raw))
        if len(_summaries) >= SUMMARY_CACHE_SIZE:
            _summaries.pop(next(iter(_summaries)))
        _summaries[job_id] = hit
    return hit


class CallRow:
    """One job as the table lists it. Its summary is parsed when first used (a page of 50 sorted
    by date parses none of the other 9,950)."""

    __slots__ = ("id", "state", "filename", "created_at", "audio_seconds", "finished_at",
                 "error_code", "review", "search", "kept_until", "_raw", "_summary")

    def __init__(self, id: str, state: str, filename: str, created_at: float, audio_seconds: float,
                 finished_at: float | None = None, error_code: str | None = None,
                 summary: CallSummary | None = None, review: Review | None = None,
                 search: str = "", summary_raw: bytes | str | None = None, kept_until: float | None = None):
        self.id, self.state, self.filename = id, state, filename
        self.created_at, self.audio_seconds = created_at, audio_seconds
        self.finished_at, self.error_code = finished_at, error_code
        self.review = review if review is not None else _NO_REVIEW
        self.search = search  # lower case (filled only for a text search)
        self.kept_until = kept_until  # kept beyond its retention until then (POST /api/jobs/{id}/keep)
        self._raw, self._summary = summary_raw, summary

    @property
    def summary(self) -> CallSummary | None:
        """None until the job finished."""
        if self._summary is None and self._raw:
            self._summary = parsed_summary(self.id, self._raw)
        return self._summary

    def __eq__(self, other) -> bool:
        return isinstance(other, CallRow) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"CallRow({self.id!r}, {self.state!r}, {self.filename!r})"

    def to_dict(self) -> dict:
        s = self.summary or CallSummary()
        shares = {spk: {e: round(s.share(spk, e), 4) for e in per} for spk, per in s.emotions.items()}
        return {
            "id": self.id, "state": self.state, "filename": self.filename,
            "created_at": self.created_at, "finished_at": self.finished_at,
            "audio_seconds": self.audio_seconds, "error_code": self.error_code,
            "languages": list(s.languages), "speakers": list(s.speakers),
            "emotion_shares": shares, "events": s.events, "segments": s.segments,
            "flags": self.review.flagged, "corrected": self.review.corrected,
            "reviewed": self.review.reviewed,
        }


@dataclass(frozen=True)
class EmotionFilter:
    speaker: str  # "*" = any speaker
    emotion: str
    op: str  # ">" or "<"
    share: float  # 0..1


@dataclass(frozen=True)
class CallsQuery:
    q: str = ""  # text search (name, transcript, corrections, notes)
    name: str = ""  # in the file name
    states: tuple[str, ...] = ()
    languages: tuple[str, ...] = ()  # any of them
    emotions: tuple[EmotionFilter, ...] = ()  # all of them
    events: tuple[tuple[str, int], ...] = ()  # (event, at least n), all of them
    flagged: bool | None = None
    corrected: bool | None = None
    reviewed: bool | None = None
    created_from: float | None = None  # unix s
    created_to: float | None = None
    min_seconds: float | None = None
    max_seconds: float | None = None
    min_speakers: int | None = None
    sort: str = "created_at"
    desc: bool = True
    page: int = 1
    per_page: int = 50

    @classmethod
    def from_json(cls, d: Any) -> "CallsQuery":
        """From a client's JSON object (every field optional; see the module docstring)."""
        if d is None:
            return cls()
        if not isinstance(d, dict):
            raise InvalidOption("the query must be a JSON object")
        known = set(cls.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise InvalidOption(f"unknown query field(s): {', '.join(sorted(map(str, unknown)))[:200]}")
        q = _text(d.get("q"), MAX_SEARCH_CHARS, "q")
        name = _text(d.get("name"), MAX_SEARCH_CHARS, "name")
        states = _names(d.get("states"), STATES, "state")
        languages = _names(d.get("languages"), LANGUAGES, "language")
        emotions = tuple(_emotion(e) for e in _list(d.get("emotions"), "emotions"))
        events = tuple(_event(e) for e in _list(d.get("events"), "events"))
        sort = d.get("sort", "created_at")
        if not isinstance(sort, str) or not _sort_ok(sort):
            raise InvalidOption(f"unknown sort {str(sort)[:60]!r}; choose one of "
                                f"{', '.join(SORT_KEYS)}, event:<Event> or emotion:<speaker>:<EMOTION>")
        per_page = _int(d.get("per_page", 50), 1, MAX_PER_PAGE, "per_page")
        return cls(
            q=q.lower(), name=name.lower(), states=states, languages=languages,
            emotions=emotions, events=events,
            flagged=_bool(d.get("flagged"), "flagged"), corrected=_bool(d.get("corrected"), "corrected"),
            reviewed=_bool(d.get("reviewed"), "reviewed"),
            created_from=_num(d.get("created_from"), "created_from"),
            created_to=_num(d.get("created_to"), "created_to"),
            min_seconds=_num(d.get("min_seconds"), "min_seconds"),
            max_seconds=_num(d.get("max_seconds"), "max_seconds"),
            min_speakers=None if d.get("min_speakers") is None else _int(d["min_speakers"], 0, 64, "min_speakers"),
            sort=sort, desc=_bool(d.get("desc", True), "desc") is not False,
            page=_int(d.get("page", 1), 1, 1_000_000, "page"), per_page=per_page)


# The desk's one-click filters and its two tag columns (static/desk.js draws them from the page's
# vocabulary, window.SenseVoiceVocab.desk): what a QA reviewer looks for first in a day's calls.
QUICK_FILTERS = (
    ("f_angry", {"emotions": [{"speaker": "*", "emotion": "ANGRY", "op": ">", "share": 0.2}]}),
    ("f_cry", {"events": [{"event": "Cry", "min": 1}]}),
    ("f_laugh", {"events": [{"event": "Laughter", "min": 1}]}),
    ("f_flagged", {"flagged": True}),
    ("f_unreviewed", {"reviewed": False}),
)
TAG_COLUMNS = {"emotion": "emotion:*:ANGRY", "event": "event:Cry"}  # sort keys of the two tag columns


def desk_table() -> dict:
    """What static/desk.js needs beside the tags: its quick filters (each a CallsQuery fragment)
    and the sort keys of its emotion and event columns (JSON-ready)."""
    return {"quick": [[key, query] for key, query in QUICK_FILTERS], "columns": dict(TAG_COLUMNS)}


def _text(v: Any, limit: int, what: str) -> str:
    if v is None:
        return ""
    if not isinstance(v, str) or len(v) > limit:
        raise InvalidOption(f"{what} must be a string of at most {limit} characters")
    return v.strip()


def _list(v: Any, what: str) -> list:
    if v is None:
        return []
    if not isinstance(v, list) or len(v) > MAX_FILTERS:
        raise InvalidOption(f"{what} must be a list of at most {MAX_FILTERS} items")
    return v


def _names(v: Any, allowed, what: str) -> tuple[str, ...]:
    out = []
    for x in _list(v, what + "s"):
        if x not in allowed:
            raise InvalidOption(f"unknown {what} {str(x)[:40]!r}; choose among {', '.join(allowed)}")
        out.append(x)
    return tuple(out)


def _bool(v: Any, what: str) -> bool | None:
    if v is None or isinstance(v, bool):
        return v
    raise InvalidOption(f"{what} must be true, false or null")


def _num(v: Any, what: str) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise InvalidOption(f"{what} must be a finite number")
    return float(v)


def _int(v: Any, lo: int, hi: int, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise InvalidOption(f"{what} must be an integer from {lo} to {hi}")
    return v


def _speaker(v: Any) -> str:
    if not isinstance(v, str) or len(v) > SPEAKER_MAX_CHARS:
        raise InvalidOption(f"an emotion filter's speaker must be a string of at most "
                            f"{SPEAKER_MAX_CHARS} characters ('*' for anyone)")
    return v


def _emotion(e: Any) -> EmotionFilter:
    if not isinstance(e, dict):
        raise InvalidOption('an emotion filter is {"speaker", "emotion", "op", "share"}')
    emotion = e.get("emotion")
    if emotion not in EMOTIONS:
        raise InvalidOption(f"unknown emotion {str(emotion)[:40]!r}; choose among {', '.join(EMOTIONS)}")
    op = e.get("op", ">")
    if op not in (">", "<"):
        raise InvalidOption("an emotion filter's op is '>' or '<'")
    share = _num(e.get("share", 0.0), "share")
    if not 0.0 <= share <= 1.0:
        raise InvalidOption("an emotion filter's share is from 0 to 1 (0.2 = 20 %)")
    return EmotionFilter(_speaker(e.get("speaker", "*")), emotion, op, share)


def _event(e: Any) -> tuple[str, int]:
    if not isinstance(e, dict):
        raise InvalidOption('an event filter is {"event", "min"}')
    event = e.get("event")
    if event not in EVENTS:
        raise InvalidOption(f"unknown event {str(event)[:40]!r}; choose among {', '.join(EVENTS)}")
    return event, _int(e.get("min", 1), 0, 1_000_000, "an event filter's min")


def _sort_ok(sort: str) -> bool:
    if sort in SORT_KEYS:
        return True
    kind, _, rest = sort.partition(":")
    if kind == "event":
        return rest in EVENTS
    if kind == "emotion":
        spk, _, emo = rest.rpartition(":")
        return emo in EMOTIONS and len(spk) <= SPEAKER_MAX_CHARS
    return False


def matches(row: CallRow, q: CallsQuery) -> bool:
    if q.states and row.state not in q.states:
        return False
    if q.name and q.name not in row.filename.lower():
        return False
    if q.q and q.q not in row.search:
        return False
    if q.created_from is not None and row.created_at < q.created_from:
        return False
    if q.created_to is not None and row.created_at > q.created_to:
        return False
    if q.min_seconds is not None and row.audio_seconds < q.min_seconds:
        return False
    if q.max_seconds is not None and row.audio_seconds > q.max_seconds:
        return False
    if q.flagged is not None and (row.review.flagged > 0) != q.flagged:
        return False
    if q.corrected is not None and (row.review.corrected > 0) != q.corrected:
        return False
    if q.reviewed is not None and row.review.reviewed != q.reviewed:
        return False
    if not (q.languages or q.min_speakers is not None or q.emotions or q.events):
        return True
    s = row.summary
    if q.languages and (s is None or not set(q.languages) & set(s.languages)):
        return False
    if q.min_speakers is not None and (s is None or len(s.speakers) < q.min_speakers):
        return False
    for f in q.emotions:
        if s is None:
            return False
        share = s.share(f.speaker, f.emotion)
        if not (share > f.share if f.op == ">" else share < f.share):
            return False
    for event, n in q.events:
        if (s.events.get(event, 0) if s is not None else 0) < n:
            return False
    return True


def _sort_key(sort: str):
    if sort == "name":
        return lambda r: (r.filename.lower(), r.created_at)
    if sort in ("created_at", "audio_seconds", "state"):
        return lambda r: (getattr(r, sort), r.created_at)
    if sort == "languages":
        return lambda r: (",".join(r.summary.languages) if r.summary else "~", r.created_at)
    if sort == "speakers":
        return lambda r: (len(r.summary.speakers) if r.summary else -1, r.created_at)
    if sort in ("flags", "corrected"):
        attr = "flagged" if sort == "flags" else "corrected"
        return lambda r: (getattr(r.review, attr), r.created_at)
    if sort == "reviewed":
        return lambda r: (r.review.reviewed, r.created_at)
    kind, _, rest = sort.partition(":")
    if kind == "event":
        return lambda r: (r.summary.events.get(rest, 0) if r.summary else -1, r.created_at)
    spk, _, emo = rest.rpartition(":")
    return lambda r: (r.summary.share(spk or "*", emo) if r.summary else -1.0, r.created_at)


@dataclass(frozen=True)
class CallsPage:
    total: int  # rows that match
    rows: list[CallRow]  # this page's
    page: int
    per_page: int


def run_query(rows: list[CallRow], q: CallsQuery, paged: bool = True) -> CallsPage:
    """Filter, sort (stable; ties by date) and page ``rows``."""
    hits = [r for r in rows if matches(r, q)]
    hits.sort(key=_sort_key(q.sort), reverse=q.desc)
    if not paged:
        return CallsPage(len(hits), hits, 1, len(hits))
    a = (q.page - 1) * q.per_page
    return CallsPage(len(hits), hits[a:a + q.per_page], q.page, q.per_page)


CSV_COLUMNS = ("id", "name", "state", "created_at_utc", "audio_seconds", "languages", "speakers",
               "emotion_shares", "events", "flags", "corrected", "reviewed")
CSV_CHUNK_ROWS = 1000  # rows per chunk of csv_chunks
# what a spreadsheet may run as a formula, or split into another cell, at the start of a cell (the
# fullwidth forms too: some spreadsheets read them as the ASCII ones)
CSV_DANGEROUS_START = frozenset("=+-@;,|\t\r\uff1d\uff0b\uff0d\uff20")


def csv_cell(value: Any) -> str:
    """A CSV cell that a spreadsheet never runs as a formula and that holds no control character:
    control, format and non-ASCII space characters become a space, and a cell whose first
    character after any leading whitespace (spaces, tabs, NBSP, other Unicode spaces) is one of
    ``= + - @ ; , |`` (a hostile file name such as ``=HYPERLINK(...)``, one with a tab or a NBSP
    before its ``=``, ``;=1+1`` read by a ``;``-separated spreadsheet) is written after a single
    quote. The one guard of every CSV the server writes (with every cell quoted: :func:`csv_chunks`)."""
    text = value if isinstance(value, str) else str(value)
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else " " for ch in text)
    head = text.lstrip()
    return "'" + text if head[:1] in CSV_DANGEROUS_START else text


def _csv_fields(r: CallRow) -> tuple:
    """One row's cells (unguarded), as the table shows them."""
    import time as _time

    s = r.summary
    shares = events = langs = speakers = ""
    if s is not None:
        shares = "; ".join(
            f"{spk or 'all'} {emo} {share * 100:.0f}%"
            for spk, per in sorted(s.emotions.items())
            for emo, share in sorted(((e, round(s.share(spk, e), 4)) for e in per), key=lambda kv: -kv[1])
            if share >= 0.005)
        events = "; ".join(f"{k} {v}" for k, v in sorted(s.events.items()))
        langs = " ".join(s.languages)
        speakers = " ".join(x or "1" for x in s.speakers)
    review = r.review
    return (r.id, r.filename, r.state,
            _time.strftime("%Y-%m-%d %H:%M:%S", _time.gmtime(r.created_at)),
            f"{r.audio_seconds:.2f}", langs, speakers, shares, events, review.flagged,
            review.corrected, "yes" if review.reviewed else "no")


def csv_chunks(rows: list[CallRow], chunk_rows: int = CSV_CHUNK_ROWS):
    """The table as CSV, in pieces of ``chunk_rows`` rows (str; the first starts with a BOM, for
    spreadsheets, and the header): every cell quoted and guarded (:func:`csv_cell`)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\r\n", quoting=csv.QUOTE_ALL)
    buf.write("\ufeff")
    w.writerow([csv_cell(c) for c in CSV_COLUMNS])
    for a in range(0, len(rows), chunk_rows):
        w.writerows([[csv_cell(x) for x in _csv_fields(r)] for r in rows[a:a + chunk_rows]])
        yield buf.getvalue()
        buf.seek(0)
        buf.truncate()
    if buf.tell():
        yield buf.getvalue()


def to_csv(rows: list[CallRow]) -> str:
    """The table as CSV (UTF-8 with a BOM for spreadsheets; one row per call): :func:`csv_chunks`
    joined."""
    return "".join(csv_chunks(rows))
