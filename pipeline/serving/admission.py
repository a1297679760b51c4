"""Admission: of long recordings (a bounded backlog of jobs waiting to be split and run), of
clients (:func:`client_key`), and of live streams (:class:`BatchProfile`, :class:`LiveAdmission`:
how many more streams the live lane can batch within its latency budget, issue 38).

Long recordings are accepted, then split by VAD in the background and run as pieces. Without a
bound, 42 uploads of 30 min of silence (14 KB FLACs each) in 45 s took the server from 2.4 to
6.7 GB while the queue depth said 0: the jobs waited in an unbounded executor holding their audio.
Now each long job counts (one job, its audio seconds) from acceptance until it is finished, a long
upload beyond either bound is refused at once (503 backlog_full + Retry-After), and the waiting
audio lives on disk (the service memory-maps it), not in memory.

Per-client limits count a client by :func:`client_key`: its address, or (where the operator asks)
the network it is in -- one host of a /24 gets as many as the whole /24 when counted by /24, so
eight addresses of one network no longer hold eight clients' share (issue 36).
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.domain.errors import BacklogFull


class Backlog:
    """Long jobs accepted and not yet finished: how many, and how many audio seconds."""

    def __init__(self, max_jobs: int, max_seconds: float, retry_after_s: int = 30):
        self.max_jobs = max_jobs
        self.max_seconds = max_seconds  # s of audio
        self.retry_after_s = retry_after_s
        self._jobs: dict[str, float] = {}  # job id -> audio seconds
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise BacklogFull now if no job could be admitted (a cheap answer before decoding)."""
        with self._lock:
            self._check(0.0)

    def admit(self, job_id: str, seconds: float, force: bool = False) -> None:
        """Count a long job in, or raise BacklogFull. ``force`` admits recovered jobs beyond the
        bounds (an accepted job is never dropped)."""
        with self._lock:
            if not force:
                self._check(seconds)
            self._jobs[job_id] = seconds

    def release(self, job_id: str) -> bool:
        """The job finished (or was never stored): it no longer counts. True if it did."""
        with self._lock:
            return self._jobs.pop(job_id, None) is not None

    def __contains__(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._jobs

    def snapshot(self) -> tuple[int, float]:
        """(jobs, audio seconds) in the backlog, for the metrics."""
        with self._lock:
            return len(self._jobs), sum(self._jobs.values())

    def _check(self, seconds: float) -> None:
        jobs, total = len(self._jobs), sum(self._jobs.values())
        if jobs >= self.max_jobs:
            raise BacklogFull(f"{jobs} long recordings are waiting to be transcribed, the most this "
                              f"server holds; try again in {self.retry_after_s} s",
                              retry_after=self.retry_after_s)
        if total + seconds > self.max_seconds:
            raise BacklogFull(f"{total / 3600:.1f} h of long recordings are waiting to be "
                              f"transcribed (the limit is {self.max_seconds / 3600:g} h); try again "
                              f"in {self.retry_after_s} s", retry_after=self.retry_after_s)


def client_key(address: str, prefix_v4: int = 32, prefix_v6: int = 128) -> str:
    """The name a per-client limit counts ``address`` under: the address itself, or with a
    prefix shorter than the full address its network (``"192.0.2.0/24"``). An IPv4 address
    mapped into IPv6 (``::ffff:192.0.2.7``, a dual-stack socket) counts as the IPv4 one. What
    is not an IP address (a test client's name, a Unix socket's '') is its own key, unchanged."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # a zone (fe80::1%eth0) is no part
    except ValueError:
        return address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = prefix_v4 if ip.version == 4 else prefix_v6
    if prefix >= ip.max_prefixlen:
        return str(ip)
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))


# ---------------------------------------------------------------------------- live captions
class BatchProfile:
    """What the live lane's batches cost here, as measured (issue 38): per batch size the recent
    time of a batch from its launch to its results, and the queue's age (how long the oldest
    re-decode of each batch waited for it). A worker thread writes it, admission reads it: a
    lock guards the few numbers.

    :meth:`rate` is the re-decodes per second the lane can run in batches that each stay within
    the latency budget (:func:`rate_of`) -- not the share of wall time a batch of any size holds:
    on the H200 a batch of 4 re-decodes took ~5 ms where one of 64 took 23 ms, so a lane "busy"
    all the time with batches of a few had most of its arithmetic left."""

    WEIGHT_NEW = 0.2  # a batch's weight in its size's average
    AGE_HALF_LIFE_S = 2.0  # the queue's age is a recent figure: it falls back when batches wait less
    SIZES_KEPT = 16  # batch sizes remembered (the most recent)
    FRESH_S = 10.0  # a size not run within this of the lane's latest batch no longer counts

    def __init__(self, max_batch: int = 64, lanes: int = 1, clock: Callable[[], float] = time.monotonic):
        self.max_batch = max_batch  # the scheduler's
        self.lanes = lanes  # workers batching from it (one per device)
        self.clock = clock
        self._times: dict[int, float] = {}  # size -> seconds (average)
        self._seen: dict[int, float] = {}  # size -> when a batch of it last ran (the clock's)
        self._age, self._age_at = 0.0, clock()
        self.sizes: Counter = Counter()  # batches run, by size (logged, then cleared)
        self._lock = threading.Lock()

    def batch(self, size: int, seconds: float, waited_s: float = 0.0) -> None:
        """A batch of ``size`` live re-decodes ran in ``seconds``; its oldest had waited
        ``waited_s`` in the queue."""
        if size <= 0:
            return
        with self._lock:
            old = self._times.pop(size, None)  # re-inserted: the dict keeps the recent sizes last
            self._times[size] = seconds if old is None else \
                (1 - self.WEIGHT_NEW) * old + self.WEIGHT_NEW * seconds
            self._seen[size] = self.clock()
            while len(self._times) > self.SIZES_KEPT:
                del self._seen[next(iter(self._times))]
                del self._times[next(iter(self._times))]
            age = self._age_now()
            self._age = waited_s if waited_s > age else 0.8 * age + 0.2 * waited_s
            self._age_at = self.clock()
            self.sizes[size] += 1

    def _age_now(self) -> float:
        return self._age * 0.5 ** ((self.clock() - self._age_at) / self.AGE_HALF_LIFE_S)

    def queue_age(self) -> float:
        """How long re-decodes waited for their batch, recently (seconds)."""
        with self._lock:
            return self._age_now()

    def points(self) -> list[tuple[int, float]]:
        """(batch size, seconds) as measured, one per size run within ``FRESH_S`` of the lane's
        latest batch: what the lane costs now, under the load the machine has now (a CPU shared
        with the speech detector, the event loop and other processes runs a batch slower than
        it did idle, and a size seen only then would keep the idle figure). A lane gone quiet
        keeps the figures of its last busy seconds."""
        with self._lock:
            if not self._seen:
                return []
            latest = max(self._seen.values())
            return [(b, t) for b, t in self._times.items() if latest - self._seen[b] <= self.FRESH_S]

    def rate(self, budget_s: float) -> float | None:
        """Re-decodes per second this lane (``lanes`` workers) can run in batches of at most half
        the budget each (:func:`rate_of`); None before any batch."""
        points = self.points()
        return self.lanes * rate_of(points, self.max_batch, budget_s) if points else None

    def report(self) -> str:
        """The figures a worker process reports for the api processes' admission ('' before any
        batch): max batch, workers, queue age s, then size:seconds per size measured."""
        points = self.points()
        if not points:
            return ""
        return " ".join([str(self.max_batch), str(self.lanes), repr(float(self.queue_age())),
                         *(f"{b}:{t!r}" for b, t in points)])

    def take_sizes(self) -> Counter:
        """The batch sizes run since the last call (for the log)."""
        with self._lock:
            sizes, self.sizes = self.sizes, Counter()
        return sizes


def rate_of(points: list[tuple[int, float]], max_batch: int, budget_s: float) -> float:
    """Re-decodes per second of one worker whose batches of each size took the seconds measured
    (``points``): the best ``size / seconds`` among the batches of at most half the budget (a
    re-decode may wait for the batch in flight, then run in its own); where the sizes fit a line
    ``fixed + per_item * size`` with a fixed part no larger than the quickest batch (a GPU's
    launch cost), a batch up to twice the largest measured is predicted from it, so the capacity
    grows as larger batches are measured; none within half the budget: the best of them all.
    Noisy points (a CPU shared with other work) only ever lower the figure."""
    half = budget_s / 2
    within = [b / t for b, t in points if t <= half and t > 0]
    best = max(within) if within else max(b / max(t, 1e-6) for b, t in points)
    if len(points) >= 2:
        n = len(points)
        mb, mt = sum(b for b, _ in points) / n, sum(t for _, t in points) / n
        var = sum((b - mb) ** 2 for b, _ in points)
        per_item = sum((b - mb) * (t - mt) for b, t in points) / var if var else 0.0
        fixed = mt - per_item * mb
        if per_item > 0 and 0 <= fixed <= min(t for _, t in points):
            largest = max(b for b, _ in points)
            size = min(max_batch, 2 * largest, int((half - fixed) / per_item))
            if size > largest:
                best = max(best, size / (fixed + per_item * size))
    return best


def report_rate(text: str, budget_s: float) -> tuple[float, float] | None:
    """(re-decodes/s within ``budget_s``, queue age s) of one worker process's
    :meth:`BatchProfile.report`; None for an empty or unreadable one."""
    try:
        max_batch, lanes, age, *rest = text.split()
        points = [(int(b), float(t)) for b, t in (p.split(":") for p in rest)]
        lanes_n, age_s = int(lanes), float(age)
        if not points:
            return None
        return lanes_n * rate_of(points, int(max_batch), budget_s), age_s
    except ValueError:
        return None


class LocalLaneCapacity:
    """The embedded lane's capacity: this process's workers' :class:`BatchProfile` (no other
    api process shares it)."""

    shared = False

    def __init__(self, profile: BatchProfile):
        self.profile = profile

    def rate(self, budget_s: float) -> float | None:
        return self.profile.rate(budget_s)

    def queue_age(self) -> float:
        return self.profile.queue_age()

    def others(self) -> float:
        return 0.0

    def reserve(self, demand: float, limit: float) -> bool:
        return demand <= limit

    def publish(self, demand: float) -> None:
        pass


@dataclass(frozen=True)
class StreamLoad:
    """One open stream as live admission sees it: its age and the voiced seconds it sent over
    the last ``window`` (its whole life while younger)."""

    age_s: float
    voiced_s: float


class LiveAdmission:
    """How many more live streams fit (issue 38), the same rule in both topologies. Pure: the
    caller hands in the lane's capacity (re-decodes per second within the budget: the
    :class:`BatchProfile` of this process's workers, or the sum the worker processes report),
    the queue's age, the open streams' speech (:class:`StreamLoad`), and what the lane did
    (:meth:`decoded`, :meth:`voiced`); the clock is injected.

    * **a stream's cost** is ``k`` re-decodes per second of voiced audio (partials at the
      cadence, its finals), learned from this lane over windows of ``LEARN_WINDOW_S`` with at
      least ``LEARN_MIN_VOICED_S`` of speech (before: one partial per interval plus a final per
      ``PRIOR_UTTERANCE_S``), times its voiced share: its own once it is ``RAMP_S`` old (a stream
      of silence costs nothing, and is the first to give way when slots run out), the larger of
      its own and the streams' mean before (its speech has not begun yet, and it will);
    * **the demand** is the open streams' cost (plus, in the distributed topology, what the
      other api processes' streams ask);
    * :meth:`room` is how many streams of the mean voiced share fit under ``share`` of the
      capacity -- a burst is admitted up to it at once, not a few at a time; none while the
      queue's age is over the budget (the lane is behind now, whatever the figures say)."""

    LEARN_WINDOW_S = 5.0
    LEARN_MIN_VOICED_S = 5.0
    RAMP_S = 4.0
    PRIOR_VOICED_SHARE = 0.6  # a person who talks: speech most of the time, pauses between
    PRIOR_UTTERANCE_S = 2.5
    MIN_SHARE = 0.05  # no stream costs nothing: a quiet one may speak
    COST_WEIGHT_NEW = 0.3

    def __init__(self, interval_s: float, budget_s: float, share: float = 0.8,
                 window_s: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.interval_s, self.budget_s, self.share, self.window_s = interval_s, budget_s, share, window_s
        self.clock = clock
        self.k = 1.0 / interval_s + 1.0 / self.PRIOR_UTTERANCE_S  # re-decodes per voiced second
        self.learned = False
        self._decodes, self._voiced, self._since = 0, 0.0, clock()

    # -- what the lane did (this process's streams)
    def decoded(self, n: int = 1) -> None:
        self._decodes += n
        self._learn()

    def voiced(self, seconds: float) -> None:
        self._voiced += seconds
        self._learn()

    def _learn(self) -> None:
        now = self.clock()
        if now - self._since < self.LEARN_WINDOW_S:
            return
        if self._voiced >= self.LEARN_MIN_VOICED_S:
            k = self._decodes / self._voiced
            self.k = k if not self.learned else \
                (1 - self.COST_WEIGHT_NEW) * self.k + self.COST_WEIGHT_NEW * k
            self.learned = True
        self._decodes, self._voiced, self._since = 0, 0.0, now

    # -- the streams' cost
    def _own(self, s: StreamLoad) -> float:
        return s.voiced_s / max(min(s.age_s, self.window_s), 1e-3)

    def mean_share(self, streams: list[StreamLoad]) -> float:
        """The voiced share of the streams old enough to show it (the prior before any is)."""
        old = [self._own(s) for s in streams if s.age_s >= self.RAMP_S]
        return min(sum(old) / len(old), 1.0) if old else self.PRIOR_VOICED_SHARE

    def demand(self, streams: list[StreamLoad]) -> float:
        """Re-decodes per second these streams ask of the lane."""
        mean = self.mean_share(streams)
        total = 0.0
        for s in streams:
            own = min(self._own(s), 1.0)
            total += max(own if s.age_s >= self.RAMP_S else max(own, mean), self.MIN_SHARE)
        return self.k * total

    def stream_cost(self, streams: list[StreamLoad]) -> float:
        """Re-decodes per second one more stream is expected to ask."""
        return self.k * max(self.mean_share(streams), self.MIN_SHARE)

    def room(self, capacity: float | None, streams: list[StreamLoad], queue_age_s: float = 0.0,
             others: float = 0.0) -> int | None:
        """How many more streams fit; None while the capacity is not measured yet."""
        if capacity is None:
            return None
        if queue_age_s > self.budget_s:
            return 0
        left = self.share * capacity - others - self.demand(streams)
        return max(int(left / self.stream_cost(streams)), 0)
