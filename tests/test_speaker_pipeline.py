"""Speakers end to end on a synthetic call (tests/speaker_calls.py: two espeak-ng voices, en-us
male and en-us+f3 female, turns of 2-9 s): silero speech spans -> windows -> embeddings -> clusters
-> turns, against the truth. The demo CAM++ weights are random (pipeline/model/demo/build_speaker.py)
and do not separate the two voices (see docs/BENCHMARKS.md), so the turns'
accuracy is tested with a deterministic embedding double (each window's pitch), and the real
architecture with the demo weights only for what it must give whatever the weights (a speaker per
span, names in order)."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import torch

from pipeline.audio.vad import Segmenter
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import TranscribeOptions
from pipeline.serving.speakers import SpeakerLabeller
from tests.speaker_calls import two_voice_call

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")

SR = SAMPLE_RATE_HZ
PITCH_BINS = np.geomspace(60, 400, 32)  # Hz


def pitch_embed(windows: np.ndarray) -> np.ndarray:
    """The double: a window's pitch (autocorrelation peak of its voiced 40 ms frames, median)
    as a bump over log-spaced pitch bins. Deterministic; separates a male and a female voice."""
    frame = int(0.04 * SR)
    lags = np.arange(SR // 400, SR // 60)
    out = np.zeros((len(windows), len(PITCH_BINS)))
    for i, w in enumerate(windows):
        f0s = []
        for a in range(0, len(w) - frame, frame):
            x = w[a:a + frame] - w[a:a + frame].mean()
            energy = float(x @ x)
            if energy < 1e-4:
                continue
            ac = np.array([x[:-lag] @ x[lag:] for lag in lags]) / energy
            if ac.max() > 0.5:
                f0s.append(SR / lags[int(ac.argmax())])
        if f0s:
            out[i] = np.exp(-0.5 * ((np.log(PITCH_BINS) - np.log(np.median(f0s))) / 0.08) ** 2)
        out[i, 0] += 1e-3
    return out


def der(turns, truth, total_s: float) -> tuple[float, float]:
    """Diarization error rate on a 10 ms grid, no collar: (missed + false alarm + confusion) /
    speech, with the labels mapped to the voices by the best one-to-one map; and its confusion
    part alone (the speaker model's share; missed and false alarm are the speech detector's, whose
    spans keep the short pauses between turns)."""
    import itertools

    n = int(total_s * 100) + 1
    ref = np.full(n, -1)
    for t in truth:
        ref[int(t.start_s * 100):int(t.end_s * 100)] = t.voice
    names = sorted({s for _, s in turns})
    speech = max(1, int(np.sum(ref >= 0)))
    best = (1.0, 1.0)
    for perm in itertools.permutations(range(max(len(names), 2)), len(names)):
        hyp = np.full(n, -1)
        for span, name in turns:
            hyp[int(span.start_s * 100):int(span.end_s * 100)] = perm[names.index(name)]
        confusion = np.sum((ref >= 0) & (hyp >= 0) & (hyp != ref)) / speech
        errors = np.sum((ref >= 0) & (hyp != ref)) + np.sum((ref < 0) & (hyp >= 0))
        best = min(best, (float(errors / speech), float(confusion)))
    return best


@pytest.fixture(scope="module")
def call(tmp_path_factory):
    return two_voice_call(tmp_path_factory.mktemp("speaker-calls"))


@pytest.fixture(scope="module")
def segmenter():
    seg = Segmenter().load()
    yield seg
    seg.close()


@pytest.mark.parametrize("options", [TranscribeOptions(diarize=True), TranscribeOptions(speakers=2)],
                         ids=["found", "given"])
def test_turns_of_a_two_voice_call_within_half_a_second(call, segmenter, options):
    wave, truth = call
    assert all(2.0 <= t.end_s - t.start_s <= 15.0 for t in truth) and len({t.voice for t in truth}) == 2
    got = SpeakerLabeller(pitch_embed).spans(torch.from_numpy(wave), segmenter, options)
    # merge neighbours of one speaker: a turn the VAD cut at a pause is still one turn
    merged: list[list] = []
    for span, name in got:
        if merged and merged[-1][2] == name:
            merged[-1][1] = span.end_s
        else:
            merged.append([span.start_s, span.end_s, name])
    assert len(merged) == len(truth), (merged, truth)
    assert [m[2] for m in merged] == [f"Speaker {t.voice + 1}" for t in truth]
    for (start, end, _), t in zip(merged, truth):
        assert abs(start - t.start_s) <= 0.5 and abs(end - t.end_s) <= 0.5, (start, end, t)
    error, confusion = der(got, truth, len(wave) / SR)
    print(f"two-voice call, embedding double: {len(merged)} turns of {len(truth)}, DER {error:.1%} "
          f"(confusion {confusion:.1%})")
    assert error < 0.15 and confusion < 0.05


def test_the_demo_campplus_labels_every_span_with_named_speakers(call, segmenter):
    from pipeline.model.demo.build_speaker import build_speaker_weights
    from pipeline.model.speaker import CAMPPlus, SpeakerEmbedder

    wave, truth = call
    model = CAMPPlus()
    model.load_state_dict(build_speaker_weights(0, clips=8))
    got = SpeakerLabeller(SpeakerEmbedder(model).embed).spans(torch.from_numpy(wave), segmenter,
                                                               TranscribeOptions(speakers=2))
    names = [name for _, name in got]
    assert set(names) <= {"Speaker 1", "Speaker 2"} and names[0] == "Speaker 1"
    assert all(a.end <= b.start for (a, _), (b, _) in zip(got, got[1:]))
    speech = sum(t.end_s - t.start_s for t in truth)
    assert sum(s.duration_s for s, _ in got) >= 0.9 * speech
    error, confusion = der(got, truth, len(wave) / SR)
    print(f"two-voice call, demo CAM++ weights: {len(got)} spans, DER {error:.1%} (confusion {confusion:.1%})")


# ----------------------------------------------------------------------------- the split's wiring
class _FixedLabeller:
    """A labeller double: the spans it is given, alternating two speakers."""

    def __init__(self):
        self.calls = 0

    def spans(self, wave, segmenter, options, progress=lambda f: None):
        from pipeline.audio.vad import Span

        self.calls += 1
        n = wave.shape[-1]
        return [(Span(0, n // 2), "Speaker 1"), (Span(n // 2, n), "Speaker 2")]


def test_split_pieces_labels_a_mono_recording_when_speakers_are_asked():
    from pipeline.domain.errors import ModelUnavailable
    from pipeline.domain.types import Lane
    from pipeline.serving.speech_split import split_pieces

    class NoSegmenter:
        def split(self, wave, on_progress=None):
            from pipeline.audio.vad import Span

            return [Span(0, wave.shape[-1])]

    wave = torch.zeros(4 * SR)
    labeller = _FixedLabeller()
    items = split_pieces("j", Lane.BULK, TranscribeOptions(speakers=2), wave, NoSegmenter(),
                         speakers=lambda: labeller)
    assert [(i.speaker, i.start_s, i.piece, i.pieces) for i in items] == [
        ("Speaker 1", 0.0, 0, 2), ("Speaker 2", 2.0, 1, 2)]
    assert items[1].audio.shape[-1] == 2 * SR
    # not asked: no labeller called, no names
    plain = split_pieces("j", Lane.BULK, TranscribeOptions(), wave, NoSegmenter(), speakers=lambda: labeller)
    assert [i.speaker for i in plain] == [None] and labeller.calls == 1
    # a split stereo call keeps its channels as its speakers
    stereo = split_pieces("j", Lane.BULK, TranscribeOptions(split_channels=True, speakers=2),
                          torch.zeros(2, SR), NoSegmenter(), speakers=lambda: labeller)
    assert sorted(i.speaker for i in stereo) == ["left", "right"] and labeller.calls == 1
    with pytest.raises(ModelUnavailable, match="no speaker model"):
        split_pieces("j", Lane.BULK, TranscribeOptions(diarize=True), wave, NoSegmenter())


def test_the_calls_table_counts_each_labelled_speaker():
    from pipeline.domain.calls import summarize
    from pipeline.domain.types import Segment, Transcript

    segs = (Segment("en", "NEUTRAL", (), "withitn", "hello", 0.0, 3.0, speaker="Speaker 1"),
            Segment("en", "ANGRY", (), "withitn", "no", 3.5, 8.5, speaker="Speaker 2"),
            Segment("en", "NEUTRAL", (), "withitn", "ok", 9.0, 10.0, speaker="Speaker 1"))
    summary = summarize(Transcript(text="hello no ok", raw_text="", segments=segs), 10.0)
    assert set(summary.speakers) == {"Speaker 1", "Speaker 2"}
    assert summary.speech_s == {"Speaker 1": 4.0, "Speaker 2": 5.0}
    assert summary.share("Speaker 2", "ANGRY") == 1.0
