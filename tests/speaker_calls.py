"""Synthetic calls for the speaker tests: espeak-ng voices taking turns, with the truth.

Two (or three) distinct espeak-ng voices (en-us male, en-us+f3 female, en-gb+m7) read turns of
about 2-15 s with a short pause between turns; the mono 16 kHz wave and each turn's
``(start_s, end_s, voice)`` come back. Cached per call under the caller's directory.
"""

from __future__ import annotations

import subprocess
import zlib
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torchaudio.functional as AF

from pipeline.domain.tags import SAMPLE_RATE_HZ

VOICES = ("en-us", "en-us+f3", "en-gb+m7")
PAUSE_S = 0.6  # s of silence between two turns
TEXTS = (
    "Hello, thank you for calling the support line.",
    "Hi. I have a problem with my last invoice, it shows a charge that I do not recognise at all, "
    "and I would like to know where it comes from.",
    "I see. Let me look up your account, this will only take a moment.",
    "Sure, no problem at all, I can wait for a while.",
    "Thank you for waiting. The charge is for the premium plan that was switched on in March, "
    "together with the extra storage that came with it.",
    "I never asked for that plan. Can you switch it off and refund the difference please?",
    "Of course. I have switched it off and the refund will reach you within five working days.",
    "Great, thanks a lot for your help today.",
)


@dataclass(frozen=True)
class TruthTurn:
    start_s: float
    end_s: float
    voice: int


def _speak(text: str, voice: str, path: Path) -> np.ndarray:
    if not path.exists():
        tmp = path.with_name(f".{path.name}.tmp.wav")
        subprocess.run(["espeak-ng", "-v", voice, "-s", "160", "-w", str(tmp), text], check=True,
                       capture_output=True)
        tmp.rename(path)
    with wave.open(str(path)) as w:
        x = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768
        rate = w.getframerate()
    y = AF.resample(torch.from_numpy(x), rate, SAMPLE_RATE_HZ).numpy()
    nz = np.flatnonzero(np.abs(y) > 1e-3)  # espeak's own leading and trailing silence off
    return y[nz[0]:nz[-1] + 1] if len(nz) else y


def two_voice_call(cache: Path, voices: int = 2) -> tuple[np.ndarray, list[TruthTurn]]:
    """The call's mono wave and its turns (voice ``k % voices`` reads ``TEXTS[k]``)."""
    cache.mkdir(parents=True, exist_ok=True)
    pause = np.zeros(round(PAUSE_S * SAMPLE_RATE_HZ), dtype=np.float32)
    parts, truth, at = [pause], [], len(pause)
    for k, text in enumerate(TEXTS):
        v = k % voices
        speech = _speak(text, VOICES[v], cache / f"turn-{zlib.crc32(text.encode()):08x}-{VOICES[v]}.wav")
        truth.append(TruthTurn(at / SAMPLE_RATE_HZ, (at + len(speech)) / SAMPLE_RATE_HZ, v))
        parts += [speech, pause]
        at += len(speech) + len(pause)
    return np.concatenate(parts), truth
