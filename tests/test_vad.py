"""pipeline.audio.vad on synthetic long audio: espeak-ng phrases, silences and sine chords, placed at
known times."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.audio.vad import MAX_SEGMENT_S, Segmenter, Span
from pipeline.domain.tags import SAMPLE_RATE_HZ
from tests.media import speech_wav

SR = SAMPLE_RATE_HZ
PHRASES = (
    "The quick brown fox jumps over the lazy dog.",
    "Speech recognition on long recordings needs segmentation first.",
    "Please call me back tomorrow morning at nine.",
    "Every span must stay under thirty seconds for the encoder.",
)
TOLERANCE_S = 0.3  # s, span edge vs the known speech edge (speech_pad_ms is 100 ms of it)
NOISE = 0.002  # amplitude of the background noise under everything
ROOT = Path(__file__).resolve().parent.parent


# -- media ------------------------------------------------------------------------------------


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path), "rb") as w:
        assert w.getframerate() == SR and w.getnchannels() == 1
        return np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32) / 32768


def trim(x: np.ndarray) -> np.ndarray:
    """Drop espeak's leading/trailing near-silence so the phrase's true edges are known."""
    loud = np.flatnonzero(np.abs(x) > 0.02 * np.abs(x).max())
    return x[loud[0] : loud[-1] + 1]


def chord(seconds: float, root: float = 220.0) -> np.ndarray:
    """A music-like major triad with two harmonics per note and 50 ms fades."""
    t = np.arange(int(seconds * SR)) / SR
    notes = (root, root * 1.26, root * 1.5)
    y = sum(0.6**h * np.sin(2 * np.pi * f * (h + 1) * t) for f in notes for h in range(3))
    fade = np.minimum(1.0, np.minimum(t / 0.05, (seconds - t) / 0.05))
    return (0.3 * y / np.abs(y).max() * fade).astype(np.float32)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * SR), dtype=np.float32)


def assemble(parts: list[tuple[str, np.ndarray]], seed: int = 0) -> tuple[np.ndarray, list]:
    """Concatenate ``(kind, samples)`` parts plus faint noise; return the wave and the
    ``(start, end)`` seconds of every "speech" part."""
    speech, pos = [], 0
    for kind, x in parts:
        if kind == "speech":
            speech.append((pos / SR, (pos + len(x)) / SR))
        pos += len(x)
    wave_ = np.concatenate([x for _, x in parts])
    wave_ += np.random.default_rng(seed).normal(0, NOISE, len(wave_)).astype(np.float32)
    return wave_, speech


@pytest.fixture(scope="module")
def phrases(media_dir: Path) -> list[np.ndarray]:
    return [
        trim(read_wav(speech_wav(media_dir / f"vad_phrase_{i}.wav", text=text)))
        for i, text in enumerate(PHRASES)
    ]


@pytest.fixture(scope="module")
def segmenter() -> Segmenter:
    return Segmenter().load()


def check_spans(spans: list[Span], n: int, max_s: float = MAX_SEGMENT_S) -> None:
    """The invariants every split keeps."""
    prev_end = 0
    for s in spans:
        assert isinstance(s, Span) and isinstance(s.start, int) and isinstance(s.end, int)
        assert prev_end <= s.start < s.end <= n
        assert s.end - s.start <= round(max_s * SR)
        prev_end = s.end


# -- tests ------------------------------------------------------------------------------------


def test_spans_match_known_speech_positions(segmenter, phrases):
    p = phrases
    parts = [
        ("gap", silence(1.0)), ("speech", p[0]), ("gap", silence(2.0)),
        ("music", chord(3.0)), ("gap", silence(2.0)), ("speech", p[1]),
        ("gap", silence(2.0)), ("speech", p[2]), ("gap", silence(2.0)),
        ("music", chord(2.0, root=330.0)), ("gap", silence(2.0)), ("speech", p[3]),
        ("gap", silence(1.5)),
    ]  # fmt: skip
    x, speech = assemble(parts)
    spans = segmenter.split(x)
    check_spans(spans, len(x))
    assert len(spans) == len(speech), [(s.start_s, s.end_s) for s in spans]
    for span, (a, b) in zip(spans, speech):
        assert abs(span.start_s - a) <= TOLERANCE_S, (span, a)
        assert abs(span.end_s - b) <= TOLERANCE_S, (span, b)


def test_long_continuous_speech_is_cut_at_quiet_points(segmenter, phrases):
    parts: list[tuple[str, np.ndarray]] = []
    gaps = []  # (start, end) samples of each 0.1 s gap
    pos = 0
    while pos < 70 * SR:
        for x in phrases:
            parts.append(("speech", x))
            pos += len(x)
            parts.append(("gap", silence(0.1)))
            gaps.append((pos, pos + int(0.1 * SR)))
            pos += int(0.1 * SR)
    x, _ = assemble(parts)
    assert len(x) >= 70 * SR
    spans = segmenter.split(x)
    check_spans(spans, len(x))
    assert len(spans) >= 3
    # the speech is covered: nothing is lost between spans except silence
    covered = sum(s.end - s.start for s in spans)
    assert covered >= 0.95 * (len(x) - sum(b - a for a, b in gaps))
    # every cut between touching spans lies in the middle of a pause: the 80 ms around it are
    # at the noise floor (here the 0.1 s gaps between phrases win over pauses between words)
    cuts = [a.end for a, b in itertools.pairwise(spans) if a.end == b.start]
    assert cuts, "expected the 70 s stretch to be cut, not separated by detected silence"
    for cut in cuts:
        around = x[cut - int(0.04 * SR) : cut + int(0.04 * SR)]
        assert np.sqrt(np.mean(around**2)) < 2 * NOISE, cut / SR


@pytest.mark.parametrize(
    "make",
    [
        lambda: np.zeros(0, dtype=np.float32),
        lambda: silence(40.0),
        lambda: np.random.default_rng(3).normal(0, 0.05, 20 * SR).astype(np.float32),
        lambda: np.concatenate([chord(3.0), silence(1.0), chord(3.0, root=262.0), silence(2.0)]),
    ],
    ids=["empty", "digital-silence", "noise", "chords"],
)
def test_no_speech_gives_empty_list(segmenter, make):
    calls = []
    assert segmenter.split(make(), on_progress=calls.append) == []
    assert calls and calls[-1] == 1.0


def test_short_audio_and_input_types(segmenter, phrases):
    x, speech = assemble([("gap", silence(0.5)), ("speech", phrases[0]), ("gap", silence(0.5))])
    spans = segmenter.split(x)
    assert len(spans) == 1 and abs(spans[0].start_s - speech[0][0]) <= TOLERANCE_S
    assert segmenter.split(torch.from_numpy(x)) == spans
    assert segmenter.split(torch.from_numpy(x)[None]) == spans  # (1, n)
    assert segmenter.split(x.astype(np.float64)) == spans
    pcm = np.clip(np.round(x * 32768), -32768, 32767).astype(np.int16)
    assert [(s.start, s.end) for s in segmenter.split(pcm)] == [(s.start, s.end) for s in spans]
    with pytest.raises(ValueError):
        segmenter.split(np.stack([x, x]))  # stereo is the caller's job
    with pytest.raises(TypeError):
        segmenter.split(x.astype(np.int32))
    assert spans[0].start_s == spans[0].start / SR and spans[0].end_s == spans[0].end / SR


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::FutureWarning")
def test_scores_match_silero_reference(segmenter, phrases):
    """One lane (under a minute) gives exactly silero's own window-by-window scores."""
    from silero_vad import load_silero_vad

    x, _ = assemble([("gap", silence(0.7)), ("speech", phrases[1]), ("gap", silence(1.3))])
    x = x[: len(x) - 100]  # a partial last window
    kept = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # tiny ops: 2 threads on 2 busy cores are far slower
        reference = load_silero_vad()
        t = torch.from_numpy(x)
        with torch.inference_mode():
            expected = [
                reference(torch.nn.functional.pad(t[i : i + 512], (0, max(0, i + 512 - len(t)))),
                          SR).item()
                for i in range(0, len(t), 512)
            ]  # fmt: skip
    finally:
        torch.set_num_threads(kept)
    assert np.array_equal(segmenter.speech_probs(x), np.array(expected, dtype=np.float32))


