"""Failed sign-ins cost the client: after ``limit`` failures in ``window_s`` a client address is
refused (429 ``too_many_auth_failures`` + Retry-After) until its window ends, the right token
included, so a password (``SENSEVOICE_UI_AUTH``) or a token cannot be guessed at the server's speed.

A failure is any answer 401 (a REST, OpenAI or event route without the right token, /docs), a
failed UI login (Gradio answers its ``/ui/login`` form with 400), or a live stream the route
refused for its token (it marks the scope: WebSocket refusals are frames, not statuses).
Successful requests cost nothing. Memory is one small entry per failing address, at most
``MAX_CLIENTS``, forgotten oldest first when its window ends or the table is full.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass

from pipeline.domain.errors import TooManyAuthFailures
from pipeline.web.edge import PROBE_PATHS, refuse, scope_client_key
from pipeline.web.ui_guard import UI_PATH

logger = logging.getLogger("sensevoice.auth")

LOGIN_PATHS = frozenset({UI_PATH + "/login", UI_PATH + "/login/"})
AUTH_FAILED = "sensevoice.auth_failed"  # scope key a route sets when it refuses a token itself
MAX_CLIENTS = 100_000  # failing addresses remembered before expired ones are swept


@dataclass
class _Window:
    started: float
    failures: int


class AuthFailures:
    """Failures per client address in fixed windows of ``window_s`` seconds."""

    def __init__(self, limit: int, window_s: float, clock=time.monotonic):
        self.limit, self.window_s, self.clock = limit, window_s, clock
        self._clients: OrderedDict[str, _Window] = OrderedDict()  # oldest window first

    def retry_after(self, key: str) -> float:
        """Seconds until ``key`` may try again (0: now)."""
        w = self._clients.get(key)
        if w is None or w.failures < self.limit:
            return 0.0
        left = w.started + self.window_s - self.clock()
        if left <= 0:
            del self._clients[key]
            return 0.0
        return left

    def failed(self, key: str) -> None:
        now = self.clock()
        w = self._clients.get(key)
        if w is None or now - w.started >= self.window_s:
            self._sweep(now)
            w = self._clients[key] = _Window(now, 0)
            self._clients.move_to_end(key)
        w.failures += 1
        if w.failures == self.limit:
            logger.warning("client %s: %d failed sign-ins in %.0f s; refused until the window ends",
                           key, w.failures, self.window_s)

    def _sweep(self, now: float) -> None:
        """Forget ended windows, and the oldest beyond MAX_CLIENTS: O(1) per failure (the table
        is in window order), whatever the number of addresses a guesser rotates through."""
        clients = self._clients
        while clients:
            key, w = next(iter(clients.items()))
            if now - w.started < self.window_s and len(clients) < MAX_CLIENTS:
                break
            del clients[key]


class AuthThrottle:
    """ASGI middleware (HTTP and WebSocket) in front of every route that checks a token."""

    def __init__(self, app, limit: int, window_s: float):
        self.app = app
        self.failures = AuthFailures(limit, window_s) if limit > 0 else None

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if self.failures is None or kind not in ("http", "websocket") or \
                scope["path"] in PROBE_PATHS:  # probes sign in to nothing
            return await self.app(scope, receive, send)
        key = scope_client_key(scope) or ""
        wait = self.failures.retry_after(key)
        if wait > 0:
            return await _refuse(scope, send, wait)
        login = kind == "http" and scope["path"] in LOGIN_PATHS
        failed = False

        async def watching_send(message):
            nonlocal failed
            if message["type"] == "http.response.start":
                status = message["status"]
                failed = status == 401 or (login and status == 400)
            await send(message)

        try:
            await self.app(scope, receive, watching_send)
        finally:
            if failed or scope.get(AUTH_FAILED):
                self.failures.failed(key)


async def _refuse(scope, send, wait: float) -> None:
    retry = max(1, round(wait))
    await refuse(scope, send, TooManyAuthFailures(
        f"too many failed sign-ins from this address; try again in {retry} s"),
        [(b"retry-after", str(retry).encode())])
