"""Hotwords: the words or phrases a request asks the decoder to favour, each with a weight.

A list arrives as text (one term a line: ``term`` or ``term:weight``), as a JSON list (of such
strings, of ``{"term": ..., "weight": ...}`` objects or of ``[term, weight]`` pairs) or, on the
OpenAI face, as a ``prompt`` that reads as a list of short terms (:func:`hotwords_from_prompt`).
Every value is hostile: the number of terms, their length, their weights and their characters
are bounded here, before anything is stored; what the model's vocabulary can spell is checked
where the tokenizer is (:mod:`pipeline.model.hotwords`).

The weight is the bonus, in natural-log units of the CTC posteriors, that each token of a term
earns while the decoder follows it; a term that is not completed earns nothing
(:mod:`pipeline.model.hotwords`).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from typing import Iterable

from pipeline.domain.errors import InvalidOption

MAX_TERMS = 1000  # per request
MAX_TERM_CHARS = 100
MAX_TOKENS_PER_TERM = 64  # pieces of the model's vocabulary (checked where the tokenizer is)
MAX_TEXT_CHARS = 200_000  # the whole field, before it is parsed
DEFAULT_WEIGHT = 2.0
MIN_WEIGHT = 0.1
MAX_WEIGHT = 10.0
# the OpenAI prompt read as hotwords: each comma (or line) separated item at most this long
PROMPT_TERM_WORDS = 4
PROMPT_TERM_CHARS = 40
_PROMPT_SPLIT = re.compile(r"[,\n;，、；]")
_SENTENCE_END = re.compile(r"[.?!。？！]")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Hotword:
    """One term and its per-token bonus."""

    term: str
    weight: float = DEFAULT_WEIGHT

    def __post_init__(self) -> None:
        term = self.term.strip() if isinstance(self.term, str) else None
        if not term:
            raise InvalidOption("hotwords: a term is empty")
        if len(term) > MAX_TERM_CHARS:
            raise InvalidOption(f"hotwords: the term {term[:30]!r}... is longer than {MAX_TERM_CHARS} characters")
        if _CONTROL.search(term) or "<|" in term or "|>" in term:
            raise InvalidOption(f"hotwords: the term {term[:30]!r} holds control characters or a tag")
        weight = self.weight
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise InvalidOption(f"hotwords: the weight of {term!r} is not a number")
        if not MIN_WEIGHT <= weight <= MAX_WEIGHT:
            raise InvalidOption(f"hotwords: the weight of {term!r} is {weight}; "
                                f"choose between {MIN_WEIGHT} and {MAX_WEIGHT}")
        object.__setattr__(self, "term", term)
        object.__setattr__(self, "weight", float(weight))

    def to_text(self) -> str:
        return self.term if self.weight == DEFAULT_WEIGHT else f"{self.term}:{self.weight:g}"


def _item(value) -> Hotword:
    if isinstance(value, Hotword):
        return value
    if isinstance(value, str):
        return _from_text(value)
    if isinstance(value, dict):
        if set(value) - {"term", "weight"} or "term" not in value:
            raise InvalidOption('hotwords: an object item takes "term" and an optional "weight"')
        if not isinstance(value["term"], str):
            raise InvalidOption("hotwords: a term must be text")
        return Hotword(value["term"], value.get("weight", DEFAULT_WEIGHT))
    if isinstance(value, (list, tuple)) and len(value) == 2 and isinstance(value[0], str):
        return Hotword(value[0], value[1])
    raise InvalidOption("hotwords: each item is a text ('term' or 'term:weight'), "
                        "an object {term, weight} or a pair [term, weight]")


def _from_text(line: str) -> Hotword:
    """``term`` or ``term:weight`` (the last colon, when a number follows it)."""
    head, sep, tail = line.rpartition(":")
    if sep and head.strip():
        try:
            weight = float(tail)
        except ValueError:
            return Hotword(line)
        return Hotword(head, weight)
    return Hotword(line)


def parse_hotwords(value) -> tuple[Hotword, ...]:
    """A typed, de-duplicated list from what a client sent: None or "" (none), text (one term a
    line, or a JSON list), or a list. Raises :class:`InvalidOption` with the reason."""
    if value is None:
        return ()
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode("utf-8", "replace")
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            raise InvalidOption(f"hotwords: the list is longer than {MAX_TEXT_CHARS} characters")
        text = value.strip()
        if not text:
            return ()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise InvalidOption("hotwords: the text starts with '[' but is not a JSON list") from None
        else:
            value = [line for line in text.splitlines() if line.strip()]
    if not isinstance(value, (list, tuple)):
        raise InvalidOption("hotwords: give a list, or text with one term a line")
    if len(value) > MAX_TERMS:
        raise InvalidOption(f"hotwords: {len(value)} terms; at most {MAX_TERMS} are accepted")
    return _unique(_item(v) for v in value)


def _unique(items: Iterable[Hotword]) -> tuple[Hotword, ...]:
    """One entry a term (the highest weight), in the order given."""
    best: dict[str, Hotword] = {}
    for h in items:
        if h.term not in best or h.weight > best[h.term].weight:
            best[h.term] = h
    return tuple(best.values())


def hotwords_from_prompt(prompt: str | None) -> tuple[Hotword, ...]:
    """The OpenAI ``prompt`` as hotwords when it reads as a list of terms: items separated by
    commas, semicolons or lines (also ，、；), each at most ``PROMPT_TERM_WORDS`` words and
    ``PROMPT_TERM_CHARS`` characters, and no sentence punctuation (. ? ! 。？！) anywhere. Prose
    ("The meeting is about Kubernetes.") is not a list: () and the prompt is ignored, as before."""
    if not prompt or not prompt.strip() or len(prompt) > MAX_TEXT_CHARS:
        return ()
    if _SENTENCE_END.search(re.sub(r":\s*\d+(\.\d+)?\s*(?=[,\n;，、；]|$)", "", prompt)):
        return ()
    items = [p.strip() for p in _PROMPT_SPLIT.split(prompt) if p.strip()]
    if not items or len(items) > MAX_TERMS:
        return ()
    for item in items:
        term = _from_text(item).term if ":" in item else item
        if len(term) > PROMPT_TERM_CHARS or len(term.split()) > PROMPT_TERM_WORDS:
            return ()
    try:
        return parse_hotwords(items)
    except InvalidOption:
        return ()


def dump_hotwords(hotwords: Iterable[Hotword]) -> list[list]:
    """The stored form: [[term, weight], ...] (read back by :func:`parse_hotwords`)."""
    return [[h.term, h.weight] for h in hotwords]


FUNASR_WEIGHT_SCALE = 10.0  # FunASR's clients weigh terms around 10-40: divided by this, bounded


def hotwords_from_funasr(value) -> tuple[Hotword, ...]:
    """FunASR's ``hotwords``: a JSON object ``{"term": weight, ...}`` (as its clients send it, in
    a text or as an object), or lines of ``term weight`` (its hotword file's form) or of plain
    terms. FunASR's weights (integers around 20) are divided by ``FUNASR_WEIGHT_SCALE`` and
    bounded to [MIN_WEIGHT, MAX_WEIGHT]; the list's other bounds are :func:`parse_hotwords`'s."""
    if value is None or value == "":
        return ()
    if isinstance(value, str):
        if len(value) > MAX_TEXT_CHARS:
            raise InvalidOption(f"hotwords: the list is longer than {MAX_TEXT_CHARS} characters")
        text = value.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                raise InvalidOption("hotwords: the text starts with '{' but is not a JSON object") from None
        else:
            value = {}
            for line in (raw.strip() for raw in text.splitlines() if raw.strip()):
                head, _, tail = line.rpartition(" ")
                try:
                    value[head.strip() if head.strip() else line] = float(tail) if head.strip() else None
                except ValueError:
                    value[line] = None
    if not isinstance(value, dict):
        raise InvalidOption('hotwords: give a JSON object {"term": weight, ...} or lines of "term weight"')
    if len(value) > MAX_TERMS:
        raise InvalidOption(f"hotwords: {len(value)} terms; at most {MAX_TERMS} are accepted")
    items = []
    for term, weight in value.items():
        if weight is None:
            items.append(Hotword(str(term)))
            continue
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise InvalidOption(f"hotwords: the weight of {str(term)[:30]!r} is not a number")
        items.append(Hotword(str(term), min(max(weight / FUNASR_WEIGHT_SCALE, MIN_WEIGHT), MAX_WEIGHT)))
    return _unique(items)
