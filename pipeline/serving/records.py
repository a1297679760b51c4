"""What both brokers store the same way: a long job's piece results, the options' JSON, and the
user-facing error of a failed write (the disk or the store is full, or an I/O error)."""

from __future__ import annotations

import errno
import functools
import json
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.domain.errors import SenseVoiceError, StorageError, StorageFull
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
    avg_logprob: float | None = None  # the engine's confidence (EngineOutput's); not stored yet
    tag_probs: tuple[tuple[str, float], ...] = ()


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
