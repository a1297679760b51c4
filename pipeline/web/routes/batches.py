"""Many calls at once: ``POST /api/batches`` takes several files and/or zips of recordings (one
multipart field ``files``, repeated) and answers one job per recording.

Each file, and each entry of a zip (pipeline/audio/archive.py: capped in count and size, no nested
archives, names never used as paths), is submitted exactly as ``POST /api/jobs`` submits an upload
(same decoding rules, limits and errors). A recording that is refused does not sink the others:
the answer lists every recording in order, ``{"name", "id", "status", "links"}`` when accepted,
``{"name", "error": {"code", "message"}}`` when not (200; 400/413 only when the request or an
archive as a whole is refused). The whole request is one upload under the upload limits
(``max_upload_bytes`` in all).

A batch costs what its recordings cost, not what its body weighs (issue 36): its body takes an
upload slot whatever its size, its client may have ``max_batches_per_client`` batches in progress
(429 too_many_batches_from_client; pipeline/web/middleware.py), and once unpacked it holds one upload
slot per ``batch_recordings_per_slot`` recordings or per quarter of ``max_upload_bytes`` unpacked,
whichever is more (:func:`batch_weight`; 503/429 when the other uploads leave no room), until every
recording is submitted and the answer sent. The files are read and unpacked, and the recordings
submitted ``SUBMITS_AT_ONCE`` at a time, through the submit limiter that ``POST /api/jobs`` uses
(``submit_threads``), never the shared thread pool: polls, results and reviews are answered while a
batch is taken in.

Access: the API token; or, for the page, a signed-in UI session (the UI asks for a login whenever
a token is set); without either configured, open as the rest of the API. The jobs come back with
their signed links, which the page keeps as the jobs it owns (the calls table lists them).
"""

from __future__ import annotations

import asyncio
import logging
import math

from anyio import to_thread
from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.responses import JSONResponse

from pipeline.audio.archive import MAX_ENTRIES, ArchiveRefused, Entry, read_recordings
from pipeline.domain.errors import InvalidOption, SenseVoiceError, Unauthorized
from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.serving.records import storage_error
from pipeline.web.fast_submit import submit_bytes, submit_limiter
from pipeline.web.links import job_links
from pipeline.web.middleware import weigh_upload_slot
from pipeline.web.ui_guard import token_or_ui_login

logger = logging.getLogger("sensevoice.batches")

MAX_FILES = MAX_ENTRIES  # files in one request (the recordings of all its zips count too)
# one batch's recordings submitted at once: a few, so that a batch moves on while another request
# (or batch) gets its turn at the submit limiter's threads
SUBMITS_AT_ONCE = 2


def build_batches_router(settings, intake) -> APIRouter:
    router = APIRouter()

    @router.post("/api/batches")
    async def create_batch(
            request: Request,
            files: list[UploadFile] = File(..., description="recordings and/or zips of recordings"),
            language: str = Form("auto"), use_itn: bool = Form(True),
            split_channels: bool = Form(False), word_timestamps: bool = Form(False),
            hotwords: str = Form("", description="as POST /api/jobs: one list for every recording"),
            redact: str = Form("", description="as POST /api/jobs: 'pii' or a comma list of kinds"),
            redact_audio: str = Form("", description="as POST /api/jobs: 'silence' or 'beep'")):
        if not token_or_ui_login(request, settings.server.token):
            raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer <token>'), "
                               "or sign in to the UI")
        if len(files) > MAX_FILES:
            raise ArchiveRefused(f"{len(files)} files in one request; at most {MAX_FILES}")
        options = TranscribeOptions(language=language, use_itn=use_itn,
                                    split_channels=split_channels, word_timestamps=word_timestamps,
                                    hotwords=hotwords, redact=redact,
                                    redact_audio=redact_audio)
        limiter = submit_limiter(request.app.state, intake)
        cap = settings.limits.max_upload_bytes
        entries: list[Entry] = []
        for f in files:
            used = sum(len(e.data or b"") for e in entries)  # all zips: cap bytes unpacked in all
            entries += await to_thread.run_sync(_read_file, f, cap, MAX_FILES - len(entries),
                                                max(cap - used, 0), limiter=limiter)
            await f.close()
            if len(entries) > MAX_FILES:
                raise ArchiveRefused(f"more than {MAX_FILES} recordings in one request")
        if not entries:
            raise InvalidOption("no recording in this request (an empty archive?)")
        unpacked = sum(len(e.data or b"") for e in entries)
        weight = weigh_upload_slot(request, batch_weight(len(entries), unpacked, settings.limits))
        logger.debug("batch of %d recordings (%d bytes) holds %d upload slots", len(entries), unpacked,
                     weight)
        out = await _submit_all(request.app.state, settings, intake, entries, options)
        return JSONResponse({"jobs": out})  # (the upload slots are given back once this is sent)

    return router


def batch_weight(recordings: int, unpacked: int, limits) -> int:
    """The upload slots a batch holds until its recordings are submitted: one per
    ``batch_recordings_per_slot`` recordings or per quarter of ``max_upload_bytes`` unpacked,
    whichever is more, at least one (the middleware caps it: :func:`weigh_upload_slot`)."""
    by_count = math.ceil(recordings / max(limits.batch_recordings_per_slot, 1))
    by_bytes = math.ceil(unpacked / max(limits.max_upload_bytes // 4, 1))
    return max(1, by_count, by_bytes)


def _read_file(f: UploadFile, cap: int, max_entries: int, room: int) -> list[Entry]:
    """One file of the request: itself, or the recordings of a zip (in a worker thread)."""
    try:
        return read_recordings(f.file, f.filename or "", cap, max_entries, room)
    finally:
        f.file.close()  # the spooled copy goes: the bytes are what is kept


async def _submit_all(state, settings, intake, entries: list[Entry],
                      options: TranscribeOptions) -> list[dict]:
    """Each recording submitted as ``POST /api/jobs`` submits one (the same limiter), at most
    ``SUBMITS_AT_ONCE`` at a time; the answers in the entries' order. A recording's bytes are
    dropped once it is submitted."""
    token, hours = settings.server.token, settings.limits.retention_hours
    gate = asyncio.Semaphore(SUBMITS_AT_ONCE)

    async def one(i: int) -> dict:
        e = entries[i]
        if e.error is not None:
            return _refused(e.name, e.error)
        async with gate:
            try:
                job = await submit_bytes(state, intake, e.data, e.name, options, Lane.BULK)
            except SenseVoiceError as err:
                return _refused(e.name, err)
            except OSError as err:  # a write that failed below the store's checks: this one's error
                logger.error("I/O error while storing a batch's recording: %s", err)
                return _refused(e.name, storage_error(err))
            finally:
                entries[i] = Entry(e.name)
        return {"name": job.filename, "id": job.id, "status": job.state.value,
                "links": job_links(job, token, hours)}

    try:
        async with asyncio.TaskGroup() as group:
            tasks = [group.create_task(one(i)) for i in range(len(entries))]
    except BaseExceptionGroup as eg:  # an unexpected failure: the app's handlers see it, not a group
        raise eg.exceptions[0] from None
    return [t.result() for t in tasks]


def _refused(name: str, e: SenseVoiceError) -> dict:
    return {"name": name, "error": {"code": e.code, "message": e.message}}
