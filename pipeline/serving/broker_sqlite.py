"""JobStore: the truth about jobs, on SQLite (WAL, synchronous=FULL).

States: queued -> running -> done | failed. Every transition is state-checked (``WHERE state=?``)
so a result can never be written twice and a recovered job can never be finished by a stale worker.
The uploaded bytes of each accepted job are spooled beside the database (fsync'd before the submit
answers), so that a restart can decode and run queued jobs again. A row records its upload's size:
a sibling web process syncs its spool file while the owner commits the row (two fsyncs at once, not
in series), so after a power cut a queued row may name a spool file that never reached the disk
whole (its submit was not answered: the answer waits for both); recovery fails it (audio_lost).

Only this service's user reads any of it (issue 36: the data directory was 0755 and every upload
and transcript 0644): the data directory is 0700 (an existing one of ours is tightened,
pipeline/serving/private_dir.py), and the database (its -wal and -shm take its mode), the spool
files and the long-audio waves are created 0600.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator, Sequence

import numpy as np
import torch

from pipeline.domain.errors import (AudioGone, AudioLost, JobGone, JobNotFound, JobUnfinished, SenseVoiceError,
                                    TooManyAttempts)
from pipeline.domain.types import Job, JobError, JobState, Lane, Transcript
from pipeline.serving import calls_index
from pipeline.serving.group_commit import GroupCommit
from pipeline.serving.job_events import Feed, JobEvent
from pipeline.serving.payloads import map_private
from pipeline.serving.private_dir import (FILE_MODE, create_private, ensure_data_dir,
                                            private_subdir, check_own_file)
from pipeline.serving.records import (SegmentResult, dump_options, dump_scores, dump_words,
                                      load_options, load_piece, storage_error)

if TYPE_CHECKING:
    from pipeline.audio.wav import Pcm16Layout

logger = logging.getLogger("sensevoice.jobs")

MAX_ATTEMPTS = 3  # a job that was running during 3 crashes is failed, not retried forever
ORPHAN_AGE_S = 60.0  # a spooled upload without a row this old is a crash's leftover (recover)

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE NOT NULL,
    state TEXT NOT NULL,
    lane INTEGER NOT NULL,
    options TEXT NOT NULL,
    filename TEXT NOT NULL DEFAULT '',
    audio_seconds REAL NOT NULL,
    created_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    result TEXT,
    error_code TEXT,
    error_message TEXT,
    upload_bytes INTEGER
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state, seq);
CREATE TABLE IF NOT EXISTS segments (
    job_id TEXT NOT NULL,
    idx INTEGER NOT NULL,
    start_s REAL NOT NULL,
    end_s REAL NOT NULL,
    speaker TEXT,
    raw_text TEXT NOT NULL,
    words TEXT NOT NULL DEFAULT '[]',
    scores TEXT,
    PRIMARY KEY (job_id, idx)
);
"""


@dataclass(frozen=True)
class SpooledPcm16:
    """A job's audio that is its spooled upload's own samples (a mono 16 kHz 16-bit PCM WAV:
    ``frames`` int16 values at byte ``offset``), mapped when the worker takes it: no float copy
    of it waits in the queue or crosses a socket, and the engine's gather is its one copy (as for
    the distributed worker's shared files). The file is never changed once renamed into place
    and a private mapping keeps its pages when it is deleted."""

    path: Path
    offset: int
    frames: int

    def load(self) -> torch.Tensor:
        pages = map_private(self.path, self.offset + 2 * self.frames, "the spooled upload")
        samples = np.frombuffer(pages, dtype="<i2", count=self.frames, offset=self.offset)
        return torch.from_numpy(samples if self.offset % 2 == 0 else samples.copy())


