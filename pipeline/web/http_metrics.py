"""HTTP request metrics: every answer counted by method, route template and status, timed, and an
error answer counted by the code of its JSON body (``HttpMetrics``, the app's outermost middleware)."""

from __future__ import annotations

from pipeline.domain.errors import SenseVoiceError


class HttpMetrics:
    """ASGI middleware: count each HTTP answer by method, route template (``/api/jobs/{job_id}``,
    never the raw path: job ids must not mint series) and status, time it, and count an error answer
    (>= 400) by the ``{"error": {"code": ...}}`` of its JSON body. The body passes through as it
    comes; only an error body's first ``MAX_ERROR_BODY`` bytes are kept to read the code."""

    MAX_ERROR_BODY = 16 * 1024
    MAX_REMEMBERED = 4096  # (method, path) pairs whose template is remembered; then forgotten at once

    def __init__(self, app, metrics, routes_of=None):
        self.app, self.metrics, self.routes_of = app, metrics, routes_of
        # matching a request against every route took ~10 % of the event loop's time under load
        # (the router then matches it again); a poll's path repeats every half second
        self._templates: dict[tuple[str, str], str] = {}
        self._routes_seen = -1  # the app's route count the remembered templates were read from

    def _template(self, scope) -> str:
        app = self.routes_of if self.routes_of is not None else scope.get("app")
        routes = getattr(getattr(app, "router", None), "routes", ())
        if len(routes) != self._routes_seen or len(self._templates) >= self.MAX_REMEMBERED:
            self._templates.clear()
            self._routes_seen = len(routes)
        key = (scope.get("method", ""), scope.get("path", ""))
        found = self._templates.get(key)
        if found is None:
            found = self._templates[key] = route_template(scope, self.routes_of)
        return found

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        import time

        t0, route = time.monotonic(), self._template(scope)
        answer = {"status": 0, "json": False, "body": bytearray(), "done": False}

        async def counted_send(message):
            if message["type"] == "http.response.start":
                answer["status"] = int(message["status"])
                ctype = dict(message.get("headers") or ()).get(b"content-type", b"")
                answer["json"] = b"json" in ctype
            elif message["type"] == "http.response.body" and not answer["done"]:
                body = answer["body"]
                if answer["status"] >= 400 and answer["json"] and len(body) < self.MAX_ERROR_BODY:
                    body += message.get("body", b"")[: self.MAX_ERROR_BODY - len(body)]
                if not message.get("more_body", False):
                    answer["done"] = True
                    self._record(scope, route, answer, t0)
            await send(message)

        try:
            await self.app(scope, receive, counted_send)
        except BaseException:
            if not answer["done"]:  # Starlette's outermost handler answers 500 for it
                answer.update(status=answer["status"] or 500, done=True)
                self._record(scope, route, answer, t0, default_code=SenseVoiceError.code)
            raise
        if not answer["done"] and answer["status"]:  # the client left before the body ended
            self._record(scope, route, answer, t0)

    def _record(self, scope, route, answer, t0, default_code=None):
        import time

        code = default_code
        if answer["status"] >= 400 and answer["body"]:
            code = error_code_of(bytes(answer["body"])) or code
        self.metrics.observe_http(scope.get("method", "GET"), route, answer["status"],
                                  time.monotonic() - t0, code)


def error_code_of(body: bytes) -> str | None:
    """The ``error.code`` of a JSON error body (ours, and the OpenAI-shaped one), else None."""
    import json

    try:
        error = json.loads(body).get("error")
    except (ValueError, AttributeError, UnicodeDecodeError):
        return None
    return error.get("code") if isinstance(error, dict) else None


def route_template(scope, app=None) -> str:
    """The template of the route that answers this request (``/api/jobs/{job_id}``); a mount (the
    UI) is its prefix plus ``{path:path}``; no route: ``unmatched``. Matched here, before the
    request runs, against the app's routes (and the routes of included routers)."""
    from pipeline.serving.metrics import UNMATCHED_ROUTE

    app = app if app is not None else scope.get("app")
    found = _match(getattr(getattr(app, "router", None), "routes", ()), scope)
    return found or UNMATCHED_ROUTE


def _match(routes, scope) -> str | None:
    from starlette.routing import Match, Mount

    partial = None
    for route in routes:
        try:
            match, _ = route.matches(scope)
        except Exception:  # a route that cannot judge this scope does not answer it
            continue
        if match is Match.NONE:
            continue
        included = getattr(route, "original_router", None)  # FastAPI's include_router wrapper
        if isinstance(route, Mount):
            template = route.path.rstrip("/") + "/{path:path}"
        elif included is not None:
            template = _match(getattr(included, "routes", ()), scope)
        else:
            template = getattr(route, "path_format", None) or getattr(route, "path", None)
        if template and match is Match.FULL:
            return template
        partial = partial or template  # the path matches, the method does not (405)
    return partial
