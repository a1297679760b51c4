"""The owner's end of the sibling web processes (``--web-processes``): the embedded server's
process that holds the store's one writer, the scheduler and the GPU loop answers its siblings
here, over ``multiprocessing.connection`` (pipeline/serving/sibling_wire.py has the messages).

A sibling takes an upload, decodes it and spools it (fsync'd) itself; this process then inserts
the job's row (the store's group commit: the rows of many submits, from any process, in one
transaction) and puts its work item into the scheduler -- one message, so a job is accepted
whole or not at all. The messages a sibling sent together are one batch (their rows one group),
read and answered by that sibling's connection thread. Everything a sibling reads (polls) it
reads from SQLite itself (WAL), but for the finished jobs' bodies that this process sends it as
they finish (``body_of``; a pusher thread, never the finisher): in order with their later changes
(a reviewer's edit) and their purges (``forget``), so that a sibling's copy never outlives the
job or lags its store by more than the messages in flight."""

from __future__ import annotations

import logging
import queue
import socket
import threading
from collections.abc import Callable
from multiprocessing.connection import AuthenticationError, Listener

import torch

from pipeline.domain.errors import SenseVoiceError
from pipeline.domain.types import JobState, Transcript
from pipeline.serving import sibling_wire as wire

logger = logging.getLogger("sensevoice.siblings")

MAX_BATCH = 256  # requests of one sibling handled as one batch (its submits' rows: one group commit)
PUSH_BATCH = 512  # finished jobs' bodies (and purges) sent to the siblings in one write, at most
PUSH_STALL_S = 5  # a sibling that takes no pushed bytes for this long is cut off (it restarts, empty)
HELLO_TIMEOUT_S = 10  # a connection that does not prove the secret within this is closed


