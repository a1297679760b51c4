"""Downloads of a finished transcript: plain text, JSON, SRT and WebVTT.

``export(transcript, fmt, options, job_meta) -> (body, media_type)``; the body is UTF-8 bytes.

* **txt**: one line per segment, in transcript order:
  ``[00:01:02.500 - 00:01:05.000] agent: [en] [HAPPY] text`` when the segment has times, else
  ``agent: [en] [HAPPY] text`` (an untimed segment with nothing to show gives no line).
* **json**: ``job_meta``'s keys (id, audio_seconds, ...) and ``"result"``: the whole typed result,
  ``dataclasses.asdict(transcript)``, the same shape as a job in the REST API;
  ``Transcript.from_dict(doc["result"])`` reads it back. ``options`` do not apply.
* **srt**: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, then the cue text.
* **vtt**: ``WEBVTT`` header, ``HH:MM:SS.mmm --> HH:MM:SS.mmm`` cues; the speaker as a voice span
  ``<v agent>text</v>``.

Cue rules (srt and vtt):

* one segment is one line: line breaks, tabs and other control characters in the text (and in
  the speaker name) become single spaces, so a cue never holds a blank line; ``-->`` is rewritten
  to ``->`` so text can never look like a timing line;
* in vtt, ``&``, ``<`` and ``>`` in text and speaker are written ``&amp;``, ``&lt;``, ``&gt;``
  (srt is plain text and is written as is);
* segments without text (after the tag prefix) give no cue;
* cues are sorted by start (stable) and never overlap: a cue's end is clipped to the next cue's
  start; a cue that would be left shorter than 1 ms (two segments starting together, e.g. both
  channels of a call) is joined to the next one as a line above it;
* times: when every segment has ``start`` and ``end``, those are used (rounded to ms, ``end`` at
  least 1 ms after ``start``). Otherwise no time is trusted and cues are laid end to end from 0,
  each lasting a share of the duration proportional to its text length, where the duration is
  ``job_meta["audio_seconds"]`` when given (so a single untimed segment spans the whole audio),
  else estimated at :data:`CHARS_PER_SECOND` with at least :data:`MIN_UNTIMED_CUE_S` per cue.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.domain.errors import InvalidOption
from pipeline.domain.types import Segment, Transcript

FORMATS = ("txt", "json", "srt", "vtt")
MEDIA_TYPES = {
    "txt": "text/plain; charset=utf-8",
    "json": "application/json",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}
CHARS_PER_SECOND = 15.0  # reading speed used to size cues of untimed segments
MIN_UNTIMED_CUE_S = 1.0  # s, shortest estimated cue
# C0 controls (\t \n \r ...), DEL, NEL, line and paragraph separators: each run becomes a space
_LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")
_SPACES = re.compile(r" {2,}")


@dataclass(frozen=True)
class ExportOptions:
    """What a download shows. Hashable; override with ``dataclasses.replace``."""

    tags: bool = True  # prefix each cue/line with its tags, e.g. "[en] [HAPPY] [Laughter] "
    speaker: bool = True  # show the segment's speaker ("agent: ", or <v agent> in vtt)
    tag_format: str = "[{}]"  # how one tag is written; "{}" is the tag name
    hidden_tags: tuple[str, ...] = ()  # tag names never shown, e.g. ("Speech", "EMO_UNKNOWN")


@dataclass(frozen=True)
class _Cue:
    start: int  # ms
    end: int  # ms
    lines: tuple[tuple[str, str], ...]  # (speaker, text) per line, already cleaned


def export(
    transcript: Transcript,
    fmt: str,
    options: ExportOptions = ExportOptions(),
    job_meta: dict | None = None,
) -> tuple[bytes, str]:
    """``(body, media_type)`` of ``transcript`` as ``fmt`` (one of :data:`FORMATS`)."""
    if fmt not in FORMATS:
        raise InvalidOption(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if fmt == "json":
        body = _json(transcript, job_meta)
    elif fmt == "txt":
        body = _txt(_segments(transcript), options)
    else:
        cues = _cues(_segments(transcript), options, _audio_seconds(job_meta))
        body = _srt(cues) if fmt == "srt" else _vtt(cues)
    return body.encode("utf-8"), MEDIA_TYPES[fmt]


# -- text -------------------------------------------------------------------------------------


def clean_line(text: str) -> str:
    """One line of plain text: control characters and line breaks become one space, no ``-->``."""
    text = _SPACES.sub(" ", _LINE_BREAKS.sub(" ", text)).strip()
    while "-->" in text:
        text = text.replace("-->", "->")
    return text


def vtt_escape(text: str) -> str:
    """Escape the characters WebVTT cue text treats as markup."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def tag_prefix(segment: Segment, options: ExportOptions) -> str:
    """``"[en] [HAPPY] [Laughter] "`` for ``segment`` (empty when tags are off or none show)."""
    if not options.tags:
        return ""
    names = [segment.language, segment.emotion, *segment.events]
    shown = [options.tag_format.format(n) for n in names if n and n not in options.hidden_tags]
    return " ".join(shown) + " " if shown else ""


