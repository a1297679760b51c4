"""The live lane over Redis: re-decodes of live streams carried from the api process that holds
the stream (its audio, endpointing and state) to whichever worker process takes them, and back.

Why not the job queue: a re-decode is no job (nothing is stored, it is worthless a second late, a
stream has at most one in flight) and must not wait behind a Stream's consumer-group bookkeeping
or a visibility timeout of a minute. So it travels apart, as the top lane:

* **api side** (:class:`LiveClient`, one per api process, threads started on first use):
  :meth:`LiveClient.submit` returns a Future at once (the event loop never waits on Redis); a
  sender thread pushes the requests (16-bit PCM of the utterance, the options, this process's
  reply key, a deadline), a receiver thread reads the replies and resolves the futures, and every
  ``CHECK_S`` looks at who holds the requests still unanswered: one held by a worker whose beat
  is over ``lost_after_s`` late (killed, crashed, stopping) is pushed again at the front of the
  queue for another worker (at most ``MAX_ATTEMPTS`` deliveries in all), else its stream ends with
  :class:`~pipeline.domain.errors.LiveWorkerLost` -- within ``lost_after_s + 2 * CHECK_S``,
  never a hang.
* **worker side** (:class:`LiveServer`, one per worker process): a claimer thread takes requests
  (a Lua script pops them and records the claim atomically: a worker killed right after the pop
  is still seen holding them) while fewer than ``max_waiting`` of them wait in the local scheduler,
  where they go as the top lane (batched with the jobs); a replier thread sends the engine's
  outputs back. The claimer beats ``4 / lost_after_s`` times a second while the process serves.

Keys (``P`` = prefix)::

    P:live:requests   list    requests waiting: LPUSH (moved ones and finals RPUSH: first), popped
                              from the right by the claim script; each "rid deadline_ms\\nreply key\\n
                              options JSON\\n" + 16-bit PCM. Expires when no request came for
                              ``REQUEST_TTL_S`` (no worker ever took them).
    P:live:bell       list    one token per push: workers wait on it (BLPOP), the claim script
                              deletes it when the requests run out
    P:live:claims     hash    rid -> the worker that took it, or "-" (withdrawn while waiting: the
                              worker skips it); deleted with the reply
    P:live:workers    hash    worker -> the Redis time (ms) its beat expires
    P:live:capacity   hash    worker -> "expiry_ms " + what its live batches cost
                              (BatchProfile.report): every api process's admission reads the
                              live workers' capacity from it (issue 38)
    P:live:demand     hash    api process -> "expiry_ms re-decodes/s": what its open streams ask;
                              an admission adds to its own field only while the sum over the
                              live fields stays under the capacity share (one Lua step)
    P:live:reply:A    list    api process A's replies (JSON), RPUSH by workers, BLPOP by A; one
                              reader per process rather than one blocking read (and connection)
                              per stream; each reply names its request; expires with A

Measured (tests/test_live_distributed.py: loopback, demo model, 2 api + 2 worker processes on a
loaded 2-core machine, live_lost_after_s 0.5, 4 runs, 2026-12-02): kill -9 of the worker holding
a re-decode -> moved to the other in 0.36-0.58 s, the stream's finals unchanged; kill -9 of the
last worker -> the stream's live_worker_lost frame 0.41-0.60 s after the kill. Pause over ->
final 0.06-0.16 s, voiced start -> first partial 0.2-0.5 s (two streams through two api
processes at once).
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from queue import Empty, SimpleQueue

import redis

from pipeline.domain.errors import BrokerUnavailable, LiveWorkerLost, NotReady, SenseVoiceError
from pipeline.domain.types import Lane
from pipeline.serving.payloads import pcm16_bytes, pcm16_tensor
from pipeline.serving.records import dump_options, load_options
from pipeline.serving.scheduler import Scheduler, WorkItem

logger = logging.getLogger("sensevoice.live_lane")

CHECK_S = 0.2  # how often an api process looks for requests held by a worker that is gone
MAX_ATTEMPTS = 3  # deliveries of one re-decode (the first and two moves), then LiveWorkerLost
REQUEST_TTL_S = 120.0  # the request list expires when nothing was pushed for this long
REPLY_TTL_S = 60.0  # an api process's reply list expires this long after its latest reply
FORGET_WORKER_S = 60.0  # a worker's registry field is deleted once expired for this long
SEND_BATCH = 64  # requests (or replies) per round trip at most


def _take_batch(queue: SimpleQueue) -> list:
    """Wait for one entry, then take what else is queued, up to ``SEND_BATCH``: one round trip."""
    batch = [queue.get()]
    while len(batch) < SEND_BATCH:
        try:
            batch.append(queue.get_nowait())
        except Empty:
            break
    return batch

# KEYS: requests, bell, claims. ARGV: consumer, max items, claims ttl ms. Pops up to max requests
# (oldest first), skipping withdrawn and expired ones, and records each claim in the same step.
_CLAIM = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
local n = tonumber(ARGV[2])
while #out < n do
  local el = redis.call('RPOP', KEYS[1])
  if not el then
    redis.call('DEL', KEYS[2])
    break
  end
  local rid, deadline = string.match(el, '^(%S+) (%d+)\\n')
  if rid then
    local mark = redis.call('HGET', KEYS[3], rid)
    if mark == '-' then
      redis.call('HDEL', KEYS[3], rid)
    elseif tonumber(deadline) > now then
      redis.call('HSET', KEYS[3], rid, ARGV[1])
      out[#out + 1] = el
    end
  end
end
if #out > 0 then redis.call('PEXPIRE', KEYS[3], ARGV[3]) end
return out
"""

