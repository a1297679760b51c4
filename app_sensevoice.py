"""SenseVoice web app: FastAPI + Gradio UI (at /ui, / redirects) + REST API (/api) + health probes.

    python app_sensevoice.py [--model DIR|NAME] [--demo] [--device cuda|cpu] [--host H] [--port P]
                             [--data-dir DIR] [--api-only] [--supervise]

Every option also reads its SENSEVOICE_* environment variable (see pipeline/config.py).
Nothing heavy happens at import time: ``create_app`` builds the app, the model loads in the background
after the server starts, and /readyz turns 200 once it is loaded and warmed up.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from contextlib import asynccontextmanager

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

logger = logging.getLogger("sensevoice.app")


def create_app(settings=None, service=None, start: bool = True):
    """Build the FastAPI app. ``start`` loads the model in a background thread at server start-up."""
    from fastapi import FastAPI

    from pipeline.api import PollBodies, build_health_router, install_error_handlers
    from pipeline.config import Settings
    from pipeline.edge import HostOriginGuard, allowed_hosts
    from pipeline.service import TranscriptionService

    settings = settings or Settings()
    service = service or TranscriptionService(settings)

    @asynccontextmanager
    async def lifespan(_app):
        import asyncio

        if start:
            service.start_background()
        heartbeat = asyncio.create_task(service.beat_event_loop())  # the watchdog sees a frozen loop
        yield
        heartbeat.cancel()
        service.stop()

    app = FastAPI(title="SenseVoice", lifespan=lifespan)
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
    return app


def add_api(app, settings, service, bodies):
    """The job routes, the UI and the request guards inside the Host/Origin check."""
    from pipeline.api import FastPolls, UploadLimit, build_router
    from pipeline.ui_guard import AccessGuard

    app.include_router(build_router(service, bodies))
    if settings.ui:
        app = mount_ui(app, settings, service)
    app.add_middleware(AccessGuard, settings=settings)  # token on /docs; what the UI may read
    uploads = settings.max_concurrent_uploads or max(8, 2 * (os.cpu_count() or 2))
    app.add_middleware(UploadLimit, max_bytes=settings.max_upload_bytes + 64 * 1024,
                       max_in_flight=uploads, retry_after_s=settings.retry_after_s,
                       max_per_client=settings.max_uploads_per_client,
                       body_timeout_s=settings.body_timeout_s,
                       min_rate_bytes_s=settings.body_min_rate_bytes_s, grace_s=settings.body_grace_s)
    app.add_middleware(FastPolls, service=service, bodies=bodies)  # polls skip what is inside it
    return app


def mount_ui(app, settings, service):
    """The Gradio UI at /ui (/ redirects there), hardened: its own upload directory
    (<data_dir>/ui-uploads, 0700: the only files the UI reads, see pipeline/ui_guard.py), a login
    whenever an API token or SENSEVOICE_UI_AUTH is set, no file access to the rest of the data
    directory, no internal errors shown, no monitoring route, no run history, capped uploads."""
    import gradio as gr
    from fastapi.responses import RedirectResponse

    from pipeline.ui import build_ui, css, head_html, ui_login
    from pipeline.ui_guard import UI_PATH, prepare_upload_dir

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
    return app


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description="SenseVoice speech recognition web app")
    ap.add_argument("--model", help="local model directory or hub name (default iic/SenseVoiceSmall)")
    ap.add_argument("--demo", action="store_true", help="serve a small offline demo model")
    ap.add_argument("--device", help="cuda, cuda:N or cpu (default: cuda if available)")
    ap.add_argument("--host")
    ap.add_argument("--port", type=int)
    ap.add_argument("--data-dir", help="job store and spool directory")
    ap.add_argument("--api-only", action="store_true", help="serve the REST API without the UI")
    ap.add_argument("--broker", help="redis://HOST:PORT/DB: the distributed topology (default: "
                    "embedded, SQLite and an in-process queue)")
    ap.add_argument("--role", choices=("all", "api", "worker"),
                    help="api (HTTP, UI, decoding), worker (one GPU's model), all (default)")
    ap.add_argument("--supervise", action="store_true",
                    help="run the server as a child process and restart it when it exits non-zero")
    return ap.parse_args(argv)


RESTART_BACKOFF_S = (1, 2, 5, 10, 30)  # seconds between restarts; the last repeats


def supervise(command: list[str]) -> int:
    """Bare-metal supervisor: run ``command`` (the server) and restart it after a crash, a fatal
    device error or a hang (it exits non-zero); queued and running jobs resume from the store.
    SIGTERM or Ctrl-C stops the server, then the supervisor, with the server's exit code."""
    import signal
    import subprocess
    import time

    proc: subprocess.Popen | None = None
    stopping = False

    def stop(_signum, _frame):
        nonlocal stopping
        stopping = True
        if proc is not None and proc.poll() is None:
            proc.terminate()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    restarts = 0
    while True:
        started = time.monotonic()
        proc = subprocess.Popen(command)
        code = proc.wait()
        if stopping:  # uvicorn re-raises the signal it stopped on: that is a clean stop too
            return 0 if code in (0, -signal.SIGTERM, -signal.SIGINT) else abs(code)
        if code in (0, 2):  # stopped, or a configuration error a restart cannot fix
            return code
        if time.monotonic() - started > 300:  # it ran a while: start the back-off again
            restarts = 0
        delay = RESTART_BACKOFF_S[min(restarts, len(RESTART_BACKOFF_S) - 1)]
        restarts += 1
        logger.warning("server exited with %s; restarting in %d s", code, delay)
        deadline = time.monotonic() + delay
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        if stopping:
            return 0


