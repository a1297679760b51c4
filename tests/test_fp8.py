"""FP8 (e4m3) GEMMs (pipeline/model/fp8.py): the quantisation, its scales and shapes, the emulated
product, the engine's tokens against fp32 (CPU); on a GPU, ``torch._scaled_mm`` against the
emulation and the compiled, captured fp8 engine's tokens against fp32."""

from __future__ import annotations

import difflib
import time

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipeline.audio.decode import decode_audio
from pipeline.domain.types import TranscribeOptions
from pipeline.model import fp8
from pipeline.model.engine import SenseVoiceEngine

OPTS = [
    TranscribeOptions("auto", True),
    TranscribeOptions("en", False),
    TranscribeOptions("zh", True),
    TranscribeOptions("ja", False, ban_emo_unk=True),
    TranscribeOptions("nospeech", True),
]
STEP = 2.0 ** -4  # e4m3: 3 mantissa bits, a rounding error of at most half a step of 2^-3, relative
SUBNORMAL_HALF_STEP = 2.0 ** -10  # below 2^-6 the steps are 2^-9 apart (absolute, in units of the scale)


@pytest.fixture(scope="module")
def clips(clip_factory):
    """The engine tests' clips: real speech cut to different lengths, plus noise."""
    speech = decode_audio(clip_factory("wav", 16000, 1).read_bytes()).samples
    rng = np.random.default_rng(0)
    out = [speech, speech[: len(speech) // 2], speech[: 16000 + 321], np.concatenate([speech, speech])]
    out.append((0.05 * rng.standard_normal(27_777)).astype(np.float32))
    return [np.ascontiguousarray(c, dtype=np.float32) for c in out]


def matched(ref: list, got: list) -> tuple[int, int]:
    """(tokens of ``got`` matching ``ref`` in order, tokens of ``ref``) over clips."""
    same = sum(sum(b.size for b in difflib.SequenceMatcher(None, a, g, autojunk=False).get_matching_blocks())
               for a, g in zip(ref, got))
    return same, sum(len(a) for a in ref)


# ---------------------------------------------------------------- quantisation
def test_weight_quantised_per_output_channel_within_e4m3_rounding():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(48, 32, generator=g) * torch.logspace(-3, 2, 48)[:, None]  # rows 5 decades apart
    w[5] = 0.0  # an all-zero row
    q, s = fp8.quantise_weight(w)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (48, 32) and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (1, 48)
    amax = w.abs().amax(1)
    rows = amax > 0
    assert torch.allclose(s[0, rows], amax[rows] / 448.0)
    assert torch.equal(q.float().abs().amax(1)[rows], torch.full((int(rows.sum()),), 448.0))  # amax -> 448
    back = q.float() * s.t()
    err = (back - w).abs()
    assert bool((err <= w.abs() * STEP + s.t() * SUBNORMAL_HALF_STEP + 1e-30).all())
    assert torch.equal(back[5], torch.zeros(32)) and bool(torch.isfinite(s).all())


def test_activations_quantised_per_token():
    x = torch.randn(7, 64, dtype=torch.float64) * torch.tensor([1e-4, 1, 10, 1e3, 1, 1, 1])[:, None]
    x[3] = 0.0
    q, s = fp8.quantise_rows(x)
    assert q.shape == (7, 64) and s.shape == (7, 1) and q.dtype == torch.float8_e4m3fn
    assert torch.equal(q[3].float(), torch.zeros(64)) and bool(torch.isfinite(s).all())
    rel = ((q.float() * s - x.float()).abs() / x.float().abs().amax(1, keepdim=True).clamp(min=1e-30))
    assert float(rel.max()) <= STEP  # each row scaled by its own amax: small and large rows alike


def test_emulated_linear_is_the_dequantised_product_and_close_to_fp32():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(3, 5, 64, generator=g)
    w = torch.randn(32, 64, generator=g) / 8
    b = torch.randn(32, generator=g)
    wq, ws = fp8.quantise_weight(w)
    y = fp8.linear(x, wq, ws, b, torch.float32)
    assert y.shape == (3, 5, 32) and y.dtype == torch.float32
    xq, xs = fp8.quantise_rows(x.reshape(-1, 64))
    deq = F.linear(xq.float() * xs, wq.float() * ws.t(), b).view(3, 5, 32)
    assert torch.allclose(y, deq, rtol=1e-5, atol=1e-5)
    exact = F.linear(x, w, b)
    rel = float((y - exact).norm() / (exact - b).norm())
    assert 1e-4 < rel < 0.06, rel  # quantised (not the fp32 product), within e4m3's error
    assert fp8.linear(x.to(torch.float64), wq, ws, None, torch.float64).dtype == torch.float64


def test_block_quantisation_touches_only_the_named_layers(tiny_dir):
    e = SenseVoiceEngine.from_model_dir_fast(tiny_dir, "cpu", "float32", compile=False)
    w, _ = e.core.blocks[1]
    q = fp8.quantise_block(w, ["w1", "qkv"])
    assert q.w1.dtype == q.qkv_w.dtype == torch.float8_e4m3fn
    assert q.w1_s.shape == (1, w.w1.shape[0]) and q.qkv_s.shape == (1, w.qkv_w.shape[0])
    assert q.out_s is None and q.w2_s is None and q.out_w is w.out_w and q.w2 is w.w2 and q.b1 is w.b1
    assert w.w1_s is None and w.w1.dtype == torch.float32  # the original is left as it was
    with pytest.raises(ValueError, match="not a quantisable layer"):
        fp8.quantise_block(w, ["lo"])
    with pytest.raises(ValueError, match="quantised already"):
        fp8.quantise_block(q, ["w1"])
    odd = w._replace(w1=torch.zeros(40, 24))  # not multiples of 16: _scaled_mm cannot take it
    assert fp8.quantise_block(odd, ["w1"]).w1_s is None


def test_setting_values():
    assert fp8.layers_of("off") == () and fp8.layers_of("ffn") == ("w1", "w2")
    assert set(fp8.layers_of("all")) == set(fp8.LAYERS)
    with pytest.raises(ValueError, match="fp8_gemm must be one of"):
        fp8.layers_of("e5m2")


def test_a_gpu_without_fp8_units_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *_: (8, 0))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *_: "A100")
    with pytest.raises(fp8.Fp8Unsupported, match="8.9"):
        fp8.check_device(torch.device("cuda", 0))
    fp8.check_device(torch.device("cpu"))  # the emulation runs anywhere


