"""The resident inference thread: one per device. Pops dynamic batches, runs the engine, stores results.

It reads a queue and writes the broker, and knows nothing else: no callbacks into its owner (the
broker publishes what changed, pipeline/serving/job_events.py; a fatal error is left in ``fatal``
for the owner's watchdog). Only this thread touches its engine. A CUDA out-of-memory error halves the batch and retries; a job
that fails alone is failed with its reason, and the worker keeps serving.

Two threads share the work of a batch so that the GPU never waits on Python: this one takes a
batch, marks it running and queues it on the device (``engine.transcribe_async``, which returns
before the GPU is done); a finisher thread waits for its token ids, builds the transcripts, stores
them and announces them, while this one already queues the next batch. At most one finished batch
waits for the finisher, so results are never far behind the GPU; stopping drains it first.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Sequence

import torch

from pipeline.model.protocol import Engine
from pipeline.domain.errors import (AudioLost, BrokerUnavailable, DeviceFailed, InferenceFailed, JobFailed,
                                    NotReady, OutOfDeviceMemory, QueueTimeout, WorkerFailed)
from pipeline.serving.ports import WorkerSink
from pipeline.serving.records import (SegmentResult, redact_across, redacted_piece,
                                      transcript_from_pieces)
from pipeline.serving.metrics import Metrics
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.serving.scheduler import Scheduler, WorkItem

if TYPE_CHECKING:
    from collections.abc import Callable

    from pipeline.domain.types import Job, Transcript

logger = logging.getLogger("sensevoice.worker")

POLL_S = 0.1  # seconds the loop waits for work before it beats the heartbeat again
IDLE_POLL_S = 0.005  # the same while the engine has background work (compile, graph captures)
LIVE_SIZES_LOG_S = 30.0  # the live lane's batch sizes are logged this often (while it runs)
FATAL_CUDA_MARKERS = ("illegal memory access", "device-side assert", "unspecified launch failure",
                      "an illegal instruction", "misaligned address")


class Worker(threading.Thread):
    def __init__(self, name: str, engine: Engine, scheduler: Scheduler, store: WorkerSink, *,
                 queue_timeout_s: float = float("inf"), delete_audio_when_done: bool = False,
                 metrics: Metrics | None = None, cpu_threads: int = 0, background_work: bool = True):
        super().__init__(name=name, daemon=True)
        self.engine = engine
        self.background_work = background_work  # the engine's compile and graph captures
        self.scheduler = scheduler
        self.store = store
        self.queue_timeout_s = queue_timeout_s
        self.delete_audio_when_done = delete_audio_when_done
        self.metrics = metrics or Metrics([])
        self.cpu_threads = cpu_threads
        self._loop_beat = time.monotonic()
        self._waiting_since: float | None = None  # the finisher waits for the device since then
        self.batches = 0
        self.busy_s = 0.0  # seconds spent launching batches and waiting for their results
        self._sizes_logged = time.monotonic()  # the live lane's batch sizes were last logged
        self.fatal: BaseException | None = None
        self._stop_event = threading.Event()
        self._finishing: queue.Queue = queue.Queue(maxsize=1)  # launched batches, one waiting
        self._finisher: threading.Thread | None = None
        self._finish_lock = threading.Lock()  # one batch finished at a time (long jobs' pieces)

    @property
    def heartbeat(self) -> float:
        """When this worker last proved alive: its loop's last turn, or when the finisher began
        waiting for a batch that has not come back from the device (a hung GPU stops both)."""
        waiting = self._waiting_since
        return self._loop_beat if waiting is None else min(self._loop_beat, waiting)

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        try:
            if self.engine.device.type == "cuda":
                torch.cuda.set_device(self.engine.device)
            elif self.cpu_threads:
                torch.get_num_threads()  # a thread's count is set lazily on first use: touch it first
                torch.set_num_threads(self.cpu_threads)
            self._finisher = threading.Thread(target=self._finish_loop, name=f"{self.name}-finisher",
                                              daemon=True)
            self._finisher.start()
            self._loop()
        except BaseException as e:  # the thread must never die silently: readiness reports it
            logger.critical("worker %s died: %s", self.name, e, exc_info=True)
            self.fatal = e  # the owner's watchdog reads it
        finally:
            if self._finisher is not None:  # what was launched is finished and stored first
                self._finishing.put(None)
                self._finisher.join()

    def _finish_loop(self) -> None:
        """The finisher thread: wait for each launched batch, store and announce its results."""
        if self.engine.device.type == "cuda":
            torch.cuda.set_device(self.engine.device)
        while True:
            job = self._finishing.get()
            if job is None:
                return
            with self._finish_lock:
                self._finish(job)

    def _finish(self, job) -> None:
        """Wait for a launched batch, then store and announce its results (finisher thread, or
        the worker's own when nothing else is queued)."""
        batch, waves, pending, t_start, t0, moved = job
        waited = self._waiting_since = time.monotonic()
        try:
            outs = pending.result()
        except Exception as e:
            if _is_fatal(e):
                logger.critical("fatal device error, worker stops: %s", e)
                self.fatal = e
                self._stop_event.set()
                for item in batch:  # its jobs are recovered after the restart
                    if item.reply is not None:
                        self._fail(item, DeviceFailed(f"the GPU failed: {e}"),
                                   NotReady(f"the GPU failed: {e}"))
                return
            logger.exception("batch of %d failed on the device", len(batch))
            for item in batch:
                self._fail(item, InferenceFailed(f"inference failed: {e}"), e)
            return
        finally:
            self._waiting_since = None
            done = time.monotonic()
            self.busy_s += done - waited  # the device's time (a CPU's: detokenising)
            self._live_batch(batch, done - t0, t0)
        keep = [k for k, i in enumerate(batch) if i.reply is not None or i.job_id in moved]
        if len(keep) < len(batch):  # cancelled or handled elsewhere while it ran
            batch, waves, outs = ([seq[k] for k in keep] for seq in (batch, waves, outs))
        try:
            compute_ms = (time.monotonic() - t0) * 1e3
            self.metrics.observe_compute(compute_ms / 1e3, len(batch), str(self.engine.device))
            self._complete(batch, waves, outs, t_start, compute_ms)
        except BrokerUnavailable as e:  # entries stay pending: reclaimed later, never lost
            logger.warning("%s", e)
            self.store.release([i.job_id for i in batch if i.reply is None])
        except Exception as e:  # a bug here must not leave its jobs running forever
            logger.exception("unexpected error while storing a batch (the worker goes on)")
            for item in batch:
                self._fail(item, WorkerFailed(f"the worker failed on this batch: {e}"))

    def _live_batch(self, batch: Sequence[WorkItem], seconds: float, launched: float) -> None:
        """Record a batch's live re-decodes for live admission (the scheduler's BatchProfile: its
        size, launch to results, the oldest one's wait) and log the sizes run every
        LIVE_SIZES_LOG_S."""
        live = [i for i in batch if i.reply is not None]
        if not live:
            return
        profile = self.scheduler.live_batches
        profile.batch(len(live), seconds, launched - min(i.enqueued_at for i in live))
        if launched - self._sizes_logged >= LIVE_SIZES_LOG_S:
            self._sizes_logged = launched
            sizes = profile.take_sizes()
            logger.info("live lane: %d batches in the last %.0f s, by size %s", sum(sizes.values()),
                        LIVE_SIZES_LOG_S, dict(sorted(sizes.items())))

    def _loop(self) -> None:
        while not self._stop_event.is_set() and self.fatal is None:
            self._loop_beat = time.monotonic()
            batch: list[WorkItem] = []
            try:
                idle_work = self.background_work and self.engine.has_idle_work
                batch = self.scheduler.next_batch(timeout=IDLE_POLL_S if idle_work else POLL_S)
                if batch:
                    self._run_batch(batch)
                    if self.background_work and self.engine.has_hot_work:  # a shape run op by op often:
                        self.engine.capture_hot()  # captured now, even with more queued
                elif idle_work:  # nothing queued: one short step (a graph capture, ~10-100 ms)
                    self.engine.idle_step()
            except BrokerUnavailable as e:  # the broker is down: its entries stay pending and
                logger.warning("%s", e)      # are reclaimed later, never lost; wait and go on
                self.store.release([i.job_id for i in batch if i.reply is None])
                for item in batch:
                    if item.reply is not None:
                        self._fail(item, e, e)
                time.sleep(1.0)
            except Exception as e:
                if _is_fatal(e):  # a poisoned CUDA context: give up, let the supervisor restart
                    logger.critical("fatal device error, worker stops: %s", e)
                    self.fatal = e
                    for item in batch:  # a live stream hears it now (its jobs are recovered)
                        if item.reply is not None:
                            self._fail(item, DeviceFailed(f"the GPU failed: {e}"),
                                       NotReady(f"the GPU failed: {e}"))
                    return
                # a bug (here or in the scheduler) is not a device fault: fail what this batch
                # held and keep serving; the process is not restarted for it
                logger.exception("unexpected worker error (the worker goes on)")
                for item in batch:  # never leave a job running forever
                    self._fail(item, WorkerFailed(f"the worker failed on this batch: {e}"))
                time.sleep(POLL_S)  # a bug that repeats must not spin a core

    # ------------------------------------------------------------------ one batch
    def _run_batch(self, batch: list[WorkItem]) -> None:
        t_start = time.monotonic()
        live = [i for i in batch if i.reply is not None]
        if live:  # live re-decodes are no jobs: no store, no queue timeout; batched with the jobs
            batch = [i for i in batch if i.reply is None]
            live = [i for i in live if i.reply.set_running_or_notify_cancel()]
        for item in [i for i in batch if t_start - i.enqueued_at > self.queue_timeout_s]:
            self._fail(item, QueueTimeout(
                f"timed out in queue after {t_start - item.enqueued_at:.0f} s"))
            batch.remove(item)
        if live:
            batch = live + batch
        if not batch:
            return
        waves = []
        for item in list(batch):
            try:
                waves.append(self._audio(item))
            except Exception as e:
                logger.error("job %s: spooled audio unreadable: %s", item.job_id, e)
                self._fail(item, AudioLost(f"the job's audio could not be read: {e}"))
                batch.remove(item)
        if batch:
            self._infer(batch, waves, t_start)

    @staticmethod
    def _audio(item: WorkItem) -> torch.Tensor:
        if isinstance(item.audio, torch.Tensor):
            return item.audio
        if item.audio is None:
            raise ValueError("the work item carries no audio")
        return item.audio.load()  # spooled samples mapped, or a recovered job's upload decoded

    def _mark_running(self, batch: Sequence[WorkItem], t_start: float) -> set[str]:
        """Move the batch's jobs to running; returns those this worker moved (the others were
        cancelled or handled elsewhere meanwhile: their outputs are dropped)."""
        jobs = [i for i in batch if i.reply is None]
        moved = self.store.mark_running([i.job_id for i in jobs if i.pieces == 1]) if jobs else set()
        pieces = [i.job_id for i in jobs if i.pieces > 1]
        if pieces:  # a long job's later pieces find it already running
            moved |= self.store.mark_running(pieces, already_running_ok=True)
        waits: dict[str, list[float]] = {}
        for item in jobs:
            if item.job_id in moved:
                waits.setdefault(item.lane, []).append(t_start - item.enqueued_at)
        for lane, seconds in waits.items():  # each lane's series touched once per batch
            self.metrics.observe_queues(lane, seconds)
        return moved

    def _infer(self, batch: Sequence[WorkItem], waves: Sequence[torch.Tensor], t_start: float,
               moved: set[str] | None = None) -> None:
        """Queue the batch on the device, then mark its jobs running while the GPU computes (the
        store's transaction is off the latency path), then hand it to the finisher. A batch that
        fails to launch is marked running first (``moved``: already marked, for the retries)."""
        try:
            t0 = time.monotonic()
            pending = self.engine.transcribe_async(waves, [i.options for i in batch])
            self.busy_s += time.monotonic() - t0  # a CPU computes here; a GPU is handed the batch
        except torch.cuda.OutOfMemoryError as e:
            moved = self._mark_running(batch, t_start) if moved is None else moved
            if len(batch) == 1:
                if batch[0].reply is not None or batch[0].job_id in moved:
                    self._fail(batch[0], OutOfDeviceMemory("the GPU ran out of memory on this clip alone"), e)
                return
            torch.cuda.empty_cache()
            half = len(batch) // 2
            logger.warning("CUDA OOM on a batch of %d; retrying as %d + %d", len(batch), half,
                           len(batch) - half)
            self._infer(batch[:half], waves[:half], t_start, moved)
            self._infer(batch[half:], waves[half:], t_start, moved)
            return
        except Exception as e:
            moved = self._mark_running(batch, t_start) if moved is None else moved
            if _is_fatal(e) or len(batch) == 1:
                if _is_fatal(e):
                    raise
                if batch[0].reply is not None or batch[0].job_id in moved:
                    self._fail(batch[0], InferenceFailed(f"inference failed: {e}"), e)
                return
            logger.warning("batch of %d failed (%s); retrying one by one", len(batch), e)
            for item, wave in zip(batch, waves):
                self._infer([item], [wave], t_start, moved)
            return
        moved = self._mark_running(batch, t_start) if moved is None else moved
        job = (batch, waves, pending, t_start, t0, moved)
        if self._finishing.empty() and not len(self.scheduler) and self._finish_lock.acquire(blocking=False):
            try:  # nothing to overlap with: no hand-over to the finisher (idle latency)
                self._finish(job)
            finally:
                self._finish_lock.release()
        else:
            self._finishing.put(job)  # waits while one is waiting

    def _complete(self, batch: list[WorkItem], waves: Sequence[torch.Tensor], outs,
                  t_start: float, compute_ms: float) -> None:
        """Finisher thread: answer live re-decodes, store and announce the jobs' results."""
        self.batches += 1
        for item, out in zip(batch, outs):
            if item.reply is not None:
                item.reply.set_result(out)
        jobs = [(i, w, o) for i, w, o in zip(batch, waves, outs) if i.reply is None]
        if not jobs:
            return
        batch, waves, outs = (list(t) for t in zip(*jobs))
        whole = [(i, w, o) for i, w, o in zip(batch, waves, outs) if i.pieces == 1]
        parts = [(i, w, o) for i, w, o in zip(batch, waves, outs) if i.pieces > 1]
        results = [(i.job_id, transcript_from_pieces([_piece(i, w, o)])) for i, w, o in whole]
        audio_s = {i.job_id: w.shape[0] / SAMPLE_RATE_HZ for i, w, _ in whole}
        if parts:
            complete = self._save_pieces(parts)
            results += [(jid, transcript) for jid, transcript, _ in complete]
            audio_s.update((jid, seconds) for jid, _, seconds in complete)
        written = self.store.finish_many(results)
        if self.delete_audio_when_done:
            for jid in written:
                self.store.delete_spool(jid)
        counted = set()  # a long job's last pieces may share this batch: count and log it once
        by_lane: dict[str, tuple[float, list[float]]] = {}  # lane -> (audio s, each job's time)
        now, debug = time.monotonic(), logger.isEnabledFor(logging.DEBUG)
        for item, wave in zip(batch, waves):
            queue_ms = (t_start - item.enqueued_at) * 1e3
            if debug and item.pieces > 1:
                logger.debug("piece done id=%s piece=%d/%d audio_s=%.2f queue_ms=%.1f",
                             item.job_id, item.piece + 1, item.pieces, wave.shape[0] / SAMPLE_RATE_HZ,
                             queue_ms)
            if item.job_id in written and item.job_id not in counted:
                counted.add(item.job_id)
                audio, times = by_lane.get(item.lane, (0.0, []))
                times.append(now - item.enqueued_at)
                by_lane[item.lane] = (audio + audio_s[item.job_id], times)
                if debug:  # not INFO: at thousands of jobs a second the log would be the work
                    logger.debug(
                        "job done id=%s audio_s=%.2f pieces=%d queue_ms=%.1f compute_ms=%.1f "
                        "batch=%d", item.job_id, audio_s[item.job_id], item.pieces, queue_ms,
                        compute_ms, len(batch))
        for lane, (audio, times) in by_lane.items():  # the series touched once per lane
            self.metrics.jobs_done(lane, audio, times)

    def _save_pieces(self, parts) -> list[tuple[str, Transcript, float]]:
        """Store the pieces of long jobs; return (job id, transcript, audio seconds of the
        recording) of the jobs whose last piece is in."""
        self.store.save_segments([_piece(i, w, o) for i, w, o in parts])
        complete = []
        redact = {i.job_id: i.options.redact for i, _, _ in parts}
        for job_id, total in {i.job_id: i.pieces for i, _, _ in parts}.items():
            done = self.store.segment_count(job_id)  # the pieces themselves only once complete
            if done >= total:
                pieces = self.store.segments(job_id)
                seconds = _recording_seconds(self.store.get, job_id, pieces)
                transcript = transcript_from_pieces(pieces)
                if redact[job_id]:  # an item said across a pause: its parts in two pieces
                    transcript = redact_across(transcript, redact[job_id])
                complete.append((job_id, transcript, seconds))
        return complete

    def _fail(self, item: WorkItem, failure: JobFailed | BrokerUnavailable,
              error: BaseException | None = None) -> None:
        """Store ``failure`` (its code and message) as the job's end; a live re-decode's stream
        hears ``error`` (the cause) instead, or the failure itself."""
        code = failure.code
        if item.reply is not None:  # a live re-decode: its stream reports the error
            if not item.reply.done():
                item.reply.set_exception(error or failure)
            return
        if self.store.fail(item.job_id, code, failure.message) is not False:  # a long job fails once
            self.metrics.request_failure(item.lane, code)
            logger.info("job failed id=%s code=%s", item.job_id, code)
        else:
            logger.debug("job %s already finished; piece %d failed with %s", item.job_id,
                         item.piece, code)


def _piece(item: WorkItem, wave: torch.Tensor, out) -> SegmentResult:
    start = item.start_s
    words = tuple(replace(w, start=round(w.start + start, 3), end=round(w.end + start, 3))
                  for w in out.words)
    piece = SegmentResult(item.job_id, item.piece, start, start + wave.shape[0] / SAMPLE_RATE_HZ,
                          item.speaker, out.raw_text, words, pieces=item.pieces,
                          avg_logprob=out.avg_logprob, tag_probs=out.tag_probs)
    # masked before anything is stored: the unredacted text of such a job is never kept
    return redacted_piece(piece, item.options.redact) if item.options.redact else piece


def _recording_seconds(get: Callable[[str], Job], job_id: str, pieces: Sequence[SegmentResult]) -> float:
    """A long job's audio seconds for the metrics: the job's own figure, else where its last piece
    ends (split channels overlap in time, so never the sum of the pieces)."""
    try:
        seconds = float(get(job_id).audio_seconds)
    except Exception as e:  # purged meanwhile, a store without get: the pieces still tell
        logger.debug("job %s: audio seconds from its pieces (%s)", job_id, e)
        seconds = 0.0
    return seconds or max((p.end_s for p in pieces), default=0.0)


def _is_fatal(e: BaseException) -> bool:
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(m in text for m in FATAL_CUDA_MARKERS)
