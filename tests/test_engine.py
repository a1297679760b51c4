"""The project's guarantee: the batched engine gives funasr's tokens (fp32), batch-mates don't matter."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import torch

from pipeline.audio.decode import decode_audio
from pipeline.model.engine import N_QUERIES, SenseVoiceEngine, gather_rows
from pipeline.model.loading import reference_generate
from pipeline.domain.types import TranscribeOptions
from tests.test_reliability import FakeEngine, run_worker

OPTS = [
    TranscribeOptions("auto", True),
    TranscribeOptions("en", False),
    TranscribeOptions("zh", True),
    TranscribeOptions("ja", False, ban_emo_unk=True),
    TranscribeOptions("nospeech", True),
]


@pytest.fixture(scope="module")
def clips(clip_factory):
    """Real speech at 16 kHz, cut to different lengths, plus noise."""
    speech = decode_audio(clip_factory("wav", 16000, 1).read_bytes()).samples
    rng = np.random.default_rng(0)
    out = [speech, speech[: len(speech) // 2], speech[: 16000 + 321], np.concatenate([speech, speech])]
    out.append((0.05 * rng.standard_normal(27_777)).astype(np.float32))
    return [np.ascontiguousarray(c, dtype=np.float32) for c in out]


def funasr_ids(am, wave: np.ndarray, opt: TranscribeOptions) -> list[int]:
    """funasr's own model on its own frontend's features, one clip: the reference token ids."""
    m = am.model
    fe = am.kwargs["frontend"]
    feats, lens = fe(torch.from_numpy(wave)[None], torch.tensor([len(wave)]))
    q = m.embed(torch.tensor([[m.lid_dict[opt.language], 1, 2,
                               m.textnorm_dict["withitn" if opt.use_itn else "woitn"]]]))
    x = torch.cat([q, feats], 1)
    with torch.inference_mode():
        enc, enc_lens = m.encoder(x.clone(), lens + N_QUERIES)
        logp = m.ctc.log_softmax(enc)
        if opt.ban_emo_unk:
            logp[:, :, m.emo_dict["unk"]] = -float("inf")
    y = torch.unique_consecutive(logp[0, : int(enc_lens[0])].argmax(-1))
    return y[y != 0].tolist()


@pytest.fixture(scope="module")
def tiny_engine(tiny_am):
    return SenseVoiceEngine.from_automodel(tiny_am, "cpu", "float32")


@pytest.fixture(scope="module")
def demo_engine(demo_am):
    return SenseVoiceEngine.from_automodel(demo_am, "cpu", "float32")


def test_mixed_batch_same_tokens_as_funasr_model(tiny_am, tiny_engine, clips):
    """One padded batch mixing lengths, languages, itn and ban_emo_unk == funasr item by item."""
    waves = [torch.from_numpy(c) for c in clips]
    outs = tiny_engine.transcribe(waves, OPTS)
    for wave, opt, out in zip(clips, OPTS, outs):
        ref = funasr_ids(tiny_am, wave, opt)
        agree = _agreement(list(out.token_ids), ref)
        assert agree >= 0.99, (opt, agree, out.token_ids[:20], ref[:20])


def test_single_clip_tokens_identical(tiny_am, tiny_engine, clips):
    for opt in OPTS[:3]:
        out = tiny_engine.transcribe([torch.from_numpy(clips[0])], [opt])[0]
        assert list(out.token_ids) == funasr_ids(tiny_am, clips[0], opt)


def test_demo_model_text_identical_to_automodel_generate(demo_am, demo_engine, clips):
    """End to end from the same 16 kHz waveform: identical text to AutoModel.generate."""
    for opt in OPTS[:3]:
        ref = reference_generate(demo_am, clips[:4], opt)
        mine = [o.raw_text for o in demo_engine.transcribe([torch.from_numpy(c) for c in clips[:4]],
                                                           [opt] * 4)]
        assert mine == ref
    assert "<|NEUTRAL|><|Speech|>" in mine[0] and "speech" in mine[0]


def test_random_model_agrees_with_automodel_generate(tiny_am, tiny_engine, clips):
    """Random weights: >= 99 % token agreement end to end (near-ties may flip on tiny feature diffs)."""
    opt = TranscribeOptions("auto", True)
    ref = reference_generate(tiny_am, clips, opt)
    mine = tiny_engine.transcribe([torch.from_numpy(c) for c in clips], [opt] * len(clips))
    units = lambda t: re.findall(r"<\|[^|]*\|>|\S+", t)  # noqa: E731 (tags and words)
    agree = [_agreement(units(m.raw_text), units(r)) for r, m in zip(ref, mine)]
    assert min(agree) >= 0.99, agree


def test_result_independent_of_batch_mates(tiny_engine, clips):
    """A clip alone and inside a busy padded batch give the same tokens (fp32)."""
    target = torch.from_numpy(clips[2])
    alone = tiny_engine.transcribe([target], [OPTS[1]])[0]
    others = [torch.from_numpy(c) for c in clips] * 3
    busy = tiny_engine.transcribe(others + [target], OPTS * 3 + [OPTS[1]])[-1]
    assert busy.token_ids == alone.token_ids


def _agreement(a: list[int], b: list[int]) -> float:
    """Fraction of positions equal after aligning by edit distance (1.0 when identical)."""
    if a == b:
        return 1.0
    n, m = len(a), len(b)
    d = np.zeros((n + 1, m + 1), dtype=np.int32)
    d[:, 0] = np.arange(n + 1)
    d[0, :] = np.arange(m + 1)
    for i in range(1, n + 1):
        for j in range(1, m + 1):
            d[i, j] = min(d[i - 1, j] + 1, d[i, j - 1] + 1, d[i - 1, j - 1] + (a[i - 1] != b[j - 1]))
    return 1.0 - d[n, m] / max(n, m, 1)


@pytest.mark.requires_cuda
def test_cuda_graphs_and_fp16_match_fp32(tiny_am, clips):
    """On a GPU: captured graphs == eager, and fp16 (fp32 residual) tokens ~ fp32 tokens."""
    e32 = SenseVoiceEngine.from_automodel(tiny_am, "cuda", "float32")
    e16 = SenseVoiceEngine.from_automodel(tiny_am, "cuda", "float16", fp32_residual=True)
    e16.capture_graphs([1, 8], max_seconds=10.0)
    waves = [torch.from_numpy(c) for c in clips[:4]]
    with torch.inference_mode():
        f, _, frames = e16.features(waves)
        x, lens, ban = e16.encoder_inputs(f, frames, OPTS[:4])
        assert torch.equal(e16.forward_ids(x, lens, ban), e16.core(x, lens, ban))
    a = e32.transcribe(waves, OPTS[:4])
    b = e16.transcribe(waves, OPTS[:4])
    agree = [_agreement(list(x.token_ids), list(y.token_ids)) for x, y in zip(a, b)]
    assert min(agree) >= 0.95, agree


def test_word_timestamps_follow_the_ctc_runs(demo_engine, clips):
    """Asked-for word times: one per emitted word, ordered, non-overlapping, inside the clip;
    not computed when not asked."""
    wave = clips[0]
    asked = demo_engine.transcribe([torch.from_numpy(wave)],
                                   [TranscribeOptions("en", True, word_timestamps=True)])[0]
    plain = demo_engine.transcribe([torch.from_numpy(wave)], [TranscribeOptions("en", True)])[0]
    assert plain.words == () and asked.token_ids == plain.token_ids
    words = asked.words
    assert [w.text for w in words] == asked.raw_text.split(">")[-1].split()
    assert all(0 <= w.start < w.end <= len(wave) / 16000 for w in words)
    assert all(a.end <= b.start for a, b in zip(words, words[1:]))


# ---------------------------------------------------------------- the fused encoder (the GPU default)
def _inputs(engine, clips, opts):
    f, _, frames = engine.features([torch.from_numpy(c) for c in clips])
    return engine.encoder_inputs(f, frames, opts)


def _eager_and_fused(engine, clips):
    """(eager reference logits, fused logits, fused ids) of one mixed batch, fused uncompiled."""
    from pipeline.model.fused import CompiledBlocks

    core = engine.core
    with torch.inference_mode():
        x, lens, ban = _inputs(engine, clips, OPTS)
        ref = core.forward_eager(x, lens, ban, return_logits=True)
        core.compiled = CompiledBlocks(compile=False)
        try:
            return ref, core(x, lens, ban, return_logits=True), core(x, lens, ban)
        finally:
            core.compiled = None


def test_fused_block_arithmetic_matches_the_eager_reference(tiny_engine, clips):
    """pipeline/model/fused.py, uncompiled, fp32: the same logits as the eager blocks (to float
    rounding: the FSMN conv becomes a sum of shifted taps) and the same argmax, mixed batch."""
    ref, got, ids = _eager_and_fused(tiny_engine, clips)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)  # -inf (a banned tag) equals -inf
    assert torch.equal(ids, ref.argmax(-1))


def test_fused_block_notices_a_wrong_fsmn(tiny_engine, clips, monkeypatch):
    """The check above can fail: a 1 % error in the FSMN memory moves the logits well past it."""
    from pipeline.model import kernels

    right = kernels.fsmn_memory_reference
    monkeypatch.setattr(kernels, "fsmn_memory_reference",
                        lambda v, mask, taps, left: right(v, mask, taps, left) * 1.01)
    ref, got, _ = _eager_and_fused(tiny_engine, clips)
    finite = ref.isfinite()
    assert (got - ref)[finite].abs().max().item() > 1e-3


def test_compiled_fused_engine_gives_funasr_tokens(tiny_am, clips, tmp_path):
    """The GPU default, compiled by TorchInductor (here its CPU backend): compiled in the
    background by idle_step (as the worker does), then a mixed batch and a single clip give
    funasr's own token ids (fp32); a new shape does not compile again."""
    engine = SenseVoiceEngine(tiny_am.model, tiny_am.kwargs["tokenizer"],
                              SenseVoiceEngine.from_automodel(tiny_am, "cpu").frontend, "cpu",
                              "float32", fused=True, cache_dir=tmp_path)
    assert engine.has_idle_work and not engine.core.fused
    deadline = time.monotonic() + 600
    while engine.idle_step():
        assert time.monotonic() < deadline and engine.compile_error is None
        time.sleep(0.2)
    assert engine.compile_error is None and engine.core.fused and not engine.has_idle_work
    outs = engine.transcribe([torch.from_numpy(c) for c in clips], OPTS)
    for wave, opt, out in zip(clips, OPTS, outs):
        assert list(out.token_ids) == funasr_ids(tiny_am, wave, opt), opt
    single = engine.transcribe([torch.from_numpy(clips[2])], [OPTS[1]])[0]
    assert list(single.token_ids) == funasr_ids(tiny_am, clips[2], OPTS[1])
    with engine.compiled.no_recompile():  # batch and frames are dynamic: a new shape reuses it
        engine.transcribe([torch.from_numpy(c[:20_000]) for c in clips[:3]], OPTS[:3])


