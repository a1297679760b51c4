"""A reviewer's work on one finished job: corrected segment texts (the model's text kept beside
them), flags with a note, and the call marked reviewed.

Pure values (no storage, no web): :class:`Review` is what the job stores keep with the job
(pipeline/serving/reviews.py), :class:`ReviewPatch` one request's changes, validated here against
the job's transcript (every value a client sends is hostile: bounded lengths, the segment index
checked against the transcript, control characters removed). :func:`corrected_transcript` is the
transcript with the reviewer's text (what txt/srt/vtt export), :func:`result_with_review` the JSON
of the result that keeps both (``text`` the reviewer's, ``model_text`` the model's, ``corrected``,
``flagged``, ``note`` on every segment).

Segments are addressed by their index in ``Transcript.segments`` (the order of the job's JSON).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from typing import Any

from pipeline.domain.errors import InvalidOption
from pipeline.domain.types import Transcript

MAX_TEXT_CHARS = 5000  # a corrected segment text (a 30 s piece of fast speech is ~600)
MAX_NOTE_CHARS = 1000  # a flag's note
MAX_EDITS = 500  # segment edits in one request
# control characters other than tab/newline, bidi overrides and isolates (a note must not
# reorder what follows it on the page or in a CSV), and the BOM
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069\ufeff]")
_BLANKS = re.compile(r"[ \t\r\n\u2028\u2029]+")


def clean_text(value: str, limit: int, what: str) -> str:
    """A client's text, made safe to store: unsafe controls dropped, runs of whitespace (line
    breaks included: a segment is one line) made one space, trimmed, at most ``limit`` chars."""
    if not isinstance(value, str):
        raise InvalidOption(f"{what} must be a string")
    if len(value) > limit:
        raise InvalidOption(f"{what} is {len(value)} characters long; at most {limit} are kept")
    return _BLANKS.sub(" ", _UNSAFE.sub("", value)).strip()


@dataclass(frozen=True)
class SegmentReview:
    """The reviewer's changes to one segment; the defaults mean "untouched"."""

    text: str | None = None  # the corrected text; None: the model's stands
    flagged: bool = False
    note: str = ""  # the flag's note (kept while flagged)
    updated_at: float = 0.0  # unix s

    @property
    def empty(self) -> bool:
        return self.text is None and not self.flagged and not self.note


