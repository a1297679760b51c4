"""Batch CLI: transcribe folders of recordings through the same pipeline, here or on a server.

    python -m pipeline.cli PATHS... --output-dir DIR [--format txt,json,srt,vtt] [--language auto]
                           [--languages zh,en] [--word-timestamps] [--no-itn] [--split-channels]
                           [--redact pii|card,phone,...] [--speakers N | --diarize]
                           [--demo | --model DIR|NAME] [--device cuda|cpu]
                           [--server URL [--token TOKEN]] [--jobs N] [--retry-for S] [--quiet]

* **Inputs**: PATHS are files, folders (walked recursively) and glob patterns, expanded here
  (``"calls/**/*.wav"``: quoted, it works on any shell). Folders and patterns yield the files with
  an audio or video suffix (:data:`MEDIA_SUFFIXES`), hidden ones (``.name``) left out; a file named
  on the command line is taken whatever its suffix. Links: a walk (of a folder, or of a pattern's
  fixed leading folders, matched part by part, ``**`` for any folders) never enters a linked
  folder (no loops, no leaving the tree: glob.glob would) and takes a linked file only when it
  points inside the folder walked; a file named on the command line is taken as named.
* **Outputs** mirror the inputs' tree under ``--output-dir``: relative to the deepest folder holding
  every PATH (a folder PATH holds its files; a pattern, its fixed leading folders), so
  ``a/call.wav`` and ``b/call.wav`` give ``DIR/a/call.txt`` and ``DIR/b/call.txt``. Two inputs
  that would share outputs (``x.wav`` and ``x.mp3`` in one folder) are refused: the second fails.
  Each output is written to a temporary file beside it and renamed into place (``os.replace``):
  a file under its final name is always complete, even after a crash or Ctrl-C.
* **Resume**: a file whose outputs (every ``--format``) all exist is skipped, so the same command
  run again carries on where it stopped (run it with the same PATHS: they fix the mirror root).
* **Streaming**: at most ``--jobs`` files are read, decoded or waited for at once; memory does not
  grow with the number of files. Local mode puts each decoded file straight into the worker's
  batches (no job store, no spooled copy: :mod:`pipeline.serving.direct`) and one writer thread
  writes the outputs a group at a time (one sync per group); with ``--server`` each thread takes
  the next file when its previous one is written.
* **Busy** answers (queue full, GPU memory low, too many uploads: 503 + Retry-After, 429) are
  retried after their Retry-After for at most ``--retry-for`` seconds; a file that fails (corrupt,
  no audio track, too long) fails alone, with its reason in the final table.
* Local mode (default): the model in this process (``--demo`` or ``--model``);
  ``--server URL``: the REST API through :mod:`pipeline.client` (token: ``--token`` or
  ``SENSEVOICE_API_TOKEN``), so a laptop can feed a remote GPU server.

Exit status: 0 every file done (now or before), 1 some file failed, 2 nothing could start (no model,
no inputs, server unreachable, token refused), 130 interrupted (what was written stays complete).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import fnmatch
import gc
import logging
import math
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from queue import Empty, Queue

from pipeline.config import env_api_token
from pipeline.domain.exports import FORMATS
from pipeline.domain.tags import AUTO_LANGUAGE, REQUEST_LANGUAGES

logger = logging.getLogger("sensevoice.cli")

MEDIA_SUFFIXES = frozenset(
    ".wav .wave .mp3 .flac .ogg .oga .opus .m4a .aac .wma .amr .aif .aiff .aifc .caf .mka .au .ac3 "
    ".spx .3gp .3g2 .mp4 .m4v .mov .mkv .webm .avi .wmv .flv .mpg .mpeg .ts .mts .m2ts".split())
JOB_TIMEOUT_S = 24 * 3600.0  # s, the longest one file may take once accepted
DEFAULT_JOBS = 16  # files in flight on a server: enough for its worker to batch across them
LOCAL_JOBS = 256  # files in flight in local mode: a few of the worker's largest batches
READERS = 8  # local mode: threads reading and decoding files (decodes run in the decoder pool)
REMOTE_UPLOADS_AT_ONCE = 4  # uploads in flight to a server (its max_uploads_per_client default)
_GLOB_MAGIC = re.compile(r"[*?[]")
EXIT_OK, EXIT_FAILED, EXIT_START, EXIT_INTERRUPTED = 0, 1, 2, 130


class FileFailed(Exception):
    """One file failed; ``reason`` goes into the final table."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class StartFailed(Exception):
    """Nothing can be transcribed (no model, server unreachable, token refused): one line, exit 2."""


