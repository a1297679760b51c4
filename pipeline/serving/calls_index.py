"""What the calls table and the reviewer's desk keep with each job, in both job stores.

Per finished job: its :class:`~pipeline.domain.calls.CallSummary` (written when the job finishes,
so a listing never parses a transcript), the lower-case text a search looks in, and the reviewer's
:class:`~pipeline.domain.review.Review` (corrections, flags, reviewed).

* SQLite (:class:`SqliteCalls`): a ``calls`` table beside ``jobs`` in the same database (WAL,
  synchronous=FULL: a review survives a crash like the job does). The summary is written in the
  finish transaction; a purge deletes the row with the job's result.
* Redis (:class:`RedisCalls`): fields of the job's own hash (``summary``, ``search``, ``review``),
  so they expire with the record (the retention) and can never outlive it; a sorted set
  ``P:calls`` (id by creation time) lists the jobs of the server (ids whose record expired are
  dropped from it as a listing meets them).

Each store hands out its own (``calls()`` of the JobStore port, pipeline/serving/ports.py): this
module imports neither store. A job finished before this index existed (or whose summary write was lost) is summarised the first
time a listing meets it. Writes of a review are read-modify-write under the store's own isolation
(SQLite ``BEGIN IMMEDIATE``; Redis ``WATCH``), so two reviewers' changes never lose each other.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Iterable

import orjson

from pipeline.domain.calls import CallRow, search_text, summarize
from pipeline.domain.errors import ResultNotReady
from pipeline.domain.review import Review
from pipeline.domain.types import Job, JobState, Transcript
from pipeline.serving.job_events import JobEvent
from pipeline.serving.ports import Patch

logger = logging.getLogger("sensevoice.calls")

SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    job_id TEXT PRIMARY KEY,
    created_at REAL NOT NULL,
    filename TEXT NOT NULL DEFAULT '',
    audio_seconds REAL NOT NULL,
    finished_at REAL,
    summary TEXT NOT NULL,
    review TEXT
);
CREATE TABLE IF NOT EXISTS calls_search (
    job_id TEXT PRIMARY KEY,
    text TEXT NOT NULL
);
"""
REDIS_CHUNK = 2000  # records read per pipeline round trip in a listing
MAX_LISTED = 100_000  # jobs one listing reads at most (the newest)
SCAN_ABOVE = 2_000  # a listing naming more jobs than this reads the table once instead



def _finished(job: Job) -> Transcript:
    if job.state is not JobState.DONE or job.result is None:
        raise ResultNotReady(f"job {job.id} is {job.state.value}: only a finished transcript can "
                             "be reviewed")
    return job.result


def _summary_json(result: Transcript, audio_seconds: float) -> str:
    return orjson.dumps(summarize(result, audio_seconds).to_dict()).decode()


NO_REVIEW = Review()  # shared by every row without a review (never mutated: patches copy)


def _review(raw) -> Review:
    if not raw:
        return NO_REVIEW
    try:
        return Review.from_dict(orjson.loads(raw))
    except orjson.JSONDecodeError:
        return Review()


# ---------------------------------------------------------------------------------- SQLite
# A done job's row in ``calls`` holds all the table shows of it, so a listing reads that narrow
# table and never the jobs rows (each holds a whole transcript: scanning 10,000 of them took
# longer than the listing may); the unfinished and failed jobs come from ``jobs`` by its state
# index. The search text sits in its own table, read only by a search (in SQL: instr).
def ensure_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(SCHEMA)


def _index(conn: sqlite3.Connection, job_id: str, result: Transcript, review: Review | None,
           with_summary: bool = True) -> None:
    row = conn.execute("SELECT created_at, filename, audio_seconds, finished_at FROM jobs WHERE id=?",
                       (job_id,)).fetchone()
    if row is None:
        return
    if with_summary:
        conn.execute(
            "INSERT INTO calls (job_id, created_at, filename, audio_seconds, finished_at, summary) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT(job_id) DO UPDATE SET summary=excluded.summary, "
            "finished_at=excluded.finished_at",
            (job_id, row[0], row[1], row[2], row[3], _summary_json(result, row[2])))
    conn.execute("INSERT OR REPLACE INTO calls_search (job_id, text) VALUES (?, ?)",
                 (job_id, search_text(result, review, row[1])))