@dataclass(frozen=True)
class Review:
    """Everything a reviewer changed on one job."""

    reviewed: bool = False
    reviewed_at: float | None = None  # unix s, when marked reviewed
    updated_at: float | None = None  # unix s, the latest change
    segments: dict[int, SegmentReview] = field(default_factory=dict)

    @property
    def corrected(self) -> int:
        return sum(1 for s in self.segments.values() if s.text is not None)

    @property
    def flagged(self) -> int:
        return sum(1 for s in self.segments.values() if s.flagged)

    @property
    def empty(self) -> bool:
        return not self.reviewed and not self.segments

    def to_dict(self) -> dict:
        """The stored form (and the ``review`` of the REST answer)."""
        return {
            "reviewed": self.reviewed, "reviewed_at": self.reviewed_at,
            "updated_at": self.updated_at, "corrected": self.corrected, "flagged": self.flagged,
            "segments": [{"index": i, "text": s.text, "flagged": s.flagged, "note": s.note,
                          "updated_at": s.updated_at} for i, s in sorted(self.segments.items())],
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> "Review":
        """The stored form back (tolerant: a malformed entry is skipped, never raised)."""
        if not isinstance(d, dict):
            return cls()
        segments = {}
        for s in d.get("segments") or ():
            try:
                idx = int(s["index"])
                text = s.get("text")
                segments[idx] = SegmentReview(
                    text=str(text) if text is not None else None, flagged=bool(s.get("flagged")),
                    note=str(s.get("note") or ""), updated_at=float(s.get("updated_at") or 0.0))
            except (KeyError, TypeError, ValueError):
                continue
        return cls(reviewed=bool(d.get("reviewed")), reviewed_at=_opt_float(d.get("reviewed_at")),
                   updated_at=_opt_float(d.get("updated_at")), segments=segments)


def _opt_float(v: Any) -> float | None:
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


_UNSET: Any = object()


@dataclass(frozen=True)
class SegmentEdit:
    """One segment's change in a request; a field left at its default is not changed.
    ``text=None`` goes back to the model's text."""

    index: int
    text: Any = _UNSET  # str, None (the model's again), or unset
    flagged: bool | None = None
    note: str | None = None


@dataclass(frozen=True)
class ReviewPatch:
    reviewed: bool | None = None
    edits: tuple[SegmentEdit, ...] = ()

    @classmethod
    def from_json(cls, body: Any) -> "ReviewPatch":
        """A request body ``{"reviewed": bool?, "segments": [{"index", "text"?, "flagged"?,
        "note"?}]}``, checked field by field (InvalidOption, 400, names what is wrong)."""
        if not isinstance(body, dict):
            raise InvalidOption("the body must be a JSON object")
        unknown = set(body) - {"reviewed", "segments"}
        if unknown:
            raise InvalidOption(f"unknown field(s): {', '.join(sorted(map(str, unknown)))[:200]}")
        reviewed = body.get("reviewed")
        if reviewed is not None and not isinstance(reviewed, bool):
            raise InvalidOption("reviewed must be true or false")
        raw = body.get("segments") or []
        if not isinstance(raw, list):
            raise InvalidOption("segments must be a list")
        if len(raw) > MAX_EDITS:
            raise InvalidOption(f"{len(raw)} segment edits in one request; at most {MAX_EDITS}")
        edits = []
        for e in raw:
            if not isinstance(e, dict):
                raise InvalidOption("each segment edit must be an object")
            bad = set(e) - {"index", "text", "flagged", "note"}
            if bad:
                raise InvalidOption(f"unknown segment field(s): {', '.join(sorted(map(str, bad)))[:200]}")
            idx = e.get("index")
            if not isinstance(idx, int) or isinstance(idx, bool):
                raise InvalidOption("each segment edit needs an integer index")
            text = e["text"] if "text" in e else _UNSET
            if text is not _UNSET and text is not None:
                text = clean_text(text, MAX_TEXT_CHARS, "a corrected text")
            flagged = e.get("flagged")
            if flagged is not None and not isinstance(flagged, bool):
                raise InvalidOption("flagged must be true or false")
            note = e.get("note")
            if note is not None:
                note = clean_text(note, MAX_NOTE_CHARS, "a note")
            edits.append(SegmentEdit(idx, text, flagged, note))
        return cls(reviewed=reviewed, edits=tuple(edits))


def apply_patch(review: Review, patch: ReviewPatch, transcript: Transcript,
                now: float | None = None) -> Review:
    """``review`` with ``patch`` applied, checked against ``transcript`` (an index outside its
    segments is refused). A corrected text equal to the model's is no correction; an empty one
    is (the reviewer heard nothing there). A note without a flag flags the segment."""
    now = time.time() if now is None else now
    n = len(transcript.segments)
    segments = dict(review.segments)
    for e in patch.edits:
        if not 0 <= e.index < n:
            raise InvalidOption(f"segment index {e.index} is out of range: this transcript has "
                                f"{n} segment{'s' if n != 1 else ''}")
        cur = segments.get(e.index, SegmentReview())
        if e.text is not _UNSET:
            model = transcript.segments[e.index].text
            cur = replace(cur, text=None if e.text is None or e.text == model else e.text)
        if e.note is not None:
            cur = replace(cur, note=e.note, flagged=True if e.flagged is None and e.note else cur.flagged)
        if e.flagged is not None:
            cur = replace(cur, flagged=e.flagged, note=cur.note if e.flagged else "")
        cur = replace(cur, updated_at=now)
        if cur.empty:
            segments.pop(e.index, None)
        else:
            segments[e.index] = cur
    reviewed, reviewed_at = review.reviewed, review.reviewed_at
    if patch.reviewed is not None and patch.reviewed != review.reviewed:
        reviewed, reviewed_at = patch.reviewed, now if patch.reviewed else None
    return Review(reviewed=reviewed, reviewed_at=reviewed_at, updated_at=now, segments=segments)


def corrected_transcript(transcript: Transcript, review: Review | None) -> Transcript:
    """The transcript with the reviewer's texts (``text`` rebuilt from them as the model's is:
    non-empty segment texts joined by one space); the model's when nothing was corrected."""
    if review is None or not review.corrected:
        return transcript
    segs = tuple(replace(s, text=review.segments[i].text)
                 if i in review.segments and review.segments[i].text is not None else s
                 for i, s in enumerate(transcript.segments))
    return replace(transcript, segments=segs, text=" ".join(s.text for s in segs if s.text))


def result_with_review(transcript: Transcript, review: Review | None) -> dict:
    """The result's JSON keeping both texts: every segment carries ``corrected`` (bool),
    ``model_text``, ``flagged`` and ``note``; ``text`` is the reviewer's where corrected; the
    top-level ``text`` is rebuilt from them and ``model_text`` keeps the model's."""
    review = review or Review()
    out = corrected_transcript(transcript, review).to_dict()
    out["model_text"] = transcript.text
    for i, (seg, model) in enumerate(zip(out["segments"], transcript.segments)):
        r = review.segments.get(i, SegmentReview())
        seg["corrected"] = r.text is not None
        seg["model_text"] = model.text
        seg["flagged"] = r.flagged
        seg["note"] = r.note
    return out


def review_json(review: Review | None) -> dict:
    """A job's review as the REST API answers it (counts and marks; the per-segment changes are
    in the result's segments)."""
    review = review or Review()
    return {"reviewed": review.reviewed, "reviewed_at": review.reviewed_at,
            "updated_at": review.updated_at, "corrected": review.corrected,
            "flagged": review.flagged}
