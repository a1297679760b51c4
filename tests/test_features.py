"""pipeline.model.features.BatchedFrontend against funasr's WavFrontend (dither 0), item by item.

Audio: real synthetic speech (espeak-ng -> ffmpeg 16 kHz mono), white noise, a pure tone and
digital silence, cut to lengths that cover short clips, long clips and every interesting
``fbank_frames % 6`` tail of the LFR stacking.
"""

from __future__ import annotations

import ast
import math
import random
import shutil
import subprocess
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.model import features as feat
from pipeline.model.features import (
    FEAT_DIM,
    FRAME_LENGTH,
    FRAME_SHIFT,
    BatchedFrontend,
    load_cmvn,
    num_fbank_frames,
    num_lfr_frames,
)

TOL_VS_FUNASR = 1e-3  # max abs diff per item against funasr (CPU measures 0 to ~5e-7)
TOL_BATCH_OF_ONE = 1e-5  # an item alone vs the same item inside a padded batch

DEVICES = [
    "cpu",
    pytest.param(
        "cuda",
        marks=[
            pytest.mark.requires_cuda,  # the project's marker (tests/conftest.py)
            pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
        ],
    ),
]


def _frames_to_samples(frames: int, extra: int = 0) -> int:
    """Smallest sample count with ``frames`` fbank frames, plus ``extra`` (< FRAME_SHIFT)."""
    return FRAME_LENGTH + (frames - 1) * FRAME_SHIFT + extra


# ---------------------------------------------------------------------------------------------
# fixtures


