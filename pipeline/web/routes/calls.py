"""The reviewer's desk over REST: a job's review, and the calls table.

* ``GET /api/jobs/{id}/review``: the job's review (``reviewed``, each changed segment's corrected
  text, flag and note) and the model's segment texts beside it.
* ``PATCH /api/jobs/{id}/review``: change it, ``{"reviewed": bool?, "segments": [{"index",
  "text"?, "flagged"?, "note"?}]}`` (``text: null`` goes back to the model's text). Only a finished
  job; the index is checked against its transcript; lengths are bounded (pipeline/domain/review.py).
  Access is that of the job's result: the API token, or the job's own signed link (the page holds
  that link, never the token); without a token, as open as the rest of the API (the job id is the
  secret). The review is stored with the job (both stores; deleted with it, pipeline/serving/
  calls_index.py) and the job's JSON, its events and its exports carry it.
* ``POST /api/calls``: the calls table. ``{"jobs": [{"id", "exp"?, "sig"?}, ...]}`` lists the jobs
  the caller holds (a browser sends the jobs it submitted, with their signed links when the server
  has a token: an id without a valid link is not listed), or ``{"all": true}`` every job of the
  server (needs the API token when one is set); ``"query"`` filters, sorts and pages
  (pipeline/domain/calls.py); ``"format": "csv"`` answers the whole filtered table as CSV.
"""

from __future__ import annotations

import logging

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from pipeline.domain.calls import CallsQuery, run_query, to_csv
from pipeline.domain.errors import InvalidOption, Unauthorized
from pipeline.domain.review import ReviewPatch, apply_patch
from pipeline.serving.calls_index import calls_of
from pipeline.web.auth import require_token_or_link, token_ok
from pipeline.web.links import job_links, link_key, link_state
from pipeline.web.views import job_json

logger = logging.getLogger("sensevoice.calls")

MAX_BODY_BYTES = 4 * 1024 * 1024  # a calls request naming 20,000 jobs with their links is ~2.4 MB
MAX_JOBS = 20_000  # jobs one request may name
MAX_ID_CHARS = 64


async def read_json(request: Request, limit: int = MAX_BODY_BYTES):
    """The request's JSON body, at most ``limit`` bytes (400 when larger or not JSON)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise InvalidOption(f"the request body is larger than {limit} bytes")
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise InvalidOption(f"the request body is larger than {limit} bytes")
    try:
        return orjson.loads(bytes(body) or b"null")
    except orjson.JSONDecodeError:
        raise InvalidOption("the request body is not valid JSON") from None


def owned_ids(entries, token: str) -> list[str]:
    """The ids of ``entries`` the caller may list: all of them without a server token; with one,
    those whose signed link (``exp``, ``sig``) is valid."""
    if not isinstance(entries, list):
        raise InvalidOption('"jobs" must be a list of {"id", "exp", "sig"}')
    if len(entries) > MAX_JOBS:
        raise InvalidOption(f"{len(entries)} jobs named; at most {MAX_JOBS} in one request")
    key = link_key(token)
    out = []
    for e in entries:
        if not isinstance(e, dict) or not isinstance(e.get("id"), str) or len(e["id"]) > MAX_ID_CHARS:
            raise InvalidOption('each of "jobs" is {"id": string, "exp": string?, "sig": string?}')
        if key:
            exp, sig = e.get("exp"), e.get("sig")
            if not (isinstance(exp, (str, int)) and isinstance(sig, str)):
                continue
            if link_state(key, e["id"], str(exp), sig) != "valid":
                continue
        out.append(e["id"])
    return list(dict.fromkeys(out))


def review_view(job) -> dict:
    review = job.meta.get("review")
    segments = job.result.segments if job.result else ()
    body = job_json(job)
    return {"id": job.id, "review": (review.to_dict() if review else None) or {
        "reviewed": False, "reviewed_at": None, "updated_at": None, "corrected": 0, "flagged": 0,
        "segments": []}, "model_texts": [s.text for s in segments], "result": body["result"]}


def build_calls_router(settings, view, broker) -> APIRouter:
    """The routes over the job view (reads) and the broker's calls index (reviews, listings)."""
    router = APIRouter()
    token = settings.server.token
    auth_or_link = [Depends(require_token_or_link(token))]
    calls = calls_of(broker)

    @router.get("/api/jobs/{job_id}/review", dependencies=auth_or_link)
    def get_review(job_id: str):
        return JSONResponse(review_view(view.get(job_id)))

    @router.patch("/api/jobs/{job_id}/review", dependencies=auth_or_link)
    async def patch_review(job_id: str, request: Request):
        patch = ReviewPatch.from_json(await read_json(request, 1024 * 1024))

        def write():
            job, _ = calls.update_review(
                job_id, lambda old, job: apply_patch(old, patch, job.result))
            return review_view(job)

        return JSONResponse(await run_in_threadpool(write))

    @router.post("/api/calls")
    async def list_calls(request: Request):
        body = await read_json(request)
        if not isinstance(body, dict):
            raise InvalidOption("the body must be a JSON object")
        unknown = set(body) - {"jobs", "all", "query", "format"}
        if unknown:
            raise InvalidOption(f"unknown field(s): {', '.join(sorted(map(str, unknown)))[:200]}")
        fmt = body.get("format", "json")
        if fmt not in ("json", "csv"):
            raise InvalidOption("format is 'json' or 'csv'")
        query = CallsQuery.from_json(body.get("query"))
        if body.get("all") is True:
            if not token_ok(request.headers.get, token):
                raise Unauthorized("listing every job of the server needs the API token "
                                   "(send 'Authorization: Bearer <token>')")
            ids = None
        else:
            ids = owned_ids(body.get("jobs") or [], token)

        def work():
            rows = calls.rows(ids, search=query.q)
            return run_query(rows, query, paged=fmt == "json")

        page = await run_in_threadpool(work)
        if fmt == "csv":
            return Response(to_csv(page.rows).encode("utf-8"), media_type="text/csv; charset=utf-8",
                            headers={"Content-Disposition": 'attachment; filename="calls.csv"'})
        hours = settings.limits.retention_hours
        rows = []
        for r in page.rows:
            d = r.to_dict()
            d["links"] = job_links(r, token, hours)
            rows.append(d)
        return Response(orjson.dumps({"total": page.total, "page": page.page,
                                      "per_page": page.per_page, "rows": rows}),
                        media_type="application/json")

    return router