# ---------------------------------------------------------------------------------------------
# Inputs and outputs
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Task:
    """One input file and where its outputs go: ``out`` + ``.<format>``."""

    path: Path  # as found (relative when the PATH was)
    out: Path  # DIR / mirrored folders / file name without its suffix


@dataclass
class Plan:
    todo: list[Task] = field(default_factory=list)
    skipped: int = 0  # every output already there (resume)
    failed: list[tuple[str, str]] = field(default_factory=list)  # (path, reason) before any work
    links_out: list[str] = field(default_factory=list)  # linked files pointing out of their tree


def output_path(out: Path, fmt: str) -> Path:
    return out.with_name(f"{out.name}.{fmt}")


def _split_pattern(pattern: str) -> tuple[Path, tuple[str, ...]]:
    """A pattern's fixed leading folders and its remaining parts
    (``calls/2026/**/*.wav`` -> ``calls/2026``, ``("**", "*.wav")``)."""
    parts = Path(pattern).parts
    n = next((i for i, part in enumerate(parts) if _GLOB_MAGIC.search(part)), len(parts))
    return Path(*parts[:n]) if n else Path("."), parts[n:]


def _match(parts: Sequence[str], pattern: Sequence[str]) -> bool:
    """``parts`` (a relative path) matches ``pattern``, ``**`` standing for any folders."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _match(parts[1:], pattern[1:])


def _may_lead_to_match(parts: Sequence[str], pattern: Sequence[str]) -> bool:
    """A folder at ``parts`` may hold a match: it matches, lies under a match, or may still
    become one (always, past a ``**``)."""
    if any(_match(parts[:k], pattern) for k in range(1, len(parts) + 1)):
        return True
    for part, pat in zip(parts, pattern):
        if pat == "**":
            return True
        if not fnmatch.fnmatchcase(part, pat):
            return False
    return len(parts) < len(pattern)


def mirror_root(paths: Sequence[str]) -> Path:
    """The deepest folder holding every PATH: outputs are laid out relative to it."""
    bases = []
    for p in paths:
        if _GLOB_MAGIC.search(p) and not os.path.exists(p):
            bases.append(str(_split_pattern(p)[0]))
        else:
            bases.append(p if os.path.isdir(p) else os.path.dirname(p) or ".")
    return Path(os.path.commonpath([os.path.abspath(b) for b in bases]))


def _is_media(path: Path) -> bool:
    return not path.name.startswith(".") and path.suffix.lower() in MEDIA_SUFFIXES


def walk(top: Path, skip: Path, links_out: list[str], pattern: Sequence[str] | None = None
         ) -> Iterator[Path]:
    """Media files under ``top`` (those whose path below ``top``, or one of its folders, matches
    ``pattern`` when given), sorted; hidden entries and ``skip`` (the output folder) left out;
    linked folders never entered (no loops, no leaving the tree: glob.glob follows them); linked
    files only when they point inside ``top``."""
    tree = top.resolve()
    for dirpath, dirnames, filenames in os.walk(top):  # followlinks=False
        rel = Path(dirpath).relative_to(top).parts
        dirnames[:] = sorted(
            d for d in dirnames if not d.startswith(".") and Path(dirpath, d).resolve() != skip
            and (pattern is None or _may_lead_to_match((*rel, d), pattern)))
        for name in sorted(filenames):
            path = Path(dirpath, name)
            if not _is_media(path) or pattern is not None and not any(
                    _match((*rel, name)[:k], pattern) for k in range(1, len(rel) + 2)):
                continue
            if path.is_symlink() and not path.resolve().is_relative_to(tree):
                links_out.append(str(path))
                continue
            yield path


def find_inputs(paths: Sequence[str], output_dir: Path, plan: Plan) -> Iterator[Path]:
    """Every input file of ``paths``, in order, each once; unusable PATHS go to ``plan.failed``."""
    skip = output_dir.resolve()
    seen: set[str] = set()

    def once(found: Iterable[Path]) -> Iterator[Path]:
        for p in found:
            key = os.path.abspath(p)
            if key not in seen:
                seen.add(key)
                yield p

    for arg in paths:
        path = Path(arg)
        if path.is_dir():
            yield from once(walk(path, skip, plan.links_out))
        elif path.is_file():
            yield from once([path])
        elif _GLOB_MAGIC.search(arg) and _split_pattern(arg)[0].is_dir():
            base, pattern = _split_pattern(arg)
            yield from once(walk(base, skip, plan.links_out, pattern))
        else:
            plan.failed.append((arg, "no such file or folder"))


def make_plan(paths: Sequence[str], output_dir: Path, formats: Sequence[str]) -> Plan:
    """Find the inputs, map each to its mirrored outputs, and skip the complete ones (resume).
    Paths and stat calls only: nothing is read or decoded here."""
    plan = Plan()
    root = mirror_root(paths)
    owners: dict[Path, Path] = {}
    for path in find_inputs(paths, output_dir, plan):
        rel = Path(os.path.relpath(os.path.abspath(path), root))
        if rel.parts and rel.parts[0] == "..":  # cannot happen for paths under root; be safe
            rel = Path(path.name)
        out = output_dir / rel.parent / rel.stem
        if out in owners:
            plan.failed.append((str(path), f"its outputs would overwrite those of {owners[out]} "
                                           "(same name without the extension, same folder)"))
            continue
        owners[out] = path
        if all(output_path(out, fmt).is_file() for fmt in formats):
            plan.skipped += 1
        else:
            plan.todo.append(Task(path, out))
    return plan


def write_atomic(path: Path, body: bytes, root: Path | None = None) -> None:
    """Write ``body`` to ``path`` through a temporary sibling renamed into place: ``path`` is
    either absent, its old content, or complete. A failed write leaves no temporary file. With
    ``root`` (``--output-dir``), a path whose folder leads out of it (a link) is refused."""
    if root is not None and not path.parent.resolve().is_relative_to(root.resolve()):
        raise OSError(errno.EPERM, f"it would be outside {root} (a link leads out of it)")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # mode: the umask's
        with os.fdopen(fd, "wb") as f:
            f.write(body)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise


def stage(path: Path, body: bytes) -> tuple[Path, Path]:
    """Write ``body`` to a temporary sibling of ``path`` (its folder exists and was checked; not
    synced, not renamed): the caller syncs a group of them and renames each into place. Returns
    (temporary, final)."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)  # mode: the umask's
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return tmp, path


