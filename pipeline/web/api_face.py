"""The api role's face: the job routes (REST, OpenAI), a job's event stream, the live captions and
the UI, each given only the parts it uses, inside the request guards."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.serving.live import LiveHub
from pipeline.web.middleware import install_guards
from pipeline.web.routes.events import build_events_router, event_fanout
from pipeline.web.routes.jobs import build_jobs_router
from pipeline.web.routes.openai import build_openai_router
from pipeline.web.routes.desk import build_desk_router
from pipeline.web.routes.live import build_live_router

if TYPE_CHECKING:
    from pipeline.serving.runtime import Runtime
    from pipeline.web.views import JobPages


def add_api(app, runtime: Runtime, bodies, pages: JobPages):
    """The job routes, the UI and the request guards inside the Host/Origin check. Each router
    gets the parts it uses: the intake and the job view (jobs, OpenAI), the pages (events, UI),
    the live lane (stream, realtime)."""
    settings, intake, view, pool = runtime.settings, runtime.intake, runtime.view, runtime.pool
    app.include_router(build_jobs_router(settings, intake, view, bodies))
    app.include_router(build_openai_router(settings, intake, view))  # /v1: OpenAI-compatible
    app.state.event_fanout = event_fanout(settings)  # a job's events, built once, shared
    app.include_router(build_events_router(pages, app.state.event_fanout))  # and /favicon.ico
    hub = LiveHub(settings, runtime.live_decode, runtime.health,
                  registry=runtime.metrics.registry,
                  speech_device=pool.speech_device if pool is not None else "cpu",
                  busy_seconds=runtime.live_busy_seconds, capacity=runtime.live_capacity)
    app.state.live_hub = hub
    app.include_router(build_live_router(hub))  # live captions (WebSocket): ours, FunASR's, OpenAI's
    app.include_router(build_desk_router(settings, intake, view, runtime.broker.calls(),  # the desk
                                         runtime.broker, runtime.on_purge))
    if settings.ui.enabled:
        from pipeline.web.ui import mount_ui

        app = mount_ui(app, runtime, pages)
    install_guards(app, settings, view, bodies, intake)
    return app
