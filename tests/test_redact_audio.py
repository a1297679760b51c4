"""pipeline/audio/redact_audio.py: spans silenced or bleeped, padded and clipped; hostile spans
skipped; the WAV it writes."""

from __future__ import annotations

import io
import math
import wave

import numpy as np

from pipeline.audio.redact_audio import BEEP_LEVEL, PAD_S, mask_spans, wav_bytes

RATE = 16000


def test_silence_pads_and_clips_each_span():
    x = np.full(RATE * 3, 0.5, dtype=np.float32)
    out = mask_spans(x, RATE, [(1.0, 1.5), (2.9, 9.0)], "silence")
    a, b = int((1.0 - PAD_S) * RATE), math.ceil((1.5 + PAD_S) * RATE)
    assert not out[a:b].any() and out[a - 1] == 0.5 and out[b] == 0.5
    assert not out[int((2.9 - PAD_S) * RATE):].any()
    assert x.min() == 0.5  # the input is left as it was


def test_beep_is_a_tone_at_its_level():
    out = mask_spans(np.zeros(RATE, dtype=np.float32), RATE, [(0.2, 0.8)], "beep")
    tone = out[int(0.1 * RATE):int(0.9 * RATE)]
    assert abs(np.abs(tone).max() - BEEP_LEVEL) < 1e-3
    assert abs(np.argmax(np.abs(np.fft.rfft(tone))) * RATE / len(tone) - 1000) < 5


def test_hostile_spans_are_skipped():
    x = np.ones(RATE, dtype=np.float32)
    spans = [(float("nan"), 1.0), (0.5, float("inf")), (0.8, 0.2), (-5.0, -4.0), (7.0, 8.0)]
    assert np.array_equal(mask_spans(x, RATE, spans, "silence"), x)


def test_wav_bytes_writes_each_channel():
    left, right = np.full(100, 0.5, dtype=np.float32), np.full(120, -2.0, dtype=np.float32)
    with wave.open(io.BytesIO(wav_bytes([left, right], 8000))) as w:
        assert (w.getnchannels(), w.getframerate(), w.getnframes()) == (2, 8000, 100)
        pcm = np.frombuffer(w.readframes(100), dtype="<i2").reshape(-1, 2)
    assert pcm[0].tolist() == [16384, -32767]  # clipped to full scale
