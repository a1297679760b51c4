"""Personal data masked in a transcript (issue 41): card, phone, e-mail, ID numbers and long digit
runs, written or spoken, in English and Chinese. Pure: no I/O.

``redact=pii`` asks for every kind; a comma list names some (``card,phone``). A found span is
replaced by its typed mask (``[CARD]``, ``[PHONE]``, ``[EMAIL]``, ``[ID]``, ``[DIGITS]``) in the text
and, where the job has word times, the words it covers become one word, the mask, spanning their
times. The worker applies it to each piece's model output before anything is stored
(pipeline/serving/worker.py), so the unredacted text of such a job is never kept.

Detection:

- **digit runs**: written groups (``4111 1111-1111``), spoken English digits (``four one one one``,
  ``oh``, ``double five``) and spoken Chinese digits (``幺三八零``), joined by spaces, hyphens and
  brackets (spoken ones also by commas and full stops, as the model punctuates speech). Quantities
  are never part of one: thousands-grouped and decimal numbers (``1,299.99``), dates (``2024-03-15``),
  clock times (``10:30``), year ranges, Chinese place-value numbers (``三百五十``), amounts with a
  currency or unit (``$``, ``元``, ``dollars``, ``%``).
- a run is a **card** when it has 13-19 digits and passes the Luhn check; an **ID** when it is a
  Chinese resident ID (17 digits and a check character, ISO 7064 MOD 11-2); a **phone** when it is a
  Chinese mobile (``1[3-9]`` + 9, optionally ``+86``), a Chinese landline (``0`` + 9-11), a North
  American number (10 digits, or 11 from ``1``), any ``+`` international number (8-15), or 7-8 digits
  after a word such as "phone"/"电话"; else **digits** when it has ``DIGITS_MIN`` digits or more.
  A run wholly made of several (a phone then a card) is split at its groups; else it is one
  ``digits`` run (where digits are asked for).
- **e-mail**: written (``a.b@c.com``) or spoken (``john dot smith at gmail dot com``, ``艾特``, ``点``),
  the domain ending in a known top-level domain.

What was masked is listed per job from the masks themselves (:func:`redactions_of`): kind and times,
never the values."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from pipeline.domain.redact_kinds import (  # noqa: F401 (the names callers import from here)
    ALL,
    AUDIO_MODES,
    KINDS,
    MASKS,
    parse_redact,
    parse_redact_audio,
)
from pipeline.domain.types import Segment, Transcript, Word

_KIND_OF_MASK = {mask: kind for kind, mask in MASKS.items()}
MASK_RE = re.compile("|".join(re.escape(m) for m in MASKS.values()))
DIGITS_MIN = 8  # a digit run this long is masked as [DIGITS] when no other kind fits
_ITEM_MAX = 19  # digits of the longest item (a card)
EAGER_MIN = 4  # a live partial's digit runs masked from this length (the item may not be complete)
_DIGIT_KINDS = frozenset(("card", "phone", "id", "digits"))


@dataclass(frozen=True)
class Span:
    """A found item: its kind and its characters ``[a, b)`` in the text."""

    kind: str
    a: int
    b: int


@dataclass(frozen=True)
class Redaction:
    """One masked item of a job: its kind and, where known, its time (seconds); never its value."""

    kind: str
    start: float | None
    end: float | None

    def to_dict(self) -> dict:
        return {"kind": self.kind, "start": self.start, "end": self.end}


# -- digit runs -----------------------------------------------------------------------------------

_EN_DIGITS = {"zero": "0", "oh": "0", "one": "1", "two": "2", "three": "3", "four": "4",
              "five": "5", "six": "6", "seven": "7", "eight": "8", "nine": "9"}
_ZH_DIGITS = {"零": "0", "〇": "0", "一": "1", "幺": "1", "二": "2", "三": "3", "四": "4",
              "五": "5", "六": "6", "七": "7", "八": "8", "九": "9"}
_ZH_PLACES = set("十百千万萬亿億拾佰仟点點")
_EN = "|".join(_EN_DIGITS)
_ATOM = re.compile(
    r"(?=[0-9零〇一幺二三四五六七八九叉]|(?<![A-Za-z])[A-Za-z])"  # (fast past the inside of words)
    # quantities: never part of a run (a barrier)
    r"(?:(?P<qty>(?:19|20)\d{2}\s*[-–—~]\s*(?:19|20)\d{2}(?![0-9])"  # year range
    r"|\d{4}[-/.]\d{1,2}[-/.]\d{1,2}(?![0-9])|\d{1,2}[-/.]\d{1,2}[-/.](?:\d{4}|\d{2})(?![0-9])"  # dates
    r"|\d+(?::\d{2})+(?![0-9])"  # clock times
    r"|\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![0-9])|\d+\.\d+)"  # 1,299.99 / 3.5
    r"|(?P<num>[0-9]+)"
    rf"|(?P<rep>(?<![A-Za-z])(?:double|triple)[\s-]+(?:{_EN})(?![A-Za-z]))"
    rf"|(?P<word>(?<![A-Za-z])(?:{_EN})(?![A-Za-z]))"
    r"|(?P<zh>[零〇一幺二三四五六七八九]+)"
    r"|(?P<x>(?<![A-Za-z])[Xx](?![A-Za-z])|叉))",
    re.IGNORECASE)
_GAP = re.compile(r"[\s\-–—()]{0,3}")  # between any two groups of a run
_SPOKEN_GAP = re.compile(r"[\s\-–—(),，、.。]{0,3}")  # between spoken groups
_CURRENCY_BEFORE = re.compile(r"[$¥￥€£]\s*$|(?:USD|RMB|CNY)\s*$", re.I)
_UNIT_AFTER = re.compile(r"^\s*(?:元|块|圆|万|亿|%|percent|dollars?|yuan|rmb|usd|kg|km|miles?|年)",
                         re.I)
_PHONE_CONTEXT = re.compile(r"(?:phone|call|mobile|cell|number|tel|fax|电话|手机|号码|致电|打给|联系)",
                            re.I)
_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)


@dataclass(frozen=True)
class _Atom:
    a: int
    b: int
    digits: str  # what it says, digits (an ID's check "X" as "X")
    spoken: bool


def luhn_ok(digits: str) -> bool:
    """The Luhn check of a card number (digits only)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def resident_id_ok(value: str) -> bool:
    """A Chinese resident ID: 17 digits, a birth date that can be, and its MOD 11-2 check character."""
    if len(value) != 18 or not value[:17].isdigit():
        return False
    month, day = int(value[10:12]), int(value[12:14])
    if not (1 <= month <= 12 and 1 <= day <= 31 and value[6:8] in ("18", "19", "20")):
        return False
    check = "10X98765432"[sum(int(c) * w for c, w in zip(value, _ID_WEIGHTS)) % 11]
    return value[17].upper() == check


