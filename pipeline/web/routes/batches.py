"""Many calls at once: ``POST /api/batches`` takes several files and/or zips of recordings (one
multipart field ``files``, repeated) and answers one job per recording.

Each file, and each entry of a zip (pipeline/audio/archive.py: capped in count and size, no nested
archives, names never used as paths), is submitted exactly as ``POST /api/jobs`` submits an upload
(same decoding rules, limits and errors). A recording that is refused does not sink the others:
the answer lists every recording in order, ``{"name", "id", "status", "links"}`` when accepted,
``{"name", "error": {"code", "message"}}`` when not (200; 400/413 only when the request or an
archive as a whole is refused). The whole request is one upload under the upload limits
(``max_upload_bytes`` in all).

Access: the API token; or, for the page, a signed-in UI session (the UI asks for a login whenever
a token is set); without either configured, open as the rest of the API. The jobs come back with
their signed links, which the page keeps as the jobs it owns (the calls table lists them).
"""

from __future__ import annotations

import logging

from fastapi import APIRouter, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from pipeline.audio.archive import MAX_ENTRIES, ArchiveRefused, Entry, is_zip, read_zip
from pipeline.audio.decode import read_upload
from pipeline.domain.errors import InvalidOption, SenseVoiceError, Unauthorized
from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.web.auth import token_ok
from pipeline.web.links import job_links
from pipeline.web.middleware import release_upload_slot

logger = logging.getLogger("sensevoice.batches")

MAX_FILES = MAX_ENTRIES  # files in one request (the recordings of all its zips count too)


def _may_submit(request: Request, token: str) -> bool:
    if token_ok(request.headers.get, token):
        return True
    from pipeline.web.ui_guard import signed_in

    gradio_app = getattr(request.app.state, "gradio_app", None)
    return (gradio_app is not None and getattr(gradio_app, "auth", None) is not None
            and signed_in(gradio_app, request.scope))


def build_batches_router(settings, intake) -> APIRouter:
    router = APIRouter()

    @router.post("/api/batches")
    async def create_batch(
            request: Request,
            files: list[UploadFile] = File(..., description="recordings and/or zips of recordings"),
            language: str = Form("auto"), use_itn: bool = Form(True),
            split_channels: bool = Form(False), word_timestamps: bool = Form(False)):
        if not _may_submit(request, settings.server.token):
            raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer <token>'), "
                               "or sign in to the UI")
        if len(files) > MAX_FILES:
            raise ArchiveRefused(f"{len(files)} files in one request; at most {MAX_FILES}")
        options = TranscribeOptions(language=language, use_itn=use_itn,
                                    split_channels=split_channels, word_timestamps=word_timestamps)
        cap = settings.limits.max_upload_bytes
        entries: list[Entry] = []
        for f in files:
            data = await run_in_threadpool(read_upload, f.file, cap)
            name = f.filename or ""
            await f.close()
            if is_zip(data[:4]):  # the recordings of all zips: cap bytes unpacked in all
                used = sum(len(e.data or b"") for e in entries)
                entries += await run_in_threadpool(read_zip, data, MAX_FILES - len(entries),
                                                   cap, max(cap - used, 0))
            else:
                entries.append(Entry(name, data=data))
            if len(entries) > MAX_FILES:
                raise ArchiveRefused(f"more than {MAX_FILES} recordings in one request")
        release_upload_slot(request)  # the bytes are in memory; decoding holds no upload slot
        out = await run_in_threadpool(_submit_all, settings, intake, entries, options)
        if not out:
            raise InvalidOption("no recording in this request (an empty archive?)")
        return JSONResponse({"jobs": out})

    return router


def _submit_all(settings, intake, entries: list[Entry], options: TranscribeOptions) -> list[dict]:
    token, hours = settings.server.token, settings.limits.retention_hours
    out = []
    for e in entries:
        if e.error is not None:
            out.append({"name": e.name, "error": {"code": e.error.code, "message": e.error.message}})
            continue
        try:
            job = intake.submit(e.data, filename=e.name, options=options, lane=Lane.BULK)
        except SenseVoiceError as err:
            out.append({"name": e.name, "error": {"code": err.code, "message": err.message}})
            continue
        out.append({"name": job.filename, "id": job.id, "status": job.state.value,
                    "links": job_links(job, token, hours)})
    return out
