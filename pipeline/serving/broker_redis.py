"""RedisBroker: the job store and the work queue of the distributed topology, on Redis.

It has the JobStore methods that the Worker and the service call (``mark_running``, ``save_segments``,
``segment_count``, ``segments``, ``finish_many``, ``fail``, ``get``, ...), with the same state
machine (queued -> running -> done | failed, every transition state-checked), plus the queue
operations of the in-process Scheduler (``enqueue``, ``check_capacity``, ``queue_depth``) and the
consumer side of a worker process (``claim``, ``reclaim``, ``heartbeat``; ``Feeder`` runs them into a
local Scheduler, so the existing Worker runs unchanged with ``store=broker``).

Key layout (``P`` = prefix, default ``sv``; ``ID`` = job id)::

    P:job:ID       hash    the Job: id state lane options(JSON) filename audio_seconds created_at
                           started_at finished_at attempts result(JSON) error_code error_message
                           pieces (set by enqueue) progress (while unfinished)
    P:upload:ID    string  the original upload (review player, GET /api/jobs/{id}/audio): b"B" + its
                           bytes, or b"F" + the name of its file in the shared directory
    P:tomb:ID      string  "1": the id existed (after P:job:ID expired it answers 410, not 404)
    P:audio:ID     hash    piece -> that piece's 16 kHz audio: b"S" + 16-bit PCM, or b"F" + the name
                           of its file in the shared directory (pipeline/serving/payloads.py)
    P:entries:ID   hash    piece -> "<lane>:<stream entry id>" (so any process can ack a job)
    P:segs:ID      hash    piece -> JSON [start_s, end_s, speaker, raw_text, words(, scores)] (long
                           jobs; scores, when the engine gave them, records.dump_scores)
    P:queue:<lane> stream  one entry per WorkItem; consumer group ``workers``; lanes
                           ``interactive`` then ``bulk`` (types.Lane order = priority)
    P:workers      hash    alive:<consumer> -> expiry (unix ms); gpu:<consumer> -> "expiry ratio"
                           (the live workers and their free GPU memory, for metrics and admission)
    P:counts       hash    jobs per state, kept with HINCRBY on transitions (approximate: a record
                           that expires unfinished is not subtracted; done/failed are totals)

TTLs: while a job is unfinished its keys live ``retention_s + pending_margin_s`` (default one day
more than the retention: a queued job never expires before it could run); when it finishes (or
fails) the record and the upload are set to expire ``retention_s`` from then, and its audio, entries
and segments are deleted at once. The tombstone lives ``tombstone_s`` (30 days) beyond the record.
The embedded store's ``purge``/``recover`` have nothing to do here (TTLs and ``reclaim`` do it).

Queue: an entry is XACK'ed *and* XDEL'eted when its job is done, so XLEN of the lanes is the number
of items waiting + in flight, and ``queue_size`` bounds it cluster-wide (enqueue checks it in the
same Lua script that adds the entry). A worker process claims entries with XREADGROUP (interactive
lane first) and holds them until it finishes, fails or drops their job; ``heartbeat`` keeps the
entries it holds alive while they wait in its local queue or run (only those: an entry the worker
dropped, handed back with ``release``, or held longer than ``max_hold_s`` is left to expire), and
``reclaim`` takes over entries idle longer than ``visibility_timeout_s`` (their worker died or
hung). The reclaiming broker lets the job, still ``running``, run again as a new attempt. An entry
already delivered ``max_attempts`` times is not delivered again: its job fails with
``too_many_attempts`` (a poison input that kills workers cannot kill them forever).

Delivery is at-least-once, the result is written once: ``finish_many`` is one Lua script that
moves running -> done only if the job is running, sets the result and acks+deletes every entry of
the job atomically (those its record names, and any duplicate this process holds). A job
reclaimed while its first worker was only slow is finished by whichever worker comes first; the
other's finish returns an empty set. ``fail`` likewise (queued|running -> failed, once). Long jobs:
``save_segments`` acks each piece as it is stored, except the pieces that complete the job, which
stay pending until ``finish`` (a worker that dies in between leaves them to be reclaimed).

Durability: an accepted job is written with one MULTI/EXEC before the submit answers. With
``appendonly yes`` + ``appendfsync everysec`` (the recommended setting) a crash of the Redis host can
lose up to ~1 s of accepted jobs and transitions; with ``appendfsync always`` none (at a cost per
write). Without AOF (RDB snapshots only) a crash loses everything since the last snapshot. Redis must
run with ``maxmemory-policy noeviction``: an evicting Redis drops accepted jobs silently
(``config_warnings()`` reports these settings). Decoded audio is held in Redis until its job
finishes (16 kHz 16-bit PCM: 115 MB per hour of audio), uploads for the retention period; with a
shared directory (``Settings.shared_dir``) both are files there and Redis holds their names.

Errors: every connection error, timeout, "loading", read-only replica, OOM or MISCONF reply is
raised as errors.BrokerUnavailable (503 broker_unavailable + Retry-After), naming the URL without its
password. The client reconnects by itself: when Redis is back the same object works again, and
consumer groups that Redis lost are created again on the next claim.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import replace
from typing import Callable, Iterable
from urllib.parse import urlsplit, urlunsplit

import redis
import redis.asyncio as aredis
from redis.backoff import ExponentialBackoff
from redis.exceptions import (BusyLoadingError, ConnectionError as RedisConnectionError,
                              OutOfMemoryError, ReadOnlyError, ResponseError,
                              TimeoutError as RedisTimeoutError)
from redis.asyncio.retry import Retry as AsyncRetry
from redis.retry import Retry


from pipeline.domain.errors import (AudioGone, AudioLost, AudioUnreadable, BrokerUnavailable, JobGone, JobNotFound,
                                    JobUnfinished, QueueFull, TooManyAttempts)
from pipeline.serving import calls_index
from pipeline.serving.job_events import Feed, JobEvent
from pipeline.serving.live_redis import ClusterBusy, ClusterCapacity, LiveClient, LiveServer
from pipeline.serving.payloads import Payloads
from pipeline.serving.records import (SegmentResult, dump_options, dump_scores, dump_words,
                                      load_options, load_piece)
from pipeline.serving.scheduler import Scheduler, WorkItem
from pipeline.domain.types import Job, JobError, JobState, Lane, Transcript

logger = logging.getLogger("sensevoice.broker")

GROUP = "workers"  # the consumer group of every lane's stream
MEMORY_REPORT_S = 1.0  # how often a worker reports its free GPU memory
POSITION_SCAN_MAX = 64  # queue entries a position read scans at most (polls run it)
LANES = tuple(sorted(Lane))  # priority order: Lane.INTERACTIVE first
TOMBSTONE_S = 30 * 86400.0
PENDING_MARGIN_S = 86400.0
RECLAIM_SCAN = 100  # pending entries looked at per lane per reclaim call
SWEEP_PERIOD_S = 60.0  # how often the janitor looks for shared files whose values are gone
UNAVAILABLE = (RedisConnectionError, RedisTimeoutError, BusyLoadingError, ReadOnlyError,
               OutOfMemoryError)

# ---------------------------------------------------------------------------- Lua scripts
# Every script takes KEYS[1] = the counts hash, KEYS[2 .. L+1] = the lane streams (ARGV[1] = L).
_PRELUDE = """
local L = tonumber(ARGV[1])
local function ack_entry(value, group)
  local lane, id = string.match(value, '^(%d+):(.+)$')
  if lane then
    local s = KEYS[2 + tonumber(lane)]
    redis.pcall('XACK', s, group, id)
    redis.call('XDEL', s, id)
  end
end
local function ack_list(values, group)
  for v in string.gmatch(values or '', '[^,]+') do ack_entry(v, group) end
end
local function ack_all(entries, group)
  local e = redis.call('HGETALL', entries)
  for i = 2, #e, 2 do ack_entry(e[i], group) end
  redis.call('DEL', entries)
end
-- a job that just ended (done or failed): KEYS[k .. k+5] = job, entries, audio, segs, upload,
-- tomb. Its entries are acked and deleted, its audio and pieces deleted, the record and upload
-- kept for the retention, the tombstone beyond it.
local function close_job(k, ttl, tomb_ttl, group)
  redis.call('HDEL', KEYS[k], 'progress')
  ack_all(KEYS[k + 1], group)
  redis.call('DEL', KEYS[k + 2], KEYS[k + 3])
  redis.call('PEXPIRE', KEYS[k], ttl)
  redis.call('PEXPIRE', KEYS[k + 4], ttl)
  redis.call('PEXPIRE', KEYS[k + 5], tomb_ttl)
