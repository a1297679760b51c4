"""Who may call: the API token (``Authorization: Bearer`` or ``X-API-Key``, compared in constant
time), or a signed link of one job (the UI's player and export links) of a scope the route takes
(pipeline/web/links.py: a download link reads, only a review link edits a review)."""

from __future__ import annotations

import hmac

from fastapi import Request

from pipeline.domain.errors import LinkExpired, ReadOnlyLink, Unauthorized
from pipeline.web.links import SCOPE_LABELS, link_key, link_state


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


def require_token_or_link(token: str, scopes: tuple[str, ...] = ("read",), needs: str = ""):
    """A dependency for a job's routes: the API token, or a signed link of that job of one of
    ``scopes`` that has not expired (``?exp=...&sig=...``, pipeline/web/links.py: the UI's player,
    export, page and review links, which a browser cannot give an Authorization header). A valid
    link of another scope (a download link on a route that edits, or on the page's own event
    stream) is 403 ``read_only_link``, saying what the route ``needs``; an expired link this server
    signed, of any scope, is 410 ``link_expired`` (not a guess: not a failed sign-in)."""
    keys = [link_key(token, s) for s in scopes]
    other_keys = [link_key(token, s) for s in SCOPE_LABELS if s not in scopes]
    needs = needs or "this route needs another of its links"

    async def check(request: Request, job_id: str) -> None:  # no I/O: safe on the event loop
        if token_ok(request.headers.get, token):
            return
        q = request.query_params
        exp, sig = q.get("exp"), q.get("sig")
        states = [link_state(key, job_id, exp, sig) for key in keys]
        if "valid" in states:
            return
        others = [link_state(key, job_id, exp, sig) for key in other_keys] if "expired" not in states else []
        if "expired" in states or "expired" in others:
            raise LinkExpired(f"this link to job {job_id} has expired (links last as long as the "
                              "job's retention); send the API token, or open the job from the UI "
                              "again for a new link")
        if "valid" in others:
            raise ReadOnlyLink(f"this link to job {job_id} does not open this route: {needs}, or the "
                               "API token (send 'Authorization: Bearer <token>')")
        raise Unauthorized("missing or wrong API token (send 'Authorization: Bearer <token>'), "
                           "or an invalid signed link")

    return check