# KEYS: workers, capacity. ARGV: consumer, ttl ms, capacity report ('' : none yet). The beat's
# expiry on Redis's clock (no host skew).
_BEAT = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], now + tonumber(ARGV[2]))
if ARGV[3] and ARGV[3] ~= '' then
  redis.call('HSET', KEYS[2], ARGV[1], (now + tonumber(ARGV[2])) .. ' ' .. ARGV[3])
end
return now
"""

# KEYS: demand. ARGV: this api process, its demand with the new stream, the limit, ttl ms.
# Records the demand only while the live fields' sum stays under the limit; returns
# {1 or 0, the others' sum as text}.
_RESERVE = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local all = redis.call('HGETALL', KEYS[1])
local others = 0
for i = 1, #all, 2 do
  if all[i] ~= ARGV[1] then
    local exp, d = string.match(all[i + 1], '^(%d+) (%S+)$')
    if exp and tonumber(exp) > now then others = others + tonumber(d) end
  end
end
if others + tonumber(ARGV[2]) > tonumber(ARGV[3]) then return {0, tostring(others)} end
redis.call('HSET', KEYS[1], ARGV[1], (now + tonumber(ARGV[4])) .. ' ' .. ARGV[2])
return {1, tostring(others)}
"""

FINAL = "final:"  # a final's request id starts so: the worker queues it ahead of every partial. A
# worker of the previous release reads the id as opaque and serves it as a partial (a rolling
# upgrade loses nothing); a request of a previous api process (no mark) is a partial here.


class _Keys:
    def __init__(self, prefix: str):
        self.requests = f"{prefix}:live:requests"
        self.bell = f"{prefix}:live:bell"
        self.claims = f"{prefix}:live:claims"
        self.workers = f"{prefix}:live:workers"
        self.capacity = f"{prefix}:live:capacity"
        self.demand = f"{prefix}:live:demand"
        self.reply_prefix = f"{prefix}:live:reply:"


def _ms(seconds: float) -> int:
    return int(seconds * 1000)


def encode_request(rid: str, deadline_ms: int, reply_key: str, item: WorkItem) -> bytes:
    head = f"{rid} {deadline_ms}\n{reply_key}\n{dump_options(item.options)}\n".encode()
    return head + pcm16_bytes(item.audio)