def index_finished(conn: sqlite3.Connection, job_id: str, result: Transcript) -> None:
    """In the finish transaction: the job's row of the table and its search text."""
    _index(conn, job_id, result, None)


def forget(conn: sqlite3.Connection, job_id: str) -> None:
    """With the job's purge: its review, summary and search text go too."""
    conn.execute("DELETE FROM calls WHERE job_id=?", (job_id,))
    conn.execute("DELETE FROM calls_search WHERE job_id=?", (job_id,))


def with_review(conn: sqlite3.Connection, job: Job) -> Job:
    """The job with its review in ``meta["review"]`` (finished jobs only)."""
    if job.state is not JobState.DONE:
        return job
    row = conn.execute("SELECT review FROM calls WHERE job_id=?", (job.id,)).fetchone()
    if row is None or not row[0]:
        return job
    job.meta["review"] = _review(row[0])
    return job


UNFINISHED = ("queued", "running", "failed")


class SqliteCalls:
    """The calls index of the embedded store (pipeline/serving/broker_sqlite.py's JobStore: its
    read connection and ``get``, its feed for the refreshed snapshot)."""

    def __init__(self, store):
        self.store = store
        self._backfilled = False  # jobs of this store finish through index_finished: once is enough

    def update_review(self, job_id: str, patch: Patch) -> tuple[Job, Review]:
        conn = self.store._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            job = self.store.get(job_id)
            result = _finished(job)
            new = patch(job.meta.get("review") or Review(), job)
            _index(conn, job_id, result, new,
                   with_summary=conn.execute("SELECT 1 FROM calls WHERE job_id=?",
                                             (job_id,)).fetchone() is None)
            conn.execute("UPDATE calls SET review=? WHERE job_id=?",
                         (json.dumps(new.to_dict(), ensure_ascii=False), job_id))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        job.meta["review"] = new
        # the service's snapshot (what polls read) is refreshed as after a finish
        self.store.feed.publish([JobEvent(job_id, JobState.DONE)])
        return job, new

    def rows(self, ids: list[str] | None, search: str = "") -> list[CallRow]:
        """The rows of ``ids`` (None: every job of the store); with ``search`` (lower case) each
        row's ``search`` is not empty exactly when its text holds ``search``."""
        conn = self.store._conn()
        if not self._backfilled:
            self._backfill(conn)
            self._backfilled = True
        wanted = None
        many = ids is None or len(ids) > SCAN_ABOVE  # one scan beats as many look-ups
        where, args = ("", ()) if many else (" WHERE job_id IN (SELECT value FROM json_each(?))",
                                             (json.dumps(ids),))
        if ids is not None and many:
            wanted = set(ids)
        texts = {}
        if search:
            texts = dict(conn.execute(
                "SELECT job_id, text FROM calls_search WHERE instr(text, ?) > 0", (search,)))
        out = []
        for r in conn.execute("SELECT job_id, created_at, filename, audio_seconds, finished_at, "
                              "summary, review FROM calls" + where, args):
            if wanted is None or r[0] in wanted:
                out.append(CallRow(r[0], "done", r[2], r[1], r[3], r[4], summary_raw=r[5],
                                   review=_review(r[6]), search=texts.get(r[0], "")))
        jwhere = "" if many else " AND id IN (SELECT value FROM json_each(?))"
        for r in conn.execute(
                "SELECT id, state, filename, created_at, audio_seconds, finished_at FROM jobs "
                "WHERE state IN (?, ?, ?)" + jwhere, UNFINISHED + args):
            if wanted is None or r[0] in wanted:
                out.append(CallRow(r[0], r[1], r[2], r[3], r[4], r[5],
                                   search=r[2].lower() if search and search in r[2].lower() else ""))
        kept = dict(conn.execute("SELECT id, kept_until FROM jobs WHERE kept_until IS NOT NULL"))  # (indexed: few)
        if kept:
            for row in out:
                row.kept_until = kept.get(row.id)
        return out

    def _backfill(self, conn: sqlite3.Connection) -> None:
        """Index finished jobs that have no row yet (finished before the index existed)."""
        missing = conn.execute(
            "SELECT j.id, j.result FROM jobs j LEFT JOIN calls c ON c.job_id = j.id "
            "WHERE j.state = 'done' AND c.job_id IS NULL").fetchall()
        for jid, raw in missing:
            try:
                result = Transcript.from_dict(json.loads(raw))
            except (TypeError, ValueError, KeyError):
                continue
            _index(conn, jid, result, None)


