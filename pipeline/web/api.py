"""REST API under /api, plus /healthz and /readyz. Thin: every call goes to TranscriptionService.

Handlers that decode or touch SQLite are plain ``def`` (FastAPI runs them in its thread pool), so the
event loop never blocks. Errors are JSON ``{"error": {"code", "message"}}`` with the right status.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import math
import threading
from collections import OrderedDict

import orjson

from fastapi import APIRouter, Depends, FastAPI, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline.audio.decode import read_upload
from pipeline.web.edge import scope_client_key
from pipeline.domain.errors import (AudioGone, Busy, ClientUploadLimit, InvalidOption, LinkExpired,
                     RequestTimeout, ResultNotReady, SenseVoiceError, TooManyUploads, Unauthorized,
                     UploadTooLarge)
from pipeline.serving.broker_sqlite import storage_error
from pipeline.serving.metrics import CONTENT_TYPE
from pipeline.serving.service import TranscriptionService
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions

logger = logging.getLogger("sensevoice.api")


def error_response(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def domain_response(e: SenseVoiceError) -> JSONResponse:
    """The answer to a domain error (back-pressure ones with Retry-After), for the exception
    handler and for middleware that answers before the app."""
    headers = {"Retry-After": str(e.retry_after)} if isinstance(e, Busy) else None
    return error_response(e.status, e.code, e.message, headers)


OPENAI_PREFIX = "/v1/"  # the OpenAI-compatible routes (pipeline/web/routes/openai.py)


def refusal_response(scope, e: SenseVoiceError) -> JSONResponse:
    """:func:`domain_response` for middleware, in OpenAI's error shape under /v1/ (so that the
    OpenAI clients read the refusals of uploads there as they read the routes' own errors)."""
    if scope.get("path", "").startswith(OPENAI_PREFIX):
        from pipeline.web.routes.openai import openai_error_response

        return openai_error_response(e)
    return domain_response(e)


def token_ok(get_header, token: str) -> bool:
    """'Authorization: Bearer <token>' (or X-API-Key) matches ``token``; always true without one."""
    if not token:
        return True
    auth = get_header("authorization") or ""
    given = auth[7:] if auth.lower().startswith("bearer ") else get_header("x-api-key") or ""
    return hmac.compare_digest(given.encode(), token.encode())


def job_json(job: Job) -> dict:
    return {
        "id": job.id,
        "status": job.state.value,
        "position": job.position,
        "filename": job.filename,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "duration_s": job.duration_s,
        "audio_seconds": job.audio_seconds,
        "options": {"language": job.options.language, "use_itn": job.options.use_itn,
                    "ban_emo_unk": job.options.ban_emo_unk,
                    "split_channels": job.options.split_channels,
                    "word_timestamps": job.options.word_timestamps},
        "progress": job.meta.get("progress"),
        "result": job.result.to_dict() if job.result else None,
        "error": {"code": job.error.code, "message": job.error.message} if job.error else None,
    }


def job_body(job: Job) -> bytes:
    """The JSON of a job, as GET /api/jobs/{id} answers it (orjson: no framework encoder)."""
    return orjson.dumps(job_json(job))


class PollBodies:
    """Encoded JSON of finished jobs (it never changes again), so that repeated polls of a done job
    are a dictionary lookup. Keyed by the job snapshot itself: a new snapshot is encoded anew."""

    def __init__(self, size: int = 2048):
        self.size = size
        self._bodies: OrderedDict[str, tuple[Job, bytes]] = OrderedDict()
        self._lock = threading.Lock()

    def body(self, job: Job) -> bytes:
        if job.state not in (JobState.DONE, JobState.FAILED):
            return job_body(job)  # small, and its position/progress change
        with self._lock:
            hit = self._bodies.get(job.id)
            if hit is not None and hit[0] is job:
                self._bodies.move_to_end(job.id)
                return hit[1]
        body = job_body(job)
        with self._lock:
            self._bodies[job.id] = (job, body)
            while len(self._bodies) > self.size:
                self._bodies.popitem(last=False)
        return body

    def forget(self, job_ids) -> None:
        """Drop purged jobs: their transcripts must not outlive retention, not even in memory."""
        with self._lock:
            for jid in job_ids:
                self._bodies.pop(jid, None)


