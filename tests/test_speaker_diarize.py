"""pipeline/audio/diarize.py: windows, clustering on synthetic embeddings (counts found and
given), turns cut at pauses; the speaker options' bounds (pipeline/domain/types.py)."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.audio.diarize import (AGGLOMERATIVE_MAX, SPECTRAL_MAX, SpeakerCount, Turn, cluster,
                                    diarize, windows)
from pipeline.audio.vad import Span
from pipeline.domain.errors import InvalidOption
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import MAX_SPEAKERS, TranscribeOptions
from pipeline.serving.records import dump_options, load_options

SR = SAMPLE_RATE_HZ


def blobs(k: int, per: int, noise: float = 0.3, dim: int = 192, seed: int = 0):
    """``k`` clusters of ``per`` embeddings each (interleaved, as turns of a call would be)."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(k, dim))
    truth = np.tile(np.arange(k), per)
    x = centres[truth] + noise * rng.normal(size=(len(truth), dim))
    return x, truth


def agreement(labels: np.ndarray, truth: np.ndarray) -> float:
    """Share of items whose label maps to their true cluster under the best one-to-one map."""
    import itertools

    ids = sorted(set(labels.tolist()))
    best = 0.0
    for perm in itertools.permutations(sorted(set(truth.tolist())), len(ids)):
        mapping = dict(zip(ids, perm))
        best = max(best, float(np.mean([mapping[v] == t for v, t in zip(labels, truth)])))
    return best


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("per", [6, 120, 800])  # agglomerative, spectral, spectral on a subsample
def test_the_count_is_found(k, per):
    assert 6 * 3 <= AGGLOMERATIVE_MAX < 120 * 2 and 800 * 1 > SPECTRAL_MAX
    x, truth = blobs(k, per, seed=k * 1000 + per)
    labels = cluster(x, threshold=0.5)
    assert len(set(labels.tolist())) == k
    assert agreement(labels, truth) == 1.0
    assert labels[0] == 0  # in order of first appearance


@pytest.mark.parametrize("per", [6, 120])
def test_a_given_count_is_respected(per):
    x, truth = blobs(3, per)
    for exact in (1, 2, 3, 4):
        labels = cluster(x, SpeakerCount(exact=exact), threshold=0.5)
        assert len(set(labels.tolist())) == exact
    assert agreement(cluster(x, SpeakerCount(exact=3)), truth) == 1.0


def test_bounds_of_a_found_count_hold():
    x, _ = blobs(3, 120)
    assert len(set(cluster(x, SpeakerCount(high=2), threshold=0.5).tolist())) <= 2
    x, _ = blobs(1, 120)
    assert len(set(cluster(x, SpeakerCount(low=2), threshold=0.5).tolist())) >= 2


def test_fewer_windows_than_the_count_and_none():
    x, _ = blobs(2, 1)
    assert cluster(x, SpeakerCount(exact=5)).tolist() == [0, 1]
    assert cluster(np.zeros((0, 192))).tolist() == []


