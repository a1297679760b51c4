"""Server push of one job: ``GET /api/jobs/{id}/events``, a Server-Sent Events stream (and the
site's ``/favicon.ico``).

The stream sends the job as an ``event: job`` whenever it changes (queued position, segmenting %,
pieces transcribed, done or failed) and ends after the final state, so the page shows a result the
moment the worker stores it: no poll interval between the worker and the screen. The service's
threads wake the job's producer through ``service.changes`` (pipeline/serving/job_events.py); a
queued job is read again every ``QUEUED_REFRESH_S`` for its place in the queue, and in the
distributed topology (workers in other processes notify nobody here) the broker is read every
``BROKER_REFRESH_S``. The REST poll (``GET /api/jobs/{id}``) stays as it is for API clients.

One producer per job, whatever the number of its subscribers (pipeline/web/event_fanout.py): each
change is read, built and encoded once and the same bytes go to every stream; progress goes out at
most every ``PROGRESS_INTERVAL_S``, the final state at once; a result over
``EVENT_RESULT_MAX_BYTES`` is left out of the final event (``result_omitted``: the page fetches it
once from ``links.result``). Streams are bounded per job and per client address (issue 19).

Each event's data is the REST job JSON plus what a screen needs to word the state honestly
(:func:`live_view`): ``stage`` (loading, queued, segmenting, transcribing, done, failed), the model's
state, ``percent`` (segmenting), ``pieces_done`` / ``pieces`` (transcribing a long recording), and
the job's signed player and download ``links``.

Access is that of the job's audio and result: the API token, or the job's own signed link
(``?exp=...&sig=...``, pipeline/web/links.py): a page holds that link, never the token. Without a
token the route is as open as the rest of the API (the job id, 122 random bits, is the secret).
"""

from __future__ import annotations

import re
import time
from dataclasses import replace
from pathlib import Path

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, StreamingResponse

from pipeline.domain.errors import SenseVoiceError
from pipeline.domain.types import Job, JobState
from pipeline.web.api import job_json, require_token_or_link
from pipeline.web.edge import scope_client_key
from pipeline.web.event_fanout import EventFanout, follow
from pipeline.web.links import expiry, job_links, link_key, sign

# static/ installed as pipeline/static, or beside the package in a checkout (as ui.py finds it)
FAVICON = next(p / "static" for p in Path(__file__).resolve().parents[2:4]
               if (p / "static").is_dir()) / "favicon.ico"
QUEUED_REFRESH_S = 0.5  # a queued job's place changes when other jobs start: read it this often
BROKER_REFRESH_S = 0.02  # distributed: how often the broker is read (as service.wait does)
KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing a quiet stream
STREAM_MAX_S = 600.0  # a stream ends after this; the page reconnects (bounded server state)
EVENT_RESULT_MAX_BYTES = 32 * 1024  # a larger result is fetched once by the page, not pushed
# progress (queue place, %, pieces) is published at most this often per job, the latest state
# then: each event is one write per subscriber (a 20-min recording's 312 pieces made hundreds of
# fan-outs to 1,200 subscribers); the final state goes out at once
PROGRESS_INTERVAL_S = 0.25
SEGMENTING = re.compile(r"^segmenting(?: (\d+)%)?$")
PIECES = re.compile(r"^segment (\d+) of (\d+)$")
FINAL = (JobState.DONE, JobState.FAILED, JobState.PURGED)


def stage_of(job: Job, model_state: str) -> dict:
    """The state a screen shows, from the job and the service's progress note."""
    progress = str(job.meta.get("progress") or "")
    out: dict = {"stage": job.state.value, "percent": None, "pieces_done": None, "pieces": None}
    if job.state in FINAL:
        return out
    seg = SEGMENTING.match(progress)
    pieces = PIECES.match(progress)
    if seg:
        out.update(stage="segmenting", percent=int(seg.group(1) or 0))
    elif pieces:  # a long recording's pieces: queued behind other work, or being transcribed
        out.update(pieces_done=int(pieces.group(1)), pieces=int(pieces.group(2)))
        waiting = job.state is JobState.QUEUED and (job.position or 0) > 1
        out["stage"] = "queued" if waiting else "transcribing"
    elif job.state is JobState.RUNNING:
        out["stage"] = "transcribing"
    if out["stage"] == "queued" and model_state in ("starting", "loading"):
        out["stage"] = "loading"
    return out


def page_query(job: Job, token: str, retention_hours: float) -> str:
    """``exp=...&sig=...`` for the page's own URL (``?job=ID&exp=...&sig=...``: a reload follows
    the job again), empty without a token. Until the job ends it expires a retention period after
    the job was accepted (a fixed value: the view does not change on every read); then as the
    job's other links do, when its retention ends."""
    key = link_key(token)
    if not key:
        return ""
    if job.finished_at is not None:
        exp = expiry(job, retention_hours)
    else:
        exp = expiry(replace(job, finished_at=job.created_at), retention_hours)
    return f"exp={exp}&sig={sign(key, job.id, exp)}"


def live_view(job: Job, service) -> dict:
    """The job as the page shows it: the REST JSON, its stage, the model state, signed links."""
    settings = service.settings
    body = job_json(job)
    body.update(stage_of(job, service.state))
    body["model"] = service.state
    # the player and download links once there is something to play or download (their expiry
    # counts from the job's end)
    body["links"] = (job_links(job, settings.api_token, settings.retention_hours)
                     if job.state in FINAL else {})
    query = page_query(job, settings.api_token, settings.retention_hours)
    body["links"]["events"] = f"/api/jobs/{job.id}/events" + (f"?{query}" if query else "")
    body["links"]["page"] = query
    return body


