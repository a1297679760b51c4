"""The reviewer's desk over REST: a job's review, and the calls table.

* ``GET /api/jobs/{id}/review``: the job's review (``reviewed``, each changed segment's corrected
  text, flag and note) and the model's segment texts beside it.
* ``PATCH /api/jobs/{id}/review``: change it, ``{"reviewed": bool?, "segments": [{"index",
  "text"?, "flagged"?, "note"?}]}`` (``text: null`` goes back to the model's text). Only a finished
  job; the index is checked against its transcript; lengths are bounded (pipeline/domain/review.py).
  Access: the API token, or the job's review link (``links.review`` of the page's view: a
  review-scoped signed link, pipeline/web/links.py; the page holds that link, never the token); the
  job's download link reads the review (GET) but a PATCH with it is 403 ``read_only_link``;
  without a token, as open as the rest of the API (the job id is the secret). The review is
  stored with the job (both stores; deleted with it, pipeline/serving/calls_index.py) and the
  job's JSON, its events and its exports carry it.
* ``POST /api/calls``: the calls table. ``{"jobs": [{"id", "exp"?, "sig"?}, ...]}`` lists the jobs
  the caller holds (a browser sends the jobs it submitted, with their signed links when the server
  has a token: an id without a valid link is not listed), or ``{"all": true}`` every job of the
  server (needs the API token when one is set); ``"query"`` filters, sorts and pages
  (pipeline/domain/calls.py); ``"format": "csv"`` answers the whole filtered table as CSV.
  The work (checking the links, the store's query, the CSV) runs in a worker thread: a CSV of
  30,000 calls is about a second of CPU, which once ran on the event loop (a dozen at once stopped
  the server: issue 36). CSV exports are bounded per web process and per client address
  (``max_exports``, ``max_exports_per_client``: beyond them 503 ``too_many_exports`` / 429
  ``too_many_exports_from_client`` + Retry-After, :class:`ExportSlots`).
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import TYPE_CHECKING

import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response

from pipeline.domain.calls import CallsQuery, csv_chunks, run_query
from pipeline.domain.errors import ClientExportLimit, InvalidOption, TooManyExports, Unauthorized
from pipeline.domain.review import ReviewPatch, apply_patch
from pipeline.web.auth import require_token_or_link, token_ok
from pipeline.web.edge import scope_client_key
from pipeline.web.links import expiry, job_links, link_key, link_state
from pipeline.web.views import job_json

if TYPE_CHECKING:
    from pipeline.serving.ports import CallsIndex

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


class ExportSlots:
    """The CSV exports in progress, in all and per client address (only touched on the event
    loop: no lock). :meth:`hold` refuses at once beyond a limit (0 = none)."""

    def __init__(self, total: int, per_client: int, retry_after_s: int = 5):
        self.total, self.per_client, self.retry_after_s = total, per_client, retry_after_s
        self.in_flight = 0
        self.by_client: dict[str, int] = {}

    @contextmanager
    def hold(self, client: str | None):
        mine = self.by_client.get(client, 0) if client is not None else 0
        if self.per_client and client is not None and mine >= self.per_client:
            raise ClientExportLimit(
                f"this client already has {mine} CSV exports in progress, the most one client may "
                f"have; try again in {self.retry_after_s} s", retry_after=self.retry_after_s)
        if self.total and self.in_flight >= self.total:
            raise TooManyExports(
                f"{self.in_flight} CSV exports are being built, the most this server builds at "
                f"once; try again in {self.retry_after_s} s", retry_after=self.retry_after_s)
        self.in_flight += 1
        if client is not None:
            self.by_client[client] = mine + 1
        try:
            yield
        finally:
            self.in_flight -= 1
            if client is not None:
                n = self.by_client.get(client, 0) - 1
                if n > 0:
                    self.by_client[client] = n
                else:
                    self.by_client.pop(client, None)


def review_view(job) -> dict:
    review = job.meta.get("review")
    segments = job.result.segments if job.result else ()
    body = job_json(job)
    return {"id": job.id, "review": (review.to_dict() if review else None) or {
        "reviewed": False, "reviewed_at": None, "updated_at": None, "corrected": 0, "flagged": 0,
        "segments": []}, "model_texts": [s.text for s in segments], "result": body["result"]}


def build_calls_router(settings, view, calls: CallsIndex) -> APIRouter:
    """The routes over the job view (reads) and the store's calls index (reviews, listings)."""
    router = APIRouter()
    token = settings.server.token
    read_or_review = [Depends(require_token_or_link(token, ("read", "review")))]
    review_only = [Depends(require_token_or_link(
        token, ("review",), needs="changing a review needs its review link (links.review of the page's view)"))]
    limits = settings.limits
    exports = ExportSlots(limits.max_exports, limits.max_exports_per_client)

    @router.get("/api/jobs/{job_id}/review", dependencies=read_or_review)
    def get_review(job_id: str):
        return JSONResponse(review_view(view.get(job_id)))

    @router.patch("/api/jobs/{job_id}/review", dependencies=review_only)
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
        signed_in = token_ok(request.headers.get, token)  # (always, without a token)
        if body.get("all") is True:
            if not token_ok(request.headers.get, token):
                raise Unauthorized("listing every job of the server needs the API token "
                                   "(send 'Authorization: Bearer <token>')")
            entries = None
        else:
            entries = body.get("jobs") or []
        hours = limits.retention_hours

        def page_of():
            ids = None if entries is None else owned_ids(entries, token)
            return run_query(calls.rows(ids, search=query.q), query, paged=fmt == "json")

        def as_json() -> bytes:  # (the links: an HMAC each, 500 rows at most)
            page = page_of()
            rows = []
            for r in page.rows:
                d = r.to_dict()
                # the review link only to the token's holder: a download link must not lead to one
                d["links"] = job_links(r, token, hours, review=signed_in)
                d["expires_at"] = expiry(r, hours) if r.finished_at is not None else None  # (a keep: the job's JSON)
                rows.append(d)
            return orjson.dumps({"total": page.total, "page": page.page,
                                 "per_page": page.per_page, "rows": rows})

        def as_csv() -> bytes:
            return b"".join(c.encode("utf-8") for c in csv_chunks(page_of().rows))

        if fmt == "json":
            return Response(await run_in_threadpool(as_json), media_type="application/json")
        with exports.hold(scope_client_key(request.scope)):
            data = await run_in_threadpool(as_csv)
        return Response(data, media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": 'attachment; filename="calls.csv"'})

    return router
