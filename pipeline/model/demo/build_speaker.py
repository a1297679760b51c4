"""Offline demo weights for the CAM++ speaker model (:mod:`pipeline.model.speaker`), for ``make run``
and the tests, built without any download.

The weights are CAM++'s own random initialisation (``torch.manual_seed(seed)``), then every
BatchNorm's running statistics are set from synthetic voiced speech: harmonic tones with a pitch
contour and three formants (harmonics weighted by resonances), at pitches from 85 to 260 Hz.
Without that step each layer's output keeps the random network's common offset and all embeddings
point the same way (cosine ~1); with it the last layer's output is centred, so the cosine between
two windows reflects what differs between them (pitch, formants, timbre). That is not a trained
speaker model: it separates voices as different as two espeak-ng voices of opposite sex, not two
people of similar voice. Real use needs the real weights (``--speaker-model``).

``cache_root/campplus-demo-s{seed}/campplus_cn_common.bin`` + ``sensevoice_speaker_build.json``;
the same seed gives the same tensors.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path

import numpy as np
import torch

from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.model.demo.build_model import _file_lock, _replace_dir

logger = logging.getLogger("sensevoice.speaker")

BUILDER_VERSION = 1
MARKER_NAME = "sensevoice_speaker_build.json"
WEIGHTS_NAME = "campplus_cn_common.bin"
CALIBRATION_CLIPS = 16  # synthetic 1.5 s voices the BatchNorm statistics are measured on
CLIP_SAMPLES = int(1.5 * SAMPLE_RATE_HZ)  # one embedding window


def synthetic_voice(rng: np.random.Generator, f0: float, formants: tuple[float, float, float],
                    samples: int = CLIP_SAMPLES, rate: int = SAMPLE_RATE_HZ) -> np.ndarray:
    """A voiced sound: the harmonics of a wandering ``f0`` weighted by three formant resonances."""
    t = np.arange(samples) / rate
    contour = f0 * (1 + 0.08 * np.sin(2 * np.pi * rng.uniform(0.5, 3) * t + rng.uniform(0, 6.28)))
    phase = 2 * np.pi * np.cumsum(contour / rate)
    k = np.arange(1, int(0.45 * rate / f0) + 1)
    freqs = k * f0
    gain = sum(1.0 / (1.0 + ((freqs - fc) / 90.0) ** 2) for fc in formants) / k
    out = (gain[:, None] * np.sin(k[:, None] * phase[None, :])).sum(axis=0)
    out += rng.normal(0, 0.01 * np.abs(out).max(), samples)
    return (0.3 * out / (np.abs(out).max() + 1e-9)).astype(np.float32)


def calibration_clips(seed: int, n: int = CALIBRATION_CLIPS) -> np.ndarray:
    rng = np.random.default_rng(seed)
    clips = []
    for _ in range(n):
        f0 = float(rng.uniform(85, 260))
        formants = (float(rng.uniform(300, 900)), float(rng.uniform(900, 2300)), float(rng.uniform(2300, 3400)))
        clips.append(synthetic_voice(rng, f0, formants))
    return np.stack(clips)


def build_speaker_weights(seed: int = 0, clips: int = CALIBRATION_CLIPS) -> dict[str, torch.Tensor]:
    """The demo state dict: the seeded random CAM++ with BatchNorm statistics measured on
    :func:`calibration_clips` (one pass in train mode with cumulative averaging, weights unchanged)."""
    from pipeline.model.speaker import CAMPPlus, SpeakerFrontend

    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = CAMPPlus()
    finally:
        torch.random.set_rng_state(state)
    for m in model.modules():
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # cumulative average over the calibration batches
    feats = SpeakerFrontend()(torch.from_numpy(calibration_clips(seed, clips)))
    model.train()
    with torch.no_grad():
        for chunk in feats.split(16):
            model(chunk)
    model.eval()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def build_speaker_dir(out: Path, seed: int = 0) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    torch.save(build_speaker_weights(seed), out / WEIGHTS_NAME)
    (out / MARKER_NAME).write_text(json.dumps({"seed": seed, "builder_version": BUILDER_VERSION}))
    return out


def _is_built(path: Path, seed: int) -> bool:
    try:
        marker = json.loads((path / MARKER_NAME).read_text())
    except (OSError, ValueError):
        return False
    return (marker.get("seed") == seed and marker.get("builder_version") == BUILDER_VERSION
            and (path / WEIGHTS_NAME).is_file())


def ensure_speaker_dir(cache_root: Path, seed: int = 0) -> Path:
    """``cache_root/campplus-demo-s{seed}``, built once (under a file lock, moved into place)."""
    root = Path(cache_root).expanduser()
    target = root / f"campplus-demo-s{seed}"
    if _is_built(target, seed):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{target.name}.lock"):
        if _is_built(target, seed):
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
        try:
            build_speaker_dir(tmp, seed)
            tmp.chmod(0o755)
            _replace_dir(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    logger.info("built the demo speaker weights in %s", target)
    return target
