"""A finished job's retention, changed by a person (issue 40): deleted now, or kept longer.

* ``DELETE /api/jobs/{id}``: the job, its audio, its result and its review are removed from the
  store as retention removes them (pipeline/serving/ports.py ``JobRemoval.remove``); the id then
  answers like a purged job (410 ``job_purged``: the poll, the result, the audio, the review, the
  event stream), and this process's copies of it (the poll cache, the job view, a sibling's pushed
  body) are dropped through the same hooks a purge runs (``Runtime.on_purge``). 200
  ``{"id", "deleted": true}``.
* ``POST /api/jobs/{id}/keep``: the job is kept ``{"days": n}`` from now (default and at most
  ``limits.keep_max_days``), never less than its retention already keeps it. 200
  ``{"id", "expires_at"}`` (unix seconds).

Who may: whoever may edit the job's review: the API token, or the job's review link (the page's
and the desk's own, ``links.review``); a download link is 403 ``read_only_link``. A queued or
running job is refused with 409 ``job_not_finished`` (it is neither cancelled nor kept: wait for
its end, its events say when, then ask again); an unknown id 404, a purged one 410.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse

from pipeline.domain.errors import InvalidOption
from pipeline.web.auth import require_token_or_link
from pipeline.web.links import expiry
from pipeline.web.routes.calls import read_json

if TYPE_CHECKING:
    from pipeline.serving.job_view import JobView
    from pipeline.serving.ports import JobRemoval

logger = logging.getLogger("sensevoice.retention")

DAY_S = 86400.0
MAX_BODY_BYTES = 1024


def keep_days(body, cap_days: float) -> float:
    """The days a keep asks for: ``{"days": n}`` with 0 < n, at most ``cap_days``; the cap when
    the body is empty. A hostile value is a 400 naming it."""
    if body is None or body == {}:
        return cap_days
    if not isinstance(body, dict) or set(body) - {"days"}:
        raise InvalidOption('the body is {"days": number} (or empty: the longest keep)')
    days = body.get("days")
    if isinstance(days, bool) or not isinstance(days, (int, float)) or not math.isfinite(days) or days <= 0:
        raise InvalidOption(f"days must be a number > 0, not {str(days)[:40]!r}")
    return min(float(days), cap_days)


def build_retention_router(settings, view: JobView, store: JobRemoval,
                           forget: list[Callable[[Iterable[str]], None]]) -> APIRouter:
    """``forget``: what a purge runs with the ids it removed (``Runtime.on_purge``: the poll
    bodies, the job view's snapshots, the intake's, the siblings')."""
    router = APIRouter()
    cap_days = settings.limits.keep_max_days
    may_edit = [Depends(require_token_or_link(
        settings.server.token, ("review",),
        needs="deleting or keeping a job needs its review link (links.review of the page's view)"))]

    @router.delete("/api/jobs/{job_id}", dependencies=may_edit)
    async def delete_job(job_id: str):
        def remove() -> None:
            store.remove(job_id)
            for hook in forget:
                try:
                    hook([job_id])
                except Exception:  # the job is deleted in the store; a cache hook must not say otherwise
                    logger.exception("forgetting deleted job %s", job_id)

        await run_in_threadpool(remove)
        view.changes.notify(job_id)  # a follower of its events reads it again: gone
        logger.info("job %s deleted on request", job_id)
        return JSONResponse({"id": job_id, "deleted": True})

    @router.post("/api/jobs/{job_id}/keep", dependencies=may_edit)
    async def keep_job(job_id: str, request: Request):
        days = keep_days(await read_json(request, MAX_BODY_BYTES), cap_days)
        def keep() -> int:
            store.keep(job_id, time.time() + days * DAY_S)
            return expiry(view.get(job_id), settings.limits.retention_hours)  # (its retention if later)

        expires_at = await run_in_threadpool(keep)
        view.forget([job_id])  # its snapshot in memory says the old expiry: the next poll reads the store
        view.changes.notify(job_id)
        return JSONResponse({"id": job_id, "expires_at": expires_at})

    return router