def ignore_file_size_signal() -> None:
    """A write past the file-size limit (ulimit -f, prlimit --fsize) fails with EFBIG, which the
    store answers as 507 storage_full, instead of SIGXFSZ killing the whole server."""
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def run_per_gpu(argv: list[str], settings, gpus: int) -> int:
    """``--role worker --device cuda`` on a host with several GPUs: one worker process per GPU
    (``--device cuda:N``, probes and metrics on ``--port`` + N: a later flag wins); SIGTERM stops
    them all; the first non-zero exit ends the others too (the orchestrator restarts the set)."""
    import signal
    import subprocess
    import time

    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--device", f"cuda:{n}",
                               "--port", str(settings.port + n)]) for n in range(gpus)]

    def stop(_signum, _frame):
        for p in procs:
            if p.poll() is None:
                p.terminate()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, stop)
    while all(p.poll() is None for p in procs):
        time.sleep(0.5)
    stop(None, None)
    codes = [p.wait() for p in procs]
    return next((c for c in codes if c not in (0, -signal.SIGTERM)), 0)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    ignore_file_size_signal()
    if args.supervise:
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--supervise"]
        return supervise([sys.executable, __file__, *rest])
    from pipeline.config import Settings
    from pipeline.edge import http_protocol
    from pipeline.errors import ModelUnavailable
    from pipeline.model import resolve_model
    from pipeline.service import TranscriptionService

    overrides = {k: v for k, v in {"model": args.model, "device": args.device, "host": args.host,
                                   "port": args.port, "data_dir": args.data_dir,
                                   "broker": args.broker, "role": args.role}.items() if v is not None}
    if args.demo:
        overrides["demo"] = True
    if args.api_only:
        overrides["ui"] = False
    overrides.setdefault("exit_on_fatal", True)
    settings = Settings(**overrides)
    if settings.role == "worker" and settings.resolved_device() == "cuda":
        gpus = gpu_count()
        if gpus > 1:  # one worker process per GPU, each on its own port (probes, metrics)
            return run_per_gpu(sys.argv[1:] if argv is None else argv, settings, gpus)
    source = None
    if settings.role != "api":  # an api process holds no model
        try:
            source = resolve_model(settings)  # fail fast, before the server starts
        except ModelUnavailable as e:
            print(f"error: {e.message}", file=sys.stderr)
            return 2
    import uvicorn

    if settings.gil_switch_ms > 0:  # process-wide: set by the entry point, not by create_app
        sys.setswitchinterval(settings.gil_switch_ms / 1000)
    app = create_app(settings, TranscriptionService(settings, source))
    # a wildcard bind is reached as 127.0.0.1 here (its own name is not an allowed Host)
    shown = "127.0.0.1" if settings.host in ("", "0.0.0.0", "::") else settings.host
    shown = f"[{shown}]" if ":" in shown else shown
    print(f"SenseVoice {settings.role} on http://{shown}:{settings.port}/  "
          f"(model: {source.name if source else 'none, api role'})", flush=True)
    # uvloop + httptools (requirements) rather than asyncio + h11: polls stay cheap under load
    # and the edge guards (pipeline/edge.py): a header deadline, a header size cap, connection
    # counts per client and in all, on top of uvicorn's httptools protocol
    uvicorn.run(app, host=settings.host, port=settings.port, log_level="info", loop="uvloop",
                http=http_protocol(settings), access_log=settings.access_log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
