"""A zip of recordings, opened as hostile input: its entries' bytes and display names, bounded.

The rules (issue 23, issue 36):

* the central directory is weighed before it is read: the entry count and directory size that the
  end record (the zip64 end record, when there is one) declares, found where :mod:`zipfile` finds
  them, are refused above ``MAX_RECORDS`` / ``MAX_DIRECTORY_BYTES`` (413 ``archive_too_large``)
  before :class:`zipfile.ZipFile` parses anything (it parses exactly the declared directory size:
  a 94 MB zip of 2,000,000 directory records took 17 s and 800 MB to be refused after parsing);
* no two entries share bytes: an entry's local header, name, extra field and compressed data may
  not overlap another's (a 9.5 KB zip of 160 entries pointing at one 1.26 MB recording is
  refused, 400 ``invalid_archive``, not unpacked 160 times);
* at most ``max_entries`` files (directories and the ``__MACOSX/`` / ``._name`` litter of macOS
  are skipped and not counted); more: the whole archive is refused (413 ``archive_too_large``);
* at most ``max_total_bytes`` of decompressed data in all and ``max_entry_bytes`` per entry,
  counted while decompressing (never trusting the sizes the archive declares: a zip bomb that
  lies about them is stopped at the cap, having inflated no more than it);
* no archive inside the archive (zip, gzip, bzip2, xz, 7z, rar, tar: by their first bytes, whatever
  the name says); an encrypted entry is refused;
* an entry's name is never a path: only its last part is kept, for display (``../../etc/passwd``
  is the display name ``passwd``; nothing is written to disk here at all);
* each entry is then submitted as an upload is, decoded under the same rules (the caller's job).

A refused entry does not sink the others: :func:`read_zip` returns each entry as an
:class:`Entry` with its bytes, or with the :class:`SenseVoiceError` that refused it.
"""

from __future__ import annotations

import io
import struct
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath

from pipeline.audio.decode import read_upload
from pipeline.domain.errors import InvalidOption, SenseVoiceError, UploadTooLarge

MAX_ENTRIES = 200  # recordings in one zip
# central-directory records (directories and macOS litter count: 4 a recording leaves them room) and
# the directory's bytes (a record is 46 bytes + its name, extra field and comment)
MAX_RECORDS = 4 * MAX_ENTRIES
MAX_DIRECTORY_BYTES = 1 << 20
END = struct.Struct("<4s4H2IH")  # end of central directory record (22 bytes, then the comment)
END64_LOCATOR = struct.Struct("<4sIQI")  # zip64 end of central directory locator (20 bytes)
END64 = struct.Struct("<4sQ2H2I4Q")  # zip64 end of central directory record (56 bytes)
LOCAL = struct.Struct("<4s5H3I2H")  # local file header (30 bytes, then name and extra field)
ZIP_MAGIC = b"PK\x03\x04"
NESTED = (ZIP_MAGIC, b"PK\x05\x06", b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00", b"7z\xbc\xaf\x27\x1c",
          b"Rar!\x1a\x07")
CHUNK = 1 << 20


class ArchiveRefused(SenseVoiceError):
    """The archive as a whole is refused (not a zip, too many entries, too large)."""

    status = 413
    code = "archive_too_large"


class NotAnArchive(InvalidOption):
    code = "invalid_archive"


def is_zip(head: bytes) -> bool:
    return head.startswith(ZIP_MAGIC) or head.startswith(b"PK\x05\x06")


def is_archive(head: bytes) -> bool:
    """Whether these first bytes are those of an archive or a compressed stream."""
    return head.startswith(NESTED) or head[257:262] == b"ustar"


@dataclass(frozen=True)
class Entry:
    name: str  # for display only: the entry's last path part
    data: bytes | None = None
    error: SenseVoiceError | None = None


def display_name(name: str) -> str:
    """The last part of an entry's name (``\\`` read as ``/``), never a path."""
    return PurePosixPath(name.replace("\\", "/")).name[:200]


def _skipped(info: zipfile.ZipInfo) -> bool:
    parts = info.filename.replace("\\", "/").split("/")
    return info.is_dir() or "__MACOSX" in parts or parts[-1].startswith("._") or not parts[-1]


@dataclass(frozen=True)
class Directory:
    """What a zip's end record declares of its central directory."""

    records: int
    size: int  # bytes


def end_record(data: bytes) -> Directory | None:
    """The central directory's record count and size as ``zipfile`` will read them, or None when
    ``data`` has no end record. Found as :func:`zipfile._EndRecData` finds it (the last 22 bytes
    when they are an end record without a comment, else the last end-record signature in the final
    64 KiB + 22 bytes; the zip64 end record's figures when a zip64 locator sits just before it), so
    that the limits are checked against the very record the parser then follows."""
    n = len(data)
    at = n - END.size
    if not (at >= 0 and data.startswith(b"PK\x05\x06", at) and data.endswith(b"\0\0")):
        at = data.rfind(b"PK\x05\x06", max(n - (1 << 16) - END.size, 0))
        if at < 0 or n - at < END.size:
            return None
    fields = END.unpack_from(data, at)
    records, size = fields[4], fields[5]
    # (positions before the start read from the start, as zipfile's seeks in a BytesIO do)
    locator = max(at - END64_LOCATOR.size, 0)
    if n - locator >= END64_LOCATOR.size and data.startswith(b"PK\x06\x07", locator):
        end64 = max(at - END64_LOCATOR.size - END64.size, 0)
        if n - end64 >= END64.size and data.startswith(b"PK\x06\x06", end64):
            fields = END64.unpack_from(data, end64)
            records, size = fields[7], fields[8]
    return Directory(records, size)


