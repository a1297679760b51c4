"""Who spoke when, on a mono recording: speech spans -> embedding windows -> clusters -> turns.

1. **Windows**: each speech span (from :mod:`pipeline.audio.vad`) is cut into windows of
   :data:`WINDOW_S` every :data:`SHIFT_S` (FunASR's ``sv_chunk``: 1.5 s every 0.75 s; the last
   window ends at the span's end, a span shorter than a window is one zero-padded window).
2. **Embeddings** of all windows at once, by the caller's ``embed`` (CAM++ batched on the device:
   :class:`pipeline.model.speaker.SpeakerEmbedder`; a test double in the tests).
3. **Clusters** on cosine similarity (:func:`cluster`): the count given, or found between the
   bounds. Few windows (<= :data:`AGGLOMERATIVE_MAX`): average-linkage agglomerative clustering,
   merged while the closest pair is above ``threshold`` (found) or down to the count (given). More:
   spectral clustering as FunASR's ``SpectralCluster`` (rows pruned to their nearest
   neighbours, unnormalised Laplacian, the count from the largest eigengap, k-means on the
   eigenvectors), then clusters whose centroids are closer than ``threshold`` merged (FunASR's
   ``merge_by_cos``). Above :data:`SPECTRAL_MAX` windows the spectral step runs on an even
   subsample and every window joins its nearest centroid (an hour is ~4,800 windows).
4. **Turns**: a window flanked by two windows of one other label takes theirs; between two windows
   of different labels the change is put in the middle of their overlap, then moved to the
   quietest point within :data:`REFINE_S` of it (a pause between two people wins), so a turn's
   edge is not bound to the 0.75 s grid. A turn shorter than :data:`MIN_TURN_S` that touches
   another joins the longer neighbour (a window over a pause is no turn of its own).

numpy (and torch's ``eigh``; no scipy/sklearn in the requirements); deterministic (a fixed seed for k-means).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from pipeline.audio.vad import Span, _quietest
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import MAX_SPEAKERS

logger = logging.getLogger("sensevoice.diarize")

WINDOW_S = 1.5  # s, one embedding window (FunASR's seg_dur)
SHIFT_S = 0.75  # s, window hop (FunASR's seg_shift)
MIN_TURN_S = 1.0  # s, a shorter turn touching another joins it
REFINE_S = 0.5  # s, a turn change moves to the quietest point at most this far away
AGGLOMERATIVE_MAX = 40  # windows: at most this many are clustered agglomeratively
SPECTRAL_MAX = 600  # windows: more are clustered on an even subsample of this many
PRUNE_SHARE = 0.022  # spectral: share of each row's neighbours kept (FunASR's pval)
PRUNE_MIN = 6  # spectral: neighbours kept at least


@dataclass(frozen=True)
class SpeakerCount:
    """The count asked for: ``exact`` when given, else found within ``[low, high]``."""

    exact: int | None = None
    low: int = 1
    high: int = MAX_SPEAKERS

    def __post_init__(self) -> None:
        for v in (self.exact, self.low, self.high):
            if v is not None and not 1 <= v <= MAX_SPEAKERS:
                raise ValueError(f"a speaker count must be within 1..{MAX_SPEAKERS}, got {v}")
        if self.low > self.high:
            raise ValueError(f"min speakers {self.low} above max speakers {self.high}")


@dataclass(frozen=True)
class Turn:
    """``wave[start:end]`` (samples) spoken by ``speaker`` (0, 1, ...: in order of first turn)."""

    start: int
    end: int
    speaker: int

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE_HZ

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE_HZ


# ----------------------------------------------------------------------------- windows
def windows(spans: Sequence[Span], window: int = round(WINDOW_S * SAMPLE_RATE_HZ),
            shift: int = round(SHIFT_S * SAMPLE_RATE_HZ)) -> list[tuple[int, int, int]]:
    """``(span index, start, end)`` of each window, in samples (``end - start <= window``)."""
    out = []
    for k, span in enumerate(spans):
        last_end = span.start
        for a in range(span.start, span.end, shift):
            b = min(a + window, span.end)
            if b <= last_end:
                break
            last_end = b
            out.append((k, max(span.start, b - window), b))
    return out


def gather(wave: np.ndarray, wins: Sequence[tuple[int, int, int]], window: int) -> np.ndarray:
    """The windows' samples ``[N, window]`` float32, short ones zero-padded at the end."""
    out = np.zeros((len(wins), window), dtype=np.float32)
    for i, (_, a, b) in enumerate(wins):
        out[i, :b - a] = wave[a:b]
    return out


