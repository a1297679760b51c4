"""Where the distributed topology's bulky bytes travel: inside Redis, or beside it in a shared directory.

A job's decoded audio (16 kHz, sent from the api process that decoded it to the worker that runs
it) and its upload (kept for the review player) are the only large values of the topology: a 10 s
clip is 320 KB of upload and 320 KB of 16-bit PCM. Inside Redis they pass through its one thread
twice each (in, then out): measured on the H200, that alone kept Redis's thread busy at ~300
jobs/s. ``Payloads`` keeps the values' encoding in one place and offers two homes:

* in Redis (the default; api and worker processes on any hosts): the value itself;
* in a shared directory (``Settings.shared_dir``, e.g. ``/dev/shm/sensevoice`` for api and worker
  processes on one host, or a shared filesystem): a file written by the api process, and in Redis
  only its name. Redis then carries a few hundred bytes per job.

Every stored value starts with one format byte:

    b"S" + 16-bit little-endian PCM    decoded audio, inline (exact for 16-bit sources: what
                                        decoding gives is k / 32768, and k is what is sent)
    b"B" + bytes                        an upload, inline
    b"F" + file name                    either, in the shared directory: an upload's file as
                                        inline, an audio file as b"P" + b"\\0" + 16-bit PCM
                                        (the samples 2-byte aligned: the worker maps the file
                                        and reads no byte of it; files of older writers, b"S" +
                                        PCM, are read too)

A file's lifetime follows its Redis value: the process that ends a job deletes the job's audio
files; uploads and any file whose value is gone (a process that died between writing a file and
its Redis command, an upload past the retention) are removed by :meth:`Payloads.sweep`, which the
api processes' janitors run. Files are written with a temporary name and renamed, never fsynced:
a host crash loses the audio of queued jobs, which then fail with ``audio_lost`` (never silently),
so on one host choose /dev/shm for speed; Redis's own durability is unchanged.

The directory is checked at the start (0700, ours, and under no directory another user can write:
pipeline/serving/private_dir.py) and then used only through the descriptor of the directory
checked: every file is opened, renamed and deleted relative to it (``dir_fd=``), so a directory
that another user puts at its path later is never read (issue 36: ``/audio`` served the bytes of
such a swapped-in directory). The janitor's sweep logs an error when the path names another
directory than the one in use. A stored value that names a damaged file (or no file this process
can read) raises :class:`~pipeline.domain.errors.AudioUnreadable`: ``/audio`` answers it as a JSON
500 ``audio_unreadable``.
"""

from __future__ import annotations

import logging
import mmap
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from queue import SimpleQueue

import numpy as np
import torch

from pipeline.domain.errors import AudioUnreadable, UnsafeDirectory
from pipeline.serving.private_dir import PrivateDir, create_private

logger = logging.getLogger("sensevoice.payloads")

PCM16 = b"S"
PCM16_FILE = b"P\0"  # a shared audio file's header: the samples start 2-byte aligned
BYTES = b"B"
FILE = b"F"
SWEEP_MIN_AGE_S = 60.0  # a file younger than this may still be waiting for its Redis command
SWEEP_BATCH = 500  # names checked against Redis per round trip
_NAME = re.compile(r"^(uploads/[0-9a-f-]{36}|audio/[0-9a-f-]{36}/\d{1,6})$")  # relative to the dir
_JOB_ID = re.compile(r"^[0-9a-f-]{36}$")
WHAT = "shared directory (SENSEVOICE_SHARED_DIR)"


def pcm16_bytes(audio: torch.Tensor) -> bytes:
    """A 1-D wave in [-1, 1] (CPU or CUDA, any float dtype) as 16-bit little-endian PCM."""
    a = audio.detach()
    if a.dim() != 1:
        raise ValueError(f"a work item's audio must be 1-D, got shape {tuple(a.shape)}")
    x = a.to("cpu", torch.float32).numpy() * np.float32(32768.0)
    np.rint(x, out=x)
    np.clip(x, -32768, 32767, out=x)
    return x.astype("<i2").tobytes()


def pcm16_tensor(data: bytes | memoryview) -> torch.Tensor:
    """16-bit little-endian PCM -> an int16 tensor of the samples k. The worker sends it to the
    device as it is (half the bytes of float32 over the bus) and the engine scales it there to
    k / 32768, what decoding gave (:func:`pipeline.model.engine.as_float_wave`): no per-sample
    work on the worker's CPU."""
    return torch.from_numpy(np.frombuffer(data, dtype="<i2").astype(np.int16))


