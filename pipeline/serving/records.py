"""What both brokers store the same way: a long job's piece results, the options' JSON, and the
user-facing error of a failed write (the disk or the store is full, or an I/O error)."""

from __future__ import annotations

import errno
import functools
import json
import sqlite3
from dataclasses import dataclass

from pipeline.domain.errors import SenseVoiceError, StorageError, StorageFull
from pipeline.domain.types import TranscribeOptions, Word


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


def dump_options(o: TranscribeOptions) -> str:
    return json.dumps({"language": o.language, "use_itn": o.use_itn, "ban_emo_unk": o.ban_emo_unk,
                       "split_channels": o.split_channels, "word_timestamps": o.word_timestamps})


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