def test_fsmn_triton_kernel_equals_the_reference():
    """The CUDA kernel of the FSMN memory, run by Triton's interpreter on the CPU: equal to the
    PyTorch arithmetic for strided values (a slice of the fused q|k|v), padded rows, odd sizes."""
    pytest.importorskip("triton")
    import subprocess
    import sys

    code = """
import torch
from pipeline.model.kernels import fsmn_memory_reference, fsmn_memory_triton
g = torch.Generator().manual_seed(0)
for b, t, d, k, left in ((3, 37, 160, 11, 5), (2, 5, 512, 11, 5), (1, 20, 96, 7, 2)):
    qkv = torch.randn(b, t, 3 * d, generator=g)
    v = qkv[:, :, 2 * d:]
    lens = torch.tensor([t] + [max(1, t - 7 * i) for i in range(1, b)])
    mask = (torch.arange(t)[None] < lens[:, None]).float()
    taps = torch.randn(d, k, generator=g)
    err = (fsmn_memory_reference(v, mask, taps, left) - fsmn_memory_triton(v, mask, taps, left)).abs().max()
    assert err < 1e-5, (b, t, d, k, left, float(err))
print("ok")
"""
    import os

    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_engine_loaded_without_funasr_equals_the_funasr_one(tiny_am, tiny_dir, tiny_engine, clips):
    """pipeline/model/fast_load.py reads the directory itself (funasr's import is most of a GPU
    server's start-up): the same logits as the engine built through funasr (fused arithmetic,
    fp32) and funasr's own token ids, for a mixed batch."""
    fast = SenseVoiceEngine.from_model_dir_fast(tiny_dir, "cpu", "float32", compile=False)
    assert fast is not None and fast.model is None
    with torch.inference_mode():
        x, lens, ban = _inputs(tiny_engine, clips, OPTS)
        fx, flens, fban = _inputs(fast, clips, OPTS)
        assert torch.equal(fx, x) and torch.equal(flens, lens) and torch.equal(fban, ban)
        got = fast.core(fx, flens, fban, return_logits=True)
    _, ref, _ = _eager_and_fused(tiny_engine, clips)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    outs = fast.transcribe([torch.from_numpy(c) for c in clips], OPTS)
    for wave, opt, out in zip(clips, OPTS, outs):
        assert list(out.token_ids) == funasr_ids(tiny_am, wave, opt), opt
        assert out.raw_text == tiny_engine.tokenizer.decode(list(out.token_ids))


