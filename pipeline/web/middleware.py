"""The app's own ASGI middleware: :class:`FastPolls` answers polls of jobs held in memory before the
framework runs, :class:`UploadLimit` bounds request bodies (size, time, slots)."""

from __future__ import annotations

import asyncio
import logging

from fastapi import Request
from typing import TYPE_CHECKING

from starlette.datastructures import Headers

from pipeline.domain.errors import (ClientBatchLimit, ClientUploadLimit, RequestTimeout, TooManyUploads,
                                    UploadTooLarge)
from pipeline.web.auth import token_ok
from pipeline.web.auth_throttle import AuthThrottle
from pipeline.web.edge import scope_client_key
from pipeline.web.errors import refusal_response

if TYPE_CHECKING:
    from pipeline.serving.job_view import JobView
    from pipeline.web.views import PollBodies

logger = logging.getLogger("sensevoice.api")


class FastPolls:
    """ASGI middleware: answer ``GET /api/jobs/{id}`` for a job held in memory straight from the
    snapshot, without the framework's routing, dependencies and encoders (polls are most of the
    traffic: 200 pollers at 2 Hz are 400 requests/s, and the event loop shares the GIL with the
    inference thread). Anything else, a cold job, a missing or wrong token, goes to the app."""

    PREFIX = "/api/jobs/"

    def __init__(self, app, view: JobView, bodies: PollBodies, token: str):
        self.app = app
        self.view = view
        self.bodies = bodies
        self.token = token

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET":
            path: str = scope["path"]
            job_id = path[len(self.PREFIX):] if path.startswith(self.PREFIX) else ""
            if job_id and "/" not in job_id and token_ok(Headers(scope=scope).get, self.token):
                body = self.bodies.pushed(job_id)  # (a sibling: the owner sent it)
                if body is None and (job := await self.view.poll(job_id)) is not None:
                    body = self.bodies.body(job)
                if body is not None:
                    await send({"type": "http.response.start", "status": 200, "headers": [
                        (b"content-type", b"application/json"),
                        (b"content-length", str(len(body)).encode())]})
                    await send({"type": "http.response.body", "body": body})
                    return
        await self.app(scope, receive, send)