async def read_job(service, job_id: str) -> Job:
    """The job without blocking the loop: memory, the async broker read, else the thread pool."""
    job = await service.poll(job_id)
    if job is None:
        job = await run_in_threadpool(service.get, job_id)
    return job


def sse(event: str, data: dict) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def job_event(job: Job, service) -> bytes:
    """The job's ``event: job``, encoded once for all its subscribers. A result whose JSON is over
    ``EVENT_RESULT_MAX_BYTES`` is left out (``result: null``, ``result_omitted: true``): the page
    fetches it once from ``links.result`` instead of every subscriber receiving it."""
    view = live_view(job, service)
    data = sse("job", view)
    if len(data) > EVENT_RESULT_MAX_BYTES and view.get("result") is not None:
        view["result"] = None
        view["result_omitted"] = True
        data = sse("job", view)
    return data


async def encode_job_event(job: Job, service) -> bytes:
    """:func:`job_event` off the event loop when the job has a result (a long recording's is
    hundreds of kB: building and encoding it is not one short loop step)."""
    if job.result is None:
        return job_event(job, service)
    return await run_in_threadpool(job_event, job, service)


def produce_job_events(service, job_id: str):
    """The producer of one job's channel (pipeline/web/event_fanout.py): it reads the job on each
    change notice (or its refresh interval) and publishes the event when it changed; a quiet
    channel ticks every KEEPALIVE_S. The job is read again as soon as the watch is taken: a change
    since the channel's first event is not missed."""

    async def produce(channel) -> None:
        deadline = time.monotonic() + STREAM_MAX_S
        with service.changes.watch(job_id) as watch:
            while time.monotonic() < deadline:
                watch.clear()
                try:
                    job = await read_job(service, job_id)
                except SenseVoiceError as e:  # purged while watched
                    channel.publish(sse("error", {"error": {"code": e.code, "message": e.message}}),
                                    final=True)
                    return
                data = await encode_job_event(job, service)
                final = job.state in FINAL
                if data != channel.latest.data:
                    hold = channel.published_at + PROGRESS_INTERVAL_S - time.monotonic()
                    if not final and hold > 0:  # progress: at most every interval, the latest
                        await watch.wait(hold)  # (a notice: read again, a final goes out at once)
                        continue
                    channel.publish(data, final=final)
                if final:
                    return
                if service.distributed:
                    wait = BROKER_REFRESH_S
                elif job.state is JobState.QUEUED or service.state != "ready":
                    wait = QUEUED_REFRESH_S
                else:
                    wait = KEEPALIVE_S
                await watch.wait(min(wait, max(0.0, channel.last_sent + KEEPALIVE_S - time.monotonic())))
                if time.monotonic() - channel.last_sent >= KEEPALIVE_S:
                    channel.tick()

    return produce


async def job_stream(fanout: EventFanout, channel, client: str | None):
    """One subscriber's bytes; its place in the channel is given back however the stream ends
    (see :func:`started`)."""
    try:
        async for chunk in follow(channel, time.monotonic() + STREAM_MAX_S):
            yield chunk
    finally:
        fanout.leave(channel, client)


async def started(stream):
    """``stream`` advanced to its first chunk, then the rest. Starlette never closes a body
    iterator: one that a client left before it began would never run its ``finally`` (the
    subscriber's place would stay counted); once begun, the loop's async-generator finalizer
    closes it when it is dropped."""
    first = await stream.__anext__()

    async def chunks():
        yield first
        async for chunk in stream:
            yield chunk

    return chunks()


def event_fanout(settings) -> EventFanout:
    return EventFanout(settings.max_event_streams_per_job, settings.max_event_streams_per_client)


def build_events_router(service, fanout: EventFanout) -> APIRouter:
    router = APIRouter()
    auth_or_link = [Depends(require_token_or_link(service.settings.api_token))]

    @router.get("/api/jobs/{job_id}/events", dependencies=auth_or_link)
    async def job_events(job_id: str, request: Request):
        """Server-Sent Events of one job (``event: job``, data = the job JSON with ``stage``)
        until it is done or failed. 404 / 410 (JSON) for an unknown or purged job; 503
        event_streams_full / 429 too_many_event_streams_from_client beyond the limits."""
        client = scope_client_key(request.scope)
        fanout.check(job_id, client)  # over a limit: refused before any work
        channel = fanout.channels.get(job_id)
        if channel is None:  # the first subscriber builds the first event (unknown / purged: JSON)
            job = await read_job(service, job_id)
            first = await encode_job_event(job, service)
            channel = fanout.open(job_id, first, job.state in FINAL,
                                  produce_job_events(service, job_id))
        fanout.join(channel, client)
        body = await started(job_stream(fanout, channel, client))
        return StreamingResponse(body, media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no",
                                          "X-Content-Type-Options": "nosniff"})

    @router.get("/favicon.ico", include_in_schema=False)
    async def favicon():
        return FileResponse(FAVICON, media_type="image/x-icon",
                            headers={"Cache-Control": "public, max-age=86400"})

    return router