def test_fast_loader_declines_what_it_does_not_know(tiny_dir, tmp_path):
    """Another model or encoder in config.yaml: None (the caller loads through funasr); weights
    that do not match the config: a clear ModelUnavailable."""
    import shutil

    from pipeline.domain.errors import ModelUnavailable

    other = tmp_path / "other"
    shutil.copytree(tiny_dir, other)
    cfg = (other / "config.yaml").read_text()
    (other / "config.yaml").write_text(cfg.replace("encoder: SenseVoiceEncoderSmall", "encoder: Conformer"))
    assert SenseVoiceEngine.from_model_dir_fast(other, "cpu", compile=False) is None
    (other / "config.yaml").write_text(cfg.replace("num_blocks: 2", "num_blocks: 3"))
    with pytest.raises(ModelUnavailable, match="not the weights config.yaml describes"):
        SenseVoiceEngine.from_model_dir_fast(other, "cpu", compile=False)


@pytest.mark.requires_cuda
def test_fast_loaded_fused_engine_on_the_gpu(tiny_am, tiny_dir, clips, tmp_path):
    """On a GPU: the engine the service builds there (no funasr import, compiled fused blocks,
    graphs) gives funasr's own tokens in fp32."""
    fast = SenseVoiceEngine.from_model_dir_fast(tiny_dir, "cuda", "float32", cache_dir=tmp_path)
    fast.plan_graphs([1, 8], max_seconds=10.0)
    while fast.idle_step():
        time.sleep(0.01)
    assert fast.core.compiled.ready and fast._graphs
    outs = fast.transcribe([torch.from_numpy(c) for c in clips], OPTS)
    for wave, opt, out in zip(clips, OPTS, outs):
        assert list(out.token_ids) == funasr_ids(tiny_am, wave, opt), opt


