"""The wire between the embedded server's sibling web processes and the process that owns the
store and the GPU loop (``--web-processes``): one Unix socket per sibling, framed messages.

A frame is ``<II`` (header length, payload length), a JSON header, then the payload bytes (a
work item's float32 audio, or nothing: a mono 16-bit WAV's job names its samples' place in the
spool file both processes see). Requests carry ``rid``; each reply carries the same
``rid`` and either ``ok`` (with the op's values) or ``error`` (a domain error's code and
message, raised again on the sibling's side as the same class). The socket lives in a private
directory (0700) and the first frame of a connection must carry the owner's secret: nothing
else on the host can speak on it. That first frame is read within ``HELLO_MAX_BYTES`` (issue 36: a
connection that declared a 2 GiB first frame had it allocated before its secret was checked);
only a connection that gave the secret may send frames up to ``MAX_PAYLOAD_BYTES``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
import socket
import struct
import threading

import numpy as np
import orjson
import torch

from pipeline.audio.wav import Pcm16Layout
from pipeline.domain import errors as domain_errors
from pipeline.domain.types import Job, JobState, Lane
from pipeline.serving.records import dump_options, load_options
from pipeline.serving.broker_sqlite import SpooledPcm16
from pipeline.serving.scheduler import DeferredAudio, WorkItem

FRAME = struct.Struct("<II")
MAX_HEADER_BYTES = 1 << 20
MAX_PAYLOAD_BYTES = 1 << 31  # a work item's audio: at most the longest accepted recording, float32
HELLO_MAX_BYTES = 4 << 10  # a connection's first frame, whole (its secret: 64 hex digits), before it is trusted


class WireClosed(ConnectionError):
    """The other end closed the socket (or sent a frame this side cannot read)."""


def _framed(head: dict, payload_len: int = 0) -> bytes:
    data = orjson.dumps(head)
    return FRAME.pack(len(data), payload_len) + data


def send_frame(sock: socket.socket, lock: threading.Lock, head: dict, payload: bytes | memoryview = b"") -> None:
    payload = memoryview(payload).cast("B")  # bytes, whatever the item size of the buffer
    with lock:
        sock.sendall(_framed(head, len(payload)))
        if payload:
            sock.sendall(payload)


def send_frames(sock: socket.socket, lock: threading.Lock, heads: list[dict]) -> None:
    """Header-only frames (replies) in one write."""
    data = b"".join(_framed(head) for head in heads)
    with lock:
        sock.sendall(data)


def push_frames(pushes: list[tuple[str, object]]) -> bytes:
    """The owner's unasked frames (no ``rid``), in order: ``("bodies", [(job id, body), ...])``
    (finished jobs' poll bodies) and ``("forget", [job id, ...])`` (purged jobs)."""
    out = []
    for op, values in pushes:
        if op == "bodies":
            ids, bodies = [jid for jid, _ in values], [body for _, body in values]
            payload = b"".join(bodies)
            out += [_framed({"op": op, "ids": ids, "sizes": [len(b) for b in bodies]}, len(payload)), payload]
        else:
            out.append(_framed({"op": op, "ids": list(values)}))
    return b"".join(out)


def pushed_bodies(head: dict, payload: memoryview) -> list[tuple[str, bytes]]:
    """A bodies frame's (job id, body) pairs (ValueError if its sizes do not add up)."""
    ids, sizes = [str(x) for x in head["ids"]], [int(x) for x in head["sizes"]]
    if len(ids) != len(sizes) or sum(sizes) != len(payload) or min(sizes, default=0) < 0:
        raise ValueError("a bodies frame whose sizes do not match its payload")
    out, at = [], 0
    for jid, size in zip(ids, sizes):
        out.append((jid, bytes(payload[at:at + size])))
        at += size
    return out


class FrameReader:
    """The frames of one socket through one buffer: :meth:`next` waits for a frame, :meth:`ready`
    says whether another whole one is there without waiting (so that a reader can take all the
    frames that arrived together as one batch)."""

    CHUNK = 1 << 16

    def __init__(self, sock: socket.socket):
        self.sock = sock
        self._buf = bytearray()
        self._eof = False

    def _fill(self, block: bool = True) -> bool:
        if self._eof:
            raise WireClosed("the other end closed the connection")
        try:
            data = self.sock.recv(self.CHUNK, 0 if block else socket.MSG_DONTWAIT)
        except BlockingIOError:
            return False
        if not data:
            self._eof = True
            if block:
                raise WireClosed("the other end closed the connection")
            return False
        self._buf += data
        return True

    def _frame_size(self, max_bytes: int | None = None) -> int | None:
        """The first frame's whole size once its sizes are buffered (WireClosed if not ours, or
        larger than ``max_bytes``)."""
        if len(self._buf) < FRAME.size:
            return None
        head_len, payload_len = FRAME.unpack_from(self._buf)
        if head_len > MAX_HEADER_BYTES or payload_len > MAX_PAYLOAD_BYTES:
            raise WireClosed(f"a frame of {head_len} + {payload_len} bytes is not one of ours")
        size = FRAME.size + head_len + payload_len
        if max_bytes is not None and size > max_bytes:
            raise WireClosed(f"a frame of {size} bytes where at most {max_bytes} are read")
        return size

    def ready(self) -> bool:
        while True:
            size = self._frame_size()
            if size is not None and len(self._buf) >= size:
                return True
            if self._eof or not self._fill(block=False):
                return False

    def next(self, max_bytes: int | None = None) -> tuple[dict, memoryview]:
        """The next frame: its header and payload. WireClosed at the end of the stream, or (before
        anything is allocated for it) when the frame is larger than ``max_bytes`` (a hello)."""
        while (size := self._frame_size(max_bytes)) is None:
            self._fill()
        if len(self._buf) >= size:
            frame = self._buf[:size]
            del self._buf[:size]
        else:  # a large payload: the rest read straight into its place
            frame, have = bytearray(size), len(self._buf)
            frame[:have] = self._buf
            self._buf = bytearray()
            view = memoryview(frame)[have:]
            while view:
                got = self.sock.recv_into(view)
                if got == 0:
                    raise WireClosed("the other end closed the connection")
                view = view[got:]
        head_len = FRAME.unpack_from(frame)[0]
        return orjson.loads(frame[FRAME.size:FRAME.size + head_len]), memoryview(frame)[FRAME.size + head_len:]


# ---------------------------------------------------------------------------- values
def job_head(job: Job) -> dict:
    return {"id": job.id, "lane": int(job.lane), "options": dump_options(job.options),
            "filename": job.filename, "audio_seconds": job.audio_seconds, "created_at": job.created_at}


def job_from_head(h: dict) -> Job:
    return Job(id=str(h["id"]), state=JobState.QUEUED, options=load_options(h["options"]),
               lane=Lane(int(h["lane"])), created_at=float(h["created_at"]),
               audio_seconds=float(h["audio_seconds"]), filename=str(h["filename"]))


def item_head(item: WorkItem) -> dict:
    head = {"job_id": item.job_id, "lane": int(item.lane), "options": dump_options(item.options),
            "n_samples": item.n_samples, "piece": item.piece, "pieces": item.pieces,
            "start_s": item.start_s, "speaker": item.speaker}
    if isinstance(item.audio, SpooledPcm16):  # the owner maps the same spool file: no payload
        head["spooled"] = [item.audio.offset, item.audio.frames]
    return head


def item_audio(item: WorkItem) -> memoryview:
    """The item's wave as float32 bytes (exact: what this process decoded is what the GPU gets);
    nothing for a job whose audio is its spooled upload's samples."""
    wave = item.audio
    if isinstance(wave, SpooledPcm16):
        return memoryview(b"")
    if not isinstance(wave, torch.Tensor):
        raise TypeError("a sibling's work item carries its decoded wave or its spooled samples")
    return memoryview(np.ascontiguousarray(wave.detach().float().cpu().numpy()))


def item_from_head(h: dict, audio: bytes | bytearray | memoryview,
                   spooled: Callable[[str, Pcm16Layout], DeferredAudio] | None = None) -> WorkItem:
    """The work item a frame carries; a spooled one's audio from ``spooled`` (this process's
    store: the path is made here from the job id, never taken from the frame)."""
    n = int(h["n_samples"])
    if "spooled" in h:
        offset, frames = (int(v) for v in h["spooled"])
        if spooled is None or offset < 0 or frames != n or audio:
            raise ValueError("a spooled work item this side cannot take")
        wave = spooled(str(h["job_id"]), Pcm16Layout(offset, frames))
    else:
        wave = torch.from_numpy(np.frombuffer(audio, dtype=np.float32))
        if wave.numel() != n:
            wave = wave.view(-1, n)  # [channels, n]: a split call's wave
    return WorkItem(str(h["job_id"]), Lane(int(h["lane"])), load_options(h["options"]), n,
                    audio=wave, piece=int(h["piece"]), pieces=int(h["pieces"]), start_s=float(h["start_s"]),
                    speaker=h["speaker"])


def error_head(e: domain_errors.SenseVoiceError) -> dict:
    return {"code": e.code, "message": e.message, "retry_after": getattr(e, "retry_after", None)}


@functools.cache
def _error_classes() -> dict[str, type[domain_errors.SenseVoiceError]]:
    found: dict[str, type[domain_errors.SenseVoiceError]] = {}
    todo = [domain_errors.SenseVoiceError]
    while todo:
        cls = todo.pop()
        found.setdefault(cls.code, cls)
        todo.extend(cls.__subclasses__())
    return found


def error_from_head(h: dict) -> domain_errors.SenseVoiceError:
    """The domain error a reply names (an unknown code: a 500 with its message)."""
    cls = _error_classes().get(str(h.get("code")), domain_errors.SenseVoiceError)
    message = str(h.get("message", ""))
    if issubclass(cls, domain_errors.Busy):
        return cls(message, h.get("retry_after"))
    try:
        return cls(message)
    except TypeError:  # an error whose constructor takes more: its code and message still travel
        e = domain_errors.SenseVoiceError(message)
        e.code, e.status = cls.code, cls.status
        return e