class UploadLimit:
    """ASGI middleware for request bodies.

    * Size: a body over ``max_bytes`` is refused while it streams in (413), before the multipart
      parser spools it anywhere.
    * Time: a body must arrive within ``body_timeout_s``, and after ``grace_s`` at
      ``min_rate_bytes_s`` on average (counted over the time spent waiting for the client, not
      the time the app spends between reads); else 408 request_timeout and the connection is
      closed. A slow client cannot hold an upload slot, a task and a connection for hours.
    * Slots: a large body is refused at once while ``max_in_flight`` large bodies are being
      received or handled (503 too_many_uploads) or while its client has ``max_per_client`` of
      them (429 too_many_uploads_from_client), both with Retry-After; so that many slow or huge
      uploads at a time cannot take every thread or the memory (each upload is read whole before
      it is decoded), and one client cannot take every slot.
    * Batches (``batch_path``): a batch's body takes a slot whatever its size (a few kilobytes of
      zip can unpack into many recordings), its client may have ``max_batches_per_client`` of them
      at once (429 too_many_batches_from_client + Retry-After), and its handler weighs the slot
      by what it unpacked (:func:`weigh_upload_slot`): it holds that many slots until its answer
      is sent, every recording submitted.

    A slot is released exactly once: when the final response body message has been sent (a
    background task after the response holds none), with the request's end as a backstop, or
    earlier by the handler (:func:`release_upload_slot`: a request that waits for its job after
    submitting it holds no slot)."""

    SMALL_BODY = 64 * 1024  # bytes; smaller bodies (forms, the UI's queue calls) are not counted

    def __init__(self, app, max_bytes: int, max_in_flight: int = 0, retry_after_s: int = 2,
                 max_per_client: int = 0, body_timeout_s: float = 0.0, min_rate_bytes_s: int = 0,
                 grace_s: float = 0.0, batch_path: str | None = None, max_batches_per_client: int = 0):
        self.app = app
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight  # 0 = no limit
        self.max_per_client = max_per_client  # 0 = no limit
        self.retry_after_s = retry_after_s
        self.body_timeout_s = body_timeout_s  # 0 = none
        self.min_rate = min_rate_bytes_s  # 0 = none
        self.grace_s = grace_s
        self.in_flight = 0  # slots held (a weighed batch holds several); only touched on the event loop
        self.per_client: dict[str, int] = {}
        self.batch_path = batch_path
        self.max_batches_per_client = max_batches_per_client  # 0 = no limit
        self.batches_per_client: dict[str, int] = {}

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        length: int | None = 0
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = int(value) if value.isdigit() else None
            elif name == b"transfer-encoding":
                length = None  # chunked: the length is known at the end
                break
        if length == 0:  # no body: nothing to guard
            return await self.app(scope, receive, send)
        if length is not None and length > self.max_bytes:
            return await self._too_large(scope)(scope, receive, send)
        slot = None
        batch = scope["path"] == self.batch_path and scope["method"] == "POST"
        if batch or length is None or length > self.SMALL_BODY:
            key = scope_client_key(scope)
            if (batch and self.max_batches_per_client and key is not None
                    and self.batches_per_client.get(key, 0) >= self.max_batches_per_client):
                return await refusal_response(scope, ClientBatchLimit(
                    f"this client already has {self.batches_per_client[key]} batches in progress, "
                    f"the most one client may have; try again in {self.retry_after_s} s",
                    retry_after=self.retry_after_s))(scope, receive, send)
            if self.max_per_client and key is not None and self.per_client.get(key, 0) >= self.max_per_client:
                return await refusal_response(scope, ClientUploadLimit(
                    f"this client already has {self.per_client[key]} uploads in progress, the most "
                    f"one client may have; try again in {self.retry_after_s} s",
                    retry_after=self.retry_after_s))(scope, receive, send)
            if self.max_in_flight and self.in_flight >= self.max_in_flight:
                return await refusal_response(scope, TooManyUploads(
                    f"{self.in_flight} uploads are in progress, the most this server takes at once; "
                    f"try again in {self.retry_after_s} s", retry_after=self.retry_after_s))(
                    scope, receive, send)
            slot = _UploadSlot(self, key, batch)
            scope[UPLOAD_SLOT] = slot  # the handler may give it back early
        try:
            await self._guarded(scope, receive, send, slot)
        finally:
            if slot is not None:
                slot.release()  # backstop: the request ended without a final response message

    def _too_large(self, scope):
        return refusal_response(scope, UploadTooLarge(f"upload larger than {self.max_bytes} bytes"))

    async def _guarded(self, scope, receive, send, slot):
        loop = asyncio.get_running_loop()
        start = loop.time()
        seen = 0
        waited = 0.0  # seconds spent waiting for the client's body
        body_done = started = False
        refusal = None  # the response that replaces the app's, once the body is refused

        async def final_send(message):
            await send(message)
            if (slot is not None and message["type"] == "http.response.body"
                    and not message.get("more_body", False)):
                slot.release()  # the response is sent: the slot is free

        async def refuse(response):
            nonlocal refusal, started
            refusal = response
            if not started:  # answer now, not when the app has unwound
                started = True
                await response(scope, receive, final_send)
            raise _BodyRefused()

        async def guarded_receive():
            nonlocal seen, waited, body_done
            if refusal is not None:
                raise _BodyRefused()
            if body_done:  # e.g. waiting for http.disconnect: no deadline
                return await receive()
            t0 = loop.time()
            deadline = start + self.body_timeout_s if self.body_timeout_s else None
            if self.min_rate:  # the wait left before the average falls under the minimum rate
                rate_deadline = t0 + max(self.grace_s, seen / self.min_rate) - waited
                deadline = rate_deadline if deadline is None else min(deadline, rate_deadline)
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                waited += loop.time() - t0
                await refuse(self._timeout_response(scope, seen, loop.time() - start))
            waited += loop.time() - t0
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    await refuse(self._too_large(scope))
                if not message.get("more_body", False):
                    body_done = True
            return message

        async def guarded_send(message):
            nonlocal started
            if refusal is not None:  # the app's own answer to the refused body is dropped
                return
            if message["type"] == "http.response.start":
                started = True
            await final_send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        except Exception:
            # the app's own error for the body it could not read (its type is the app's choice:
            # FastAPI makes a 400 of it, others raise), already answered
            if refusal is None:
                raise

    def _timeout_response(self, scope, seen: int, elapsed: float):
        if self.body_timeout_s and elapsed >= self.body_timeout_s:
            why = f"the request body did not arrive within {self.body_timeout_s:g} s"
        else:
            why = (f"the request body arrived too slowly ({seen} bytes in {elapsed:.0f} s; at least "
                   f"{self.min_rate} bytes/s are needed)")
        response = refusal_response(scope, RequestTimeout(why))
        response.headers["connection"] = "close"  # the rest of the body is not wanted
        return response


UPLOAD_SLOT = "sensevoice.upload_slot"  # the scope key of a request's _UploadSlot
BATCH_PATH = "/api/batches"  # pipeline/web/routes/batches.py: a slot whatever the body's size


def release_upload_slot(request: Request) -> None:
    """Give back the request's upload slot now (idempotent; on the event loop, as UploadLimit)."""
    slot = request.scope.get(UPLOAD_SLOT)
    if slot is not None:
        slot.release()


