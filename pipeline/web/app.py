"""The FastAPI app of one process: health probes always; the REST API, the Gradio UI and the
request guards when the process serves the api role (``create_app``)."""

from __future__ import annotations

import gc
import logging
import os
from contextlib import asynccontextmanager

from pipeline.config import Settings
from pipeline.serving.runtime import Runtime, build_runtime
from pipeline.web.http_metrics import HttpMetrics

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

logger = logging.getLogger("sensevoice.web")


def create_app(settings: Settings | None = None, start: bool = True, runtime: Runtime | None = None):
    """Build the FastAPI app around a runtime (built from ``settings`` when not given). ``start``
    loads the model in a background thread at server start-up."""
    from fastapi import FastAPI

    from pipeline.web.edge import HostOriginGuard, allowed_hosts
    from pipeline.web.errors import install_error_handlers
    from pipeline.web.routes.health import build_health_router
    from pipeline.web.views import JobPages, PollBodies

    runtime = runtime or build_runtime(settings or Settings())
    settings, health = runtime.settings, runtime.health

    @asynccontextmanager
    async def lifespan(_app):
        import asyncio

        gc.collect()
        gc.freeze()  # what the app was built from; again once the model is loaded (see below)
        if start:
            runtime.start_background()
        heartbeat = asyncio.create_task(health.beat_event_loop())  # the watchdog sees a frozen loop
        frozen = asyncio.create_task(freeze_when_ready(health))
        yield
        frozen.cancel()
        heartbeat.cancel()
        runtime.stop()
        gc.unfreeze()  # (a process that builds another app, as the tests do, can collect this one)

    app = FastAPI(title="SenseVoice", lifespan=lifespan)
    app.state.runtime = runtime
    install_error_handlers(app)
    bodies = PollBodies(retention_hours=settings.limits.retention_hours)  # bodies carry expires_at
    runtime.on_purge.append(bodies.forget)
    app.state.poll_bodies = bodies
    app.include_router(build_health_router(runtime))
    if runtime.intake is not None:  # a worker process serves probes and metrics only
        from pipeline.web.api_face import add_api

        pages = JobPages(settings, runtime.view, runtime.health)  # what the page's routes read
        app.state.pages = pages
        app = add_api(app, runtime, bodies, pages)
    # outermost (inside only Starlette's error handler): a Host this server does not answer for or
    # a cross-site browser request is refused before anything else runs, FastPolls included
    app.add_middleware(HostOriginGuard, allowed=allowed_hosts(settings))
    # outermost of ours: every answer is counted, the Host guard's refusals included
    app.add_middleware(HttpMetrics, metrics=runtime.metrics, routes_of=app)
    return app


async def freeze_when_ready(health, poll_s: float = 0.5) -> None:
    """``gc.freeze()`` once the service is ready: the objects of start-up (gradio, torch, the
    model's modules) move out of the collector's reach. A full collection of this heap held the
    GIL 330-590 ms (measured with 1,200 event streams open, which allocate enough to set off
    several; issue 19); frozen, it scans only what came after."""
    import asyncio

    while health.state not in ("ready", "failed"):
        await asyncio.sleep(poll_s)
    gc.freeze()
