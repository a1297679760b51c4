"""Hotwords in the CTC decoding: a boosted term wins where the audio supports it, and nothing
changes where it does not.

SenseVoice decodes CTC greedily: each frame's argmax, repeats collapsed, blanks dropped. For the
rows of a batch that carry hotwords (:class:`pipeline.domain.hotwords.Hotword`), each term is
aligned against the frames by a keyword-spotting Viterbi search, vectorised over every (row,
term, state) on the device and stepped over the frames:

- a term of ``L`` pieces is the CTC state chain ``tok1 [blank] tok2 [blank] ... tokL`` (the blank
  between two equal pieces is required, as CTC needs it);
- a frame's score for a symbol is its logit minus the frame's best logit, so the greedy path
  scores 0 everywhere and a path through the term scores its acoustic deficit (<= 0);
- a term may start at any frame after the four prompt frames and end at any later one: the best
  alignment's gain is ``deficit + L * weight``; only a gain > 0 replaces the greedy frames of its
  span (the term wins where the audio nearly says it; an absent term's pieces are tens of nats
  below the argmax and never win).

The few best terms of each row (``TOP_TERMS``) come back to the host with their score history;
there, the winners' alignments are traced back and written over the greedy path, best gain first,
never two over the same frames (:func:`apply_row`). Rows without hotwords are never touched: their
tokens are the greedy ones, bit for bit.

Each list is spelt once by the model's SentencePiece vocabulary (:func:`spell`): an English term
as a word start (``▁New`` ``▁Y`` ``ork``), a term in another script without the word-start mark
(the model writes Chinese mid-sentence without it). A term with a piece the vocabulary lacks (the
unknown id, which is also CTC's blank) cannot be emitted by the model and is reported
(:class:`Unspellable`), never silently boosted.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from pipeline.domain.errors import InvalidOption
from pipeline.domain.hotwords import MAX_TOKENS_PER_TERM, Hotword

logger = logging.getLogger("sensevoice.hotwords")

BLANK_ID = 0  # CTC blank; in SenseVoice's vocabulary also <unk>
FIRST_FRAME = 4  # the prompt frames (language, emotion, event, itn) are never biased
TOP_TERMS = 3  # terms per row whose alignments come back to the host
MIN_GAIN = 1e-4  # a replacement must beat the greedy path by more than this (ties keep greedy)
NEG = float("-inf")
WORD_START = "\u2581"


class Unspellable(InvalidOption):
    """A hotword holds a piece that the model's vocabulary lacks: the model can never write it."""


@dataclass(frozen=True)
class TermTable:
    """One hotword list as CTC state chains: ``tokens`` [J, S] (the symbol of each state, blank
    0; padded states -1), ``last`` [J] (the final state), ``bonus`` [J] (pieces x weight),
    ``skip`` [J, S] (a state that may follow the one two before it: a piece after a different
    piece, past the optional blank)."""

    terms: tuple[str, ...]
    tokens: np.ndarray
    last: np.ndarray
    bonus: np.ndarray
    skip: np.ndarray

    @property
    def states(self) -> int:
        return self.tokens.shape[1]


def _pieces(sp, term: str) -> tuple[list[int], list[str]]:
    """The term's piece ids as the model would write it (see the module's docstring)."""
    pieces = sp.encode(term, out_type=str)
    if not term[:1].isascii() and pieces:
        if pieces[0] == WORD_START:
            pieces = pieces[1:]
        elif pieces[0].startswith(WORD_START) and sp.piece_to_id(pieces[0][1:]) != sp.unk_id():
            pieces = [pieces[0][1:], *pieces[1:]]
    return [sp.piece_to_id(p) for p in pieces], pieces


