"""The REST API of jobs: submit (``POST /api/jobs``), read (``GET /api/jobs/{id}``), the transcript
in an export format, the recording as uploaded. Thin: the intake accepts, the job view reads.

Handlers that decode or touch SQLite run in the thread pool, so the event loop never blocks."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, File, Form, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, JSONResponse, Response

from pipeline.domain.errors import AudioGone, InvalidOption, ResultNotReady
from pipeline.domain.tags import AUTO_LANGUAGE, REQUEST_LANGUAGES
from pipeline.domain.types import JobState, Lane, TranscribeOptions
from pipeline.web.auth import require_token, require_token_or_link
from pipeline.web.submit import submit_upload, wait_finished

if TYPE_CHECKING:
    from pipeline.serving.intake import Intake
    from pipeline.serving.job_view import JobView
    from pipeline.web.views import PollBodies

MAGIC_TYPES = ((b"RIFF", "audio/wav"), (b"fLaC", "audio/flac"), (b"OggS", "audio/ogg"),
               (b"ID3", "audio/mpeg"), (b"\xff\xfb", "audio/mpeg"), (b"\xff\xf3", "audio/mpeg"),
               (b"\x1aE\xdf\xa3", "video/webm"))


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


def build_jobs_router(settings, intake: Intake, view: JobView, bodies: PollBodies) -> APIRouter:
    router = APIRouter()
    auth = [Depends(require_token(settings.server.token))]
    auth_or_link = [Depends(require_token_or_link(settings.server.token))]

    @router.post("/api/jobs", status_code=202, dependencies=auth)
    async def create_job(
            request: Request,
            file: UploadFile = File(...),
            language: str = Form(AUTO_LANGUAGE, description=", ".join(REQUEST_LANGUAGES)),
            use_itn: bool = Form(True, description="punctuation and digits (inverse text "
                                 "normalisation)"),
            ban_emo_unk: bool = Form(False, description="never answer the EMO_UNKNOWN emotion"),
            split_channels: bool = Form(False, description="a stereo call: each channel is a "
                                        "speaker ('left', 'right')"),
            word_timestamps: bool = Form(False, description="each segment's words with their "
                                         "times (CTC-aligned); subtitles are cut at them"),
            languages: str = Form("", description="a language allow-list, e.g. 'zh,en': the "
                                  "language is detected only among these (empty: any)"),
            hotwords: str = Form("", description="words or phrases to favour, one a line "
                                 "('term' or 'term:weight', weight 0.1-10, default 2) or a JSON "
                                 "list; at most 1,000 (docs/API.md)"),
            redact: str = Form("", description="personal data masked before the result is "
                               "stored: 'pii' (all) or a comma list of card, phone, email, id, "
                               "digits"),
            redact_audio: str = Form("", description="the recording served back with those items "
                                     "'silence'd or 'beep'ed (alone: redact=pii)"),
            speakers: str = Form("", description="a mono recording's speakers: their count "
                                 "(1-16; each segment labelled 'Speaker 1', ...); empty or 0: off"),
            diarize: bool = Form(False, description="label a mono recording's speakers, their "
                                 "count found (within min_speakers..max_speakers)"),
            min_speakers: str = Form("", description="the fewest speakers a found count may be"),
            max_speakers: str = Form("", description="the most speakers a found count may be"),
            wait: str | None = Query(None, description="seconds to wait for the result: 200 with "
                                     "the finished job if it ends in time, else 202")):
        """Submit a recording: 202 with the job's id (poll GET /api/jobs/{id}); with ``?wait=``,
        200 and the finished job when it ends within that many seconds (capped at
        ``request_wait_s``). Reading and decoding run in the thread pool; the wait holds none."""
        timeout = wait_seconds(wait, settings.limits.request_wait_s)
        options = TranscribeOptions(language=language, use_itn=use_itn, ban_emo_unk=ban_emo_unk,
                                    split_channels=split_channels, word_timestamps=word_timestamps,
                                    languages=languages, hotwords=hotwords, redact=redact,
                                    redact_audio=redact_audio,
                                    speakers=speakers, diarize=diarize, min_speakers=min_speakers,
                                    max_speakers=max_speakers)
        job = await submit_upload(request, intake, file, options, Lane.BULK)
        headers = {"Location": f"/api/jobs/{job.id}"}
        if timeout is not None:
            job = await wait_finished(view, job.id, timeout)
            if job.state in (JobState.DONE, JobState.FAILED):
                return Response(bodies.body(job), media_type="application/json", headers=headers)
        return JSONResponse({"id": job.id, "status": job.state.value, "position": job.position},
                            status_code=202, headers=headers)

    @router.get("/api/jobs/{job_id}", dependencies=auth)
    async def get_job(job_id: str):
        # FastPolls answers jobs held in memory before they get here: this is a cold one (or an
        # unknown id), read from the broker in the thread pool
        job = await run_in_threadpool(view.get, job_id)
        return Response(bodies.body(job), media_type="application/json")

    @router.get("/api/jobs/{job_id}/result", dependencies=auth_or_link)
    def get_result(job_id: str, format: str = "json", tags: bool | None = None,
                   speaker: bool = True, tag_style: str = "prefix"):
        """The transcript as txt, json, srt or vtt (pipeline/domain/exports.py). ``tags``: show
        language/emotion/event tags (default: in txt yes, in srt/vtt no); ``tag_style=class``
        writes them as WebVTT classes instead of a prefix."""
        from pipeline.domain.exports import FORMATS, ExportOptions, export
        from pipeline.domain.review import Review

        if format not in FORMATS:
            raise InvalidOption(f"unknown format {format!r}; choose one of {', '.join(FORMATS)}")
        options = ExportOptions(tags=tags, speaker=speaker, tag_style=tag_style)
        job = view.get(job_id)
        if job.result is None:
            raise ResultNotReady(f"job {job_id} is {job.state.value}: no result yet"
                                 if job.state is not JobState.FAILED else
                                 f"job {job_id} failed: {job.error.message if job.error else ''}")
        body, media = export(job.result, format, options,
                             job_meta={"id": job.id, "audio_seconds": job.audio_seconds,
                                       "created_at": job.created_at, "finished_at": job.finished_at},
                             review=job.meta.get("review") or Review())  # as the job's JSON
        return Response(body, media_type=media, headers={
            "Content-Disposition": f'attachment; filename="transcript-{job.id}.{format}"'})

    @router.get("/api/jobs/{job_id}/audio", dependencies=auth_or_link)
    def get_audio(job_id: str):
        """The recording as uploaded, while it is retained (for the review player); a job that
        asked for ``redact_audio``: a WAV with the masked items' spans silenced or bleeped."""
        job = view.get(job_id)  # 404 / 410 first
        headers = {"Cache-Control": "private, max-age=3600", "X-Content-Type-Options": "nosniff"}
        path = view.upload(job_id)
        if job.options.redact_audio:
            limits = settings.limits
            return Response(view.masked_upload(job, limits.max_audio_seconds, limits.max_upload_bytes),
                            media_type="audio/wav", headers=headers)
        if isinstance(path, bytes):  # the upload lives in a shared broker, read by any api process
            return Response(path, media_type=media_type_of(path[:12]), headers=headers)
        if not path.exists():
            raise AudioGone(f"the audio of job {job_id} is no longer kept")
        return FileResponse(path, media_type=sniff_media_type(path), headers=headers)

    return router