def map_private(path: str | os.PathLike, min_size: int, what: str = "a file",
                dir_fd: int | None = None) -> mmap.mmap:
    """A private (copy-on-write) mapping of a whole file that is never changed once in place: its
    pages are read where they lie (writing the mapping never writes the file, and deleting the file
    leaves the mapping intact). ValueError when it holds fewer than ``min_size`` bytes (mapping
    past its end would fault on access); ``what`` names the file in that message. ``dir_fd``:
    ``path`` is relative to that directory."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0), dir_fd=dir_fd)
    try:
        if os.fstat(fd).st_size < min_size:
            raise ValueError(f"{what} too short for the {min_size} bytes it must hold")
        return mmap.mmap(fd, 0, access=mmap.ACCESS_COPY)
    finally:
        os.close(fd)


class Payloads:
    """Encode, store and read back audio pieces and uploads (see the module's docstring)."""

    def __init__(self, shared_dir: str | os.PathLike | None = None):
        self.dir = Path(shared_dir) if shared_dir else None
        self._deletions: SimpleQueue[list[str]] = SimpleQueue()
        self._deleter: threading.Thread | None = None
        self._deleter_lock = threading.Lock()
        self._root: PrivateDir | None = None
        self._swap_logged = False
        if self.dir is not None:  # uploads/<job id>, audio/<job id>/<piece>: deletes by name, no scans
            # 0700, ours, under no directory others can write, or refused at start
            # (pipeline/serving/private_dir.py); files 0600; used through this descriptor only
            self._root = PrivateDir(self.dir, WHAT)
            for sub in ("uploads", "audio"):
                self._private_sub(sub)

    @property
    def _fd(self) -> int:
        assert self._root is not None
        return self._root.fd

    def _private_sub(self, sub: str) -> None:
        """``sub`` of the kept directory: created 0700, or checked (a directory, not a link, ours,
        0700: nobody else can have made it inside a 0700 directory of ours, but an older version
        or an operator may have)."""
        try:
            os.mkdir(sub, 0o700, dir_fd=self._fd)
        except FileExistsError:
            pass
        st = os.stat(sub, dir_fd=self._fd, follow_symlinks=False)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
            raise UnsafeDirectory(
                f"the {WHAT} {self.dir} holds {sub!r} that is not a private directory of this "
                f"service's user (mode {stat.S_IMODE(st.st_mode):o}, uid {st.st_uid}): remove "
                f"it (rm -rf {self.dir / sub}) and start again")

    def replaced(self) -> bool:
        """The shared directory's path names another directory than the one this process checked
        at its start and uses (someone swapped it). False without a shared directory."""
        return self._root is not None and self._root.replaced()

    # ------------------------------------------------------------------ write
    def audio(self, job_id: str, piece: int, audio: torch.Tensor) -> bytes:
        """The value to store for one piece of a job's decoded audio."""
        return self._value(f"audio/{job_id}/{int(piece)}", PCM16 if self.dir is None else PCM16_FILE,
                           pcm16_bytes(audio))

    def upload(self, job_id: str, data: bytes) -> bytes:
        """The value to store for a job's upload."""
        return self._value(f"uploads/{job_id}", BYTES, data)

    def _value(self, name: str, kind: bytes, data: bytes) -> bytes:
        if self.dir is None:
            return kind + data
        if not _NAME.match(name):
            raise ValueError(f"not a shared file's name: {name[:80]!r}")
        folder, base = name.rsplit("/", 1)
        tmp = f"{folder}/.{base}.{secrets.token_hex(4)}.tmp"
        fd = self._fd
        for attempt in (1, 2):  # a job's audio folder: made here, removed by a sweep once empty
            try:
                if name.startswith("audio/"):
                    try:
                        os.mkdir(folder, 0o700, dir_fd=fd)
                    except FileExistsError:
                        pass
                with open(create_private(tmp, dir_fd=fd), "wb") as f:
                    f.write(kind)
                    f.write(data)
                os.replace(tmp, name, src_dir_fd=fd, dst_dir_fd=fd)
                break
            except FileNotFoundError:  # the sweep removed the empty folder just now: again
                self._unlink(tmp)
                if attempt == 2:
                    raise
            except BaseException:
                self._unlink(tmp)
                raise
        return FILE + name.encode()

    def _unlink(self, name: str, dir_fd: int | None = None) -> bool:
        """Delete ``name`` (relative to the kept directory, or to ``dir_fd``): False if it was gone."""
        try:
            os.unlink(name, dir_fd=self._fd if dir_fd is None else dir_fd)
            return True
        except FileNotFoundError:
            return False

    # ------------------------------------------------------------------ read
    def read_audio(self, value: bytes) -> torch.Tensor | None:
        """The piece's 16-bit samples (see :func:`pcm16_tensor`), or None when its file is gone.
        A shared file is mapped, not read: the samples are the file's pages (a private mapping,
        so writing the tensor never writes the file), and the one copy made of them is the
        engine's, into its batch. A file is never changed once renamed into place (deleting it
        leaves a mapping intact), so a mapping cannot lose its pages."""
        if value[:1] == FILE:
            name = self._name(value)
            try:
                pages = map_private(name, len(PCM16_FILE), "a shared audio file", dir_fd=self._fd)
            except FileNotFoundError:
                return None
            except ValueError as e:
                raise AudioUnreadable(f"{e} ({name})") from None
            head = pages[:len(PCM16_FILE)]
            if head == PCM16_FILE:
                samples = np.frombuffer(pages, dtype="<i2", offset=len(PCM16_FILE))
            elif head[:1] == PCM16:  # an older writer's file: unaligned samples, copied
                samples = np.frombuffer(pages, dtype="<i2", offset=1).copy()
            else:
                raise AudioUnreadable(f"a stored value of unknown format {head[:1]!r} (expected "
                                      f"{PCM16_FILE!r}) in the shared file {name}")
            return torch.from_numpy(samples.astype(np.int16, copy=False))
        data = self._resolve(value, PCM16)
        return None if data is None else pcm16_tensor(data)

    def read_upload(self, value: bytes) -> bytes | None:
        data = self._resolve(value, BYTES)
        return None if data is None else bytes(data)

    def _name(self, value: bytes) -> str:
        """The shared file a stored value names, relative to the kept directory (refused unless
        it is one this layout makes: AudioUnreadable)."""
        name = value[1:].decode("ascii", "replace")
        if self.dir is None or not _NAME.match(name):
            raise AudioUnreadable(f"a stored value names a shared file ({name[:80]!r}) that this "
                                  "process cannot read: set the same shared_dir on every process")
        return name

    def _resolve(self, value: bytes, kind: bytes) -> memoryview | None:
        if value[:1] == FILE:
            name = self._name(value)
            try:
                fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                             dir_fd=self._fd)
            except FileNotFoundError:
                return None
            except OSError as e:  # a link or a folder at its name (ELOOP, EISDIR), EACCES, EIO
                logger.error("the shared file %s cannot be read: %s", name, e)
                raise AudioUnreadable(f"the shared file {name} cannot be read "
                                      f"({e.strerror or e})") from None
            try:
                with open(fd, "rb") as f:
                    value = f.read()
            except OSError as e:  # EISDIR comes here (O_RDONLY opens a folder), EIO
                logger.error("the shared file %s cannot be read: %s", name, e)
                raise AudioUnreadable(f"the shared file {name} cannot be read "
                                      f"({e.strerror or e})") from None
        if value[:1] != kind:
            raise AudioUnreadable(f"a stored value of unknown format {value[:1]!r} (expected {kind!r})")
        return memoryview(value)[1:]

    # ------------------------------------------------------------------ delete
    def delete_audio(self, job_ids: Iterable[str]) -> None:
        """Delete the audio files of jobs that ended (their Redis values are deleted already), in
        a background thread: unlink + rmdir cost ~0.1-0.6 ms a job in file-system metadata, off the
        worker's path from one batch to the next. A deletion lost with the process is the sweep's."""
        if self.dir is None:
            return
        ids = list(job_ids)
        if not ids:
            return
        with self._deleter_lock:
            if self._deleter is None or not self._deleter.is_alive():
                self._deleter = threading.Thread(target=self._delete_loop, daemon=True,
                                                 name="sensevoice-payload-deleter")
                self._deleter.start()
        self._deletions.put(ids)

    def _delete_loop(self) -> None:
        while True:
            ids = self._deletions.get()
            try:
                self.delete_audio_now(ids)
            except Exception:  # noqa: BLE001 - never let the thread die: the sweep is the backstop
                logger.exception("deleting shared audio files failed")

    def delete_audio_now(self, job_ids: Iterable[str]) -> None:
        """Delete the audio files of these jobs in this thread."""
        if self.dir is None:
            return
        fd = self._fd
        for jid in job_ids:
            if not _JOB_ID.match(jid):
                continue  # never a name of this layout (no "..", no "/")
            folder = f"audio/{jid}"
            self._unlink(f"{folder}/0")  # a clip's one piece, then its folder: two calls, no listing
            try:
                os.rmdir(folder, dir_fd=fd)
                continue
            except FileNotFoundError:
                continue
            except OSError:  # a long job's other pieces (ENOTEMPTY): listed and removed
                pass
            try:
                sub = self._open_sub(folder)
                try:
                    for name in os.listdir(sub):
                        self._unlink(name, sub)
                finally:
                    os.close(sub)
                os.rmdir(folder, dir_fd=fd)
            except FileNotFoundError:
                pass
            except OSError as e:  # a piece written meanwhile (ENOTEMPTY): the sweep takes it
                logger.debug("audio of job %s not removed yet: %s", jid, e)

    def _open_sub(self, sub: str) -> int:
        """A descriptor of the folder ``sub`` of the kept directory (never through a link)."""
        return os.open(sub, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                       | getattr(os, "O_CLOEXEC", 0), dir_fd=self._fd)

    def delete_piece(self, job_id: str, piece: int) -> None:
        if self.dir is not None and _JOB_ID.match(job_id):
            self._unlink(f"audio/{job_id}/{int(piece)}")

    def delete_upload(self, job_id: str) -> None:
        if self.dir is not None and _JOB_ID.match(job_id):
            self._unlink(f"uploads/{job_id}")

    def sweep(self, still_stored: Callable[[list[str]], list[bool]],
              min_age_s: float = SWEEP_MIN_AGE_S, upload_min_age_s: float | None = None) -> int:
        """Delete the files older than ``min_age_s`` whose Redis value is gone. ``still_stored``
        answers, for a list of file names, whether each one's value still exists. Uploads are
        looked at only from ``upload_min_age_s`` (their values live for the retention: younger
        ones are orphaned only by a writer that died, and are left for a later sweep). Returns the
        number of files deleted."""
        if self.dir is None:
            return 0
        self._log_if_replaced()
        now = time.time()
        cutoff = now - min_age_s
        upload_cutoff = now - (min_age_s if upload_min_age_s is None else upload_min_age_s)
        names = self._old_files("uploads", upload_cutoff)
        audio = self._open_sub("audio")
        try:
            with os.scandir(audio) as folders:
                job_dirs = [e.name for e in folders if e.is_dir(follow_symlinks=False)]
        finally:
            os.close(audio)
        for jid in job_dirs:
            names += self._old_files(f"audio/{jid}", cutoff)
            try:
                os.rmdir(f"audio/{jid}", dir_fd=self._fd)  # empty (its job ended): gone; else it stays
            except OSError:
                pass
        deleted = 0
        for start in range(0, len(names), SWEEP_BATCH):
            batch = names[start:start + SWEEP_BATCH]
            for name, kept in zip(batch, still_stored(batch)):
                if not kept:
                    self._unlink(name)
                    deleted += 1
        if deleted:
            logger.info("removed %d shared files whose jobs are gone", deleted)
        return deleted

    def _old_files(self, sub: str, cutoff: float) -> list[str]:
        """Names (relative to the dir) of the files in ``sub`` last written before ``cutoff``;
        a temporary file of a writer that died is deleted on the way."""
        names = []
        try:
            fd = self._open_sub(sub)
        except (FileNotFoundError, NotADirectoryError):
            return names
        try:
            with os.scandir(fd) as entries:
                for e in entries:
                    try:
                        if e.stat(follow_symlinks=False).st_mtime >= cutoff:
                            continue
                    except FileNotFoundError:
                        continue
                    if e.name.startswith(".") and e.name.endswith(".tmp"):
                        self._unlink(e.name, fd)
                    elif _NAME.match(f"{sub}/{e.name}"):
                        names.append(f"{sub}/{e.name}")
        finally:
            os.close(fd)
        return names

    def _log_if_replaced(self) -> None:
        """An error in the log (once) when the shared directory's path names another directory
        than the one in use: someone renamed it away and may have put his own there. This process
        goes on with the one it checked; a process started now would use (or refuse) the other."""
        if self._swap_logged or not self.replaced():
            return
        self._swap_logged = True
        logger.error("the %s %s is no longer the directory this process checked at its start: "
                     "someone renamed or replaced it (look at who can write %s). This process "
                     "goes on using the one it checked and never reads the other; restart every "
                     "api and worker process once the path is safe again",
                     WHAT, self.dir, self.dir.parent if self.dir else "")
