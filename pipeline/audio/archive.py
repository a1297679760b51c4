"""A zip of recordings, opened as hostile input: its entries' bytes and display names, bounded.

The rules (issue 23):

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
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath

from pipeline.domain.errors import InvalidOption, SenseVoiceError, UploadTooLarge

MAX_ENTRIES = 200  # recordings in one zip
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


def read_zip(data: bytes, max_entries: int = MAX_ENTRIES, max_entry_bytes: int = 200 << 20,
             max_total_bytes: int = 200 << 20) -> list[Entry]:
    """The recordings in the zip ``data`` (see the module docstring)."""
    try:
        zf = zipfile.ZipFile(io.BytesIO(data))
        infos = [i for i in zf.infolist() if not _skipped(i)]
    except (zipfile.BadZipFile, zipfile.LargeZipFile, ValueError, EOFError) as e:
        raise NotAnArchive(f"this is not a readable zip archive ({e})") from None
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
