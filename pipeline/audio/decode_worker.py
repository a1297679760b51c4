"""A decoder process: ``python -m pipeline.audio.decode_worker --memory BYTES --parent PID``.

Started by :class:`pipeline.audio.decoder_pool.Decoder`; decodes one upload at a time, read from stdin, and
answers on stdout. Nothing is pickled either way: a decoder that a crafted file took over could
otherwise hand the server a pickle that runs code when loaded. Frames, all little-endian:

* hello, once at start: :data:`HELLO` (magic, pid);
* request: :data:`REQUEST` (magic, max_seconds, max_bytes or -1, channel or -1, target length,
  data length), then the target (``"module:function"``, UTF-8) and the upload's bytes;
* reply: :data:`REPLY` (magic, status, sample rate, channels, samples, message length), then
  either the samples (float32) for status :data:`STATUS_OK`, or a UTF-8 message of at most
  :data:`MAX_MESSAGE_BYTES` for an error code of :data:`ERRORS`.

The server checks every field of a reply before reading on (a known rate, at most the 16 kHz
budget of samples, a known code), so what it allocates is bounded by what it asked for.

The process imports PyAV and numpy, never torch. It limits its own address space
(``RLIMIT_AS``, so a file that needs more fails alone: :class:`DecoderOutOfMemory`), asks the
kernel to kill it when the server's thread that started it ends (``PR_SET_PDEATHSIG``: a
``kill -9`` of the server leaves no decoder behind), and exits at the end of its stdin.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import os
import resource
import signal
import struct
import sys
from collections.abc import Callable
from typing import BinaryIO

from pipeline.domain.errors import (
    AudioDecodeError,
    AudioTooLong,
    DecoderCrashed,
    DecoderOutOfMemory,
    EmptyAudio,
    NoAudioStream,
    SenseVoiceError,
    UploadTooLarge,
)

HELLO = struct.Struct("<4sI")  # magic, pid
REQUEST = struct.Struct("<4sdqiIQ")  # magic, max_seconds, max_bytes, channel, target len, data len
REPLY = struct.Struct("<4sIIIQI")  # magic, status, sample rate, channels, samples, message len
HELLO_MAGIC, REQUEST_MAGIC, REPLY_MAGIC = b"SVh1", b"SVq1", b"SVr1"

STATUS_OK = 0
# The errors a decoder may report, by code: anything else in a reply is a protocol breach. Code 7
# is a failure that is not the file's fault as far as the decoder knows (a bug, a bad target).
ERRORS: dict[int, type[SenseVoiceError]] = {
    1: AudioDecodeError,
    2: NoAudioStream,
    3: EmptyAudio,
    4: AudioTooLong,
    5: UploadTooLarge,
    6: DecoderOutOfMemory,
    7: DecoderCrashed,
}
MAX_MESSAGE_BYTES = 1024  # an error message longer than this is a protocol breach
MAX_TARGET_BYTES = 256
MAX_CHANNELS = 1024  # channels a reply may report (FFmpeg's decoders stop at 512 or fewer)
WRITE_CHUNK = 1 << 20  # bytes per write of the samples

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>

REPLY_FD: int | None = None  # where replies go, once main() runs (fault targets in tests use it)


def error_code(error: BaseException) -> int:
    """The code of :data:`ERRORS` that reports ``error`` (most specific class first)."""
    if isinstance(error, MemoryError):  # numpy, or av.error.MemoryError (FFmpeg's ENOMEM)
        return 6
    for code in sorted(ERRORS, key=lambda c: -len(ERRORS[c].__mro__)):
        if code != 7 and isinstance(error, ERRORS[code]):
            return code
    return 7


def encode_message(text: str) -> bytes:
    """``text`` as UTF-8, cut to :data:`MAX_MESSAGE_BYTES` on a character boundary."""
    data = text.encode("utf-8", "replace")[:MAX_MESSAGE_BYTES]
    return data.decode("utf-8", "ignore").encode("utf-8")


def resolve_target(name: str) -> Callable:
    """The function a ``"module:qualified.name"`` string names."""
    module, sep, qualname = name.partition(":")
    if not sep or not module or not qualname:
        raise ValueError(f"a decoder target is 'module:function', got {name!r}")
    target = importlib.import_module(module)
    for attribute in qualname.split("."):
        target = getattr(target, attribute)
    if not callable(target):
        raise ValueError(f"decoder target {name!r} is not callable")
    return target


def _die_with_parent(parent: int) -> None:
    """SIGKILL this process when the server's thread that started it ends (any exit of the
    server, ``kill -9`` included); exit now if the server is already gone."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:  # the server died before the prctl: nobody would kill us
        os._exit(0)