def test_gather_rows_pads_each_wave_with_zeros():
    """The batch's one host copy: each 16-bit wave in its row, the rest of the row zero (a reused
    buffer's old samples never leak into a shorter wave's padding)."""
    waves = [torch.arange(1, 6, dtype=torch.int16), torch.tensor([7, 8], dtype=torch.int16)]
    out = torch.full((2, 5), 99, dtype=torch.int16)
    assert gather_rows(waves, out) is out
    assert out.tolist() == [[1, 2, 3, 4, 5], [7, 8, 0, 0, 0]]


def _pcm16(clip: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.clip(np.rint(clip * 32768), -32768, 32767).astype(np.int16))


def test_16_bit_waves_give_the_tokens_of_their_float_samples(tiny_engine, clips):
    """The distributed worker's waves (16-bit samples k, scaled to k / 32768 by the engine) give
    the tokens of the float waves k / 32768 (CPU: one padded batch)."""
    pcm = [_pcm16(c) for c in clips]
    floats = [w.float() / 32768 for w in pcm]
    a = tiny_engine.transcribe(pcm, OPTS[:len(pcm)])
    b = tiny_engine.transcribe(floats, OPTS[:len(pcm)])
    assert [x.token_ids for x in a] == [y.token_ids for y in b]


@pytest.mark.requires_cuda
def test_16_bit_waves_on_the_gpu_go_through_pinned_rows(tiny_am, clips):
    """On a GPU, 16-bit host waves are gathered into pinned rows and moved in one copy: the same
    tokens as the float waves, batch after batch (a reused pinned block holds no old samples)."""
    e = SenseVoiceEngine.from_automodel(tiny_am, "cuda", "float32")
    pcm = [_pcm16(c) for c in clips]
    floats = [w.float() / 32768 for w in pcm]
    want = [x.token_ids for x in e.transcribe(floats, OPTS[:len(pcm)])]
    for _ in range(3):
        assert [x.token_ids for x in e.transcribe(pcm, OPTS[:len(pcm)])] == want
        assert [x.token_ids for x in e.transcribe(pcm[1:], OPTS[1:len(pcm)])] == want[1:]