def _write_am_mvn(path) -> None:
    """A realistic Kaldi nnet-text am.mvn: shift ~ -10..-12 (minus mean log-mel), scale ~0.25."""
    idx = np.arange(FEAT_DIM)
    mel = idx % 80
    shift = -(10.0 + 2.0 * np.sin(mel / 80 * math.pi) + 0.01 * (idx // 80))  # -10 .. -12.06
    scale = 0.25 + 0.05 * np.cos(mel / 13.0) + 0.001 * (idx // 80)  # ~0.20 .. 0.31
    fmt = lambda v: " ".join(f"{x:.6f}" for x in v)  # noqa: E731
    path.write_text(
        "<Nnet>\n"
        f"<Splice> {FEAT_DIM} {FEAT_DIM}\n"
        "[ 0 ]\n"
        f"<AddShift> {FEAT_DIM} {FEAT_DIM}\n"
        f"<LearnRateCoef> 0 [ {fmt(shift)} ]\n"
        f"<Rescale> {FEAT_DIM} {FEAT_DIM}\n"
        f"<LearnRateCoef> 0 [ {fmt(scale)} ]\n"
        "</Nnet>\n",
        encoding="utf-8",
    )


@pytest.fixture(scope="module")
def am_mvn(tmp_path_factory):
    path = tmp_path_factory.mktemp("model") / "am.mvn"
    _write_am_mvn(path)
    return path


@pytest.fixture(scope="module")
def funasr_frontend(am_mvn):
    wav_frontend = pytest.importorskip("funasr.frontends.wav_frontend")
    return wav_frontend.WavFrontend(
        cmvn_file=str(am_mvn),
        fs=16000,
        window="hamming",
        n_mels=80,
        frame_length=25,
        frame_shift=10,
        lfr_m=7,
        lfr_n=6,
        dither=0.0,
    )


def _read_wav16(path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        assert w.getframerate() == SAMPLE_RATE_HZ and w.getnchannels() == 1 and w.getsampwidth() == 2
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    """About 8 s of real (synthetic) English speech at 16 kHz, in [-1, 1]."""
    if shutil.which("espeak-ng") is None or shutil.which("ffmpeg") is None:
        pytest.skip("espeak-ng and ffmpeg are needed to make speech")
    d = tmp_path_factory.mktemp("speech")
    raw, out = d / "out.wav", d / "out16.wav"
    text = (
        "The quick brown fox jumps over the lazy dog. Speech recognition turns sound into "
        "text, one frame at a time, and the features must match to four decimal places."
    )
    subprocess.run(["espeak-ng", "-w", str(raw), text], check=True, capture_output=True)
    subprocess.run(
        ["ffmpeg", "-y", "-loglevel", "error", "-i", str(raw), "-ar", "16000", "-ac", "1", str(out)],
        check=True,
        capture_output=True,
    )
    x = _read_wav16(out)
    assert x.size > 6 * SAMPLE_RATE_HZ and np.abs(x).max() > 0.05
    return x


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.1).astype(np.float32)


def _tone(n: int, hz: float = 440.0) -> np.ndarray:
    t = np.arange(n) / SAMPLE_RATE_HZ
    return (0.5 * np.sin(2 * math.pi * hz * t)).astype(np.float32)


@pytest.fixture(scope="module")
def clips(speech) -> list[tuple[str, np.ndarray]]:
    """Named clips of different lengths; fbank frames % 6 covers 0..5."""
    s = speech
    out = [
        ("speech 0.3 s", s[2000 : 2000 + 4800]),
        ("speech 1.7 s", s[8000 : 8000 + 27200]),
        ("speech 3 s", s[:48000]),
        ("speech 5.43 s", s[-86880:]),
        ("speech 60 frames (%6=0)", s[16000 : 16000 + _frames_to_samples(60)]),
        ("speech 61 frames (%6=1)", s[20000 : 20000 + _frames_to_samples(61, 159)]),
        ("speech 65 frames (%6=5)", s[30000 : 30000 + _frames_to_samples(65, 80)]),
        ("noise 62 frames (%6=2)", _noise(_frames_to_samples(62, 3))),
        ("tone 63 frames (%6=3)", _tone(_frames_to_samples(63))),
        ("tone 64 frames (%6=4)", _tone(_frames_to_samples(64, 17), hz=3001.0)),
        ("noise 1 frame (400 samples)", _noise(FRAME_LENGTH, seed=1)),
        ("silence 0.5 s", np.zeros(8000, dtype=np.float32)),
    ]
    for name, x in out:
        assert x.dtype == np.float32, name
    return out


def _pad(clips_) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = torch.tensor([len(x) for _, x in clips_], dtype=torch.int64)
    waves = torch.zeros(len(clips_), int(lengths.max()))
    for i, (_, x) in enumerate(clips_):
        waves[i, : len(x)] = torch.from_numpy(x)
    return waves, lengths


def _funasr_item(fe, x: np.ndarray) -> torch.Tensor:
    r, rl = fe(torch.from_numpy(x)[None], torch.tensor([len(x)]))
    assert r.shape[0] == 1 and int(rl[0]) == r.shape[1]
    return r[0]


# ---------------------------------------------------------------------------------------------
# tests


def test_constants():
    assert (SAMPLE_RATE_HZ, FRAME_LENGTH, FRAME_SHIFT) == (16000, 400, 160)
    assert (feat.LFR_M, feat.LFR_N, feat.N_MELS, FEAT_DIM) == (7, 6, 80, 560)
    assert feat.EPSILON == torch.finfo(torch.float).eps


def test_load_cmvn_matches_funasr(am_mvn):
    wav_frontend = pytest.importorskip("funasr.frontends.wav_frontend")
    ours = load_cmvn(am_mvn)
    theirs = wav_frontend.load_cmvn(str(am_mvn))
    assert ours.dtype == torch.float32 and ours.shape == (2, FEAT_DIM)
    assert torch.equal(ours, theirs)
    assert -12.1 < ours[0].min() and ours[0].max() < -9.9
    assert 0.19 < ours[1].min() and ours[1].max() < 0.32


def test_load_cmvn_rejects_garbage(tmp_path):
    p = tmp_path / "bad.mvn"
    p.write_text("<Nnet>\n<AddShift> 3 3\n<LearnRateCoef> 0 [ 1 2 3 ]\n</Nnet>\n")
    with pytest.raises(ValueError, match="Rescale"):
        load_cmvn(p)
    with pytest.raises(ValueError, match="shape"):
        BatchedFrontend(torch.zeros(2, 80))


def test_module_does_not_import_funasr():
    """funasr/torchaudio are test references only: never imported by the module itself."""
    tree = ast.parse(Path(feat.__file__).read_text(encoding="utf-8"))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            # the one vocabulary (pipeline.domain.tags: the sample rate) is plain data
            imported.add(node.module if node.module.startswith("pipeline.") else node.module.split(".")[0])
    assert imported <= {"__future__", "math", "os", "torch", "pipeline.domain.tags"}, imported


def test_buffers(am_mvn):
    m = BatchedFrontend.from_model_dir(am_mvn.parent)
    assert m.window.shape == (FRAME_LENGTH,) and m.mel.shape == (257, 80)
    assert torch.equal(m.cmvn, load_cmvn(am_mvn))
    ta = pytest.importorskip("torchaudio.compliance.kaldi")
    banks, _ = ta.get_mel_banks(80, 512, 16000.0, 20.0, 0.0, 100.0, -500.0, 1.0)
    assert torch.equal(m.mel[:256], banks.t()) and m.mel[256].abs().sum() == 0


def test_frame_counts():
    assert [num_fbank_frames(n) for n in (0, 1, 399, 400, 559, 560, 16000)] == [0, 0, 0, 1, 1, 2, 98]
    assert [num_lfr_frames(n) for n in (0, 399, 400, 1200, 1360, 16000)] == [0, 0, 1, 1, 2, 17]


def test_num_lfr_frames_matches_funasr(funasr_frontend):
    rng = random.Random(1234)
    ns = sorted({400, 401, 559, 560, 1200, 1360, 20000, *(rng.randint(400, 20000) for _ in range(100))})
    x = _noise(max(ns), seed=7)
    for n in ns:
        r = _funasr_item(funasr_frontend, x[:n])
        assert r.shape[0] == num_lfr_frames(n), n


def test_random_lengths_batch_matches_funasr(funasr_frontend, am_mvn):
    """Many random lengths in one padded batch: lengths and values match funasr."""
    rng = random.Random(99)
    ns = [rng.randint(400, 20000) for _ in range(64)]
    clips_ = [(f"noise+tone {n}", _noise(n, seed=i) + _tone(n, 200.0 + 37 * i)) for i, n in enumerate(ns)]
    waves, lengths = _pad(clips_)
    feats, feat_lengths = BatchedFrontend.from_model_dir(am_mvn.parent)(waves, lengths)
    assert feats.shape == (64, num_lfr_frames(waves.shape[1]), FEAT_DIM)
    assert feat_lengths.tolist() == [num_lfr_frames(n) for n in ns]
    worst = 0.0
    for i, (_, x) in enumerate(clips_):
        r = _funasr_item(funasr_frontend, x)
        assert r.shape[0] == int(feat_lengths[i])
        worst = max(worst, (feats[i, : r.shape[0]] - r).abs().max().item())
        assert not feats[i, r.shape[0] :].any(), "padded rows not zero"
    print(f"\n[features] 64 random lengths, max abs diff vs funasr: {worst:.3g}")
    assert worst <= TOL_VS_FUNASR


@pytest.mark.parametrize("device", DEVICES)
def test_matches_funasr_per_item(device, clips, funasr_frontend, am_mvn):
    module = BatchedFrontend.from_model_dir(am_mvn.parent).to(device)
    waves, lengths = _pad(clips)
    with torch.inference_mode():
        feats, feat_lengths = module(waves.to(device), lengths.to(device))
    assert feats.device.type == device and feat_lengths.device.type == device
    assert feats.dtype == torch.float32 and feat_lengths.dtype == torch.int64
    assert feats.shape == (len(clips), num_lfr_frames(waves.shape[1]), FEAT_DIM)
    feats, feat_lengths = feats.cpu(), feat_lengths.cpu()

    # the funasr batch path (pad_sequence) gives the same lengths
    _, ref_lengths = funasr_frontend(waves, lengths)
    assert feat_lengths.tolist() == ref_lengths.tolist()

    report = []
    for i, (name, x) in enumerate(clips):
        ref = _funasr_item(funasr_frontend, x)
        n = int(feat_lengths[i])
        assert n == ref.shape[0] == num_lfr_frames(len(x)), name
        diff = (feats[i, :n] - ref).abs().max().item()
        report.append(f"  {name:30s} T={n:3d}  max|diff|={diff:.3g}")
        assert diff <= TOL_VS_FUNASR, (name, diff)
        assert torch.isfinite(feats[i]).all(), name
        assert not feats[i, n:].any(), f"{name}: padded rows not zero"
    print(f"\n[features] {device}: max abs diff vs funasr per item\n" + "\n".join(report))


@pytest.mark.parametrize("device", DEVICES)
def test_batch_of_one_equals_padded_batch(device, clips, am_mvn):
    module = BatchedFrontend.from_model_dir(am_mvn.parent).to(device)
    waves, lengths = _pad(clips)
    with torch.inference_mode():
        feats, feat_lengths = module(waves.to(device), lengths.to(device))
        worst = 0.0
        for i, (name, x) in enumerate(clips):
            one, one_len = module(torch.from_numpy(x)[None].to(device), torch.tensor([len(x)], device=device))
            n = int(one_len[0])
            assert one.shape == (1, n, FEAT_DIM) and n == int(feat_lengths[i]), name
            d = (one[0] - feats[i, :n]).abs().max().item()
            worst = max(worst, d)
            assert d <= TOL_BATCH_OF_ONE, (name, d)
    print(f"\n[features] {device}: batch-of-one vs padded batch, max abs diff {worst:.3g}")


def test_garbage_past_length_is_ignored(clips, am_mvn):
    """Samples past an item's length (not zero) change nothing: only `lengths` counts."""
    module = BatchedFrontend.from_model_dir(am_mvn.parent)
    waves, lengths = _pad(clips)
    noisy = waves.clone()
    mask = torch.arange(waves.shape[1])[None] >= lengths[:, None]
    noisy[mask] = torch.from_numpy(_noise(int(mask.sum()), seed=5))
    a, la = module(waves, lengths)
    b, lb = module(noisy, lengths)
    assert torch.equal(la, lb) and torch.equal(a, b)


def test_short_items_and_inputs(am_mvn):
    module = BatchedFrontend.from_model_dir(am_mvn.parent)
    # items shorter than one frame inside a batch: length 0, all-zero rows
    waves = torch.from_numpy(_noise(3000))[None].repeat(3, 1)
    lengths = torch.tensor([3000, 399, 0])
    feats, fl = module(waves, lengths)
    assert fl.tolist() == [num_lfr_frames(3000), 0, 0]
    assert feats[1:].abs().max() == 0 and feats[0].abs().max() > 0
    # whole batch shorter than one frame: no rows at all
    feats, fl = module(torch.zeros(2, 399), torch.tensor([399, 10]))
    assert feats.shape == (2, 0, FEAT_DIM) and fl.tolist() == [0, 0]
    # float64 waves and int32 lengths are accepted; result is float32 / int64
    x = torch.from_numpy(_tone(5000))[None]
    a, la = module(x, torch.tensor([5000]))
    b, lb = module(x.double(), torch.tensor([5000], dtype=torch.int32))
    assert b.dtype == torch.float32 and lb.dtype == torch.int64
    assert torch.equal(la, lb) and (a - b).abs().max() <= 1e-4


def test_no_grad_state_and_deterministic(am_mvn, clips):
    module = BatchedFrontend.from_model_dir(am_mvn.parent)
    assert list(module.parameters()) == []
    waves, lengths = _pad(clips[:4])
    with torch.inference_mode():
        a = module(waves, lengths)
    b = module(waves, lengths)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