def _phone(digits: str, plus: bool, context: bool) -> bool:
    n = len(digits)
    if plus:
        return 8 <= n <= 15
    if re.fullmatch(r"(?:86)?1[3-9]\d{9}", digits):  # Chinese mobile
        return True
    if re.fullmatch(r"0\d{9,11}", digits):  # Chinese landline with its area code
        return True
    if re.fullmatch(r"1?[2-9]\d{2}[2-9]\d{6}", digits):  # North American
        return True
    return context and 7 <= n <= 8


def _kind(digits: str, plus: bool, context: bool) -> str | None:
    """The specific kind of a whole run's digits, or None."""
    if "X" in digits:
        return "id" if resident_id_ok(digits) else None
    if resident_id_ok(digits):  # (before the card: 1 in 10 IDs passes the Luhn check too)
        return "id"
    if 13 <= len(digits) <= 19 and luhn_ok(digits) and not plus:
        return "card"
    if _phone(digits, plus, context):
        return "phone"
    return None


def _atoms(text: str) -> list[_Atom | None]:
    """The digit groups of ``text`` in order; None marks a quantity (a barrier)."""
    out: list[_Atom | None] = []
    for m in _ATOM.finditer(text):
        kind, a, b = m.lastgroup, m.start(), m.end()
        if kind == "qty":
            out.append(None)
        elif kind == "num":
            if _CURRENCY_BEFORE.search(text[max(0, a - 4):a]) or _UNIT_AFTER.match(text[b:b + 8]):
                out.append(None)
            else:
                out.append(_Atom(a, b, m.group(), False))
        elif kind == "rep":
            word = re.split(r"[\s-]+", m.group())
            times = 2 if word[0].lower() == "double" else 3
            out.append(_Atom(a, b, _EN_DIGITS[word[-1].lower()] * times, True))
        elif kind == "word":
            out.append(_Atom(a, b, _EN_DIGITS[m.group().lower()], True))
        elif kind == "zh":
            if (a and text[a - 1] in _ZH_PLACES) or (b < len(text) and text[b] in _ZH_PLACES):
                out.append(None)  # 三百五十, 二十: a number with place values
            else:
                out.append(_Atom(a, b, "".join(_ZH_DIGITS[c] for c in m.group()), True))
        else:  # an X: only an ID's check character (kept when it ends a 17-digit run)
            out.append(_Atom(a, b, "X", False))
    return out