class FastPolls:
    """ASGI middleware: answer ``GET /api/jobs/{id}`` for a job held in memory straight from the
    snapshot, without the framework's routing, dependencies and encoders (polls are most of the
    traffic: 200 pollers at 2 Hz are 400 requests/s, and the event loop shares the GIL with the
    inference thread). Anything else, a cold job, a missing or wrong token, goes to the app."""

    PREFIX = "/api/jobs/"

    def __init__(self, app, service: TranscriptionService, bodies: PollBodies):
        self.app = app
        self.service = service
        self.bodies = bodies
        self.token = service.settings.api_token

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "GET":
            path: str = scope["path"]
            job_id = path[len(self.PREFIX):] if path.startswith(self.PREFIX) else ""
            if job_id and "/" not in job_id and token_ok(Headers(scope=scope).get, self.token):
                job = await self.service.poll(job_id)
                if job is not None:
                    body = self.bodies.body(job)
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

    A slot is released exactly once: when the final response body message has been sent (a
    background task after the response holds none), with the request's end as a backstop, or
    earlier by the handler (:func:`release_upload_slot`: a request that waits for its job after
    submitting it holds no slot)."""

    SMALL_BODY = 64 * 1024  # bytes; smaller bodies (forms, the UI's queue calls) are not counted

    def __init__(self, app, max_bytes: int, max_in_flight: int = 0, retry_after_s: int = 2,
                 max_per_client: int = 0, body_timeout_s: float = 0.0, min_rate_bytes_s: int = 0,
                 grace_s: float = 0.0):
        self.app = app
        self.max_bytes = max_bytes
        self.max_in_flight = max_in_flight  # 0 = no limit
        self.max_per_client = max_per_client  # 0 = no limit
        self.retry_after_s = retry_after_s
        self.body_timeout_s = body_timeout_s  # 0 = none
        self.min_rate = min_rate_bytes_s  # 0 = none
        self.grace_s = grace_s
        self.in_flight = 0  # only touched on the event loop: no lock needed
        self.per_client: dict[str, int] = {}

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
        if length is None or length > self.SMALL_BODY:
            key = scope_client_key(scope)
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
            slot = _UploadSlot(self, key)
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


def release_upload_slot(request: Request) -> None:
    """Give back the request's upload slot now (idempotent; on the event loop, as UploadLimit)."""
    slot = request.scope.get(UPLOAD_SLOT)
    if slot is not None:
        slot.release()


async def submit_upload(request: Request, service: TranscriptionService, file: UploadFile,
                        options: TranscribeOptions, lane: Lane) -> Job:
    """Read an upload and submit its job (both in the thread pool), then drop the upload (its
    spooled copy and the bytes) and give back its upload slot: a request that waits for its job
    afterwards (``?wait=``, /v1/audio/transcriptions) holds no slot, no memory and no thread."""
    data = await run_in_threadpool(read_upload, file.file, service.settings.max_upload_bytes)
    await file.close()
    job = await run_in_threadpool(service.submit, data, filename=file.filename or "",
                                  options=options, lane=lane)
    release_upload_slot(request)
    return job


class _UploadSlot:
    """One large upload's place in UploadLimit's counts (in all and per client)."""

    __slots__ = ("limit", "key", "held")

    def __init__(self, limit: UploadLimit, key: str | None):
        self.limit, self.key, self.held = limit, key, True
        limit.in_flight += 1
        if key is not None:
            limit.per_client[key] = limit.per_client.get(key, 0) + 1

    def release(self) -> None:
        if not self.held:  # idempotent: the final message and the backstop both call it
            return
        self.held = False
        limit = self.limit
        limit.in_flight -= 1
        if self.key is not None:
            n = limit.per_client.get(self.key, 0) - 1
            if n > 0:
                limit.per_client[self.key] = n
            else:
                limit.per_client.pop(self.key, None)


class _BodyRefused(Exception):
    """Raised into the app's receive once its request body is refused (too large, too slow)."""


_BodyTooLarge = _BodyRefused  # the old name


MAGIC_TYPES = ((b"RIFF", "audio/wav"), (b"fLaC", "audio/flac"), (b"OggS", "audio/ogg"),
               (b"ID3", "audio/mpeg"), (b"\xff\xfb", "audio/mpeg"), (b"\xff\xf3", "audio/mpeg"),
               (b"\x1aE\xdf\xa3", "video/webm"))


def sniff_media_type(path) -> str:
    """A media type from the file's first bytes (the client's name and type are never trusted)."""
    with open(path, "rb") as f:
        return media_type_of(f.read(12))