def decode_request(blob: bytes) -> tuple[str, str, WorkItem]:
    """(rid, reply key, the local work item with a fresh Future as its reply)."""
    head, reply_key, options, pcm = blob.split(b"\n", 3)
    rid = head.split(b" ", 1)[0].decode()
    audio = pcm16_tensor(pcm)
    item = WorkItem(rid, Lane.INTERACTIVE, load_options(options), int(audio.shape[0]), audio=audio,
                    reply=Future(), final=rid.startswith(FINAL))
    return rid, reply_key.decode(), item


def encode_reply(rid: str, future: Future) -> bytes:
    if future.cancelled():
        return json.dumps({"req": rid, "error": NotReady.code, "message": "withdrawn"}).encode()
    e = future.exception()
    if e is not None:
        code = e.code if isinstance(e, SenseVoiceError) else "error"
        return json.dumps({"req": rid, "error": code, "message": str(e)}).encode()
    out = future.result()
    return json.dumps({"req": rid, "raw_text": out.raw_text, "token_ids": list(out.token_ids),
                       "words": [[w.text, w.start, w.end] for w in out.words]}).encode()


def decode_reply(msg: dict):
    from pipeline.domain.types import Word
    from pipeline.model.engine import EngineOutput

    return EngineOutput(tuple(msg["token_ids"]), msg["raw_text"],
                        tuple(Word(t, s, e) for t, s, e in msg["words"]))


# ---------------------------------------------------------------------------- api side
@dataclass(eq=False)
class _Pending:
    item: WorkItem
    blob: bytes = b""
    sent_at: float = 0.0  # monotonic; 0 until pushed
    attempts: int = 0  # deliveries so far