class UnsyncedSpool:
    """A spooled upload written but not yet durable (:meth:`JobStore.spool_unsynced`): ``size``
    bytes, recorded with the job's row."""

    def __init__(self, job_id: str, fd: int, size: int):
        self.job_id, self._fd, self.size = job_id, fd, size

    def sync(self) -> None:
        """fsync it (and let go of it); StorageFull or StorageError when that fails (the caller
        discards the job, which deletes the file)."""
        try:
            os.fsync(self._fd)
        except OSError as e:
            logger.error("storing job %s failed: %s", self.job_id, e)
            raise storage_error(e) from None
        finally:
            self.close()

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class JobStore:
    """SQLite-backed job store. Reads use one connection per thread (WAL: they never wait on a
    writer); every write goes through one shared connection under a lock (``_write``). Writers on
    separate connections of one process queued on SQLite's file lock, whose busy handler sleeps
    between tries: under load the submit threads, the worker and its finisher slept ~0.6 ms a job
    there, and each commit took its own fsync. After each write that changes a job it publishes a
    :class:`JobEvent` on ``feed`` (the embedded topology's counterpart of what the Redis broker's
    readers see)."""

    def __init__(self, data_dir: str | Path, owner: bool = True):
        """``owner``: the process that writes the store (it creates the schema and clears the
        writes a crash cut short); a sibling web process (``owner=False``) only reads it and
        spools uploads."""
        self.data_dir = ensure_data_dir(data_dir)  # 0700 (tightened if looser), or refused
        self.spool_dir = private_subdir(self.data_dir / "spool")
        for stale in self.spool_dir.glob("*.tmp") if owner else ():  # a write cut short by a crash
            stale.unlink(missing_ok=True)
        self.db_path = self.data_dir / "jobs.sqlite3"
        if owner:
            self._private_database()
        self._local = threading.local()
        self._write_lock = threading.Lock()
        self._write_conn: sqlite3.Connection | None = None
        self.feed = Feed()
        self._calls: calls_index.SqliteCalls | None = None
        self._inserts: GroupCommit[tuple] = GroupCommit(self._insert_jobs)
        if owner:
            with self._conn() as c:
                c.executescript(SCHEMA)
                if "upload_bytes" not in {r["name"] for r in c.execute("PRAGMA table_info(jobs)")}:
                    c.execute("ALTER TABLE jobs ADD COLUMN upload_bytes INTEGER")  # a store of before
                if "scores" not in {r["name"] for r in c.execute("PRAGMA table_info(segments)")}:
                    c.execute("ALTER TABLE segments ADD COLUMN scores TEXT")  # before issue 39
                if "kept_until" not in {r["name"] for r in c.execute("PRAGMA table_info(jobs)")}:
                    c.execute("ALTER TABLE jobs ADD COLUMN kept_until REAL")  # keep (issue 40)
                c.execute("CREATE INDEX IF NOT EXISTS jobs_kept ON jobs(kept_until) WHERE kept_until IS NOT NULL")
                calls_index.ensure_schema(c)  # the calls table's summaries and reviews

    # ------------------------------------------------------------------ plumbing
    def _private_database(self) -> None:
        """The database file made 0600 before SQLite opens it (SQLite creates it with the umask's
        mode, 0644 usually, and gives its -wal and -shm files the database's mode); the files of
        a store of before, 0644, are tightened; one another user planted is refused."""
        try:
            os.close(os.open(self.db_path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE))
        except FileExistsError:
            pass
        for suffix in ("", "-wal", "-shm", "-journal"):  # ours (never planted), 0600
            check_own_file(f"{self.db_path}{suffix}", "job store file")

    def _conn(self) -> sqlite3.Connection:
        """This thread's connection, for reads."""
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._connect()
        return conn

    def _connect(self, shared: bool = False) -> sqlite3.Connection:
        conn = sqlite3.connect(self.db_path, timeout=30.0, isolation_level=None,
                               check_same_thread=not shared)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA busy_timeout=30000")
        conn.row_factory = sqlite3.Row
        return conn

    def _writer(self) -> sqlite3.Connection:
        """The one connection that writes; use it under ``_write_lock`` (``_write``)."""
        if self._write_conn is None:
            self._write_conn = self._connect(shared=True)
        return self._write_conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """The write connection, held: single statements commit on their own (autocommit)."""
        with self._write_lock:
            yield self._writer()

    def spool_path(self, job_id: str) -> Path:
        return self.spool_dir / f"{job_id}.upload"  # server-made name; the client's name is never a path

    spools_pcm16 = True  # a mono 16-bit WAV's job reads its samples from the spooled upload

    def spooled_audio(self, job_id: str, layout: Pcm16Layout) -> SpooledPcm16:
        """The audio of a job whose spooled upload is a mono 16 kHz 16-bit PCM WAV (``layout``)."""
        return SpooledPcm16(self.spool_path(job_id), int(layout.offset), int(layout.frames))

    # ------------------------------------------------------------------ writes
    def create(self, job: Job, upload: bytes) -> None:
        """Spool the upload (fsync) and insert the job, before the submit answers. A write that
        fails (disk full, file-size limit, I/O error) leaves nothing behind: no temporary file,
        no spool file without its row; it raises StorageFull (507) or StorageError (503). The rows
        of submits that arrive together are inserted in one transaction (:class:`GroupCommit`)."""
        self.spool(job.id, upload)
        self.insert(job, len(upload))

    def spool(self, job_id: str, upload: bytes) -> None:
        """Write a job's upload durably (fsync) under its server-made name, through a temporary
        one; StorageFull or StorageError, with no file left behind, when that fails."""
        path = self.spool_path(job_id)
        tmp = path.with_suffix(".tmp")
        try:
            self._write_new(job_id, tmp, upload).sync()
            os.replace(tmp, path)
        except SenseVoiceError:
            tmp.unlink(missing_ok=True)
            raise
        except OSError as e:
            tmp.unlink(missing_ok=True)
            path.unlink(missing_ok=True)
            logger.error("storing job %s failed: %s", job_id, e)
            raise storage_error(e) from None

    def spool_unsynced(self, job_id: str, upload: bytes) -> UnsyncedSpool:
        """Write a job's upload under its final name, not yet durable: the caller has the job's
        row committed meanwhile and then calls ``sync()`` (the two fsyncs overlap), answering only
        once both are done. StorageFull or StorageError, with no file left, when the write fails."""
        return self._write_new(job_id, self.spool_path(job_id), upload)

    @staticmethod
    def _write_new(job_id: str, path: Path, upload: bytes) -> UnsyncedSpool:
        """``path`` created holding ``upload`` (not synced); StorageFull or StorageError, with
        the file removed, when that fails."""
        try:
            fd = create_private(path, replace=True)  # 0600; a .tmp left by a crash is overwritten
        except OSError as e:
            logger.error("storing job %s failed: %s", job_id, e)
            raise storage_error(e) from None
        try:
            view = memoryview(upload)
            while view:
                view = view[os.write(fd, view):]
        except OSError as e:
            os.close(fd)
            path.unlink(missing_ok=True)
            logger.error("storing job %s failed: %s", job_id, e)
            raise storage_error(e) from None
        return UnsyncedSpool(job_id, fd, len(upload))

    def insert(self, job: Job, upload_bytes: int | None = None) -> None:
        """Insert a queued job whose upload is spooled (its spool file is deleted if this fails)."""
        error = self.insert_many([job], [upload_bytes])[0]
        if error is not None:
            raise error

    def insert_many(self, jobs: Sequence[Job],
                    upload_bytes: Sequence[int | None] | None = None) -> list[Exception | None]:
        """Insert queued jobs whose uploads are spooled, in the store's group commits; for each
        job None, or the error (StorageFull, StorageError) that refused it (its spool file gone).
        ``upload_bytes``: each job's spooled size (recovery fails a job whose file is shorter)."""
        sizes = upload_bytes if upload_bytes is not None else [None] * len(jobs)
        rows = [(job.id, JobState.QUEUED.value, int(job.lane), dump_options(job.options),
                 job.filename, job.audio_seconds, job.created_at, size) for job, size in zip(jobs, sizes)]
        out: list[Exception | None] = []
        for job, error in zip(jobs, self._inserts.many(rows)):
            if isinstance(error, (OSError, sqlite3.Error)):
                self.spool_path(job.id).unlink(missing_ok=True)
                logger.error("storing job %s failed: %s", job.id, error)
                error = storage_error(error)
            elif error is not None:
                raise error  # a bug, not the disk: as before, it propagates
            out.append(error)
        return out

    def _insert_jobs(self, rows: Sequence[tuple]) -> None:
        with self._transaction() as conn:
            conn.executemany(
                "INSERT INTO jobs (id, state, lane, options, filename, audio_seconds, created_at,"
                " upload_bytes) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """One transaction (one fsync) for many statements: a whole batch commits at once."""
        with self._write() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                if conn.in_transaction:  # SQLite rolls back itself on some errors (SQLITE_FULL)
                    conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def mark_running(self, job_ids: Iterable[str], already_running_ok: bool = False) -> set[str]:
        """queued -> running (attempts + 1), in one transaction. Returns the ids that really moved
        (plus, with ``already_running_ok``, those already running: later pieces of a long job)."""
        now = time.time()
        moved, started = set(), []
        with self._transaction() as conn:
            for jid in job_ids:
                cur = conn.execute(
                    "UPDATE jobs SET state=?, started_at=?, attempts=attempts+1 WHERE id=? AND state=?",
                    (JobState.RUNNING.value, now, jid, JobState.QUEUED.value),
                )
                if cur.rowcount:
                    started.append(jid)
                if cur.rowcount or (already_running_ok and conn.execute(
                        "SELECT 1 FROM jobs WHERE id=? AND state=?",
                        (jid, JobState.RUNNING.value)).fetchone()):
                    moved.add(jid)
        self.feed.publish([JobEvent(jid, JobState.RUNNING, at=now) for jid in started])
        return moved

    def save_segments(self, results: Iterable[SegmentResult]) -> None:
        """Store piece results of long jobs (one transaction); re-running a piece overwrites it.
        Publishes each job's progress ("segment n of total") when the pieces say their total
        (the service keeps it: progress means nothing after a restart)."""
        results = list(results)
        with self._transaction() as conn:
            conn.executemany(
                "INSERT OR REPLACE INTO segments (job_id, idx, start_s, end_s, speaker, raw_text, words,"
                " scores) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                [(r.job_id, r.idx, r.start_s, r.end_s, r.speaker, r.raw_text,
                  json.dumps(dump_words(r.words), ensure_ascii=False),
                  None if (sc := dump_scores(r)) is None else json.dumps(sc))
                 for r in results])
        events = []
        for jid, total in {r.job_id: r.pieces for r in results if r.pieces}.items():
            events.append(JobEvent(jid, None, f"segment {self.segment_count(jid)} of {total}"))
        self.feed.publish(events)

    def segments(self, job_id: str) -> list[SegmentResult]:
        rows = self._conn().execute(
            "SELECT * FROM segments WHERE job_id=? ORDER BY start_s, idx", (job_id,)).fetchall()
        return [load_piece(r["job_id"], r["idx"], r["start_s"], r["end_s"], r["speaker"],
                           r["raw_text"], json.loads(r["words"]),
                           json.loads(r["scores"]) if r["scores"] else None)
                for r in rows]

    def segment_count(self, job_id: str) -> int:
        return self._conn().execute("SELECT COUNT(*) FROM segments WHERE job_id=?",
                                    (job_id,)).fetchone()[0]

    def clear_segments(self, job_id: str) -> None:
        with self._write() as conn:
            conn.execute("DELETE FROM segments WHERE job_id=?", (job_id,))

    def finish(self, job_id: str, result: Transcript) -> bool:
        return job_id in self.finish_many([(job_id, result)])

    def finish_many(self, results: Iterable[tuple[str, Transcript]]) -> set[str]:
        """running -> done for a batch, in one transaction. Returns the ids that were written."""
        now = time.time()
        written, events = set(), []
        with self._transaction() as conn:
            for jid, result in results:
                cur = conn.execute(
                    "UPDATE jobs SET state=?, finished_at=?, result=? WHERE id=? AND state=?",
                    (JobState.DONE.value, now, json.dumps(result.to_dict(), ensure_ascii=False),
                     jid, JobState.RUNNING.value),
                )
                if cur.rowcount:
                    written.add(jid)
                    events.append(JobEvent(jid, JobState.DONE, at=now, result=result))
                    conn.execute("DELETE FROM segments WHERE job_id=?", (jid,))
                    calls_index.index_finished(conn, jid, result)
        self.feed.publish(events)
        return written

    def fail(self, job_id: str, code: str, message: str) -> bool:
        """Fail a queued or running job (never a finished one)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE jobs SET state=?, finished_at=?, error_code=?, error_message=?"
                " WHERE id=? AND state IN (?, ?)",
                (JobState.FAILED.value, time.time(), code, message, job_id,
                 JobState.QUEUED.value, JobState.RUNNING.value),
            )
        if cur.rowcount:
            self.feed.publish([JobEvent(job_id, JobState.FAILED)])
        return bool(cur.rowcount)

    def release(self, job_ids: Iterable[str]) -> None:
        """Nothing to hand back: an embedded job stays in this store (the broker's counterpart
        lets another worker reclaim claimed items)."""

    def requeue(self, job_id: str) -> bool:
        """running -> queued (e.g. after a retryable fault)."""
        with self._write() as conn:
            cur = conn.execute(
                "UPDATE jobs SET state=?, started_at=NULL WHERE id=? AND state=?",
                (JobState.QUEUED.value, job_id, JobState.RUNNING.value),
            )
        return bool(cur.rowcount)

    def recover(self) -> list[Job]:
        """After a restart: jobs left running go back to the queue, or fail after MAX_ATTEMPTS.
        Returns every queued job in submission order (to be put back on the scheduler); the piece
        results of a long one are forgotten (it is split again)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE jobs SET state=?, finished_at=?, error_code=?,"
                " error_message=? WHERE state=? AND attempts>=?",
                (JobState.FAILED.value, time.time(), TooManyAttempts.code,
                 f"the job was interrupted {MAX_ATTEMPTS} times while running and was given up",
                 JobState.RUNNING.value, MAX_ATTEMPTS),
            )
            conn.execute("UPDATE jobs SET state=?, started_at=NULL WHERE state=?",
                         (JobState.QUEUED.value, JobState.RUNNING.value))
            # a recovered long job is split again: the piece results of its last run go
            conn.execute("DELETE FROM segments WHERE job_id IN (SELECT id FROM jobs WHERE state=?)",
                         (JobState.QUEUED.value,))
        rows = self._conn().execute("SELECT * FROM jobs WHERE state=? ORDER BY seq",
                            (JobState.QUEUED.value,)).fetchall()
        rows = self._fail_cut_uploads(rows)
        self._sweep_orphans()
        return [_row_to_job(r) for r in rows]

    def _fail_cut_uploads(self, rows: list[sqlite3.Row]) -> list[sqlite3.Row]:
        """The queued rows whose spooled upload is whole; the others fail (audio_lost) and their
        file goes. A power cut between the row's commit and the spool file's fsync leaves such a
        row; its submit was not answered then (the answer waits for both), but one whose file was
        damaged later was: it fails with a message rather than vanish, and is never transcribed
        from part of its recording."""
        kept, cut = [], []
        for r in rows:
            try:
                size = self.spool_path(r["id"]).stat().st_size
            except OSError:
                size = -1
            (cut if r["upload_bytes"] is not None and size < r["upload_bytes"] else kept).append(r)
        for r in cut:
            self.fail(r["id"], AudioLost.code, "the upload was not stored whole (a crash or power "
                      "cut came before it reached the disk); submit it again")
            self.delete_spool(r["id"])
        if cut:
            logger.warning("%d queued jobs failed: their upload was cut short by a crash (%s)",
                           len(cut), ", ".join(r["id"] for r in cut[:5]))
        return kept

    def _sweep_orphans(self, min_age_s: float = ORPHAN_AGE_S) -> None:
        """Delete spooled uploads that no job row names: a process killed between spooling an
        upload and inserting its row (the client got no answer) left them. Only files older than
        ``min_age_s``: a sibling web process may be between the two steps right now."""
        conn, cutoff, swept = self._conn(), time.time() - min_age_s, 0
        for path in self.spool_dir.glob("*.upload"):  # (the files kept, not every row ever stored)
            try:
                if path.stat().st_mtime < cutoff and conn.execute(
                        "SELECT 1 FROM jobs WHERE id=?", (path.stem,)).fetchone() is None:
                    path.unlink()
                    swept += 1
            except OSError:
                pass  # gone meanwhile
        if swept:
            logger.info("removed %d spooled uploads without a job (a crash between spool and insert)", swept)

    def purge(self, finished_before: float) -> list[str]:
        """Delete results and audio of jobs finished before ``finished_before`` (unix s) and not
        kept beyond now (``keep``); the row stays as a tombstone so the id answers 410, not 404."""
        conn = self._conn()
        rows = conn.execute(
            "SELECT id FROM jobs WHERE state IN (?, ?) AND finished_at < ?"
            " AND (kept_until IS NULL OR kept_until < ?)",
            (JobState.DONE.value, JobState.FAILED.value, finished_before, time.time())).fetchall()
        return self._purge_ids([r["id"] for r in rows])

    def _purge_ids(self, ids: list[str]) -> list[str]:
        """Retention's removal of finished jobs (their result, review, pieces and upload; the row a
        tombstone): the ids it removed (a job that is not finished is left as it is)."""
        done = []
        with self._transaction() as c:
            for jid in ids:
                cur = c.execute(
                    "UPDATE jobs SET state=?, result=NULL, filename='' WHERE id=? AND state IN (?, ?)",
                    (JobState.PURGED.value, jid, JobState.DONE.value, JobState.FAILED.value))
                if cur.rowcount:
                    done.append(jid)
                c.execute("DELETE FROM segments WHERE job_id=?", (jid,))
                calls_index.forget(c, jid)
        for jid in done:
            self.delete_spool(jid)
        return done

    def _finished_row(self, job_id: str) -> sqlite3.Row:
        """A finished job's row (JobNotFound, JobGone, or JobUnfinished for a queued or running one)."""
        row = self._conn().execute("SELECT state, finished_at, kept_until FROM jobs WHERE id=?",
                                   (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job with id {job_id!r}")
        state = JobState(row["state"])
        if state is JobState.PURGED:
            raise _purged(job_id)
        if state not in (JobState.DONE, JobState.FAILED):
            raise JobUnfinished(f"job {job_id} is {state.value}: only a finished job is deleted or "
                                "kept; wait for its end")
        return row

    def remove(self, job_id: str) -> None:
        """Delete a finished job now, as retention does (JobRemoval)."""
        self._finished_row(job_id)
        if not self._purge_ids([job_id]):  # purged (or removed) meanwhile
            raise _purged(job_id)

    def keep(self, job_id: str, until: float) -> float:
        """Keep a finished job until ``until`` (unix s) at least; the time it is kept until."""
        self._finished_row(job_id)
        with self._write() as conn:
            conn.execute("UPDATE jobs SET kept_until=MAX(COALESCE(kept_until, 0), ?) WHERE id=? AND state IN (?, ?)",
                         (until, job_id, JobState.DONE.value, JobState.FAILED.value))
        row = self._finished_row(job_id)
        return float(row["kept_until"] or until)

    def delete_spool(self, job_id: str) -> None:
        self.spool_path(job_id).unlink(missing_ok=True)

    # ------------------------------------------------------------------ reads
    def get(self, job_id: str) -> Job:
        row = self._conn().execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        if row is None:
            raise JobNotFound(f"no job with id {job_id!r}")
        if row["state"] == JobState.PURGED.value:
            raise _purged(job_id)
        return calls_index.with_review(self._conn(), _row_to_job(row))

    def calls(self) -> calls_index.SqliteCalls:
        """The calls index kept in this database (reviews, the calls listing)."""
        if self._calls is None:
            self._calls = calls_index.SqliteCalls(self)
        return self._calls

    def load_upload(self, job_id: str) -> bytes:
        try:
            return self.spool_path(job_id).read_bytes()
        except FileNotFoundError:  # deleted with its job's audio (as the Redis store answers)
            raise AudioGone(f"the audio of job {job_id} is no longer kept") from None

    def discard(self, job_id: str) -> None:
        """Forget a job that was never accepted (the queue filled up between checks)."""
        with self._write() as conn:
            conn.execute("DELETE FROM jobs WHERE id=? AND state=?", (job_id, JobState.QUEUED.value))
        self.delete_spool(job_id)

    def counts(self) -> dict[str, int]:
        rows = self._conn().execute("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state").fetchall()
        out = {s.value: 0 for s in JobState}
        out.update({r["state"]: r["n"] for r in rows})
        return out

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None
        with self._write_lock:
            if self._write_conn is not None:
                self._write_conn.close()
                self._write_conn = None


def _purged(job_id: str) -> JobGone:
    return JobGone(f"job {job_id} finished more than the retention period ago, or was deleted; "
                   "its result and audio were deleted")


def _row_to_job(r: sqlite3.Row) -> Job:
    result = Transcript.from_dict(json.loads(r["result"])) if r["result"] else None
    error = JobError(r["error_code"], r["error_message"]) if r["error_code"] else None
    return Job(
        id=r["id"], state=JobState(r["state"]), options=load_options(r["options"]),
        lane=Lane(r["lane"]), created_at=r["created_at"], audio_seconds=r["audio_seconds"],
        filename=r["filename"], started_at=r["started_at"], finished_at=r["finished_at"],
        attempts=r["attempts"], result=result, error=error,
        meta={"kept_until": r["kept_until"]} if "kept_until" in r.keys() and r["kept_until"] else {},
    )


class WaveSpool:
    """Decoded 16 kHz audio of long recordings waiting on this host's disk to be split by VAD
    (memory-mapped, not held in memory); deleted when the job ends. ``directory`` is a folder of
    the data directory: both are made private (0700) here, the files 0600, in either topology."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        ensure_data_dir(self.dir.parent)
        private_subdir(self.dir)

    def path(self, job_id: str) -> Path:
        return self.dir / f"{job_id}.wave.npy"

    def save(self, job_id: str, samples: np.ndarray) -> None:
        path = self.path(job_id)
        tmp = path.with_suffix(".tmp")
        try:
            with open(create_private(tmp, replace=True), "wb") as f:
                np.save(f, np.ascontiguousarray(samples, dtype=np.float32))
            os.replace(tmp, path)
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise storage_error(e) from None

    def load(self, job_id: str) -> np.ndarray | None:
        """The saved audio, memory-mapped copy-on-write (pages are read as pieces run), or None."""
        try:
            return np.load(self.path(job_id), mmap_mode="c")
        except FileNotFoundError:
            return None

    def delete(self, job_id: str) -> None:
        self.path(job_id).unlink(missing_ok=True)

    def keep_only(self, job_ids: set[str]) -> None:
        """Delete what no unfinished job needs (left by a crash between a finish and its delete)."""
        for path in self.dir.glob("*.wave.npy"):
            if path.name.split(".", 1)[0] not in job_ids:
                path.unlink(missing_ok=True)
