"""Directories and files only this service's user may read or write: the data directory (job
store, spool, long-audio waves, the UI's uploads), the distributed topology's shared directory
(decoded audio and uploads, pipeline/serving/payloads.py) and the UI's upload directory.

Issue 19 found the shared directory accepted as it was when another local user had created it
first (mode 0777): the uploads were written 0644 into it, and that user read one, replaced it,
and ``/api/jobs/{id}/audio`` served the planted bytes. Now a directory is created 0700; one that
exists must be a real directory (no symlink), owned by this process's user and writable by no
one else, or the service refuses to start with an error that says how to fix it. Files are
created 0600 (:func:`create_private`).

Issue 36 found two more ways in:

* the shared directory was checked once, by path: a user who could write its *parent* renamed it
  away after the start and put his own at its path, and ``/audio`` served what he planted. Now
  every ancestor of the shared directory must be writable by no other user (a sticky directory
  owned by root or by us, like /tmp or /dev/shm, is fine: there only an entry's owner renames it),
  and the directory is used through a descriptor kept from the check (:class:`PrivateDir`, every
  access ``dir_fd=``-relative), so a directory swapped in later is never read or written;
* the data directory, its SQLite store and spool files were created 0755/0644 (the umask's): any
  local user read every upload and transcript. Now :func:`ensure_data_dir` creates it 0700; an
  existing one of ours with looser modes is *tightened* to 0700 (with a warning in the log: its
  files were readable by others until then), one of another user is refused, one of root's
  (a container volume) is used with a warning when others have access. Its folders are 0700
  (:func:`private_subdir`) and its files 0600, and a folder or store file that is not ours (one
  planted there) is refused (:func:`check_own_file`).
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from pipeline.domain.errors import UnsafeDirectory

logger = logging.getLogger("sensevoice.private_dir")

FILE_MODE = 0o600
DIR_MODE = 0o700
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0)


def make_dirs(path: str | os.PathLike) -> None:
    """``mkdir -p`` whose new directories are 0700 (Path.mkdir(parents=True) makes the missing
    parents with the umask's mode, 0755 usually)."""
    path = Path(os.path.abspath(path))
    missing = []
    while not os.path.lexists(path) and path != path.parent:
        missing.append(path)
        path = path.parent
    for p in reversed(missing):
        try:
            os.mkdir(p, DIR_MODE)
        except FileExistsError:
            pass


def ensure_private_dir(path: str | os.PathLike, what: str = "directory") -> Path:
    """Create ``path`` (and missing parents) with mode 0700, or check the existing one: a
    directory, not a link, owned by this process's user, not writable by group or others.
    UnsafeDirectory otherwise."""
    path = Path(path)
    fd = _open_private(path, what)
    os.close(fd)
    return path


def _make_and_open(path: Path, what: str) -> int:
    """``path`` made 0700 if missing, then opened without following a link: a descriptor of the
    directory there (UnsafeDirectory when a link or a file is). The caller checks it (fstat)."""
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    try:
        return os.open(path, _DIR_FLAGS | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a link (O_NOFOLLOW) or a file is there
            raise UnsafeDirectory(f"the {what} {path} is not a directory (a link or a file is "
                                  f"there): remove it, or choose another path") from None
        raise


def _open_private(path: Path, what: str) -> int:
    """``path`` created 0700 or checked as :func:`ensure_private_dir` says: a descriptor of the
    very directory checked (opened without following a link, then checked through fstat)."""
    make_dirs(path.parent)
    fd = _make_and_open(path, what)
    try:
        _check_private(os.fstat(fd), path, what)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _check_private(st: os.stat_result, path: Path, what: str) -> None:
    me = os.geteuid()
    if not stat.S_ISDIR(st.st_mode):
        raise UnsafeDirectory(f"the {what} {path} is not a directory (a link or a file is there): "
                              f"remove it, or choose another path")
    if st.st_uid != me:
        raise UnsafeDirectory(
            f"the {what} {path} belongs to uid {st.st_uid}, not to this service's user (uid {me}): "
            f"another user may read or replace what is written there. Remove it (rm -rf {path}) "
            f"and start again (it is created 0700), or choose another path")
    if st.st_mode & 0o022:
        raise UnsafeDirectory(
            f"the {what} {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}): "
            f"another user may have put or replaced files there. Remove it (rm -rf {path}) and "
            f"start again (it is created 0700), or choose another path")


def check_ancestors(path: str | os.PathLike, what: str = "directory") -> None:
    """Every directory above ``path`` (its real path) must be one no other user can rename
    ``path`` in: owned by root or by us, and not writable by group or others unless sticky
    (in a sticky directory, /tmp or /dev/shm, only an entry's owner renames it). UnsafeDirectory
    otherwise: that user could swap ``path`` for a directory of his after this check."""
    me = os.geteuid()
    real = Path(os.path.realpath(path))
    for parent in real.parents:
        try:
            st = os.stat(parent)
        except FileNotFoundError:  # made 0700 by us (make_dirs) after this check
            continue
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, me):
            raise UnsafeDirectory(
                f"the {what} {path} is inside {parent}, which belongs to uid {st.st_uid} (not to "
                f"this service's user, uid {me}, nor root): that user can rename the {what} and "
                f"put his own in its place. Choose a path under directories of this user or root")
        if mode & 0o022 and not mode & stat.S_ISVTX:
            raise UnsafeDirectory(
                f"the {what} {path} is inside {parent}, which other users can write (mode "
                f"{mode:o}, no sticky bit): one of them can rename the {what} and put his own in "
                f"its place. Run chmod go-w {parent} (or chmod +t, as /tmp), or choose another path")


class PrivateDir:
    """A private directory (checked as :func:`ensure_private_dir` says, its ancestors as
    :func:`check_ancestors` says) held open: ``fd`` is the directory checked, whatever is renamed
    to or from its path later; use it as ``dir_fd=`` for every access. :meth:`replaced` tells
    whether the path names another directory now (someone swapped it: logged by its users)."""

    def __init__(self, path: str | os.PathLike, what: str = "directory"):
        self.path = Path(path)
        self.what = what
        self.fd = -1
        check_ancestors(self.path, what)  # before anything is created in them
        make_dirs(self.path.parent)
        self.fd = fd = _open_private(self.path, what)
        st = os.fstat(fd)
        self.dev_ino = (st.st_dev, st.st_ino)

    def replaced(self) -> bool:
        """The path no longer names the directory checked at the start (it was renamed away,
        removed, or another one put in its place)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return True
        return (st.st_dev, st.st_ino) != self.dev_ino

    def close(self) -> None:
        fd, self.fd = self.fd, -1
        if fd >= 0:
            os.close(fd)

    def __del__(self):
        self.close()


def ensure_data_dir(path: str | os.PathLike, what: str = "data directory (--data-dir)") -> Path:
    """The data directory, created 0700 (missing parents too), or the existing one: a directory
    (a link to one is followed: a data directory on another disk is usual), owned by this
    process's user and tightened to 0700 when group or others had any access (logged: what it
    held was readable by them until now). One of another user is refused (UnsafeDirectory), but
    one of root's while this user is not root (a container's volume: Kubernetes makes an emptyDir
    root's, mode 2777) cannot be tightened: it is used with a warning when others have access,
    and what this service makes in it is private all the same (folders 0700, files 0600)."""
    path = Path(path)
    make_dirs(path)
    try:
        fd = os.open(path, _DIR_FLAGS)
    except NotADirectoryError:
        raise UnsafeDirectory(f"the {what} {path} is not a directory: remove the file there, or "
                              f"choose another path") from None
    try:
        st = os.fstat(fd)
        me = os.geteuid()
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid == me:
            if mode & 0o077:
                os.fchmod(fd, DIR_MODE)
                logger.warning("the %s %s was mode %o (other users could read the uploads and "
                               "transcripts in it): tightened to 0700", what, path, mode)
        elif st.st_uid == 0:
            if mode & 0o077 and path not in _warned_root_dirs:
                _warned_root_dirs.add(path)
                logger.warning(
                    "the %s %s belongs to root, mode %o: this service's user (uid %d) cannot make "
                    "it private. What it writes there is private (folders 0700, files 0600), but "
                    "%s. Run chown %d %s (it is then kept 0700) unless no other user runs on this "
                    "host or container", what, path, mode, me,
                    "other users can rename or delete it" if mode & 0o022 and not mode & stat.S_ISVTX
                    else "other users can list its names", me, path)
        else:
            raise UnsafeDirectory(
                f"the {what} {path} belongs to uid {st.st_uid}, not to this service's user (uid "
                f"{me}): that user may read every upload and transcript kept there. Run the "
                f"service as its owner, or chown -R it to this user, or choose another path")
    finally:
        os.close(fd)
    return path


_warned_root_dirs: set[Path] = set()


def private_subdir(path: str | os.PathLike, what: str = "folder of the data directory") -> Path:
    """A folder inside the data directory: created 0700, or the existing one (a directory, not a
    link, ours: UnsafeDirectory otherwise) tightened to 0700."""
    path = Path(path)
    fd = _make_and_open(path, what)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            _check_private(st, path, what)  # raises: another user's
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, DIR_MODE)
    finally:
        os.close(fd)
    return path


def check_own_file(path: str | os.PathLike, what: str = "file") -> None:
    """An existing ``path`` must be a regular file of ours (not a link, not another user's: one
    planted in a data directory others can write); it is made 0600 if it was looser (files of a
    version that wrote them 0644). A missing one is fine. UnsafeDirectory otherwise."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    me = os.geteuid()
    if not stat.S_ISREG(st.st_mode) or st.st_uid != me:
        kind = "not a file (a link or a folder)" if not stat.S_ISREG(st.st_mode) else \
            f"owned by uid {st.st_uid}"
        raise UnsafeDirectory(
            f"the {what} {path} is {kind}, not a file of this service's user (uid {me}): another "
            f"user may have planted it to read what is written there. Remove it, make the data "
            f"directory this user's (chown) and start again, or choose another path")
    if stat.S_IMODE(st.st_mode) & 0o077:
        os.chmod(path, FILE_MODE)


def create_private(path: str | os.PathLike, dir_fd: int | None = None, *,
                   replace: bool = False) -> int:
    """A new file, mode 0600, opened for writing (never through a link; never an existing one
    unless ``replace``, which truncates a file of a write cut short): its descriptor. ``dir_fd``:
    ``path`` is relative to that directory (:class:`PrivateDir`)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_TRUNC if replace else os.O_EXCL
    return os.open(path, flags, FILE_MODE, dir_fd=dir_fd)