@pytest.mark.requires_cuda
def test_a_batch_of_host_and_gpu_waves_is_padded_on_the_gpu(tiny_am, clips):
    """The embedded server's batches mix WAV uploads' 16-bit host samples (spooled, mapped),
    decoded uploads' float waves on the GPU and live re-decodes' host floats: the padded batch is
    the all-host batch's, value for value, and the tokens are the float waves'."""
    e = SenseVoiceEngine.from_automodel(tiny_am, "cuda", "float32")
    pcm = [_pcm16(c) for c in clips]
    floats = [w.float() / 32768 for w in pcm]
    mixed = [w if k % 3 == 0 else floats[k].cuda() if k % 3 == 1 else floats[k] for k, w in enumerate(pcm)]
    want = e._padded(floats)
    got = e._padded(mixed)
    assert got.device.type == "cuda" and torch.equal(got, want)
    assert [x.token_ids for x in e.transcribe(mixed, OPTS[:len(pcm)])] == \
        [x.token_ids for x in e.transcribe(floats, OPTS[:len(pcm)])]


def test_close_waits_for_a_compile_in_progress_and_starts_no_more(tiny_am, tmp_path, monkeypatch):
    """Issue 42: the batch CLI exited while the background compile still ran (torch.compile's
    threads at the interpreter's exit: status 134 / 139 on the H200 after writing every output).
    The pool closes its engines once the workers stopped: close() returns only after the compile
    thread ended, and no background work starts after it."""
    import threading

    engine = SenseVoiceEngine(tiny_am.model, tiny_am.kwargs["tokenizer"],
                              SenseVoiceEngine.from_automodel(tiny_am, "cpu").frontend, "cpu",
                              "float32", fused=True, cache_dir=tmp_path)
    started, ended = threading.Event(), threading.Event()

    def slow_compile():  # stands in for torch.compile: seconds in a thread of its own
        started.set()
        time.sleep(1.0)
        ended.set()

    monkeypatch.setattr(engine, "_compile_in_background", slow_compile)
    assert engine.has_idle_work and engine.idle_step()
    assert started.wait(30)
    engine.close()
    assert ended.is_set()  # waited for it
    monkeypatch.setattr(engine, "_compile_thread", None)  # as if none had started yet
    assert engine.idle_step() is False and engine._compile_thread is None  # closed: none starts