def spell(sp, hotwords: Sequence[Hotword], strict: bool = True) -> TermTable:
    """A :class:`TermTable` for one list; :class:`Unspellable` names the terms the vocabulary
    cannot write and ``InvalidOption`` a term of more than ``MAX_TOKENS_PER_TERM`` pieces.
    ``strict=False`` (the engine: the request was checked where it came in, or could not be)
    leaves such terms out and logs them."""
    chains, bad = [], []
    unk = sp.unk_id()
    for h in hotwords:
        ids, pieces = _pieces(sp, h.term)
        missing = [p for p, i in zip(pieces, ids) if i in (unk, BLANK_ID)]
        if missing or not ids:
            bad.append(f"{h.term!r} (unknown: {' '.join(missing) or 'everything'})")
            continue
        if len(ids) > MAX_TOKENS_PER_TERM:
            if not strict:
                bad.append(f"{h.term!r} ({len(ids)} pieces)")
                continue
            raise InvalidOption(f"hotwords: {h.term!r} is {len(ids)} pieces of the model's vocabulary; "
                                f"at most {MAX_TOKENS_PER_TERM}")
        chains.append((h.term, ids, h.weight))
    if bad and not strict:
        logger.warning("hotwords left out: the model's vocabulary cannot spell %s", ", ".join(bad[:10]))
    elif bad:
        raise Unspellable("hotwords: the model's vocabulary cannot spell " + ", ".join(bad[:10])
                          + (f" and {len(bad) - 10} more" if len(bad) > 10 else ""))
    return table(chains)


def table(chains: Sequence[tuple[str, Sequence[int], float]]) -> TermTable:
    """The state chains of (term, piece ids, weight) triples."""
    n_states = max((2 * len(ids) - 1 for _, ids, _ in chains), default=1)
    j = len(chains)
    tokens = np.full((j, n_states), -1, dtype=np.int64)
    skip = np.zeros((j, n_states), dtype=bool)
    last = np.zeros(j, dtype=np.int64)
    bonus = np.zeros(j, dtype=np.float32)
    for k, (_, ids, weight) in enumerate(chains):
        for p, tok in enumerate(ids):
            tokens[k, 2 * p] = tok
            if p:
                tokens[k, 2 * p - 1] = BLANK_ID
                skip[k, 2 * p] = tok != ids[p - 1]
        last[k] = 2 * len(ids) - 2
        bonus[k] = len(ids) * weight
    return TermTable(tuple(t for t, _, _ in chains), tokens, last, bonus, skip)


class TableCache:
    """Spelt lists by identity (a job's options object is shared by its pieces and, from the
    stores, by every job with the same options text) and then by value; least recently used
    dropped past ``size``. Thread-safe."""

    def __init__(self, sp, size: int = 2048):
        self.sp, self.size = sp, size
        self._by_id: OrderedDict[int, tuple[tuple, TermTable]] = OrderedDict()
        self._by_value: OrderedDict[tuple, TermTable] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, hotwords: tuple[Hotword, ...]) -> TermTable:
        with self._lock:
            hit = self._by_id.get(id(hotwords))
            if hit is not None and hit[0] is hotwords:
                self._by_id.move_to_end(id(hotwords))
                return hit[1]
            found = self._by_value.get(hotwords)
        if found is None:
            found = spell(self.sp, hotwords, strict=False)
        with self._lock:
            self._by_value[hotwords] = found
            self._by_id[id(hotwords)] = (hotwords, found)  # the tuple held: its id stays its own
            for d in (self._by_value, self._by_id):
                while len(d) > self.size:
                    d.popitem(last=False)
        return found


@dataclass
class HotSearch:
    """One batch's search results for its hotword rows, on the host once the batch's event fired:
    ``rows`` the batch rows, ``greedy`` [R, T] their argmax ids, ``gain`` / ``term`` / ``end``
    [R, M] the best terms, ``history`` [R, M, T, S] their Viterbi scores, ``tables`` per row."""

    rows: list[int]
    tables: list[TermTable]
    greedy: torch.Tensor
    gain: torch.Tensor
    term: torch.Tensor
    end: torch.Tensor
    history: torch.Tensor


