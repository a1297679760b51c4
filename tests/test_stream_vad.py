"""The live speech detector's rounds vectorised across streams (issue 38,
pipeline/audio/stream_vad.py): streams whose frames hold different numbers of windows are scored
in one round as slices of one stack, and each stream gets the probabilities and the state it
gets when scored alone -- over several rounds, so a state handed back wrong would show."""

from __future__ import annotations

import numpy as np
import pytest

from pipeline.audio.stream_vad import StreamAudio, StreamScorer
from tests.test_stream import RATE, speech  # noqa: F401 (the fixture)


def test_streams_of_unequal_frames_get_what_they_get_alone(speech):
    pcm = speech.pcm
    sizes = [512 * 2 * k + 96 for k in range(1, 8)]  # bytes: 1..7 windows and a remainder (one piece)
    alone = StreamScorer(gather_s=0.0)
    expected = []
    for k, size in enumerate(sizes):
        audio, probs = StreamAudio(RATE), []
        for r in range(4):  # four rounds of this stream's frames, from its own offset
            at = 16000 + (k * 7919 + r * size) // 2 * 2
            probs.append(alone.score(audio, pcm[at:at + size]).result(timeout=60).probs)
        expected.append(np.concatenate(probs))
    together = StreamScorer(gather_s=0.0)
    audios = [StreamAudio(RATE) for _ in sizes]
    got: list[list[np.ndarray]] = [[] for _ in sizes]
    for r in range(4):
        with together._cond:  # every stream's frame queued before the round is taken
            futures = [together.score(a, pcm[at:at + size])
                       for k, (a, size) in enumerate(zip(audios, sizes))
                       for at in [16000 + (k * 7919 + r * size) // 2 * 2]]
        for k, f in enumerate(futures):
            got[k].append(f.result(timeout=60).probs)
    assert together.rounds == 4  # one round per frame of them all
    for k in range(len(sizes)):
        probs = np.concatenate(got[k])
        assert len(probs) == len(expected[k])
        assert probs.tolist() == pytest.approx(expected[k].tolist(), abs=1e-4)
    assert max(e.max() for e in expected) > 0.5  # speech was scored, not only silence


def test_a_round_with_more_streams_than_rows_per_call_is_split_into_calls():
    scorer = StreamScorer(gather_s=0.0, max_rows=3)
    audios = [StreamAudio(RATE) for _ in range(7)]
    noise = (np.random.default_rng(0).standard_normal(512 * 2) * 3000).astype("<i2").tobytes()
    alone = StreamScorer(gather_s=0.0)
    expected = alone.score(StreamAudio(RATE), noise).result(timeout=60).probs
    with scorer._cond:
        futures = [scorer.score(a, noise) for a in audios]
    for f in futures:
        assert f.result(timeout=60).probs.tolist() == pytest.approx(expected.tolist(), abs=1e-4)
    assert scorer.calls >= 3 * 2  # 7 rows in calls of at most 3, for each of the 2 windows