def _check_directory(data: bytes) -> None:
    """Refuse, before anything is parsed, a zip whose central directory is too large."""
    directory = end_record(data)
    if directory is None:
        raise NotAnArchive("this is not a readable zip archive (no end of central directory record)")
    if directory.records > MAX_RECORDS or directory.size > MAX_DIRECTORY_BYTES:
        raise ArchiveRefused(
            f"the archive's directory lists {directory.records} entries in {directory.size} bytes; "
            f"at most {MAX_RECORDS} entries and {MAX_DIRECTORY_BYTES} bytes are read (and at most "
            f"{MAX_ENTRIES} recordings taken from one archive)")


def _check_overlaps(data: bytes, infos: list[zipfile.ZipInfo]) -> None:
    """Refuse an archive in which two entries share bytes: each entry's span is its local header,
    name and extra field (as the local header declares them) and its compressed data (as the
    directory declares it: what ``zipfile`` reads). Entries that point at the same data, or into
    another's, are how a few kilobytes unpack into many copies of one recording."""
    spans = []
    for info in infos:
        start = info.header_offset
        head = data[start:start + LOCAL.size]
        extra = 0
        if len(head) == LOCAL.size and head.startswith(ZIP_MAGIC):
            fields = LOCAL.unpack(head)
            extra = fields[9] + fields[10]
        spans.append((start, start + LOCAL.size + extra + info.compress_size, info.filename))
    spans.sort()
    for (_, end, first), (start, _, second) in zip(spans, spans[1:]):
        if start < end:
            raise NotAnArchive(
                f"entries {display_name(first)!r} and {display_name(second)!r} share bytes in this "
                "archive (overlapping entries: a crafted zip); each recording must be stored once")


def read_zip(data: bytes, max_entries: int = MAX_ENTRIES, max_entry_bytes: int = 200 << 20,
             max_total_bytes: int = 200 << 20) -> list[Entry]:
    """The recordings in the zip ``data`` (see the module docstring)."""
    _check_directory(data)  # before zipfile parses the directory
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        every = zf.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError, NotImplementedError) as e:
        raise NotAnArchive(f"this is not a readable zip archive ({e})") from None
    if len(every) > MAX_RECORDS:  # (the end record's count lied; the size bounded the parse)
        raise ArchiveRefused(f"the archive holds {len(every)} entries; at most {MAX_RECORDS} are read")
    _check_overlaps(data, every)
    infos = [i for i in every if not _skipped(i)]
    if len(infos) > max_entries:
        raise ArchiveRefused(f"the archive holds {len(infos)} files; at most {max_entries} "
                             "recordings are taken from one archive")
    out, total = [], 0
    for info in infos:
        name = display_name(info.filename)
        if info.flag_bits & 0x1:
            out.append(Entry(name, error=InvalidOption(f"{name}: encrypted entries are not opened")))
            continue
        if info.file_size > max_entry_bytes:
            out.append(Entry(name, error=UploadTooLarge(
                f"{name}: {info.file_size} bytes when unpacked, more than {max_entry_bytes}")))
            continue
        room = min(max_entry_bytes, max_total_bytes - total)
        try:
            body = _inflate(zf, info, room)
        except (zipfile.BadZipFile, ValueError, EOFError, NotImplementedError, OSError) as e:
            out.append(Entry(name, error=InvalidOption(f"{name}: cannot be unpacked ({e})")))
            continue
        except zipfile.error as e:  # pragma: no cover - other zipfile failures
            out.append(Entry(name, error=InvalidOption(f"{name}: cannot be unpacked ({e})")))
            continue
        if body is None:
            if room < max_entry_bytes:
                raise ArchiveRefused(f"the archive unpacks to more than {max_total_bytes} bytes, "
                                     "the most one upload may hold")
            out.append(Entry(name, error=UploadTooLarge(
                f"{name}: more than {max_entry_bytes} bytes when unpacked")))
            continue
        total += len(body)
        if is_archive(body[:512]):
            out.append(Entry(name, error=InvalidOption(
                f"{name}: an archive inside the archive is not opened; add its recordings directly")))
            continue
        out.append(Entry(name, data=body))
    return out


def _inflate(zf: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int) -> bytes | None:
    """The entry's bytes, or None when it inflates past ``limit`` (read in chunks: no more than
    ``limit`` + one chunk is ever held, whatever the header claims)."""
    buf = bytearray()
    with zf.open(info) as f:
        while True:
            chunk = f.read(CHUNK)
            if not chunk:
                return bytes(buf)
            buf += chunk
            if len(buf) > limit:
                return None


def read_recordings(file, name: str, cap: int, max_entries: int, room: int) -> list[Entry]:
    """One uploaded file of a batch (read from ``file`` up to ``cap`` bytes): itself, or the
    recordings of a zip (:func:`read_zip`, ``room`` bytes unpacked at most). Blocking: call it from a
    worker thread."""
    data = read_upload(file, cap)
    if is_zip(data[:4]):
        return read_zip(data, max_entries, cap, room)
    return [Entry(name, data=data)]
