"""Zips of recordings as hostile input (pipeline/audio/archive.py): bombs, lying sizes, path
tricks, nested archives, encrypted entries, too many entries, a central directory too large to be
parsed, entries that share bytes; and POST /api/batches over real HTTP: 20 files in one request,
a zip, each recording decoded under the upload rules."""

from __future__ import annotations

import gzip
import io
import struct
import zipfile

import httpx
import pytest

from pipeline.audio.archive import (MAX_DIRECTORY_BYTES, MAX_RECORDS, ArchiveRefused, NotAnArchive,
                                    end_record, read_zip)
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


def directory_only(n: int, zip64: bool = True, declared: int | None = None) -> bytes:
    """A zip that is (all but) a central directory: ``n`` 47-byte records of one empty entry, its
    end record declaring ``declared`` records (``n``), through zip64 end records or not."""
    local = struct.pack("<4s5H3I2H", b"PK\x03\x04", 20, 0, 0, 0, 0, 0, 0, 0, 1, 0) + b"a"
    record = struct.pack("<4s6H3I5H2I", b"PK\x01\x02", 20, 20, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0,
                         0, 0) + b"a"
    cd = record * n
    declared = n if declared is None else declared
    if not zip64:
        return local + cd + struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, declared & 0xFFFF,
                                        declared & 0xFFFF, len(cd), len(local), 0)
    end64 = struct.pack("<4sQ2H2I4Q", b"PK\x06\x06", 44, 45, 45, 0, 0, declared, declared, len(cd),
                        len(local))
    locator = struct.pack("<4sIQI", b"PK\x06\x07", 0, len(local) + len(cd), 1)
    end = struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 0xFFFF, 0xFFFF, 0xFFFFFFFF, 0xFFFFFFFF, 0)
    return local + cd + end64 + locator + end


@pytest.fixture
def no_parse(monkeypatch):
    """zipfile's central-directory parser, made to fail the test if it is reached."""
    def parse(self):
        raise AssertionError("zipfile parsed the central directory")
    monkeypatch.setattr(zipfile.ZipFile, "_RealGetContents", parse)


def test_a_huge_central_directory_is_refused_before_it_is_parsed(no_parse):
    # the attack: 94 MB of 2,000,000 directory records (zip64 end records): 17 s and +800 MB
    # parsed before the entry limit refused it
    bomb = directory_only(2_000_000)
    assert len(bomb) > 90_000_000
    with pytest.raises(ArchiveRefused, match="2000000 entries"):
        read_zip(bomb)
    # the classic end record's count, and a count that lies under a directory too large to read
    with pytest.raises(ArchiveRefused):
        read_zip(directory_only(MAX_RECORDS + 1, zip64=False))
    records = MAX_DIRECTORY_BYTES // 47 + 1  # (47 bytes a record)
    with pytest.raises(ArchiveRefused, match=f"3 entries in {records * 47} bytes"):
        read_zip(directory_only(records, zip64=False, declared=3))
    with pytest.raises(NotAnArchive):  # no end record at all: nothing for zipfile to parse either
        read_zip(b"PK\x03\x04" + bytes(100))


def test_the_end_record_is_the_one_zipfile_reads():
    # a record count that lies under the size limit: the parse is bounded by the size, then refused
    lying = directory_only(MAX_RECORDS * 2, zip64=False, declared=3)
    assert end_record(lying).records == 3
    with pytest.raises(ArchiveRefused, match=f"{MAX_RECORDS * 2} entries"):
        read_zip(lying)
    plain = make_zip({"a.wav": b"RIFF", "b.wav": b"RIFF"})
    commented = bytearray(plain)
    commented[-2:] = struct.pack("<H", 9)  # an archive comment: the end record is searched for
    commented += b"a comment"
    for data in (plain, bytes(commented), directory_only(10), directory_only(10, zip64=False)):
        theirs = zipfile._EndRecData(io.BytesIO(data))
        ours = end_record(data)
        assert (ours.records, ours.size) == (theirs[4], theirs[5])
    assert [e.data for e in read_zip(bytes(commented))] == [b"RIFF", b"RIFF"]


def test_entries_that_share_bytes_are_refused(monkeypatch):
    one = make_zip({"a.wav": bytes(1_260_000)})  # deflated: a kilobyte or so
    at, = struct.unpack("<I", one[-6:-2])
    size, = struct.unpack("<I", one[-10:-6])
    record = one[at:at + size]
    # the attack: 160 directory entries pointing at one 1.26 MB recording (9.5 KB): 160 jobs
    crafted = one[:at] + record * 160 + struct.pack("<4s4H2IH", b"PK\x05\x06", 0, 0, 160, 160,
                                                     size * 160, at, 0)
    assert len(crafted) < 12_000 and len(zipfile.ZipFile(io.BytesIO(crafted)).infolist()) == 160
    inflated = []
    real_open = zipfile.ZipFile.open
    monkeypatch.setattr(zipfile.ZipFile, "open",
                        lambda self, *a, **k: inflated.append(1) or real_open(self, *a, **k))
    with pytest.raises(NotAnArchive, match="share bytes"):
        read_zip(crafted)
    assert inflated == []  # refused before any entry was unpacked
    # an entry whose declared size runs into the next entry's header
    two = bytearray(make_zip({"a.wav": b"A" * 1000, "b.wav": b"B" * 1000}, zipfile.ZIP_STORED))
    at = two.find(b"PK\x01\x02")
    two[at + 20:at + 24] = struct.pack("<I", 1010)  # a.wav's compressed size, 10 bytes too many
    with pytest.raises(NotAnArchive, match="share bytes"):
        read_zip(bytes(two))
    # stored one after the other, as any zip tool writes them: taken
    fine = make_zip({f"{i}.wav": b"RIFF" * 100 for i in range(150)} | {"d/": b""}, zipfile.ZIP_STORED)
    assert len([e for e in read_zip(fine) if e.data]) == 150


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
