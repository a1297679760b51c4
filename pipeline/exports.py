"""Downloads of a finished transcript: TXT, JSON (the full typed result), SRT and WebVTT.

Cue timing comes from the segments (seconds); segments without times (a short clip) get one cue over
the whole recording, or consecutive placeholder cues of 1 s when there are several. Cues are sorted,
never overlap (an end is clipped to the next start), and cue text never breaks the format: newlines
are collapsed, ``-->`` is neutralised, and WebVTT text escapes ``&``, ``<`` and ``>``.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from .types import Segment, Transcript

FORMATS = ("txt", "json", "srt", "vtt")
MEDIA_TYPES = {"txt": "text/plain; charset=utf-8", "json": "application/json",
               "srt": "application/x-subrip; charset=utf-8", "vtt": "text/vtt; charset=utf-8"}
PLACEHOLDER_CUE_S = 1.0  # seconds per cue when segments carry no times


@dataclass(frozen=True)
class ExportOptions:
    tags: bool = True  # prefix cues with "[en] [HAPPY] [Laughter] "
    speaker: bool = True  # prefix cues with "left: " / a WebVTT voice span


@dataclass(frozen=True)
class Cue:
    start: float
    end: float
    segment: Segment


def export(transcript: Transcript, fmt: str, options: ExportOptions = ExportOptions(),
           job_meta: dict | None = None) -> tuple[bytes, str]:
    """(body, media type) of ``transcript`` in ``fmt``."""
    if fmt == "json":
        body = json.dumps({**(job_meta or {}), "result": asdict(transcript)}, ensure_ascii=False, indent=1)
    elif fmt == "txt":
        body = _txt(transcript, options)
    elif fmt == "srt":
        body = _srt(cues(transcript, (job_meta or {}).get("audio_seconds")), options)
    elif fmt == "vtt":
        body = _vtt(cues(transcript, (job_meta or {}).get("audio_seconds")), options)
    else:
        raise ValueError(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    return body.encode("utf-8"), MEDIA_TYPES[fmt]


def cues(transcript: Transcript, duration: float | None = None) -> list[Cue]:
    """Timed, sorted, non-overlapping cues for the segments that carry text or tags."""
    segs = list(transcript.segments)
    if not segs:
        return []
    if all(s.start is not None and s.end is not None for s in segs):
        timed = sorted(((s.start, s.end, s) for s in segs), key=lambda t: (t[0], t[1]))
    elif len(segs) == 1:
        timed = [(0.0, float(duration or PLACEHOLDER_CUE_S), segs[0])]
    else:
        timed = [(i * PLACEHOLDER_CUE_S, (i + 1) * PLACEHOLDER_CUE_S, s) for i, s in enumerate(segs)]
    out = []
    for i, (start, end, seg) in enumerate(timed):
        if i + 1 < len(timed):
            end = min(end, timed[i + 1][0])
        out.append(Cue(start, max(start, end), seg))
    return out


def _prefix(seg: Segment, options: ExportOptions) -> str:
    parts = []
    if options.tags:
        parts += [f"[{t}]" for t in (seg.language, seg.emotion, *seg.events) if t]
    return " ".join(parts) + (" " if parts else "")


def _clean(text: str) -> str:
    """One line of cue text that cannot end the cue or fake a timing line."""
    return " ".join(text.split()).replace("-->", "->")


def _clock(seconds: float, sep: str) -> str:
    ms = int(round(max(seconds, 0.0) * 1000))
    h, rem = divmod(ms, 3_600_000)
    m, rem = divmod(rem, 60_000)
    s, ms = divmod(rem, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _txt(transcript: Transcript, options: ExportOptions) -> str:
    lines = []
    for seg in transcript.segments:
        who = f"{seg.speaker}: " if options.speaker and seg.speaker else ""
        when = f"[{_clock(seg.start, '.')} - {_clock(seg.end, '.')}] " if seg.start is not None \
            and seg.end is not None else ""
        lines.append(f"{when}{who}{_prefix(seg, options)}{_clean(seg.text)}".rstrip())
    return "\n".join(lines) + "\n"


def _srt(items: list[Cue], options: ExportOptions) -> str:
    blocks = []
    for n, c in enumerate(items, 1):
        who = f"{_clean(c.segment.speaker)}: " if options.speaker and c.segment.speaker else ""
        text = f"{who}{_prefix(c.segment, options)}{_clean(c.segment.text)}".strip() or "..."
        blocks.append(f"{n}\n{_clock(c.start, ',')} --> {_clock(c.end, ',')}\n{text}\n")
    return "\n".join(blocks)


def _vtt_escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _vtt(items: list[Cue], options: ExportOptions) -> str:
    blocks = ["WEBVTT\n"]
    for c in items:
        text = _vtt_escape(f"{_prefix(c.segment, options)}{_clean(c.segment.text)}".strip() or "...")
        if options.speaker and c.segment.speaker:
            text = f"<v {_vtt_escape(_clean(c.segment.speaker))}>{text}</v>"
        blocks.append(f"{_clock(c.start, '.')} --> {_clock(c.end, '.')}\n{text}\n")
    return "\n".join(blocks)
