"""Directories and files other local users must not touch (issue 19 rows 4 and 7): the shared
directory of the distributed topology is created 0700 or refused at start, its files are 0600;
the UI reads and serves only files of its upload directory with one link that this service's user
created (a hard link to the job store planted there was accepted and later broke the store).

Issue 36 item 7: the data directory, its SQLite store (with -wal and -shm), spool and wave files
were 0755/0644; a shared directory whose parent another user could write was swapped after the
start and ``/audio`` served what he planted; a damaged shared file made ``/audio`` a plain-text
500. Tests run as root: modes are checked through stat (root reads anything)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import io
import logging
import sqlite3
import time
import uuid
import wave

import httpx
import numpy as np
import pytest
import torch

from pipeline.domain.errors import AudioUnreadable, PathRefused, UnsafeDirectory
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions, Transcript
from pipeline.serving.broker_sqlite import JobStore, WaveSpool
from pipeline.serving.payloads import Payloads
from pipeline.serving.private_dir import ensure_private_dir
from pipeline.web.ui_guard import own_upload, prepare_upload_dir, read_own_upload
from tests.conftest import ROOT, LiveServer, make_settings
from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures)

OTHER_UID = 65534  # nobody

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="needs root to plant another user's files")


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_a_new_shared_directory_is_0700_and_its_files_0600(tmp_path):
    shared = tmp_path / "shm" / "sensevoice"
    old_umask = os.umask(0o022)  # a usual umask: files would be 0644 without an explicit mode
    try:
        payloads = Payloads(shared)
        value = payloads.upload("0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d", b"RIFF....")
        payloads.audio("0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d", 0, torch.zeros(160))
    finally:
        os.umask(old_umask)
    assert mode(shared) == 0o700
    assert mode(shared / "uploads") == 0o700 and mode(shared / "audio") == 0o700
    files = [p for p in shared.rglob("*") if p.is_file()]
    assert len(files) == 2 and {mode(p) for p in files} == {0o600}
    assert payloads.read_upload(value) == b"RIFF...."


@root_only
def test_a_shared_directory_another_user_made_is_refused(tmp_path):
    shared = tmp_path / "planted"
    shared.mkdir()
    os.chown(shared, OTHER_UID, OTHER_UID)
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafeDirectory) as e:
        Payloads(shared)
    assert f"belongs to uid {OTHER_UID}" in e.value.message and "rm -rf" in e.value.message
    assert "SENSEVOICE_SHARED_DIR" in e.value.message
    assert not (shared / "uploads").exists()  # nothing written into it


def test_a_shared_directory_writable_by_others_is_refused(tmp_path):
    shared = tmp_path / "wide"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(UnsafeDirectory, match="writable by others"):
        Payloads(shared)
    os.chmod(shared, 0o770)  # group-writable: another user of the group could plant files too
    with pytest.raises(UnsafeDirectory, match="writable by others"):
        ensure_private_dir(shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        ensure_private_dir(link)


@root_only
def test_the_server_refuses_to_start_on_a_planted_shared_directory(tmp_path):
    shared = tmp_path / "planted"
    shared.mkdir(mode=0o777)
    os.chown(shared, OTHER_UID, OTHER_UID)
    env = {**os.environ, "SENSEVOICE_SHARED_DIR": str(shared),
           "SENSEVOICE_BROKER": "redis://127.0.0.1:1/0", "SENSEVOICE_ROLE": "api"}
    r = subprocess.run([sys.executable, str(ROOT / "app_sensevoice.py"), "--port", "1",
                        "--data-dir", str(tmp_path / "data")], env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2, r.stderr[-2000:]
    assert f"belongs to uid {OTHER_UID}" in r.stderr and "Traceback" not in r.stderr


@root_only
def test_a_ui_upload_directory_another_user_made_is_refused(tmp_path):
    planted = tmp_path / "data" / "ui-uploads"
    planted.mkdir(parents=True)
    os.chown(planted, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeDirectory, match="UI upload directory"):
        prepare_upload_dir(tmp_path / "data")


# ---------------------------------------------------------------------------- uploads the UI names


def test_a_hard_link_in_the_upload_directory_is_not_an_upload(tmp_path):
    root = prepare_upload_dir(tmp_path / "data")
    store = tmp_path / "data" / "jobs.sqlite3"
    store.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100)
    os.makedirs(os.path.join(root, "abc"))
    planted = os.path.join(root, "abc", "clip.wav")
    os.link(store, planted)
    assert own_upload(planted, root) is None
    with pytest.raises(PathRefused):
        read_own_upload(planted, root, 10**6)
    # the same bytes as a file of its own are an upload
    single = os.path.join(root, "abc", "single.wav")
    with open(single, "wb") as f:
        f.write(store.read_bytes())
    assert own_upload(single, root) == single
    assert read_own_upload(single, root, 10**6)[1] == store.read_bytes()


@root_only
def test_a_file_another_user_planted_is_not_an_upload(tmp_path):
    root = prepare_upload_dir(tmp_path / "data")
    planted = os.path.join(root, "theirs.wav")
    with open(planted, "wb") as f:
        f.write(b"RIFF")
    os.chown(planted, OTHER_UID, OTHER_UID)
    assert own_upload(planted, root) is None
    with pytest.raises(PathRefused):
        read_own_upload(planted, root, 10**6)


def test_the_file_route_refuses_a_hard_link_to_the_job_store(demo_dir, tmp_path):
    server = LiveServer(make_settings(demo_dir, tmp_path / "data")).start()
    try:
        data = os.path.realpath(server.settings.server.data_dir)
        store = os.path.join(data, "jobs.sqlite3")
        assert os.path.isfile(store)
        root = os.path.join(data, "ui-uploads")
        os.makedirs(os.path.join(root, "x"), exist_ok=True)
        planted = os.path.join(root, "x", "notes.wav")
        os.link(store, planted)
        r = httpx.get(f"{server.url}/ui/gradio_api/file={planted}", timeout=10)
        assert r.status_code == 403 and r.json()["error"]["code"] == "path_refused"
        assert b"SQLite format 3" not in r.content
    finally:
        server.stop()


# ---------------------------------------------------------------------------- issue 36: the data directory
def private_tree(root) -> dict[str, int]:
    """Every directory and file under ``root`` (itself included) whose mode lets group or others
    in: relative path -> mode. Empty when everything is private."""
    loose = {}
    for d, dirs, files in os.walk(root):
        for p in [d] + [os.path.join(d, f) for f in files]:
            m = stat.S_IMODE(os.lstat(p).st_mode)
            if m & 0o077:
                loose[os.path.relpath(p, root)] = m
    return loose


@pytest.fixture
def usual_umask():
    old = os.umask(0o022)  # files would be 0644 and folders 0755 without explicit modes
    yield
    os.umask(old)


def _job() -> Job:
    return Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(), 1.0,
               filename="call.wav")


def test_the_embedded_store_creates_everything_private(tmp_path, usual_umask):
    data = tmp_path / "srv" / "data"  # missing parents are made 0700 too
    store = JobStore(data)
    job = _job()
    store.create(job, b"RIFF" + b"\0" * 100)
    other = _job()  # a sibling web process's path: spooled unsynced, synced after the insert
    spooled = store.spool_unsynced(other.id, b"RIFF" + b"\1" * 100)
    store.insert(other, spooled.size)
    spooled.sync()
    assert store.mark_running([job.id]) == {job.id}
    assert store.finish(job.id, Transcript("hi", "hi"))  # the calls index's row, in the same file
    waves = WaveSpool(data / "waves")
    waves.save(job.id, np.zeros(1600, dtype=np.float32))
    sibling = JobStore(data, owner=False)  # a sibling process opens the store too
    assert sibling.get(job.id).state is JobState.DONE
    names = {os.path.relpath(os.path.join(d, f), data) for d, _, fs in os.walk(data) for f in fs}
    assert {"jobs.sqlite3", "jobs.sqlite3-wal", "jobs.sqlite3-shm", f"spool/{job.id}.upload",
            f"spool/{other.id}.upload", f"waves/{job.id}.wave.npy"} <= names
    assert private_tree(data) == {}
    assert mode(data) == mode(tmp_path / "srv") == 0o700
    sibling.close()
    store.close()


def test_the_long_audio_spool_makes_the_data_dir_private_in_either_topology(tmp_path, usual_umask):
    """The distributed api process has no job store in the data directory: the long-audio waves
    (and the UI's folders) are what it keeps there, and they make it 0700 all the same."""
    waves = WaveSpool(tmp_path / "data" / "waves")
    waves.save("a" * 36, np.zeros(160, dtype=np.float32))
    assert private_tree(tmp_path / "data") == {}


def test_an_existing_data_dir_with_loose_modes_is_tightened_and_says_so(tmp_path, usual_umask, caplog):
    data = tmp_path / "data"
    (data / "spool").mkdir(parents=True)
    os.chmod(data, 0o755)
    old = sqlite3.connect(data / "jobs.sqlite3")  # a store of before: 0644, with its -wal/-shm
    old.execute("PRAGMA journal_mode=WAL")
    old.execute("CREATE TABLE t (x)")
    assert mode(data / "jobs.sqlite3") == 0o644 and mode(data / "jobs.sqlite3-wal") == 0o644
    with caplog.at_level(logging.WARNING, logger="sensevoice.private_dir"):
        store = JobStore(data)
    try:
        assert mode(data) == 0o700 and mode(data / "spool") == 0o700
        for name in ("jobs.sqlite3", "jobs.sqlite3-wal", "jobs.sqlite3-shm"):
            assert mode(data / name) == 0o600, name
        assert "was mode 755" in caplog.text and "tightened to 0700" in caplog.text
    finally:
        store.close()
        old.close()


@root_only
def test_a_data_dir_of_another_user_is_refused(tmp_path):
    data = tmp_path / "data"
    data.mkdir(mode=0o700)
    os.chown(data, OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeDirectory, match=f"belongs to uid {OTHER_UID}") as e:
        JobStore(data)
    assert "data directory" in e.value.message
    assert list(data.iterdir()) == []  # nothing written into it
    (tmp_path / "file").write_bytes(b"")
    with pytest.raises(UnsafeDirectory, match="not a directory"):
        JobStore(tmp_path / "file")



@root_only
def test_a_folder_or_store_file_planted_in_the_data_dir_is_refused(tmp_path):
    data = tmp_path / "data"
    (data / "spool").mkdir(parents=True, mode=0o700)
    os.chown(data / "spool", OTHER_UID, OTHER_UID)  # made by another user (a data dir he could write)
    with pytest.raises(UnsafeDirectory, match=f"spool belongs to uid {OTHER_UID}"):
        JobStore(data)
    os.chown(data / "spool", 0, 0)
    (data / "jobs.sqlite3-wal").write_bytes(b"")
    os.chown(data / "jobs.sqlite3-wal", OTHER_UID, OTHER_UID)
    with pytest.raises(UnsafeDirectory, match=f"jobs.sqlite3-wal is owned by uid {OTHER_UID}"):
        JobStore(data)


@root_only
def test_a_root_data_dir_of_a_container_is_used_and_its_files_are_private(caplog):
    """Kubernetes makes an emptyDir root's (mode 2777) and runs the service as another user: the
    directory cannot be made private, so it is used with a warning, and what the service writes
    in it is private (this test acts as that user through its effective uid)."""
    import tempfile

    base = tempfile.mkdtemp(dir="/tmp")
    store = None
    try:
        os.chmod(base, 0o755)  # the other user may walk to it
        data = os.path.join(base, "data")
        os.mkdir(data)
        os.chmod(data, 0o2777)
        os.setegid(OTHER_UID)
        os.seteuid(OTHER_UID)
        try:
            with caplog.at_level(logging.WARNING, logger="sensevoice.private_dir"):
                store = JobStore(data)
                store.spool(str(uuid.uuid4()), b"RIFF")
                store.mark_running([])  # the write connection: -wal and -shm (gone at close)
                WaveSpool(os.path.join(data, "waves")).save("a" * 36, np.zeros(16, np.float32))
        finally:
            os.seteuid(0)
            os.setegid(0)
        assert caplog.text.count("belongs to root, mode 2777") == 1  # said once
        assert "other users can rename or delete it" in caplog.text
        assert f"chown {OTHER_UID}" in caplog.text
        assert mode(data) == 0o2777  # not this user's to change
        assert os.path.exists(os.path.join(data, "jobs.sqlite3-wal"))
        assert private_tree(data) == {".": 0o2777}  # everything in it private
    finally:
        if store is not None:
            store.close()
        subprocess.run(["rm", "-rf", base], check=True)


def test_the_running_embedded_server_keeps_its_data_private(demo_dir, tmp_path, usual_umask):
    server = LiveServer(make_settings(demo_dir, tmp_path / "data")).start()
    try:
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes((np.sin(np.arange(16000) / 8) * 8000).astype("<i2").tobytes())
        r = httpx.post(f"{server.url}/api/jobs?wait=60", files={"file": ("a.wav", buf.getvalue())},
                       timeout=90)
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        audio = httpx.get(f"{server.url}/api/jobs/{r.json()['id']}/audio", timeout=10)
        assert audio.status_code == 200 and audio.content == buf.getvalue()
        data = server.settings.server.data_dir
        assert os.path.exists(os.path.join(data, "jobs.sqlite3-wal"))
        assert private_tree(data) == {}
    finally:
        server.stop()


# ---------------------------------------------------------------------------- issue 36: the shared directory
def test_a_shared_dir_whose_parent_others_can_write_is_refused(tmp_path):
    parent = tmp_path / "open"
    parent.mkdir()
    os.chmod(parent, 0o777)  # no sticky bit: any user renames what is in it
    with pytest.raises(UnsafeDirectory, match="which other users can write") as e:
        Payloads(parent / "shm")
    assert "SENSEVOICE_SHARED_DIR" in e.value.message and "chmod go-w" in e.value.message
    assert not (parent / "shm").exists()  # refused before anything is created
    with pytest.raises(UnsafeDirectory, match="which other users can write"):
        Payloads(parent / "a" / "b" / "shm")
    assert list(parent.iterdir()) == []  # not even the missing folders above it
    os.chmod(parent, 0o770)  # group-writable: the same
    with pytest.raises(UnsafeDirectory, match="which other users can write"):
        Payloads(parent / "shm")
    os.chmod(parent, 0o700)  # a grandparent others can write: the same (the parent is renamed)
    os.chmod(tmp_path, 0o777)
    try:
        with pytest.raises(UnsafeDirectory, match=f"inside {tmp_path},"):
            Payloads(parent / "shm")
    finally:
        os.chmod(tmp_path, 0o700)


def test_a_shared_dir_in_a_sticky_root_directory_is_accepted(tmp_path):
    parent = tmp_path / "shm-like"
    parent.mkdir()
    os.chmod(parent, 0o1777)  # as /tmp and /dev/shm
    if os.geteuid() == 0:
        assert os.stat(parent).st_uid == 0  # root's, as /dev/shm
    p = Payloads(parent / "sensevoice")
    value = p.upload(str(uuid.uuid4()), b"RIFF")
    assert p.read_upload(value) == b"RIFF" and mode(parent / "sensevoice") == 0o700


@root_only
def test_a_shared_dir_in_another_users_directory_is_refused(tmp_path):
    parent = tmp_path / "theirs"
    parent.mkdir(mode=0o1777)
    os.chmod(parent, 0o1777)
    os.chown(parent, OTHER_UID, OTHER_UID)  # sticky, but its owner renames anything in it
    with pytest.raises(UnsafeDirectory, match=f"belongs to uid {OTHER_UID}"):
        Payloads(parent / "shm")


def test_a_swapped_shared_directory_is_never_served(tmp_path, caplog):
    parent = tmp_path / "parent"
    shared = parent / "shm"
    p = Payloads(shared)
    jid = str(uuid.uuid4())
    upload = p.upload(jid, b"the real upload")
    audio = p.audio(jid, 0, torch.full((160,), 0.5))
    # another user (who could write the parent: the start refuses that now, root does it here)
    # renames the checked directory away and puts his own, with planted files, at its path
    os.rename(shared, parent / "moved")
    for sub in ("uploads", f"audio/{jid}"):
        (shared / sub).mkdir(parents=True)
    (shared / "uploads" / jid).write_bytes(b"Bplanted bytes")
    (shared / "audio" / jid / "0").write_bytes(b"P\0" + b"\x01\x02" * 160)
    assert p.replaced()
    assert p.read_upload(upload) == b"the real upload"  # read through the kept descriptor
    assert torch.equal(p.read_audio(audio), torch.full((160,), 16384, dtype=torch.int16))
    jid2 = str(uuid.uuid4())
    p.upload(jid2, b"a later upload")  # written into the checked directory, not the planted one
    assert (parent / "moved" / "uploads" / jid2).read_bytes() == b"Ba later upload"
    assert not (shared / "uploads" / jid2).exists()
    p.delete_upload(jid)
    p.delete_audio_now([jid])
    assert (shared / "uploads" / jid).exists() and (shared / "audio" / jid / "0").exists()
    assert not (parent / "moved" / "uploads" / jid).exists()
    with caplog.at_level(logging.ERROR, logger="sensevoice.payloads"):
        p.sweep(lambda names: [True] * len(names))
        p.sweep(lambda names: [True] * len(names))
    assert caplog.text.count("is no longer the directory this process checked") == 1
    assert (shared / "uploads" / jid).read_bytes() == b"Bplanted bytes"  # untouched, never read


@pytest.mark.parametrize("damage", ["format", "folder", "link"])
def test_a_damaged_shared_upload_is_audio_unreadable(tmp_path, damage):
    p = Payloads(tmp_path / "shm")
    jid = str(uuid.uuid4())
    value = p.upload(jid, b"RIFF")
    path = tmp_path / "shm" / "uploads" / jid
    path.unlink()
    if damage == "format":
        path.write_bytes(b"Xnot a stored value")
    elif damage == "folder":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "elsewhere")
        (tmp_path / "elsewhere").write_bytes(b"Bsecret")
    with pytest.raises(AudioUnreadable) as e:
        p.read_upload(value)
    assert e.value.status == 500 and e.value.code == "audio_unreadable"


