"""Split long audio into speech spans of at most ``max_segment_s`` with silero-vad, on CPU, offline.

SenseVoice's encoder attends over the whole input (memory grows with T^2), so long audio is cut
into spans before recognition. Three steps:

1. **Speech probabilities**, one per 512-sample window (32 ms), from the silero-vad model that
   ships inside the ``silero-vad`` pip package (no download). The audio is cut into up to
   :data:`MAX_LANES` contiguous *lanes* run side by side as one batch, each with its own LSTM
   state, so one model call scores up to 64 windows: about 8x faster than one window per call
   (2 ms per call of 64 windows against 0.25 ms per call of one, on 2 cores). Each lane first
   replays :data:`LANE_WARMUP_MS` of the audio before its own part and discards those scores.
   Silero's LSTM remembers for tens of seconds, so scores near a lane start differ a little from
   a single pass over the whole file (as for anyone who runs silero on a file in pieces);
   measured on 6 minutes of speech, span edges moved by at most 0.1 s (3 windows) and the span
   count did not change. With one lane (audio under a minute) the scores equal silero's own
   ``get_speech_timestamps`` loop exactly.

   Memory stays bounded: the wave is read through strided views, never copied; per call only
   ``lanes x 576`` samples are gathered; one float32 score per window is kept (450 KB per hour).

   On a GPU (``Segmenter(device="cuda")``) the same lanes run through silero's network re-stated
   in PyTorch (:mod:`pipeline.audio.silero_net`, bit-identical to the TorchScript model on CPU)
   with up to :data:`MAX_LANES_GPU` lanes of at least :data:`MIN_LANE_S_GPU` each: an hour is
   ~250 steps of 512 windows instead of ~1,800 steps of 64. The wave goes to the device once,
   every score stays there, and one transfer brings them back.

   Scoring runs on one thread owned by the :class:`Segmenter` with one torch intra-op thread:
   the model's ops are too small to gain from more (2 ms per 64-lane step either way on 2 cores),
   and with 2 threads on a busy CPU (another process, the service's other work) OpenMP's barriers
   made steps up to 75x slower here (150 ms) while one thread stayed at 2 ms. Under OpenMP,
   ``torch.set_num_threads`` sets the calling thread's count and the default for threads created
   later, so the caller's count and that default are restored right after the thread starts.
2. **Speech regions** from the scores with silero's own hysteresis
   (``get_speech_timestamps_from_probs``: ``threshold``, ``min_silence_ms``, ``speech_pad_ms``,
   regions shorter than :data:`MIN_SPEECH_MS` dropped).
3. **Spans**: a region longer than ``max_segment_s`` is cut at its quietest point between 60% and
   100% of the limit, repeatedly: the middle of the longest run of 25 ms frames (10 ms hop) whose
   energy is within 6 dB of the lowest frame's, so a pause between sentences wins over a stop
   consonant. Then neighbours separated by at most ``merge_gap_ms`` are merged while the result
   stays within the limit.

Spans are sorted, non-overlapping, inside ``[0, len(wave))``, each ``<= max_segment_s``. Audio with
no speech gives ``[]``: what to do then (e.g. transcribe it whole) is the caller's decision.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from pipeline.domain.tags import SAMPLE_RATE_HZ  # the only rate accepted (silero's and SenseVoice's)

logger = logging.getLogger("sensevoice.vad")

MAX_SEGMENT_S = 30.0  # s, default longest span
WINDOW = 512  # samples, silero's window at 16 kHz (32 ms)
CONTEXT = 64  # samples, silero prepends the previous window's tail to each window
STATE_SIZE = 128  # silero LSTM width; its state tensor is (2, batch, STATE_SIZE)
MIN_SPEECH_MS = 250  # ms, shorter speech regions are dropped (silero's default)
MAX_LANES = 64  # lanes scored in one batched model call
MIN_LANE_S = 30.0  # s, audio per lane at least (short audio runs in fewer lanes)
MAX_LANES_GPU = 512  # the same on a GPU, where a step of 512 costs what a step of 64 does
MIN_LANE_S_GPU = 6.0  # s, audio per lane at least on a GPU
LANE_WARMUP_MS = 1000  # ms, audio replayed before each lane's own part, scores discarded
SPLIT_WINDOW = (0.6, 1.0)  # fraction of max_segment_s where a long region may be cut
FRAME = 400  # samples, 25 ms energy frame for choosing a cut
HOP = 160  # samples, 10 ms energy hop
QUIET_RATIO = 4.0  # frame energy within this factor (6 dB) of the quietest frame counts as quiet
PROGRESS_STEPS = 100  # progress reports per split, about
SCORING_THREADS = 1  # torch intra-op threads of the scoring thread
SCORING_SHARE = 0.95  # fraction of progress given to scoring (the rest is post-processing)


@dataclass(frozen=True)
class Span:
    """A stretch of the 16 kHz wave: ``wave[start:end]`` (samples, end exclusive)."""

    start: int  # samples
    end: int  # samples, exclusive

    @property
    def start_s(self) -> float:
        return self.start / SAMPLE_RATE_HZ

    @property
    def end_s(self) -> float:
        return self.end / SAMPLE_RATE_HZ

    @property
    def duration_s(self) -> float:
        return (self.end - self.start) / SAMPLE_RATE_HZ


@contextmanager
def _torch_threads_kept():
    """Restore the calling thread's torch thread count and the default for new threads."""
    before = torch.get_num_threads()
    try:
        yield
    finally:
        # unconditionally: another thread may have changed the default for new threads
        torch.set_num_threads(before)


