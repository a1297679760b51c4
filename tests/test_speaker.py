"""pipeline/model/speaker.py: CAM++ re-stated. Shapes, FunASR's state dict names, the same
outputs as FunASR's CAMPPlus and torchaudio's kaldi fbank, a pinned embedding of a known input,
loading (a foreign file, a directory without weights, an unreachable hub: clear errors) and the
demo weights (pipeline/model/demo/build_speaker.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.domain.errors import ModelUnavailable
from pipeline.model.demo.build_speaker import build_speaker_weights, ensure_speaker_dir
from pipeline.model.speaker import (EMBEDDING_DIM, CAMPPlus, SpeakerEmbedder, SpeakerFrontend,
                                    load_campplus, resolve_speaker_model, weights_file)

WINDOW = 24_000  # 1.5 s


def known_wave() -> np.ndarray:
    t = np.arange(WINDOW) / 16_000
    return (0.3 * np.sin(2 * np.pi * 150 * t) + 0.1 * np.sin(2 * np.pi * 1200 * t)).astype(np.float32)


def seeded_model() -> CAMPPlus:
    torch.manual_seed(0)
    return CAMPPlus().eval()


def test_shapes_and_parameter_names():
    model = seeded_model()
    feats = SpeakerFrontend()(torch.zeros(3, WINDOW) + 1e-3 * torch.randn(3, WINDOW))
    assert feats.shape == (3, 148, 80)  # kaldi snip_edges: 1 + (24000 - 400) // 160
    with torch.inference_mode():
        assert model(feats).shape == (3, EMBEDDING_DIM)
        assert model(feats[:, :37]).shape == (3, EMBEDDING_DIM)  # any length
    names = model.state_dict().keys()
    assert len(names) == 937
    for name in ("head.conv1.weight", "head.layer1.0.shortcut.0.weight", "xvector.tdnn.linear.weight",
                 "xvector.block1.tdnnd12.cam_layer.linear_local.weight", "xvector.block2.tdnnd24.linear1.weight",
                 "xvector.block3.tdnnd16.nonlinear2.batchnorm.running_var", "xvector.transit3.linear.weight",
                 "xvector.out_nonlinear.batchnorm.weight", "xvector.dense.linear.weight",
                 "xvector.dense.nonlinear.batchnorm.running_mean"):
        assert name in names, name
    assert sum(p.numel() for p in model.parameters()) == 6_848_544


def test_the_frontend_is_torchaudio_kaldi_fbank_minus_its_mean():
    import torchaudio.compliance.kaldi as kaldi

    waves = torch.from_numpy(np.stack([known_wave(), np.random.default_rng(0).normal(0, 0.1, WINDOW)
                                       .astype(np.float32)]))
    ours = SpeakerFrontend()(waves)
    for row, wave in zip(ours, waves):
        ref = kaldi.fbank(wave.unsqueeze(0), num_mel_bins=80)
        torch.testing.assert_close(row, ref - ref.mean(0, keepdim=True), atol=1e-4, rtol=1e-4)


def test_the_same_outputs_as_funasr_campplus():
    pytest.importorskip("funasr")
    from funasr.models.campplus.model import CAMPPlus as FunasrCAMPPlus

    torch.manual_seed(1)
    ref = FunasrCAMPPlus().eval()
    for m in ref.modules():  # statistics other than the initial ones, so the batchnorms count
        if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 2.0)
    ours = CAMPPlus().eval()
    ours.load_state_dict(ref.state_dict(), strict=True)
    feats = SpeakerFrontend()(torch.from_numpy(np.stack([known_wave(), known_wave()[::-1].copy()])))
    with torch.inference_mode():
        torch.testing.assert_close(ours(feats), ref(feats), atol=1e-5, rtol=1e-5)


def test_the_embedding_of_a_known_input_is_stable():
    emb = SpeakerEmbedder(seeded_model()).embed(np.stack([known_wave(), known_wave()[::-1].copy()]))
    assert emb.shape == (2, EMBEDDING_DIM) and emb.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(emb[0, :6], [-0.0391, 0.0236, 0.1493, -0.1202, -0.0799, 0.0967], atol=2e-3)
    np.testing.assert_allclose(emb[1, :3], [0.0123, 0.0458, 0.1528], atol=2e-3)


def test_batching_does_not_change_an_embedding():
    rng = np.random.default_rng(3)
    waves = rng.normal(0, 0.1, (5, WINDOW)).astype(np.float32)
    model = seeded_model()
    whole = SpeakerEmbedder(model, batch_size=256).embed(waves)
    pieces = SpeakerEmbedder(model, batch_size=2).embed(waves)
    np.testing.assert_allclose(whole, pieces, atol=1e-5)
    assert SpeakerEmbedder(model).embed(np.zeros((0, WINDOW), np.float32)).shape == (0, EMBEDDING_DIM)


def test_weights_load_and_foreign_files_are_refused(tmp_path):
    state = seeded_model().state_dict()
    torch.save(state, tmp_path / "campplus_cn_common.bin")
    loaded = load_campplus(weights_file(tmp_path))
    assert torch.equal(loaded.state_dict()["xvector.dense.linear.weight"], state["xvector.dense.linear.weight"])
    torch.save({"encoder.weight": torch.zeros(2)}, tmp_path / "other.bin")
    with pytest.raises(ModelUnavailable, match="not CAM\\+\\+ weights"):
        load_campplus(tmp_path / "other.bin")
    (tmp_path / "junk.bin").write_bytes(b"not a checkpoint")
    with pytest.raises(ModelUnavailable, match="not a readable"):
        load_campplus(tmp_path / "junk.bin")


def test_resolve_a_directory_and_fail_fast_without_the_hub(tmp_path, monkeypatch):
    torch.save(seeded_model().state_dict(), tmp_path / "model.pt")
    assert resolve_speaker_model(str(tmp_path), hub_timeout_s=0.1).weights == tmp_path / "model.pt"
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelUnavailable, match="not a CAM\\+\\+ speaker model directory"):
        resolve_speaker_model(str(empty), hub_timeout_s=0.1)
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "no-cache"))
    import pipeline.model.loading as loading

    monkeypatch.setattr(loading, "hub_reachable", lambda timeout_s: False)
    with pytest.raises(ModelUnavailable, match="cannot reach the model hub"):
        resolve_speaker_model("iic/speech_campplus_sv_zh-cn_16k-common", hub_timeout_s=0.1)
    with pytest.raises(ModelUnavailable, match="not a hub name"):
        resolve_speaker_model("nonsense", hub_timeout_s=0.1)


def test_demo_weights_are_reproducible_and_calibrated(tmp_path):
    a = build_speaker_weights(seed=0, clips=4)
    b = build_speaker_weights(seed=0, clips=4)
    assert all(torch.equal(a[k], b[k]) for k in a)
    c = build_speaker_weights(seed=1, clips=4)
    assert not torch.equal(a["xvector.dense.linear.weight"], c["xvector.dense.linear.weight"])
    # the statistics were measured: not the initial 0 / 1
    assert a["xvector.dense.nonlinear.batchnorm.running_mean"].abs().max() > 0.01
    assert not torch.allclose(a["head.bn1.running_var"], torch.ones(32))


def test_the_demo_directory_is_built_once(tmp_path, monkeypatch):
    import pipeline.model.demo.build_speaker as build

    calls = []
    real = build.build_speaker_weights
    monkeypatch.setattr(build, "build_speaker_weights", lambda seed=0: calls.append(seed) or real(seed, clips=2))
    path = ensure_speaker_dir(tmp_path)
    assert weights_file(path) is not None and load_campplus(weights_file(path)) is not None
    assert ensure_speaker_dir(tmp_path) == path and calls == [0]
