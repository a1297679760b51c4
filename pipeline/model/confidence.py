"""Confidence and tag scores from the CTC posteriors the forward pass already computed.

The head (:func:`pipeline.model.fused.head`) hands over, beside the argmax ids, each frame's
best log softmax (``logp`` [T]) and the tag vocabulary's logits at the four query frames
(``tags`` [4, K]). This module turns them, on the host and per clip, into:

- a token's log probability: the best frame of its CTC run (the frames where the token is the
  argmax; a token emitted over several frames is as sure as its surest frame);
- a word's probability: the mean of its pieces' probabilities (Whisper's word ``probability``);
- a segment's ``avg_logprob``: the mean log probability of its text tokens (the four tags have
  their own scores), Whisper's field of that name;
- a tag's probability: the softmax over its own kind (the languages, the emotions, the events,
  the itn tags) at its query frame, so "HAPPY 0.62" says how sure the emotion was among emotions;
- the language allow-list: the language frame's decision re-taken among the allowed languages
  (the no-speech tag always allowed); in SenseVoice the CTC output at that frame conditions no
  other frame, so only the language token changes.

Plain numpy: no torch, no model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Sequence

import numpy as np

from pipeline.domain.tags import EMOTIONS, EVENTS, ITN_TAGS, LANGUAGES, NO_SPEECH

KINDS = (("language", LANGUAGES), ("emotion", EMOTIONS), ("event", EVENTS), ("itn", ITN_TAGS))


@dataclass(frozen=True)
class TagVocab:
    """The tag tokens the model's vocabulary holds, in the order of the head's tag columns."""

    ids: tuple[int, ...]
    names: tuple[str, ...]
    kinds: tuple[str, ...]  # "language" | "emotion" | "event" | "itn", per column

    @classmethod
    def from_pieces(cls, piece_id: Callable[[str], int | None]) -> "TagVocab":
        """``piece_id("<|HAPPY|>")`` -> its id, or None when the vocabulary lacks it."""
        ids, names, kinds = [], [], []
        for kind, tag_names in KINDS:
            for name in tag_names:
                tid = piece_id(f"<|{name}|>")
                if tid is not None and tid not in ids:
                    ids.append(tid), names.append(name), kinds.append(kind)
        return cls(tuple(ids), tuple(names), tuple(kinds))

    def __post_init__(self) -> None:
        object.__setattr__(self, "_column", {tid: k for k, tid in enumerate(self.ids)})
        object.__setattr__(self, "_of_kind", {kind: np.array([k for k, x in enumerate(self.kinds) if x == kind],
                                                             dtype=np.int64) for kind, _ in KINDS})

    def column(self, token_id: int) -> int | None:
        return self._column.get(int(token_id))

    def of_kind(self, kind: str) -> np.ndarray:
        return self._of_kind[kind]

    def language_columns(self, allowed: Iterable[str]) -> np.ndarray:
        """The columns of the allowed languages and of the no-speech tag."""
        keep = set(allowed) | {NO_SPEECH}
        return np.array([k for k in self.of_kind("language") if self.names[k] in keep], dtype=np.int64)


def token_logprobs(logp: np.ndarray, run_starts: np.ndarray, pos: np.ndarray, n: int) -> np.ndarray:
    """Each emitted token's log probability: the best frame of its CTC run. ``logp`` [T] the
    frames' best log softmax, ``run_starts`` the frames (< n) where a run of one symbol starts
    (frame 0 always), ``pos`` the emitted tokens' frames (each a run start)."""
    if not len(pos):
        return np.zeros(0, dtype=np.float32)
    run_best = np.maximum.reduceat(logp[:n], run_starts)
    return run_best[np.searchsorted(run_starts, pos, side="right") - 1]


def _softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def restrict_language(tokens: list[int], lps: np.ndarray, pos: np.ndarray, tags: np.ndarray,
                      frame_logp: float, vocab: TagVocab, allowed: Sequence[str]) -> None:
    """The allow-list, in place: a language token at the language frame that is not allowed
    becomes the allowed language the frame scores highest (its log probability re-read from the
    same frame's scores). ``tags`` [4, K] the query frames' tag logits; ``frame_logp`` the
    frame's best log softmax (so its logsumexp is the emitted token's logit minus it)."""
    if not tokens or pos[0] != 0:
        return
    col = vocab.column(tokens[0])
    if col is None or vocab.kinds[col] != "language" or vocab.names[col] in (*allowed, NO_SPEECH):
        return
    cols = vocab.language_columns(allowed)
    best = cols[int(np.argmax(tags[0, cols]))]
    lse = tags[0, col] - frame_logp
    tokens[0] = vocab.ids[best]
    lps[0] = tags[0, best] - lse


def tag_probs(tokens: Sequence[int], pos: np.ndarray, tags: np.ndarray, vocab: TagVocab,
              allowed: Sequence[str] = ()) -> tuple[tuple[str, float], ...]:
    """(tag name, probability among its kind) of each tag emitted at a query frame; a language
    among the allowed ones when an allow-list is given."""
    out = []
    for tok, p in zip(tokens, pos.tolist()):
        if p >= tags.shape[0]:
            break
        col = vocab.column(tok)
        if col is None:
            continue
        kind = vocab.kinds[col]
        cols = vocab.language_columns(allowed) if kind == "language" and allowed else vocab.of_kind(kind)
        probs = _softmax(tags[p, cols].astype(np.float64))
        out.append((vocab.names[col], round(float(probs[int(np.flatnonzero(cols == col)[0])]), 4)))
    return tuple(out)


def avg_logprob(lps: np.ndarray, is_text: np.ndarray) -> float | None:
    """The mean log probability of the text tokens (None when the clip has none)."""
    text = lps[is_text]
    return round(float(text.mean()), 4) if len(text) else None


def word_probability(lps: Sequence[float]) -> float:
    """A word's probability: the mean of its pieces' probabilities."""
    return round(float(np.mean(np.exp(np.asarray(lps, dtype=np.float64)))), 4)
