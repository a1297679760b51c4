"""Live captions: a stream's transcript grows while the person speaks (issue 14).

SenseVoiceSmall is no streaming model, but it decodes a few seconds of audio in milliseconds, so
the utterance in progress is decoded again several times a second (partials) and once more when
a pause or the stream's end closes it (its final). One :class:`LiveSession` per stream, whatever
its protocol (pipeline/web/routes/stream.py serves the native one and FunASR's):

* **audio in**: :meth:`LiveSession.feed` hands each frame to the process's
  :class:`~pipeline.audio.stream_vad.StreamScorer` (conversion, resampling and silero run there,
  batched across streams, never on the event loop) and runs the
  :class:`~pipeline.audio.stream_vad.Endpointer` over the probabilities it gives back: utterances
  are cut where the offline splitter cuts a recording.
* **decodes**: one driver task per stream runs its decodes one at a time through
  ``WorkerPool.decode_live`` (the live lane of the dynamic batcher, above every job lane, batched with
  whatever the workers run; nothing is stored). Finals go first, in order, and are never dropped;
  an utterance's first partial is queued as a final is (the caption appearing is what a person
  waits for; the partials after it only refine it).
  Otherwise a partial of the utterance in progress starts once ``partial_interval_s`` has passed
  since the previous one started and new speech arrived: a stream whose decodes take longer than
  its audio skips the partials in between (each partial decodes the latest audio), and a partial
  still queued when a final is due is withdrawn (the worker drops a cancelled future). A partial
  is sent only when its text changed.
* **captions out**: the driver awaits ``emit(caption)``: a client that reads slowly slows its own
  stream only, and holds up its decodes rather than piling up captions.

Bounded per stream whatever the client sends: its pace (real time plus ``burst_s``: a faster sender
waits, :class:`RealTimePace`), the frame size (the route checks it), the audio held
while it waits for the model (``max_buffered_s``: beyond it :meth:`feed` waits for the decodes,
which stops reading the socket; after ``idle_timeout_s`` of that, ``live_overloaded``), a decode's
wait (``decode_timeout_s``: a worker that hangs ends the stream with ``not_ready``; in the
distributed topology one that died is noticed within ``live_lost_after_s`` and its re-decode moved
to another worker, or the stream ends with ``live_worker_lost``), the audio
of one stream in all (``max_stream_s``), its time open whatever it sends (``max_stream_wall_s``: the
route finalises it and ends it with ``stream_time_limit``), an utterance's length
(``max_utterance_s``, cut at its quietest point). :class:`LiveHub` bounds the streams of a process
(``max_streams``) and of one client (``max_streams_per_client``, a client being an address or its
network: ``client_prefix_v4`` / ``_v6``), and counts them in the service's Prometheus registry.

**Quiet streams give way** (issue 36: 64 streams from 8 addresses, each sending 20 ms every 10 s,
held every slot for as long as tried). Each stream measures the speech it sent over the last
``quiet_window_s`` of wall clock (:class:`SpeechMeter`). While every slot is held, a new stream
that would be let in otherwise takes the slot of the quietest stream old enough to judge whose
speech was under ``quiet_share`` of that window (the client holding the most streams first): that
stream is asked to stop (:meth:`LiveSession.stop`; the route finalises what it sent and closes it
with ``quiet_stream_yielded``) and no longer counts. With a free slot nothing is closed.

Times are seconds from the stream's start, on the 16 kHz clock of its audio.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Protocol

import numpy as np
import torch

from pipeline.audio.stream_vad import (Closed, Dropped, Endpointer, EndpointRules, StreamAudio,
                                       StreamScorer, quietest_point)
from pipeline.audio.vad import WINDOW, Segmenter
from pipeline.domain.errors import (BrokerUnavailable, LiveAtCapacity, LiveDecodeFailed,
                                    LiveOverloaded, LiveWorkerLost, NotReady, QuietStreamYielded,
                                    SenseVoiceError, StreamTimeLimit, StreamTooLong, TooManyStreams)
from pipeline.domain.redaction import redact_rich
from pipeline.domain.richtext import parse_rich_text
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import Segment, TranscribeOptions, Word
from pipeline.serving.admission import LiveAdmission, StreamLoad, client_key

logger = logging.getLogger("sensevoice.live")

DECODE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)  # seconds
TRIM_SLACK_S = 10.0  # audio no longer needed is dropped from a stream's buffer in steps of this
MIN_FEED_S = 0.02  # audio handed to the speech scorer at once, at least (shorter frames wait)


# one re-decode on the live lane: (wave, options) -> its future; a final is asked with final=True
# and goes ahead of every partial
LiveDecode = Callable[..., Future]


@dataclass(frozen=True)
class LiveLimits:
    """The live knobs of :class:`~pipeline.config.Settings` (``max_live_streams``, ``live_*``)."""

    max_streams: int = 64
    max_streams_per_client: int = 8
    partial_interval_s: float = 0.4
    pause_s: float = 0.7
    max_utterance_s: float = 30.0
    idle_timeout_s: float = 30.0
    max_stream_s: float = 4 * 3600.0
    max_frame_bytes: int = 256 * 1024
    max_buffered_s: float = 60.0
    burst_s: float = 10.0  # audio a stream may send ahead of real time
    decode_timeout_s: float = 60.0  # a decode not answered by then: the workers are gone or hung
    latency_budget_s: float = 0.15  # re-decodes slower than this (recently): no new stream
    target_busy: float = 0.6  # partials thin out from half this busy share (and, capacity unknown, admission)
    capacity_share: float = 0.8  # admission fills the lane's measured capacity up to this share
    max_stream_wall_s: float = 4 * 3600.0  # a stream's time open, wall clock
    quiet_window_s: float = 60.0  # a stream's recent speech is measured over this
    quiet_share: float = 0.05  # under this share of speech: quiet (gives way when slots are full)
    client_prefix_v4: int = 32  # the per-client limit counts an IPv4 client by this network
    client_prefix_v6: int = 64

    @classmethod
    def from_settings(cls, settings) -> LiveLimits:
        return cls(max_streams=settings.live.max_streams,
                   max_streams_per_client=settings.live.max_streams_per_client,
                   partial_interval_s=settings.live.partial_interval_s,
                   pause_s=settings.live.pause_s, max_utterance_s=settings.live.max_utterance_s,
                   idle_timeout_s=settings.live.idle_timeout_s,
                   max_stream_s=settings.live.max_stream_s,
                   max_frame_bytes=settings.live.max_frame_bytes,
                   max_buffered_s=settings.live.max_buffered_s,
                   burst_s=settings.live.burst_s,
                   latency_budget_s=settings.live.latency_budget_s,
                   target_busy=settings.live.target_busy,
                   capacity_share=settings.live.capacity_share,
                   max_stream_wall_s=settings.live.max_stream_wall_s,
                   quiet_window_s=settings.live.quiet_window_s,
                   quiet_share=settings.live.quiet_share,
                   client_prefix_v4=settings.live.client_prefix_v4,
                   client_prefix_v6=settings.live.client_prefix_v6)

    @property
    def buffered_samples(self) -> int:
        """Audio a stream may hold (never less than an utterance plus 5 s: a stream must be able
        to finish the utterance it holds)."""
        return int(max(self.max_buffered_s, self.max_utterance_s + 5.0) * SAMPLE_RATE_HZ)


@dataclass(frozen=True)
class Caption:
    """A partial (the utterance in progress, provisional) or a final (the utterance, settled)."""

    final: bool
    start: float  # seconds from the stream's start
    end: float  # seconds
    raw_text: str  # what the model emitted, tags included
    text: str  # the plain text
    segments: tuple[Segment, ...]  # typed tags; times are the utterance's
    reason: str | None = None  # finals: "pause", "limit" (utterance length) or "end"
    interval: float | None = None  # partials: the cadence in use (s between re-decodes)

    @property
    def words(self) -> tuple[Word, ...]:
        return tuple(w for s in self.segments for w in s.words)


@dataclass
class LiveStats:
    """What one stream did (logged when it ends)."""

    audio_samples: int = 0
    partials: int = 0  # sent
    partials_dropped: int = 0  # decoded or queued, then overtaken by a final
    partials_unchanged: int = 0  # decoded, same text as the previous one: not sent
    finals: int = 0
    decode_s_max: float = 0.0
    opened_at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class _Job:
    kind: str  # "final" | "retract"
    generation: int
    start: int  # samples
    end: int
    reason: str | None = None


class AudioBuffer:
    """A stream's 16 kHz audio from ``base`` on (absolute sample positions). Appending never
    writes into samples already handed out as views (a full array is replaced, not grown in place,
    and trimming copies), so a view given to the worker stays valid and unchanged."""

    def __init__(self, capacity: int = 4 * SAMPLE_RATE_HZ):
        self._data = np.zeros(capacity, dtype=np.float32)
        self.base = 0  # absolute position of _data[0]
        self.end = 0  # absolute position after the last sample

    def append(self, x: np.ndarray) -> None:
        used, n = self.end - self.base, len(x)
        if used + n > len(self._data):
            grown = np.zeros(max(2 * len(self._data), used + n), dtype=np.float32)
            grown[:used] = self._data[:used]
            self._data = grown
        self._data[used:used + n] = x
        self.end += n

    def view(self, start: int, end: int) -> np.ndarray:
        return self._data[start - self.base:end - self.base]

    def trim(self, keep_from: int) -> None:
        """Forget audio before ``keep_from`` (in steps of TRIM_SLACK_S, copying what is kept)."""
        if keep_from - self.base < TRIM_SLACK_S * SAMPLE_RATE_HZ:
            return
        kept = self._data[keep_from - self.base:self.end - self.base]
        self._data = np.concatenate([kept, np.zeros(max(len(kept), 4 * SAMPLE_RATE_HZ), np.float32)])
        self.base = keep_from


class RealTimePace:
    """A stream's audio is taken at most at real time plus ``burst_s`` (issue 19: 8 senders of
    192 kHz noise as fast as accepted took a real-time stream's speech-end -> final from 0.4 to
    5.5 s). :meth:`admit` waits until a frame is due: the stream's socket is not read meanwhile,
    so a faster client is slowed by TCP back-pressure, and costs the server what a real-time one
    costs."""

    def __init__(self, sample_rate: int, burst_s: float, clock=time.monotonic):
        self.bytes_per_s = 2.0 * sample_rate  # s16le mono
        self.burst_s = burst_s
        self.clock = clock
        self.started = clock()
        self.received = 0  # bytes so far
        self.waited_s = 0.0  # how long this stream was held back in all

    def ahead_s(self, incoming: int = 0) -> float:
        """How far the stream (with ``incoming`` more bytes) is ahead of real time plus the burst."""
        sent_s = (self.received + incoming) / self.bytes_per_s
        return sent_s - (self.clock() - self.started) - self.burst_s

    async def admit(self, n: int) -> None:
        wait = self.ahead_s(n)
        if wait > 0:
            self.waited_s += wait
            await asyncio.sleep(wait)
        self.received += n


class SpeechMeter:
    """The speech a stream sent over the last ``window_s`` of wall clock (seconds of audio its
    speech detector scored as voiced), kept in buckets of a second: a few dozen numbers a stream
    whatever its frame rate."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self._buckets: deque[list[float]] = deque()  # [second, voiced seconds]

    def add(self, voiced_s: float, now: float) -> None:
        second = math.floor(now)
        if self._buckets and self._buckets[-1][0] == second:
            self._buckets[-1][1] += voiced_s
        else:
            self._buckets.append([second, voiced_s])
        self._forget(now)

    def voiced(self, now: float) -> float:
        self._forget(now)
        return sum(v for _, v in self._buckets)

    def _forget(self, now: float) -> None:
        while self._buckets and self._buckets[0][0] + 1 <= now - self.window_s:
            self._buckets.popleft()


