"""Directories only this service's user may write: the distributed topology's shared directory
(decoded audio and uploads, pipeline/serving/payloads.py) and the UI's upload directory.

Issue 19 found the shared directory accepted as it was when another local user had created it
first (mode 0777): the uploads were written 0644 into it, and that user read one, replaced it,
and ``/api/jobs/{id}/audio`` served the planted bytes. Now a directory is created 0700; one that
exists must be a real directory (no symlink), owned by this process's user and writable by no
one else, or the service refuses to start with an error that says how to fix it. Files are
created 0600 (:func:`create_private`).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from pipeline.domain.errors import UnsafeDirectory

FILE_MODE = 0o600
DIR_MODE = 0o700


def ensure_private_dir(path: str | os.PathLike, what: str = "directory") -> Path:
    """Create ``path`` (and missing parents) with mode 0700, or check the existing one: a
    directory, not a link, owned by this process's user, not writable by group or others.
    UnsafeDirectory otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        pass
    st = os.lstat(path)
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
    return path


def create_private(path: str | os.PathLike) -> int:
    """A new file, mode 0600, opened for writing (never an existing one, never through a link):
    its descriptor."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    return os.open(path, flags, FILE_MODE)
