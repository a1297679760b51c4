"""The HTTP server answers from its first second, before the app is built (issue 42).

Building the app imports torch (2-5 s), gradio and the UI (3-9 s) before a byte is served: a probe
or a visitor met a refused connection for that long. :class:`EarlyApp` is what uvicorn serves from
the start. Until the real app is built (in a thread: ``build``) and its lifespan has started, it
answers on its own, reading nothing of the request:

* ``/healthz`` 200 (the process is alive), ``/readyz`` 503 ``{"ready": false, "state": "starting",
  "model": ..., "demo": ..., "warm": false}`` -- the fields the app's own probe gives while it loads;
* a page (``/``, ``/ui``...) a short HTML page that reloads itself every 2 s, so a demo station
  opened before the server shows the UI as soon as it is there;
* anything else 503 ``starting`` with ``Retry-After``; a WebSocket is closed with 1013 (try again
  later).

Then every request goes to the real app, whose lifespan it runs (startup when built, shutdown when
the server stops). A build that fails calls ``failed`` (the entry point stops the server with the
error's exit status); until then the answers say ``failed``, not ``starting``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

logger = logging.getLogger("sensevoice.web.early")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict]]
Send = Callable[[dict], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

RETRY_AFTER_S = 2
PAGE = b"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta http-equiv="refresh" content="2">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>SenseVoice is starting</title></head>
<body style="font-family: system-ui, sans-serif; margin: 3rem; color: #333">
<h1>SenseVoice is starting&hellip;</h1>
<p>The speech model is loading. This page reloads by itself in a moment.</p>
</body></html>
"""
FAILED_PAGE = PAGE.replace(b"is starting&hellip;", b"could not start").replace(
    b"The speech model is loading. This page reloads by itself in a moment.",
    b"The server could not start; its log says why.").replace(
    b'<meta http-equiv="refresh" content="2">\n', b"")


class EarlyApp:
    """An ASGI app that answers while ``build`` runs in a thread, then hands everything to the app
    ``build`` returned. ``failed(exc)`` is called (on the event loop) when the build or the app's
    start-up raises."""

    def __init__(self, build: Callable[[], ASGIApp], failed: Callable[[BaseException], None],
                 probe: dict | None = None):
        self._build = build
        self._failed = failed
        self._probe = dict(probe or {})  # what /readyz says beside ready and state (model, demo)
        self.app: ASGIApp | None = None  # the real app, once its lifespan has started
        self.state = "starting"  # starting -> ready | failed
        self.built = asyncio.Event()  # (made on first use: see _lifespan)
        self._lifespan_in: asyncio.Queue | None = None
        self._lifespan_task: asyncio.Task | None = None
        self._shutdown_done: asyncio.Event | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        app = self.app
        if app is not None:
            await app(scope, receive, send)
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1013, "reason": "the server is starting"})
        elif scope["type"] == "http":
            await self._answer(scope, send)

    # -- while building ----------------------------------------------------------------------------

    async def _answer(self, scope: Scope, send: Send) -> None:
        path = scope.get("path", "")
        method = scope.get("method", "GET")
        failed = self.state == "failed"
        if path == "/healthz":
            status, body, kind = (503 if failed else 200), {"status": "failed" if failed else "ok"}, "json"
        elif path == "/readyz":
            status, body, kind = 503, {"ready": False, "state": self.state, **self._probe, "warm": False}, "json"
        elif method in ("GET", "HEAD") and _is_page(path, scope):
            status, body, kind = 503, FAILED_PAGE if failed else PAGE, "html"
        else:
            message = ("the server could not start; its log says why" if failed
                       else "the server is starting; try again in a few seconds")
            status, body, kind = 503, {"error": {"code": self.state, "message": message}}, "json"
        data = json.dumps(body).encode() if kind == "json" else body
        headers = [(b"content-type", b"application/json" if kind == "json" else b"text/html; charset=utf-8"),
                   (b"content-length", str(len(data)).encode()), (b"cache-control", b"no-store")]
        if status == 503 and not failed:
            headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else data})

    # -- lifespan: ours completes at once; the real app's starts once it is built --------------------

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        message = await receive()
        if message["type"] != "lifespan.startup":
            return
        builder = asyncio.create_task(self._build_and_start(), name="sensevoice-early-build")
        await send({"type": "lifespan.startup.complete"})
        message = await receive()  # lifespan.shutdown
        if not builder.done():  # a build in a thread cannot be interrupted: wait for it, then stop it
            logger.info("stopping while the app is still being built: waiting for the build")
        await asyncio.gather(builder, return_exceptions=True)
        await self._stop_app()
        await send({"type": "lifespan.shutdown.complete"})

    async def _build_and_start(self) -> None:
        try:
            app = await asyncio.to_thread(self._build)
            await self._start_app(app)
        except BaseException as e:  # noqa: BLE001 -- any failure of the build ends the server
            self.state = "failed"
            logger.error("start-up failed: %s", e)
            self._failed(e)
            if isinstance(e, (KeyboardInterrupt, SystemExit, asyncio.CancelledError)):
                raise
            return
        self.app = app
        self.state = "ready"
        self.built.set()

    async def _start_app(self, app: ASGIApp) -> None:
        inbox: asyncio.Queue = asyncio.Queue()
        started: asyncio.Future = asyncio.get_running_loop().create_future()
        self._shutdown_done = asyncio.Event()

        async def send(message: dict) -> None:
            kind = message["type"]
            if kind == "lifespan.startup.complete" and not started.done():
                started.set_result(None)
            elif kind == "lifespan.startup.failed" and not started.done():
                started.set_exception(RuntimeError(message.get("message") or "the app's start-up failed"))
            elif kind in ("lifespan.shutdown.complete", "lifespan.shutdown.failed"):
                self._shutdown_done.set()

        scope = {"type": "lifespan", "asgi": {"version": "3.0", "spec_version": "2.0"}, "state": {}}
        self._lifespan_in = inbox
        self._lifespan_task = asyncio.create_task(app(scope, inbox.get, send), name="sensevoice-app-lifespan")
        self._lifespan_task.add_done_callback(
            lambda t: started.done() or started.set_exception(
                t.exception() or RuntimeError("the app's lifespan ended before its start-up")))
        await inbox.put({"type": "lifespan.startup"})
        await started

    async def _stop_app(self) -> None:
        task, inbox = self._lifespan_task, self._lifespan_in
        if task is None or inbox is None or task.done():
            return
        await inbox.put({"type": "lifespan.shutdown"})
        await asyncio.wait([task, asyncio.ensure_future(self._shutdown_done.wait())],
                           return_when=asyncio.FIRST_COMPLETED)


def _is_page(path: str, scope: Scope) -> bool:
    """A browser's page request (the UI, the root, the desk), not an API or a file of the UI."""
    if path in ("/", "/ui", "/ui/", "/desk", "/desk/"):
        return True
    accept = dict(scope.get("headers") or ()).get(b"accept", b"")
    return path.startswith("/ui") and b"text/html" in accept