def test_lanes_agree_with_one_pass(segmenter, phrases, monkeypatch):
    """Batched lanes (here 6 or more) find the same spans as one pass, edges within 0.1 s."""
    from pipeline.audio import vad

    rng = np.random.default_rng(5)
    parts = [
        part
        for i in range(70)
        for part in (("speech", phrases[i % 4]), ("gap", silence(rng.uniform(0.2, 2.5))))
    ]
    x, _ = assemble(parts)
    assert len(x) > 6 * vad.MIN_LANE_S * SR
    batched = segmenter.split(x)
    monkeypatch.setattr(vad, "MAX_LANES", 1)
    one_pass = segmenter.split(x)
    assert len(batched) == len(one_pass)
    for a, b in zip(batched, one_pass, strict=True):
        assert abs(a.start - b.start) <= 0.1 * SR and abs(a.end - b.end) <= 0.1 * SR


def test_silero_net_equals_the_torchscript_model():
    """pipeline.audio.silero_net (the GPU path's network) == silero's TorchScript core on the same
    windows and states, step after step."""
    from pipeline.audio.silero_net import SileroNet
    from pipeline.audio.vad import _load_net

    jit = _load_net()
    net = SileroNet(jit)
    gen = torch.Generator().manual_seed(3)
    state = torch.zeros(2, 33, 128)
    mine = state.clone()
    with torch.inference_mode():
        for _ in range(5):
            x = 0.3 * torch.randn(33, 576, generator=gen)
            p, state = jit(x, state)
            q, mine = net(x, mine)
            torch.testing.assert_close(q, p, atol=1e-6, rtol=0)
            torch.testing.assert_close(mine, state, atol=1e-6, rtol=0)