def test_windows_follow_funasr_sv_chunk():
    spans = [Span(0, int(3.2 * SR)), Span(4 * SR, 4 * SR + SR // 2)]
    wins = windows(spans)
    firsts = [(a / SR, b / SR) for k, a, b in wins if k == 0]
    assert firsts == [(0.0, 1.5), (0.75, 2.25), (1.5, 3.0), (1.7, 3.2)]  # the last ends at the span's end
    assert [(a, b) for k, a, b in wins if k == 1] == [(4 * SR, 4 * SR + SR // 2)]  # short: one window


def _tone_call(turn_lengths_s, pause_s=0.4):
    """A wave of alternating tones (220 / 440 Hz) with pauses, and its true turns."""
    parts, truth, at = [], [], 0
    for k, length in enumerate(turn_lengths_s):
        n = int(length * SR)
        t = np.arange(n) / SR
        parts.append(0.3 * np.sin(2 * np.pi * (220 if k % 2 == 0 else 440) * t).astype(np.float32))
        truth.append((at, at + n, k % 2))
        at += n
        gap = int(pause_s * SR)
        parts.append(np.zeros(gap, dtype=np.float32))
        at += gap
    return np.concatenate(parts), truth


def _pitch_embed(wins: np.ndarray) -> np.ndarray:
    """A double: the magnitude spectrum's 220 and 440 Hz bins (which tone a window holds)."""
    spec = np.abs(np.fft.rfft(wins, axis=1))
    freq = np.fft.rfftfreq(wins.shape[1], 1 / SR)
    return np.stack([spec[:, np.argmin(np.abs(freq - f))] for f in (220, 440)], axis=1) + 1e-3


def test_turns_are_cut_at_the_pause_between_two_speakers():
    wave, truth = _tone_call([3.0, 5.0, 2.5, 7.0])
    span = Span(0, len(wave))  # one span over the pauses (as the VAD's merge gives)
    turns = diarize(wave, [span], _pitch_embed, SpeakerCount(), threshold=0.5)
    assert [t.speaker for t in turns] == [0, 1, 0, 1]
    for got, (a, b, _) in zip(turns[1:], truth[1:]):
        # the cut is in the pause before the true turn (0.4 s wide): within 0.5 s of its start
        assert a - 0.45 * SR <= got.start <= a, (got.start / SR, a / SR)
    assert turns[0].start == 0 and turns[-1].end == len(wave)
    assert all(x.end == y.start for x, y in zip(turns, turns[1:]))


def test_a_lone_window_of_another_label_is_smoothed():
    wave, _ = _tone_call([6.0])
    wins = windows([Span(0, len(wave))])

    def embed(w):
        e = np.tile([1.0, 0.0], (len(w), 1))
        e[len(w) // 2] = [0.0, 1.0]  # one stray window
        return e

    turns = diarize(wave, [Span(0, len(wave))], embed, SpeakerCount(exact=2))
    assert len(wins) > 3 and turns == [Turn(0, len(wave), 0)]


# ----------------------------------------------------------------------------- options
@pytest.mark.parametrize("kw, message", [
    (dict(speakers=0, diarize=True), "speakers=0"),
    (dict(speakers=0, max_speakers=3), "speakers=0"),
    (dict(speakers=50), "speakers=50"),
    (dict(max_speakers=MAX_SPEAKERS + 1), "max_speakers"),
    (dict(min_speakers=0, diarize=True), "min_speakers=0"),
    (dict(min_speakers=4, max_speakers=2), "min_speakers=4"),
    (dict(speakers=5, max_speakers=3), "outside"),
    (dict(speakers="two"), "whole number"),
    (dict(speakers="-1"), "whole number"),
    (dict(speakers="50"), "speakers=50"),
    (dict(speakers=True), "whole number"),
    (dict(speakers=2.5), "whole number"),
])
def test_bad_speaker_options_are_invalid(kw, message):
    with pytest.raises(InvalidOption, match=message):
        TranscribeOptions(**kw)


def test_speaker_options_round_trip_and_zero_is_off():
    assert not TranscribeOptions(speakers=0).wants_speakers
    assert TranscribeOptions(speakers=0).speakers is None
    assert TranscribeOptions(speakers="2") == TranscribeOptions(speakers=2)  # a form's text
    assert TranscribeOptions(speakers="", min_speakers=" ") == TranscribeOptions()
    with pytest.raises(InvalidOption, match="speakers=0"):
        TranscribeOptions(speakers="0", diarize=True)
    for o in (TranscribeOptions(speakers=2), TranscribeOptions(diarize=True, min_speakers=2, max_speakers=4)):
        assert o.wants_speakers
        assert load_options(dump_options(o)) == o
    assert "speakers" not in dump_options(TranscribeOptions()) and "diarize" not in dump_options(TranscribeOptions())