def _load_net(device: torch.device | None = None) -> Any:
    """The stateless core of silero's JIT model: ``net(x[B, 576], state[2, B, 128]) -> (p, state)``;
    on a CUDA ``device``, the same network re-stated in PyTorch and moved there.

    silero's wrapper (``model(x, sr)``) keeps state and context inside itself and adds the
    context itself; its ``_model`` takes both as arguments, so lanes can be batched.
    """
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.load deprecation notice
        warnings.simplefilter("ignore", DeprecationWarning)  # importlib.resources.path
        from silero_vad import load_silero_vad

        wrapper = load_silero_vad(onnx=False)
    net = getattr(wrapper, "_model", None)
    if net is None:
        raise RuntimeError(
            "silero-vad's JIT model has no '_model' submodule; pipeline/audio/vad.py was written "
            "against silero-vad 6.2.3 (see requirements.txt)"
        )
    if device is not None and device.type == "cuda":
        from pipeline.audio.silero_net import SileroNet

        # full fp32 convolutions, process-wide: cuDNN's default TF32 keeps 10-bit mantissas in
        # silero's STFT (fp16/bf16 work, the engine's, is not affected by this switch)
        torch.backends.cudnn.allow_tf32 = False
        return SileroNet(net).to(device).eval()
    return net