# ---------------------------------------------------------------------------------------------
# Backends: this process's runtime, or a server
# ---------------------------------------------------------------------------------------------


def _reason(e: Exception) -> str:
    code, message = getattr(e, "code", None), getattr(e, "message", None)
    return f"{code}: {message}" if code and message else str(e) or type(e).__name__


class LocalBackend:
    """The model in this process, fed directly (:class:`~pipeline.serving.direct.DirectRun`, from
    ``build_runtime(settings, "local")``): no job store, no spooled upload, no fsync per file; the
    output folder is the record."""

    def __init__(self, settings, options, formats: Sequence[str]):
        self.settings, self.options, self.formats = settings, options, formats
        self.run = None

    def __enter__(self) -> "LocalBackend":
        from pipeline.domain.errors import SenseVoiceError
        from pipeline.serving.runtime import build_runtime

        try:  # the model is found first: a missing one is one line, before anything loads
            self.run = build_runtime(self.settings, "local", resolve=True)
            with contextlib.redirect_stdout(sys.stderr):  # funasr prints its version: not ours
                self.run.start()
        except SenseVoiceError as e:
            self.__exit__()
            raise StartFailed(e.message) from e
        gc.collect()
        gc.freeze()  # start-up's objects (torch, funasr, the model) out of the collector's reach:
        return self  # its collections, set off by each file's transcript and outputs, scan the run's

    def __exit__(self, *exc) -> None:
        if self.run is not None:
            self.run.stop()

    def submit(self, path: Path):
        """Read and decode one file and queue it: (the future of its transcript, audio seconds)."""
        from pipeline.domain.errors import SenseVoiceError

        limit = self.settings.limits.max_upload_bytes
        try:
            if path.stat().st_size > limit:  # refused before it is read into memory
                raise FileFailed(f"upload_too_large: {path.stat().st_size} bytes, over the "
                                 f"{limit}-byte cap (SENSEVOICE_MAX_UPLOAD_BYTES)")
            return self.run.submit(path.read_bytes(), self.options)
        except OSError as e:
            raise FileFailed(f"cannot read: {e.strerror or e}") from e
        except SenseVoiceError as e:
            raise FileFailed(_reason(e)) from e

    def bodies(self, future, seconds: float) -> dict[str, bytes]:
        """The finished transcript in every format (FileFailed: the worker failed it)."""
        from pipeline.domain.exports import export
        from pipeline.serving.direct import RecordingFailed

        try:
            transcript = future.result()
        except RecordingFailed as e:
            raise FileFailed(_reason(e)) from e
        meta = {"audio_seconds": seconds}
        return {f: export(transcript, f, job_meta=meta)[0] for f in self.formats}


