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


def create_app(settings: Settings | None = None, service=None, start: bool = True,
               runtime: Runtime | None = None):
    """Build the FastAPI app around a runtime (built from ``settings`` when not given; ``service``
    is the older spelling of ``runtime.service``). ``start`` loads the model in a background thread
    at server start-up."""
    from fastapi import FastAPI

    from pipeline.web.api import PollBodies, build_health_router, install_error_handlers
    from pipeline.web.edge import HostOriginGuard, allowed_hosts

    if runtime is None:
        settings = settings or (service.settings if service is not None else Settings())
        runtime = Runtime(settings, service) if service is not None else build_runtime(settings)
    settings, service = runtime.settings, runtime.service

    @asynccontextmanager
    async def lifespan(_app):
        import asyncio

        gc.collect()
        gc.freeze()  # what the app was built from; again once the model is loaded (see below)
        if start:
            service.start_background()
        heartbeat = asyncio.create_task(service.beat_event_loop())  # the watchdog sees a frozen loop
        frozen = asyncio.create_task(freeze_when_ready(service))
        yield
        frozen.cancel()
        heartbeat.cancel()
        service.stop()
        gc.unfreeze()  # (a process that builds another app, as the tests do, can collect this one)

    app = FastAPI(title="SenseVoice", lifespan=lifespan)
    app.state.runtime = runtime
    app.state.service = service
    install_error_handlers(app)
    bodies = PollBodies()
    service.on_purge.append(bodies.forget)
    app.state.poll_bodies = bodies
    app.include_router(build_health_router(service))
    if service.serves_api:  # a worker process serves probes and metrics only
        app = add_api(app, settings, service, bodies)
    # outermost (inside only Starlette's error handler): a Host this server does not answer for or
    # a cross-site browser request is refused before anything else runs, FastPolls included
    app.add_middleware(HostOriginGuard, allowed=allowed_hosts(settings))
    # outermost of ours: every answer is counted, the Host guard's refusals included
    app.add_middleware(HttpMetrics, metrics=service.metrics, routes_of=app)
    return app


async def freeze_when_ready(service, poll_s: float = 0.5) -> None:
    """``gc.freeze()`` once the service is ready: the objects of start-up (gradio, torch, the
    model's modules) move out of the collector's reach. A full collection of this heap held the
    GIL 330-590 ms (measured with 1,200 event streams open, which allocate enough to set off
    several; issue 19); frozen, it scans only what came after."""
    import asyncio

    while service.state not in ("ready", "failed"):
        await asyncio.sleep(poll_s)
    gc.freeze()


def add_api(app, settings, service, bodies):
    """The job routes, the UI and the request guards inside the Host/Origin check."""
    from pipeline.web.api import FastPolls, UploadLimit, build_router
    from pipeline.web.auth_throttle import AuthThrottle
    from pipeline.web.routes.events import build_events_router, event_fanout
    from pipeline.web.routes.openai import build_openai_router
    from pipeline.web.routes.stream import build_stream_router
    from pipeline.web.ui_guard import AccessGuard

    app.include_router(build_router(service, bodies))
    app.include_router(build_openai_router(service))  # /v1: OpenAI-compatible
    app.state.event_fanout = event_fanout(settings)  # a job's events, built once, shared
    app.include_router(build_events_router(service, app.state.event_fanout))  # and /favicon.ico
    app.include_router(build_stream_router(service))  # live captions (WebSocket), FunASR's too
    if settings.ui:
        app = mount_ui(app, settings, service)
    # token on /docs; what the UI may read; its session routes only after its login
    app.add_middleware(AccessGuard, settings=settings,
                       ui_app=lambda: getattr(app.state, "gradio_app", None))
    uploads = settings.max_concurrent_uploads or max(8, 2 * (os.cpu_count() or 2))
    app.add_middleware(UploadLimit, max_bytes=settings.max_upload_bytes + 64 * 1024,
                       max_in_flight=uploads, retry_after_s=settings.retry_after_s,
                       max_per_client=settings.max_uploads_per_client,
                       body_timeout_s=settings.body_timeout_s,
                       min_rate_bytes_s=settings.body_min_rate_bytes_s, grace_s=settings.body_grace_s)
    app.add_middleware(FastPolls, service=service, bodies=bodies)  # polls skip what is inside it
    # outermost of these: failed sign-ins (any 401, the UI's login, a live stream's token) are
    # counted per client address and a guessing client is refused
    app.add_middleware(AuthThrottle, limit=settings.auth_failures_per_client,
                       window_s=settings.auth_failure_window_s)
    return app


def mount_ui(app, settings, service):
    """The Gradio UI at /ui (/ redirects there), hardened: its own upload directory
    (<data_dir>/ui-uploads, 0700: the only files the UI reads, see pipeline/web/ui_guard.py), a login
    whenever an API token or SENSEVOICE_UI_AUTH is set, no file access to the rest of the data
    directory, no internal errors shown, no monitoring route, no run history, capped uploads."""
    import gradio as gr
    from fastapi.responses import RedirectResponse

    from pipeline.web.ui import build_ui, css, head_html, ui_login
    from pipeline.web.ui_guard import UI_PATH, prepare_upload_dir

    @app.get("/", include_in_schema=False)
    async def root():
        return RedirectResponse(UI_PATH + "/")

    upload_dir = prepare_upload_dir(settings.data_dir)
    # Gradio reads GRADIO_TEMP_DIR when it builds each component (its cache), when it builds the
    # mounted app (the upload route's folder) and in some checks at request time: never the
    # host-wide /tmp/gradio, whose files any other Gradio app on the host may have put there
    os.environ["GRADIO_TEMP_DIR"] = upload_dir
    blocks = build_ui(service, upload_dir)
    data_dir = os.path.realpath(settings.data_dir)
    blocked = {os.path.join(data_dir, name) for name in
               ("spool", "jobs.sqlite3", "jobs.sqlite3-wal", "jobs.sqlite3-shm", "jobs.sqlite3-journal")}
    blocked |= {e.path for e in os.scandir(data_dir) if e.name != os.path.basename(upload_dir)}
    app = gr.mount_gradio_app(
        app, blocks, path=UI_PATH, css=css(), head=head_html(), auth=ui_login(settings),
        show_error=False, max_file_size=settings.max_upload_bytes, blocked_paths=sorted(blocked),
        enable_monitoring=False, footer_links=[], mcp_server=False, ssr_mode=False,
        run_history=False,
    )
    # pinned on the objects too: another app built later in this process cannot move them
    for block in [blocks, *blocks.blocks.values()]:
        block.GRADIO_CACHE = upload_dir
    for route in app.routes:
        if getattr(route, "path", None) == UI_PATH and hasattr(route.app, "uploaded_file_dir"):
            route.app.uploaded_file_dir = upload_dir
            app.state.gradio_app = route.app  # its login, for AccessGuard
    return app
