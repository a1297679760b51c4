"""Zips of recordings as hostile input (pipeline/audio/archive.py): bombs, lying sizes, path
tricks, nested archives, encrypted entries, too many entries; and POST /api/batches over real
HTTP: 20 files in one request, a zip, each recording decoded under the upload rules."""

from __future__ import annotations

import gzip
import io
import struct
import zipfile

import httpx
import pytest

from pipeline.audio.archive import ArchiveRefused, NotAnArchive, read_zip
from tests.test_api import wait_done

MB = 1 << 20


def make_zip(entries: dict[str, bytes], method=zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", method) as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return buf.getvalue()


def test_names_are_never_paths_and_litter_is_skipped():
    data = make_zip({"../../etc/passwd": b"a", "C:\\Windows\\evil.wav": b"b", "dir/": b"",
                     "__MACOSX/._x.wav": b"junk", "calls/._x.wav": b"junk", "/abs/ok.mp3": b"c"})
    got = read_zip(data)
    assert [(e.name, e.data) for e in got] == [("passwd", b"a"), ("evil.wav", b"b"), ("ok.mp3", b"c")]


def test_a_zip_bomb_stops_at_the_cap():
    bomb = make_zip({"a.wav": bytes(50 * MB)})
    assert len(bomb) < 100_000
    (entry,) = read_zip(bomb, max_entry_bytes=MB, max_total_bytes=10 * MB)
    assert entry.data is None and entry.error.code == "upload_too_large"
    # sizes in the headers that lie (1,000 bytes declared): stopped, never 50 MB inflated
    lying = bytearray(bomb)
    for sig, off in ((b"PK\x03\x04", 22), (b"PK\x01\x02", 24)):
        at = lying.find(sig)
        lying[at + off:at + off + 4] = struct.pack("<I", 1000)
    (entry,) = read_zip(bytes(lying), max_entry_bytes=MB, max_total_bytes=10 * MB)
    assert entry.data is None and entry.error is not None
    # many small entries that add up past the total: the whole archive is refused
    many = make_zip({f"{i}.wav": bytes(600_000) for i in range(5)})
    with pytest.raises(ArchiveRefused):
        read_zip(many, max_entry_bytes=MB, max_total_bytes=2 * MB)


def test_nested_archives_encrypted_entries_and_too_many_entries():
    inner = make_zip({"x.wav": b"RIFF"})
    got = read_zip(make_zip({"inner.wav": inner, "a.gz": gzip.compress(b"x" * 100),
                             "ok.wav": b"RIFF...."}))
    assert [e.error is not None for e in got] == [True, True, False]
    assert "archive inside the archive" in got[0].error.message
    secret = bytearray(make_zip({"secret.wav": b"RIFF"}))  # the "encrypted" flag set in both headers
    for sig, off in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
        at = secret.find(sig) + off
        secret[at] |= 0x1
    (entry,) = read_zip(bytes(secret))
    assert "encrypted" in entry.error.message
    with pytest.raises(ArchiveRefused):
        read_zip(make_zip({f"{i}.wav": b"x" for i in range(11)}), max_entries=10)
    with pytest.raises(NotAnArchive):
        read_zip(b"PK\x03\x04 not really")


def test_batch_of_20_files_and_a_zip(live_server, clip_factory, tmp_path):
    clips = [clip_factory(fmt, rate, ch) for fmt, rate, ch in
             (("wav", 16000, 1), ("mp3", 44100, 2), ("opus", 48000, 1), ("m4a", 22050, 2))]
    files = [("files", (f"call-{i:02d}{clips[i % 4].suffix}", clips[i % 4].read_bytes()))
             for i in range(19)]
    files.append(("files", ("notes.txt", b"this is not audio")))
    r = httpx.post(live_server.url + "/api/batches", files=files, data={"language": "en"}, timeout=120)
    assert r.status_code == 200, r.text
    jobs = r.json()["jobs"]
    assert len(jobs) == 20 and [j["name"] for j in jobs[:3]] == ["call-00.wav", "call-01.mp3", "call-02.opus"]
    assert jobs[-1]["error"]["code"] == "unsupported_media" and "id" not in jobs[-1]
    for j in jobs[:-1]:
        assert wait_done(live_server, j["id"])["status"] == "done"
    # a zip: recordings, a path trick, a nested zip and a text file
    data = make_zip({"day/../../a.wav": clips[0].read_bytes(), "b.mp3": clips[1].read_bytes(),
                     "nested.zip": make_zip({"c.wav": clips[0].read_bytes()}), "readme.txt": b"hi"})
    r = httpx.post(live_server.url + "/api/batches", files=[("files", ("calls.zip", data))], timeout=120)
    assert r.status_code == 200, r.text
    got = r.json()["jobs"]
    assert [j["name"] for j in got] == ["a.wav", "b.mp3", "nested.zip", "readme.txt"]
    assert "id" in got[0] and "id" in got[1] and got[2]["error"]["code"] == "invalid_option"
    assert got[3]["error"]["code"] == "unsupported_media"
    listed = httpx.post(live_server.url + "/api/calls",
                        json={"jobs": [{"id": j["id"]} for j in jobs + got if "id" in j]}, timeout=30)
    assert listed.json()["total"] == 21
    r = httpx.post(live_server.url + "/api/batches", files=[("files", ("x.zip", b"PK\x03\x04junk"))],
                   timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_archive"