class RemoteBackend:
    """A server's REST API through :class:`pipeline.client.Client`."""

    def __init__(self, url: str, token: str | None, options, formats: Sequence[str], retry_for: float):
        from pipeline.client import Client

        self.url, self.options, self.formats = url, options, formats
        self.client = Client(url, token, busy_timeout=retry_for)
        self.uploads = threading.BoundedSemaphore(REMOTE_UPLOADS_AT_ONCE)

    def __enter__(self) -> "RemoteBackend":
        import httpx

        try:
            self.client.health()
        except httpx.HTTPError as e:
            self.client.close()
            raise StartFailed(f"cannot reach {self.url}: {e}") from e
        return self

    def __exit__(self, *exc) -> None:
        self.client.close()

    def transcribe(self, path: Path) -> tuple[float, dict[str, bytes]]:
        import httpx

        from pipeline.client import ApiError, WaitTimeout

        try:
            with self.uploads:
                job_id = self.client.submit(path, self.options)
            job = self.client.wait(job_id, timeout=JOB_TIMEOUT_S)
            if job.get("status") != "done":
                err = job.get("error") if isinstance(job.get("error"), dict) else {}
                raise FileFailed(f"{str(err.get('code', job.get('status')))[:80]}: "
                                 f"{str(err.get('message', ''))[:500]}")
            seconds = audio_seconds(job.get("audio_seconds"))
            bodies = {fmt: self.client.result(job_id, fmt) for fmt in self.formats}
        except ApiError as e:
            if e.status == 401:
                raise StartFailed(f"{self.url} refused the token: {e.message}") from e
            raise FileFailed(f"{e.code}: {e.message}") from e
        except OSError as e:
            raise FileFailed(f"cannot read: {e.strerror or e}") from e
        except (httpx.HTTPError, WaitTimeout) as e:
            raise FileFailed(f"server: {e}") from e
        return seconds, bodies