def test_the_audio_route_answers_a_damaged_shared_file_in_json(redis_url, tmp_path):  # noqa: F811
    """``GET /api/jobs/{id}/audio`` of the distributed topology over a damaged shared file: the
    app's JSON error (500 audio_unreadable), not a plain-text 500; a file that is gone is 410."""
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from pipeline.config import Settings
    from pipeline.serving.broker_redis import RedisBroker
    from pipeline.serving.job_view import JobView
    from pipeline.web.errors import install_error_handlers
    from pipeline.web.routes.jobs import build_jobs_router

    broker = RedisBroker(redis_url, retention_s=60, queue_size=100, shared_dir=tmp_path / "shm")
    try:
        app = FastAPI()
        install_error_handlers(app)
        app.include_router(build_jobs_router(Settings(data_dir=tmp_path / "data"), None,
                                             JobView(broker), None))
        client = TestClient(app, raise_server_exceptions=False)
        job = _job()
        broker.create(job, b"RIFF....WAVE")
        r = client.get(f"/api/jobs/{job.id}/audio")
        assert r.status_code == 200 and r.content == b"RIFF....WAVE"
        (tmp_path / "shm" / "uploads" / job.id).write_bytes(b"\x00damaged")
        r = client.get(f"/api/jobs/{job.id}/audio")
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json()["error"]["code"] == "audio_unreadable"
        (tmp_path / "shm" / "uploads" / job.id).unlink()
        r = client.get(f"/api/jobs/{job.id}/audio")
        assert r.status_code == 410 and r.json()["error"]["code"] == "audio_deleted"
    finally:
        broker.close()