# ---------------------------------------------------------------- the engine
@pytest.fixture(scope="module")
def demo_fp32(demo_dir, clips):
    e = SenseVoiceEngine.from_model_dir_fast(demo_dir, "cpu", "float32", compile=False)
    return [list(o.token_ids) for o in e.transcribe([torch.from_numpy(c) for c in clips], OPTS)]


@pytest.mark.parametrize("mode", ["ffn", "all"])
def test_fp8_engine_tokens_agree_with_fp32(demo_dir, clips, demo_fp32, mode):
    """The demo model (hand-set, trained-like margins) through the emulated fp8 engine: >= 99.5 %
    of fp32's tokens (45/45 when written)."""
    e = SenseVoiceEngine.from_model_dir_fast(demo_dir, "cpu", "float32", compile=False)
    assert e.use_fp8(mode) == fp8.layers_of(mode) == e.fp8_layers
    assert all(getattr(w, fp8.LAYERS[n][1]) is not None for w, _ in e.core.blocks for n in e.fp8_layers)
    got = [list(o.token_ids) for o in e.transcribe([torch.from_numpy(c) for c in clips], OPTS)]
    same, total = matched(demo_fp32, got)
    assert total > 20 and same >= 0.995 * total, (same, total)


def test_fp8_engine_on_random_weights_is_close_but_not_exact(tiny_dir, clips):
    """The tiny random model's near-tie logits flip under e4m3 rounding (214/224 tokens for ffn
    when written): a broken quantisation (scales transposed, wrong axis) lands far below."""
    waves = [torch.from_numpy(c) for c in clips]
    ref = [list(o.token_ids) for o in SenseVoiceEngine.from_model_dir_fast(
        tiny_dir, "cpu", "float32", compile=False).transcribe(waves, OPTS)]
    e = SenseVoiceEngine.from_model_dir_fast(tiny_dir, "cpu", "float32", compile=False)
    e.use_fp8("ffn")
    same, total = matched(ref, [list(o.token_ids) for o in e.transcribe(waves, OPTS)])
    assert 0.85 * total <= same, (same, total)