def _runs(text: str) -> list[list[_Atom]]:
    runs: list[list[_Atom]] = []
    cur: list[_Atom] = []
    for atom in _atoms(text):
        if atom is None:
            if cur:
                runs.append(cur)
            cur = []
            continue
        if cur:
            prev, gap = cur[-1], text[cur[-1].b:atom.a]
            pattern = _SPOKEN_GAP if prev.spoken and atom.spoken else _GAP
            joined = pattern.fullmatch(gap) is not None and (
                atom.digits != "X" or sum(len(x.digits) for x in cur) == 17)
            if prev.digits == "X" or not joined:
                runs.append(cur)
                cur = []
        cur.append(atom)
    if cur:
        runs.append(cur)
    return [[x for x in run if not (x.digits == "X" and len(run) == 1)] for run in runs if
            any(x.digits != "X" for x in run)]


def _run_spans(text: str, run: list[_Atom], kinds: frozenset[str], eager: bool = False) -> list[Span]:
    a0 = run[0].a
    before = text[max(0, a0 - 3):a0]
    plus = before.rstrip(" (").endswith("+")
    context = _PHONE_CONTEXT.search(text[max(0, a0 - 40):a0]) is not None

    def span(kind: str, i: int, j: int) -> Span:
        a = run[i].a
        if i == 0:  # the "+" or "(" that opens it
            while a and text[a - 1] in "+( ":
                a -= 1
            while a < run[0].a and text[a] == " ":
                a += 1
        b = run[j - 1].b
        if b < len(text) and text[b] == ")" and "(" in text[run[i].a - 1:b]:
            b += 1
        return Span(kind, a, b)

    digits = "".join(x.digits for x in run)
    whole = _kind(digits, plus, context)
    if whole in kinds:
        return [span(whole, 0, len(run))]
    spans: list[Span] = []
    covered = [False] * len(run)
    i = 0
    while i < len(run):  # the longest piece from each group that is a kind asked for
        for j in range(min(len(run), i + _ITEM_MAX), i, -1):  # (an item has 19 digits at most)
            piece = "".join(x.digits for x in run[i:j])
            kind = _kind(piece, plus and i == 0, context) if len(piece) <= _ITEM_MAX else None
            if kind in kinds and not (i == 0 and j == len(run)):
                spans.append(span(kind, i, j))
                covered[i:j] = [True] * (j - i)
                i = j
                break
        else:
            i += 1
    long_run = len(digits.replace("X", "")) >= (EAGER_MIN if eager else DIGITS_MIN)
    if eager and long_run and not all(covered) and kinds & _DIGIT_KINDS:
        return [span("digits", 0, len(run))]  # perhaps the start of an item still being said
    if "digits" in kinds and long_run and not all(covered):
        return [span("digits", 0, len(run))]  # not wholly items of their own: one digit run
    return sorted(spans, key=lambda s: s.a)


