"""Downloads of a finished transcript: plain text, JSON, SRT and WebVTT.

``export(transcript, fmt, options, job_meta) -> (body, media_type)``; the body is UTF-8 bytes.

* **txt**: one line per segment, in transcript order:
  ``[00:01:02.500 - 00:01:05.000] agent: [en] [HAPPY] text`` when the segment has times, else
  ``agent: [en] [HAPPY] text`` (an untimed segment with nothing to show gives no line).
* **json**: ``job_meta``'s keys (id, audio_seconds, ...) and ``"result"``: the whole typed result,
  ``dataclasses.asdict(transcript)``, the same shape as a job in the REST API;
  ``Transcript.from_dict(doc["result"])`` reads it back. ``options`` do not apply. A redacted
  transcript's (its text holds masks such as ``[CARD]``) also has ``"redactions"``: each masked
  item's kind, start and end, never its value.
* **srt**: numbered cues, ``HH:MM:SS,mmm --> HH:MM:SS,mmm``, then the cue text; the speaker as
  ``agent: `` before the first line of each cue.
* **vtt**: ``WEBVTT`` header, ``HH:MM:SS.mmm --> HH:MM:SS.mmm`` cues; the speaker as a voice span
  on each line, ``<v agent>text</v>``.

A reviewed job (``review``, pipeline/domain/review.py): every format carries the reviewer's
corrected text; json keeps both (each segment's ``text``, ``model_text``, ``corrected``,
``flagged``, ``note``; the document's ``review``); txt ends a flagged segment's line with
``[FLAGGED: note]``; vtt lists the review and each flag (with its time) in ``NOTE`` blocks after the
header, which players do not show; srt, which has no comments, carries the corrected text only.

Tags (language, emotion, events) are shown in txt and hidden in subtitles unless
``ExportOptions.tags`` says otherwise. Shown in a subtitle, they are a prefix of each cue
(``[en] [HAPPY] text``), or with ``tag_style="class"`` a WebVTT class span on each line
(``<c.en.HAPPY.Laughter>text</c>``, for a player's style sheet; srt has no classes, so shows no
tags in that style).

Subtitle rules (srt and vtt), the usual broadcast limits:

* a cue has at most ``max_lines`` (2) lines of at most ``max_line_chars`` (42) characters, where
  a wide (CJK, fullwidth) character counts as ``42 / max_line_wide`` (18 a line); the speaker
  label and the tag prefix count on the first line (in vtt too, although players show no voice
  name: srt and vtt get the same cues). Two lines are balanced in width;
* a cue lasts at most ``max_cue_s`` (7 s);
* text is never split inside a word: it breaks at spaces, and between CJK characters (never
  before closing punctuation such as ``，。」`` nor after opening punctuation). Among the ways to
  cut a segment into cues within these limits, the cheapest is taken: each cue costs 1, ending it
  inside a clause :data:`WORD_BREAK_COST` more, at a comma :data:`CLAUSE_BREAK_COST` more, at a
  sentence end or a pause nothing; a cue never spans a pause of :data:`PAUSE_BREAK_S` nor holds
  text of two segments (their tags or speakers differ).
  A single word wider than a line (a long URL) stands alone on its line, over the limit;
* cue times come from the word timestamps (``Segment.words``, CTC-aligned) when the segment has
  them; text the words do not cover, and segments without words, share the time between their
  timed neighbours (or the segment's span) in proportion to their characters. The rich-text
  segments of one VAD piece, which all carry the piece's span, share it the same way (their words
  are on the first of them), so their cues never overlap;
* line breaks, tabs and other control characters in the text (and in the speaker name) become
  single spaces, so a cue never holds a blank line; ``-->`` is rewritten to ``->`` so text can
  never look like a timing line;
* in vtt, ``&``, ``<`` and ``>`` in text and speaker are written ``&amp;``, ``&lt;``, ``&gt;``
  (srt is plain text and is written as is);
* segments without text (after the tag prefix) give no cue;
* cues are sorted by start (stable) and never overlap: a cue's end is clipped to the next cue's
  start; a cue that would be left shorter than 1 ms (two speakers starting together) is joined
  to the next one as lines above it (such a cue holds each speaker's lines, so may exceed
  ``max_lines``);
* times: when every segment has ``start`` and ``end``, those are used (rounded to ms, ``end`` at
  least 1 ms after ``start``). Otherwise no time is trusted and segments are laid end to end from
  0, each lasting a share of the duration proportional to its text length, where the duration is
  ``job_meta["audio_seconds"]`` when given, else each its reading time at
  :data:`CHARS_PER_SECOND`, at least :data:`MIN_UNTIMED_CUE_S`; then split into cues as above.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.domain.errors import InvalidOption
from pipeline.domain.redaction import redactions_of
from pipeline.domain.review import Review, corrected_transcript, result_with_review
from pipeline.domain.types import Segment, Transcript, Word

FORMATS = ("txt", "json", "srt", "vtt")
MEDIA_TYPES = {
    "txt": "text/plain; charset=utf-8",
    "json": "application/json",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}
SUBTITLE_FORMATS = ("srt", "vtt")
TAG_STYLES = ("prefix", "class")
CHARS_PER_SECOND = 15.0  # reading speed used to size cues of untimed segments
MIN_UNTIMED_CUE_S = 1.0  # s, shortest estimated cue
MAX_LINE_CHARS = 42  # narrow characters (Latin, Cyrillic, Arabic...) a subtitle line holds
MAX_LINE_WIDE = 18  # wide characters (CJK, fullwidth) a subtitle line holds
MAX_LINES = 2  # lines a cue holds
MAX_CUE_S = 7.0  # s, longest cue
PAUSE_BREAK_S = 1.0  # s, a silence between two words this long ends a cue
CLAUSE_BREAK_COST = 1.5  # a cue ending at a comma costs this much more than at a sentence end
WORD_BREAK_COST = 5.0  # and one ending between two words of a clause this much (a cue costs 1)
SHORT_CUE_COST = 0.5  # times (1 - the share of its lines a cue's text fills) squared: evens cues
_SENTENCE_END = ".!?…。！？"
_CLAUSE_END = ",;:、，；："
_CLOSERS = "\"')]}»”’」』】〕〉》）"  # stripped before looking for a sentence or clause end
_NO_LINE_START = set(",.!?;:%…、。，．！？：；）」』】〕〉》〙〗〛”’・ー々ゝゞぁぃぅぇぉっゃゅょゎァィゥェォッャュョヮヵヶ～)]}»")
_NO_LINE_END = set("([{«（「『【〔〈《〘〖〚“‘")
_CLASS_CHARS = re.compile(r"[^A-Za-z0-9_-]")  # what a WebVTT class name keeps of a tag name
# C0 controls (\t \n \r ...), DEL, NEL, line and paragraph separators: each run becomes a space
_LINE_BREAKS = re.compile(r"[\x00-\x1f\x7f\x85\u2028\u2029]+")
_SPACES = re.compile(r" {2,}")


@dataclass(frozen=True)
class ExportOptions:
    """What a download shows. Hashable; override with ``dataclasses.replace``."""

    # show each line's/cue's tags, e.g. "[en] [HAPPY] [Laughter] "; None = the format's default:
    # shown in txt, hidden in srt and vtt
    tags: bool | None = None
    speaker: bool = True  # show the segment's speaker ("agent: ", or <v agent> in vtt)
    tag_format: str = "[{}]"  # how one tag is written; "{}" is the tag name
    hidden_tags: tuple[str, ...] = ()  # tag names never shown, e.g. ("Speech", "EMO_UNKNOWN")
    tag_style: str = "prefix"  # tags in subtitles: "prefix", or "class" (vtt <c.en.HAPPY> spans)
    max_line_chars: int = MAX_LINE_CHARS  # subtitle line width, narrow characters
    max_line_wide: int = MAX_LINE_WIDE  # subtitle line width, wide (CJK) characters
    max_lines: int = MAX_LINES  # lines in a subtitle cue
    max_cue_s: float = MAX_CUE_S  # s, longest subtitle cue

    def __post_init__(self) -> None:
        if self.tag_style not in TAG_STYLES:
            raise InvalidOption(f"unknown tag style {self.tag_style!r}; choose one of "
                                f"{', '.join(TAG_STYLES)}")
        if min(self.max_line_chars, self.max_line_wide, self.max_lines) < 1 or not (
                self.max_cue_s > 0 and math.isfinite(self.max_cue_s)):
            raise InvalidOption("subtitle limits must be positive")


@dataclass(frozen=True)
class _Line:
    speaker: str  # cleaned; "" when not shown
    prefix: str  # the tag prefix shown before the text (the first line of a segment's cue), or ""
    text: str  # cleaned
    classes: tuple[str, ...]  # vtt class names (tag_style "class")
    lead: bool  # the first line of a segment's cue: srt writes the speaker label on it


@dataclass(frozen=True)
class _Cue:
    start: int  # ms
    end: int  # ms
    lines: tuple[_Line, ...]


def export(
    transcript: Transcript,
    fmt: str,
    options: ExportOptions = ExportOptions(),
    job_meta: dict | None = None,
    review: Review | None = None,
) -> tuple[bytes, str]:
    """``(body, media_type)`` of ``transcript`` as ``fmt`` (one of :data:`FORMATS`), with the
    reviewer's corrections and flags when ``review`` is given."""
    if fmt not in FORMATS:
        raise InvalidOption(f"unknown export format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if options.tags is None:
        options = dataclasses.replace(options, tags=fmt not in SUBTITLE_FORMATS)
    model, transcript = transcript, corrected_transcript(transcript, review)
    if fmt == "json":
        body = _json(transcript, job_meta, model if review is not None else None, review)
    elif fmt == "txt":
        body = _txt(_segments(transcript), options, review)
    else:
        cues = _cues(_segments(transcript), options, _audio_seconds(job_meta))
        body = _srt(cues) if fmt == "srt" else _vtt(cues, _review_notes(
            transcript, review, _audio_seconds(job_meta)))
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


def _txt(segments: Sequence[Segment], options: ExportOptions, review: Review | None = None) -> str:
    lines = []
    flags = {i: r for i, r in (review.segments.items() if review else ()) if r.flagged}
    for i, seg in enumerate(segments):
        text = clean_line(tag_prefix(seg, options) + seg.text)
        speaker = _speaker(seg, options)
        line = f"{speaker}: {text}".strip() if speaker else text
        times = _times(seg)
        if times is not None:
            a, b = _ms(times[0]), _ms(times[1])
            line = f"[{_clock(a, '.')} - {_clock(max(a, b), '.')}] {line}".strip()
        if i in flags:
            note = clean_line(flags[i].note)
            line = f"{line} [FLAGGED{': ' + note if note else ''}]".strip()
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


def _json(transcript: Transcript, job_meta: dict | None, model: Transcript | None = None,
          review: Review | None = None) -> str:
    doc = {**(job_meta or {}), "result": dataclasses.asdict(transcript)}
    if model is not None:  # reviewed: both texts, the marks, and the review itself
        doc["result"] = result_with_review(model, review)
        doc["review"] = review.to_dict()
    masked = redaction_list(model if model is not None else transcript)
    if masked:  # a redacted job's list: kinds and times, never the values
        doc["redactions"] = masked
    return json.dumps(doc, ensure_ascii=False, indent=2, default=_json_default) + "\n"


def redaction_list(transcript: Transcript) -> list[dict]:
    """What a redacted transcript masks (pipeline/domain/redaction.py): each item's kind, start and
    end (its words' times, else its segment's), never its value; [] when nothing is masked."""
    return [r.to_dict() for r in redactions_of(transcript)]


def _audio_seconds(job_meta: dict | None) -> float | None:
    value = (job_meta or {}).get("audio_seconds")
    usable = isinstance(value, (int, float)) and not isinstance(value, bool)
    return float(value) if usable and math.isfinite(value) and value > 0 else None


# -- cues -------------------------------------------------------------------------------------


class _Unit:
    """A piece of cue text never split across lines or cues: a word with its attached punctuation,
    or one CJK character; ``sep`` is what joins it to the unit before ("" or " ")."""

    __slots__ = ("text", "sep", "a", "b", "start", "end", "width", "sep_width")

    def __init__(self, text: str, sep: str, a: int):
        self.text, self.sep, self.a, self.b = text, sep, a, a + len(text)  # a, b: its characters
        self.start: float | None = None  # seconds
        self.end: float | None = None
        self.width = self.sep_width = 0  # set by _measure


@dataclass(frozen=True)
class _Item:
    """A segment with what a cue shows of it."""

    segment: Segment
    text: str  # clean_line(segment.text)
    prefix: str  # the tag prefix (with its trailing space) when tags are shown, else ""
    speaker: str
    classes: tuple[str, ...]  # vtt class names of its tags (tag_style "class")


def _wide(ch: str) -> bool:
    return unicodedata.east_asian_width(ch) in "WF"


def _breakable(ch: str) -> bool:
    """A character a line may break before or after without a space (Han, kana, CJK punctuation,
    fullwidth forms); not Hangul, whose words are separated by spaces."""
    o = ord(ch)
    return (0x2E80 <= o <= 0x2FDF or 0x3000 <= o <= 0x30FF or 0x3100 <= o <= 0x312F
            or 0x31F0 <= o <= 0x31FF or 0x3400 <= o <= 0x4DBF or 0x4E00 <= o <= 0x9FFF
            or 0xF900 <= o <= 0xFAFF or 0xFF00 <= o <= 0xFFEF or 0x20000 <= o <= 0x3FFFF)


def _token_units(token: str, sep: str, a: int) -> list[_Unit]:
    """A whitespace-free token as units: broken between CJK characters (never before closing
    punctuation, never after opening punctuation), else whole."""
    units = [_Unit(token[0], sep, a)]
    for i in range(1, len(token)):
        prev, ch = token[i - 1], token[i]
        if ((_breakable(prev) or _breakable(ch)) and ch not in _NO_LINE_START
                and prev not in _NO_LINE_END):
            units.append(_Unit(ch, "", a + i))
        else:
            units[-1].text += ch
            units[-1].b += 1
    return units


def _text_units(text: str, offset: int) -> list[_Unit]:
    """The units of one segment's (clean) text; ``offset`` is where it starts in its group."""
    units: list[_Unit] = []
    for m in re.finditer(r"\S+", text):
        token = m.group()
        if units and all(ch in _NO_LINE_START for ch in token):  # "word ," "好 。": keep it attached
            units[-1].text += " " + token
            units[-1].b = offset + m.end()
            continue
        units += _token_units(token, " " if units else "", offset + m.start())
    return units


def _align(stream: str, words: Sequence[Word]) -> list[tuple[float, float] | None]:
    """The time of each character of ``stream`` that a word covers (words are matched in order,
    ignoring spaces, within a short window past the last match; a word not found is skipped)."""
    times: list[tuple[float, float] | None] = [None] * len(stream)
    cursor = missed = 0
    for w in words:
        text = "".join(str(w.text).split())
        if not text or not (math.isfinite(w.start) and math.isfinite(w.end)):
            continue
        pos = stream.find(text, cursor, cursor + 8 + 2 * missed + len(text))
        if pos < 0:
            missed += len(text)
            continue
        times[pos:pos + len(text)] = [(float(w.start), float(max(w.start, w.end)))] * len(text)
        cursor, missed = pos + len(text), 0
    return times


def _time_units(units: list[_Unit], times, span: tuple[float, float]) -> None:
    """Give every unit a start and end: the words' times where they cover it, else a share of the
    time between its timed neighbours (or the group's span) proportional to its characters."""
    prev = span[0]
    for u in units:
        hit = [t for t in times[u.a:u.b] if t is not None] if times else []
        if hit:
            u.start = max(min(t[0] for t in hit), prev)
            u.end = prev = max(max(t[1] for t in hit), u.start)
    i, n = 0, len(units)
    while i < n:
        if units[i].start is not None:
            i += 1
            continue
        j = i
        while j < n and units[j].start is None:
            j += 1
        lo = units[i - 1].end if i > 0 else span[0]
        hi = max(units[j].start if j < n else span[1], lo)
        weights = [max(len(u.text) + len(u.sep), 1) for u in units[i:j]]
        total, acc = sum(weights), 0
        for u, w in zip(units[i:j], weights):
            u.start = lo + (hi - lo) * acc / total
            acc += w
            u.end = lo + (hi - lo) * acc / total
        i = j


def _timeline(items: Sequence[_Item], duration: float | None,
              ) -> list[tuple[list[_Unit], tuple[float, float]]]:
    """Per item: its units, timed, and its span (seconds). Segments sharing one span (the
    rich-text segments of one VAD piece) share it by characters, and the words of the piece
    (kept on its first segment) time all of them; without times for every segment no time is
    trusted and items are laid out end to end (see the module docstring)."""
    spans = [_times(it.segment) for it in items]
    timed = all(s is not None for s in spans)
    if not timed:
        laid = _lay_out([it.prefix + it.text for it in items], duration)
        spans = [(a / 1000, b / 1000) for a, b in laid]
    out: list[tuple[list[_Unit], tuple[float, float]]] = []
    i = 0
    while i < len(items):
        j = i + 1
        while (timed and j < len(items) and spans[j] == spans[i]
               and items[j].segment.speaker == items[i].segment.speaker):
            j += 1
        texts, units, offset = [], [], 0
        for k in range(i, j):
            texts.append(items[k].text)
            units.append(_text_units(items[k].text, offset))
            offset += len(items[k].text) + 1
        flat = [u for us in units for u in us]
        words = [w for it in items[i:j] for w in it.segment.words] if timed else []
        start, end = spans[i]
        times = _align(" ".join(texts), words) if words else None
        _time_units(flat, times, (start, max(start, end)))
        if j - i > 1:  # the segments' own spans within the piece's
            for us, k in zip(units, range(i, j)):
                out.append((us, (us[0].start, us[-1].end) if us else _between(units, k - i, start)))
        else:
            out.append((units[0], (start, end)))
        i = j
    return out


def _between(units: list[list[_Unit]], k: int, start: float) -> tuple[float, float]:
    """The instant between the text before an empty segment of a piece and the text after it."""
    before = [u for us in units[:k] for u in us]
    t = before[-1].end if before else start
    return t, t


def _measure(units: Sequence[_Unit], options: ExportOptions) -> None:
    for u in units:
        u.width, u.sep_width = _width(u.text, options), _width(u.sep, options)


def _width(text: str, options: ExportOptions) -> int:
    """Width in 1/(max_line_chars * max_line_wide) of a line: a line holds max_line_chars narrow
    or max_line_wide wide characters (integers: no rounding at the limit)."""
    return sum(options.max_line_chars if _wide(ch) else options.max_line_wide for ch in text)


def _greedy_lines(units: Sequence[_Unit], lead: int, cap: int) -> list[list[_Unit]]:
    """Lines filled one after another; ``lead`` is the width already on the first line (speaker
    label and tag prefix). A unit wider than a line has a line of its own (after the lead)."""
    lines: list[list[_Unit]] = [[]]
    used = lead
    for u in units:
        add = u.width + (u.sep_width if lines[-1] else 0)
        if used + add <= cap or (not lines[-1] and (used == 0 or u.width > cap)):
            lines[-1].append(u)
            used += add
        else:
            lines.append([u])
            used = u.width
    return lines  # the first is empty only when the lead leaves no room: the lead shows there


def _line_width(units: Sequence[_Unit]) -> int:
    return sum(u.width for u in units) + sum(u.sep_width for u in units[1:])


def _wrap(units: Sequence[_Unit], lead: int, options: ExportOptions) -> list[list[_Unit]]:
    """The cue's lines: one when it fits, else two of balanced width (a break after punctuation
    preferred to a third of a line of balance), else (more lines allowed, or a unit wider than a
    line) filled greedily."""
    cap = options.max_line_chars * options.max_line_wide
    greedy = _greedy_lines(units, lead, cap)
    if len(greedy) <= 1 or options.max_lines != 2:
        return greedy
    best, best_cost = None, None
    for k in range(1, len(units)):
        w1, w2 = lead + _line_width(units[:k]), _line_width(units[k:])
        if w1 > cap or w2 > cap:
            continue
        # balance the text (a long lead would otherwise push nearly all of it to the second line);
        # a break after punctuation is worth a third of a line of imbalance
        cost = max(w1 - lead, w2) + (0 if _ends_with(units[k - 1], _CLAUSE_END + _SENTENCE_END)
                                     else cap // 3)
        if best_cost is None or cost < best_cost:
            best, best_cost = k, cost
    return greedy if best is None else [list(units[:best]), list(units[best:])]


def _ends_with(unit: _Unit, marks: str) -> bool:
    core = unit.text.rstrip(_CLOSERS)
    return bool(core) and core[-1] in marks


def _break_cost(units: Sequence[_Unit], k: int) -> float:
    """What ending a cue after ``units[:k]`` costs: nothing at the segment's end, at a sentence end
    or before a pause; a little at a clause end; much elsewhere."""
    if k >= len(units) or units[k].start - units[k - 1].end >= PAUSE_BREAK_S:
        return 0.0
    if _ends_with(units[k - 1], _SENTENCE_END):
        return 0.0
    return CLAUSE_BREAK_COST if _ends_with(units[k - 1], _CLAUSE_END) else WORD_BREAK_COST


def _pack(units: Sequence[_Unit], lead: int, options: ExportOptions) -> list[list[_Unit]]:
    """One segment's units as cues, the cheapest way (dynamic programming over break points): each
    cue costs 1 plus its :func:`_break_cost` plus a little when it is short, so cues are few, end
    at punctuation when they can, and are of even lengths when they cannot.
    A cue fits in ``max_lines`` lines (greedy filling: the fewest lines), lasts at most
    ``max_cue_s`` and spans no pause of ``PAUSE_BREAK_S``; a unit too wide or too long for any
    cue is a cue alone."""
    n = len(units)
    cap = options.max_line_chars * options.max_line_wide
    room = max(options.max_lines * cap - lead, 1)  # what the text of a full cue fills
    best = [0.0] + [math.inf] * n  # best[k]: the cost of cutting units[:k] into cues
    back = [0] * (n + 1)
    breaks = [0.0] + [1.0 + _break_cost(units, k) for k in range(1, n + 1)]
    for i in range(n):
        if best[i] == math.inf:
            continue
        lines, used, empty, total = 1, lead, True, 0
        for j in range(i, n):
            u = units[j]
            if j > i and (u.start - units[j - 1].end >= PAUSE_BREAK_S
                          or u.end - units[i].start > options.max_cue_s):
                break
            add = u.width + (0 if empty else u.sep_width)
            total += add
            if used + add <= cap or (empty and (used == 0 or u.width > cap)):
                used += add
            else:
                lines, used = lines + 1, u.width
            empty = False
            if j > i and lines > options.max_lines:
                break
            short = SHORT_CUE_COST * max(0.0, 1 - total / room) ** 2
            cost = best[i] + breaks[j + 1] + short
            if cost < best[j + 1]:
                best[j + 1], back[j + 1] = cost, i
    cues, k = [], n
    while k > 0:
        cues.append(list(units[back[k]:k]))
        k = back[k]
    return cues[::-1]


def _item_cues(item: _Item, units: list[_Unit], span: tuple[float, float],
               options: ExportOptions) -> list[_Cue]:
    """The cues of one segment's timed units (a segment showing only its tags: one cue)."""
    label = f"{item.speaker}: " if item.speaker else ""
    lead = _width(label + item.prefix, options)
    _measure(units, options)
    out = []
    for cue in (_pack(units, lead, options) if units else [[]]):
        start, end = (cue[0].start, cue[-1].end) if cue else span
        a = _ms(start)
        b = min(max(_ms(end), a + 1), a + max(1, round(options.max_cue_s * 1000)))
        lines = _wrap(cue, lead, options) if cue else [[]]
        out.append(_Cue(a, b, tuple(
            _Line(item.speaker, item.prefix if n == 0 else "", _join_units(line), item.classes,
                  n == 0)
            for n, line in enumerate(lines))))
    return out


def _join_units(units: Sequence[_Unit]) -> str:
    return "".join((u.sep if i else "") + u.text for i, u in enumerate(units))


def _tag_classes(segment: Segment, options: ExportOptions) -> tuple[str, ...]:
    if not options.tags or options.tag_style != "class":
        return ()
    names = [segment.language, segment.emotion, *segment.events]
    classes = (_CLASS_CHARS.sub("", n) for n in names if n and n not in options.hidden_tags)
    return tuple(c for c in classes if c)


def _items(segments: Sequence[Segment], options: ExportOptions) -> list[_Item]:
    items = []
    for seg in segments:
        prefix = clean_line(tag_prefix(seg, options)) if options.tag_style == "prefix" else ""
        items.append(_Item(seg, clean_line(seg.text), prefix + " " if prefix else "",
                           _speaker(seg, options), _tag_classes(seg, options)))
    return items


def segment_spans(transcript: Transcript, duration: float | None = None,
                  ) -> list[tuple[float, float]]:
    """``(start, end)`` seconds of each of ``transcript.segments`` as the subtitles time them:
    the rich-text segments of one VAD piece (which share the piece's span) each get their share
    of it (by their words' times when there are some, else by characters); untimed segments are
    laid out end to end over ``duration``."""
    segs = transcript.segments
    own = [_times(s) for s in segs]
    if all(t is not None for t in own) and not any(
            own[k] == own[k - 1] and segs[k].speaker == segs[k - 1].speaker for k in range(1, len(segs))):
        # every segment timed and none sharing a piece: each keeps its own span, as _timeline
        # would give it (the worker summarises every finished job with this: no text units)
        return [(round(a, 3), round(max(a, b), 3)) for a, b in own]
    items = _items(segs, ExportOptions(tags=False, speaker=True))
    return [(round(a, 3), round(max(a, b), 3)) for _, (a, b) in _timeline(items, duration)]


def _cues(
    segments: Sequence[Segment], options: ExportOptions, duration: float | None
) -> list[_Cue]:
    """Timed, sorted, non-overlapping cues within the line limits (see the module docstring)."""
    items = [it for it in _items(segments, options) if clean_line(it.prefix + it.text)]
    if not items:
        return []
    cues = []
    for item, (units, span) in zip(items, _timeline(items, duration)):
        cues += _item_cues(item, units, span, options)
    cues.sort(key=lambda c: c.start)  # stable: equal starts keep transcript order
    return _no_overlap(cues)


def _lay_out(texts: Sequence[str], duration: float | None) -> list[tuple[int, int]]:
    """End-to-end cue times (ms) from 0 for untimed segments: ``duration`` shared by text length,
    or, when it is not known, each lasting its reading time (at least MIN_UNTIMED_CUE_S)."""
    weights = [max(len(t), 1) for t in texts]
    if duration is None:
        shares = [max(w / CHARS_PER_SECOND, MIN_UNTIMED_CUE_S) for w in weights]
    else:
        shares = [duration * w / sum(weights) for w in weights]
    out, acc = [], 0.0
    for share in shares:
        a = _ms(acc)
        acc += share
        out.append((a, _ms(acc)))
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
        lines = "\n".join(
            ((f"{ln.speaker}: " if ln.lead and ln.speaker else "") + ln.prefix + ln.text).strip()
            for ln in cue.lines)
        blocks.append(f"{i}\n{_clock(cue.start, ',')} --> {_clock(cue.end, ',')}\n{lines}\n")
    return "\n".join(blocks)


def _vtt_line(line: _Line) -> str:
    text = vtt_escape((line.prefix + line.text).strip())
    if line.classes:
        text = f"<c.{'.'.join(line.classes)}>{text}</c>"
    return f"<v {vtt_escape(line.speaker)}>{text}</v>" if line.speaker else text


def _review_notes(transcript: Transcript, review: Review | None,
                  duration: float | None) -> list[str]:
    """The vtt NOTE blocks of a review: whether it was reviewed, then each flag with its time."""
    if review is None or review.empty:
        return []
    import time as _time

    head = (f"reviewed {_time.strftime('%Y-%m-%d %H:%M UTC', _time.gmtime(review.reviewed_at))}"
            if review.reviewed and review.reviewed_at else "not marked reviewed")
    notes = [f"NOTE {head}; {review.corrected} corrected, {review.flagged} flagged\n"]
    spans = segment_spans(transcript, duration) if review.flagged else []
    for i, r in sorted(review.segments.items()):
        if r.flagged and i < len(spans):
            a, b = spans[i]
            note = clean_line(r.note)
            notes.append(f"NOTE flagged {_clock(_ms(a), '.')} - {_clock(_ms(b), '.')}"
                         f"{': ' + note if note else ''}\n")
    return notes


def _vtt(cues: Sequence[_Cue], notes: Sequence[str] = ()) -> str:
    blocks = ["WEBVTT\n", *notes]
    for cue in cues:
        # (a first line that holds only the speaker label in srt has nothing to show in vtt)
        lines = "\n".join(_vtt_line(ln) for ln in cue.lines if (ln.prefix + ln.text).strip())
        blocks.append(f"{_clock(cue.start, '.')} --> {_clock(cue.end, '.')}\n{lines}\n")
    return "\n".join(blocks)