def test_off_changes_nothing_and_the_eager_reference_is_refused(tiny_dir, tiny_am):
    e = SenseVoiceEngine.from_model_dir_fast(tiny_dir, "cpu", "float32", compile=False)
    blocks = list(e.core.blocks)
    assert e.use_fp8("off") == () and e.fp8_layers == ()
    assert all(a is b for a, b in zip(e.core.blocks, blocks))
    eager = SenseVoiceEngine.from_automodel(tiny_am, "cpu", "float32")
    with pytest.raises(ValueError, match="fused encoder"):
        eager.use_fp8("ffn")


# ---------------------------------------------------------------- on a GPU
@pytest.mark.requires_cuda
def test_scaled_mm_equals_the_emulation():
    """torch._scaled_mm (row-wise scales, bf16 out) vs the fp32 emulation of the same operands:
    equal up to the bf16 output's rounding, on the encoder's shapes and an odd token count."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no fp8 matrix units")
    g = torch.Generator(device="cuda").manual_seed(0)
    for m, k, n in [(171 * 3, 512, 2048), (176, 2048, 512), (1, 560, 1536), (64 * 176, 512, 1536)]:
        x = torch.randn(m, k, device="cuda", generator=g, dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", generator=g) / k ** 0.5
        wq, ws = fp8.quantise_weight(w)
        xq, xs = fp8.quantise_rows(x)
        got = fp8.scaled_mm(xq, xs, wq, ws).float()
        want = fp8.emulated_mm(xq, xs, wq, ws)
        assert float((got - want).abs().max() / want.abs().max()) < 2 ** -7, (m, k, n)


@pytest.mark.requires_cuda
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_compiled_fp8_engine_on_the_gpu_agrees_with_fp32(demo_dir, clips, dtype, tmp_path):
    """The engine the service builds with fp8_gemm=all (compiled, graphs captured) vs fp32, and
    its compiled kernels vs the uncompiled fp8 functions (the emulation's arithmetic on _scaled_mm)."""
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("no fp8 matrix units")
    waves = [torch.from_numpy(c) for c in clips]
    ref = [list(o.token_ids) for o in SenseVoiceEngine.from_model_dir_fast(
        demo_dir, "cuda", "float32", compile=False).transcribe(waves, OPTS)]
    e = SenseVoiceEngine.from_model_dir_fast(demo_dir, "cuda", dtype, fp32_residual=True, cache_dir=tmp_path)
    e.use_fp8("all")
    uncompiled = [list(o.token_ids) for o in e.transcribe(waves, OPTS)]
    e.plan_graphs([1, 8], max_seconds=10.0)
    while e.idle_step():
        time.sleep(0.01)
    assert e.core.compiled.ready and e._graphs
    got = [list(o.token_ids) for o in e.transcribe(waves, OPTS)]
    same, total = matched(ref, got)
    assert total > 20 and same >= 0.995 * total, (same, total)
    assert matched(uncompiled, got)[0] >= 0.995 * total
    with pytest.raises(RuntimeError, match="before"):
        e.use_fp8("ffn")
