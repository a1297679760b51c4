"""pipeline.model.loading.load_engine: the service's engine from the project's own loader (no funasr
import on the path), the same text as funasr's own ``AutoModel.generate``; funasr only for the eager
reference (``fused=False``) and for a directory the own loader does not know."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import torch

from pipeline.audio.decode import decode_audio
from pipeline.domain.types import TranscribeOptions
from pipeline.model.loading import load_engine, reference_generate
from tests.conftest import ROOT

OPTS = [TranscribeOptions("auto", True), TranscribeOptions("en", False), TranscribeOptions("zh", True),
        TranscribeOptions("auto", True, ban_emo_unk=True)]


@pytest.fixture(scope="module")
def clips(clip_factory):
    speech = decode_audio(clip_factory("wav", 16000, 1).read_bytes()).samples
    out = [speech, speech[: len(speech) // 2], speech[: 16000 + 321], np.concatenate([speech, speech])]
    return [np.ascontiguousarray(c, dtype=np.float32) for c in out]


def test_the_service_engine_loads_without_funasr_and_gives_automodel_generate_text(demo_dir, demo_am, clips,
                                                                                   tmp_path):
    """In a fresh process (what a server does): no funasr module imported, and for each option the
    demo model's text is funasr's own AutoModel.generate's, clip by clip."""
    np.save(tmp_path / "clips.npy", np.array(clips, dtype=object), allow_pickle=True)
    opts = [[o.language, o.use_itn, o.ban_emo_unk] for o in OPTS]
    code = (
        "import json, sys, numpy as np, torch\n"
        "from pipeline.domain.types import TranscribeOptions\n"
        "from pipeline.model.loading import load_engine\n"
        f"engine = load_engine({str(demo_dir)!r}, 'cpu')\n"
        f"clips = np.load({str(tmp_path / 'clips.npy')!r}, allow_pickle=True)\n"
        "texts = []\n"
        f"for lang, itn, ban in {opts!r}:\n"
        "    o = TranscribeOptions(lang, itn, ban_emo_unk=ban)\n"
        "    texts.append([r.raw_text for r in engine.transcribe([torch.from_numpy(c) for c in clips], [o] * len(clips))])\n"
        "print(json.dumps({'funasr': [m for m in sys.modules if m.split('.')[0] == 'funasr'],\n"
        "                  'eager_modules': engine.model is not None, 'texts': texts}))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["funasr"] == [] and not got["eager_modules"], got
    for opt, mine in zip(OPTS, got["texts"]):
        assert mine == reference_generate(demo_am, clips, opt), opt
    assert "<|Speech|>" in got["texts"][0][0] and "speech" in got["texts"][0][0]


def test_a_started_server_holds_no_funasr_module(demo_dir, tmp_path):
    """The whole worker side of a process (build_runtime, start: load, warm-up, workers) on the CPU."""
    code = (
        "import sys\n"
        "from pipeline.config import Settings\n"
        "from pipeline.serving.runtime import build_runtime\n"
        f"rt = build_runtime(Settings(model={str(demo_dir)!r}, device='cpu', data_dir={str(tmp_path)!r}))\n"
        "rt.start()\n"
        "assert rt.pool.workers and rt.pool.workers[0].engine.model is None\n"
        "rt.stop()\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'funasr'))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-2000:]


def test_fused_false_is_the_eager_reference_over_funasrs_modules(tiny_dir, tiny_am, clips):
    engine = load_engine(tiny_dir, "cpu", fused=False, automodel=lambda: tiny_am)
    assert engine.model is tiny_am.model and not engine.core.fused
    fast = load_engine(tiny_dir, "cpu")
    assert fast.model is None
    waves = [torch.from_numpy(c) for c in clips]
    assert ([o.token_ids for o in fast.transcribe(waves, OPTS)]
            == [o.token_ids for o in engine.transcribe(waves, OPTS)])


def test_a_directory_the_own_loader_does_not_know_loads_through_funasr(tiny_dir, tiny_am, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    cfg = (other / "config.yaml").read_text()
    (other / "config.yaml").write_text(cfg.replace("encoder: SenseVoiceEncoderSmall", "encoder: Conformer"))
    asked = []
    engine = load_engine(other, "cpu", automodel=lambda: asked.append(1) or tiny_am)
    assert asked == [1] and engine.model is tiny_am.model