def test_the_background_compile_thread_runs_with_its_starters_torch_thread_count():
    """torch.compile's guards compare the intra-op thread count: the compile thread must have
    the worker's, even after another thread (a live stream's VAD, one thread) changed the
    default that new threads start from -- a plain thread started then gets 1."""
    import threading

    from pipeline.model.engine import start_with_torch_threads

    before, seen = torch.get_num_threads(), {}

    def run(target):
        t = threading.Thread(target=target)
        t.start()
        t.join()

    def vad_like():
        torch.get_num_threads()
        torch.set_num_threads(1)

    def owner():  # the worker: 2 threads, then starts the compile
        torch.get_num_threads()
        torch.set_num_threads(2)
        start_with_torch_threads(lambda: seen.setdefault("compile", torch.get_num_threads()), "c").join()

    try:
        run(vad_like)
        run(lambda: seen.setdefault("plain", torch.get_num_threads()))  # the hazard
        run(owner)
    finally:
        torch.set_num_threads(before)  # the default for later threads, as it was
    assert seen == {"compile": 2, "plain": 1}


@pytest.mark.requires_cuda
def test_float_host_waves_on_the_gpu_go_through_pinned_rows(tiny_am, clips):
    """Live re-decodes' float waves on the host are gathered into pinned rows too: the tokens of
    the same waves padded on the device, batch after batch."""
    e = SenseVoiceEngine.from_automodel(tiny_am, "cuda", "float32")
    host = [torch.from_numpy(c).float() for c in clips]
    want = [x.token_ids for x in e.transcribe([w.cuda() for w in host], OPTS[:len(host)])]
    for _ in range(3):
        assert [x.token_ids for x in e.transcribe(host, OPTS[:len(host)])] == want
        assert [x.token_ids for x in e.transcribe(host[1:], OPTS[1:len(host)])] == want[1:]


