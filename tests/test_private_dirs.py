"""Directories and files other local users must not touch (issue 19 rows 4 and 7): the shared
directory of the distributed topology is created 0700 or refused at start, its files are 0600;
the UI reads and serves only files of its upload directory with one link that this service's user
created (a hard link to the job store planted there was accepted and later broke the store)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import httpx
import pytest
import torch

from pipeline.domain.errors import PathRefused, UnsafeDirectory
from pipeline.serving.payloads import Payloads
from pipeline.serving.private_dir import ensure_private_dir
from pipeline.web.ui_guard import own_upload, prepare_upload_dir, read_own_upload
from tests.conftest import ROOT, LiveServer, make_settings

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