def _limit_address_space(limit: int) -> None:
    """Cap this process's address space at ``limit`` bytes (0: leave it as it is)."""
    if limit <= 0:
        return
    _, hard = resource.getrlimit(resource.RLIMIT_AS)
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _read(stream: BinaryIO, n: int) -> bytes | None:
    """Exactly ``n`` bytes, or ``None`` at the end of the stream (the server went away)."""
    data = stream.read(n)
    return data if len(data) == n else None


def _discard(stream: BinaryIO, n: int) -> bool:
    """Skip ``n`` bytes in small reads (after an upload too large to hold)."""
    while n > 0:
        chunk = stream.read(min(n, 1 << 16))
        if not chunk:
            return False
        n -= len(chunk)
    return True


def _write_all(fd: int, data: memoryview | bytes) -> None:
    view = memoryview(data).cast("B")
    while view:
        written = os.write(fd, view[:WRITE_CHUNK])
        view = view[written:]


def _error_reply(error: BaseException) -> bytes:
    code = error_code(error)
    text = str(error) or type(error).__name__
    if code == 7:
        text = f"{type(error).__name__}: {text}"
    message = encode_message(text)
    return REPLY.pack(REPLY_MAGIC, code, 0, 0, 0, len(message)) + message


def _audio_reply(result: object) -> tuple[bytes, tuple]:
    """The header and the float32 parts for a :class:`DecodedParts` or :class:`DecodedAudio`."""
    import numpy as np

    from pipeline.audio.decode import DecodedAudio, DecodedParts

    if isinstance(result, DecodedParts):
        parts = result.parts
    elif isinstance(result, DecodedAudio):
        parts = (result.samples,)
    else:
        raise TypeError(f"a decoder target returned {type(result).__name__}, not decoded audio")
    parts = tuple(np.ascontiguousarray(part, dtype="<f4").reshape(-1) for part in parts)
    total = sum(part.size for part in parts)
    header = REPLY.pack(REPLY_MAGIC, STATUS_OK, int(result.sample_rate), int(result.channels),
                        total, 0)
    return header, parts


def _write_reply(fd: int, header: bytes, parts: tuple) -> None:
    """The header, then each part's bytes (a function: no loop variable outlives the reply and
    keeps the last part, up to the whole output, alive until the next upload)."""
    _write_all(fd, header)
    for part in parts:
        _write_all(fd, memoryview(part).cast("B"))


def serve(requests: BinaryIO, reply_fd: int) -> int:
    """Answer requests until the end of ``requests``; the exit status."""
    targets: dict[str, Callable] = {}
    while True:
        head = _read(requests, REQUEST.size)
        if head is None:
            return 0
        magic, max_seconds, max_bytes, channel, target_len, data_len = REQUEST.unpack(head)
        if magic != REQUEST_MAGIC or target_len > MAX_TARGET_BYTES:
            return 2  # not our server: stop rather than guess
        name = _read(requests, target_len)
        if name is None:
            return 0
        parts: tuple = ()
        try:
            data = _read(requests, data_len)
        except MemoryError as e:  # an upload larger than this address space holds
            if not _discard(requests, data_len):  # the server waits for it all to be read
                return 0
            header = _error_reply(e)
        else:
            if data is None:
                return 0
            try:
                target = targets.get(name.decode())
                if target is None:
                    target = targets[name.decode()] = resolve_target(name.decode())
                result = target(data, max_seconds=max_seconds,
                                max_bytes=None if max_bytes < 0 else max_bytes,
                                channel=None if channel < 0 else channel)
                data = None  # the upload's bytes go before the samples are written out
                header, parts = _audio_reply(result)
            except Exception as e:  # noqa: BLE001 - every failure (MemoryError too) is a reply
                header = _error_reply(e)
            data = result = None
        try:
            _write_reply(reply_fd, header, parts)
        except OSError:  # the server went away, or killed us mid-reply
            return 0
        header, parts = b"", ()  # nothing of this upload is held while waiting for the next


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="pipeline.audio.decode_worker")
    parser.add_argument("--memory", type=int, default=0, help="address-space limit, bytes")
    parser.add_argument("--parent", type=int, required=True, help="the server's pid")
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the server's to handle
    _limit_address_space(args.memory)
    global REPLY_FD
    REPLY_FD = reply_fd = os.dup(1)
    os.dup2(2, 1)  # a stray print goes to stderr, never into a reply
    import pipeline.audio.decode  # noqa: F401 - PyAV and numpy now, not on the first upload

    _write_all(reply_fd, HELLO.pack(HELLO_MAGIC, os.getpid()))
    with open(0, "rb", buffering=1 << 16, closefd=False) as requests:
        return serve(requests, reply_fd)


if __name__ == "__main__":
    # run the importable module, not this ``__main__`` copy, so that REPLY_FD is set where
    # ``import pipeline.audio.decode_worker`` finds it
    from pipeline.audio.decode_worker import main as _main

    sys.exit(_main())