def audio_seconds(value) -> float:
    """A job's ``audio_seconds`` as the server sent it: a finite number >= 0 (0 when absent);
    FileFailed otherwise (a hostile or broken server), never a traceback."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise FileFailed(f"server: audio_seconds is not a number ({str(value)[:40]!r})")
    try:
        seconds = float(value)
    except ValueError:
        raise FileFailed(f"server: audio_seconds is not a number ({value[:40]!r})") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise FileFailed(f"server: audio_seconds is not a duration ({seconds!r})")
    return seconds


# ---------------------------------------------------------------------------------------------
# The run: bounded threads, a progress bar, a final table
# ---------------------------------------------------------------------------------------------


@dataclass
class Tally:
    transcribed: int = 0
    skipped: int = 0
    audio_s: float = 0.0  # seconds of audio transcribed in this run
    wall_s: float = 0.0  # the whole run, start-up included
    start_s: float = 0.0  # of which start-up (model load, warm-up, server check)
    failures: list[tuple[str, str]] = field(default_factory=list)
    fatal: str | None = None  # why the run stopped early
    interrupted: bool = False
    began: float = field(default_factory=time.monotonic)  # monotonic, when main() began


class Runner:
    """``jobs`` threads, each taking the next task, transcribing it and writing its outputs. The
    main thread only counts results and draws the bar. On Ctrl-C (or SIGTERM) no new file is
    taken and no new output begun; outputs being written are finished before the run ends."""

    def __init__(self, backend, formats: Sequence[str], jobs: int, progress: bool,
                 output_dir: Path | None = None):
        self.backend, self.formats, self.jobs, self.progress = backend, formats, jobs, progress
        self.output_dir = output_dir  # nothing is written outside it
        self.stopping = threading.Event()
        self._lock = threading.Condition()
        self._writing = 0
        self._results: Queue = Queue()

    def run(self, tasks: Sequence[Task], tally: Tally) -> Tally:
        from tqdm import tqdm

        pending = iter(tasks)
        started = time.monotonic()
        tally.start_s = started - tally.began
        self._start(pending, min(self.jobs, len(tasks)))
        tqdm.monitor_interval = 0  # no monitor thread: the run leaves no thread of its own behind
        bar = tqdm(total=len(tasks), unit="file", desc="transcribing", file=sys.stderr,
                   disable=not self.progress, dynamic_ncols=True, smoothing=0.05)
        try:
            for _ in range(len(tasks)):
                task, seconds, reason = self._next()
                if reason is None:
                    tally.transcribed += 1
                    tally.audio_s += seconds
                elif isinstance(reason, StartFailed):
                    tally.fatal = str(reason)
                    break
                else:
                    tally.failures.append((str(task.path), reason))
                    bar.write(f"failed: {task.path}: {reason}", file=sys.stderr)
                hours = tally.audio_s / 3600
                rate = hours / max(time.monotonic() - started, 1e-9)
                bar.set_postfix_str(f"{hours:.3f} audio-h, {rate:.4f} audio-h/s", refresh=False)
                bar.update(1)
        except KeyboardInterrupt:
            tally.interrupted = True
        finally:
            self._stop()
            bar.close()
        return tally

    def _start(self, pending: Iterator[Task], n: int) -> None:
        for k in range(n):
            threading.Thread(target=self._work, args=(pending,), name=f"sensevoice-cli-{k}",
                             daemon=True).start()

    def _next(self):
        while True:  # a timed get: Ctrl-C is seen at once
            try:
                return self._results.get(timeout=0.5)
            except Empty:
                continue

    def _stop(self) -> None:
        with self._lock:
            self.stopping.set()
            self._lock.wait_for(lambda: self._writing == 0, timeout=60)

    def _work(self, pending: Iterator[Task]) -> None:
        while not self.stopping.is_set():
            with self._lock:
                task = next(pending, None)
            if task is None:
                return
            self._results.put(self._one(task))

    def _one(self, task: Task):
        try:
            seconds, bodies = self.backend.transcribe(task.path)
            with self._lock:
                if self.stopping.is_set():
                    return task, None, "interrupted"
                self._writing += 1
            try:
                for fmt in self.formats:
                    target = output_path(task.out, fmt)
                    write_atomic(target, bodies[fmt], self.output_dir)
            except OSError as e:
                return task, None, f"cannot write {target}: {e.strerror or e}"
            finally:
                with self._lock:
                    self._writing -= 1
                    self._lock.notify_all()
            return task, seconds, None
        except FileFailed as e:
            return task, None, e.reason
        except StartFailed as e:
            return task, None, e
        except Exception as e:  # a bug, not the file: reported with the file, the run goes on
            logger.exception("%s", task.path)
            return task, None, f"internal error: {e!r}"


class LocalRunner(Runner):
    """Local mode: reader threads read, decode and queue files straight into the worker's batches
    (at most ``jobs`` recordings' audio in flight: a slot comes back when the worker has run the
    file); writer threads write the finished ones' outputs a group at a time: each file through a
    temporary name, then one ``os.sync`` for the group, then the renames (a file under its final
    name is complete and on disk; one sync per group, not one per file). Transcripts waiting for
    a writer are bounded too (``4 * jobs``): a slow disk holds the worker back, not memory."""

    GROUP = 256  # outputs written between two syncs at most
    WRITERS = 2

    def run(self, tasks: Sequence[Task], tally: Tally) -> Tally:
        self._slots = threading.BoundedSemaphore(self.jobs)
        self._done: Queue = Queue(maxsize=4 * self.jobs)
        self._dirs_ok: set[Path] = set()  # output folders made and checked to be inside the root
        writers = [threading.Thread(target=self._write_loop, name=f"sensevoice-cli-writer-{k}", daemon=True)
                   for k in range(self.WRITERS)]
        for w in writers:
            w.start()
        try:
            return super().run(tasks, tally)
        finally:  # every thread the run started ends with it (issue 42: a thread left at exit crashed it)
            for _ in writers:
                self._done.put(None)
            for w in writers:
                w.join()

    def _finished(self, task: Task, seconds: float, future) -> None:
        """(the worker's thread) The file's audio is done with: its slot is free."""
        self._slots.release()
        self._done.put((task, seconds, future))

    def _start(self, pending: Iterator[Task], n: int) -> None:
        for k in range(min(n, READERS)):
            threading.Thread(target=self._read, args=(pending,), name=f"sensevoice-cli-reader-{k}",
                             daemon=True).start()

    def _read(self, pending: Iterator[Task]) -> None:
        while not self.stopping.is_set():
            self._slots.acquire()
            with self._lock:
                task = None if self.stopping.is_set() else next(pending, None)
            if task is None:
                self._slots.release()
                return
            try:
                future, seconds = self.backend.submit(task.path)
            except FileFailed as e:
                self._slots.release()
                self._results.put((task, None, e.reason))
                continue
            except Exception as e:  # a bug, not the file: reported with the file, the run goes on
                logger.exception("%s", task.path)
                self._slots.release()
                self._results.put((task, None, f"internal error: {e!r}"))
                continue
            future.add_done_callback(lambda f, task=task, seconds=seconds:
                                     self._finished(task, seconds, f))

    def _write_loop(self) -> None:
        """Write groups until the run's end puts a ``None`` (one per writer) in the queue."""
        while True:
            first = self._done.get()
            if first is None:
                return
            group = [first]
            while len(group) < self.GROUP:
                try:
                    item = self._done.get_nowait()
                except Empty:
                    break
                if item is None:  # another writer's stop: hand it back, write what we hold, stop
                    self._done.put(None)
                    self._write_group(group)
                    return
                group.append(item)
            self._write_group(group)

    def _check_dir(self, folder: Path) -> None:
        """Make an output folder, once, refusing one whose path leads out of the root (a link)."""
        if folder in self._dirs_ok:
            return
        root = self.output_dir
        if root is not None and not folder.resolve().is_relative_to(root.resolve()):
            raise OSError(errno.EPERM, f"it would be outside {root} (a link leads out of it)")
        folder.mkdir(parents=True, exist_ok=True)
        self._dirs_ok.add(folder)

    def _write_group(self, group) -> None:
        ready = []  # (task, seconds, [(tmp, target)])
        for task, seconds, future in group:
            try:
                bodies = self.backend.bodies(future, seconds)
            except FileFailed as e:
                self._results.put((task, None, e.reason))
                continue
            except Exception as e:
                logger.exception("%s", task.path)
                self._results.put((task, None, f"internal error: {e!r}"))
                continue
            ready.append((task, seconds, bodies))
        with self._lock:
            if self.stopping.is_set():
                for task, _, _ in ready:
                    self._results.put((task, None, "interrupted"))
                return
            self._writing += 1
        try:
            staged = []
            for task, seconds, bodies in ready:
                try:
                    self._check_dir(task.out.parent)
                    files = [stage(output_path(task.out, fmt), bodies[fmt])
                             for fmt in self.formats]
                except OSError as e:
                    self._results.put((task, None, f"cannot write: {e.strerror or e}"))
                    continue
                staged.append((task, seconds, files))
            if staged:
                os.sync()  # the group's data on disk before any of it takes its final name
            for task, seconds, files in staged:
                try:
                    for tmp, target in files:
                        os.replace(tmp, target)
                except OSError as e:
                    for tmp, _ in files:
                        with contextlib.suppress(OSError):
                            tmp.unlink()
                    self._results.put((task, None, f"cannot write {target}: {e.strerror or e}"))
                    continue
                self._results.put((task, seconds, None))
        finally:
            with self._lock:
                self._writing -= 1
                self._lock.notify_all()


def print_table(tally: Tally, out=None) -> None:
    """The final table: files, audio hours, wall time, x real time, failures with reasons."""
    out = out or sys.stdout
    total = tally.transcribed + tally.skipped + len(tally.failures)
    speed = tally.audio_s / tally.wall_s if tally.wall_s > 0 else 0.0
    rows = [("files", f"{total}  ({tally.transcribed} transcribed, {tally.skipped} already done, "
                      f"{len(tally.failures)} failed)"),
            ("audio hours", f"{tally.audio_s / 3600:.4f}"),
            ("wall time", f"{tally.wall_s:.1f} s ({tally.start_s:.1f} s of it starting up)"),
            ("x real time", f"{speed:.1f}")]
    if tally.interrupted:
        rows.append(("interrupted", "yes: run the same command again to carry on"))
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    if tally.failures:
        lines.append(f"failures ({len(tally.failures)}):")
        name_w = min(max(len(p) for p, _ in tally.failures), 60)
        lines += [f"  {p:<{name_w}}  {reason}" for p, reason in tally.failures]
    print("\n".join(lines), file=out, flush=True)


# ---------------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------------


def _formats(value: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(f.strip().lower() for f in value.split(",") if f.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise argparse.ArgumentTypeError(
            f"unknown format {', '.join(unknown) or value!r}; choose from {','.join(FORMATS)}")
    return chosen


def _languages(value: str) -> tuple[str, ...]:
    """``--languages zh,en``: the allow-list, checked here (an unknown name is a usage error)."""
    from pipeline.domain.types import ALLOWED_LANGUAGES, parse_languages

    chosen = parse_languages(value)
    unknown = [code for code in chosen if code not in ALLOWED_LANGUAGES]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown language {', '.join(unknown)}; choose among {','.join(ALLOWED_LANGUAGES)}")
    return chosen


def _speakers(value: str) -> int | None:
    """``--speakers N``: checked here (out of 1..16 is a usage error); 0 is off."""
    from pipeline.domain.errors import InvalidOption
    from pipeline.domain.types import TranscribeOptions

    try:
        return TranscribeOptions(speakers=value).speakers
    except InvalidOption as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _redact(value: str) -> tuple[str, ...]:
    """``--redact pii`` or ``--redact card,phone``: checked here (an unknown kind is a usage error)."""
    from pipeline.domain.errors import InvalidOption
    from pipeline.domain.types import TranscribeOptions

    try:
        return TranscribeOptions(redact=value).redact
    except InvalidOption as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _hotwords(path: str) -> tuple:
    """``--hotwords FILE``: one term a line (``term`` or ``term:weight``) or a JSON list, read and
    checked here (an unreadable file or a refused list is a usage error)."""
    from pipeline.domain.errors import InvalidOption
    from pipeline.domain.types import TranscribeOptions

    try:
        with open(path, "rb") as f:
            text = f.read(200_001).decode("utf-8")
        return TranscribeOptions(hotwords=text).hotwords
    except (OSError, UnicodeDecodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot read the hotwords file {path!r}: {e}") from None
    except InvalidOption as e:
        raise argparse.ArgumentTypeError(f"{path}: {e}") from None


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m pipeline.cli", description=__doc__.splitlines()[0],
                                 epilog="Exit status: 0 all done, 1 some file failed, 2 could not "
                                        "start, 130 interrupted.")
    ap.add_argument("paths", nargs="+", metavar="PATH", help="files, folders and glob patterns")
    ap.add_argument("--output-dir", "--out", dest="output_dir", type=Path, required=True,
                    help="where outputs go, mirroring the inputs' folders")
    ap.add_argument("--format", type=_formats, default=("txt",),
                    help="comma list of txt,json,srt,vtt (default txt)")
    ap.add_argument("--language", default=AUTO_LANGUAGE, choices=REQUEST_LANGUAGES)
    ap.add_argument("--hotwords", type=_hotwords, default=(), metavar="FILE",
                    help="words or phrases to favour, one a line ('term' or 'term:weight', weight "
                         "0.1-10, default 2) or a JSON list; at most 1,000")
    ap.add_argument("--languages", type=_languages, default=(), metavar="LIST",
                    help="a language allow-list, e.g. zh,en: each segment's language is "
                         "detected only among these (default: any)")
    ap.add_argument("--redact", type=_redact, default=(), metavar="KINDS",
                    help="mask personal data in every output: pii (all) or a comma list of "
                         "card,phone,email,id,digits (written or spoken; never kept unmasked)")
    ap.add_argument("--word-timestamps", action="store_true",
                    help="per-word times from the CTC alignment (in json; subtitles use them)")
    ap.add_argument("--no-itn", action="store_true", help="no punctuation or digits (inverse "
                    "text normalisation off)")
    ap.add_argument("--split-channels", action="store_true",
                    help="stereo calls: each channel as its own speaker")
    ap.add_argument("--speakers", type=_speakers, default=None, metavar="N",
                    help="mono recordings: N speakers (1-16), each segment labelled 'Speaker 1', ...; "
                         "0: off")
    ap.add_argument("--diarize", action="store_true",
                    help="mono recordings: label the speakers, their count found")
    local = ap.add_argument_group("local mode (the default): the model in this process")
    local.add_argument("--model", help="local model directory or hub name (default iic/SenseVoiceSmall)")
    local.add_argument("--demo", action="store_true", help="the small offline demo model")
    local.add_argument("--device", help="cuda, cuda:N or cpu (default: cuda if available)")
    remote = ap.add_argument_group("server mode")
    remote.add_argument("--server", metavar="URL", help="a running server, e.g. http://gpu-box:7860")
    remote.add_argument("--token", default=env_api_token(),
                        help="its API token (default: SENSEVOICE_API_TOKEN)")
    ap.add_argument("--jobs", type=int, default=None,
                    help=f"files in flight at once (default {LOCAL_JOBS} in local mode, "
                         f"{DEFAULT_JOBS} with --server)")
    ap.add_argument("--retry-for", type=float, default=3600.0, metavar="SECONDS",
                    help="keep retrying a busy server or queue this long per file (default 3600)")
    ap.add_argument("--quiet", action="store_true", help="no progress bar")
    args = ap.parse_args(argv)
    if args.server and (args.model or args.demo or args.device):
        ap.error("--server runs on the server's model: --model, --demo and --device are for "
                 "local mode")
    if args.jobs is None:
        args.jobs = DEFAULT_JOBS if args.server else LOCAL_JOBS
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    return args


@contextlib.contextmanager
def _backend(args, options) -> Iterator[LocalBackend | RemoteBackend]:
    if args.server:
        with RemoteBackend(args.server, args.token, options, args.format, args.retry_for) as b:
            yield b
        return
    from pipeline.config import Settings

    overrides = {k: v for k, v in {"model": args.model, "device": args.device}.items() if v}
    settings = Settings(demo=args.demo, role="all", broker="", **overrides)
    with LocalBackend(settings, options, args.format) as b:
        yield b


def _interrupt(_signum, _frame):
    raise KeyboardInterrupt


def main(argv=None) -> int:
    # the libraries' chatter (funasr warns on the root logger) stays out; this package's warnings show
    logging.basicConfig(level=logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("sensevoice").setLevel(logging.WARNING)
    started = time.monotonic()
    args = parse_args(argv)
    from pipeline.domain.types import TranscribeOptions

    options = TranscribeOptions(language=args.language, use_itn=not args.no_itn,
                                split_channels=args.split_channels,
                                word_timestamps=args.word_timestamps, languages=args.languages,
                                redact=args.redact, speakers=args.speakers, diarize=args.diarize)
    if args.hotwords:
        options = replace(options, hotwords=args.hotwords)
    plan = make_plan(args.paths, args.output_dir, args.format)
    for link in plan.links_out:
        print(f"skipped: {link}: a link pointing out of the folder walked", file=sys.stderr)
    if not (plan.todo or plan.skipped or plan.failed):
        print(f"error: no audio or video files in {' '.join(args.paths)}", file=sys.stderr)
        return EXIT_START
    tally = Tally(skipped=plan.skipped, failures=list(plan.failed), began=started)
    if plan.todo:
        previous = (signal.signal(signal.SIGTERM, _interrupt)
                    if threading.current_thread() is threading.main_thread() else None)
        try:
            with _backend(args, options) as backend:
                runner = Runner if args.server else LocalRunner
                runner(backend, args.format, args.jobs, progress=not args.quiet,
                       output_dir=args.output_dir).run(plan.todo, tally)
        except StartFailed as e:
            print(f"error: {e}", file=sys.stderr)
            return EXIT_START
        except KeyboardInterrupt:  # during start-up
            tally.interrupted = True
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
    tally.wall_s = time.monotonic() - started
    print_table(tally)
    if tally.fatal:
        print(f"error: {tally.fatal}", file=sys.stderr)
        return EXIT_START
    if tally.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_FAILED if tally.failures else EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