# ---------------------------------------------------------------------------------- Redis
_FIELDS = (b"state", b"filename", b"created_at", b"audio_seconds", b"finished_at",
           b"error_code", b"summary", b"review", b"kept_until")
_SEARCH = len(_FIELDS)  # a text search's hit, appended after the fields

# KEYS = job 1, search 1, job 2, search 2, ...; ARGV = summary 1, search text 1, summary 2, ...
# (a worker's finished batch in one command). Only on a record that still exists (never a key
# without TTL); the search text expires with the record
_SET_SUMMARIES = """
for i = 1, #KEYS, 2 do
  local ttl = redis.call('PTTL', KEYS[i])
  if ttl ~= -2 then
    redis.call('HSET', KEYS[i], 'summary', ARGV[i])
    if ttl > 0 then redis.call('SET', KEYS[i + 1], ARGV[i + 1], 'PX', ttl)
    else redis.call('SET', KEYS[i + 1], ARGV[i + 1]) end
  end
end
return 1
"""

# KEYS: search texts. ARGV: the lower-case text searched. Returns the 1-based indices of the keys
# whose text holds it (plain find: no pattern characters), so a search moves no texts out of Redis
# (moving 10,000 of them took ~0.6 s)
_FIND = """
local out = {}
for i, k in ipairs(KEYS) do
  local t = redis.call('GET', k)
  if t and string.find(t, ARGV[1], 1, true) then out[#out + 1] = i end
end
return out
"""


def calls_key(prefix: str) -> str:
    return f"{prefix}:calls"


def redis_on_create(pipe, prefix: str, job: Job) -> None:
    """In the create transaction: the job joins the server's list."""
    pipe.zadd(calls_key(prefix), {job.id: float(job.created_at)})


def redis_review(h: dict) -> Review | None:
    raw = h.get(b"review")
    return _review(raw) if raw else None


def listing_row(result: Transcript, audio_seconds: float, filename: str) -> tuple[str, str]:
    """A finished job's calls-listing row in the distributed store: (summary JSON, search text),
    written by the finish script with the result (pipeline/serving/broker_redis.py)."""
    return _summary_json(result, audio_seconds), search_text(result, None, filename)


def redis_index_finished(broker, written: Iterable[str], results: list[tuple[str, Transcript]]) -> None:
    """After the finish script, for jobs whose claim the finishing process did not see (their
    row was not in the script): each written job's summary (a failure is logged, not raised: a
    listing summarises a job that has none)."""
    written = set(written)
    todo = [(jid, t) for jid, t in results if jid in written]
    if not todo:
        return
    try:
        pipe = broker.client.pipeline(transaction=False)
        for jid, _ in todo:
            pipe.hmget(broker.key("job", jid), "audio_seconds", "filename")
        meta = pipe.execute()
        keys, args = [], []
        for (jid, t), (seconds, filename) in zip(todo, meta):
            if seconds is None:
                continue
            name = filename.decode("utf-8", "replace") if filename else ""
            keys += (broker.key("job", jid), broker.key("search", jid))
            args += (_summary_json(t, float(seconds)), search_text(t, None, name))
        if keys:
            broker.client.register_script(_SET_SUMMARIES)(keys=keys, args=args)
    except Exception as e:  # the finish itself is stored; the listing backfills
        logger.warning("could not index %d finished job(s): %s", len(todo), e)


