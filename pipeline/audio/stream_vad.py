"""Speech detection on live audio, as it arrives: the offline splitter's rules (pipeline/audio/vad.py)
applied window by window, so that live captions are cut where the offline job is cut.

Three parts:

* :class:`StreamAudio` -- one stream's input side: 16-bit little-endian mono PCM in frames of any
  size (an odd byte is carried to the next frame), at any rate from 8 to 192 kHz (FFmpeg's
  resampler converts other rates to 16 kHz chunk by chunk, keeping its filter state between
  frames), cut into silero's 512-sample windows with the previous 64 samples as context and the
  LSTM state carried from window to window. A stream scored frame by frame gets the very windows
  and states the offline splitter computes for the whole file in one lane.
* :class:`StreamScorer` -- one thread that scores the windows of every live stream of the process:
  each step stacks the next window of every waiting stream, with its state, into one silero call.
  One window per call costs 0.25 ms and 64 rows per call 2 ms on this 2-core machine (vad.py's
  figures), so 500 streams at real time (15,600 windows/s) take about half a core rather than four.
  Conversion and resampling run on that thread too: the event loop only hands bytes over.
  Rounds are fair: each takes the next ``PIECE_S`` of input of every waiting stream, so a stream
  with a large frame of 192 kHz audio never makes another stream's frame wait for all of it.
  While many streams are open a round gathers their frames for up to ``GATHER_S`` (20 ms) first:
  streams send 100 ms frames at their own phases, so a round taken at once held one or two of
  them, and a silero call costs 0.32 ms for one row, 0.95 ms for two, 1.6 ms for 16 on this
  machine (issue 22: at 42 streams the scorer's thread took half a core; gathered, ~12 rows a call).
  A lone stream is never held back.
* :class:`Endpointer` -- silero's hysteresis (``get_speech_timestamps_from_probs``: a region
  starts at a window >= ``threshold`` and ends where ``min_silence`` of windows under
  ``threshold - 0.15`` began; regions not longer than ``min_speech`` are dropped), the offline
  splitter's padding, and its merging of neighbours: an utterance closes once the silence after
  its last region exceeds ``close_gap`` (0.7 s by default: the 500 ms merge gap plus 100 ms of
  padding on each side, the widest pause the offline splitter still merges). An utterance
  that reaches ``max_len`` is cut at its quietest point between 60% and 100% of it, as the offline
  splitter cuts a long region. On the same probabilities the spans equal the offline splitter's
  (``tests/test_stream.py`` checks it).

Hand-written because silero's own ``VADIterator`` keeps one state per model object, scores one
window per call, and has neither the splitter's minimum speech length nor its merging.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from pipeline.audio.vad import (CONTEXT, MIN_SPEECH_MS, SPLIT_WINDOW, STATE_SIZE, WINDOW, Segmenter,
                                _init_scoring_thread, _load_net, _quietest, _torch_threads_kept)
from pipeline.domain.tags import SAMPLE_RATE_HZ

logger = logging.getLogger("sensevoice.live.vad")

MIN_RATE = 8_000  # Hz, the lowest input rate a live stream may declare
MAX_RATE = 192_000  # Hz, the highest
MAX_ROWS = 256  # windows scored in one silero call (streams beyond it wait for the next step)
MAX_ROWS_GPU = 2048  # the same on a GPU, where a call of 2,048 windows costs what one of 64 does
PIECE_S = 0.25  # input audio of one stream scored per round (a larger frame takes more rounds)
GATHER_S = 0.02  # while many streams are open, a round waits this long for more of their frames
GATHER_STREAMS = 8  # "many": streams scored within the last GATHER_MEMORY_S
GATHER_MEMORY_S = 1.0
PCM_SCALE = 32768.0  # s16 -> [-1, 1), as FFmpeg converts it


@dataclass(frozen=True)
class Scored:
    """What one frame of a stream gave: its new 16 kHz samples and the speech probability of each
    window it completed (the last, zero-padded window too when the stream was flushed)."""

    samples: np.ndarray  # float32, 16 kHz
    probs: np.ndarray  # float32, one per 512-sample window


class StreamAudio:
    """One stream's PCM -> 16 kHz float32 -> silero windows and state. Used by one thread at a
    time (the scorer's): a stream sends its next frame once the previous one is scored."""

    def __init__(self, sample_rate: int = SAMPLE_RATE_HZ):
        if not MIN_RATE <= sample_rate <= MAX_RATE:
            raise ValueError(f"sample rate {sample_rate} Hz is outside {MIN_RATE}..{MAX_RATE} Hz")
        self.sample_rate = int(sample_rate)
        self._odd = b""  # the odd byte of the previous frame
        self._resampler = None
        if self.sample_rate != SAMPLE_RATE_HZ:
            from pipeline.audio.decode import StreamResampler

            self._resampler = StreamResampler(self.sample_rate)
        self._context = np.zeros(CONTEXT, dtype=np.float32)  # the 64 samples before _tail
        self._tail = np.zeros(0, dtype=np.float32)  # samples not yet in a scored window
        self.state = torch.zeros(2, 1, STATE_SIZE)  # silero's LSTM state after the last window

    def convert(self, data: bytes, flush: bool = False) -> np.ndarray:
        """16 kHz float32 samples for ``data`` (s16le); ``flush`` drains the resampler."""
        data = self._odd + data
        cut = len(data) - len(data) % 2
        self._odd = data[cut:]
        pcm = np.frombuffer(data[:cut], dtype="<i2").astype(np.float32) / PCM_SCALE
        if self._resampler is not None:
            parts = [part.copy() for part in self._resampler(pcm)] if len(pcm) else []
            if flush:
                parts += [part.copy() for part in self._resampler(None)]
            pcm = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
        return pcm

    def windows(self, samples: np.ndarray, flush: bool = False) -> np.ndarray:
        """The complete windows ``samples`` adds, each with its 64 samples of context: ``(k, 576)``.
        ``flush`` zero-pads the last partial window (as the offline scorer pads the file's end)."""
        buf = np.concatenate([self._tail, samples]) if len(self._tail) else samples
        k = len(buf) // WINDOW
        if flush and len(buf) % WINDOW:
            k += 1
            buf = np.concatenate([buf, np.zeros(k * WINDOW - len(buf), dtype=np.float32)])
        if k == 0:
            self._tail = buf.copy()
            return np.zeros((0, CONTEXT + WINDOW), dtype=np.float32)
        full = np.concatenate([self._context, buf])
        view = np.lib.stride_tricks.sliding_window_view(full[:k * WINDOW + CONTEXT], CONTEXT + WINDOW)
        rows = np.ascontiguousarray(view[::WINDOW])  # row i: buf[512 i - 64 : 512 i + 512]
        self._context = full[k * WINDOW:k * WINDOW + CONTEXT].copy()
        self._tail = buf[k * WINDOW:].copy()
        return rows


@dataclass(eq=False)
class _Request:
    """One frame of one stream, cut into pieces of at most ``piece_s`` of input audio."""

    audio: StreamAudio
    future: Future
    pieces: int  # pieces not yet scored
    started: bool = False  # its first piece was taken
    dead: bool = False  # cancelled before it ran, or failed: its other pieces are skipped
    samples: list = field(default_factory=list)
    probs: list = field(default_factory=list)


@dataclass(eq=False)
class _Piece:
    request: _Request
    data: bytes
    flush: bool
    rows: np.ndarray | None = None
    samples: np.ndarray | None = None
    probs: np.ndarray | None = None


class StreamScorer:
    """Scores the windows of every live stream on one thread, batched (see the module docstring).

    Fair across streams: a frame is cut into pieces of at most ``piece_s`` of input audio, and
    each scoring round takes the next piece of every stream that has one (round robin). A stream
    with a large backlog (a large frame of 192 kHz audio) therefore costs each round what any
    other stream costs, and another stream's frame waits at most one round, never for that
    backlog (issue 19: a real-time stream's frames waited behind 8 fast senders' frames).

    :meth:`score` never blocks: it queues the frame and returns a future of :class:`Scored`.
    silero loads on the thread at the first request. Thread-safe."""

    _shared: StreamScorer | None = None
    _shared_lock = threading.Lock()

    def __init__(self, max_rows: int = MAX_ROWS, piece_s: float = PIECE_S, device: str = "cpu",
                 gather_s: float = GATHER_S, clock: Callable[[], float] = time.monotonic):
        """``device``: where silero runs. On a GPU (the offline segmenter's network,
        :mod:`pipeline.audio.silero_net`) each stream's state stays there, a step scores up to
        :data:`MAX_ROWS_GPU` streams, and a round's scores come back in one transfer."""
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:  # set_device needs an index
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.max_rows = max_rows if self.device.type == "cpu" else max(max_rows, MAX_ROWS_GPU)
        self.piece_s = piece_s
        self._cond = threading.Condition()
        self._queues: dict[StreamAudio, deque[_Piece]] = {}  # per stream, in arrival order
        self._thread: threading.Thread | None = None
        self._net: Any = None
        self.gather_s = gather_s
        self.clock = clock
        self._first_at = 0.0  # when the oldest frame waiting was queued
        self._seen: dict[int, float] = {}  # id of a stream -> when a round last scored it
        self.calls = 0  # silero calls made (for the benchmark and the tests)
        self.rows = 0  # windows scored
        self.rounds = 0  # scoring rounds (one piece of each waiting stream)

    @classmethod
    def shared(cls, device: str = "cpu") -> StreamScorer:
        """The process's scorer (one thread and one silero for every live stream); the first
        caller's ``device`` is the one it runs on."""
        with cls._shared_lock:
            if cls._shared is None:
                cls._shared = cls(device=device)
            return cls._shared

    def score(self, audio: StreamAudio, data: bytes, flush: bool = False) -> Future:
        """Queue one frame of ``audio``'s stream; the future gets its :class:`Scored`."""
        step = max(2, int(audio.sample_rate * self.piece_s) * 2)  # bytes of s16 input
        cuts = [bytes(data[i:i + step]) for i in range(0, len(data), step)] or [b""]
        request = _Request(audio, Future(), len(cuts))
        pieces = [_Piece(request, cut, flush and k == len(cuts) - 1) for k, cut in enumerate(cuts)]
        with self._cond:
            if self._thread is None:
                with _torch_threads_kept():  # the thread's set_num_threads changes the default
                    self._thread = threading.Thread(target=self._run, name="sensevoice-live-vad",
                                                    daemon=True)
                    self._thread.start()
            if not self._queues:
                self._first_at = self.clock()
            self._queues.setdefault(audio, deque()).extend(pieces)
            self._cond.notify()
        return request.future

    def _run(self) -> None:
        _init_scoring_thread()  # one intra-op thread (vad.py says why)
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            self._net = _load_net(self.device)
        except BaseException as e:  # every request fails with the reason, now and later
            logger.exception("silero-vad could not be loaded for live captions")
            self._net = e
        while True:
            with self._cond:
                while not self._queues:
                    self._cond.wait()
                while (wait := self.gather_wait()) > 0:
                    self._cond.wait(wait)
                batch = []
                for audio in list(self._queues):  # one piece of each waiting stream
                    queue = self._queues[audio]
                    batch.append(queue.popleft())
                    if not queue:
                        del self._queues[audio]
            self.rounds += 1
            self._remember(batch)
            self._serve(batch)

    def gather_wait(self) -> float:
        """Seconds the next round should still wait for more streams' frames (0: take it now).
        Called holding the lock."""
        waiting = len(self._queues)
        open_streams = len(self._seen)
        if self.gather_s <= 0 or open_streams < GATHER_STREAMS or waiting >= open_streams:
            return 0.0
        return max(0.0, self._first_at + self.gather_s - self.clock())

    def _remember(self, batch: list[_Piece]) -> None:
        """The streams scored lately (how many are open, as the scorer sees them)."""
        now = self.clock()
        for piece in batch:
            self._seen[id(piece.request.audio)] = now
        if self.rounds % 16 == 0:
            for key in [k for k, t in self._seen.items() if now - t > GATHER_MEMORY_S]:
                del self._seen[key]

    def _serve(self, batch: list[_Piece]) -> None:
        live = []
        for piece in batch:
            r = piece.request
            if not r.started and not r.dead:
                r.started = True
                r.dead = not r.future.set_running_or_notify_cancel()  # cancelled before it ran
            if not r.dead:
                live.append(piece)
        if isinstance(self._net, BaseException):
            for piece in live:
                self._fail(piece.request, RuntimeError(f"speech detection is unavailable: {self._net}"))
            return
        ready = []
        for piece in live:
            try:
                piece.samples = piece.request.audio.convert(piece.data, piece.flush)
                piece.rows = piece.request.audio.windows(piece.samples, piece.flush)
                piece.probs = np.zeros(len(piece.rows), dtype=np.float32)
                ready.append(piece)
            except Exception as e:  # a stream's own fault (never seen: any bytes are PCM)
                self._fail(piece.request, e)
        try:
            self._score(ready)
        except Exception as e:
            logger.exception("live speech detection failed")
            for piece in ready:
                self._fail(piece.request, RuntimeError(f"speech detection failed: {e}"))
            return
        for piece in ready:
            r = piece.request
            r.samples.append(piece.samples)
            r.probs.append(piece.probs)
            r.pieces -= 1
            if r.pieces == 0:
                r.future.set_result(Scored(np.concatenate(r.samples), np.concatenate(r.probs)))

    @staticmethod
    def _fail(request: _Request, e: BaseException) -> None:
        if not request.dead:
            request.dead = True
            request.future.set_exception(e)

    def _score(self, pieces: list[_Piece]) -> None:
        """Step through the pieces' windows: step t scores window t of every piece that has one,
        in groups of at most ``max_rows``, each row with its stream's state. Vectorised across
        the streams: the pieces are taken longest first, so the ones with a window t are a
        prefix -- one slice of the round's windows (stacked once) and of its states (gathered
        once, handed back once), where each step used to stack its rows and concatenate and
        copy out every stream's state."""
        order = sorted((p for p in pieces if len(p.rows)), key=lambda p: -len(p.rows))
        if not order:
            return
        dev = self.device
        on_gpu = dev.type == "cuda"
        lengths = [len(p.rows) for p in order]
        steps, n = lengths[0], len(order)
        windows = np.zeros((steps, n, CONTEXT + WINDOW), dtype=np.float32)
        for k, p in enumerate(order):
            windows[:lengths[k], k] = p.rows
        x = torch.from_numpy(windows)
        if on_gpu:  # asynchronous copies: the host never waits for the step
            x = x.pin_memory().to(dev, non_blocking=True)
        with torch.inference_mode():
            state = torch.cat([p.request.audio.state.to(dev, non_blocking=on_gpu) for p in order], dim=1)
            scores = torch.zeros(steps, n, device=dev)  # the round's scores, on the device
            m = n
            for t in range(steps):
                while lengths[m - 1] <= t:  # the pieces with a window t: the first m
                    m -= 1
                for g in range(0, m, self.max_rows):
                    h = min(g + self.max_rows, m)
                    out, state[:, g:h] = self._net(x[t, g:h], state[:, g:h].contiguous())
                    scores[t, g:h] = out[:, 0]
                    self.calls += 1
                    self.rows += h - g
            for k, p in enumerate(order):  # each stream's state stays on the device
                p.request.audio.state = state[:, k:k + 1].clone()
            host = scores.cpu().numpy()  # the one transfer of the round
        for k, p in enumerate(order):
            p.probs[:] = host[:lengths[k], k]


# ---------------------------------------------------------------------------- endpointing
@dataclass(frozen=True)
class EndpointRules:
    """The endpointing rules in 16 kHz samples (see the module docstring)."""

    threshold: float  # speech probability that starts a region
    neg_threshold: float  # under it a window is silence (silero: threshold - 0.15)
    min_silence: int  # silence that ends a region
    min_speech: int  # regions not longer than this are dropped
    pad: int  # added before an utterance's first region and after its last
    close_gap: int  # silence after an utterance's last region that closes it
    max_len: int  # an utterance reaching this is cut at its quietest point

    @classmethod
    def of(cls, segmenter: Segmenter, pause_s: float | None = None,
           max_utterance_s: float | None = None) -> EndpointRules:
        """The offline splitter's rules. ``pause_s`` (default: the widest pause the splitter merges,
        its merge gap plus the padding on both sides, 0.7 s) and ``max_utterance_s`` (default: its
        longest span) are the two a live stream may tune."""
        ms = SAMPLE_RATE_HZ // 1000
        pad = segmenter.speech_pad_ms * ms
        merged = segmenter.merge_gap_ms * ms + 2 * pad  # from one region's end to the next's start
        close_gap = merged if pause_s is None else max(WINDOW, round(pause_s * SAMPLE_RATE_HZ))
        max_s = segmenter.max_segment_s if max_utterance_s is None else max_utterance_s
        return cls(threshold=segmenter.threshold,
                   neg_threshold=max(segmenter.threshold - 0.15, 0.01),
                   min_silence=min(segmenter.min_silence_ms * ms, close_gap),
                   min_speech=MIN_SPEECH_MS * ms, pad=pad, close_gap=close_gap,
                   max_len=max(WINDOW * 4, round(max_s * SAMPLE_RATE_HZ)))


@dataclass(frozen=True)
class Closed:
    """An utterance is complete: samples ``[start, end)`` of the stream (padded as the offline
    splitter pads), closed by a ``pause``, the length ``limit`` or the stream's ``end``."""

    start: int
    end: int
    reason: str  # "pause" | "limit" | "end"


@dataclass(frozen=True)
class Dropped:
    """The utterance in progress was too short to be speech (its only region was dropped)."""

    start: int


class Endpointer:
    """Utterances from speech probabilities, one 512-sample window at a time (see the module
    docstring). ``quietest(lo, hi)`` gives a cut point in ``(lo, hi)`` for the length limit (the
    caller holds the audio). Not thread-safe: one stream's event loop drives it."""

    def __init__(self, rules: EndpointRules, quietest: Callable[[int, int], int]):
        self.rules = rules
        self.quietest = quietest
        self.windows = 0  # windows seen
        self.start: int | None = None  # padded start of the utterance in progress, or None
        self.kept = False  # the utterance holds a region long enough to be speech
        self.kept_end = 0  # where its last kept region ends
        self.triggered = False  # inside a region
        self.region_start = 0
        self.temp_end = 0  # where the current silence inside a region began (0: none)
        self.floor = 0  # an utterance never starts before the previous one's end

    @property
    def position(self) -> int:
        """Samples covered by the windows seen."""
        return self.windows * WINDOW

    def push(self, probs: np.ndarray) -> list[Closed | Dropped]:
        events: list[Closed | Dropped] = []
        for p in probs.tolist():
            self._window(float(p), events)
        return events

    def _window(self, p: float, events: list) -> None:
        r = self.rules
        cur = self.windows * WINDOW
        self.windows += 1
        if not self.triggered and self.kept and cur - self.kept_end > r.close_gap:
            # no later region can merge with it: close it (its padding never passes this window)
            events.append(self._close(min(self.kept_end + r.pad, cur + WINDOW), "pause"))
        if p >= r.threshold and self.temp_end:
            self.temp_end = 0
        if p >= r.threshold and not self.triggered:
            self.triggered = True
            self.region_start = cur
            if self.start is None:
                self.start = max(self.floor, cur - r.pad, 0)
        elif p < r.neg_threshold and self.triggered:
            if not self.temp_end:
                self.temp_end = cur
            if cur - self.temp_end >= r.min_silence:
                self._end_region(self.temp_end, events)
        self._limit(events)

    def _end_region(self, end: int, events: list) -> None:
        if end - self.region_start > self.rules.min_speech:
            self.kept, self.kept_end = True, end
        elif not self.kept and self.start is not None:
            events.append(Dropped(self.start))
            self.start = None
        self.triggered = False
        self.temp_end = 0

    def _limit(self, events: list) -> None:
        """Cut an utterance that reached ``max_len``: at a pause (idle after a kept region) close
        it there; in speech, at its quietest point between 60% and 100% of the limit."""
        r = self.rules
        if self.start is None or (self.windows * WINDOW) - self.start < r.max_len:
            return
        if not self.triggered:
            if self.kept:
                end = min(self.kept_end + r.pad, self.start + r.max_len)
                events.append(self._close(end, "limit"))
            return
        lo_frac, hi_frac = SPLIT_WINDOW
        lo, hi = self.start + int(lo_frac * r.max_len), self.start + int(hi_frac * r.max_len)
        cut = self.quietest(lo, hi)
        events.append(Closed(self.start, cut, "limit"))
        self.start = self.floor = cut
        self.kept = True  # what follows the cut belongs to speech already found
        self.kept_end = max(self.kept_end, cut)
        self.region_start = min(self.region_start, cut)

    def _close(self, end: int, reason: str) -> Closed:
        closed = Closed(self.start, max(end, self.start), reason)
        self.floor = closed.end
        self.start, self.kept, self.kept_end = None, False, 0
        return closed

    def finish(self, n: int) -> list[Closed | Dropped]:
        """The stream ended after ``n`` samples (every window, the padded last one too, pushed)."""
        events: list[Closed | Dropped] = []
        if self.triggered:
            self._end_region(n, events)  # silero: the open region ends with the audio
        if self.start is not None and self.kept:
            events.append(self._close(min(n, self.kept_end + self.rules.pad), "end"))
        elif self.start is not None:
            events.append(Dropped(self.start))
            self.start = None
        return events


def quietest_point(samples: np.ndarray, lo: int, hi: int) -> int:
    """A cut point in ``(lo, hi)`` of ``samples``: the middle of the longest quiet stretch (the
    offline splitter's rule, :func:`pipeline.audio.vad._quietest`)."""
    return _quietest(samples, lo, hi)

