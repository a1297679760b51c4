"""A write that fails (disk full, simulated with the file-size limit as `prlimit --fsize` sets it)
answers JSON 507 with a clear message and leaves nothing behind: no .tmp in the spool, no spool file
without its row. Before: a plain-text 500 and a .tmp file for good; a failed INSERT orphaned the
spool file."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time

import httpx
import numpy as np
import pytest

from pipeline.domain.errors import StorageFull
from pipeline.serving.broker_sqlite import JobStore
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from tests.conftest import ROOT, free_port
from tests.test_reliability import wait_ready

FSIZE_LIMIT = 2 * 1024 * 1024  # bytes: any file write past this offset fails with EFBIG


def _limit_file_size():
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # as the server does in main()
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


def _job(seconds: float = 1.0) -> Job:
    import uuid

    return Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(), seconds)


def test_spool_write_past_the_file_size_limit_is_507_and_leaves_nothing(tmp_path):
    """JobStore.create in a process under RLIMIT_FSIZE (a real EFBIG from the kernel)."""
    script = textwrap.dedent(f"""
        import json, resource, signal, sys, time, uuid
        sys.path.insert(0, {str(ROOT)!r})
        from pipeline.domain.errors import SenseVoiceError
        from pipeline.serving.broker_sqlite import JobStore
        from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
        store = JobStore({str(tmp_path / "data")!r})
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({FSIZE_LIMIT}, {FSIZE_LIMIT}))
        job = Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(), 1.0)
        try:
            store.create(job, b"x" * ({FSIZE_LIMIT} + 4096))
            out = {{"raised": None}}
        except SenseVoiceError as e:
            out = {{"raised": e.code, "status": e.status, "message": e.message}}
        small = Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(), 1.0)
        store.create(small, b"y" * 1000)
        out["counts"] = store.counts()
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["raised"] == "storage_full" and out["status"] == 507
    assert "disk full" in out["message"]
    assert out["counts"]["queued"] == 1  # the small job after it was stored; the big one not at all
    spool = sorted(p.name for p in (tmp_path / "data" / "spool").iterdir())
    assert len(spool) == 1 and spool[0].endswith(".upload")  # no .tmp, no orphan


def test_a_failed_insert_removes_the_spool_file(tmp_path):
    """SQLite answers 'database or disk is full' (its page limit reached): no orphaned spool file."""
    store = JobStore(tmp_path / "data")
    conn = store._writer()  # the connection every write goes through
    pages = conn.execute("PRAGMA page_count").fetchone()[0]
    conn.execute(f"PRAGMA max_page_count = {pages}")
    with pytest.raises(StorageFull):
        for _ in range(200):  # fill the last free page(s), then the INSERT fails
            store.create(_job(), b"z" * 100)
    rows = conn.execute("SELECT COUNT(*) FROM jobs").fetchone()[0]
    spooled = list((tmp_path / "data" / "spool").glob("*.upload"))
    assert len(spooled) == rows  # every spool file has its row, and no other
    assert not list((tmp_path / "data" / "spool").glob("*.tmp"))


def test_stale_tmp_files_are_removed_at_start(tmp_path):
    spool = tmp_path / "data" / "spool"
    spool.mkdir(parents=True)
    (spool / "cut-short.tmp").write_bytes(b"half")
    JobStore(tmp_path / "data")
    assert not (spool / "cut-short.tmp").exists()


def test_recovery_removes_old_spooled_uploads_that_no_job_names(tmp_path):
    """A process killed between spooling an upload and inserting its row (a sibling web process
    mid-submit, or the embedded store's own create) left a file no job names: the owner's recovery
    removes it once it is older than a submit's two steps could be apart."""
    store = JobStore(tmp_path / "data")
    kept = _job()
    store.create(kept, b"a job's upload")
    orphan, fresh = store.spool_path("orphan-of-a-crash"), store.spool_path("being-submitted")
    orphan.write_bytes(b"left behind")
    fresh.write_bytes(b"its row comes next")
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    os.utime(store.spool_path(kept.id), (old, old))
    assert [j.id for j in store.recover()] == [kept.id]
    assert not orphan.exists() and fresh.exists() and store.spool_path(kept.id).exists()