def _segments(transcript: Transcript) -> tuple[Segment, ...]:
    """The segments to export; a transcript with text but no segments gives one untimed one."""
    if transcript.segments:
        return transcript.segments
    if transcript.text.strip():
        return (Segment(language="", emotion="", events=(), itn="", text=transcript.text),)
    return ()


def _speaker(segment: Segment, options: ExportOptions) -> str:
    return clean_line(segment.speaker) if options.speaker and segment.speaker else ""


def _times(segment: Segment) -> tuple[float, float] | None:
    """``(start, end)`` seconds when both are finite numbers, else ``None``."""
    a, b = segment.start, segment.end
    if a is None or b is None or not (math.isfinite(a) and math.isfinite(b)):
        return None
    return float(a), float(b)


# -- txt / json -------------------------------------------------------------------------------


def _clock(ms: int, sep: str) -> str:
    """``HH:MM:SS<sep>mmm`` (hours grow past 99 if they must)."""
    ms = max(ms, 0)
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{sep}{ms:03d}"


def _ms(seconds: float) -> int:
    return max(0, round(seconds * 1000))


def _txt(segments: Sequence[Segment], options: ExportOptions) -> str:
    lines = []
    for seg in segments:
        text = clean_line(tag_prefix(seg, options) + seg.text)
        speaker = _speaker(seg, options)
        line = f"{speaker}: {text}".strip() if speaker else text
        times = _times(seg)
        if times is not None:
            a, b = _ms(times[0]), _ms(times[1])
            line = f"[{_clock(a, '.')} - {_clock(max(a, b), '.')}] {line}".strip()
        if line:
            lines.append(line)
    return "".join(line + "\n" for line in lines)


def _json_default(value: object) -> object:
    if isinstance(value, enum.Enum):
        return value.value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=str)
    return str(value)


def _json(transcript: Transcript, job_meta: dict | None) -> str:
    doc = {**(job_meta or {}), "result": dataclasses.asdict(transcript)}
    return json.dumps(doc, ensure_ascii=False, indent=2, default=_json_default) + "\n"


def _audio_seconds(job_meta: dict | None) -> float | None:
    value = (job_meta or {}).get("audio_seconds")
    usable = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if usable and math.isfinite(value) and value > 0 else None


# -- cues -------------------------------------------------------------------------------------


def _cues(
    segments: Sequence[Segment], options: ExportOptions, duration: float | None
) -> list[_Cue]:
    """Timed, sorted, non-overlapping cues (see the module docstring for the rules)."""
    items = []  # (segment, speaker, text)
    for seg in segments:
        text = clean_line(tag_prefix(seg, options) + seg.text)
        if text:
            items.append((seg, _speaker(seg, options), text))
    if not items:
        return []
    spans = [_times(seg) for seg, _, _ in items]
    if all(t is not None for t in spans):
        ms = [(_ms(a), _ms(b)) for a, b in spans]  # type: ignore[misc]
    else:
        ms = _lay_out([text for _, _, text in items], duration)
    cues = [
        _Cue(a, max(b, a + 1), ((speaker, text),)) for (a, b), (_, speaker, text) in zip(ms, items)
    ]
    cues.sort(key=lambda c: c.start)  # stable: equal starts keep transcript order
    return _no_overlap(cues)


def _lay_out(texts: Sequence[str], duration: float | None) -> list[tuple[int, int]]:
    """End-to-end cue times from 0 for untimed segments, shared by text length."""
    weights = [max(len(t), 1) for t in texts]
    if duration is None:
        duration = sum(max(w / CHARS_PER_SECOND, MIN_UNTIMED_CUE_S) for w in weights)
    total_ms, total_w = _ms(duration), sum(weights)
    out, acc = [], 0
    for w in weights:
        a = round(total_ms * acc / total_w)
        acc += w
        out.append((a, round(total_ms * acc / total_w)))
    return out


def _no_overlap(cues: list[_Cue]) -> list[_Cue]:
    """Clip each cue's end to the next start; join a cue left under 1 ms into the next one."""
    out: list[_Cue] = []
    pending: _Cue | None = None
    for nxt in cues:
        if pending is not None:
            if nxt.start - pending.start < 1:  # nothing left of pending: join it above nxt
                nxt = _Cue(pending.start, max(pending.end, nxt.end), pending.lines + nxt.lines)
            else:
                out.append(dataclasses.replace(pending, end=min(pending.end, nxt.start)))
        pending = nxt
    if pending is not None:
        out.append(pending)
    return out


def _srt(cues: Sequence[_Cue]) -> str:
    blocks = []
    for i, cue in enumerate(cues, 1):
        lines = "\n".join(f"{sp}: {text}" if sp else text for sp, text in cue.lines)
        blocks.append(f"{i}\n{_clock(cue.start, ',')} --> {_clock(cue.end, ',')}\n{lines}\n")
    return "\n".join(blocks)


def _vtt(cues: Sequence[_Cue]) -> str:
    blocks = ["WEBVTT\n"]
    for cue in cues:
        lines = "\n".join(
            f"<v {vtt_escape(sp)}>{vtt_escape(text)}</v>" if sp else vtt_escape(text)
            for sp, text in cue.lines
        )
        blocks.append(f"{_clock(cue.start, '.')} --> {_clock(cue.end, '.')}\n{lines}\n")
    return "\n".join(blocks)