def _span(seconds: float) -> str:
    """A duration for a person: '4 h', '90 min', '45 s'."""
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _seconds(samples: int) -> float:
    return round(samples / SAMPLE_RATE_HZ, 3)


class LiveSession:
    """One live stream (see the module docstring). Driven from one event loop: :meth:`feed` per
    binary frame, then :meth:`end`; or :meth:`abort`. ``failed`` resolves with the error that ended
    the stream early (a decode, the readiness of the model, or ``emit`` itself)."""

    def __init__(self, hub: LiveHub, options: TranscribeOptions, sample_rate: int,
                 emit: Callable[[Caption], Awaitable[None]], client: str = ""):
        self.hub = hub
        self.limits = hub.limits
        self.client = client  # the per-client limit's key (client_key)
        loop = asyncio.get_running_loop()
        self.opened = loop.time()  # the loop's clock (asyncio.timeout_at's)
        self.deadline = self.opened + self.limits.max_stream_wall_s
        self.speech = SpeechMeter(self.limits.quiet_window_s)
        self._stop: SenseVoiceError | None = None  # why the route should finalise and end it
        self.on_stop: Callable[[], None] | None = None  # the route's wake-up while it waits
        self.options = options
        self.partial_options = replace(options, word_timestamps=False)
        self.emit = emit
        self.audio = StreamAudio(sample_rate)
        self._min_feed = max(2, int(MIN_FEED_S * sample_rate) * 2)  # bytes
        self._gathered = bytearray()  # short frames not yet handed to the scorer
        self._measured = False  # a decode of this stream has come back (LaneLoad.measured)
        self.load_token = 0  # its place among the lane's new streams (set by the hub)
        self.buffer = AudioBuffer()
        self.endpointer = Endpointer(hub.rules, self._quietest)
        self.stats = LiveStats()
        self._queue: deque[_Job] = deque()  # finals (and retractions) to run, in order
        self._generation = 0  # the utterance in progress; bumped when it closes or is dropped
        self._partial_started = -math.inf  # loop time the latest partial decode started
        self._partial_upto = 0  # where the latest partial's audio ended
        self._last_partial: str | None = None  # raw text of the latest partial sent (this utterance)
        self._inflight = None  # (kind, concurrent future) of the decode running
        self._wake = asyncio.Event()  # new audio, a final queued, the end
        self._progress = asyncio.Event()  # a final decoded (held audio shrank)
        self._ending = False
        self.pace = RealTimePace(sample_rate, self.limits.burst_s)
        self.failed: asyncio.Future = asyncio.get_running_loop().create_future()
        self._driver = asyncio.create_task(self._drive(), name="sensevoice-live-driver")

    # ------------------------------------------------------------------ audio in
    async def feed(self, data: bytes) -> None:
        """One binary frame of s16le PCM (any length). Frames shorter than MIN_FEED_S are
        gathered first: a client sending tiny frames costs the speech scorer no more calls."""
        self._check()
        await self.pace.admit(len(data))  # never faster than real time plus the burst
        if len(self._gathered) + len(data) < self._min_feed:
            self._gathered += data
            return
        data, self._gathered = bytes(self._gathered) + data, bytearray()
        scored = await asyncio.wrap_future(self.hub.scorer.score(self.audio, data))
        self._take(scored)
        if self.buffer.end > self.limits.max_stream_s * SAMPLE_RATE_HZ:
            raise StreamTooLong(f"a live stream may send at most {self.limits.max_stream_s:g} s "
                                "of audio; start a new stream")
        await self._hold_back()

    async def end(self) -> None:
        """The client stopped: close every utterance, wait until each final is emitted."""
        self._check()
        data, self._gathered = bytes(self._gathered), bytearray()
        scored = await asyncio.wrap_future(self.hub.scorer.score(self.audio, data, flush=True))
        self._take(scored)
        for event in self.endpointer.finish(self.buffer.end):
            self._on_event(event)
        self._ending = True
        self._wake.set()
        await asyncio.wait({self._driver})
        self._check()

    def cut(self) -> bool:
        """Close the utterance in progress where the audio scored so far ends, as the stream's
        end would (its final, reason "end", is queued behind those before it), and go on: the
        client said its turn is over (OpenAI's ``input_audio_buffer.commit``). False: no speech
        was in progress (a region too short to be speech is dropped, as at the end)."""
        self._check()
        events = self.endpointer.finish(self.endpointer.position)
        for event in events:
            self._on_event(event)
        return any(isinstance(e, Closed) for e in events)

    def stop(self, error: SenseVoiceError) -> None:
        """Ask the route to finalise what arrived and end the stream with ``error`` (it wakes a
        route waiting for the client at once: :attr:`on_stop`)."""
        if self._stop is None:
            self._stop = error
        if self.on_stop is not None:
            self.on_stop()

    def stop_due(self, now: float) -> SenseVoiceError | None:
        """Why the stream must end now (asked to stop, or past its time open), or None."""
        if self._stop is None and now >= self.deadline:
            self._stop = StreamTimeLimit(
                f"a live stream may stay open at most {_span(self.limits.max_stream_wall_s)}; "
                "start a new stream")
        return self._stop

    def quiet(self, now: float) -> float | None:
        """The speech sent over the quiet window when it is under the quiet share (the stream
        old enough to judge, not asked to stop already), else None."""
        window = self.limits.quiet_window_s
        if self._stop is not None or self.failed.done() or now - self.opened < window:
            return None
        voiced = self.speech.voiced(now)
        return voiced if voiced < self.limits.quiet_share * window else None

    def abort(self) -> None:
        """Stop now (the client left, or the route gave up): nothing more is decoded or emitted."""
        self._driver.cancel()
        if self._inflight is not None:
            self._inflight[1].cancel()

    def settle(self) -> None:
        """This stream's load is measured (its first decode came back, or it ended): it no longer
        counts among the new streams that hold admission back."""
        if not self._measured:
            self._measured = True
            self.hub.load.measured(self.load_token)

    def _check(self) -> None:
        if self.failed.done():
            raise self.failed.result()

    def _take(self, scored) -> None:
        self.buffer.append(scored.samples)
        self.stats.audio_samples += len(scored.samples)
        voiced = int(np.count_nonzero(scored.probs >= self.hub.rules.threshold))
        self.speech.add(voiced * WINDOW / SAMPLE_RATE_HZ, asyncio.get_running_loop().time())
        self.hub.admission.voiced(voiced * WINDOW / SAMPLE_RATE_HZ)
        for event in self.endpointer.push(scored.probs):
            self._on_event(event)
        if self.endpointer.triggered:
            self._wake.set()  # a partial may be due
        self.buffer.trim(self._keep_from())  # a stream of silence holds no audio

    def _on_event(self, event: Closed | Dropped) -> None:
        if isinstance(event, Closed):
            self._queue.append(_Job("final", self._generation, event.start, event.end, event.reason))
            if self._inflight is not None and self._inflight[0] == "partial":
                # still queued: withdrawn; running: no longer awaited (the final is queued now,
                # ahead of every partial, not after that partial's batch comes back)
                self._inflight[1].cancel()
                self._inflight[2].cancel()
        elif self._last_partial is not None:  # a partial of it was shown: take it back
            self._queue.append(_Job("retract", self._generation, event.start, event.start))
        self._generation += 1
        self._last_partial = None
        self._partial_upto = 0
        self._wake.set()

    def _quietest(self, lo: int, hi: int) -> int:
        base = self.buffer.base
        return base + quietest_point(self.buffer.view(base, self.buffer.end), lo - base, hi - base)

    def _keep_from(self) -> int:
        """The earliest sample still needed: a final not yet decoded, the utterance in progress,
        or the padding an utterance starting now would take."""
        keep = max(0, self.endpointer.position - self.hub.rules.pad - WINDOW)
        if self.endpointer.start is not None:
            keep = min(keep, self.endpointer.start)
        for job in self._queue:
            keep = min(keep, job.start)
        return keep

    def held_samples(self) -> int:
        return self.buffer.end - self._keep_from()

    async def _hold_back(self) -> None:
        """Wait while the stream holds more audio than it may (its finals are behind)."""
        cap = self.limits.buffered_samples
        if self.held_samples() <= cap:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.idle_timeout_s
        while self.held_samples() > cap:
            self._check()
            self._progress.clear()
            try:
                await asyncio.wait_for(self._progress.wait(), max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise LiveOverloaded(
                    "the server has not kept up with this stream for "
                    f"{self.limits.idle_timeout_s:g} s "
                    f"({self.held_samples() / SAMPLE_RATE_HZ:.0f} s of audio wait for the model); "
                    "try again later", retry_after=5) from None

    # ------------------------------------------------------------------ decodes
    async def _drive(self) -> None:
        try:
            while True:
                self._wake.clear()
                if self._queue:
                    await self._run(self._queue.popleft())
                    self.buffer.trim(self._keep_from())
                    self._progress.set()
                    continue
                if self._ending:
                    return
                wait = self._partial_due_in()
                if wait == 0.0:
                    await self._run_partial()
                    continue
                try:
                    await asyncio.wait_for(self._wake.wait(), wait)
                except TimeoutError:
                    pass
        except asyncio.CancelledError:
            raise
        except SenseVoiceError as e:
            self._fail(e)
        except Exception as e:  # emit could not send (the client left), or a bug
            if not isinstance(e, ConnectionError):
                logger.debug("live stream driver stopped: %r", e)
            self._fail(e)

    def _fail(self, e: BaseException) -> None:
        if not self.failed.done():
            self.failed.set_result(e)
        self._progress.set()  # a feed waiting for room learns it at once

    def _partial_due_in(self) -> float | None:
        """0 when a partial should start now; else seconds until one may (None: on new audio)."""
        ep = self.endpointer
        if ep.start is None or not ep.triggered or self.buffer.end - self._partial_upto < WINDOW:
            return None
        if 0 < ep.temp_end <= self._partial_upto:  # nothing voiced since the latest partial
            return None
        now = asyncio.get_running_loop().time()
        # until the utterance shows a first partial, the configured interval: a stretch delays
        # only the partials after it
        every = self.limits.partial_interval_s if self._last_partial is None else self.hub.load.cadence()
        left = self._partial_started + every - now
        return 0.0 if left <= 0 else left

    async def _run_partial(self) -> None:
        start, end, generation = self.endpointer.start, self.buffer.end, self._generation
        self._partial_started = asyncio.get_running_loop().time()
        self._partial_upto = end
        # the utterance's first caption is as urgent as a final (what a person waits for is the
        # caption appearing; the partials after it only refine it): it goes ahead of partials
        out = await self._decode(start, end, self.partial_options, "partial",
                                 urgent=self._last_partial is None)
        if out is None or generation != self._generation:
            self.stats.partials_dropped += 1
            self.hub.metrics.partials_dropped.inc()
            return
        caption = replace(self._caption(out, start, end, final=False),
                          interval=round(self.hub.load.cadence(), 3))
        if out.raw_text == self._last_partial or (self._last_partial is None and not caption.text):
            self.stats.partials_unchanged += 1
            return
        self._last_partial = out.raw_text
        await self.emit(caption)
        self.stats.partials += 1
        self.hub.metrics.captions.labels("partial").inc()

    async def _run(self, job: _Job) -> None:
        if job.kind == "retract":  # the utterance shown was too short to be speech
            await self.emit(Caption(False, _seconds(job.start), _seconds(job.start), "", "", ()))
            return
        out = await self._decode(job.start, job.end, self.options, "final")
        if out is None:  # cancelled by abort()
            raise asyncio.CancelledError
        await self.emit(self._caption(out, job.start, job.end, final=True, reason=job.reason))
        self.stats.finals += 1
        self.hub.metrics.captions.labels("final").inc()

    async def _decode(self, start: int, end: int, options: TranscribeOptions, kind: str,
                      urgent: bool = False):
        """The engine's output for ``[start, end)``; None when the decode was withdrawn.
        ``urgent`` (an utterance's first partial) is queued as a final is."""
        wave = torch.from_numpy(self.buffer.view(start, end))
        # NotReady: the stream ends; a final (and an utterance's first partial) goes ahead of
        # every other partial (final=True)
        future = self.hub.decode(wave, options, final=True) if kind == "final" or urgent \
            else self.hub.decode(wave, options)
        t0 = time.monotonic()
        self.hub.admission.decoded()
        waiter = asyncio.wrap_future(future)
        self._inflight = (kind, future, waiter)
        self.hub.load.begin()
        try:
            await asyncio.wait({waiter}, timeout=self.limits.decode_timeout_s)
        finally:
            self.hub.load.end()
            self._inflight = None
            if not waiter.done():  # cancelled, or no answer: withdraw the decode
                future.cancel()
        if not waiter.done():
            raise NotReady(f"the model has not answered this stream for "
                           f"{self.limits.decode_timeout_s:g} s; try again later")
        if waiter.cancelled():
            return None
        if waiter.exception() is not None:
            e = waiter.exception()
            if isinstance(e, (LiveWorkerLost, BrokerUnavailable)):  # the lane failed, not the audio
                raise e
            raise LiveDecodeFailed(f"the model failed on this stream's audio: {e}") from e
        seconds = time.monotonic() - t0
        self.hub.load.observe(seconds)
        self.settle()
        self.stats.decode_s_max = max(self.stats.decode_s_max, seconds)
        self.hub.metrics.decode_seconds.labels(kind).observe(seconds)
        return waiter.result()

    def _caption(self, out, start: int, end: int, final: bool, reason: str | None = None) -> Caption:
        t0, t1 = _seconds(start), _seconds(end)
        words = tuple(replace(w, start=round(w.start + t0, 3), end=round(w.end + t0, 3))
                      for w in out.words)
        raw = out.raw_text
        if self.options.redact:  # a partial may end inside an item: its digit runs masked early
            masked = redact_rich(raw, words, self.options.redact, span=(t0, t1), eager=not final)
            raw, words = masked.raw_text, masked.words
        segments = tuple(replace(s, start=t0, end=t1, words=words if k == 0 else ())
                         for k, s in enumerate(parse_rich_text(raw)))
        text = " ".join(s.text for s in segments if s.text)
        return Caption(final, t0, t1, raw, text, segments, reason)


REFUSAL_CODES = (TooManyStreams.code, LiveAtCapacity.code, NotReady.code)  # why a stream is refused a slot


class LaneLoad:
    """The live lane's load as its streams measure it, and what follows from it.

    * ``latency()``: how long re-decodes take now (queue + batch + compute), a time-decayed
      average (half-life ``HALF_LIFE_S``: it falls back to zero when the lane goes quiet);
    * ``busy()``: the share of time the model computes (``busy_seconds``: its workers' batches,
      or in an api process of the distributed topology what the worker processes report; without
      it, the share of time a re-decode of this process's streams is in hand), an exponential
      average over ``BUSY_TAU_S``. (The time in hand overstated it: on the CPU with 10 streams
      their re-decodes of ~8 ms were in hand ~40 ms each, the rest being hand-overs between
      threads; on the H200 it was near 1 from a few dozen streams);
    * ``stream_cost()``: the lane's busy share per stream, learned from the open streams, each
      weighed by the share of its load it brings by now (a stream's load builds up over its
      first ``RAMP_S``: its speech begins, its utterances grow); it rises fast, follows the
      lane down while the lane is busy (``LEARN_BUSY``: batching makes a stream cheaper as
      streams are added), and in a lull is forgotten only with a half-life of
      ``COST_HALF_LIFE_S``, so a lull does not make room that the streams open will want back;
    * ``cadence()``: how often a stream re-decodes its utterance in progress -- the configured
      interval while the lane is under half its limits (half the latency budget, half the busy
      target), stretched from there in proportion up to ``MAX_STRETCH`` times at them (and never
      under twice the latency: each stream asks for at most half of the lane's time); an
      utterance's first partial keeps the configured interval (the stretch thins the partials
      after it); finals are never delayed (they go first, whatever the cadence);
    * ``refusal(open)``: why a new stream must wait (None: admit it) -- the lane over its latency
      budget; the load predicted with one more stream over ``TARGET_BUSY`` (the busy share now,
      plus the learned cost of the load the young streams have still to bring: issue
      22 measured that admission reading the latency alone let in streams whose load came
      seconds later, 50 of 96 offered at 3.4 s first-partial p95); or too many streams admitted
      in the last ``NEW_WINDOW_S`` whose load has not been measured yet (no decode of theirs has
      come back): at most ``NEW_STREAMS`` plus half the others times the latency headroom
      (1 - latency / budget), so a burst never gets in before its load has been seen. The hub
      calls ``admitted()`` for each stream it lets in (a token), ``measured(token)`` once, at its
      first decode or at its end without one, and ``ended(token)`` at its end; each session
      calls ``begin()`` and ``end()`` around each re-decode it waits for."""

    HALF_LIFE_S = 2.0
    MAX_STRETCH = 4.0
    NEW_STREAMS = 4  # streams admitted before any load is measured
    NEW_WINDOW_S = 3.0  # a stream admitted longer ago counts as measured (silent: no load)
    BUSY_TAU_S = 3.0  # time constant of the busy share's average
    RAMP_S = 4.0  # a stream younger than this has not brought its whole load yet
    COST_HALF_LIFE_S = 15.0  # how slowly a learned per-stream cost is forgotten in a lull
    LEARN_BUSY = 0.2  # from this busy share the learned cost follows the lane down as well as up
    FAST_TAU_S = 0.5  # the busy share's fast average: under the slow one, the lane is easing off
    TARGET_BUSY = 0.6  # default: the lane busy at most this share with every open stream's load
    MIN_SAMPLE_S = 0.05  # the model's compute is read at most this often

    def __init__(self, interval_s: float, budget_s: float, clock: Callable[[], float] = time.monotonic,
                 busy_seconds: Callable[[], float] | None = None, target_busy: float = TARGET_BUSY):
        self.interval_s, self.budget_s, self.clock = interval_s, budget_s, clock
        self.TARGET_BUSY = target_busy  # this lane's (Settings.live.target_busy)
        self.busy_seconds = busy_seconds  # the model's compute so far, where this process has it
        self._computed = busy_seconds() if busy_seconds is not None else 0.0
        self._latency = 0.0
        self._at = clock()
        self._new: dict[int, float] = {}  # token -> when admitted: load not measured yet
        self._open: dict[int, float] = {}  # token -> when admitted: every stream not ended
        self._tokens = 0
        self._busy, self._busy_at, self._outstanding = 0.0, self._at, 0
        self._fast = 0.0  # the busy share over the last ~FAST_TAU_S
        self._cost, self._cost_at = 0.0, self._at
        self._carried = 0.0  # the streams' ramped count, averaged as the busy share is

    def observe(self, seconds: float) -> None:
        """One re-decode took ``seconds``."""
        now = self.clock()
        decay = 0.5 ** ((now - self._at) / self.HALF_LIFE_S)
        self._latency = max(seconds, self._latency * decay) if seconds > self._latency * decay \
            else 0.8 * self._latency * decay + 0.2 * seconds  # rises at once, falls smoothly
        self._at = now

    def latency(self) -> float:
        return self._latency * 0.5 ** ((self.clock() - self._at) / self.HALF_LIFE_S)

    # ------------------------------------------------------------------ busy share, cost
    def _advance(self) -> float:
        """Bring the busy share and the load the streams carry (each weighed by its ramp,
        averaged the same way, so that their ratio is a stream's cost even while streams come
        and go) up to now."""
        now = self.clock()
        dt = now - self._busy_at
        if self.busy_seconds is None:  # a re-decode in hand or not, over dt
            held = 1.0 if self._outstanding > 0 else 0.0
        elif dt < self.MIN_SAMPLE_S:
            return now
        else:  # the model's compute over dt
            computed = self.busy_seconds()
            held, self._computed = min((computed - self._computed) / dt, 1.0), computed
        keep = math.exp(-dt / self.BUSY_TAU_S)
        carried = sum(self._ramp(now - at) for at in self._open.values())
        self._busy = held + (self._busy - held) * keep
        self._fast = held + (self._fast - held) * math.exp(-dt / self.FAST_TAU_S)
        self._carried = carried + (self._carried - carried) * keep
        self._busy_at = now
        return now

    def begin(self) -> None:
        """A re-decode was submitted."""
        self._advance()
        self._outstanding += 1

    def end(self) -> None:
        """A re-decode was answered (or withdrawn, or given up)."""
        now = self._advance()
        self._outstanding = max(self._outstanding - 1, 0)
        if self._carried >= 1.0:
            cost, known = self._busy / self._carried, self.stream_cost()
            # rises fast (half way at each sample), falls at its half-life -- and follows the
            # lane down too while it is busy enough to show its load (>= LEARN_BUSY): a batch of
            # many streams costs less a stream than one of few, so the cost the first streams
            # taught held later ones out (at 15 open on two cores it predicted 63 % busy; the
            # lane settled at 0.018 a stream, half the first figure). In a lull (the lane's
            # last half second under its 3 s average or under LEARN_BUSY) it only fades: the
            # streams open will speak again.
            rising = self._fast >= max(self._busy, self.LEARN_BUSY)  # busy, and not easing off
            if cost > known or rising:
                self._cost, self._cost_at = 0.5 * (known + cost), now

    def _ramp(self, age: float) -> float:
        """The share of its load a stream of this age brings (grows over ``RAMP_S``)."""
        return min(max(age / self.RAMP_S, 0.0), 1.0)

    def busy(self) -> float:
        self._advance()
        return self._busy

    def stream_cost(self) -> float:
        """The lane's busy share one stream brings (0: not learned yet)."""
        return self._cost * 0.5 ** ((self.clock() - self._cost_at) / self.COST_HALF_LIFE_S)

    def predicted(self) -> float:
        """The busy share expected once every open stream and one more bring their load."""
        cost, now = self.stream_cost(), self.clock()
        coming = sum(1.0 - self._ramp(now - at) for at in self._open.values())
        return self.busy() + cost * (coming + 1.0)

    # ------------------------------------------------------------------ cadence, admission
    def cadence(self) -> float:
        """The configured interval up to half the budget (and half the busy target); from there
        stretched in proportion, to ``MAX_STRETCH`` times at it (fewer partials make room before
        the lane is full, not after); never under twice the latency (half the lane per stream)."""
        fill = max(self.latency() / self.budget_s, self.busy() / self.TARGET_BUSY)
        over_half = min(max(fill - 0.5, 0.0) / 0.5, 1.0)
        stretched = self.interval_s * (1.0 + (self.MAX_STRETCH - 1.0) * over_half)
        return min(max(stretched, 2.0 * self.latency()), self.MAX_STRETCH * self.interval_s)

    def refusal(self, open_streams: int) -> str | None:
        latency = self.latency()
        if latency > self.budget_s:
            return (f"live captions are at capacity: re-decodes take {latency * 1e3:.0f} ms now, "
                    f"over the {self.budget_s * 1e3:.0f} ms they are kept under; try again in a few "
                    "seconds")
        predicted = self.predicted()
        if predicted > self.TARGET_BUSY:
            return (f"live captions are at capacity: the {len(self._open)} streams open are "
                    f"expected to keep the model {min(predicted, 9.99) * 100:.0f} % busy, over the "
                    f"{self.TARGET_BUSY * 100:.0f} % it is kept under; try again in a few seconds")
        new = self.new()
        measured = max(open_streams - new, 0)
        if new >= self.NEW_STREAMS + 0.5 * measured * (1.0 - latency / self.budget_s):
            return ("live streams are arriving faster than they can be taken on; try again in a "
                    "few seconds")
        return None

    def new(self) -> int:
        """Streams admitted within ``NEW_WINDOW_S`` whose load is not measured yet."""
        since = self.clock() - self.NEW_WINDOW_S
        for token in [t for t, at in self._new.items() if at < since]:
            del self._new[token]
        return len(self._new)

    def admitted(self) -> int:
        self._tokens += 1
        self._new[self._tokens] = self._open[self._tokens] = self.clock()
        return self._tokens

    def measured(self, token: int) -> None:
        self._new.pop(token, None)

    def ended(self, token: int) -> None:
        self._new.pop(token, None)
        self._open.pop(token, None)


class LaneCapacity(Protocol):
    """Where live admission reads what the lane has left (issue 38): this process's workers'
    measured batches (:class:`~pipeline.serving.admission.LocalLaneCapacity`), or the worker
    processes' reports through the broker, with the other api processes' demand beside them
    (:class:`~pipeline.serving.live_redis.ClusterCapacity`)."""

    shared: bool  # other api processes admit against the same workers (reserve asks the broker)

    def rate(self, budget_s: float) -> float | None: ...  # re-decodes/s within the budget
    def queue_age(self) -> float: ...  # how long re-decodes wait for their batch, recently
    def others(self) -> float: ...  # re-decodes/s the other api processes' streams ask
    def reserve(self, demand: float, limit: float) -> bool: ...  # blocking where shared
    def publish(self, demand: float) -> None: ...  # this process's streams' demand, re-decodes/s


class LiveMetrics:
    """The live series, in the service's registry (``/metrics``)."""

    def __init__(self, registry=None):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = registry if registry is not None else CollectorRegistry()
        self.streams = Gauge("sensevoice_live_streams", "Live caption streams open.", registry=r)
        self.captions = Counter("sensevoice_live_captions_total",
                                "Captions sent to live streams, by kind (partial, final).",
                                ("kind",), registry=r)
        self.partials_dropped = Counter(
            "sensevoice_live_partials_dropped_total",
            "Partial re-decodes withdrawn or discarded because a final overtook them.", registry=r)
        self.ended = Counter("sensevoice_live_streams_ended_total",
                             "Live streams ended, by how (ok, or the error code).", ("code",),
                             registry=r)
        self.decode_seconds = Histogram("sensevoice_live_decode_seconds",
                                        "Live re-decodes from queueing to output, by kind.",
                                        ("kind",), buckets=DECODE_BUCKETS, registry=r)
        self.audio = Counter("sensevoice_live_audio_seconds_total",
                             "Audio seconds received by live streams.", registry=r)
        self.admitted = Counter("sensevoice_live_streams_admitted_total",
                                "Live streams given a slot (the model decodes them).", registry=r)
        self.refused = Counter("sensevoice_live_streams_refused_total",
                               "Live streams refused a slot, by error code (too_many_streams: "
                               "full; not_ready: no model here or not loaded).", ("code",),
                               registry=r)
        for code in REFUSAL_CODES:  # from zero: rate() sees the first refusal
            self.refused.labels(code)
        self.cadence = Gauge("sensevoice_live_partial_interval_seconds",
                             "How often a live stream re-decodes its utterance in progress now "
                             "(stretched from live_partial_interval_s while the lane is busy).",
                             registry=r)
        self.latency = Gauge("sensevoice_live_decode_latency_seconds",
                             "Recent live re-decode latency (time-decayed average): over "
                             "live_latency_budget_s, new streams are refused.", registry=r)
        self.busy = Gauge("sensevoice_live_lane_busy_ratio",
                          "Share of time the live lane's model computes, as live admission reads "
                          "it (exponential average over 3 s).", registry=r)
        self.stream_cost = Gauge("sensevoice_live_stream_cost_ratio",
                                 "The live lane's busy share one stream brings, as learned: new "
                                 "streams are refused once the open ones would take it past "
                                 "live_target_busy (0.6 by default).", registry=r)
        self.capacity = Gauge("sensevoice_live_capacity_per_second",
                              "Re-decodes per second the live lane's workers can batch within "
                              "live_latency_budget_s, as measured from their batches (0: not "
                              "measured yet).", registry=r)
        self.demand = Gauge("sensevoice_live_demand_per_second",
                            "Re-decodes per second this process's open live streams are expected "
                            "to ask (their speech times the learned cost per voiced second).",
                            registry=r)


class LiveHub:
    """The live streams of one process: their limit, the shared speech scorer, the endpointing
    rules and the metrics. Only touched on the event loop."""

    def __init__(self, settings, decode: LiveDecode | None, health, *, registry=None,
                 speech_device: str = "cpu", limits: LiveLimits | None = None,
                 scorer: StreamScorer | None = None,
                 busy_seconds: Callable[[], float] | None = None,
                 capacity: LaneCapacity | None = None,
                 clock: Callable[[], float] = time.monotonic):
        """``busy_seconds``: the seconds the model has computed so far (this process's workers, or
        in an api process of the distributed topology the worker processes' reports), where the
        lane's busy share is read; None: the share of time a re-decode of its streams is in hand.
        ``capacity``: what the lane has left (:class:`LaneCapacity`); admission refuses a stream
        once the open ones would ask more than ``capacity_share`` of it. None, or not measured
        yet: the busy share and the guard for young streams hold admission (:class:`LaneLoad`),
        and the lane is probed (:meth:`_probe`). ``clock``: the probe's (a test's fake one)."""
        self.settings = settings
        self.clock = clock
        self._probed_at = -math.inf
        self.decode = decode  # the live lane (None: this process holds no model)
        self.health = health  # .not_serving(): why the model cannot serve now, or None
        self.limits = limits or LiveLimits.from_settings(settings)
        self.scorer = scorer or StreamScorer.shared(device=speech_device)
        self.rules = EndpointRules.of(Segmenter(max_segment_s=self.limits.max_utterance_s),
                                      self.limits.pause_s, self.limits.max_utterance_s)
        self.open = 0
        self._by_client: dict[str, int] = {}  # client key -> its open streams
        self._sessions: set[LiveSession] = set()  # open
        self._yielding: set[LiveSession] = set()  # asked to give way: no longer hold a slot
        self.metrics = LiveMetrics(registry)
        self.load = LaneLoad(self.limits.partial_interval_s, self.limits.latency_budget_s,
                             busy_seconds=busy_seconds, target_busy=self.limits.target_busy)
        self.metrics.cadence.set_function(self.load.cadence)
        self.metrics.latency.set_function(self.load.latency)
        self.metrics.busy.set_function(self.load.busy)
        self.metrics.stream_cost.set_function(self.load.stream_cost)
        self.capacity = capacity
        self.admission = LiveAdmission(self.limits.partial_interval_s, self.limits.latency_budget_s,
                                       self.limits.capacity_share, self.limits.quiet_window_s)
        self.metrics.capacity.set_function(lambda: self._rate() or 0.0)
        self.metrics.demand.set_function(lambda: self.admission.demand(self.stream_loads()))
        self._reserving = asyncio.Lock()  # a shared lane's reservations, one at a time here
        self._publisher: asyncio.Task | None = None

    def check_ready(self) -> None:
        """NotReady unless this process can decode live audio now."""
        if self.decode is None:
            raise NotReady("live captions need a process that holds the model (role all) or a "
                           "shared broker with workers (role api with --broker redis://...)")
        reason = self.health.not_serving()
        if reason is not None:
            raise NotReady(reason)

    def client_key(self, address: str) -> str:
        """What the per-client limit counts ``address`` as (the address, or its network)."""
        return client_key(address, self.limits.client_prefix_v4, self.limits.client_prefix_v6)

    def _admit(self, client: str) -> int:
        """The streams ``client`` (a client key) holds; TooManyStreams or NotReady if it may not
        open one. Every slot held: the quietest stream gives way (see the module docstring)."""
        if self.limits.max_streams <= 0:
            raise TooManyStreams("live captions are off on this server (max_live_streams is 0)")
        victim = None
        if self.open - len(self._yielding) >= self.limits.max_streams:
            victim = self._quietest()
            if victim is None:
                raise TooManyStreams(f"{self.open} live streams are open, the most this server "
                                     "serves at once; try again in a few seconds")
        held = self._by_client.get(client, 0)
        if client and 0 < self.limits.max_streams_per_client <= held:
            what = "address" if "/" not in client else f"network ({client})"
            raise TooManyStreams(f"this {what} holds {held} live streams, the most one client may "
                                 "open at once; close one first")
        self.check_ready()
        reason = self.refusal()
        if reason is not None:  # which rule refused, for whoever tunes them (docs/BENCHMARKS.md)
            logger.info("live stream refused with %d open: %s", self.open, reason)
            raise LiveAtCapacity(reason)
        if victim is not None:
            self._give_way(victim)
        return held

    def _rate(self) -> float | None:
        return None if self.capacity is None else self.capacity.rate(self.limits.latency_budget_s)

    PROBE_SIZE = 8  # re-decodes in a cold lane's probe (one batch where the lane batches them:
    # the sizes a lane runs under many streams; on a CPU a batch of 4 cost more a re-decode)
    PROBE_AUDIO_S = 1.5  # each as long as an utterance in progress (on this CPU under a load of
    # 16 a probe of 16 x 2 s held the lane ~3 s in the way of the first streams' re-decodes)
    PROBE_EVERY_S = 5.0  # a probe whose figure has not come (a worker's next report) is sent again

    def _probe(self) -> None:
        """The lane has no figure yet (no live batch since the process started, or none that
        the workers report): time one batch of ``PROBE_SIZE`` re-decodes of ``PROBE_AUDIO_S``
        through the live lane, as any stream's go (queue, batch, reply; in the distributed
        topology through the broker to a worker, whose next report carries it). Its figure is
        the lane's under the load the machine has when streams come -- not an idle lane's at
        start-up -- and the streams' own batches replace it from their first re-decode
        (:meth:`BatchProfile.points`). Until it comes the guard for young streams admits."""
        now = self.clock()
        if self.decode is None or self.capacity is None or now - self._probed_at < self.PROBE_EVERY_S:
            return
        self._probed_at = now
        n = int(self.PROBE_AUDIO_S * SAMPLE_RATE_HZ)
        wave = torch.randn(n, generator=torch.Generator().manual_seed(38)) * 0.05
        for _ in range(self.PROBE_SIZE):
            try:
                self.decode(wave, TranscribeOptions())  # its answer is not read: the worker timed the batch
            except SenseVoiceError as e:
                logger.info("live lane probe not sent: %s", e)
                return
        logger.info("live lane has no measured capacity yet: probing it with %d re-decodes of "
                    "%g s", self.PROBE_SIZE, self.PROBE_AUDIO_S)

    def stream_loads(self) -> list[StreamLoad]:
        """The streams holding a slot, as admission weighs them (age, recent speech)."""
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # a metrics read from another thread: the loop's clock is this one
            now = time.monotonic()
        return [StreamLoad(now - s.opened, s.speech.voiced(now))
                for s in list(self._sessions) if s not in self._yielding]

    def refusal(self) -> str | None:
        """Why a new stream must wait now, or None. The lane over its latency budget; else, with
        its capacity measured, the open streams' demand (and the other api processes') with one
        more over ``capacity_share`` of it (:class:`~pipeline.serving.admission.LiveAdmission`);
        before that, the busy share and the guard for young streams (:meth:`LaneLoad.refusal`)."""
        rate = self._rate()
        if rate is None:
            self._probe()
            return self.load.refusal(self.open - len(self._yielding))
        latency = self.load.latency()
        if latency > self.limits.latency_budget_s:
            return self.load.refusal(self.open - len(self._yielding))  # its budget message
        streams = self.stream_loads()
        others = self.capacity.others()
        room = self.admission.room(rate, streams, self.capacity.queue_age(), others)
        if room:
            return None
        return (f"live captions are at capacity: the {len(streams)} streams open here ask "
                f"{self.admission.demand(streams):.0f} re-decodes/s"
                + (f" (other api processes' streams {others:.0f})" if others else "")
                + f" of the {rate:.0f} the lane batches within its "
                f"{self.limits.latency_budget_s * 1e3:.0f} ms budget (filled to "
                f"{self.limits.capacity_share * 100:.0f} %); try again in a few seconds")

    async def _reserve(self) -> None:
        """A shared lane (several api processes): this process's demand with the new stream is
        recorded in the broker only while every api process's together stays within the share of
        the workers' capacity (atomically there), so N api processes cannot together over-admit."""
        cap = self.capacity
        rate = self._rate()
        if cap is None or not cap.shared or rate is None:
            return
        async with self._reserving:
            streams = self.stream_loads()
            need = self.admission.demand(streams) + self.admission.stream_cost(streams)
            limit = self.limits.capacity_share * rate
            if not await asyncio.to_thread(cap.reserve, need, limit):
                raise LiveAtCapacity(
                    f"live captions are at capacity: the api processes' streams together would "
                    f"ask over {limit:.0f} re-decodes/s, the share of the {rate:.0f} the workers "
                    "batch within the budget; try again in a few seconds")
        if self._publisher is None or self._publisher.done():
            self._publisher = asyncio.create_task(self._publish(), name="sensevoice-live-demand")

    async def _publish(self) -> None:
        """Tell a shared lane this process's demand as its streams speak, end and come."""
        while True:
            self.capacity.publish(self.admission.demand(self.stream_loads()) if self.open else 0.0)
            if not self.open:
                return
            await asyncio.sleep(self.PUBLISH_EVERY_S)

    PUBLISH_EVERY_S = 0.5

    def _quietest(self) -> LiveSession | None:
        """The stream to give way to a new one: quiet (LiveSession.quiet), of the client holding
        the most streams, then the one that spoke least, then the oldest. None: no stream is."""
        if self.limits.quiet_share <= 0:
            return None
        now = asyncio.get_running_loop().time()
        best, best_rank = None, None
        for session in self._sessions:
            if session in self._yielding:
                continue
            voiced = session.quiet(now)
            if voiced is None:
                continue
            rank = (-self._by_client.get(session.client, 0), voiced, session.opened)
            if best_rank is None or rank < best_rank:
                best, best_rank = session, rank
        return best

    def _give_way(self, session: LiveSession) -> None:
        window = self.limits.quiet_window_s
        voiced = session.speech.voiced(asyncio.get_running_loop().time())
        logger.info("live stream of %s gives way to a new one: %.1f s of speech in its last %g s, "
                    "with all %d slots held", session.client or "?", voiced, window,
                    self.limits.max_streams)
        self._yielding.add(session)
        session.stop(QuietStreamYielded(
            f"every live slot is held and a client is waiting: this stream sent {voiced:.1f} s "
            f"of speech in the last {_span(window)}, so it gives its slot to the waiting one; "
            "start a new stream when there is speech to caption"))

    @asynccontextmanager
    async def stream(self, options: TranscribeOptions, sample_rate: int,
                     emit: Callable[[Caption], Awaitable[None]], client: str = ""):
        """A :class:`LiveSession` holding one of the process's stream slots (and one of
        ``client``'s, the peer address counted by :meth:`client_key`) for the block."""
        client = self.client_key(client)
        try:
            held = self._admit(client)
            await self._reserve()
        except SenseVoiceError as e:
            self.metrics.refused.labels(e.code).inc()
            raise
        self.metrics.admitted.inc()
        token = self.load.admitted()
        self.open += 1
        self._by_client[client] = held + 1
        self.metrics.streams.inc()
        session = LiveSession(self, options, sample_rate, emit, client)
        session.load_token = token
        self._sessions.add(session)
        code = "ok"
        try:
            yield session
        except SenseVoiceError as e:
            code = e.code
            raise
        except BaseException:
            code = "client_gone"
            raise
        finally:
            session.abort()
            session.settle()
            self._sessions.discard(session)
            self._yielding.discard(session)
            self.load.ended(token)
            self.open -= 1
            if self._by_client[client] <= 1:
                del self._by_client[client]
            else:
                self._by_client[client] -= 1
            self.metrics.streams.dec()
            self.metrics.ended.labels(code).inc()
            self.metrics.audio.inc(session.stats.audio_samples / SAMPLE_RATE_HZ)
            s = session.stats
            logger.info("live stream ended (%s): audio %.1f s in %.1f s, %d partials (%d dropped, "
                        "%d unchanged), %d finals, slowest decode %.0f ms", code,
                        s.audio_samples / SAMPLE_RATE_HZ, time.monotonic() - s.opened_at, s.partials,
                        s.partials_dropped, s.partials_unchanged, s.finals, s.decode_s_max * 1e3)