def _speech_with_pauses(phrases, n: int = 70, seed: int = 5) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parts = [
        part
        for i in range(n)
        for part in (("speech", phrases[i % 4]), ("gap", silence(rng.uniform(0.2, 2.5))))
    ]
    return assemble(parts)[0]


def _assert_same_segmentation(seg: Segmenter, x: np.ndarray, probs_a, probs_b) -> None:
    """Speech regions: the same count, every edge within 0.1 s. Spans: the same audio covered
    to within 1 % (a 32 ms edge shift may tip two spans 0.5 s apart over the merge rule)."""
    ra, rb = seg._regions(probs_a, len(x)), seg._regions(probs_b, len(x))
    assert len(ra) == len(rb) > 20
    for (a0, a1), (b0, b1) in zip(ra, rb, strict=True):
        assert abs(a0 - b0) <= 0.1 * SR and abs(a1 - b1) <= 0.1 * SR

    def covered(spans):
        mask = np.zeros(len(x), dtype=bool)
        for sp in spans:
            mask[sp.start:sp.end] = True
        return mask

    ca, cb = covered(seg.spans_from_probs(x, probs_a)), covered(seg.spans_from_probs(x, probs_b))
    assert (ca ^ cb).sum() <= 0.01 * cb.sum()


def test_gpu_lane_layout_agrees_with_cpu_lanes(segmenter, phrases):
    """The GPU path's scoring (many short lanes, scores kept on the device, one transfer), run
    here on the CPU, finds the CPU path's speech on espeak-ng speech with pauses."""
    from pipeline.audio import vad
    from pipeline.audio.silero_net import SileroNet

    x = _speech_with_pauses(phrases)
    lanes, _, _ = vad.lane_plan(len(x) // vad.WINDOW, vad.MAX_LANES_GPU, vad.MIN_LANE_S_GPU)
    assert lanes >= 30  # far more lanes, so far more lane starts, than the CPU path's
    net = SileroNet(vad._load_net())
    probs = vad._score_on_device(net, torch.from_numpy(x), None)
    _assert_same_segmentation(segmenter, x, probs, segmenter.speech_probs(x))


@pytest.mark.requires_cuda
def test_gpu_segmentation_agrees_with_cpu(segmenter, phrases):
    """On a GPU: Segmenter(device="cuda") finds the CPU segmenter's speech."""
    x = _speech_with_pauses(phrases)
    gpu = Segmenter(device="cuda").load()
    try:
        _assert_same_segmentation(segmenter, x, gpu.speech_probs(x), segmenter.speech_probs(x))
        assert gpu.split(x)  # the whole path, wave on the device and back
    finally:
        gpu.close()


def test_progress_increases_and_ends_at_one(segmenter, phrases):
    x, _ = assemble([("speech", p) for p in phrases * 10] + [("gap", silence(5.0))])
    calls: list[float] = []
    segmenter.split(x, on_progress=calls.append)
    assert len(calls) >= 10
    assert all(0.0 <= f <= 1.0 for f in calls)
    assert all(a < b for a, b in itertools.pairwise(calls))
    assert calls[-1] == 1.0


def test_progress_callback_can_cancel(segmenter, phrases):
    class Cancelled(Exception):
        pass

    def stop(f):
        if f > 0.3:
            raise Cancelled

    x, _ = assemble([("speech", p) for p in phrases * 10])
    with pytest.raises(Cancelled):
        segmenter.split(x, on_progress=stop)


def test_limits_are_options(phrases):
    x, _ = assemble([("speech", p) for p in phrases * 6])
    spans = Segmenter(max_segment_s=8.0).split(x)
    check_spans(spans, len(x), max_s=8.0)
    assert len(spans) >= len(x) / SR / 8.0
    with pytest.raises(ValueError):
        Segmenter(max_segment_s=0.5)
    with pytest.raises(ValueError):
        Segmenter(threshold=1.5)


def test_concurrent_calls_match_serial(segmenter, phrases):
    waves = [assemble([("speech", p), ("gap", silence(1.0))] * 8, seed=i)[0] for i, p in
             enumerate(phrases)]  # fmt: skip
    serial = [segmenter.split(w) for w in waves]
    results: dict[int, list[Span]] = {}

    def run(i: int) -> None:
        results[i] = segmenter.split(waves[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(waves))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i] for i in range(len(waves))] == serial