# -- e-mail ---------------------------------------------------------------------------------------

_TLDS = ("com|net|org|edu|gov|mil|int|info|biz|io|co|me|us|uk|cn|hk|tw|jp|kr|de|fr|es|it|nl|ru|"
         "au|ca|in|sg|ai|dev|app|cc|tv")
_LABEL = r"[A-Za-z0-9]+"  # one way only to split a name into labels: no catastrophic backtracking
_DOT = r"(?:\.|\s+dot\s+|\s*(?:点|點)\s*)"
_AT = r"(?:\s*@\s*|\s+at\s+|\s*艾特\s*)"
_LOCAL_SEP = r"(?:[._+-]|\s+(?:dot|underscore|dash)\s+|\s*(?:点|點)\s*)"
_EMAIL = re.compile(
    rf"(?<![A-Za-z0-9._%+-])(?:[A-Za-z0-9]\s+){{0,30}}{_LABEL}(?:{_LOCAL_SEP}{_LABEL}){{0,10}}"
    rf"{_AT}{_LABEL}(?:(?:-|{_DOT}){_LABEL}){{0,10}}{_DOT}(?:{_TLDS})(?![A-Za-z0-9])",
    re.IGNORECASE)
_EMAIL_HINT = re.compile(r"@|(?<![A-Za-z])at(?![A-Za-z])|艾特", re.IGNORECASE)


def find_spans(text: str, kinds: Iterable[str], eager: bool = False) -> list[Span]:
    """Every item of ``kinds`` in ``text``, in order, not overlapping. ``eager`` (a live partial,
    which may end inside an item): any run of ``EAGER_MIN`` digits or more is masked too."""
    kinds = frozenset(kinds)
    if not kinds or not text:
        return []
    spans: list[Span] = []
    scan = text
    if "email" in kinds and _EMAIL_HINT.search(text):  # (the full pattern only where it may match)
        for m in _EMAIL.finditer(text):
            spans.append(Span("email", m.start(), m.end()))
        for s in spans:  # the digits in an address are the address's
            scan = scan[:s.a] + "\x00" * (s.b - s.a) + scan[s.b:]
    if kinds - {"email"}:
        for run in _runs(scan):
            spans += _run_spans(scan, run, kinds, eager)
    return sorted(spans, key=lambda s: s.a)


def redact_text(text: str, kinds: Iterable[str]) -> tuple[str, list[Span]]:
    """``text`` with each found span replaced by its mask; the spans (in the original text)."""
    spans = find_spans(text, kinds)
    if not spans:
        return text, []
    parts, pos = [], 0
    for s in spans:
        parts += [text[pos:s.a], MASKS[s.kind]]
        pos = s.b
    parts.append(text[pos:])
    return "".join(parts), spans


# -- rich text and words --------------------------------------------------------------------------

_TAG_RE = re.compile(r"<\|[^<>|\x00-\x20\x7f]+\|>")  # richtext.TAG_RE


def _word_ranges(stream: str, words: Sequence[Word]) -> list[tuple[int, int] | None]:
    """Where each word's text lies in ``stream`` (matched in order, spaces ignored), or None."""
    out: list[tuple[int, int] | None] = []
    cursor = 0
    for w in words:
        text = "".join(str(w.text).split())
        pos = stream.find(text, cursor, cursor + 16 + len(text)) if text else -1
        if pos < 0:
            out.append(None)
            continue
        out.append((pos, pos + len(text)))
        cursor = pos + len(text)
    return out