class LiveClient:
    """The api process's end of the live lane (see the module docstring). Thread-safe."""

    def __init__(self, client: redis.Redis, prefix: str, lost_after_s: float,
                 deadline_s: float = 60.0):
        self._r = client
        self.keys = _Keys(prefix)
        self.reply_key = self.keys.reply_prefix + uuid.uuid4().hex
        self.lost_after_s = lost_after_s
        self.deadline_s = deadline_s
        self.workers_alive: int | None = None  # at the latest check (None: not read yet)
        self.moved = 0  # re-decodes moved to another worker
        self.lost = 0  # re-decodes given up (LiveWorkerLost)
        self._pending: dict[str, _Pending] = {}
        self._lock = threading.Lock()
        self._outbox: SimpleQueue = SimpleQueue()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def _start(self) -> None:
        with self._lock:
            if self._threads or self._stop.is_set():
                return
            self._threads = [threading.Thread(target=self._send_loop, name="sensevoice-live-send",
                                              daemon=True),
                             threading.Thread(target=self._receive_loop,
                                              name="sensevoice-live-receive", daemon=True)]
            for t in self._threads:
                t.start()

    def submit(self, item: WorkItem) -> Future:
        """Queue one re-decode; its Future gets the engine's output (or the stream's error).
        Cancelling the Future withdraws the request if no worker took it yet."""
        if self._stop.is_set():
            raise NotReady("the server is stopping")
        if self.workers_alive == 0:
            raise NotReady("no worker serves live captions now; try again in a few seconds")
        self._start()
        if item.reply is None:
            item.reply = Future()
        if item.final and not item.job_id.startswith(FINAL):  # the request carries its kind
            item.job_id = FINAL + item.job_id
        pending = _Pending(item)
        with self._lock:
            self._pending[item.job_id] = pending
        item.reply.add_done_callback(lambda f, rid=item.job_id: self._done(rid, f))
        self._outbox.put(pending)
        return item.reply

    def _done(self, rid: str, future: Future) -> None:
        with self._lock:
            pending = self._pending.pop(rid, None)
        if future.cancelled() and pending is not None and pending.sent_at:
            self._outbox.put(rid)  # withdraw it (a worker that took it already runs it anyway)

    def close(self) -> None:
        self._stop.set()
        self._outbox.put(None)
        for t in self._threads:
            t.join(timeout=2)
        self._fail_all(NotReady("the server is stopping"))

    def _fail_all(self, error: BaseException) -> None:
        with self._lock:
            pending = list(self._pending.values())
        for p in pending:
            _resolve(p.item.reply, error=error)

    # -- sender thread
    def _send_loop(self) -> None:
        while not self._stop.is_set():
            batch = _take_batch(self._outbox)
            if None in batch:
                return
            try:
                self._send(batch)
            except redis.RedisError as e:
                logger.warning("live lane: could not send %d re-decodes: %s", len(batch), e)
                for p in batch:
                    if isinstance(p, _Pending):
                        _resolve(p.item.reply, error=BrokerUnavailable(
                            f"the broker (Redis) did not take a live re-decode: {e}"))

    def _send(self, batch: list) -> None:
        deadline_ms = None
        pipe = self._r.pipeline(transaction=False)
        pushed = []
        for p in batch:
            if isinstance(p, str):  # a withdrawal
                pipe.hsetnx(self.keys.claims, p, "-")
                continue
            if p.item.reply.done():
                continue
            if deadline_ms is None:
                deadline_ms = _ms(time.time() + self.deadline_s)
            p.blob = encode_request(p.item.job_id, deadline_ms, self.reply_key, p.item)
            if p.item.final:  # the front of the queue: taken before every partial waiting
                pipe.rpush(self.keys.requests, p.blob)
            else:
                pipe.lpush(self.keys.requests, p.blob)
            pushed.append(p)
        if pushed:
            pipe.lpush(self.keys.bell, *(b"1" for _ in pushed))
            pipe.pexpire(self.keys.requests, _ms(REQUEST_TTL_S))
            pipe.pexpire(self.keys.bell, _ms(REQUEST_TTL_S))
        pipe.execute()
        now = time.monotonic()
        for p in pushed:
            p.sent_at, p.attempts = now, 1

    # -- receiver thread
    def _receive_loop(self) -> None:
        next_check = 0.0
        while not self._stop.is_set():
            try:
                got = self._r.blpop([self.reply_key], timeout=CHECK_S)
                if got is not None:
                    more = self._r.lpop(self.reply_key, SEND_BATCH) or []
                    for raw in [got[1], *more]:
                        self._answer(json.loads(raw))
                now = time.monotonic()
                if now >= next_check:
                    next_check = now + CHECK_S
                    self._check()
            except redis.RedisError as e:
                logger.warning("live lane: the broker does not answer: %s", e)
                self._fail_all(BrokerUnavailable(f"the broker (Redis) does not answer: {e}"))
                self._stop.wait(CHECK_S)
            except Exception:
                logger.exception("live lane: unexpected error (the receiver goes on)")
                self._stop.wait(CHECK_S)

    def _answer(self, msg: dict) -> None:
        with self._lock:
            pending = self._pending.get(msg.get("req"))
        if pending is None:  # answered already (a moved request's first worker was only slow),
            self._r.hdel(self.keys.claims, msg.get("req", ""))  # or withdrawn as it was answered
            return
        if "error" not in msg:
            _resolve(pending.item.reply, result=decode_reply(msg))
        elif msg["error"] == NotReady.code:  # the worker is stopping: another one takes it
            self._lost(pending, "stopping", None)
        else:
            _resolve(pending.item.reply, error=RuntimeError(msg.get("message", msg["error"])))

    def _check(self) -> None:
        """Requests held by a worker whose beat expired are moved or failed; requests no worker
        took while none beats are failed."""
        with self._lock:
            waiting = [p for p in self._pending.values() if p.sent_at]
        pipe = self._r.pipeline(transaction=False)
        pipe.time()
        pipe.hgetall(self.keys.workers)
        if waiting:
            pipe.hmget(self.keys.claims, [p.item.job_id for p in waiting])
        (sec, usec), workers, *claims = pipe.execute()
        now_ms = int(sec) * 1000 + int(usec) // 1000
        alive = {k.decode() for k, v in workers.items() if int(v) > now_ms}
        self.workers_alive = len(alive)
        forget = [k for k, v in workers.items() if int(v) < now_ms - _ms(FORGET_WORKER_S)]
        if forget:
            self._r.hdel(self.keys.workers, *forget)
        now = time.monotonic()
        for p, claim in zip(waiting, claims[0] if claims else ()):
            holder = None if claim in (None, b"-") else claim.decode()
            if holder is not None and holder not in alive:
                self._lost(p, f"worker {holder} stopped", alive)
            elif holder is None and not alive and now - p.sent_at > self.lost_after_s:
                self._lost(p, "no worker beats", alive)

    def _lost(self, p: _Pending, why: str, alive: set[str] | None) -> None:
        if p.item.reply.done():
            return
        if p.attempts < MAX_ATTEMPTS and (alive is None or alive):
            p.attempts += 1
            p.sent_at = time.monotonic()
            self.moved += 1
            logger.warning("live re-decode %s moved to another worker (%s)", p.item.job_id, why)
            pipe = self._r.pipeline(transaction=False)
            pipe.hdel(self.keys.claims, p.item.job_id)
            pipe.rpush(self.keys.requests, p.blob)  # the front of the queue
            pipe.lpush(self.keys.bell, b"1")
            pipe.pexpire(self.keys.requests, _ms(REQUEST_TTL_S))
            pipe.execute()
            return
        self.lost += 1
        self._r.hdel(self.keys.claims, p.item.job_id)  # nobody will answer it
        _resolve(p.item.reply, error=LiveWorkerLost(
            f"the worker decoding this stream stopped ({why}) and no other worker took it over; "
            "start the stream again"))


