"""pipeline/web/early.py: the answers while the app is built, the hand-over, and a failed build
(issue 42: the HTTP server answers before torch and the UI are imported)."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from pipeline.web.early import EarlyApp


class Recorder:
    """An ASGI app that answers 200 ``real`` and records its lifespan messages."""

    def __init__(self, fail_startup: bool = False):
        self.events: list[str] = []
        self.fail_startup = fail_startup

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                self.events.append(message["type"])
                if message["type"] == "lifespan.startup":
                    if self.fail_startup:
                        await send({"type": "lifespan.startup.failed", "message": "no model"})
                        return
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"real"})


async def call(app, path: str, method: str = "GET", headers=(), kind: str = "http"):
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message):
        sent.append(message)

    await app({"type": kind, "path": path, "method": method, "headers": list(headers)}, receive, send)
    if kind == "websocket":
        return sent
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], dict(start["headers"]), body


class Lifespan:
    """Drive an app's lifespan as uvicorn does."""

    def __init__(self, app):
        self.inbox: asyncio.Queue = asyncio.Queue()
        self.outbox: asyncio.Queue = asyncio.Queue()
        self.task = asyncio.create_task(app({"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}},
                                            self.inbox.get, self.outbox.put))

    async def startup(self):
        await self.inbox.put({"type": "lifespan.startup"})
        return (await asyncio.wait_for(self.outbox.get(), 30))["type"]

    async def shutdown(self):
        await self.inbox.put({"type": "lifespan.shutdown"})
        answer = (await asyncio.wait_for(self.outbox.get(), 30))["type"]
        await asyncio.wait_for(self.task, 30)
        return answer


def test_answers_while_building_then_hands_every_request_to_the_app():
    async def main():
        release = threading.Event()
        real = Recorder()
        failures = []

        def build():
            assert release.wait(30)
            return real

        early = EarlyApp(build, failures.append, {"model": "demo", "demo": True})
        life = Lifespan(early)
        assert await life.startup() == "lifespan.startup.complete"  # at once: uvicorn binds now

        status, headers, body = await call(early, "/healthz")
        assert status == 200 and json.loads(body) == {"status": "ok"}
        status, headers, body = await call(early, "/readyz")
        assert status == 503 and json.loads(body) == {"ready": False, "state": "starting", "model": "demo",
                                                      "demo": True, "warm": False}
        assert headers[b"retry-after"] == b"2"
        status, headers, body = await call(early, "/api/jobs", "POST")
        assert status == 503 and json.loads(body)["error"]["code"] == "starting"
        status, headers, body = await call(early, "/ui/")
        assert status == 503 and headers[b"content-type"].startswith(b"text/html")
        assert b'http-equiv="refresh"' in body and b"starting" in body
        status, _, body = await call(early, "/ui/", "HEAD")
        assert status == 503 and body == b""
        closed = await call(early, "/api/stream", kind="websocket")
        assert closed == [{"type": "websocket.close", "code": 1013, "reason": "the server is starting"}]
        assert real.events == []  # the real app is not started before it is built

        release.set()
        await asyncio.wait_for(early.built.wait(), 30)
        assert real.events == ["lifespan.startup"] and early.state == "ready"
        assert await call(early, "/readyz") == (200, {}, b"real")
        assert await call(early, "/anything") == (200, {}, b"real")
        assert await life.shutdown() == "lifespan.shutdown.complete"
        assert real.events == ["lifespan.startup", "lifespan.shutdown"] and failures == []

    asyncio.run(main())


@pytest.mark.parametrize("how", ["build raises", "startup fails"])
def test_a_failed_start_is_reported_once_and_answered_as_failed(how):
    async def main():
        failures = []

        def build():
            if how == "build raises":
                raise RuntimeError("model file damaged")
            return Recorder(fail_startup=True)

        early = EarlyApp(build, failures.append)
        life = Lifespan(early)
        assert await life.startup() == "lifespan.startup.complete"
        for _ in range(300):
            if failures:
                break
            await asyncio.sleep(0.05)
        assert len(failures) == 1 and early.state == "failed" and early.app is None
        status, headers, body = await call(early, "/readyz")
        assert status == 503 and json.loads(body)["state"] == "failed" and b"retry-after" not in headers
        status, _, body = await call(early, "/healthz")
        assert status == 503  # the process is going down: a liveness probe says so
        status, _, body = await call(early, "/ui/")
        assert b"could not start" in body and b"refresh" not in body
        assert await life.shutdown() == "lifespan.shutdown.complete"

    asyncio.run(main())


def test_a_stop_while_building_waits_for_the_build_then_stops_the_app():
    async def main():
        release = threading.Event()
        real = Recorder()
        early = EarlyApp(lambda: release.wait(30) and real, lambda e: None)
        life = Lifespan(early)
        await life.startup()
        stopping = asyncio.create_task(life.shutdown())
        await asyncio.sleep(0.2)
        assert not stopping.done()
        release.set()
        assert await asyncio.wait_for(stopping, 30) == "lifespan.shutdown.complete"
        assert real.events == ["lifespan.startup", "lifespan.shutdown"]

    asyncio.run(main())


def test_nothing_of_the_request_is_echoed():
    """The starting answers are constant: a hostile path or header never reaches the page."""
    async def main():
        early = EarlyApp(lambda: threading.Event().wait(30), lambda e: None)
        status, _, body = await call(early, "/ui/<script>alert(1)</script>",
                                     headers=[(b"accept", b"text/html")])
        assert status == 503 and b"<script>" not in body and b"alert" not in body
        status, _, body = await call(early, "/x\r\nSet-Cookie: a=b")
        assert b"Set-Cookie" not in body

    asyncio.run(main())


def test_no_torch_import_to_choose_the_device_on_a_host_without_a_gpu_driver(monkeypatch):
    import pipeline.config as config
    import pipeline.web.processes as processes

    monkeypatch.setattr(config, "gpu_driver_present", lambda: False)
    monkeypatch.setitem(__import__("sys").modules, "torch", None)  # an import of torch would raise
    assert config.default_device() == "cpu"
    monkeypatch.setattr(processes, "gpu_driver_present", lambda: True)
    monkeypatch.setattr(processes.os, "cpu_count", lambda: 16)
    settings = config.Settings(data_dir="/nonexistent-not-created")
    assert processes.web_processes(settings) == processes.AUTO_ON_GPU  # decided without torch
    settings.engine.device = "cpu"
    assert processes.web_processes(settings) == 1
