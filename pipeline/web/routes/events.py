"""Server push of one job: ``GET /api/jobs/{id}/events``, a Server-Sent Events stream (and the
site's ``/favicon.ico``).

The stream sends the job as an ``event: job`` whenever it changes (queued position, segmenting %,
pieces transcribed, done or failed) and ends after the final state, so the page shows a result the
moment the worker stores it: no poll interval between the worker and the screen. The service's
threads wake the job's producer through ``JobView.changes`` (pipeline/serving/job_events.py); a
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

import time

from pathlib import Path

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, StreamingResponse

from pipeline.domain.errors import SenseVoiceError
from pipeline.domain.types import Job, JobState
from pipeline.web.auth import require_token_or_link
from pipeline.web.edge import scope_client_key
from pipeline.web.event_fanout import EventFanout, follow
from pipeline.web.submit import read_job
from pipeline.web.views import FINAL, JobPages

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


def sse(event: str, data: dict) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def job_event(job: Job, pages: JobPages) -> bytes:
    """The job's ``event: job``, encoded once for all its subscribers. A result whose JSON is over
    ``EVENT_RESULT_MAX_BYTES`` is left out (``result: null``, ``result_omitted: true``): the page
    fetches it once from ``links.result`` instead of every subscriber receiving it."""
    view = pages.live_view(job)
    data = sse("job", view)
    if len(data) > EVENT_RESULT_MAX_BYTES and view.get("result") is not None:
        view["result"] = None
        view["result_omitted"] = True
        data = sse("job", view)
    return data


async def encode_job_event(job: Job, pages: JobPages) -> bytes:
    """:func:`job_event` off the event loop when the job has a result (a long recording's is
    hundreds of kB: building and encoding it is not one short loop step)."""
    if job.result is None:
        return job_event(job, pages)
    return await run_in_threadpool(job_event, job, pages)


def produce_job_events(pages: JobPages, job_id: str):
    """The producer of one job's channel (pipeline/web/event_fanout.py): it reads the job on each
    change notice (or its refresh interval) and publishes the event when it changed; a quiet
    channel ticks every KEEPALIVE_S. The job is read again as soon as the watch is taken: a change
    since the channel's first event is not missed."""

    async def produce(channel) -> None:
        deadline = time.monotonic() + STREAM_MAX_S
        view = pages.view
        with view.changes.watch(job_id) as watch:
            while time.monotonic() < deadline:
                watch.clear()
                try:
                    job = await read_job(view, job_id)
                except SenseVoiceError as e:  # purged while watched
                    channel.publish(sse("error", {"error": {"code": e.code, "message": e.message}}),
                                    final=True)
                    return
                data = await encode_job_event(job, pages)
                final = job.state in FINAL
                if data != channel.latest.data:
                    hold = channel.published_at + PROGRESS_INTERVAL_S - time.monotonic()
                    if not final and hold > 0:  # progress: at most every interval, the latest
                        await watch.wait(hold)  # (a notice: read again, a final goes out at once)
                        continue
                    channel.publish(data, final=final)
                if final:
                    return
                if not view.hears_every_change:  # workers in other processes notify nobody here
                    wait = BROKER_REFRESH_S
                elif job.state is JobState.QUEUED or pages.health.state != "ready":
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
    return EventFanout(settings.limits.max_event_streams_per_job, settings.limits.max_event_streams_per_client)


def build_events_router(pages: JobPages, fanout: EventFanout) -> APIRouter:
    router = APIRouter()
    # the page's own link (links.page), not a download link: the stream carries links.review
    auth_or_link = [Depends(require_token_or_link(
        pages.settings.server.token, ("page",),
        needs="a job's event stream needs the page's own link (links.page of its view)"))]

    @router.get("/api/jobs/{job_id}/events", dependencies=auth_or_link)
    async def job_events(job_id: str, request: Request):
        """Server-Sent Events of one job (``event: job``, data = the job JSON with ``stage``)
        until it is done or failed. 404 / 410 (JSON) for an unknown or purged job; 503
        event_streams_full / 429 too_many_event_streams_from_client beyond the limits."""
        client = scope_client_key(request.scope)
        fanout.check(job_id, client)  # over a limit: refused before any work
        channel = fanout.channels.get(job_id)
        if channel is None:  # the first subscriber builds the first event (unknown / purged: JSON)
            job = await read_job(pages.view, job_id)
            first = await encode_job_event(job, pages)
            channel = fanout.open(job_id, first, job.state in FINAL,
                                  produce_job_events(pages, job_id))
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