end
"""

# ARGV: L, limit (-1 = force), lane, piece, pieces, audio, ttl_ms, fields...
# KEYS: counts, streams..., job, audio, entries. Returns {1, id} | {0, state} (finished) | {-1, depth}
_ENQUEUE = _PRELUDE + """
local job, audio, entries = KEYS[L + 2], KEYS[L + 3], KEYS[L + 4]
local st = redis.call('HGET', job, 'state')
if st ~= 'queued' and st ~= 'running' then return {0, st or ''} end
local limit = tonumber(ARGV[2])
if limit >= 0 then
  local n = 0
  for i = 2, L + 1 do n = n + redis.call('XLEN', KEYS[i]) end
  if n >= limit then return {-1, n} end
end
local ttl = ARGV[7]
-- the audio itself (ARGV[6] is empty) is written by the same pipeline just before this script:
-- as a script argument its 640 KB per 10 s cost ~0.8 ms of Redis's one thread per job
local id = redis.call('XADD', KEYS[2 + tonumber(ARGV[3])], '*', unpack(ARGV, 8))
redis.call('HSET', entries, ARGV[4], ARGV[3] .. ':' .. id)
redis.call('PEXPIRE', entries, ttl)
redis.call('HSET', job, 'pieces', ARGV[5])
return {1, id}
"""

# ARGV: L, group, now, then per job: mode (0: queued only; 1: running is fine; 2: running is
# fine, a new attempt), held ("lane:id,lane:id": the entries this process holds for the job).
# KEYS: counts, streams..., job keys. Returns the 1-based indexes of the jobs that moved. The held
# entries of a job that did not move because it already ended are acked and deleted.
_MARK_RUNNING = _PRELUDE + """
local out = {}
local moved = 0
for i = L + 2, #KEYS do
  local j = i - L - 1
  local st = redis.call('HGET', KEYS[i], 'state')
  local mode = tonumber(ARGV[2 + 2 * j])
  if st == 'queued' then
    redis.call('HSET', KEYS[i], 'state', 'running', 'started_at', ARGV[3])
    redis.call('HINCRBY', KEYS[i], 'attempts', 1)
    moved = moved + 1
    out[#out + 1] = j
  elseif st == 'running' and mode > 0 then
    if mode == 2 then
      redis.call('HSET', KEYS[i], 'started_at', ARGV[3])
      redis.call('HINCRBY', KEYS[i], 'attempts', 1)
    end
    out[#out + 1] = j
  elseif st ~= 'running' then
    ack_list(ARGV[3 + 2 * j], ARGV[2])
  end
end
if moved > 0 then  -- the counts once per batch
  redis.call('HINCRBY', KEYS[1], 'queued', -moved)
  redis.call('HINCRBY', KEYS[1], 'running', moved)
end
return out
"""

# ARGV: L, group, now, ttl_ms, tomb_ttl_ms, then per job: result, held, summary, search text
# KEYS: counts, streams..., then per job: job, entries, audio, segs, upload, tomb, search.
# Returns 0/1 per job. Whether written now or ended before, an ended job's entries (registered,
# and held here) are acked and deleted. A job written now gets its calls-listing row in the same
# script (its summary and search text, pipeline/serving/calls_index.py) unless they are empty.
_FINISH = _PRELUDE + """
local out = {}
local n = (#KEYS - L - 1) / 7
local written = 0
for j = 1, n do
  local b = L + 1 + (j - 1) * 7
  local job = KEYS[b + 1]
  local st = redis.call('HGET', job, 'state')
  out[j] = 0
  if st == 'running' then
    redis.call('HSET', job, 'state', 'done', 'finished_at', ARGV[3], 'result', ARGV[2 + 4 * j])
    close_job(b + 1, ARGV[4], ARGV[5], ARGV[2])
    written = written + 1
    if ARGV[4 + 4 * j] ~= '' then
      redis.call('HSET', job, 'summary', ARGV[4 + 4 * j])
      redis.call('SET', KEYS[b + 7], ARGV[5 + 4 * j], 'PX', ARGV[4])
    end
    out[j] = 1
    st = 'done'
  end
  if st ~= 'queued' and st ~= 'running' then ack_list(ARGV[3 + 4 * j], ARGV[2]) end
end
if written > 0 then  -- the counts once per batch
  redis.call('HINCRBY', KEYS[1], 'running', -written)
  redis.call('HINCRBY', KEYS[1], 'done', written)
end
return out
"""

# ARGV: L, group, now, ttl_ms, tomb_ttl_ms, code, message, held
# KEYS: counts, streams..., job, entries, audio, segs, upload, tomb. Returns 1 if failed now.
_FAIL = _PRELUDE + """
local job = KEYS[L + 2]
local st = redis.call('HGET', job, 'state')
ack_list(ARGV[8], ARGV[2])
if st ~= 'queued' and st ~= 'running' then return 0 end
redis.call('HSET', job, 'state', 'failed', 'finished_at', ARGV[3], 'error_code', ARGV[6],
           'error_message', ARGV[7])
close_job(L + 2, ARGV[4], ARGV[5], ARGV[2])
redis.call('HINCRBY', KEYS[1], st, -1)
redis.call('HINCRBY', KEYS[1], 'failed', 1)
return 1
"""

# ARGV: L, group, ttl_ms, held (of these pieces), then piece, json pairs
# KEYS: counts, streams..., job, segs, entries, audio. Returns {pieces stored, 1 if kept pending}.
# The pieces' entries are acked -- unless they complete the job: then they stay pending until
# finish acks them, so a worker that dies between the last piece and finish leaves the job to be
# reclaimed (and finished) instead of running forever.
_SAVE_SEGMENTS = _PRELUDE + """
local job, segs, entries, audio = KEYS[L + 2], KEYS[L + 3], KEYS[L + 4], KEYS[L + 5]
local st = redis.call('HGET', job, 'state')
local n = 0
if st == 'queued' or st == 'running' then
  for i = 5, #ARGV, 2 do redis.call('HSET', segs, ARGV[i], ARGV[i + 1]) end
  redis.call('PEXPIRE', segs, ARGV[3])
  n = redis.call('HLEN', segs)
  local total = tonumber(redis.call('HGET', job, 'pieces') or '0')
  if total > 0 then
    redis.call('HSET', job, 'progress', 'segment ' .. n .. ' of ' .. total)
    if n >= total then return {n, 1} end
  end
end
for i = 5, #ARGV, 2 do
  local v = redis.call('HGET', entries, ARGV[i])
  if v then ack_entry(v, ARGV[2]) end
  redis.call('HDEL', entries, ARGV[i])
  redis.call('HDEL', audio, ARGV[i])
end
ack_list(ARGV[4], ARGV[2])
return {n, 0}
"""

# ARGV: L, consumer, group, then "lane:id" of the entries this process holds for the consumer.
# KEYS: counts, streams... Resets the idle time of each entry still pending for this consumer
# (XCLAIM JUSTID: the delivery count is not raised), atomically with the ownership check, so an
# entry another consumer reclaimed meanwhile is never taken back. Returns {renewed, gone...}.
_HEARTBEAT = _PRELUDE + """
local out = {0}
for i = 4, #ARGV do
  local lane, id = string.match(ARGV[i], '^(%d+):(.+)$')
  local s = KEYS[2 + tonumber(lane)]
  local p = redis.pcall('XPENDING', s, ARGV[3], id, id, 1, ARGV[2])
  if type(p) == 'table' and not p.err and #p == 1 then
    redis.call('XCLAIM', s, ARGV[3], ARGV[2], 0, id, 'JUSTID')
    out[1] = out[1] + 1
  else
    out[#out + 1] = ARGV[i]
  end
end
return out
"""

# ARGV: L, then the piece of each claimed entry. KEYS: counts, streams..., then the job key and
# the audio key of each entry. Returns {seconds, microseconds (Redis's clock), then per entry the
# job's state and the piece's audio value (false where missing)}: one command for a whole claim.
_LOAD = _PRELUDE + """
local t = redis.call('TIME')
local out = {t[1], t[2]}
for i = 2, #ARGV do
  local k = L + 2 * i - 2
  local job = redis.call('HMGET', KEYS[k], 'state', 'audio_seconds', 'filename')
  out[#out + 1] = job[1]
  out[#out + 1] = redis.call('HGET', KEYS[k + 1], ARGV[i])
  out[#out + 1] = job[2]
  out[#out + 1] = job[3]
end
return out
"""

# ARGV: L, group, cap. KEYS: counts, streams..., entries. The 1-based place of the job's earliest
# entry among the entries not yet delivered to any worker, or 0 when none is waiting undelivered.
_POSITION = _PRELUDE + """
local e = redis.call('HGETALL', KEYS[L + 2])
local best_lane, best_id, best_ms, best_seq
for i = 2, #e, 2 do
  local lane, id = string.match(e[i], '^(%d+):(.+)$')
  local ms, seq = string.match(id, '^(%d+)-(%d+)$')
  lane, ms, seq = tonumber(lane), tonumber(ms), tonumber(seq)
  if best_lane == nil or lane < best_lane or (lane == best_lane and (ms < best_ms or
      (ms == best_ms and seq < best_seq))) then
    best_lane, best_id, best_ms, best_seq = lane, id, ms, seq
  end
end
if best_lane == nil then return 0 end
local function last_delivered(s)
  local groups = redis.pcall('XINFO', 'GROUPS', s)
  if type(groups) ~= 'table' or groups.err then return '0-0' end
  for _, g in ipairs(groups) do
    local name, last
    for k = 1, #g, 2 do
      if g[k] == 'name' then name = g[k + 1] end
      if g[k] == 'last-delivered-id' then last = g[k + 1] end
    end
    if name == ARGV[2] then return last end
  end
  return '0-0'
end
local cap = tonumber(ARGV[3])
local s = KEYS[2 + best_lane]
local mine = #redis.call('XRANGE', s, '(' .. last_delivered(s), best_id, 'COUNT', cap)
if mine == 0 then return 0 end
local ahead = 0
for lane = 0, best_lane - 1 do
  local t = KEYS[2 + lane]
  ahead = ahead + #redis.call('XRANGE', t, '(' .. last_delivered(t), '+', 'COUNT', cap)
end
return ahead + mine
"""

# ARGV: L. KEYS: counts, streams..., job, upload, tomb, audio, entries, segs. Forget a job that was
# never accepted (still queued): its entries are acked and deleted too.
_DISCARD = _PRELUDE + """
if redis.call('HGET', KEYS[L + 2], 'state') ~= 'queued' then return 0 end
ack_all(KEYS[L + 6], ARGV[2])
redis.call('DEL', KEYS[L + 2], KEYS[L + 3], KEYS[L + 4], KEYS[L + 5], KEYS[L + 7])
redis.call('HINCRBY', KEYS[1], 'queued', -1)
return 1
"""

# A finished job removed or kept by a person (JobRemoval). Both answer {1, ''} (done), {0, ''} (no
# such job), {-1, ''} (purged: the tombstone) or {2, state} (queued or running: refused).
_FINISHED_ONLY = """
local function finished_only(job, tomb)
  local st = redis.call('HGET', job, 'state')
  if not st then
    if redis.call('EXISTS', tomb) == 1 then return {-1, ''} end
    return {0, ''}
  end
  if st ~= 'done' and st ~= 'failed' then return {2, st} end
  return nil
end
"""

# ARGV: L, job id, tomb_ttl_ms. KEYS: counts, streams..., job, upload, audio, entries, segs, search,
# tomb, calls. What the retention's expiry drops, dropped now; the tombstone kept (410, not 404).
_REMOVE = _PRELUDE + _FINISHED_ONLY + """
local refused = finished_only(KEYS[L + 2], KEYS[L + 8])
if refused then return refused end
redis.call('DEL', KEYS[L + 2], KEYS[L + 3], KEYS[L + 4], KEYS[L + 5], KEYS[L + 6], KEYS[L + 7])
redis.call('ZREM', KEYS[L + 9], ARGV[2])
redis.call('SET', KEYS[L + 8], '1', 'PX', ARGV[3])
return {1, ''}
"""

# ARGV: L, until (unix s), its TTL from now (ms), the tombstone's beyond it (ms). KEYS: counts,
# streams..., job, upload, tomb. The record and upload live until then at least (never shorter).
_KEEP = _PRELUDE + _FINISHED_ONLY + """
local job, upload, tomb = KEYS[L + 2], KEYS[L + 3], KEYS[L + 4]
local refused = finished_only(job, tomb)
if refused then return refused end
local kept = redis.call('HGET', job, 'kept_until')
if kept and tonumber(kept) >= tonumber(ARGV[2]) then return {1, kept} end
redis.call('HSET', job, 'kept_until', ARGV[2])
local ttl = tonumber(ARGV[3])
for _, k in ipairs({job, upload}) do
  local left = redis.call('PTTL', k)
  if left >= 0 and left < ttl then redis.call('PEXPIRE', k, ttl) end
end
local left = redis.call('PTTL', tomb)
if left >= 0 and left < ttl + tonumber(ARGV[4]) then redis.call('PEXPIRE', tomb, ttl + tonumber(ARGV[4])) end
return {1, ARGV[2]}
"""

# ARGV: L, text. KEYS: counts, streams..., job. Never creates a record that expired.
_SET_PROGRESS = _PRELUDE + """
local st = redis.call('HGET', KEYS[L + 2], 'state')
if st ~= 'queued' and st ~= 'running' then return 0 end
redis.call('HSET', KEYS[L + 2], 'progress', ARGV[2])
return 1
"""

# ARGV: L. KEYS: counts, streams..., job. running -> queued.
_REQUEUE = _PRELUDE + """
if redis.call('HGET', KEYS[L + 2], 'state') ~= 'running' then return 0 end
redis.call('HSET', KEYS[L + 2], 'state', 'queued')
redis.call('HDEL', KEYS[L + 2], 'started_at')
redis.call('HINCRBY', KEYS[1], 'running', -1)
redis.call('HINCRBY', KEYS[1], 'queued', 1)
return 1
"""


# ---------------------------------------------------------------------------- helpers
def redact_url(url: str) -> str:
    """The URL without its password (``redis://user:***@host:port/db``)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        host = parts.hostname or ""
        if parts.port:
            host = f"{host}:{parts.port}"
        user = parts.username or ""
        return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))
    except ValueError:
        return "<unparseable broker URL>"


def _unavailable_reply(e: Exception) -> bool:
    return isinstance(e, UNAVAILABLE) or (
        isinstance(e, ResponseError) and str(e).startswith(("MISCONF", "LOADING", "READONLY",
                                                            "MASTERDOWN", "OOM")))


def _s(b) -> str:
    return b.decode() if isinstance(b, bytes) else str(b)


def _opt_float(b) -> float | None:
    return float(b) if b not in (None, b"") else None


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


def _job_from_hash(h: dict, job_id: str) -> Job:
    g = lambda k: h.get(k.encode())  # noqa: E731
    state = JobState(_s(g("state")))
    result = g("result")
    code = g("error_code")
    meta = {}
    if state in (JobState.QUEUED, JobState.RUNNING):
        progress = g("progress")
        meta["progress"] = _s(progress) if progress else None
    elif h.get(b"review"):
        meta["review"] = calls_index.redis_review(h)
    if g("kept_until"):  # kept beyond its retention (JobRemoval.keep)
        meta["kept_until"] = float(g("kept_until"))
    return Job(
        id=job_id, state=state, options=load_options(g("options")),
        lane=Lane(int(g("lane"))), created_at=float(g("created_at")),
        audio_seconds=float(g("audio_seconds")), filename=_s(g("filename") or b""),
        started_at=_opt_float(g("started_at")), finished_at=_opt_float(g("finished_at")),
        attempts=int(g("attempts") or 0),
        result=Transcript.from_dict(json.loads(result)) if result else None,
        error=JobError(_s(code), _s(g("error_message") or b"")) if code else None,
        meta=meta,
    )


def _refused(job_id: str, code: int, state) -> None:
    """The answer of the remove/keep scripts as the error it means (1: done, nothing raised)."""
    if code == 0:
        raise JobNotFound(f"no job with id {job_id!r}")
    if code == -1:
        raise _gone(job_id)
    if code == 2:
        raise JobUnfinished(f"job {job_id} is {_s(state)}: only a finished job is deleted or kept; "
                            "wait for its end")


def _gone(job_id: str) -> JobGone:
    return JobGone(f"job {job_id} finished more than the retention period ago; its result and "
                   "audio were deleted")


def _translated(method):
    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            if _unavailable_reply(e):
                raise self._unavailable(e) from None
            raise
    return wrapper


def _atranslated(method):
    @functools.wraps(method)
    async def wrapper(self, *args, **kwargs):
        try:
            return await method(self, *args, **kwargs)
        except Exception as e:
            if _unavailable_reply(e):
                raise self._unavailable(e) from None
            raise
    return wrapper


# ---------------------------------------------------------------------------- the broker
class RedisBroker:
    """Job records, results and the lane queues on one Redis; thread-safe (a connection pool).
    The distributed topology's adapter of every port (pipeline/serving/ports.py): other processes
    write it too, so this process's feed hears only its own writes; the queue and the workers
    live outside this process."""

    hears_every_change = False  # other processes write it: a change is seen by reading again
    recovers_here = False  # the queue outlives this process: accepted work is queued whole first
    workers_elsewhere = True  # worker processes report liveness, free memory and busy time here
    spools_pcm16 = False  # an upload's samples go to the workers in its payload (shared file or Redis)

    def __init__(self, url: str, retention_s: float, queue_size: int,
                 visibility_timeout_s: float = 60.0, max_attempts: int = 3, retry_after_s: int = 2,
                 prefix: str = "sv", *, pending_margin_s: float = PENDING_MARGIN_S,
                 tombstone_s: float = TOMBSTONE_S, socket_timeout_s: float = 5.0,
                 max_hold_s: float = 900.0, shared_dir: str | os.PathLike | None = None,
                 live_lost_after_s: float = 1.0):
        self.url = url
        self.feed = Feed()  # this process's writes (other processes' are read from Redis)
        # audio and uploads: inline in Redis, or files in a directory all processes share
        self.payloads = Payloads(shared_dir)
        self._swept_at = 0.0
        self.safe_url = redact_url(url)
        self.retention_s = retention_s
        self.queue_size = queue_size
        self.maxsize = queue_size  # the Scheduler's name for it
        self.visibility_timeout_s = visibility_timeout_s
        self.max_attempts = max_attempts
        self.retry_after_s = retry_after_s
        self.prefix = prefix
        self.pending_margin_s = pending_margin_s
        self.tombstone_s = tombstone_s
        self.socket_timeout_s = socket_timeout_s
        self.max_hold_s = max_hold_s
        self.live_lost_after_s = live_lost_after_s
        self._live: LiveClient | None = None  # the api side of the live lane, made on first use
        self._client_kw = dict(decode_responses=False, socket_timeout=socket_timeout_s,
                               socket_connect_timeout=min(socket_timeout_s, 2.0),
                               health_check_interval=30)
        # one quick retry: the first command on a pooled connection that Redis closed (a restart)
        # reconnects instead of failing; a Redis that is down fails within milliseconds
        self._r = redis.Redis.from_url(
            url, retry=Retry(ExponentialBackoff(cap=0.1, base=0.02), 1), **self._client_kw)
        self._streams = [f"{prefix}:queue:{lane.name.lower()}" for lane in LANES]
        self._counts = f"{prefix}:counts"
        # live workers and their free GPU memory: field -> "expiry_ms [ratio]" (host clocks must
        # agree to well within the visibility timeout: NTP)
        self._workers = f"{prefix}:workers"
        self._busy_reports: dict[str, tuple[float, float, float | None]] = {}  # field -> busy, at, share
        self._cluster_busy: ClusterBusy | None = None
        self._live_capacity: ClusterCapacity | None = None
        self._lane_keys = [self._counts, *self._streams]
        self._scripts = {name: self._r.register_script(src) for name, src in (
            ("enqueue", _ENQUEUE), ("mark_running", _MARK_RUNNING), ("finish", _FINISH),
            ("fail", _FAIL), ("save_segments", _SAVE_SEGMENTS), ("heartbeat", _HEARTBEAT),
            ("position", _POSITION), ("discard", _DISCARD), ("set_progress", _SET_PROGRESS),
            ("requeue", _REQUEUE), ("load", _LOAD), ("remove", _REMOVE), ("keep", _KEEP))}
        self._groups_ready = False
        self._lock = threading.Lock()
        self._reclaimed: set[str] = set()  # job ids this broker reclaimed: running is fine for them
        # entries this process claimed and has not handed back: "lane:id" -> (consumer, job id,
        # piece, monotonic time claimed). Heartbeats renew these (and only these); a finish, a
        # failure or a drop acks or releases them.
        self._held: dict[str, tuple[str, str, int, float]] = {}
        self._held_by_job: dict[str, set[str]] = {}  # job id -> its values in _held (no scans)
        # job id -> (audio seconds, file name) of a held job, read by the claim: what its
        # calls-listing row needs, written by the finish script itself (no round trip more)
        self._listing: dict[str, tuple[float, str]] = {}
        self._aclients: dict[int, tuple[asyncio.AbstractEventLoop, aredis.Redis, object]] = {}
        self._calls: calls_index.RedisCalls | None = None

    # ------------------------------------------------------------------ keys and plumbing
    def _k(self, kind: str, job_id: str) -> str:
        return f"{self.prefix}:{kind}:{job_id}"

    # the store's own index (pipeline/serving/calls_index.py: the calls listing's summaries and
    # search texts beside the job records) reads and writes through these two
    @property
    def client(self) -> redis.Redis:
        """The connection pool's client."""
        return self._r

    def key(self, kind: str, job_id: str) -> str:
        """A job's key of one kind ("job", "search", ...) under this broker's prefix."""
        return self._k(kind, job_id)

    def _held_values(self, job_id: str, pieces: set[int] | None = None) -> str:
        with self._lock:
            return ",".join(v for v in self._held_by_job.get(job_id, ())
                            if pieces is None or self._held[v][2] in pieces)

    def _hold(self, value: str, consumer: str, job_id: str, piece: int, at: float) -> None:
        """(under ``_lock``) Record an entry this process claimed."""
        self._held[value] = (consumer, job_id, piece, at)
        self._held_by_job.setdefault(job_id, set()).add(value)

    def _unhold(self, value: str) -> None:
        """(under ``_lock``) Forget an entry this process held (no-op if it did not)."""
        held = self._held.pop(value, None)
        if held is not None:
            values = self._held_by_job.get(held[1])
            if values is not None:
                values.discard(value)
                if not values:
                    del self._held_by_job[held[1]]
                    self._listing.pop(held[1], None)

    def _release(self, job_ids: Iterable[str], pieces: set[int] | None = None) -> None:
        with self._lock:
            for jid in set(job_ids):
                for v in [v for v in self._held_by_job.get(jid, ())
                          if pieces is None or self._held[v][2] in pieces]:
                    self._unhold(v)

    def release(self, job_ids: Iterable[str]) -> None:
        """Hand back (without acking) the entries this process holds for these jobs: it dropped
        them (e.g. a batch cut short by a broker outage). Heartbeats stop renewing them, so another
        worker reclaims them after the visibility timeout. Local only: never raises."""
        self._release(job_ids)

    def _outage(self, e: Exception) -> BrokerUnavailable | None:
        """The error a Redis error is answered with when it is an outage (else None)."""
        return self._unavailable(e) if _unavailable_reply(e) else None

    def calls(self) -> calls_index.RedisCalls:
        """The calls index kept in the job records (reviews, the calls listing)."""
        if self._calls is None:
            self._calls = calls_index.RedisCalls(self, self._outage)
        return self._calls

    def _unavailable(self, e: Exception) -> BrokerUnavailable:
        return BrokerUnavailable(
            f"the job broker (Redis at {self.safe_url}) is unavailable ({e}); "
            f"try again in {BrokerUnavailable.retry_after} s")

    @property
    def _ttl_pending_ms(self) -> int:
        return _ms(self.retention_s + self.pending_margin_s)

    @property
    def _ttl_done_ms(self) -> int:
        return _ms(self.retention_s)

    @property
    def _ttl_tomb_ms(self) -> int:
        return _ms(self.retention_s + self.tombstone_s)

    def _run(self, name: str, keys: list[str], args: list, client=None):
        return self._scripts[name](keys=[*self._lane_keys, *keys],
                                   args=[len(LANES), *args], client=client)

    def _ensure_groups(self, force: bool = False) -> None:
        if self._groups_ready and not force:
            return
        for s in self._streams:
            try:
                self._r.xgroup_create(s, GROUP, id="0", mkstream=True)
            except ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise
        self._groups_ready = True

    def _with_groups(self, fn):
        """Run ``fn`` with the consumer groups in place; if Redis lost them (restarted empty,
        flushed), create them again and retry once."""
        self._ensure_groups()
        try:
            return fn()
        except ResponseError as e:
            if "NOGROUP" not in str(e):
                raise
            logger.warning("the broker had lost its consumer groups; creating them again")
            self._ensure_groups(force=True)
            return fn()

    def close(self) -> None:
        if self._live is not None:
            self._live.close()
        if self._cluster_busy is not None:
            self._cluster_busy.stop()
        if self._live_capacity is not None:
            self._live_capacity.stop()
        self._r.close()

    # ------------------------------------------------------------------ health
    def ping(self) -> bool:
        try:
            return bool(self._r.ping())
        except Exception:
            return False

    @_translated
    def config_warnings(self) -> list[str]:
        """What in the server's configuration endangers accepted jobs ([] when CONFIG is
        disabled, as on some managed services)."""
        try:
            cfg = {_s(k): _s(v) for k, v in self._r.config_get(
                "appendonly", "appendfsync", "maxmemory-policy").items()}
        except ResponseError:
            return []
        out = []
        if cfg.get("appendonly") != "yes":
            out.append("appendonly is off: a crash of Redis loses every job since the last snapshot")
        elif cfg.get("appendfsync") == "no":
            out.append("appendfsync is 'no': a crash of the host can lose ~30 s of accepted jobs")
        if cfg.get("maxmemory-policy", "noeviction") != "noeviction":
            out.append(f"maxmemory-policy is {cfg['maxmemory-policy']!r}: Redis may evict "
                       "accepted jobs; use noeviction")
        return out

    # ------------------------------------------------------------------ jobs: writes
    @_translated
    def create(self, job: Job, upload: bytes) -> None:
        """Store the job record (queued), its upload and its tombstone in one transaction."""
        ttl = self._ttl_pending_ms
        record = {
            "id": job.id, "state": JobState.QUEUED.value, "lane": int(job.lane),
            "options": dump_options(job.options), "filename": job.filename,
            "audio_seconds": repr(float(job.audio_seconds)), "created_at": repr(float(job.created_at)),
            "attempts": 0,
        }
        pipe = self._r.pipeline(transaction=True)
        pipe.hset(self._k("job", job.id), mapping=record)
        pipe.pexpire(self._k("job", job.id), ttl)
        pipe.set(self._k("upload", job.id), self.payloads.upload(job.id, upload), px=ttl)
        pipe.set(self._k("tomb", job.id), b"1", px=ttl + _ms(self.tombstone_s))
        pipe.hincrby(self._counts, JobState.QUEUED.value, 1)
        calls_index.redis_on_create(pipe, self.prefix, job)  # the server's calls table lists it
        pipe.execute()

    @_translated
    def mark_running(self, job_ids: Iterable[str], already_running_ok: bool = False) -> set[str]:
        """queued -> running (attempts + 1, started_at). Returns the ids that moved (plus, with
        ``already_running_ok``, those already running). A job this broker reclaimed from a dead
        worker is running already: it moves too, as a new attempt."""
        ids = list(dict.fromkeys(job_ids))
        if not ids:
            return set()
        with self._lock:
            modes = [2 if jid in self._reclaimed else (1 if already_running_ok else 0) for jid in ids]
            self._reclaimed.difference_update(ids)
        args: list = [GROUP, repr(time.time())]
        for jid, mode in zip(ids, modes):
            args += [mode, self._held_values(jid)]
        moved = {ids[int(i) - 1] for i in self._run("mark_running",
                                                    [self._k("job", j) for j in ids], args)}
        self._release(set(ids) - moved)  # dropped by the worker: acked if ended, else reclaimable
        self.feed.publish([JobEvent(jid, JobState.RUNNING) for jid in moved])
        return moved

    @_translated
    def save_segments(self, results: Iterable[SegmentResult]) -> None:
        """Store piece results of long jobs (re-running a piece overwrites it) and ack those
        pieces' queue entries; sets the job's progress ("segment n of total")."""
        by_job: dict[str, list[SegmentResult]] = {}
        for r in results:
            by_job.setdefault(r.job_id, []).append(r)
        if not by_job:
            return
        pipe = self._r.pipeline(transaction=False)
        for jid, rs in by_job.items():
            args: list = [GROUP, self._ttl_pending_ms, self._held_values(jid, {r.idx for r in rs})]
            for r in rs:
                row = [r.start_s, r.end_s, r.speaker, r.raw_text, dump_words(r.words)]
                if (scores := dump_scores(r)) is not None:  # a row of before has none
                    row.append(scores)
                args += [r.idx, json.dumps(row, ensure_ascii=False)]
            self._run("save_segments", [self._k("job", jid), self._k("segs", jid),
                                        self._k("entries", jid), self._k("audio", jid)],
                      args, client=pipe)
        for (jid, rs), (_, kept) in zip(by_job.items(), pipe.execute()):
            if not int(kept):  # acked; kept pieces (the job's last) stay held until finish
                self._release([jid], {r.idx for r in rs})
                for r in rs:  # their audio values are deleted: their files too
                    self.payloads.delete_piece(jid, r.idx)

    @_translated
    def segment_count(self, job_id: str) -> int:
        return int(self._r.hlen(self._k("segs", job_id)))

    @_translated
    def segments(self, job_id: str) -> list[SegmentResult]:
        out = []
        for idx, raw in self._r.hgetall(self._k("segs", job_id)).items():
            out.append(load_piece(job_id, int(idx), *json.loads(raw)))
        return sorted(out, key=lambda r: (r.start_s, r.idx))

    @_translated
    def clear_segments(self, job_id: str) -> None:
        self._r.delete(self._k("segs", job_id))

    def finish(self, job_id: str, result: Transcript) -> bool:
        return job_id in self.finish_many([(job_id, result)])

    @_translated
    def finish_many(self, results: Iterable[tuple[str, Transcript]]) -> set[str]:
        """running -> done, once, in one atomic script: sets the result, acks and deletes every
        queue entry of the job, deletes its audio and segments, and lets the record and upload
        expire ``retention_s`` from now. Returns the ids that were written."""
        results = list(results)
        if not results:
            return set()
        keys = []
        for jid, _ in results:
            keys += [self._k("job", jid), self._k("entries", jid), self._k("audio", jid),
                     self._k("segs", jid), self._k("upload", jid), self._k("tomb", jid),
                     self._k("search", jid)]
        args: list = [GROUP, repr(time.time()), self._ttl_done_ms, self._ttl_tomb_ms]
        unlisted = []  # jobs whose claim this process did not see: listed after the script
        for jid, t in results:
            held, listing = self._held_values(jid), self._listing.get(jid)
            row = ("", "") if listing is None else calls_index.listing_row(t, *listing)
            if listing is None:
                unlisted.append(jid)
            args += [t.to_json(), held, *row]
        flags = self._run("finish", keys, args)
        written = {jid for (jid, _), f in zip(results, flags) if int(f)}
        with self._lock:
            self._reclaimed.difference_update(jid for jid, _ in results)
        self._release(jid for jid, _ in results)
        self.payloads.delete_audio(written)
        if unlisted:
            calls_index.redis_index_finished(self, written & set(unlisted), results)
        self.feed.publish([JobEvent(jid, JobState.DONE) for jid in written])
        return written

    @_translated
    def fail(self, job_id: str, code: str, message: str) -> bool:
        """queued|running -> failed, once; acks and deletes the job's queue entries."""
        with self._lock:
            self._reclaimed.discard(job_id)
        failed = bool(self._run("fail", [
            self._k("job", job_id), self._k("entries", job_id), self._k("audio", job_id),
            self._k("segs", job_id), self._k("upload", job_id), self._k("tomb", job_id)],
            [GROUP, repr(time.time()), self._ttl_done_ms, self._ttl_tomb_ms, code, message,
             self._held_values(job_id)]))
        self._release([job_id])
        if failed:
            self.payloads.delete_audio([job_id])
            self.feed.publish([JobEvent(job_id, JobState.FAILED)])
        return failed

    @_translated
    def requeue(self, job_id: str) -> bool:
        """running -> queued (state only: the job's queue entries stay as they are)."""
        return bool(self._run("requeue", [self._k("job", job_id)], []))

    @_translated
    def set_progress(self, job_id: str, text: str) -> None:
        """Progress of an unfinished job (Job.meta["progress"]); ignored once it finished."""
        self._run("set_progress", [self._k("job", job_id)], [text])
        self.feed.publish([JobEvent(job_id, None, text)])

    @_translated
    def discard(self, job_id: str) -> None:
        """Forget a job that was never accepted (the queue filled up between checks)."""
        self._run("discard", [self._k("job", job_id), self._k("upload", job_id),
                              self._k("tomb", job_id), self._k("audio", job_id),
                              self._k("entries", job_id), self._k("segs", job_id)], [GROUP])
        self._release([job_id])
        self.payloads.delete_audio([job_id])
        self.payloads.delete_upload(job_id)

    @_translated
    def delete_spool(self, job_id: str) -> None:
        """Delete the upload bytes (done-and-delete setting)."""
        self._r.delete(self._k("upload", job_id))
        self.payloads.delete_upload(job_id)

    def purge(self, finished_before: float) -> list[str]:
        """Records expire by TTL; what is left here is the shared directory's files whose Redis
        values are gone (swept at most every ``SWEEP_PERIOD_S``)."""
        if self.payloads.dir is not None and time.monotonic() - self._swept_at > SWEEP_PERIOD_S:
            self._swept_at = time.monotonic()
            self.payloads.sweep(self._still_stored, upload_min_age_s=self.retention_s)
        return []

    @_translated
    def remove(self, job_id: str) -> None:
        """Delete a finished job now, as its retention's expiry would (JobRemoval): its record (the
        result and review in it), upload, pieces, search text and calls-listing entry; the
        tombstone stays (410)."""
        code, state = self._run("remove", [self._k(k, job_id) for k in (
            "job", "upload", "audio", "entries", "segs", "search", "tomb")] + [calls_index.calls_key(self.prefix)],
            [job_id, self._ttl_tomb_ms - self._ttl_done_ms])
        _refused(job_id, int(code), state)
        self.payloads.delete_audio([job_id])
        self.payloads.delete_upload(job_id)

    @_translated
    def keep(self, job_id: str, until: float) -> float:
        """Keep a finished job until ``until`` (unix s) at least (JobRemoval): its record and
        upload expire then, not before; the time it is kept until."""
        ttl_ms = max(_ms(until - time.time()), 1)
        code, kept = self._run("keep", [self._k("job", job_id), self._k("upload", job_id),
                                        self._k("tomb", job_id)],
                               [repr(float(until)), ttl_ms, self._ttl_tomb_ms - self._ttl_done_ms])
        _refused(job_id, int(code), kept)
        return float(kept)

    @_translated
    def _still_stored(self, names: list[str]) -> list[bool]:
        """For shared file names (``uploads/ID``, ``audio/ID/N``): is the Redis value still there?"""
        pipe = self._r.pipeline(transaction=False)
        for name in names:
            kind, jid, *piece = name.split("/")
            if kind == "uploads":
                pipe.exists(self._k("upload", jid))
            else:
                pipe.hexists(self._k("audio", jid), piece[0])
        return [bool(x) for x in pipe.execute()]

    def recover(self) -> list[Job]:
        return []  # a dead worker's entries are reclaimed (reclaim), nothing waits in memory

    # ------------------------------------------------------------------ jobs: reads
    @_translated
    def get(self, job_id: str) -> Job:
        """The job (JobNotFound: never existed; JobGone: expired after the retention). A queued
        job carries its place in the cluster queue (Job.position), progress in meta."""
        pipe = self._r.pipeline(transaction=False)
        pipe.hgetall(self._k("job", job_id))
        pipe.exists(self._k("tomb", job_id))
        h, tomb = pipe.execute()
        if not h:
            raise _gone(job_id) if tomb else JobNotFound(f"no job with id {job_id!r}")
        job = _job_from_hash(h, job_id)
        if job.state is JobState.QUEUED:
            job = self._with_position(job, self._position_raw(job_id))
        return job

    def _position_raw(self, job_id: str) -> int:
        return int(self._run("position", [self._k("entries", job_id)], [GROUP, self._position_scan]))

    @property
    def _position_scan(self) -> int:
        """Entries a position read may scan (it runs inside Redis on every poll of a queued job:
        scanning the whole queue made 400 polls/s saturate Redis on the H200 and the cluster
        served 89 jobs/s instead of 282); a job further back reports this many as its place."""
        return min(self.queue_size, POSITION_SCAN_MAX)

    @staticmethod
    def _with_position(job: Job, pos: int) -> Job:
        return replace(job, position=pos or None)

    @_translated
    def position(self, job_id: str) -> int | None:
        """1-based place of a queued job among the entries no worker has claimed yet (higher
        lanes first), or None (claimed by a worker, running, finished, unknown)."""
        return self._position_raw(job_id) or None

    def feeder(self, scheduler: Scheduler, consumer: str, prefetch: int,
               free_memory: Callable[[], float | None],
               busy_seconds: Callable[[], float] | None = None) -> "Feeder":
        """The thread that keeps a worker process's local scheduler supplied from this broker."""
        return Feeder(self, scheduler, consumer, prefetch=prefetch, free_memory=free_memory,
                      busy_seconds=busy_seconds)

    def upload_path(self, job_id: str) -> None:
        """No file on this host to serve: the upload is read from the broker (:meth:`load_upload`)."""
        return None

    def spooled_audio(self, job_id: str, layout) -> None:
        raise NotImplementedError("the Redis broker carries each job's samples in its payload (spools_pcm16 False)")

    def submit_live(self, item: WorkItem) -> Future:
        """One live re-decode through Redis to whichever worker takes it first (the live lane,
        pipeline/serving/live_redis.py); the future gets the engine's output."""
        with self._lock:
            if self._live is None:
                self._live = LiveClient(self._r, self.prefix, self.live_lost_after_s)
        return self._live.submit(item)

    def live_lane_stats(self) -> tuple[int, int, int] | None:
        """(workers beating on the live lane, re-decodes moved, re-decodes lost) as this api
        process saw them; None before its first live re-decode."""
        live = self._live
        if live is None or live.workers_alive is None:
            return None
        return live.workers_alive, live.moved, live.lost

    def serve_live(self, scheduler: Scheduler, consumer: str, *, max_waiting: int,
                   ready: Callable[[], str | None]) -> LiveServer:
        """A worker process's end of the live lane: claims re-decodes into ``scheduler``."""
        return LiveServer(self._r, self.prefix, scheduler, consumer, self.live_lost_after_s,
                          max_waiting, ready)

    @_translated
    def load_upload(self, job_id: str) -> bytes:
        value = self._r.get(self._k("upload", job_id))
        data = None if value is None else self.payloads.read_upload(value)
        if data is None:
            raise AudioGone(f"the audio of job {job_id} is no longer kept")
        return data

    @_translated
    def counts(self) -> dict[str, int]:
        raw = self._r.hgetall(self._counts)
        out = {s.value: 0 for s in JobState}
        out.update({_s(k): max(0, int(v)) for k, v in raw.items()})
        return out

    # ------------------------------------------------------------------ asyncio (polls)
    def _aclient(self):
        loop = asyncio.get_running_loop()
        entry = self._aclients.get(id(loop))
        if entry is None or entry[0] is not loop:
            client = aredis.Redis.from_url(
                self.url, retry=AsyncRetry(ExponentialBackoff(cap=0.1, base=0.02), 1),
                **self._client_kw)
            entry = (loop, client, client.register_script(_POSITION))
            self._aclients = {k: v for k, v in self._aclients.items() if not v[0].is_closed()}
            self._aclients[id(loop)] = entry
        return entry[1], entry[2]

    @_atranslated
    async def aget(self, job_id: str) -> Job:
        """``get`` for the event loop (redis.asyncio): same answers, same errors."""
        client, _ = self._aclient()
        async with client.pipeline(transaction=False) as pipe:
            pipe.hgetall(self._k("job", job_id))
            pipe.exists(self._k("tomb", job_id))
            h, tomb = await pipe.execute()
        if not h:
            raise _gone(job_id) if tomb else JobNotFound(f"no job with id {job_id!r}")
        # no queue position here: polls are most of the traffic, and the position script (a
        # scan inside Redis) on every poll of a queued job took a quarter of Redis's time on the
        # H200 at 400 polls/s; the submit's answer and get() carry it
        return _job_from_hash(h, job_id)

    async def aclose(self) -> None:
        for loop, client, _ in list(self._aclients.values()):
            if loop is asyncio.get_running_loop():
                await client.aclose()
        self._aclients.clear()

    # ------------------------------------------------------------------ queue: producer side
    @_translated
    def queue_depth(self) -> dict[Lane, int]:
        """Items waiting + in flight per lane, cluster-wide."""
        pipe = self._r.pipeline(transaction=False)
        for s in self._streams:
            pipe.xlen(s)
        return {lane: int(n) for lane, n in zip(LANES, pipe.execute())}

    def __len__(self) -> int:
        return sum(self.queue_depth().values())

    @_translated
    def report_free_memory(self, consumer: str, ratio: float) -> None:
        """A worker's free GPU memory share, for admission by the api processes (expires after
        the visibility timeout with the worker)."""
        self._r.hset(self._workers, f"gpu:{consumer}", f"{self._expiry_ms()} {float(ratio)!r}")

    @_translated
    def report_busy(self, consumer: str, busy_s: float) -> None:
        """A worker's model time so far (seconds of batches, per worker thread), stamped with the
        time: the api processes' live admission reads the model's busy share from two reports."""
        self._r.hset(self._workers, f"busy:{consumer}",
                     f"{self._expiry_ms()} {float(busy_s)!r} {time.time()!r}")

    def busy_seconds_reader(self) -> ClusterBusy:
        """The worker processes' model time as an api process's live admission reads it (one
        reader per broker, its thread started by the first read, stopped by ``close``)."""
        if self._cluster_busy is None:
            self._cluster_busy = ClusterBusy(self.busy_shares)
        return self._cluster_busy

    def live_capacity_reader(self) -> ClusterCapacity:
        """The live workers' capacity and the other api processes' demand, as this api process's
        live admission reads them (one per broker, its thread started by the first read)."""
        with self._lock:
            if self._live_capacity is None:
                self._live_capacity = ClusterCapacity(self._r, self.prefix)
            return self._live_capacity

    @_translated
    def busy_shares(self) -> list[float]:
        """Each live worker's share of time its model computed between its last two reports
        (a worker seen once has none yet)."""
        fields = {k: v for k, v in self._live_fields().items() if k.startswith("busy:")}
        shares = []
        with self._lock:
            for field in [f for f in self._busy_reports if f not in fields]:  # gone
                del self._busy_reports[field]
            for field, value in fields.items():
                busy, at = (float(x) for x in value.split())
                last = self._busy_reports.get(field)
                if last is None or at > last[1]:  # a new report: the share since the one before
                    share = None if last is None else min(max((busy - last[0]) / (at - last[1]), 0.0), 1.0)
                    last = self._busy_reports[field] = (busy, at, share)
                if last[2] is not None:
                    shares.append(last[2])
        return shares

    def _expiry_ms(self) -> int:
        return int((time.time() + self.visibility_timeout_s) * 1000)

    def _live_fields(self) -> dict[str, str]:
        """The registry's unexpired fields (``alive:C`` -> "", ``gpu:C`` -> ratio); expired ones
        are deleted. One small hash read: never a SCAN of the keyspace, which with 100,000s of
        job keys cost Redis 355 us a call and 37 s of its one thread in a 3-minute load run."""
        now_ms = time.time() * 1000
        live, dead = {}, []
        for field, value in self._r.hgetall(self._workers).items():
            expiry, _, rest = _s(value).partition(" ")
            if float(expiry) > now_ms:
                live[_s(field)] = rest
            else:
                dead.append(field)
        if dead:
            self._r.hdel(self._workers, *dead)
        return live

    @_translated
    def free_memory_ratios(self) -> list[float]:
        """The free GPU memory shares the live workers reported."""
        return [float(v) for k, v in self._live_fields().items() if k.startswith("gpu:")]

    @_translated
    def live_workers(self) -> int:
        """Worker processes whose feeder beat within the visibility timeout (each beat stamps its
        entry in the registry with an expiry): a worker that died drops out of this count."""
        return sum(1 for k in self._live_fields() if k.startswith("alive:"))

    def _queue_full(self, depth: int) -> QueueFull:
        return QueueFull(f"the server is busy ({depth} jobs waiting); try again in "
                         f"{self.retry_after_s} s", retry_after=self.retry_after_s)

    def check_capacity(self) -> None:
        """Raise QueueFull now if an enqueue would be refused (a cheap answer before decoding)."""
        depth = len(self)
        if depth >= self.queue_size:
            raise self._queue_full(depth)

    def put(self, item: WorkItem, force: bool = False) -> None:
        """The Scheduler's name for :meth:`enqueue`: the service queues through either."""
        self.enqueue(item, force=force)

    @_translated
    def enqueue(self, item: WorkItem, force: bool = False) -> None:
        """Store the item's 16 kHz audio and add its entry to its lane, atomically; QueueFull
        when the cluster's queue holds ``queue_size`` items (unless ``force``: the later pieces
        of an accepted long job). JobNotFound if the job has no record; a no-op if the job
        already finished or failed."""
        if item.audio is None:
            raise ValueError("a work item sent through the broker carries its audio")
        fields = {
            "job": item.job_id, "piece": item.piece, "pieces": item.pieces,
            "start_s": repr(float(item.start_s)), "speaker": json.dumps(item.speaker),
            "n_samples": int(item.n_samples), "lane": int(item.lane),
            "options": dump_options(item.options), "enqueued": repr(time.time()),  # (for people)
        }
        flat = [x for kv in fields.items() for x in kv]
        audio_key = self._k("audio", item.job_id)
        pipe = self._r.pipeline(transaction=False)  # one round trip; the audio lands first
        pipe.hset(audio_key, str(item.piece), self.payloads.audio(item.job_id, item.piece, item.audio))
        pipe.pexpire(audio_key, self._ttl_pending_ms)
        self._run("enqueue", [self._k("job", item.job_id), audio_key,
                              self._k("entries", item.job_id)],
                  [-1 if force else self.queue_size, int(item.lane), item.piece, item.pieces,
                   "", self._ttl_pending_ms, *flat], client=pipe)
        *_, (status, detail) = pipe.execute()
        if int(status) != 1:  # refused: no entry points at this audio
            self._r.hdel(audio_key, str(item.piece))
            self.payloads.delete_audio([item.job_id])
        if int(status) == -1:
            raise self._queue_full(int(detail))
        if int(status) == 0 and not detail:
            raise JobNotFound(f"no job with id {item.job_id!r} (create it before enqueueing)")

    # ------------------------------------------------------------------ queue: worker side
    @_translated
    def claim(self, consumer: str, max_items: int, block_ms: int = 0) -> list[WorkItem]:
        """Up to ``max_items`` new items for this consumer, interactive lane first, each with its
        audio (CPU float32). Blocks up to ``block_ms`` (capped below the socket timeout) when
        nothing is waiting. Entries of jobs that already ended are acked and skipped."""
        if max_items <= 0:
            return []

        def read():
            got = []
            for s in self._streams:
                left = max_items - len(got)
                if left <= 0:
                    break
                for _, entries in self._r.xreadgroup(GROUP, consumer, {s: ">"}, count=left) or []:
                    got += [(s, eid, f) for eid, f in entries]
            if not got and block_ms > 0:
                block = int(min(block_ms, max(0.0, self.socket_timeout_s - 1.0) * 1000))
                if block > 0:
                    resp = self._r.xreadgroup(GROUP, consumer, {s: ">" for s in self._streams},
                                              count=max_items, block=block) or []
                    for s, entries in resp:
                        got += [(_s(s), eid, f) for eid, f in entries]
            return got

        return self._load(self._with_groups(read), consumer, reclaimed=False)

    @_translated
    def reclaim(self, consumer: str) -> list[WorkItem]:
        """Take over entries that a worker claimed and did not finish within the visibility
        timeout (it died). An entry already delivered ``max_attempts`` times is not delivered
        again: its job fails with ``too_many_attempts`` and the entry is acked and deleted."""
        idle_ms = _ms(self.visibility_timeout_s)

        def scan():
            got, poison = [], []
            for s in self._streams:
                pending = self._r.xpending_range(s, GROUP, "-", "+", RECLAIM_SCAN, idle=idle_ms)
                retry = []
                for p in pending:
                    (poison if p["times_delivered"] >= self.max_attempts else retry).append(
                        (s, p["message_id"], p["times_delivered"]))
                if retry:
                    claimed = self._r.xclaim(s, GROUP, consumer, idle_ms,
                                             [m for _, m, _ in retry])
                    got += [(s, eid, f) for eid, f in claimed if f]
            return got, poison

        got, poison = self._with_groups(scan)
        for s, eid, times in poison:
            entry = self._r.xrange(s, eid, eid)
            fields = entry[0][1] if entry else {}
            jid = _s(fields.get(b"job", b""))
            if jid:
                failed = self.fail(jid, TooManyAttempts.code,
                                   f"the job was claimed {times} times by workers that stopped "
                                   "before finishing it, and was given up")
                logger.warning("job %s given up after %d deliveries (failed now: %s)", jid, times,
                               failed)
            pipe = self._r.pipeline(transaction=True)
            pipe.xack(s, GROUP, eid)
            pipe.xdel(s, eid)
            pipe.execute()
        if got:
            logger.info("reclaimed %d items idle for more than %g s", len(got),
                        self.visibility_timeout_s)
        return self._load(got, consumer, reclaimed=True)

    @_translated
    def heartbeat(self, consumer: str) -> int:
        """Reset the idle time of the entries this process holds for ``consumer`` (claimed,
        waiting in its local queue or running), so that a live but busy worker is not reclaimed
        from. Call it more often than the visibility timeout. An entry held longer than
        ``max_hold_s`` is no longer renewed (the process lost track of it: another worker will
        reclaim it). Returns the number of entries renewed."""
        # liveness for the metrics: XINFO CONSUMERS' idle time (Redis 7.0) does not move while a
        # consumer's blocking reads find nothing, so an idle live worker would look dead
        self._r.hset(self._workers, f"alive:{consumer}", str(self._expiry_ms()))
        now = time.monotonic()
        with self._lock:
            mine = {v: h for v, h in self._held.items() if h[0] == consumer}
            stale = [v for v, h in mine.items() if now - h[3] > self.max_hold_s]
            for v in stale:
                self._unhold(v)
        if stale:
            logger.warning("%d claimed items held over %g s are left to be reclaimed",
                           len(stale), self.max_hold_s)
        values = [v for v in mine if v not in stale]
        if not values:
            return 0
        renewed, *gone = self._run("heartbeat", [], [consumer, GROUP, *values])
        with self._lock:
            for v in gone:  # acked by another's finish, or reclaimed by another consumer
                self._unhold(_s(v))
        return int(renewed)

    def _load(self, entries: list[tuple[str, bytes, dict]], consumer: str,
              reclaimed: bool) -> list[WorkItem]:
        """Entries -> WorkItems with their audio; entries of ended jobs are acked and dropped."""
        if not entries:
            return []
        keys = []
        for _, _, f in entries:  # one script for the claim: no per-entry command in Python
            jid = _s(f[b"job"])
            keys += (self._k("job", jid), self._k("audio", jid))
        # ages from Redis's own clock (entry ids are its milliseconds): no host skew
        sec, usec, *answers = self._run("load", keys, [f[b"piece"] for _, _, f in entries])
        redis_now_ms = int(sec) * 1000 + int(usec) / 1000
        items, stale, lost, kept, listing = [], [], {}, [], {}
        now_mono = time.monotonic()
        for k, (s, eid, f) in enumerate(entries):
            state, value, seconds, name = answers[4 * k:4 * k + 4]
            jid = _s(f[b"job"])
            if state not in (b"queued", b"running"):
                stale.append((s, eid))
                continue
            try:
                audio = None if value is None else self.payloads.read_audio(value)
            except AudioUnreadable as e:  # a damaged file fails its job, never the whole claim
                logger.error("job %s: %s", jid, e.message)
                audio = None
            if audio is None:
                lost[jid] = (s, eid)
                continue
            # a reclaimed item starts a fresh queue clock (its time went to a dead worker)
            age = 0.0 if reclaimed else max(0.0, (redis_now_ms - int(_s(eid).split("-")[0])) / 1e3)
            kept.append(f"{self._streams.index(_s(s))}:{_s(eid)}")
            if seconds is not None:
                listing[jid] = (float(seconds), name.decode("utf-8", "replace") if name else "")
            items.append(WorkItem(
                job_id=jid, lane=Lane(int(f[b"lane"])),
                options=load_options(f[b"options"]),
                n_samples=int(f[b"n_samples"]), audio=audio,
                enqueued_at=now_mono - age, piece=int(f[b"piece"]), pieces=int(f[b"pieces"]),
                start_s=float(f[b"start_s"]),
                speaker=None if f[b"speaker"] == b"null" else json.loads(f[b"speaker"])))
        for jid, (s, eid) in lost.items():
            logger.error("job %s: its audio is missing from the broker", jid)
            self.fail(jid, AudioLost.code, "the job's audio could not be read from the broker")
            stale.append((s, eid))
        if stale:
            pipe = self._r.pipeline(transaction=False)
            for s, eid in stale:
                pipe.xack(s, GROUP, eid)
                pipe.xdel(s, eid)
            pipe.execute()
        with self._lock:
            for value, item in zip(kept, items):
                self._hold(value, consumer, item.job_id, item.piece, now_mono)
            self._listing.update(listing)
            if reclaimed:
                self._reclaimed.update(i.job_id for i in items)
        return items


class Feeder(threading.Thread):
    """Worker-process side: keeps a local Scheduler supplied with items claimed from the broker
    (at most ``prefetch`` waiting locally), reclaims a dead worker's items, and heartbeats this
    consumer's claims. The Worker thread runs unchanged on the Scheduler with ``store=broker``.
    A broker outage is logged and waited out; the feeder never dies of it."""

    def __init__(self, broker: RedisBroker, scheduler: Scheduler, consumer: str,
                 prefetch: int = 64, block_ms: int = 1000, error_backoff_s: float = 1.0,
                 free_memory: Callable[[], float | None] = lambda: None,
                 busy_seconds: Callable[[], float] | None = None):
        super().__init__(name=f"sensevoice-feeder-{consumer}", daemon=True)
        self.broker = broker
        self.scheduler = scheduler
        self.consumer = consumer
        self.prefetch = prefetch
        vt = broker.visibility_timeout_s
        self.block_ms = int(min(block_ms, vt * 1000 / 4))
        self.heartbeat_every_s = vt / 3
        self.reclaim_every_s = vt / 2
        self.error_backoff_s = error_backoff_s
        self.free_memory = free_memory  # () -> free share of this worker's GPU memory, or None
        self.busy_seconds = busy_seconds  # () -> this process's model time so far (per worker)
        self.error: BaseException | None = None  # the latest failure (None once it works again)
        self.heartbeat = time.monotonic()
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        next_beat = next_reclaim = next_report = 0.0
        while not self._stop_event.is_set():
            try:
                now = time.monotonic()
                self.heartbeat = now
                if now >= next_beat:
                    self.broker.heartbeat(self.consumer)
                    next_beat = now + self.heartbeat_every_s
                if now >= next_report:  # free GPU memory and model time, for the api processes'
                    ratio = self.free_memory()  # admission of jobs and of live streams
                    if ratio is not None:
                        self.broker.report_free_memory(self.consumer, ratio)
                    if self.busy_seconds is not None:
                        self.broker.report_busy(self.consumer, self.busy_seconds())
                    next_report = now + MEMORY_REPORT_S
                if now >= next_reclaim:
                    self.scheduler.put_many(self.broker.reclaim(self.consumer))
                    next_reclaim = now + self.reclaim_every_s
                room = self.prefetch - len(self.scheduler)
                if room <= 0:
                    self._stop_event.wait(0.005)
                    continue
                self.scheduler.put_many(self.broker.claim(self.consumer, room, self.block_ms))
                if self.error is not None:
                    logger.info("the broker answers again")
                self.error = None
            except Exception as e:
                if not isinstance(e, BrokerUnavailable):
                    logger.exception("feeder error (the feeder goes on)")
                elif self.error is None:
                    logger.warning("%s", e)
                self.error = e
                self._stop_event.wait(self.error_backoff_s)