def lane_plan(nw: int, max_lanes: int, min_lane_s: float) -> tuple[int, int, int]:
    """(lanes, windows each lane reports, windows replayed before each lane's part)."""
    min_lane = int(min_lane_s * SAMPLE_RATE_HZ) // WINDOW
    lanes = max(1, min(max_lanes, nw // max(min_lane, 1)))
    own = math.ceil(nw / lanes)
    warm = LANE_WARMUP_MS * SAMPLE_RATE_HZ // 1000 // WINDOW
    return lanes, own, warm


def _as_wave(wave: torch.Tensor | np.ndarray) -> torch.Tensor:
    """A 1-D float32 CPU tensor sharing memory with ``wave`` when it already is one."""
    if isinstance(wave, np.ndarray):
        arr = wave
        if arr.dtype == np.int16:
            arr = arr.astype(np.float32) / 32768.0
        elif arr.dtype != np.float32:
            if not np.issubdtype(arr.dtype, np.floating):
                raise TypeError(f"wave must be float or int16 samples, not {arr.dtype}")
            arr = arr.astype(np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # read-only arrays: we never write
            t = torch.from_numpy(np.ascontiguousarray(arr))
    elif isinstance(wave, torch.Tensor):
        t = wave.detach()
        if t.dtype == torch.int16:
            t = t.float() / 32768.0
        elif not t.is_floating_point():
            raise TypeError(f"wave must be float or int16 samples, not {t.dtype}")
        t = t.to(device="cpu", dtype=torch.float32).contiguous()
    else:
        raise TypeError(f"wave must be a torch.Tensor or numpy array, not {type(wave).__name__}")
    if t.dim() == 2 and t.shape[0] == 1:
        t = t[0]
    if t.dim() != 1:
        raise ValueError(f"wave must be mono (1-D), got shape {tuple(t.shape)}")
    return t


class _Windows:
    """Windows of a wave with silero's 64-sample context, gathered by index without copying it.

    Row ``i`` is ``wave[512 i - 64 : 512 i + 512]``, zero-filled outside the wave. Interior rows
    come from one strided view; window 0 and the last one or two are built one by one.
    """

    def __init__(self, wave: torch.Tensor):
        self.wave = wave
        self.n = wave.numel()
        size = CONTEXT + WINDOW
        first = WINDOW - CONTEXT  # view row r is window r + 1, from sample 512 (r + 1) - 64
        # last row r needs 512 r + 1024 <= n
        self.count = (self.n - 2 * WINDOW) // WINDOW + 1 if self.n >= 2 * WINDOW else 0
        self.view = (
            wave.as_strided((self.count, size), (WINDOW, 1), wave.storage_offset() + first)
            if self.count
            else None
        )

    def _row(self, i: int) -> torch.Tensor:
        row = torch.zeros(CONTEXT + WINDOW)
        lo, hi = i * WINDOW - CONTEXT, i * WINDOW + WINDOW
        a, b = max(lo, 0), min(hi, self.n)
        if b > a:
            row[a - lo : b - lo] = self.wave[a:b]
        return row

    def gather(self, idx: torch.Tensor) -> torch.Tensor:
        """Rows for window indices ``idx`` (``(B,)`` int64): ``(B, 576)`` float32."""
        if self.view is None:
            return torch.stack([self._row(int(i)) for i in idx])
        rows = self.view[(idx - 1).clamp(0, self.count - 1)]
        edge = (idx < 1) | (idx > self.count)
        if bool(edge.any()):
            for b in torch.nonzero(edge).flatten().tolist():
                rows[b] = self._row(int(idx[b]))
        return rows


class Segmenter:
    """Speech spans of a 16 kHz mono wave. Thread-safe; silero is loaded once, lazily, on CPU.

    Scoring runs on one thread of its own (calls from several threads queue there, about 4 s per
    hour of audio each); the rest of :meth:`split` runs on the caller's thread. Loading keeps
    torch's thread count as it was (``import silero_vad`` sets it to 1 process-wide).
    """

    def __init__(
        self,
        max_segment_s: float = MAX_SEGMENT_S,
        min_silence_ms: int = 300,
        speech_pad_ms: int = 100,
        threshold: float = 0.5,
        merge_gap_ms: int = 500,
        device: str = "cpu",
    ):
        """
        Args:
            max_segment_s: longest span, seconds (at least 1 s).
            min_silence_ms: silence that ends a speech region, ms.
            speech_pad_ms: padding added on each side of a speech region, ms (silero halves it
                between regions closer than twice the padding, so regions never overlap).
            threshold: speech probability that starts a region (silero ends one below
                ``threshold - 0.15``).
            merge_gap_ms: neighbouring regions at most this far apart (after padding) are merged
                into one span while it stays within ``max_segment_s``; larger gaps always separate
                spans. 0 merges only touching regions.
            device: where silero scores: "cpu" (TorchScript, 64 lanes) or a CUDA device
                (:mod:`pipeline.audio.silero_net`, up to 512 lanes, scores kept on the device).
        """
        if not max_segment_s >= 1.0:
            raise ValueError(f"max_segment_s must be at least 1 s, got {max_segment_s}")
        if min_silence_ms < 0 or speech_pad_ms < 0 or merge_gap_ms < 0:
            raise ValueError("min_silence_ms, speech_pad_ms and merge_gap_ms must be >= 0")
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be in (0, 1), got {threshold}")
        self.max_segment_s = float(max_segment_s)
        self.min_silence_ms = int(min_silence_ms)
        self.speech_pad_ms = int(speech_pad_ms)
        self.threshold = float(threshold)
        self.merge_gap_ms = int(merge_gap_ms)
        self.device = torch.device(device)
        self._net: Any = None
        self._executor: ThreadPoolExecutor | None = None
        self._lock = threading.Lock()

    # -- lifecycle ------------------------------------------------------------------------------

    def load(self) -> Segmenter:
        """Load silero now (e.g. at service start) instead of on the first :meth:`split`."""
        self._scorer()
        return self

    def close(self) -> None:
        """Stop the scoring thread (a later call starts a new one). Idempotent."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def _scorer(self) -> ThreadPoolExecutor:
        """The scoring thread, started (and silero loaded on it) on first use."""
        with self._lock:
            if self._executor is None:
                with _torch_threads_kept():  # the thread's set_num_threads changes the default
                    executor = ThreadPoolExecutor(
                        1, thread_name_prefix="vad", initializer=_init_scoring_thread
                    )
                    try:
                        if self._net is None:
                            self._net = executor.submit(_load_net, self.device).result()
                    except BaseException:
                        executor.shutdown(wait=False)
                        raise
                self._executor = executor
            return self._executor

    # -- public ---------------------------------------------------------------------------------

    def split(
        self,
        wave: torch.Tensor | np.ndarray,
        on_progress: Callable[[float], None] | None = None,
    ) -> list[Span]:
        """Speech spans of ``wave`` (1-D or ``(1, n)``, float in [-1, 1] or int16, 16 kHz).

        float32 input is used in place (a 1-hour file is never copied); other dtypes and CUDA
        tensors are converted first. ``on_progress(fraction)`` is called about 100 times with
        increasing fractions, last with 1.0, from the scoring thread and then the caller's; an
        exception it raises aborts the split and reaches the caller (a way to cancel). Returns
        ``[]`` when nothing is speech.
        """
        t0 = time.perf_counter()
        x = _as_wave(wave)
        report = _Progress(on_progress)
        if x.numel() == 0:
            report(1.0)
            return []
        probs = self.speech_probs(x, lambda f: report(f * SCORING_SHARE))
        t1 = time.perf_counter()
        samples = x.numpy()
        spans = self.spans_from_probs(samples, probs)
        report(1.0)
        logger.debug(
            "vad: %.1f s of audio -> %d spans; scoring %.2f s, spans %.2f s",
            len(samples) / SAMPLE_RATE_HZ, len(spans), t1 - t0, time.perf_counter() - t1,
        )  # fmt: skip
        return spans

    def speech_probs(
        self, wave: torch.Tensor | np.ndarray, on_progress: Callable[[float], None] | None = None
    ) -> np.ndarray:
        """silero's speech probability per 512-sample window (last window zero-padded), float32."""
        x = _as_wave(wave)
        if self.device.type == "cuda":  # the wave goes to the device once
            x = x.to(self.device)
            return self._scorer().submit(_score_on_device, self._net, x, on_progress).result()
        return self._scorer().submit(_score, self._net, x, on_progress).result()

    def spans_from_probs(self, samples: np.ndarray, probs: np.ndarray) -> list[Span]:
        """Steps 2 and 3 of the module docstring: regions from the scores, cut and merged."""
        regions = self._regions(probs, len(samples))
        max_len = round(self.max_segment_s * SAMPLE_RATE_HZ)
        pieces = [p for r in regions for p in _split_long(samples, r, max_len)]
        return _merge(pieces, max_len, self.merge_gap_ms * SAMPLE_RATE_HZ // 1000)

    # -- steps ----------------------------------------------------------------------------------

    def _regions(self, probs: np.ndarray, n: int) -> list[tuple[int, int]]:
        """Speech regions ``(start, end)`` in samples, padded, from silero's hysteresis."""
        from silero_vad import get_speech_timestamps_from_probs  # imported by _load_net already

        found = get_speech_timestamps_from_probs(
            probs.tolist(),
            sampling_rate=SAMPLE_RATE_HZ,
            threshold=self.threshold,
            min_speech_duration_ms=MIN_SPEECH_MS,
            min_silence_duration_ms=self.min_silence_ms,
            speech_pad_ms=self.speech_pad_ms,
            audio_length_samples=n,
        )
        out: list[tuple[int, int]] = []
        for d in found:
            a, b = max(int(d["start"]), out[-1][1] if out else 0), min(int(d["end"]), n)
            if b > a:
                out.append((a, b))
        return out


def _init_scoring_thread() -> None:
    """One intra-op thread for this thread (see the module docstring).

    torch sets a thread's count lazily, from the process-wide default, the first time the thread
    asks for it or runs a parallel op; a count set before that is overwritten then. So the lazy
    step is forced first (``get_num_threads``), and the count set after it sticks.
    """
    torch.get_num_threads()
    torch.set_num_threads(SCORING_THREADS)


def _score(net: Any, x: torch.Tensor, on_progress: Callable[[float], None] | None) -> np.ndarray:
    """Speech probability per window, lanes batched (see the module docstring). Scoring thread."""
    nw = math.ceil(x.numel() / WINDOW)
    probs = np.zeros(nw, dtype=np.float32)
    if nw == 0:
        return probs
    lanes, own, warm = lane_plan(nw, MAX_LANES, MIN_LANE_S)  # warm: windows replayed, not reported
    first = torch.arange(lanes, dtype=torch.int64) * own  # first reported window per lane
    start = (first - warm).clamp(min=0)
    stop = (first + own).clamp(max=nw)
    steps = int((stop - start).max())
    state = torch.zeros(2, lanes, STATE_SIZE)
    windows = _Windows(x)
    every = max(1, steps // PROGRESS_STEPS)
    with torch.inference_mode():
        for s in range(steps):
            idx = start + s
            out, state = net(windows.gather(idx.clamp(max=nw)), state)
            keep = (idx >= first) & (idx < stop)
            if bool(keep.all()):
                probs[idx.numpy()] = out[:, 0].numpy()
            elif bool(keep.any()):
                probs[idx[keep].numpy()] = out[keep, 0].numpy()
            if on_progress is not None and ((s + 1) % every == 0 or s + 1 == steps):
                on_progress((s + 1) / steps)
    return probs


def _score_on_device(net: Any, x: torch.Tensor, on_progress: Callable[[float], None] | None,
                     max_lanes: int = MAX_LANES_GPU, min_lane_s: float = MIN_LANE_S_GPU) -> np.ndarray:
    """:func:`_score` on the wave's device: many lanes, no host sync inside the loop, each step's
    scores written into a ``[lanes, steps]`` buffer there, one transfer at the end."""
    dev = x.device
    nw = math.ceil(x.numel() / WINDOW)
    probs = np.zeros(nw, dtype=np.float32)
    if nw == 0:
        return probs
    lanes, own, warm = lane_plan(nw, max_lanes, min_lane_s)
    first = np.arange(lanes, dtype=np.int64) * own
    start = np.maximum(first - warm, 0)
    stop = np.minimum(first + own, nw)
    steps = int((stop - start).max())
    # window i = wave[512 i - 64 : 512 i + 512], zeros outside: one padded copy, a strided view
    padded = torch.zeros(CONTEXT + nw * WINDOW + WINDOW, device=dev)
    padded[CONTEXT:CONTEXT + x.numel()] = x
    view = padded.as_strided((nw, CONTEXT + WINDOW), (WINDOW, 1))
    start_d = torch.from_numpy(start).to(dev)
    state = torch.zeros(2, lanes, STATE_SIZE, device=dev)
    out = torch.empty(lanes, steps, device=dev)
    every = max(1, steps // PROGRESS_STEPS)
    with torch.inference_mode():
        for s in range(steps):
            p, state = net(view[(start_d + s).clamp(max=nw - 1)], state)
            out[:, s] = p[:, 0]
            if on_progress is not None and ((s + 1) % every == 0 or s + 1 == steps):
                on_progress((s + 1) / steps)
        host = out.cpu().numpy()  # the one transfer
    for lane in range(lanes):
        a, b = int(first[lane]), int(stop[lane])
        if b > a:
            probs[a:b] = host[lane, a - start[lane]: b - start[lane]]
    return probs


class _Progress:
    """Forward strictly increasing fractions in [0, 1] to a callback, if any."""

    def __init__(self, callback: Callable[[float], None] | None):
        self.callback = callback
        self.last = -1.0

    def __call__(self, fraction: float) -> None:
        fraction = min(max(float(fraction), 0.0), 1.0)
        if self.callback is not None and fraction > self.last:
            self.last = fraction
            self.callback(fraction)


def _quietest(x: np.ndarray, lo: int, hi: int) -> int:
    """A cut point in ``(lo, hi)``: the middle of the longest quiet stretch of ``x[lo:hi]``.

    Quiet means a 25 ms frame (10 ms hop) whose energy is within :data:`QUIET_RATIO` of the
    lowest frame's, so the cut prefers a real pause (between sentences) to a short dip (a stop
    consonant), and lands in the middle of it rather than at an edge.
    """
    seg = x[lo:hi].astype(np.float64)
    if len(seg) < FRAME:
        return (lo + hi) // 2
    cs = np.concatenate([[0.0], np.cumsum(seg * seg)])
    starts = np.arange(0, len(seg) - FRAME + 1, HOP)
    energy = cs[starts + FRAME] - cs[starts]
    quiet = energy <= energy.min() * QUIET_RATIO + 1e-9 * energy.max() + 1e-12
    edges = np.flatnonzero(np.diff(np.concatenate([[0], quiet.astype(np.int8), [0]])))
    run_starts, run_ends = edges[::2], edges[1::2]  # runs of quiet frames, end exclusive
    longest = int(np.argmax(run_ends - run_starts))
    mid = (run_starts[longest] + run_ends[longest] - 1) // 2
    return lo + int(starts[mid]) + FRAME // 2


def _split_long(x: np.ndarray, region: tuple[int, int], max_len: int) -> list[tuple[int, int]]:
    """Cut a region longer than ``max_len`` at quiet points so every piece is ``<= max_len``."""
    start, end = region
    pieces: list[tuple[int, int]] = []
    lo_frac, hi_frac = SPLIT_WINDOW
    while end - start > max_len:
        cut = _quietest(x, start + int(lo_frac * max_len), start + int(hi_frac * max_len))
        pieces.append((start, cut))
        start = cut
    pieces.append((start, end))
    return pieces


def _merge(pieces: list[tuple[int, int]], max_len: int, max_gap: int) -> list[Span]:
    """Greedily join neighbours at most ``max_gap`` apart while the join is ``<= max_len``."""
    spans: list[Span] = []
    cur: tuple[int, int] | None = None
    for a, b in pieces:
        if cur is not None and a - cur[1] <= max_gap and b - cur[0] <= max_len:
            cur = (cur[0], b)
            continue
        if cur is not None:
            spans.append(Span(*cur))
        cur = (a, b)
    if cur is not None:
        spans.append(Span(*cur))
    return spans
