"""Parse SenseVoice rich text into typed segments. Parsing only: presentation lives in
``static/richtext.js`` (the browser renders; the server returns data).

SenseVoice emits, per segment, ``<|lang|><|EMO|><|Event|>...<|itn|>text``; several segments are
concatenated, e.g. ``<|en|><|NEUTRAL|><|Speech|><|withitn|>Hi.<|zh|><|SAD|><|BGM|><|woitn|>...``.

Segmentation rule (mirrored exactly by ``SenseVoiceRich.parse`` in ``static/richtext.js``):

- a tag is ``<|name|>`` where ``name`` is one or more characters other than ``<``, ``>``, ``|``,
  ASCII control characters and space (``TAG_RE``); anything else, ``<`` and ``|`` included, is text;
- a tag starts a new segment when the current one already holds text, or when the tag's slot
  (language, emotion or itn) is already filled: so every language tag after the first starts a
  segment, and a tag following text does too;
- known tags fill their slot; event tags and unknown tags are appended, in order, to ``events``
  (``Segment`` has no other place for them; the renderer shows unknown names as neutral chips);
- segment text is the non-tag text, trimmed of ``WHITESPACE``; nothing else is removed.

The parser never raises on any string and never loses non-tag text.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import replace

from pipeline.domain.tags import EMOTIONS, ITN_TAGS, LANGUAGES
from pipeline.domain.types import Segment, Transcript

logger = logging.getLogger("sensevoice.richtext")


# Same pattern in richtext.js. Explicit ASCII classes, so Python and JS agree character for
# character (their \s differ).
TAG_RE = re.compile(r"<\|([^<>|\x00-\x20\x7f]+)\|>")
# Trimmed from segment text. Explicit (not str.strip()) so the JS renderer trims the same set.
WHITESPACE = (
    " \t\n\r\f\v\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008\u2009\u200a"
    "\u2028\u2029\u202f\u205f\u3000\ufeff"
)

_SLOTS = {
    **{name: "language" for name in LANGUAGES},
    **{name: "emotion" for name in EMOTIONS},
    **{name: "itn" for name in ITN_TAGS},
}


class _Builder:
    """The segment being assembled: one slot per single-valued tag, events in order, raw text."""

    __slots__ = ("slots", "events", "parts", "has_text")

    def __init__(self) -> None:
        self.slots: dict[str, str] = {}
        self.events: list[str] = []
        self.parts: list[str] = []
        self.has_text = False  # holds something besides whitespace

    def add_text(self, text: str) -> None:
        self.parts.append(text)
        self.has_text = self.has_text or bool(text.strip(WHITESPACE))

    def is_empty(self) -> bool:
        return not self.slots and not self.events and not self.has_text

    def build(self) -> Segment:
        return Segment(
            language=self.slots.get("language", ""),
            emotion=self.slots.get("emotion", ""),
            events=tuple(self.events),
            itn=self.slots.get("itn", ""),
            text="".join(self.parts).strip(WHITESPACE),
        )


def parse_rich_text(raw: str | None) -> tuple[Segment, ...]:
    """Split SenseVoice rich text into segments (see the module docstring for the rule).

    ``None`` and ``""`` give ``()``. Missing slots are ``""``; ``start``/``end`` stay ``None``.
    """
    if not raw:
        return ()
    raw = str(raw)
    segments: list[Segment] = []
    cur = _Builder()
    pos = 0
    for m in TAG_RE.finditer(raw):
        cur.add_text(raw[pos : m.start()])
        pos = m.end()
        name = m.group(1)
        slot = _SLOTS.get(name)
        if cur.has_text or (slot is not None and slot in cur.slots):
            segments.append(cur.build())
            cur = _Builder()
        if slot is None:
            cur.events.append(name)  # a known event, or an unknown tag kept verbatim
        else:
            cur.slots[slot] = name
    cur.add_text(raw[pos:])
    if not cur.is_empty():
        segments.append(cur.build())
    return tuple(segments)


def _join(segments: Sequence[Segment]) -> str:
    return " ".join(s.text for s in segments if s.text)


def plain_text(raw: str | None) -> str:
    """The text with every tag removed: non-empty segment texts joined by one space."""
    return _join(parse_rich_text(raw))


def to_transcript(
    raw: str | None, times: Sequence[tuple[float, float]] | None = None
) -> Transcript:
    """Build a ``Transcript``: ``raw_text`` is ``raw`` unchanged, ``text`` its plain text.

    ``times`` gives (start, end) in seconds per segment, in order (e.g. the VAD segments). When
    its length differs from the number of parsed segments (odd model output), the times are not
    guessed: a warning is logged and every ``start``/``end`` stays ``None``.
    """
    raw = "" if raw is None else str(raw)
    segments = parse_rich_text(raw)
    if times is not None:
        if len(times) == len(segments):
            segments = tuple(
                replace(s, start=float(a), end=float(b)) for s, (a, b) in zip(segments, times)
            )
        else:
            logger.warning(
                "%d time spans for %d rich-text segments; leaving segment times unset",
                len(times),
                len(segments),
            )
    return Transcript(text=_join(segments), raw_text=raw, segments=segments)
