"""Signed per-job links: how the UI's review player and export links reach the REST API when an
API token is set (a browser cannot add an Authorization header to <audio src> or <a href>).

A link carries ``exp`` (unix seconds, when the job's retention ends) and ``sig`` = base64url of
HMAC-SHA256(key, "<job id>\\n<exp>"), where ``key`` = HMAC-SHA256(API token, the scope's label): the
token itself never leaves the server, and a changed token voids every link. A link has a scope:

* ``read`` (the audio and result links, the ones that travel): opens only that job's GET
  ``/api/jobs/{id}/audio``, ``/result`` and ``/review`` (pipeline/web/routes/jobs.py, calls.py),
  until ``exp``;
* ``page`` (``links.page``, the page's own URL ``?job=ID&exp=..&sig=..``): opens that job's event
  stream (``/events``), which carries the page's view with its review link -- so a download link
  never leads to the review link;
* ``review`` (``links.review``, given with the page's view of a finished job): opens that job's
  ``/review``, GET and PATCH. A download link that travels (a mail, a ticket, a proxy's log) never
  edits a review: PATCH with a read link is 403 ``read_only_link``.

The scopes have different keys, so a signature of one scope is never valid in another. Without a
token the links are the plain routes (which are then open anyway).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import math
import time
from urllib.parse import quote

KEY_LABEL = b"sensevoice/ui-job-links/v1"  # the read scope's (the first links had only it)
SCOPE_LABELS = {"read": KEY_LABEL, "review": b"sensevoice/ui-review-links/v1",
                "page": b"sensevoice/ui-page-links/v1"}
MAX_SIG_CHARS = 64  # a real one is 43; longer input is refused before any hashing


def link_key(token: str, scope: str = "read") -> bytes:
    """The signing key of ``scope``'s links derived from the API token (empty without one: nothing
    is signed)."""
    if not token:
        return b""
    return hmac.new(token.encode(), SCOPE_LABELS[scope], hashlib.sha256).digest()


def sign(key: bytes, job_id: str, exp: int) -> str:
    mac = hmac.new(key, f"{job_id}\n{int(exp)}".encode(), hashlib.sha256).digest()
    return base64.urlsafe_b64encode(mac).rstrip(b"=").decode("ascii")


def link_state(key: bytes, job_id: str, exp: str | None, sig: str | None,
               now: float | None = None) -> str:
    """'valid'; 'expired' when ``sig`` is this server's signature of (job_id, exp) but ``exp`` has
    passed (a link the server really gave out: not a guess, so the sign-in throttle does not count
    it); else 'invalid'."""
    if not key or not exp or not sig or len(sig) > MAX_SIG_CHARS or len(exp) > 12:
        return "invalid"
    if not exp.isdigit():
        return "invalid"
    if not hmac.compare_digest(sign(key, job_id, int(exp)).encode(), sig.encode("utf-8", "replace")):
        return "invalid"
    return "expired" if int(exp) < (time.time() if now is None else now) else "valid"


def verify(key: bytes, job_id: str, exp: str | None, sig: str | None,
           now: float | None = None) -> bool:
    """True when ``sig`` signs (job_id, exp) under ``key`` and ``exp`` has not passed."""
    return link_state(key, job_id, exp, sig, now) == "valid"


def expiry(job, retention_hours: float, now: float | None = None) -> int:
    """When the job's retention ends (its audio and result are purged then anyway), or its keep
    when later (``meta["kept_until"]``, POST /api/jobs/{id}/keep)."""
    finished = job.finished_at if job.finished_at is not None else (time.time() if now is None else now)
    meta = getattr(job, "meta", None)  # a Job's, or a calls row's own field
    kept = (meta.get("kept_until") if meta else getattr(job, "kept_until", None)) or 0.0
    return int(math.ceil(max(finished + max(retention_hours, 0.0) * 3600, kept)))


def job_links(job, token: str, retention_hours: float, now: float | None = None,
              review: bool = False) -> dict:
    """The audio and result URLs of ``job`` for the UI (signed when a token is set). The result
    URL takes ``&format=...`` (and the other export options) appended. With ``review``, also the
    URL that reads and edits its review (``links.review``, a review-scoped link): only for those
    who may edit it (the page's own view, the token's holder)."""
    base = f"/api/jobs/{quote(job.id, safe='')}"
    key = link_key(token)
    if not key:
        links = {"audio": base + "/audio", "result": base + "/result"}
        return {**links, "review": base + "/review"} if review else links
    exp = expiry(job, retention_hours, now)
    query = f"?exp={exp}&sig={sign(key, job.id, exp)}"
    links = {"audio": base + "/audio" + query, "result": base + "/result" + query}
    if review:
        links["review"] = f"{base}/review?exp={exp}&sig={sign(link_key(token, 'review'), job.id, exp)}"
    return links


LIVE_SUBJECT = "live"  # what a live link signs (job ids are UUIDs: a job's link never opens a stream)
LIVE_LINK_TTL_S = 3600  # seconds a live link from live_query stays valid


def live_query(token: str, now: float | None = None, ttl_s: int = LIVE_LINK_TTL_S) -> str:
    """``exp=...&sig=...`` that opens live streams for ``ttl_s`` without the token (for a page
    of this server's UI, which never holds the token); empty without a token."""
    key = link_key(token)
    if not key:
        return ""
    exp = int((time.time() if now is None else now) + ttl_s)
    return f"exp={exp}&sig={sign(key, LIVE_SUBJECT, exp)}"