def _resolve(future: Future, result=None, error: BaseException | None = None) -> None:
    """Set a Future's outcome unless it has one (cancelled, or answered by a racing reply)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except Exception:  # InvalidStateError: done already
        pass


# ---------------------------------------------------------------------------- worker side
class LiveServer:
    """A worker process's end of the live lane (see the module docstring)."""

    def __init__(self, client: redis.Redis, prefix: str, scheduler: Scheduler, consumer: str,
                 lost_after_s: float, max_waiting: int, ready: Callable[[], str | None] = lambda: None):
        self._r = client
        self.keys = _Keys(prefix)
        self.scheduler = scheduler
        self.consumer = consumer
        self.lost_after_s = lost_after_s
        self.beat_every_s = lost_after_s / 4
        self.max_waiting = max(1, max_waiting)
        self.ready = ready  # why this process cannot decode now (then it neither beats nor claims)
        self.served = 0
        self._claim = client.register_script(_CLAIM)
        self._beat = client.register_script(_BEAT)
        self._replies: SimpleQueue = SimpleQueue()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._claim_loop, name="sensevoice-live-claim",
                                          daemon=True),
                         threading.Thread(target=self._reply_loop, name="sensevoice-live-reply",
                                          daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def stop(self) -> None:
        """Stop taking re-decodes and leave the registry (the api processes move what this one
        holds at once); replies of re-decodes already running are still sent."""
        self._stop.set()
        self._threads[0].join(timeout=2)
        try:
            self._r.hdel(self.keys.workers, self.consumer)
            self._r.hdel(self.keys.capacity, self.consumer)
        except redis.RedisError:
            pass
        self._replies.put(None)
        self._threads[1].join(timeout=2)

    def _claim_loop(self) -> None:
        next_beat = 0.0
        while not self._stop.is_set():
            try:
                if self.ready() is not None:  # not serving: no beat, the api processes move on
                    self._stop.wait(self.beat_every_s)
                    continue
                now = time.monotonic()
                if now >= next_beat:  # with what this worker's live batches cost
                    self._beat(keys=[self.keys.workers, self.keys.capacity],
                               args=[self.consumer, _ms(self.lost_after_s),
                                     self.scheduler.live_batches.report()])
                    next_beat = now + self.beat_every_s
                room = self.max_waiting - self.scheduler.live_depth()
                if room <= 0:
                    self._stop.wait(0.002)
                    continue
                blobs = self._claim(keys=[self.keys.requests, self.keys.bell, self.keys.claims],
                                    args=[self.consumer, min(room, SEND_BATCH),
                                          _ms(2 * REQUEST_TTL_S)])
                if blobs:
                    self._take(blobs)
                else:  # wait for a bell, beating on time
                    self._r.blpop([self.keys.bell], timeout=max(0.01, next_beat - time.monotonic()))
            except redis.RedisError as e:
                logger.warning("live lane: the broker does not answer: %s", e)
                self._stop.wait(1.0)
            except Exception:
                logger.exception("live lane: unexpected error (the claimer goes on)")
                self._stop.wait(0.1)

    def _take(self, blobs: list[bytes]) -> None:
        items = []
        for blob in blobs:
            rid, reply_key, item = decode_request(blob)
            item.reply.add_done_callback(
                lambda f, rid=rid, key=reply_key: self._replies.put((rid, key, f)))
            items.append(item)
        for item in items:
            self.scheduler.put(item)
        self.served += len(items)

    def _reply_loop(self) -> None:
        while True:
            batch = _take_batch(self._replies)
            done = None in batch
            batch = [b for b in batch if b is not None]
            if batch:
                try:
                    pipe = self._r.pipeline(transaction=False)
                    for rid, key, future in batch:
                        pipe.rpush(key, encode_reply(rid, future))
                        pipe.pexpire(key, _ms(REPLY_TTL_S))
                    pipe.hdel(self.keys.claims, *{rid for rid, _, _ in batch})
                    pipe.execute()
                except redis.RedisError as e:  # the api processes see the claims and move them
                    logger.warning("live lane: %d replies not sent: %s", len(batch), e)
            if done:
                return


class ClusterBusy:
    """The worker processes' model time as an api process's live admission reads it (the
    embedded server reads its own workers'): the mean of the busy shares the live workers report
    (:meth:`RedisBroker.report_busy`, each second), read every ``READ_EVERY_S`` by a thread of
    its own (the event loop never waits on Redis), integrated into seconds so far. Before it an
    api process took the share of time one of its own re-decodes was in hand, which is near 1 as
    soon as a few dozen streams take turns: on the H200 it held 28-71 streams of 1,000-2,000."""

    READ_EVERY_S = 0.5

    def __init__(self, shares: Callable[[], list[float]], clock: Callable[[], float] = time.monotonic):
        self.shares, self.clock = shares, clock
        self._lock = threading.Lock()
        self._total, self._share, self._at = 0.0, 0.0, clock()
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def __call__(self) -> float:
        """Model seconds so far (per worker, averaged over the live workers)."""
        with self._lock:
            if self._thread is None:  # the first read starts the reading thread (once)
                self._thread = threading.Thread(target=self._run, name="sensevoice-cluster-busy",
                                                daemon=True)
                self._thread.start()
            return self._advance()

    def _advance(self) -> float:
        now = self.clock()
        self._total += self._share * (now - self._at)
        self._at = now
        return self._total

    def update(self) -> None:
        """Read the workers' shares once (the thread's step). No worker reporting reads as idle:
        the latency budget and the burst guard still hold admission."""
        try:
            shares = self.shares()
        except Exception as e:  # noqa: BLE001 - admission keeps the last share; the broker's health says why
            logger.debug("could not read the workers' busy shares: %s", e)
            return
        with self._lock:
            self._advance()  # the time so far at the old share
            self._share = sum(shares) / len(shares) if shares else 0.0

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.update()
            self._stopped.wait(self.READ_EVERY_S)


class ClusterCapacity:
    """What the live lane has left, as an api process's admission reads it in the distributed
    topology (issue 38; :class:`~pipeline.serving.live.LaneCapacity`): the live workers' reports
    (``P:live:capacity``) and the other api processes' demand (``P:live:demand``), read every
    ``READ_EVERY_S`` by a thread of its own that also writes this process's demand (the event
    loop never waits on Redis); :meth:`reserve` is the one blocking call, made off the loop, and
    atomic in Redis, so that N api processes cannot together over-admit."""

    READ_EVERY_S = 0.25
    DEMAND_TTL_S = 3.0  # an api process that stops reporting no longer counts after this

    shared = True

    def __init__(self, client: redis.Redis, prefix: str, clock: Callable[[], float] = time.monotonic):
        self._r = client
        self.keys = _Keys(prefix)
        self.me = uuid.uuid4().hex
        self.clock = clock
        self._reserve = client.register_script(_RESERVE)
        self._lock = threading.Lock()
        self._reports: list[str] = []  # the live workers' BatchProfile reports
        self._others = 0.0
        self._demand: float | None = None  # to write (None: written)
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def _started(self) -> None:
        with self._lock:
            if self._thread is None and not self._stopped.is_set():
                self._thread = threading.Thread(target=self._run, name="sensevoice-live-capacity",
                                                daemon=True)
                self._thread.start()

    def rate(self, budget_s: float) -> float | None:
        from pipeline.serving.admission import report_rate

        self._started()
        with self._lock:
            rates = [r for text in self._reports if (r := report_rate(text, budget_s)) is not None]
        return sum(r for r, _ in rates) if rates else None

    def queue_age(self) -> float:
        from pipeline.serving.admission import report_rate

        with self._lock:
            ages = [r[1] for text in self._reports if (r := report_rate(text, 1.0)) is not None]
        return min(ages, default=0.0)  # the least behind worker takes the next re-decode

    def others(self) -> float:
        with self._lock:
            return self._others

    def publish(self, demand: float) -> None:
        with self._lock:
            self._demand = demand

    def reserve(self, demand: float, limit: float) -> bool:
        try:
            ok, others = self._reserve(keys=[self.keys.demand],
                                       args=[self.me, repr(float(demand)), repr(float(limit)),
                                             _ms(self.DEMAND_TTL_S)])
        except redis.RedisError as e:
            raise BrokerUnavailable(f"the broker (Redis) does not answer: {e}") from e
        with self._lock:
            self._others = float(others)
        return bool(ok)

    def update(self) -> None:
        """One round (the thread's step): write this process's demand, read the others' and the
        workers' reports. A broker that does not answer keeps the last figures."""
        with self._lock:
            demand, self._demand = self._demand, None
        try:
            pipe = self._r.pipeline(transaction=False)
            pipe.time()
            pipe.hgetall(self.keys.capacity)
            pipe.hgetall(self.keys.demand)
            (sec, usec), capacity, demands = pipe.execute()
            now_ms = int(sec) * 1000 + int(usec) // 1000
            if demand is not None:
                self._r.hset(self.keys.demand, self.me,
                             f"{now_ms + _ms(self.DEMAND_TTL_S)} {float(demand)!r}")
        except redis.RedisError as e:
            logger.debug("could not read the live lane's capacity: %s", e)
            if demand is not None:
                self.publish(demand)
            return
        reports, others = [], 0.0
        for worker, value in capacity.items():
            expiry, _, report = value.decode().partition(" ")
            if int(expiry) > now_ms:
                reports.append(report)
        for api, value in demands.items():
            expiry, _, d = value.decode().partition(" ")
            if api.decode() != self.me and int(expiry) > now_ms:
                others += float(d)
        with self._lock:
            self._reports, self._others = reports, others

    def stop(self) -> None:
        self._stopped.set()

    def _run(self) -> None:
        while not self._stopped.is_set():
            self.update()
            self._stopped.wait(self.READ_EVERY_S)
