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

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

logger = logging.getLogger("sensevoice.app")



def create_app(*args, **kwargs):
    """:func:`pipeline.web.app.create_app` (imported on first use: ``--supervise`` needs no torch)."""
    from pipeline.web.app import create_app as build

    return build(*args, **kwargs)


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
    ap.add_argument("--web-processes", type=int, help="HTTP processes of the embedded server on one "
                    "port (0 = auto: 2 on a CUDA host, else 1); see SENSEVOICE_WEB_PROCESSES")
    # a sibling web process (pipeline/web/siblings.py): started by the owner, never by hand
    ap.add_argument("--sibling-dir", help=argparse.SUPPRESS)
    ap.add_argument("--sibling-fd", type=int, help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def log_settings(settings) -> None:
    """One start-up line: the settings in effect that differ from the defaults (flags and
    SENSEVOICE_* variables together), by their SENSEVOICE_ names; secrets shown as '***'."""
    changed = settings.changed()
    logger.info("settings (not the defaults): %s",
                " ".join(f"{name}={value}" for name, value in changed.items()) or "none")


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
                               "--port", str(settings.server.port + n)]) for n in range(gpus)]

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


def announce(settings, source) -> None:
    """The line that says where the server answers (a wildcard bind is reached as 127.0.0.1 here:
    its own name is not an allowed Host)."""
    shown = "127.0.0.1" if settings.server.host in ("", "0.0.0.0", "::") else settings.server.host
    shown = f"[{shown}]" if ":" in shown else shown
    print(f"SenseVoice {settings.server.role} on http://{shown}:{settings.server.port}/  "
          f"(model: {source.name if source else 'none, api role'})", flush=True)


def early_probe(settings, source) -> dict:
    """What /readyz says of the model before the runtime exists (the runtime says the same)."""
    from pipeline.model.loading import describe_model

    model, demo = describe_model(source, settings)
    return {"model": model, "demo": demo}


def serve_at_once(settings, options: dict) -> int:
    """One web process: the HTTP server answers within a second (probes, a "starting" page:
    pipeline/web/early.py) while torch, the runtime and the UI are built in a thread (issue 42).
    The model is found first, without torch: a missing directory or an unreachable hub still ends
    the process with status 2 before it listens. A build that fails stops the server with status 2
    (a configuration the restart cannot fix) or 1."""
    import uvicorn

    from pipeline.domain.errors import ModelUnavailable, UnsafeDirectory
    from pipeline.model.loading import resolve_model
    from pipeline.web.early import EarlyApp

    serves_model = settings.server.role in ("all", "worker")
    try:
        source = resolve_model(settings) if serves_model else None
    except ModelUnavailable as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    status = {"code": 0}
    server: uvicorn.Server | None = None

    def build():
        from pipeline.serving.runtime import build_runtime

        return create_app(runtime=build_runtime(settings, source=source))

    def failed(e: BaseException) -> None:
        known = isinstance(e, (ModelUnavailable, UnsafeDirectory))
        status["code"] = 2 if known else 1
        print(f"error: {e.message if known else e!r}", file=sys.stderr, flush=True)
        if server is not None:
            server.should_exit = True

    announce(settings, source)
    server = uvicorn.Server(uvicorn.Config(EarlyApp(build, failed, early_probe(settings, source)), host=settings.server.host,
                                           port=settings.server.port, **options))
    server.run()
    return status["code"]


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    ignore_file_size_signal()
    if args.supervise:
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--supervise"]
        return supervise([sys.executable, __file__, *rest])
    from pipeline.config import Settings
    from pipeline.domain.errors import ModelUnavailable, UnsafeDirectory
    from pipeline.web.edge import uvicorn_options
    from pipeline.web.processes import share_limits, web_processes

    overrides = {k: v for k, v in {"model": args.model, "device": args.device, "host": args.host,
                                   "port": args.port, "data_dir": args.data_dir,
                                   "broker": args.broker, "role": args.role,
                                   "web_processes": args.web_processes}.items() if v is not None}
    if args.demo:
        overrides["demo"] = True
    if args.api_only:
        overrides["ui"] = False
    overrides.setdefault("exit_on_fatal", True)
    if args.sibling_dir:  # the api role over the owner's store; the UI stays with the owner
        from pipeline.web.siblings import run_sibling

        return run_sibling(Settings(**{**overrides, "role": "api", "ui": False}), args.sibling_dir, args.sibling_fd)
    settings = Settings(**overrides)
    log_settings(settings)
    if settings.server.role == "worker" and settings.engine.resolved_device() == "cuda":
        gpus = gpu_count()
        if gpus > 1:  # one worker process per GPU, each on its own port (probes, metrics)
            return run_per_gpu(sys.argv[1:] if argv is None else argv, settings, gpus)
    processes = web_processes(settings)
    share_limits(settings, processes)  # each web process counts its share of the per-server limits
    if settings.server.gil_switch_ms > 0:  # process-wide: set by the entry point, not by create_app
        sys.setswitchinterval(settings.server.gil_switch_ms / 1000)
    # uvloop + httptools (requirements) rather than asyncio + h11: polls stay cheap under load
    # and the edge guards (pipeline/web/edge.py): a header deadline, a header size cap, connection
    # counts per client and in all, on top of uvicorn's httptools protocol; X-Forwarded-For only
    # from SENSEVOICE_TRUSTED_PROXIES
    options = dict(log_level="info", loop="uvloop", access_log=settings.server.access_log, **uvicorn_options(settings))
    if processes <= 1:
        return serve_at_once(settings, options)
    import uvicorn

    from pipeline.serving.runtime import build_runtime
    from pipeline.web.siblings import WebSiblings

    try:  # the model is found now (an api process holds none): fail fast, before the server starts
        runtime = build_runtime(settings, resolve=True)
    except (ModelUnavailable, UnsafeDirectory) as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    app = create_app(runtime=runtime)
    announce(settings, runtime.source)
    # sibling web processes on the same port: uploads and polls on more cores (pipeline/web/siblings.py)
    listener = uvicorn.Config(app, host=settings.server.host, port=settings.server.port).bind_socket()
    siblings = WebSiblings(settings, runtime, processes, sys.argv[1:] if argv is None else list(argv), listener,
                           bodies=app.state.poll_bodies)
    siblings.start()  # (right before the owner serves: a sibling connects to its hub at once)
    try:
        siblings.serve(app, **options)
    finally:
        siblings.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