def test_loading_keeps_torch_thread_count():
    """``import silero_vad`` sets 1 thread process-wide, and the scoring thread sets 1 for itself;
    in a fresh interpreter neither the caller's count nor a new thread's default changes, and the
    scoring thread keeps its 1 (torch would otherwise reset it lazily to the default)."""
    code = (
        "import threading, torch; torch.set_num_threads(3)\n"
        "from pipeline.audio.vad import Segmenter\n"
        "import numpy as np\n"
        "seg = Segmenter()\n"
        "seg.split(np.zeros(16000, dtype=np.float32))\n"
        "seen = []\n"
        "t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))\n"
        "t.start(); t.join()\n"
        "scorer = seg._scorer().submit(torch.get_num_threads).result()\n"
        "print(torch.get_num_threads(), seen[0], scorer)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
        timeout=120, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["3", "3", "1"]  # caller, a new thread, the scoring thread


# -- one hour ---------------------------------------------------------------------------------


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# One float32 copy of an hour at 16 kHz is 3600 * 16000 * 4 B = 230 MB. The segmenter keeps one
# float32 score per 512-sample window (450 KB per hour, plus a transient list of Python floats
# for silero's post-processing, about 4 MB), gathers 64 x 576 samples per model call and reads
# at most 12 s of audio at a time for a cut. Allowing 64 MB (a quarter of one copy of the wave)
# leaves room for torch's allocator and JIT warm-up, and fails if the wave is ever copied.
RSS_GROWTH_LIMIT = 64 * 2**20  # bytes
# 4-15 s measured on this machine's 2 shared cores (one window per call instead of 64 lanes:
# about 40 s). The limit is loose because the cores are shared: it catches gross regressions
# (a Python loop per sample, a quadratic step), not a slow neighbour.
HOUR_TIME_LIMIT_S = 120.0  # s


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
def test_one_hour_bounded_memory_and_time(segmenter, phrases):
    block, speech = assemble(
        [part for p in phrases for part in (("speech", p), ("gap", silence(2.0)))]
        + [("music", chord(3.0)), ("gap", silence(2.0))]
    )  # about 25 s; tiled to one hour
    reps = int(np.ceil(3600 * SR / len(block)))
    hour = np.tile(block, reps)[: 3600 * SR]
    assert hour.dtype == np.float32 and hour.flags.c_contiguous

    peak = baseline = _rss_bytes()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.wait(0.005):
            peak = max(peak, _rss_bytes())

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    t0 = time.perf_counter()
    try:
        spans = segmenter.split(hour)
    finally:
        elapsed = time.perf_counter() - t0
        done.set()
        sampler.join()
    peak = max(peak, _rss_bytes())
    growth = peak - baseline
    mb = growth / 2**20
    print(f"\n1 h VAD: {elapsed:.1f} s, {len(spans)} spans, peak RSS growth {mb:.1f} MB")

    check_spans(spans, len(hour))
    # every phrase of every whole tile is found (phrases 2 s apart merge only across tiles: never)
    whole_tiles = len(hour) // len(block)
    assert len(spans) >= whole_tiles * len(speech)
    assert len(spans) <= reps * len(speech)
    assert growth < RSS_GROWTH_LIMIT
    assert elapsed < HOUR_TIME_LIMIT_S


@pytest.mark.requires_cuda
def test_live_scorer_on_the_gpu_equals_the_cpu_one(phrases):
    """Live captions' speech detection on a GPU (states kept there, one transfer a round) gives
    the CPU scorer's probabilities, stream by stream, frame after frame."""
    from pipeline.audio.stream_vad import StreamAudio, StreamScorer

    x = _speech_with_pauses(phrases, n=6)
    pcm = (np.clip(x, -1, 1) * 32767).astype("<i2").tobytes()
    frame = 3200  # 100 ms of 16 kHz 16-bit audio
    results = {}
    for device in ("cpu", "cuda"):
        scorer = StreamScorer(device=device)
        streams = [StreamAudio(16000) for _ in range(5)]
        probs = [[] for _ in streams]
        for i in range(0, len(pcm), frame):
            futures = [scorer.score(s, pcm[i + 640 * k:i + 640 * k + frame]) for k, s in enumerate(streams)]
            for k, f in enumerate(futures):
                probs[k].append(f.result(timeout=60).probs)
        results[device] = [np.concatenate(p) for p in probs]
    for a, b in zip(results["cpu"], results["cuda"]):
        assert a.shape == b.shape and np.abs(a - b).max() < 1e-4