class RedisCalls:
    """The calls index of the distributed store (pipeline/serving/broker_redis.py's RedisBroker:
    its client, key scheme and ``get``); ``unavailable(e)`` is the broker's own translation of a
    Redis error into the error the service answers (None: not an outage, raised as it is)."""

    def __init__(self, broker, unavailable: Callable[[Exception], Exception | None]):
        self.broker = broker
        self._unavailable = unavailable
        self._set_summaries = broker.client.register_script(_SET_SUMMARIES)
        self._find = broker.client.register_script(_FIND)

    def update_review(self, job_id: str, patch: Patch) -> tuple[Job, Review]:
        import redis

        key = self.broker.key("job", job_id)
        out: dict = {}

        def attempt(pipe) -> None:
            job = self.broker.get(job_id)  # JobNotFound / JobGone first
            result = _finished(job)
            old = job.meta.get("review") or Review()
            new = patch(old, job)
            expires = pipe.pexpiretime(key)  # absolute (ms): the text never outlives the record
            pipe.multi()
            pipe.hset(key, "review", json.dumps(new.to_dict(), ensure_ascii=False))
            search = search_text(result, new, job.filename)
            pipe.set(self.broker.key("search", job_id), search, pxat=expires if expires > 0 else None)
            out["job"], out["review"] = job, new

        try:
            self.broker.client.transaction(attempt, key)
        except redis.RedisError as e:
            err = self._unavailable(e)
            if err is None:
                raise
            raise err from None
        job, new = out["job"], out["review"]
        job.meta["review"] = new
        return job, new

    def rows(self, ids: list[str] | None, search: str = "") -> list[CallRow]:
        """As :meth:`SqliteCalls.rows`."""
        import redis

        with_search = bool(search)

        r = self.broker.client
        try:
            if ids is None:
                ids = [i.decode() for i in r.zrevrange(calls_key(self.broker.prefix), 0, MAX_LISTED - 1)]
            out, gone = [], []
            for a in range(0, len(ids), REDIS_CHUNK):
                chunk = ids[a:a + REDIS_CHUNK]
                pipe = r.pipeline(transaction=False)
                for jid in chunk:
                    pipe.hmget(self.broker.key("job", jid), *_FIELDS)
                got = pipe.execute()
                if with_search:  # inside Redis: only the indices of the texts that hold it come back
                    hits = set(self._find(keys=[self.broker.key("search", j) for j in chunk],
                                          args=[search.encode("utf-8")]))
                    got = [v + [search.encode("utf-8") if k + 1 in hits else None]
                           for k, v in enumerate(got)]
                for jid, vals in zip(chunk, got):
                    if vals[0] is None:
                        gone.append(jid)
                        continue
                    out.append(self._row(jid, vals, search))
            if gone:
                r.zrem(calls_key(self.broker.prefix), *gone)
            return out
        except redis.RedisError as e:
            err = self._unavailable(e)
            if err is None:
                raise
            raise err from None

    def _row(self, jid: str, v: list, query: str) -> CallRow:
        s = lambda b: b.decode("utf-8", "replace") if b is not None else None  # noqa: E731
        state = s(v[0])
        summary = v[6]
        search = s(v[_SEARCH]) if query and v[_SEARCH] is not None else ""
        if summary is None and state == JobState.DONE.value:
            summary, search = self._backfill(jid)
        elif query and not search and query in (s(v[1]) or "").lower():  # unfinished: its name
            search = (s(v[1]) or "").lower()
        return CallRow(
            id=jid, state=state, filename=s(v[1]) or "", created_at=float(v[2] or 0),
            audio_seconds=float(v[3] or 0), finished_at=float(v[4]) if v[4] else None,
            error_code=s(v[5]), summary_raw=summary,
            review=_review(v[7]), search=search if query and query in search else "",
            kept_until=float(v[8]) if v[8] else None)

    def _backfill(self, jid: str) -> tuple[bytes | None, str]:
        key = self.broker.key("job", jid)
        raw, seconds, filename = self.broker.client.hmget(key, "result", "audio_seconds", "filename")
        if raw is None:
            return None, ""
        result = Transcript.from_dict(json.loads(raw))
        summary = _summary_json(result, float(seconds or 0))
        search = search_text(result, None, filename.decode("utf-8", "replace") if filename else "")
        self._set_summaries(keys=[key, self.broker.key("search", jid)], args=[summary, search])
        return summary.encode(), search