@dataclass(frozen=True)
class Redacted:
    """A piece of model output after redaction: the rich text, the words, what was masked."""

    raw_text: str
    words: tuple[Word, ...]
    redactions: tuple[Redaction, ...]


def redact_rich(raw_text: str, words: Sequence[Word], kinds: Iterable[str],
                span: tuple[float, float] | None = None, eager: bool = False) -> Redacted:
    """Mask ``kinds`` in the text parts of SenseVoice rich text (its tags untouched) and in the
    words aligned to them. A masked item's time is its words' (first start, last end), else
    ``span`` (the piece's start and end)."""
    kinds = frozenset(kinds)
    if not kinds:
        return Redacted(raw_text, tuple(words), ())
    pieces: list[tuple[bool, str]] = []  # (is text, characters)
    pos = 0
    for m in _TAG_RE.finditer(raw_text):
        pieces += [(True, raw_text[pos:m.start()]), (False, m.group())]
        pos = m.end()
    pieces.append((True, raw_text[pos:]))
    stream_parts, found, offset = [], [], 0  # the text parts joined by "\n"; spans in the stream
    for is_text, chars in pieces:
        if is_text:
            found += [Span(s.kind, s.a + offset, s.b + offset)
                      for s in find_spans(chars, kinds, eager)]
            stream_parts.append(chars)
            offset += len(chars) + 1
    if not found:
        return Redacted(raw_text, tuple(words), ())
    stream = "\n".join(stream_parts)
    ranges = _word_ranges(stream, words)
    out_words: list[Word] = []
    redactions: list[Redaction] = []
    owner: list[int | None] = []  # for each word, the span it falls in
    for r in ranges:
        hit = None
        if r is not None:
            hit = next((k for k, s in enumerate(found) if r[0] < s.b and s.a < r[1]), None)
        owner.append(hit)
    for k in range(len(words)):  # an unaligned word between two of one span's words is its
        if ranges[k] is None:
            before = next((owner[i] for i in range(k - 1, -1, -1) if ranges[i] is not None), None)
            after = next((owner[i] for i in range(k + 1, len(words)) if ranges[i] is not None), None)
            if before is not None and before == after:
                owner[k] = before
    done: set[int] = set()
    for k, w in enumerate(words):
        hit = owner[k]
        if hit is None:
            out_words.append(w)
        elif hit not in done:
            done.add(hit)
            last = max(i for i in range(len(words)) if owner[i] == hit)
            out_words.append(Word(MASKS[found[hit].kind], w.start, words[last].end))
    for k, s in enumerate(found):
        mine = [words[i] for i in range(len(words)) if owner[i] == k]
        if mine:
            redactions.append(Redaction(s.kind, mine[0].start, mine[-1].end))
        else:
            redactions.append(Redaction(s.kind, *(span or (None, None))))
    new_parts, ti = [], 0
    for is_text, chars in pieces:
        if is_text:
            base = sum(len(p) + 1 for p in stream_parts[:ti])
            mine = [Span(s.kind, s.a - base, s.b - base) for s in found
                    if base <= s.a < base + len(chars) + 1]
            text, p = [], 0
            for s in mine:
                text += [chars[p:s.a], MASKS[s.kind]]
                p = s.b
            text.append(chars[p:])
            new_parts.append("".join(text))
            ti += 1
        else:
            new_parts.append(chars)
    return Redacted("".join(new_parts), tuple(out_words), tuple(redactions))