def media_type_of(head: bytes) -> str:
    """A media type from a file's first 12 bytes."""
    for magic, media in MAGIC_TYPES:
        if head.startswith(magic):
            return media
    if head[4:8] == b"ftyp":
        return "audio/mp4"
    return "application/octet-stream"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SenseVoiceError)
    async def _domain(_request: Request, e: SenseVoiceError):
        return domain_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, e: StarletteHTTPException):
        if isinstance(e.__cause__, OSError):  # FastAPI's "error parsing the body" over a failed write
            return await _storage(_request, e.__cause__)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "invalid_request")
        return error_response(e.status_code, code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(OSError)
    async def _storage(_request: Request, e: OSError):
        # a write that failed below our own code (the multipart parser spooling a large upload to
        # a temporary file on a full disk): JSON 507/503, not a plain-text 500
        logger.error("I/O error while handling a request: %s", e)
        return domain_response(storage_error(e))

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, e: RequestValidationError):
        parts = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        return error_response(400, "invalid_request", parts or "invalid request")


def require_token(token: str):
    """A dependency: 'Authorization: Bearer <token>' (or X-API-Key) when a token is configured."""

    async def check(request: Request) -> None:  # no I/O: safe on the event loop
        if not token_ok(request.headers.get, token):
            raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer <token>')")

    return check


def require_token_or_link(token: str):
    """A dependency for a job's audio and result routes: the API token, or a signed link of that
    job that has not expired (``?exp=...&sig=...``, pipeline/web/links.py: the UI's player and export
    links, which a browser cannot give an Authorization header)."""
    from pipeline.web.links import link_key, link_state

    key = link_key(token)

    async def check(request: Request, job_id: str) -> None:  # no I/O: safe on the event loop
        if token_ok(request.headers.get, token):
            return
        q = request.query_params
        state = link_state(key, job_id, q.get("exp"), q.get("sig"))
        if state == "expired":  # a link this server signed: not a guess, not a failed sign-in
            raise LinkExpired(f"this link to job {job_id} has expired (links last as long as the "
                              "job's retention); send the API token, or open the job from the UI "
                              "again for a new link")
        if state != "valid":
            raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer <token>'), "
                               "or an invalid signed link")

    return check


FINAL_STATES = (JobState.DONE, JobState.FAILED, JobState.PURGED)
WAIT_REREAD_S = 1.0  # s, embedded: a waiting request reads its job this often (notices wake it)
WAIT_BROKER_S = 0.02  # s, distributed: how often it reads the broker (no notices from workers)