@pytest.mark.requires_cuda
def test_a_bucket_not_captured_yet_runs_from_a_larger_captured_graph(tiny_am, clips):
    """Until its own bucket is captured, a batch runs from the smallest captured graph that holds
    it within COVER_WASTE (more rows and frames, ignored): the eager path's ids exactly."""
    from pipeline.model.engine import LENGTH_BUCKET

    e = SenseVoiceEngine.from_automodel(tiny_am, "cuda", "float32")
    e.plan_graphs([1, 2, 4, 16], max_seconds=10.0, prefill_batch=0)
    waves = [torch.from_numpy(c).float() for c in clips[:2]]
    with torch.inference_mode():
        f, _, frames = e.features(waves)
        x, lens, ban = e.encoder_inputs(f, frames, OPTS[:2])
        t = -(-x.shape[1] // LENGTH_BUCKET) * LENGTH_BUCKET
        assert e._pick_graph(2, x.shape[1]) is None  # nothing captured: wanted, eager meanwhile
        e._capture(4, t + LENGTH_BUCKET)  # 4 x (t + 16): within 4x of the 2 x t bucket
        graph = e._pick_graph(2, x.shape[1])
        assert graph is e._graphs[(4, t + LENGTH_BUCKET)] and (2, t) in e._wanted
        assert torch.equal(e.forward_ids(x, lens, ban), e.core(x, lens, ban))
        e._graphs.clear()
        e._capture(16, t)  # 8x the bucket: too wasteful, eager instead
        assert (16, t) in e._graphs and e._pick_graph(2, x.shape[1]) is None


def test_a_bucket_run_uncaptured_often_is_wanted_hot_and_captured_then(tiny_engine, monkeypatch):
    """Under a steady load the worker is seldom idle: a bucket that ran uncaptured (and not
    held by a larger graph) HOT_MISSES times makes the engine ask for a capture between
    batches, of that bucket; a bucket a captured graph holds does not count."""
    from pipeline.model import engine as engine_mod

    e = tiny_engine
    captured = []
    monkeypatch.setattr(e, "_graph_batches", [1, 8, 64])
    monkeypatch.setattr(e, "_graph_max_frames", 4 * engine_mod.LENGTH_BUCKET)
    monkeypatch.setattr(e, "_graphs", {})
    monkeypatch.setattr(e, "_wanted", [])
    monkeypatch.setattr(e, "_misses", {})
    monkeypatch.setattr(e, "_capture", lambda b, t: captured.append((b, t)) or e._graphs.update({(b, t): "g"}))
    for _ in range(engine_mod.HOT_MISSES - 1):
        assert e._pick_graph(40, 20) is None  # bucket (64, 32): wanted, run op by op
    assert not e.has_hot_work
    e._pick_graph(3, 10)  # (8, 16): one miss
    e._pick_graph(40, 20)
    assert e.has_hot_work
    e.capture_hot()
    assert captured == [(64, 32)] and not e.has_hot_work and (64, 32) not in e._wanted
    assert e._pick_graph(40, 20) == "g"
    for _ in range(engine_mod.HOT_MISSES):  # (8, 16): the 64 x 32 graph is 16x it, too big
        assert e._pick_graph(3, 10) is None
    assert e.has_hot_work
    e._misses.clear()
    e._graphs[(8, 32)] = "g8"  # a graph within 4x holds it: its runs are captured ones
    for _ in range(2 * engine_mod.HOT_MISSES):
        assert e._pick_graph(3, 10) == "g8"
    assert not e.has_hot_work


class HotEngine(FakeEngine):
    """A double with one hot shape from the start: it counts the captures it is asked for."""

    def __init__(self):
        super().__init__()
        self.hot, self.captures = True, 0

    @property
    def has_hot_work(self):
        return self.hot

    def capture_hot(self):
        self.captures += 1
        self.hot = False


def test_the_worker_captures_a_hot_bucket_between_batches(tmp_path):
    """An engine with hot work is asked to capture after a batch even with more queued."""
    engine = HotEngine()
    run_worker(tmp_path, engine, [1000] * 5)
    assert engine.captures == 1


@pytest.mark.requires_cuda
def test_a_hot_bucket_is_captured_between_batches_on_the_gpu(tiny_am, clips):
    from pipeline.model.engine import HOT_MISSES

    e = SenseVoiceEngine.from_automodel(tiny_am, "cuda", "float32")
    e.plan_graphs([1, 2, 4], max_seconds=10.0, prefill_batch=0)
    waves = [torch.from_numpy(c).float() for c in clips[:2]]
    want = [x.token_ids for x in e.transcribe(waves, OPTS[:2])]
    for _ in range(HOT_MISSES - 1):
        assert [x.token_ids for x in e.transcribe(waves, OPTS[:2])] == want
    assert e.has_hot_work and not e._graphs
    e.capture_hot()
    assert len(e._graphs) == 1 and not e.has_hot_work
    assert [x.token_ids for x in e.transcribe(waves, OPTS[:2])] == want


def test_an_engine_is_warm_once_its_planned_graphs_are_tried(tiny_engine, monkeypatch):
    """/readyz's "warm": the graphs planned at start all tried (captured or failed); a bucket
    wanted later under load does not make a warm engine cold again."""
    e = tiny_engine
    assert e.warm  # CPU: nothing planned
    monkeypatch.setattr(e, "_graphs", {})
    monkeypatch.setattr(e, "_misses", {})
    monkeypatch.setattr(e, "_wanted", [(1, 16), (1, 32)])
    monkeypatch.setattr(e, "_settled", False)
    monkeypatch.setattr(e, "_capture", lambda b, t: e._graphs.update({(b, t): "g"}))
    assert not e.warm
    assert e.idle_step() and not e.warm
    assert not e.idle_step() and e.warm
    e._wanted.insert(0, (8, 16))  # a bucket a batch wants later
    assert e.warm