# ----------------------------------------------------------------------------- clustering
def _normalise(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-9)


def _relabel(labels: np.ndarray) -> np.ndarray:
    """Labels 0, 1, ... in order of first appearance."""
    order: dict[int, int] = {}
    for v in labels.tolist():
        order.setdefault(v, len(order))
    return np.array([order[v] for v in labels.tolist()], dtype=np.int64)


def _agglomerative(x: np.ndarray, count: SpeakerCount, threshold: float) -> np.ndarray:
    """Average linkage on cosine similarity."""
    n = len(x)
    sim = x @ x.T
    members = [[i] for i in range(n)]
    target_low = count.exact or count.low
    target_high = count.exact or count.high
    while len(members) > 1:
        best, pair = -np.inf, (0, 1)
        for i in range(len(members)):
            for j in range(i + 1, len(members)):
                s = float(sim[np.ix_(members[i], members[j])].mean())
                if s > best:
                    best, pair = s, (i, j)
        if len(members) <= target_low or (len(members) <= target_high and best < threshold):
            break
        i, j = pair
        members[i] += members.pop(j)
    labels = np.empty(n, dtype=np.int64)
    for c, m in enumerate(members):
        labels[m] = c
    return labels


def _kmeans(x: np.ndarray, k: int, seed: int = 0, n_init: int = 4, iters: int = 50) -> np.ndarray:
    rng = np.random.default_rng(seed)
    best_labels, best_cost = np.zeros(len(x), dtype=np.int64), np.inf
    for _ in range(n_init):
        centres = [x[rng.integers(len(x))]]
        for _ in range(1, k):  # k-means++
            d = np.min(((x[:, None, :] - np.array(centres)[None]) ** 2).sum(-1), axis=1)
            p = d / d.sum() if d.sum() > 0 else None
            centres.append(x[rng.choice(len(x), p=p)])
        c = np.array(centres)
        for _ in range(iters):
            labels = ((x[:, None, :] - c[None]) ** 2).sum(-1).argmin(1)
            new = np.array([x[labels == j].mean(0) if np.any(labels == j) else c[j] for j in range(k)])
            if np.allclose(new, c):
                break
            c = new
        cost = float(((x - c[labels]) ** 2).sum())
        if cost < best_cost:
            best_cost, best_labels = cost, labels
    return best_labels