def wait_seconds(value: str | None, cap: float) -> float | None:
    """``?wait=`` as seconds, at most ``cap``; None when not given; 400 when not a number >= 0."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        raise InvalidOption(f"wait must be a number of seconds, not {value[:40]!r}") from None
    if not (math.isfinite(seconds) and seconds >= 0):
        raise InvalidOption(f"wait must be a number of seconds >= 0, not {value[:40]!r}")
    return min(seconds, cap)


async def wait_finished(service: TranscriptionService, job_id: str, timeout_s: float) -> Job:
    """The job once it is done or failed, else as it is after ``timeout_s``. On the event loop,
    holding no thread: woken by the service's change notices (``service.changes``), reading the
    in-memory snapshot (or the broker's async client; SQLite in the thread pool for a cold job)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    with service.changes.watch(job_id) as watch:
        while True:
            watch.clear()  # before the read: a notice that comes after it wakes the wait below
            job = await service.poll(job_id)
            if job is None:
                job = await run_in_threadpool(service.get, job_id)
            left = deadline - loop.time()
            if job.state in FINAL_STATES or left <= 0:
                return job
            await watch.wait(min(left, WAIT_BROKER_S if service.distributed else WAIT_REREAD_S))


def build_router(service: TranscriptionService, bodies: PollBodies) -> APIRouter:
    router = APIRouter()
    auth = [Depends(require_token(service.settings.api_token))]
    auth_or_link = [Depends(require_token_or_link(service.settings.api_token))]

    @router.post("/api/jobs", status_code=202, dependencies=auth)
    async def create_job(
            request: Request,
            file: UploadFile = File(...),
            language: str = Form("auto", description="auto, zh, en, yue, ja, ko or nospeech"),
            use_itn: bool = Form(True, description="punctuation and digits (inverse text "
                                 "normalisation)"),
            ban_emo_unk: bool = Form(False, description="never answer the EMO_UNKNOWN emotion"),
            split_channels: bool = Form(False, description="a stereo call: each channel is a "
                                        "speaker ('left', 'right')"),
            word_timestamps: bool = Form(False, description="each segment's words with their "
                                         "times (CTC-aligned); subtitles are cut at them"),
            wait: str | None = Query(None, description="seconds to wait for the result: 200 with "
                                     "the finished job if it ends in time, else 202")):
        """Submit a recording: 202 with the job's id (poll GET /api/jobs/{id}); with ``?wait=``,
        200 and the finished job when it ends within that many seconds (capped at
        ``request_wait_s``). Reading and decoding run in the thread pool; the wait holds none."""
        timeout = wait_seconds(wait, service.settings.request_wait_s)
        options = TranscribeOptions(language=language, use_itn=use_itn, ban_emo_unk=ban_emo_unk,
                                    split_channels=split_channels, word_timestamps=word_timestamps)
        job = await submit_upload(request, service, file, options, Lane.BULK)
        headers = {"Location": f"/api/jobs/{job.id}"}
        if timeout is not None:
            job = await wait_finished(service, job.id, timeout)
            if job.state in (JobState.DONE, JobState.FAILED):
                return Response(bodies.body(job), media_type="application/json", headers=headers)
        return JSONResponse({"id": job.id, "status": job.state.value, "position": job.position},
                            status_code=202, headers=headers)

    @router.get("/api/jobs/{job_id}", dependencies=auth)
    async def get_job(job_id: str):
        # FastPolls answers jobs held in memory before they get here: this is a cold one (or an
        # unknown id), read from SQLite in the thread pool
        job = await run_in_threadpool(service.get, job_id)
        return Response(bodies.body(job), media_type="application/json")

    @router.get("/api/jobs/{job_id}/result", dependencies=auth_or_link)
    def get_result(job_id: str, format: str = "json", tags: bool | None = None,
                   speaker: bool = True, tag_style: str = "prefix"):
        """The transcript as txt, json, srt or vtt (pipeline/domain/exports.py). ``tags``: show
        language/emotion/event tags (default: in txt yes, in srt/vtt no); ``tag_style=class``
        writes them as WebVTT classes instead of a prefix."""
        from pipeline.domain.exports import FORMATS, ExportOptions, export

        if format not in FORMATS:
            raise InvalidOption(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
        options = ExportOptions(tags=tags, speaker=speaker, tag_style=tag_style)
        job = service.get(job_id)
        if job.result is None:
            raise ResultNotReady(f"job {job_id} is {job.state.value}: no result yet"
                                 if job.state is not JobState.FAILED else
                                 f"job {job_id} failed: {job.error.message if job.error else ''}")
        body, media = export(job.result, format, options,
                             job_meta={"id": job.id, "audio_seconds": job.audio_seconds,
                                       "created_at": job.created_at, "finished_at": job.finished_at})
        return Response(body, media_type=media, headers={
            "Content-Disposition": f'attachment; filename="transcript-{job.id}.{format}"'})

    @router.get("/api/jobs/{job_id}/audio", dependencies=auth_or_link)
    def get_audio(job_id: str):
        """The recording as uploaded, while it is retained (for the review player)."""
        service.get(job_id)  # 404 / 410 first
        headers = {"Cache-Control": "private, max-age=3600", "X-Content-Type-Options": "nosniff"}
        if service.distributed:  # the upload lives in the broker, readable from any api process
            data = service.store.load_upload(job_id)
            return Response(data, media_type=media_type_of(data[:12]), headers=headers)
        path = service.store.spool_path(job_id)
        if not path.exists():
            raise AudioGone(f"the audio of job {job_id} is no longer kept")
        return FileResponse(path, media_type=sniff_media_type(path), headers=headers)

    return router


def build_health_router(service: TranscriptionService) -> APIRouter:
    """Probes and metrics: every role serves them (a worker process serves only them)."""
    from pipeline.doctor import DoctorCache

    router = APIRouter()
    doctor = DoctorCache(service.settings)  # `sensevoice doctor`'s facts, refreshed in the background

    @router.get("/metrics", dependencies=[Depends(require_token(service.settings.api_token))])
    def metrics():  # Prometheus sends the bearer token
        return Response(service.metrics.render(), media_type=CONTENT_TYPE)

    @router.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz(request: Request):
        body = {"ready": service.ready, "state": service.state, "model": _model_name(service),
                "demo": service.is_demo, "devices": service.devices}
        reason = service.error or (service.unhealthy_reason() or service.unready_reason()
                                   if service.state == "ready" else None)
        if reason:
            body["error"] = reason
        if service.no_worker and not service.error:  # distributed api role: nobody runs the jobs
            body["code"] = "no_worker"
        if token_ok(request.headers.get, service.settings.api_token):  # paths, versions: not for all
            body["details"] = doctor.details()  # never waits: the latest report (informational only)
        return JSONResponse(body, status_code=200 if service.ready else 503)

    return router


def _model_name(service: TranscriptionService) -> str:
    if service.source is None:
        return service.settings.model
    return "demo (hand-set weights, not a real model)" if service.is_demo else service.source.name
