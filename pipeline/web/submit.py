"""A request's way through the api side: read its upload and submit it (in the thread pool), then
read or wait for its job on the event loop without holding a thread (REST and OpenAI routes)."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from anyio import to_thread

from fastapi import Request, UploadFile
from fastapi.concurrency import run_in_threadpool

from pipeline.audio.decode import read_upload
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from pipeline.web.fast_submit import submit_limiter
from pipeline.web.middleware import release_upload_slot

if TYPE_CHECKING:
    from pipeline.serving.intake import Intake
    from pipeline.serving.job_view import JobView

FINAL_STATES = (JobState.DONE, JobState.FAILED, JobState.PURGED)


async def submit_upload(request: Request, intake: Intake, file: UploadFile,
                        options: TranscribeOptions, lane: Lane) -> Job:
    """Read an upload and submit its job (in one trip to the thread pool: each trip is a thread
    hand-off under the GIL), then drop the upload (its spooled copy and the bytes) and give back
    its upload slot: a request that waits for its job afterwards (``?wait=``,
    /v1/audio/transcriptions) holds no slot, no memory and no thread."""
    def read_and_submit() -> Job:
        data = read_upload(file.file, intake.settings.limits.max_upload_bytes)
        file.file.close()  # the spooled copy goes before decoding: the bytes are what is kept
        return intake.submit(data, filename=file.filename or "", options=options, lane=lane)

    try:
        job = await to_thread.run_sync(read_and_submit, limiter=submit_limiter(request.app.state, intake))
    finally:
        await file.close()
    release_upload_slot(request)
    return job


async def read_job(view: JobView, job_id: str) -> Job:
    """The job without blocking the loop: memory, the async broker read, else the thread pool."""
    job = await view.poll(job_id)
    if job is None:
        job = await run_in_threadpool(view.get, job_id)
    return job


async def wait_finished(view: JobView, job_id: str, timeout_s: float) -> Job:
    """The job once it is done or failed, else as it is after ``timeout_s``. On the event loop,
    holding no thread: woken by the view's change notices (``view.changes``), reading the
    in-memory snapshot (or the broker's async client; SQLite in the thread pool for a cold job)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    with view.changes.watch(job_id) as watch:
        while True:
            watch.clear()  # before the read: a notice that comes after it wakes the wait below
            job = await read_job(view, job_id)
            left = deadline - loop.time()
            if job.state in FINAL_STATES or left <= 0:
                return job
            await watch.wait(min(left, view.reread_s))
