"""Who may call: the API token (``Authorization: Bearer`` or ``X-API-Key``, compared in constant
time), or a signed link of one job (the UI's player and export links) of a scope the route takes
(pipeline/web/links.py: a download link reads, only a review link edits a review)."""

from __future__ import annotations

import hmac

from fastapi import Request

from pipeline.domain.errors import LinkExpired, ReadOnlyLink, Unauthorized
from pipeline.web.links import link_key, link_state


def token_ok(get_header, token: str) -> bool:
    """'Authorization: Bearer <token>' (or X-API-Key) matches ``token``; always true without one."""
    if not token:
        return True
    auth = get_header("authorization") or ""
    given = auth[7:] if auth.lower().startswith("bearer ") else get_header("x-api-key") or ""
    return hmac.compare_digest(given.encode(), token.encode())


def require_token(token: str):
    """A dependency: 'Authorization: Bearer <token>' (or X-API-Key) when a token is configured."""

    async def check(request: Request) -> None:  # no I/O: safe on the event loop
        if not token_ok(request.headers.get, token):
            raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer <token>')")

    return check


def require_token_or_link(token: str, scopes: tuple[str, ...] = ("read",)):
    """A dependency for a job's routes: the API token, or a signed link of that job of one of
    ``scopes`` that has not expired (``?exp=...&sig=...``, pipeline/web/links.py: the UI's player,
    export and review links, which a browser cannot give an Authorization header). A valid link of
    the read scope on a route that edits (a download link) is 403 ``read_only_link``."""
    keys = [link_key(token, s) for s in scopes]
    read_key = link_key(token) if "read" not in scopes else b""  # a route that edits

    async def check(request: Request, job_id: str) -> None:  # no I/O: safe on the event loop
        if token_ok(request.headers.get, token):
            return
        q = request.query_params
        exp, sig = q.get("exp"), q.get("sig")
        states = [link_state(key, job_id, exp, sig) for key in keys]
        if "valid" in states:
            return
        if "expired" in states:  # a link this server signed: not a guess, not a failed sign-in
            raise LinkExpired(f"this link to job {job_id} has expired (links last as long as the "
                              "job's retention); send the API token, or open the job from the UI "
                              "again for a new link")
        if read_key and link_state(read_key, job_id, exp, sig) != "invalid":
            raise ReadOnlyLink(f"this link to job {job_id} opens its downloads only; changing the "
                               "job needs its review link (links.review of the page's view) or the "
                               "API token (send 'Authorization: Bearer <token>')")
        raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer <token>'), "
                           "or an invalid signed link")

    return check
