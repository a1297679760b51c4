"""The wire between the embedded server's sibling web processes and the process that owns the
store and the GPU loop (``--web-processes``): one ``multiprocessing.connection`` per sibling over a
Unix socket in a private directory (0700), authenticated both ways by its HMAC challenge with the
shared secret as ``authkey``. Nothing is read from a connection before that challenge but its
answer, itself read within 256 bytes (``recv_bytes(256)`` checks the declared length before it
allocates anything).

A message is a JSON object (the head), at most ``MAX_HEAD_BYTES``; a head with ``n`` is followed by
one more message of exactly ``n`` bytes, the payload (a work item's float32 audio, or finished
jobs' poll bodies), read only when ``n`` is at most ``MAX_PAYLOAD_BYTES`` and refused when it
declares more than ``n``: ``recv_bytes(maxlength)`` refuses a longer message on its length prefix,
before its bytes are read. Requests carry ``rid``; a batch of replies is one message
(``{"replies": [...]}``), each with its request's ``rid`` and either ``ok`` (the op's values) or
``error`` (a domain error's code and message, raised again on the sibling's side as the same class).
"""

from __future__ import annotations

import functools
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from multiprocessing.connection import AuthenticationError, Client, Connection, answer_challenge, deliver_challenge

import numpy as np
import orjson
import torch

from pipeline.audio.wav import Pcm16Layout
from pipeline.domain import errors as domain_errors
from pipeline.domain.types import Job, JobState, Lane
from pipeline.serving.records import dump_options, load_options
from pipeline.serving.broker_sqlite import SpooledPcm16
from pipeline.serving.scheduler import DeferredAudio, WorkItem

logger = logging.getLogger("sensevoice.siblings")

MAX_HEAD_BYTES = 1 << 20  # a head (a request, a batch of replies, a push's ids)
MAX_PAYLOAD_BYTES = 1 << 31  # a work item's audio: at most the longest accepted recording, float32


class WireClosed(ConnectionError):
    """The other end closed the connection, or sent what this side does not take (a message over
    its bound, a head that is not a JSON object); the connection is not read again."""


class Wire:
    """One authenticated connection: :meth:`send` from any thread (a head and its payload go out
    whole), :meth:`recv` from one reader thread, :meth:`cut` from any (wakes the reader)."""

    def __init__(self, conn: Connection):
        self.conn = conn
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))  # the same socket: its options, shutdown
        self._lock = threading.Lock()

    # -- the two ends
    @classmethod
    def connect(cls, path: str, secret: str) -> Wire:
        """The sibling's end (OSError: no owner listens yet; AuthenticationError: not its secret)."""
        return cls(Client(path, family="AF_UNIX", authkey=secret.encode()))

    @classmethod
    def accepted(cls, conn: Connection, secret: str, timeout_s: float) -> Wire:
        """The owner's end of a connection just accepted, once the peer proved the secret (and
        learnt that this side knows it) within ``timeout_s``; AuthenticationError or OSError else
        (the connection is closed)."""
        wire = cls(conn)
        timer = threading.Timer(timeout_s, wire.cut)  # a peer that says nothing is cut off
        timer.start()
        try:
            deliver_challenge(conn, secret.encode())
            answer_challenge(conn, secret.encode())
        except (AuthenticationError, OSError, EOFError) as e:
            wire.close()
            raise AuthenticationError(f"{type(e).__name__}: {e}") from None
        finally:
            timer.cancel()
        return wire

    # -- messages
    def send(self, head: dict, payload: bytes | memoryview = b"") -> None:
        payload = memoryview(payload).cast("B")  # bytes, whatever the item size of the buffer
        if payload.nbytes:
            head = {**head, "n": payload.nbytes}
        data = orjson.dumps(head)
        with self._lock:
            self.conn.send_bytes(data)
            if payload.nbytes:
                self.conn.send_bytes(payload)

    def recv(self) -> tuple[dict, bytes]:
        """The next head and its payload (b"" when none); WireClosed at the end or on a message
        this side does not take (nothing of an oversized one is read past its length)."""
        try:
            head = orjson.loads(self.conn.recv_bytes(MAX_HEAD_BYTES))
            n = head.get("n", 0) if isinstance(head, dict) else -1
            if not isinstance(n, int) or not 0 <= n <= MAX_PAYLOAD_BYTES:
                raise WireClosed("a message that is not one of ours")
            payload = self.conn.recv_bytes(n) if n else b""
        except (EOFError, OSError, orjson.JSONDecodeError) as e:
            raise WireClosed(f"{type(e).__name__}: {e}") from None
        if len(payload) != n:
            raise WireClosed("a payload shorter than its head declared")
        return head, payload

    def ready(self) -> bool:
        """Whether a message has (begun to) arrive, without waiting."""
        try:
            return self.conn.poll(0)
        except (EOFError, OSError):
            return False

    def push(self, pushes: list[tuple[str, list]]) -> None:
        """The owner's unasked messages (no ``rid``), in order, under one lock: ``("bodies",
        [(job id, body), ...])`` (finished jobs' poll bodies) and ``("forget", [job id, ...])``."""
        with self._lock:
            for op, values in pushes:
                if op == "bodies":
                    payload = b"".join(body for _, body in values)
                    head = {"op": op, "ids": [jid for jid, _ in values], "sizes": [len(b) for _, b in values]}
                    if payload:
                        head["n"] = len(payload)
                    self.conn.send_bytes(orjson.dumps(head))
                    if payload:
                        self.conn.send_bytes(payload)
                else:
                    self.conn.send_bytes(orjson.dumps({"op": op, "ids": list(values)}))

    def send_timeout(self, seconds: int) -> None:
        """Sends fail after ``seconds`` without progress (reads still wait)."""
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, 0))

    def cut(self) -> None:
        """End the connection both ways (a reader waiting on it wakes with WireClosed)."""
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def close(self) -> None:
        self.cut()
        self._sock.close()
        self.conn.close()


def pushed_bodies(head: dict, payload: bytes) -> list[tuple[str, bytes]]:
    """A bodies message's (job id, body) pairs (ValueError if its sizes do not add up)."""
    ids, sizes = [str(x) for x in head["ids"]], [int(x) for x in head["sizes"]]
    if len(ids) != len(sizes) or sum(sizes) != len(payload) or min(sizes, default=0) < 0:
        raise ValueError("a bodies message whose sizes do not match its payload")
    view, out, at = memoryview(payload), [], 0
    for jid, size in zip(ids, sizes):
        out.append((jid, bytes(view[at:at + size])))
        at += size
    return out


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
    """The work item a message carries; a spooled one's audio from ``spooled`` (this process's
    store: the path is made here from the job id, never taken from the message)."""
    n = int(h["n_samples"])
    if "spooled" in h:
        offset, frames = (int(v) for v in h["spooled"])
        if spooled is None or offset < 0 or frames != n or audio:
            raise ValueError("a spooled work item this side cannot take")
        wave = spooled(str(h["job_id"]), Pcm16Layout(offset, frames))
    else:
        samples = np.frombuffer(audio, dtype=np.float32)
        wave = torch.from_numpy(samples if samples.flags.writeable else samples.copy())  # (bytes: read-only)
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
