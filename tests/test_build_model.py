"""Tests for pipeline.model.demo.build_model (offline SenseVoiceSmall model directories).

Only tiny-architecture directories are built (about 1 s each once funasr is
imported); the full variant is checked through its config and a meta-device
parameter count.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import yaml

from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.model.demo import build_model as bm
from pipeline.model.demo import VARIANTS, build_model_dir, ensure_model_dir, is_demo_model

REPO_ROOT = Path(__file__).resolve().parents[1]
REFERENCE_DIR = Path("/work/shared/reference")
FULL_PARAMS = 233_999_167  # published SenseVoiceSmall with vocab 25,055
TINY_PARAMS = 1_836_543
FIXED_IDS = {
    24884: "<|zh|>", 24885: "<|en|>", 24888: "<|yue|>", 24892: "<|ja|>", 24896: "<|ko|>",
    24992: "<|nospeech|>", 24993: "<|Speech|>", 24994: "<|BGM|>", 24995: "<|Applause|>",
    24996: "<|Laughter|>", 24997: "<|Cry|>", 24998: "<|Sneeze|>", 24999: "<|Breath|>",
    25000: "<|Cough|>", 25001: "<|HAPPY|>", 25002: "<|SAD|>", 25003: "<|ANGRY|>",
    25004: "<|NEUTRAL|>", 25005: "<|FEARFUL|>", 25006: "<|DISGUSTED|>",
    25007: "<|SURPRISED|>", 25009: "<|EMO_UNKNOWN|>", 25010: "<|Sing|>",
    25011: "<|Speech_Noise|>", 25012: "<|GBG|>", 25013: "<|Event_UNK|>",
    25016: "<|withitn|>", 25017: "<|woitn|>",
    0: "<unk>", 1: "<s>", 2: "</s>",
}


# ----------------------------------------------------------------- fixtures
# Fixtures build into fresh temporary directories (not conftest's shared cache) so
# that caching, determinism and rebuilding are tested from scratch.
@pytest.fixture(scope="module")
def cache_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("sv-cache")


@pytest.fixture(scope="module")
def tmp_tiny_dir(cache_root) -> Path:
    return ensure_model_dir("tiny", cache_root=cache_root, seed=0)


@pytest.fixture(scope="module")
def demo_info(tmp_path_factory) -> bm.BuildInfo:
    return build_model_dir(tmp_path_factory.mktemp("sv-demo") / "model", "demo", seed=0)


def load_model(model_dir: Path):
    from funasr import AutoModel

    return AutoModel(model=str(model_dir), disable_update=True, device="cpu",
                     disable_pbar=True, log_level="ERROR", frontend_conf={"dither": 0.0},
                     ncpu=2)


@pytest.fixture(scope="module")
def demo_model(demo_info):
    return load_model(demo_info.path)


def read_wav(path: Path) -> np.ndarray:
    """16-bit mono WAV -> float32 samples in [-1, 1)."""
    with wave.open(str(path)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (SAMPLE_RATE_HZ, 1, 2)
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return pcm.astype(np.float32) / 32768.0


def synthetic_voice(seconds: float = 1.5) -> np.ndarray:
    """Voiced-speech stand-in: 120 Hz harmonics with a 1/k^2 spectral tilt, in bursts."""
    t = np.arange(int(seconds * SAMPLE_RATE_HZ)) / SAMPLE_RATE_HZ
    f0 = 120.0  # Hz
    x = sum(np.sin(2 * np.pi * f0 * k * t) / k**2 for k in range(1, 30))
    gate = (np.floor(t / 0.25) % 2 == 0).astype(float)  # 250 ms on / 250 ms off
    noise = np.random.default_rng(0).normal(0.0, 1e-3, t.size)
    return (0.3 * x * gate + noise).astype(np.float32)


@pytest.fixture(scope="module")
def speech(tmp_path_factory) -> np.ndarray:
    """'hello world' spoken by espeak-ng at 16 kHz, or a synthetic voice without it."""
    if not (shutil.which("espeak-ng") and shutil.which("ffmpeg")):
        return synthetic_voice()
    d = tmp_path_factory.mktemp("speech")
    raw, wav = d / "raw.wav", d / "speech.wav"
    subprocess.run(["espeak-ng", "-w", str(raw), "hello world"], check=True)
    subprocess.run(["ffmpeg", "-y", "-loglevel", "error", "-i", str(raw),
                    "-ar", str(SAMPLE_RATE_HZ), "-ac", "1", str(wav)], check=True)
    return read_wav(wav)


# ----------------------------------------------------------------- module surface
def test_import_is_light():
    code = ("import sys, pipeline; before = set(sys.modules)\n"
            "import pipeline.model.demo.build_model\n"
            "from pipeline.model.demo import build_model_dir, VARIANTS\n"
            "heavy = {'torch', 'funasr', 'sentencepiece'} & (set(sys.modules) - before)\n"
            "assert not heavy, heavy\n")
    subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True)


def test_reexports_and_variants():
    import pipeline.model.demo as pt

    assert VARIANTS == ("tiny", "full", "demo")
    assert pt.ensure_model_dir is bm.ensure_model_dir
    assert pt.is_demo_model is bm.is_demo_model
    with pytest.raises(ValueError):
        build_model_dir("/nonexistent", "huge")


@pytest.mark.parametrize("variant", ["tiny", "full"])
def test_config_matches_reference(variant):
    ref = REFERENCE_DIR / f"config.{variant}.yaml"
    if not ref.exists():
        pytest.skip("reference config not available")
    assert bm.make_config(variant) == yaml.safe_load(ref.read_text())
    assert bm.CONFIGURATION_JSON == json.loads((REFERENCE_DIR / "configuration.json").read_text())


def test_full_variant_architecture_and_params():
    enc = bm.make_config("full")["encoder_conf"]
    assert (enc["output_size"], enc["attention_heads"], enc["linear_units"],
            enc["num_blocks"], enc["tp_blocks"]) == (512, 4, 2048, 50, 20)
    assert bm.make_config("demo") == bm.make_config("tiny")
    import funasr.models.sense_voice.model  # noqa: F401  (import time is not counted)

    t0 = time.perf_counter()
    assert bm.count_params("full") == FULL_PARAMS
    assert bm.count_params("tiny") == TINY_PARAMS
    assert time.perf_counter() - t0 < 15


def test_count_params_leaves_no_meta_tensors_behind():
    import torch

    bm.count_params("tiny")
    on_meta = [f"{name}.{attr}" for name, mod in list(sys.modules.items())
               if name.startswith(("funasr", "torchaudio")) and mod is not None
               for attr, val in list(vars(mod).items())
               if isinstance(val, torch.Tensor) and val.is_meta]
    assert not on_meta
    assert torch.empty(1).device.type == "cpu"


# ----------------------------------------------------------------- built directories
def test_tiny_dir_layout(tmp_tiny_dir):
    names = {p.name for p in tmp_tiny_dir.iterdir()}
    assert set(bm.MODEL_FILES) | {bm.MARKER_NAME} == names
    assert bm.read_marker(tmp_tiny_dir) == {"variant": "tiny", "seed": 0, "params": TINY_PARAMS,
                                        "builder_version": bm.BUILDER_VERSION}
    assert tmp_tiny_dir == Path(tmp_tiny_dir.parent) / "sensevoice-tiny-s0"
    assert not is_demo_model(tmp_tiny_dir)


def test_demo_dir(demo_info):
    assert (demo_info.variant, demo_info.params) == ("demo", TINY_PARAMS)
    assert demo_info.seconds > 0
    assert is_demo_model(demo_info.path)
    assert not is_demo_model(demo_info.path / "missing")
    shifts = (demo_info.path / "am.mvn").read_text().split("<AddShift>")[1]
    assert set(shifts.split("[")[1].split("]")[0].split()) == {"-10.000000"}  # flat CMVN


def test_tokenizer_fixed_ids(tmp_tiny_dir):
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(tmp_tiny_dir / bm.BPE_NAME))
    assert sp.get_piece_size() == bm.VOCAB_SIZE == 25055
    assert {i: sp.id_to_piece(i) for i in FIXED_IDS} == FIXED_IDS
    pieces = json.loads((tmp_tiny_dir / "tokens.json").read_text(encoding="utf-8"))
    assert pieces == [sp.id_to_piece(i) for i in range(bm.VOCAB_SIZE)]
    assert "\u2581speech" in pieces
    assert sp.decode([24885, 25004, 24993, 25016]) == "<|en|><|NEUTRAL|><|Speech|><|withitn|>"


@pytest.mark.parametrize("which", ["tiny", "demo"])
def test_automodel_loads_saved_weights(which, tmp_tiny_dir, demo_info):
    import torch

    model_dir = tmp_tiny_dir if which == "tiny" else demo_info.path
    saved = torch.load(model_dir / "model.pt", map_location="cpu")
    loaded = load_model(model_dir).model.state_dict()
    assert saved.keys() == loaded.keys()
    # ignore_init_mismatch would silently keep random weights: compare every tensor
    mismatched = [k for k, v in saved.items() if not torch.equal(v, loaded[k])]
    assert not mismatched
    assert loaded["ctc.ctc_lo.weight"].shape == (25055, 64)


@pytest.mark.parametrize("language, use_itn, prefix", [
    ("en", True, "<|en|><|NEUTRAL|><|Speech|><|withitn|>"),
    ("zh", False, "<|zh|><|NEUTRAL|><|Speech|><|woitn|>"),
])
def test_demo_model_transcribes(demo_model, speech, language, use_itn, prefix):
    result = demo_model.generate(input=speech, language=language, use_itn=use_itn)
    text = result[0]["text"]
    assert text.startswith(prefix), text
    assert "speech" in text[len(prefix):], text


# ----------------------------------------------------------------- cache and determinism
def test_ensure_model_dir_is_cached(tmp_tiny_dir, cache_root, monkeypatch):
    before = {p.name: p.stat().st_mtime_ns for p in tmp_tiny_dir.iterdir()}

    def no_build(*args, **kwargs):
        raise AssertionError("ensure_model_dir rebuilt a cached directory")

    monkeypatch.setattr(bm, "build_model_dir", no_build)
    t0 = time.perf_counter()
    assert ensure_model_dir("tiny", cache_root=cache_root) == tmp_tiny_dir
    assert time.perf_counter() - t0 < 0.5
    assert {p.name: p.stat().st_mtime_ns for p in tmp_tiny_dir.iterdir()} == before


def test_default_cache_root_from_env(monkeypatch, tmp_path):
    monkeypatch.setenv(bm.CACHE_ENV, str(tmp_path))
    assert bm.default_cache_root() == tmp_path
    monkeypatch.delenv(bm.CACHE_ENV)
    assert bm.default_cache_root() == Path.home() / ".cache/sensevoice-app/models"


def test_same_seed_same_bytes(tmp_tiny_dir, tmp_path):
    import torch

    torch.manual_seed(123)
    rng_state = torch.get_rng_state()
    info = build_model_dir(tmp_path / "again", "tiny", seed=0)
    assert torch.equal(torch.get_rng_state(), rng_state)  # caller's RNG untouched
    for name in [*bm.MODEL_FILES, bm.MARKER_NAME]:
        assert (info.path / name).read_bytes() == (tmp_tiny_dir / name).read_bytes(), name


def test_other_seed_other_weights(tmp_tiny_dir, tmp_path):
    info = build_model_dir(tmp_path / "seed1", "tiny", seed=1)
    assert (info.path / "model.pt").read_bytes() != (tmp_tiny_dir / "model.pt").read_bytes()
    assert bm.read_marker(info.path)["seed"] == 1


def _leftovers(root: Path) -> list[str]:
    return [p.name for p in root.iterdir() if ".tmp-" in p.name or ".stale-" in p.name]


def test_ensure_rebuilds_stale_marker(tmp_path):
    target = tmp_path / "sensevoice-tiny-s0"
    target.mkdir()
    (target / "junk.txt").write_text("old build")
    (target / bm.MARKER_NAME).write_text(json.dumps(
        {"variant": "tiny", "seed": 0, "params": 1, "builder_version": 0}))
    assert ensure_model_dir("tiny", cache_root=tmp_path) == target
    assert bm.read_marker(target)["builder_version"] == bm.BUILDER_VERSION
    assert not (target / "junk.txt").exists()
    assert _leftovers(tmp_path) == []


def test_ensure_concurrent_callers_build_once(tmp_path, monkeypatch):
    builds = []
    real_build = bm.build_model_dir

    def counting_build(*args, **kwargs):
        builds.append(args)
        return real_build(*args, **kwargs)

    monkeypatch.setattr(bm, "build_model_dir", counting_build)
    results, errors = [], []

    def call():
        try:
            results.append(ensure_model_dir("demo", cache_root=tmp_path))
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=call) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(builds) == 1
    assert results == [tmp_path / "sensevoice-demo-s0"] * 4
    assert is_demo_model(results[0])
    assert _leftovers(tmp_path) == []


def test_cli(tmp_tiny_dir, cache_root, capsys):
    assert bm.main(["--variant", "tiny", "--cache-root", str(cache_root)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["path"], out["params"]) == (str(tmp_tiny_dir), TINY_PARAMS)
    assert bm.main(["--variant", "full", "--count-params"]) == 0
    assert json.loads(capsys.readouterr().out) == {"variant": "full", "params": FULL_PARAMS}