def redactions_of(transcript: Transcript) -> list[Redaction]:
    """What a redacted transcript masks, from its masks: each one's kind and time (the mask word's
    where the job has word times, else its segment's). A piece's words sit on its first segment;
    the segments after it with the same times take theirs from the same words."""
    out: list[Redaction] = []
    pool: list[Word] = []
    key = None
    for seg in transcript.segments:
        if seg.words or (seg.start, seg.end) != key:
            pool = [w for w in seg.words if w.text in _KIND_OF_MASK]
            key = (seg.start, seg.end)
        for m in MASK_RE.finditer(seg.text):
            kind = _KIND_OF_MASK[m.group()]
            k = next((i for i, w in enumerate(pool) if w.text == m.group()), None)
            if k is not None:
                w = pool.pop(k)
                out.append(Redaction(kind, w.start, w.end))
            else:
                out.append(Redaction(kind, seg.start, seg.end))
    return out


def redact_transcript(transcript: Transcript, kinds: Iterable[str]) -> Transcript:
    """A whole transcript redacted segment by segment (text, words), ``raw_text`` rebuilt from the
    redacted text parts. (The worker redacts each piece's output with :func:`redact_rich`; this is
    for a transcript built elsewhere.)"""
    kinds = frozenset(kinds)
    if not kinds:
        return transcript
    raw = redact_rich(transcript.raw_text, (), kinds).raw_text
    segs: list[Segment] = []
    for seg in transcript.segments:
        r = redact_rich(seg.text, seg.words, kinds)
        segs.append(replace(seg, text=r.raw_text, words=r.words))
    return Transcript(text=" ".join(s.text for s in segs if s.text), raw_text=raw,
                      segments=tuple(segs))


def redact_across(transcript: Transcript, kinds: Iterable[str]) -> Transcript:
    """Items said across two segments of one speaker (a long recording is split at pauses, and each
    piece is masked alone): the segments' texts joined, in order, each speaker's apart; the part of
    such an item in each segment masked (text, aligned words, ``raw_text``). Items within one
    segment are the pieces' own (:func:`redact_rich`), already masked."""
    kinds = frozenset(kinds)
    segs = list(transcript.segments)
    if not kinds or len(segs) < 2:
        return transcript
    cuts: dict[int, list[Span]] = {}
    for speaker in dict.fromkeys(s.speaker for s in segs):
        order = [k for k, s in enumerate(segs) if s.speaker == speaker and s.text]
        starts, pos = [], 0
        for k in order:
            starts.append(pos)
            pos += len(segs[k].text) + 1
        stream = " ".join(segs[k].text for k in order)
        for s in find_spans(stream, kinds):
            first = max(i for i, a in enumerate(starts) if a <= s.a)
            last = max(i for i, a in enumerate(starts) if a < s.b)
            if first == last:
                continue  # within one segment: the piece's own pass saw it
            for i in range(first, last + 1):
                a = max(s.a - starts[i], 0)
                b = min(s.b - starts[i], len(segs[order[i]].text))
                if a < b:
                    cuts.setdefault(order[i], []).append(Span(s.kind, a, b))
    if not cuts:
        return transcript
    raw, cursor, parts = transcript.raw_text, 0, []
    for k, seg in enumerate(segs):
        if k not in cuts:
            continue
        text, p, out = seg.text, 0, []
        for s in sorted(cuts[k], key=lambda s: s.a):
            out += [text[p:s.a], MASKS[s.kind]]
            p = s.b
        out.append(text[p:])
        new_text = "".join(out)
        words = list(seg.words)
        ranges = _word_ranges(text, words)
        for s in cuts[k]:
            hit = [i for i, r in enumerate(ranges) if r is not None and r[0] < s.b and s.a < r[1]]
            if hit:
                words[hit[0]] = Word(MASKS[s.kind], words[hit[0]].start, words[hit[-1]].end)
                for i in hit[1:]:
                    words[i] = None
        segs[k] = replace(seg, text=new_text, words=tuple(w for w in words if w is not None))
        at = raw.find(text, cursor)  # the segment's text in the joined raw text, in order
        if at >= 0:
            parts += [raw[cursor:at], new_text]
            cursor = at + len(text)
    parts.append(raw[cursor:])
    return Transcript(text=" ".join(s.text for s in segs if s.text), raw_text="".join(parts),
                      segments=tuple(segs))