def _eigh(m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``eigh`` through torch on one thread: numpy's OpenBLAS threads spin against the service's
    own (a 1,000-row matrix took 2.5-14 s on a busy 2-core machine, 0.76 s on one thread)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        lambdas, vecs = torch.linalg.eigh(torch.from_numpy(m))
    finally:
        torch.set_num_threads(before)
    return lambdas.numpy(), vecs.numpy()


def _spectral(x: np.ndarray, count: SpeakerCount) -> np.ndarray:
    n = len(x)
    sim = x @ x.T
    keep = max(PRUNE_MIN, int(PRUNE_SHARE * n))
    pruned = np.zeros_like(sim)
    top = np.argpartition(-sim, min(keep, n - 1), axis=1)[:, :keep]
    rows = np.arange(n)[:, None]
    pruned[rows, top] = sim[rows, top]
    aff = 0.5 * (pruned + pruned.T)
    np.fill_diagonal(aff, 0.0)
    lap = np.diag(np.abs(aff).sum(1)) - aff
    lambdas, vecs = _eigh(lap)
    if count.exact is not None:
        k = count.exact
    else:
        high = min(count.high, n - 1)
        gaps = np.diff(lambdas[count.low - 1:high + 1])
        k = int(np.argmax(gaps)) + count.low if len(gaps) else count.low
    return _kmeans(vecs[:, :k], k)


def _merge_close(x: np.ndarray, labels: np.ndarray, threshold: float, low: int) -> np.ndarray:
    """Join the two clusters whose centroids are most alike while above ``threshold``."""
    labels = labels.copy()
    while True:
        ids = np.unique(labels)
        if len(ids) <= low:
            return labels
        cent = _normalise(np.stack([x[labels == i].mean(0) for i in ids]))
        s = cent @ cent.T
        np.fill_diagonal(s, -np.inf)
        i, j = np.unravel_index(int(np.argmax(s)), s.shape)
        if s[i, j] < threshold:
            return labels
        labels[labels == ids[j]] = ids[i]


def cluster(embeddings: np.ndarray, count: SpeakerCount = SpeakerCount(), threshold: float = 0.78) -> np.ndarray:
    """A label per embedding (0, 1, ... in order of first appearance) for the count given or found."""
    x = _normalise(np.asarray(embeddings, dtype=np.float64))
    n = len(x)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    if count.exact is not None and count.exact >= n:
        return np.arange(n, dtype=np.int64)
    if n <= AGGLOMERATIVE_MAX:
        return _relabel(_agglomerative(x, count, threshold))
    sample = x if n <= SPECTRAL_MAX else x[np.linspace(0, n - 1, SPECTRAL_MAX).round().astype(int)]
    labels = _spectral(sample, count)
    if count.exact is None:
        labels = _merge_close(sample, labels, threshold, count.low)
    if n > SPECTRAL_MAX:
        cent = _normalise(np.stack([sample[labels == i].mean(0) for i in np.unique(labels)]))
        labels = (x @ cent.T).argmax(1)
    return _relabel(labels)


# ----------------------------------------------------------------------------- turns
def _smooth(labels: np.ndarray, span_of: np.ndarray) -> np.ndarray:
    out = labels.copy()
    for i in range(1, len(out) - 1):
        if span_of[i - 1] == span_of[i] == span_of[i + 1] and out[i - 1] == out[i + 1] != out[i]:
            out[i] = out[i - 1]
    return out


def turns(wave: np.ndarray, spans: Sequence[Span], wins: Sequence[tuple[int, int, int]],
          labels: np.ndarray) -> list[Turn]:
    """Each span cut where its windows' label changes (refined to a quiet point)."""
    refine = round(REFINE_S * SAMPLE_RATE_HZ)
    span_of = np.array([w[0] for w in wins], dtype=np.int64)
    labels = _smooth(np.asarray(labels), span_of)
    out: list[Turn] = []
    i = 0
    for k, span in enumerate(spans):
        mine = [j for j in range(i, len(wins)) if wins[j][0] == k]
        if not mine:
            continue
        i = mine[-1] + 1
        start, current = span.start, int(labels[mine[0]])
        for a, b in zip(mine, mine[1:]):
            if labels[b] == current:
                continue
            guess = (wins[b][1] + wins[a][2]) // 2
            lo, hi = max(start + 1, guess - refine), min(span.end - 1, guess + refine)
            cut = _quietest(wave, lo, hi) if hi - lo > 0 else guess
            out.append(Turn(start, cut, current))
            start, current = cut, int(labels[b])
        out.append(Turn(start, span.end, current))
    out = _absorb_short([t for t in out if t.end > t.start], round(MIN_TURN_S * SAMPLE_RATE_HZ))
    order: dict[int, int] = {}
    for t in out:
        order.setdefault(t.speaker, len(order))
    return [Turn(t.start, t.end, order[t.speaker]) for t in out]


def _absorb_short(found: list[Turn], shortest: int) -> list[Turn]:
    """A turn shorter than ``shortest`` between (or beside) turns it touches joins the longer of
    them (a window over a pause or a cough is no turn); a lone short span stays."""
    out = list(found)
    while True:
        short = [i for i, t in enumerate(out) if t.end - t.start < shortest and (
            (i > 0 and out[i - 1].end == t.start) or (i + 1 < len(out) and out[i + 1].start == t.end))]
        if not short:
            return out
        i = min(short, key=lambda j: out[j].end - out[j].start)
        t = out[i]
        left = out[i - 1] if i > 0 and out[i - 1].end == t.start else None
        right = out[i + 1] if i + 1 < len(out) and out[i + 1].start == t.end else None
        if right is None or (left is not None and left.end - left.start >= right.end - right.start):
            out[i - 1:i + 1] = [Turn(left.start, t.end, left.speaker)]
        else:
            out[i:i + 2] = [Turn(t.start, right.end, right.speaker)]
        if len(out) > 1:  # neighbours of one speaker that now touch are one turn
            merged = [out[0]]
            for u in out[1:]:
                if merged[-1].end == u.start and merged[-1].speaker == u.speaker:
                    merged[-1] = Turn(merged[-1].start, u.end, u.speaker)
                else:
                    merged.append(u)
            out = merged


def diarize(wave: np.ndarray, spans: Sequence[Span], embed: Callable[[np.ndarray], np.ndarray],
            count: SpeakerCount = SpeakerCount(), threshold: float = 0.78) -> list[Turn]:
    """Speaker turns of a 16 kHz mono ``wave`` inside its speech ``spans``."""
    window = round(WINDOW_S * SAMPLE_RATE_HZ)
    wins = windows(spans, window)
    if not wins:
        return []
    labels = cluster(embed(gather(wave, wins, window)), count, threshold)
    return turns(wave, spans, wins, labels)