class SiblingHub:
    """Serves the siblings' requests on a Unix socket until ``stop``. ``broker`` is this
    process's embedded broker, ``remember`` the job view's (a job a sibling accepted is known
    here like one accepted here), ``state`` what a sibling's probes and admission read."""

    def __init__(self, path: str, secret: str, broker, remember: Callable, state: Callable[[], dict],
                 device: str = "cpu", body_of: Callable[[str], bytes | None] | None = None):
        self.path, self.secret = path, secret
        self.broker, self.remember, self.state = broker, remember, state
        self.body_of = body_of  # a finished job's poll body (None: not known here), sent to the siblings
        self.device = torch.device(device)  # where this process's own uploads' waves wait (its GPU)
        # no authkey here: Listener.accept would run each challenge in the accepting thread, where a
        # peer that says nothing holds up every other; it runs in the connection's own (``_serve``)
        self._listener = Listener(path, family="AF_UNIX", backlog=64)
        self._stopped = threading.Event()
        self._conns: dict[wire.Wire, None] = {}  # the siblings' connections, in the order they came
        self._pushes: queue.SimpleQueue = queue.SimpleQueue()
        self._pusher = threading.Thread(target=self._push, name="sensevoice-hub-push", daemon=True)
        if body_of is not None:
            broker.feed.subscribe(self._on_event)
        self.accepted = 0  # jobs the siblings submitted that this process took
        self._count_lock = threading.Lock()
        self._thread = threading.Thread(target=self._accept, name="sensevoice-hub", daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._pusher.start()

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._pushes.put(None)
        try:  # wakes the accepting thread, which then sees the stop
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.connect(self.path)
        except OSError:
            pass
        self._thread.join(5)
        self._listener.close()
        for conn in list(self._conns):
            conn.cut()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                conn = self._listener.accept()
            except OSError:
                if self._stopped.is_set():
                    return
                continue  # (a peer that went away before it was accepted)
            if self._stopped.is_set():
                conn.close()
                return
            threading.Thread(target=self._serve, args=(conn,), name="sensevoice-hub-conn", daemon=True).start()

    def _serve(self, conn) -> None:
        try:  # nothing but the challenge's answer (256 bytes at most) is read before it is proven
            link = wire.Wire.accepted(conn, self.secret, HELLO_TIMEOUT_S)
        except AuthenticationError as e:
            logger.warning("a connection to the sibling socket without the secret (%s): closed", e)
            return
        try:
            link.send_timeout(PUSH_STALL_S)
            self._conns[link] = None
            while not self._stopped.is_set():
                messages = [link.recv()]
                while len(messages) < MAX_BATCH and link.ready():  # all that came together
                    messages.append(link.recv())
                self._handle_batch(link, messages)
        except wire.WireClosed:
            pass
        except Exception:  # a message this side cannot take: the connection ends (the sibling restarts)
            logger.exception("a sibling's message could not be taken: its connection is closed")
        finally:
            self._conns.pop(link, None)
            link.close()

    # -- what the siblings are sent unasked
    def _on_event(self, event) -> None:
        """A committed change (the writer's thread: only a put here)."""
        if event.state in (JobState.DONE, JobState.FAILED) and self._conns:
            self._pushes.put(("bodies", event.job_id))

    def forget(self, job_ids: list[str]) -> None:
        """Purged jobs: the siblings drop their bodies (``Runtime.on_purge``)."""
        if job_ids:
            self._pushes.put(("forget", list(job_ids)))

    def _push(self) -> None:
        """Send what ``_on_event`` and ``forget`` queued to every sibling, in order, many at a time.
        A body is read when it is sent (the newest state of its job: a change queued after it
        sends it again). A sibling whose socket takes nothing for ``PUSH_STALL_S`` is cut off: it
        restarts with nothing cached, where another would have waited behind it."""
        while (first := self._pushes.get()) is not None:
            batch = [first]
            while len(batch) < PUSH_BATCH:
                try:
                    batch.append(self._pushes.get_nowait())
                except queue.Empty:
                    break
            if None in batch:
                return
            try:
                pushes = self._coalesce(batch)
            except Exception:  # a bug: what the siblings hold could go stale; they restart empty
                logger.exception("the finished jobs' bodies could not be sent: the siblings restart")
                for conn in list(self._conns):
                    self._conns.pop(conn, None)
                    conn.cut()
                continue
            for conn in list(self._conns):
                try:
                    conn.push(pushes)
                except OSError as e:
                    logger.warning("a sibling took no pushed job bodies for %d s (%s): its connection is "
                                   "closed, it restarts", PUSH_STALL_S, type(e).__name__)
                    self._conns.pop(conn, None)  # (nothing more is sent to it; its reader ends)
                    conn.cut()

    def _coalesce(self, batch: list) -> list[tuple[str, object]]:
        """Queued pushes as messages in their order: runs of finished jobs as one bodies message. A
        finished job whose body is not held here any more is forgotten there instead (a sibling
        must not keep answering a body from before the change this push is for)."""
        out: list[tuple[str, list]] = []
        for op, value in batch:
            if op == "bodies":
                body = self.body_of(value)
                op, value = ("bodies", [(value, body)]) if body is not None else ("forget", [value])
            if out and out[-1][0] == op:
                out[-1][1].extend(value)
            else:
                out.append((op, list(value)))
        return out

    def _handle_batch(self, conn: wire.Wire, messages: list) -> None:
        """A batch of requests, in order; the submits among them as groups: their rows in the
        store's group commit together, then each item queued (or refused), the replies in one write."""
        replies: list[dict] = []
        submits: list = []
        for head, payload in messages:
            if head.get("op") == "submit":
                submits.append((head, payload))
                continue
            replies += self._submit_group(submits)
            submits = []
            replies.append(self._answer(head, lambda h=head, p=payload: self._handle(h, p)))
        replies += self._submit_group(submits)
        try:
            conn.send({"replies": replies})
        except OSError:  # the sibling is gone or stalled; what it sent was handled (a job it accepted runs)
            conn.cut()

    def _submit_group(self, submits: list) -> list[dict]:
        if not submits:
            return []
        jobs = [wire.job_from_head(head["job"]) for head, _ in submits]
        errors = self.broker.insert_many(jobs, [_size(head) for head, _ in submits])
        return [self._answer(head, lambda h=head, p=payload, j=job, e=error: self._place(h, p, j, e))
                for (head, payload), job, error in zip(submits, jobs, errors)]

    def _place(self, head: dict, payload, job, insert_error: Exception | None) -> dict:
        """A new job whose row is inserted (or refused: ``insert_error``): its (first) work item
        queued, or the row discarded again -- a job is accepted whole or not at all."""
        if insert_error is not None:
            raise insert_error
        try:
            self.broker.put(self._item(head, payload), force=bool(head.get("force")))
        except BaseException:
            self.broker.discard(job.id)
            raise
        self.remember(job)
        with self._count_lock:
            self.accepted += 1
        return {"position": self.broker.position(job.id)}

    @staticmethod
    def _answer(head: dict, call: Callable[[], object]) -> dict:
        reply: dict = {"rid": head.get("rid")}
        try:
            reply["ok"] = call()
        except SenseVoiceError as e:
            reply["error"] = wire.error_head(e)
        except Exception as e:  # a bug, not the client's fault: the sibling answers 500
            logger.exception("sibling request %s failed", head.get("op"))
            reply["error"] = {"code": "internal_error", "message": f"internal error: {type(e).__name__}"}
        return reply

    def _item(self, head: dict, payload):
        """The work item: a mono 16-bit WAV's the spooled samples (mapped when the worker takes
        them, as this process's own uploads'); a decoded wave where this process's own decoded
        uploads put theirs: a batch of waves on one device is padded there."""
        item = wire.item_from_head(head["item"], payload, self.broker.spooled_audio)
        if isinstance(item.audio, torch.Tensor) and self.device.type != "cpu":
            item.audio = item.audio.to(self.device)
            if item.audio.is_cuda:  # ready before the worker's stream reads it
                torch.cuda.current_stream(item.audio.device).synchronize()
        return item

    def _handle(self, head: dict, payload):
        op = head.get("op")
        if op == "put":
            self.broker.put(self._item(head, payload), force=bool(head.get("force")))
            return {}
        if op == "insert":  # a job whose work items follow (a long recording's pieces)
            job = wire.job_from_head(head["job"])
            self.broker.insert(job, _size(head))
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


def _size(head: dict) -> int | None:
    """A submit's spooled upload size as the sibling wrote it (recorded with the row)."""
    size = head.get("upload_bytes")
    return int(size) if size is not None else None