def weigh_upload_slot(request: Request, weight: int) -> int:
    """Make the request's upload slot count as ``weight`` slots (a batch, once it knows what it
    unpacked), capped at half of the slots in all and at the client's own limit (so that one batch
    can always be taken by an idle server, and never takes every slot), until it is released.
    Raises :class:`TooManyUploads` / :class:`ClientUploadLimit` (with Retry-After) when the other
    uploads in flight leave no room for it. Returns the weight held (on the event loop)."""
    slot = request.scope.get(UPLOAD_SLOT)
    return 1 if slot is None else slot.weigh(weight)


def _add(counts: dict[str, int], key: str, n: int) -> None:
    n += counts.get(key, 0)
    if n > 0:
        counts[key] = n
    else:
        counts.pop(key, None)


class _UploadSlot:
    """One large upload's place in UploadLimit's counts (in all and per client; a batch's weighs
    ``weight`` slots and counts in its client's batches too)."""

    __slots__ = ("limit", "key", "held", "weight", "batch")

    def __init__(self, limit: UploadLimit, key: str | None, batch: bool = False):
        self.limit, self.key, self.held, self.weight, self.batch = limit, key, True, 1, batch
        limit.in_flight += 1
        if key is not None:
            _add(limit.per_client, key, 1)
            if batch:
                _add(limit.batches_per_client, key, 1)

    def weigh(self, weight: int) -> int:
        limit = self.limit
        weight = max(weight, 1)
        if limit.max_in_flight:
            weight = min(weight, max(limit.max_in_flight // 2, 1))
        if limit.max_per_client and self.key is not None:
            weight = min(weight, limit.max_per_client)
        more = weight - self.weight
        if not self.held or more <= 0:
            return self.weight
        retry = limit.retry_after_s
        if limit.max_in_flight and limit.in_flight + more > limit.max_in_flight:
            raise TooManyUploads(
                f"this batch needs {weight} upload slots until its recordings are submitted and "
                f"{limit.max_in_flight - limit.in_flight + self.weight} are free; try again in {retry} s",
                retry_after=retry)
        if (limit.max_per_client and self.key is not None
                and limit.per_client.get(self.key, 0) + more > limit.max_per_client):
            raise ClientUploadLimit(
                f"this batch needs {weight} of this client's {limit.max_per_client} upload slots "
                f"until its recordings are submitted, and its other uploads hold "
                f"{limit.per_client[self.key] - self.weight}; try again in {retry} s", retry_after=retry)
        limit.in_flight += more
        if self.key is not None:
            _add(limit.per_client, self.key, more)
        self.weight = weight
        return weight

    def release(self) -> None:
        if not self.held:  # idempotent: the final message and the backstop both call it
            return
        self.held = False
        limit = self.limit
        limit.in_flight -= self.weight
        if self.key is not None:
            _add(limit.per_client, self.key, -self.weight)
            if self.batch:
                _add(limit.batches_per_client, self.key, -1)


class _BodyRefused(Exception):
    """Raised into the app's receive once its request body is refused (too large, too slow)."""


def install_guards(app, settings, view: JobView, bodies: PollBodies, intake) -> None:
    """The api role's request guards, inside the Host/Origin check (added last: outermost), and
    inside them all the common submit without the framework (``intake``: pipeline/web/fast_submit.py)."""
    from pipeline.web.fast_submit import FastSubmit
    from pipeline.web.ui_guard import AccessGuard

    app.add_middleware(FastSubmit, intake=intake, token=settings.server.token)

    # token on /docs; what the UI may read; its session routes only after its login
    app.add_middleware(AccessGuard, settings=settings,
                       ui_app=lambda: getattr(app.state, "gradio_app", None))
    uploads = settings.limits.max_concurrent_uploads
    app.add_middleware(UploadLimit, max_bytes=settings.limits.max_upload_bytes + 64 * 1024,
                       max_in_flight=uploads, retry_after_s=settings.limits.retry_after_s,
                       max_per_client=settings.limits.max_uploads_per_client,
                       body_timeout_s=settings.limits.body_timeout_s,
                       min_rate_bytes_s=settings.limits.body_min_rate_bytes_s, grace_s=settings.limits.body_grace_s,
                       batch_path=BATCH_PATH,
                       max_batches_per_client=settings.limits.max_batches_per_client)
    app.add_middleware(FastPolls, view=view, bodies=bodies, token=settings.server.token)  # polls skip what is inside it
    # outermost of these: failed sign-ins (any 401, the UI's login, a live stream's token) are
    # counted per client address and a guessing client is refused
    app.add_middleware(AuthThrottle, limit=settings.limits.auth_failures_per_client,
                       window_s=settings.limits.auth_failure_window_s)