def test_recovery_fails_a_queued_job_whose_upload_a_power_cut_left_short(tmp_path):
    """A sibling web process syncs its spool file while the owner commits the row, and answers
    once both are done: after a power cut between the two a row may name a file that is short or
    missing. A cut recording must not be transcribed as if whole, and a job whose file was damaged
    after its submit was answered must not vanish: recovery fails it (audio_lost) with a message
    and removes the file; whole ones (and rows of before, no size) are queued again."""
    store = JobStore(tmp_path / "data")
    whole, short, missing, before = _job(), _job(), _job(), _job()
    for job in (whole, short, missing):
        store.create(job, b"x" * 1000)
    store.spool(before.id, b"y" * 10)
    store.insert(before)  # no size recorded: trusted as before
    with open(store.spool_path(short.id), "r+b") as f:
        f.truncate(600)
    store.spool_path(missing.id).unlink()
    assert [j.id for j in store.recover()] == [whole.id, before.id]
    for cut in (short, missing):
        job = store.get(cut.id)
        assert job.state is JobState.FAILED and job.error.code == "audio_lost"
        assert "submit it again" in job.error.message and not store.spool_path(cut.id).exists()


def test_a_store_of_before_gets_the_upload_size_column(tmp_path):
    import sqlite3

    data = tmp_path / "data"
    store = JobStore(data)
    job = _job()
    store.create(job, b"an upload")
    conn = sqlite3.connect(data / "jobs.sqlite3")
    conn.execute("ALTER TABLE jobs DROP COLUMN upload_bytes")  # as a store made before it was
    conn.close()
    again = JobStore(data)
    assert [j.id for j in again.recover()] == [job.id]
    again.create(other := _job(), b"another")
    assert again._conn().execute("SELECT upload_bytes FROM jobs WHERE id=?", (other.id,)).fetchone()[0] == 7


def _wav_bytes(seconds: float, rate: int = 16000) -> bytes:
    import io
    import wave

    samples = (np.sin(np.arange(int(seconds * rate)) * 0.05) * 8000).astype("<i2")
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())
    return buf.getvalue()


def test_server_under_a_file_size_limit_answers_507_json_and_keeps_serving(demo_dir, tmp_path):
    """The real server (subprocess) under RLIMIT_FSIZE: an upload larger than the limit cannot be
    written (the multipart spool or the job spool): 507 JSON; the server stays up, a small upload
    is accepted and done, and no temporary file is left in the spool."""
    data, port = tmp_path / "data", free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, str(ROOT / "app_sensevoice.py"), "--model", str(demo_dir), "--device",
           "cpu", "--port", str(port), "--data-dir", str(data), "--api-only"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=_limit_file_size,
                            env={**os.environ, "SENSEVOICE_DECODE_PROCESSES": "0"})
    try:
        wait_ready(url, proc)
        big = _wav_bytes(FSIZE_LIMIT / 32000 + 5)  # over the limit, under every upload cap
        r = httpx.post(url + "/api/jobs", files={"file": ("big.wav", big)}, timeout=60)
        assert r.status_code == 507, r.text
        assert r.headers["content-type"].startswith("application/json")
        assert r.json()["error"]["code"] == "storage_full"
        assert proc.poll() is None  # SIGXFSZ did not kill it
        r = httpx.post(url + "/api/jobs", files={"file": ("small.wav", _wav_bytes(1.0))}, timeout=60)
        assert r.status_code == 202, r.text
        jid = r.json()["id"]
        deadline = time.monotonic() + 60
        while httpx.get(f"{url}/api/jobs/{jid}").json()["status"] != "done":
            assert time.monotonic() < deadline
            time.sleep(0.1)
        leftovers = [p.name for p in (data / "spool").iterdir() if not p.name.endswith(".upload")]
        assert leftovers == []
    finally:
        proc.terminate()
        proc.wait(15)
