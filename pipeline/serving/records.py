"""What both brokers store the same way: a long job's piece results, the options' JSON, and the
user-facing error of a failed write (the disk or the store is full, or an I/O error).

A piece's words are stored as ``[text, start, end]`` (as by the previous release) and its scores
(issue 39: the segment's ``avg_logprob``, its tags' probabilities and each word's probability)
beside them as one JSON object (:func:`dump_scores`), absent when the engine gave none: a row of
the previous release, without it, reads back with no scores (None)."""

from __future__ import annotations

import errno
import functools
import json
import sqlite3
from collections.abc import Sequence
import dataclasses
from dataclasses import dataclass
from typing import Any

from pipeline.domain.errors import SenseVoiceError, StorageError, StorageFull
from pipeline.domain.hotwords import dump_hotwords
from pipeline.domain.redaction import redact_across, redact_rich  # noqa: F401 (redact_across: for the worker)
from pipeline.domain.richtext import parse_rich_text
from pipeline.domain.types import Segment, TranscribeOptions, Transcript, Word


@dataclass(frozen=True)
class SegmentResult:
    """The model's raw output for one piece (VAD segment and/or channel) of a long job."""

    job_id: str
    idx: int  # position in the job's piece list
    start_s: float
    end_s: float
    speaker: str | None
    raw_text: str
    words: tuple[Word, ...] = ()  # absolute times in the recording
    pieces: int = 0  # how many pieces the job has (for its progress; 0 when unknown)
    avg_logprob: float | None = None  # the engine's confidence (EngineOutput's)
    tag_probs: tuple[tuple[str, float], ...] = ()  # (tag, probability among its kind)


def dump_words(words: Sequence[Word]) -> list[list]:
    """A piece's words as stored: ``[text, start, end]`` each (their probabilities are scores)."""
    return [[w.text, w.start, w.end] for w in words]


def dump_scores(r: SegmentResult) -> dict[str, Any] | None:
    """A piece's scores as stored beside its words, or None when it has none (nothing stored)."""
    probs = [w.probability for w in r.words]
    if r.avg_logprob is None and not r.tag_probs and all(p is None for p in probs):
        return None
    scores: dict[str, Any] = {"avg_logprob": r.avg_logprob,
                              "tag_probs": [[tag, p] for tag, p in r.tag_probs]}
    if any(p is not None for p in probs):
        scores["word_probs"] = probs
    return scores


def load_piece(job_id: str, idx: int, start_s: float, end_s: float, speaker: str | None,
               raw_text: str, words: Sequence[Sequence], scores: dict[str, Any] | None = None
               ) -> SegmentResult:
    """A stored piece read back: ``words`` as :func:`dump_words` wrote them, ``scores`` as
    :func:`dump_scores` did (None or absent: a row without scores, e.g. of the previous release)."""
    scores = scores or {}
    probs = scores.get("word_probs") or ()
    if len(probs) != len(words):  # never mismatched when written together; ignore rather than shift
        probs = ()
    if probs:
        ws = tuple(Word(w[0], w[1], w[2], p) for w, p in zip(words, probs))
    else:
        ws = tuple(Word(w[0], w[1], w[2]) for w in words)
    return SegmentResult(job_id, idx, start_s, end_s, speaker, raw_text, ws,
                         avg_logprob=scores.get("avg_logprob"),
                         tag_probs=tuple((str(t), float(p)) for t, p in scores.get("tag_probs") or ()))


def redacted_piece(p: SegmentResult, kinds: Sequence[str]) -> SegmentResult:
    """``p`` with ``kinds`` of personal data masked in its text and words (pipeline/domain/
    redaction.py); the worker applies it before a piece is stored or joins a transcript."""
    r = redact_rich(p.raw_text, p.words, kinds, span=(round(p.start_s, 3), round(p.end_s, 3)))
    return dataclasses.replace(p, raw_text=r.raw_text, words=r.words)


def transcript_from_pieces(pieces: Sequence[SegmentResult]) -> Transcript:
    """One typed transcript from the raw outputs of a job's pieces, in time order."""
    segments = []
    ordered = sorted(pieces, key=lambda p: (p.start_s, p.idx)) if len(pieces) > 1 else pieces
    for p in ordered:
        start, end = round(p.start_s, 3), round(p.end_s, 3)
        probs = dict(p.tag_probs)
        for k, seg in enumerate(parse_rich_text(p.raw_text)):  # (dataclasses.replace is slow)
            first = k == 0
            segments.append(Segment(language=seg.language, emotion=seg.emotion, events=seg.events,
                                    itn=seg.itn, text=seg.text, start=start, end=end,
                                    speaker=p.speaker, words=p.words if first else (),
                                    avg_logprob=p.avg_logprob if first else None,
                                    language_probability=probs.get(seg.language) if first else None,
                                    emotion_probability=probs.get(seg.emotion) if first else None,
                                    event_probability=(probs.get(seg.events[0]) if first and seg.events
                                                       else None)))
    raw = "".join(p.raw_text for p in ordered)
    text = " ".join(s.text for s in segments if s.text)
    return Transcript(text=text, raw_text=raw, segments=tuple(segments))


def dump_options(o: TranscribeOptions) -> str:
    d = {"language": o.language, "use_itn": o.use_itn, "ban_emo_unk": o.ban_emo_unk,
         "split_channels": o.split_channels, "word_timestamps": o.word_timestamps}
    if o.languages:  # only when set: a worker of the previous release reads the rest
        d["languages"] = list(o.languages)
    if o.hotwords:  # the same: only when set
        d["hotwords"] = dump_hotwords(o.hotwords)
    for name in ("diarize", "speakers", "min_speakers", "max_speakers"):  # the same: when set
        if getattr(o, name):
            d[name] = getattr(o, name)
    if o.redact:  # when set (a worker of the previous release cannot build these options, so it
        d["redact"] = list(o.redact)  # never stores such a job's text unredacted)
    if o.redact_audio:
        d["redact_audio"] = o.redact_audio
    return json.dumps(d)


@functools.lru_cache(maxsize=1024)
def load_options(text: str | bytes) -> TranscribeOptions:
    """The options of a stored JSON text (few distinct values: parsed once each; frozen, shared)."""
    return TranscribeOptions(**json.loads(text))


# errno values that mean "no room": the disk, a quota, or the process's file-size limit
NO_SPACE_ERRNOS = frozenset({errno.ENOSPC, errno.EFBIG, errno.EDQUOT})


def storage_error(e: OSError | sqlite3.Error) -> SenseVoiceError:
    """The user-facing error for a failed write: 507 when storage is full, else 503 (retry)."""
    full = (getattr(e, "errno", None) in NO_SPACE_ERRNOS
            or getattr(e, "sqlite_errorcode", None) == sqlite3.SQLITE_FULL
            or "disk is full" in str(e))
    if full:
        return StorageFull("the server has no room to store this upload (disk full); "
                           "try a smaller file or try again later")
    return StorageError("the server could not store this upload (an I/O error); try again")