def _stack(tables: Sequence[TermTable], device: torch.device):
    """The rows' tables padded to one [R, J, S] block (padded terms never end: last = -1)."""
    j = max(t.tokens.shape[0] for t in tables)
    s = max(t.states for t in tables)
    r = len(tables)
    tokens = np.full((r, j, s), -1, dtype=np.int64)
    skip = np.zeros((r, j, s), dtype=bool)
    last = np.zeros((r, j), dtype=np.int64)
    bonus = np.full((r, j), NEG, dtype=np.float32)
    for k, t in enumerate(tables):
        n, m = t.tokens.shape
        tokens[k, :n, :m], skip[k, :n, :m], last[k, :n], bonus[k, :n] = t.tokens, t.skip, t.last, t.bonus
    return tuple(_put(a, device) for a in (tokens, skip, last, bonus))


def _put(a: np.ndarray, device: torch.device) -> torch.Tensor:
    """Host -> device without waiting for the device's queued work (a pageable copy would)."""
    t = torch.from_numpy(a)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


STATE_BUDGET_BYTES = 1 << 30  # the search's scores per chunk of rows (a 1,000-term list of long terms)


@torch.inference_mode()
def search(hidden: torch.Tensor, ids: torch.Tensor, lengths: torch.Tensor, lo_w: torch.Tensor,
           lo_b: torch.Tensor, rows: list[int], tables: list[TermTable]) -> HotSearch:
    """Queue the search for ``rows`` of a batch on its device (no host sync). ``hidden`` [B, T, D]
    the CTC head's input (normed), ``ids`` [B, T] the argmax, ``lengths`` [B] frames, ``lo_w`` /
    ``lo_b`` the CTC projection. The scores are logits relative to each frame's argmax logit.
    Rows go through in chunks that keep the scores under ``STATE_BUDGET_BYTES``."""
    dev = hidden.device
    index = _put(np.asarray(rows, dtype=np.int64), dev)
    g = ids.index_select(0, index)  # [R, T]
    n = lengths.index_select(0, index)
    tokens, skip, last, bonus = _stack(tables, dev)
    r, j, s = tokens.shape
    t_len, depth = hidden.shape[1], hidden.shape[2]
    per_row = 4 * (t_len * j * s * 3 + j * s * depth + t_len * depth)  # scores, the pieces' weights
    chunk = max(1, STATE_BUDGET_BYTES // per_row)
    parts = []
    for a in range(0, r, chunk):
        z = slice(a, a + chunk)
        parts.append(_search_rows(hidden.index_select(0, index[z]).float(), g[z], n[z], tokens[z],
                                  skip[z], last[z], bonus[z], lo_w.float(), lo_b.float()))
    gain, term, end, hist = (torch.cat(x) if len(parts) > 1 else x[0] for x in zip(*parts))
    cuda = dev.type == "cuda"
    host = [x.to("cpu", non_blocking=cuda) for x in (g.to(torch.int32), gain, term, end, hist)]
    return HotSearch(rows, list(tables), *host)


def _search_rows(h, g, n, tokens, skip, last, bonus, w, b):
    """The Viterbi search of one chunk of rows: (gain, term, end [R, M], history [R, M, T, S]).
    The history holds two leading columns of -inf so that a step's predecessors (the same state,
    the one before, the one two before) are views of the previous frame: six kernels a frame."""
    dev = h.device
    r, j, s = tokens.shape
    t_len = h.shape[1]
    best = (h * w[g]).sum(-1) + b[g]  # [R, T] the argmax logits
    slots = tokens.clamp(min=0).view(r, j * s)
    emit = torch.baddbmm(b[slots][:, None, :], h, w[slots].transpose(1, 2)) - best[..., None]
    frames = torch.arange(t_len, device=dev)
    invalid = (tokens < 0).view(r, 1, j * s) | (frames[None, :, None] >= n[:, None, None])
    emit = emit.masked_fill(invalid, NEG).view(r, t_len, j, s).transpose(0, 1).contiguous()  # [T, R, J, S]
    skip_bias = torch.zeros((r, j, s), device=dev).masked_fill(~skip, NEG)
    if dev.type == "cpu":  # numpy: one thread, ~1 us a step (torch's pool spun 9x the CPU time)
        history = torch.from_numpy(_steps_numpy(emit.numpy(), skip_bias.numpy()))
    else:
        history = torch.full((t_len, r, j, s + 2), NEG, device=dev)
        for t in range(FIRST_FRAME, t_len):
            prev = history[t - 1]
            came = torch.maximum(prev[..., 2:], prev[..., 1:-1])
            came = torch.maximum(came, prev[..., :-2] + skip_bias)
            came[..., 0].clamp_(min=0.0)  # the term may start here
            history[t, ..., 2:] = came.add_(emit[t])
    history = history[..., 2:]
    done = history.gather(3, last[None, :, :, None].expand(t_len, r, j, 1))[..., 0]  # [T, R, J]
    best_end, end = done.max(0)
    gain = best_end + bonus
    m = min(TOP_TERMS, j)
    top_gain, top_term = gain.topk(m, dim=1)  # [R, M]
    top_end = end.gather(1, top_term)
    pick = top_term[None, :, :, None].expand(t_len, r, m, s)
    hist = history.gather(2, pick).permute(1, 2, 0, 3).contiguous()  # [R, M, T, S]
    return top_gain, top_term, top_end, hist


def _steps_numpy(emit: np.ndarray, skip_bias: np.ndarray) -> np.ndarray:
    """The frame steps of :func:`_search_rows` on the host: history [T, R, J, S + 2]."""
    t_len = emit.shape[0]
    history = np.full(emit.shape[:3] + (emit.shape[3] + 2,), NEG, dtype=np.float32)
    came = np.empty(emit.shape[1:], dtype=np.float32)
    tmp = np.empty_like(came)
    for t in range(FIRST_FRAME, t_len):
        prev = history[t - 1]
        np.maximum(prev[..., 2:], prev[..., 1:-1], out=came)
        np.add(prev[..., :-2], skip_bias, out=tmp)
        np.maximum(came, tmp, out=came)
        np.maximum(came[..., 0], 0.0, out=came[..., 0])  # the term may start here
        np.add(came, emit[t], out=history[t, ..., 2:])
    return history


def trace(history: np.ndarray, table: TermTable, term: int, end: int) -> list[tuple[int, int, float]]:
    """The best alignment of ``term`` ending at frame ``end``: (frame, symbol, score relative to
    the argmax) per frame of its span, first frame first. ``history`` [T, S] its Viterbi scores."""
    s = int(table.last[term])
    out = []
    t = end
    while True:
        here = float(history[t, s])
        if s == 0:
            before = float(history[t - 1, 0]) if t - 1 >= FIRST_FRAME else NEG
            if before <= 0.0:  # a fresh start here (ties: the shorter span)
                out.append((t, int(table.tokens[term, 0]), here))
                break
            out.append((t, int(table.tokens[term, 0]), here - before))
            t -= 1
            continue
        options = [(float(history[t - 1, s]), s), (float(history[t - 1, s - 1]), s - 1)]
        if table.skip[term, s]:
            options.append((float(history[t - 1, s - 2]), s - 2))
        before, prev = max(options)
        out.append((t, int(table.tokens[term, s]), here - before))
        s, t = prev, t - 1
    out.reverse()
    return out


def _absorb(greedy: np.ndarray, n: int, span: list[tuple[int, int, float]]) -> tuple[int, int]:
    """The span's frames widened over the rest of a greedy token's run that it cuts at either
    end: the term then replaces that token instead of writing itself beside a remnant of it
    ("York" over "Yolk" gives "York", not "York Yolk")."""
    first, last = span[0][0], span[-1][0]
    if greedy[first] != BLANK_ID and greedy[first] != span[0][1]:
        while first - 1 >= FIRST_FRAME and greedy[first - 1] == greedy[first]:
            first -= 1
    if greedy[last] != BLANK_ID and greedy[last] != span[-1][1]:
        while last + 1 < n and greedy[last + 1] == greedy[last]:
            last += 1
    return first, last


def apply_row(greedy: np.ndarray, n: int, gains: np.ndarray, terms: np.ndarray, ends: np.ndarray,
              history: np.ndarray, table: TermTable) -> tuple[np.ndarray, dict[int, float]] | None:
    """The row's frame symbols with the winning terms written over the greedy ones (best gain
    first, spans never overlapping), and each changed frame's score relative to its argmax; None
    when no term wins (the greedy path stands). ``greedy`` [T] argmax ids, ``n`` valid frames."""
    path = None
    taken = np.zeros(n, dtype=bool)
    deltas: dict[int, float] = {}
    for k in np.argsort(-gains, kind="stable"):
        if not gains[k] > MIN_GAIN:
            break
        span = trace(history[k], table, int(terms[k]), int(ends[k]))
        first, last = _absorb(greedy, n, span)
        if taken[first:last + 1].any():
            continue
        taken[first:last + 1] = True
        if path is None:
            path = greedy[:n].astype(np.int64, copy=True)
        for t, sym, d in span:
            if sym != path[t]:
                path[t] = sym
                deltas[t] = d
        path[first:span[0][0]] = span[0][1]
        path[span[-1][0] + 1:last + 1] = span[-1][1]
    if path is None or not deltas:
        return None
    return path, deltas


def rewrite(host: np.ndarray, runs: np.ndarray | None, logp: np.ndarray | None, lens: Sequence[int],
            found: HotSearch) -> int:
    """Write each winning row's new path into the batch's host arrays in place: the kept ids
    (-1 where nothing is emitted), the run starts and the frames' log probabilities. Returns how
    many rows changed."""
    greedy = found.greedy.numpy()
    gain, term, end, hist = (x.numpy() for x in (found.gain, found.term, found.end, found.history))
    changed = 0
    for k, row in enumerate(found.rows):
        n = int(lens[row])
        got = apply_row(greedy[k], n, gain[k], term[k], end[k], hist[k], found.tables[k])
        if got is None:
            continue
        path, deltas = got
        starts = np.ones(n, dtype=bool)
        starts[1:] = path[1:] != path[:-1]
        host[row, :n] = np.where(starts & (path != BLANK_ID), path, -1)
        if runs is not None:
            runs[row, :n] = starts
        if logp is not None:
            for t, d in deltas.items():
                logp[row, t] = min(float(logp[row, t]) + d, 0.0)
        changed += 1
    return changed


BPE_FILE = "chn_jpn_yue_eng_ko_spectok.bpe.model"


class Speller:
    """The API's check of a list against the model's vocabulary, where the process can read the
    model directory (roles ``all`` and a worker's host; an api-only process without the files
    skips it and the engine leaves unspellable terms out). Lists seen before are not spelt again."""

    def __init__(self, bpe_path):
        import sentencepiece as spm

        sp = spm.SentencePieceProcessor()
        sp.load(str(bpe_path))
        self._cache = TableCache(sp, size=512)
        self._ok: OrderedDict[tuple, None] = OrderedDict()
        self._lock = threading.Lock()

    def check(self, hotwords: tuple[Hotword, ...]) -> None:
        """Raises :class:`Unspellable` (400 invalid_option) naming the terms it cannot spell."""
        with self._lock:
            if hotwords in self._ok:
                return
        spell(self._cache.sp, hotwords, strict=True)
        with self._lock:
            self._ok[hotwords] = None
            while len(self._ok) > 512:
                self._ok.popitem(last=False)
