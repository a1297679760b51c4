"""The owner's end of the sibling web processes (``--web-processes``): the embedded server's
process that holds the store's one writer, the scheduler and the GPU loop answers its siblings
here (pipeline/serving/sibling_wire.py has the frames).

A sibling takes an upload, decodes it and spools it (fsync'd) itself; this process then inserts
the job's row (the store's group commit: the rows of many submits, from any process, in one
transaction) and puts its work item into the scheduler -- one message, so a job is accepted
whole or not at all. Everything a sibling reads (polls) it reads from SQLite itself (WAL)."""

from __future__ import annotations

import hmac
import logging
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import torch

from pipeline.domain.errors import SenseVoiceError
from pipeline.domain.types import Transcript
from pipeline.serving import sibling_wire as wire

logger = logging.getLogger("sensevoice.siblings")

HANDLER_THREADS = 16  # submits handled at once (their row inserts share group commits)


class SiblingHub:
    """Serves the siblings' requests on a Unix socket until ``stop``. ``broker`` is this
    process's embedded broker, ``remember`` the job view's (a job a sibling accepted is known
    here like one accepted here), ``state`` what a sibling's probes and admission read."""

    def __init__(self, path: str, secret: str, broker, remember: Callable, state: Callable[[], dict],
                 device: str = "cpu"):
        self.path, self.secret = path, secret
        self.broker, self.remember, self.state = broker, remember, state
        self.device = torch.device(device)  # where this process's own uploads' waves wait (its GPU)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(64)
        self._pool = ThreadPoolExecutor(HANDLER_THREADS, thread_name_prefix="sensevoice-hub")
        self._stopped = threading.Event()
        self._conns: set[socket.socket] = set()
        self.accepted = 0  # jobs the siblings submitted that this process took
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="sensevoice-hub", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stopped.set()
        for s in [self._sock, *list(self._conns)]:
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), name="sensevoice-hub-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        lock = threading.Lock()
        try:
            head, _ = wire.recv_frame(conn)
            if head.get("op") != "hello" or not hmac.compare_digest(str(head.get("secret", "")), self.secret):
                logger.warning("a connection to the sibling socket without the secret: closed")
                return
            self._conns.add(conn)
            while not self._stopped.is_set():
                head, payload = wire.recv_frame(conn)
                if head.get("op") in ("submit", "put"):  # blocking writes: many at once share a commit
                    self._pool.submit(self._answer, conn, lock, head, payload)
                else:
                    self._answer(conn, lock, head, payload)
        except (wire.WireClosed, OSError):
            pass
        except Exception:  # a frame this side cannot read: the connection ends (the sibling restarts)
            logger.exception("a sibling's frame could not be read: its connection is closed")
        finally:
            self._conns.discard(conn)
            conn.close()

    def _answer(self, conn: socket.socket, lock: threading.Lock, head: dict, payload: bytearray) -> None:
        reply: dict = {"rid": head.get("rid")}
        try:
            reply["ok"] = self._handle(head, payload)
        except SenseVoiceError as e:
            reply["error"] = wire.error_head(e)
        except Exception as e:  # a bug, not the client's fault: the sibling answers 500
            logger.exception("sibling request %s failed", head.get("op"))
            reply["error"] = {"code": "internal_error", "message": f"internal error: {type(e).__name__}"}
        try:
            wire.send_frame(conn, lock, reply)
        except OSError:
            pass  # the sibling is gone; what it sent was handled (a job it accepted runs)

    def _item(self, head: dict, payload: bytearray):
        """The work item, its wave where this process's own uploads put theirs: a batch of waves
        on one device is padded there (a batch of host and device waves went back through the
        host, synchronising the GPU: the H200 ran 375 jobs/s with 4 web processes)."""
        item = wire.item_from_head(head["item"], payload)
        if self.device.type != "cpu":
            item.audio = item.audio.to(self.device)
            if item.audio.is_cuda:  # ready before the worker's stream reads it
                torch.cuda.current_stream(item.audio.device).synchronize()
        return item

    def _handle(self, head: dict, payload: bytearray):
        op = head.get("op")
        if op == "submit":  # a new job: its row, then its (first) work item, or neither
            job = wire.job_from_head(head["job"])
            self.broker.insert(job)
            try:
                self.broker.put(self._item(head, payload), force=bool(head.get("force")))
            except SenseVoiceError:
                self.broker.discard(job.id)
                raise
            self.remember(job)
            with self._count_lock:
                self.accepted += 1
            return {"position": self.broker.position(job.id)}
        if op == "put":
            self.broker.put(self._item(head, payload), force=bool(head.get("force")))
            return {}
        if op == "insert":  # a job whose work items follow (a long recording's pieces)
            job = wire.job_from_head(head["job"])
            self.broker.insert(job)
            self.remember(job)
            return {}
        if op == "discard":
            self.broker.discard(str(head["job_id"]))
            return {}
        if op == "finish_empty":  # a long recording with no speech at all: an empty transcript
            job_id = str(head["job_id"])
            self.broker.mark_running([job_id])
            return {"finished": self.broker.finish(job_id, Transcript(text="", raw_text="", segments=()))}
        if op == "position":
            return {"position": self.broker.position(str(head["job_id"]))}
        if op == "state":
            return self.state()
        raise ValueError(f"unknown op {op!r}")
