"""The embedded server on more than one core (``--web-processes N``, SENSEVOICE_WEB_PROCESSES).

One process (the owner) holds what must be one: the store's writer, the scheduler and the GPU
loop, the Gradio UI (its sessions live in memory) and the live captions. On one event loop and one
GIL it served ~250 uploads/s of the no-op engine on two cores: HTTP, decoding and polling took
the loop. N-1 sibling web processes accept on the same listening socket (the kernel hands each
connection to one of them) and serve the REST API's submits and reads themselves -- ``POST
/api/jobs``, ``POST /v1/audio/transcriptions``: decoded and spooled there, the job's row and work
item handed to the owner in one message (pipeline/serving/sibling_hub.py); ``GET /api/jobs/{id}``
and its ``/result``, ``/audio`` and ``/review``, ``/v1/models``: read from SQLite and the spool --
and relay every other request (the UI, live captions, event streams, review edits, batches, probes,
metrics) to the owner over a private Unix socket, with the client's address in a header that the
owner believes only from that socket and with the secret they share.

The owner starts the siblings, starts one again when it dies (what it had accepted is in the
store), and stops them with itself; a sibling whose owner is gone stops (``stop_self``)."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from pipeline.domain.errors import NotReady
from pipeline.serving.sibling_hub import SiblingHub
from pipeline.web.edge import refuse
from pipeline.web.processes import SHARED_LIMITS, owner_accepts

logger = logging.getLogger("sensevoice.siblings")

SIBLING_HEADER = b"x-sensevoice-sibling"  # the shared secret: a relayed request
CLIENT_HEADER = b"x-sensevoice-client"  # the client's address as the sibling saw it
HOP_BY_HOP = frozenset((b"connection", b"keep-alive", b"transfer-encoding", b"upgrade", b"te", b"trailer",
                        b"proxy-connection", b"proxy-authorization", SIBLING_HEADER, CLIENT_HEADER))
WS_OWN_HEADERS = frozenset((b"host", b"sec-websocket-key", b"sec-websocket-version",
                            b"sec-websocket-extensions", b"sec-websocket-protocol"))
# the reads a sibling answers from the store itself: a job (its poll), its transcript's exports,
# its recording, its review; the models the OpenAI route names
SIBLING_READS = re.compile(r"/api/jobs/[^/]+(?:/(?:result|audio|review))?|/v1/models(?:/[^/]+)?")
RESTART_DELAY_S = 1.0  # a sibling that died is started again after this long
def owned(method: str, path: str) -> bool:
    """The requests a sibling serves itself (the rest go to the owner)."""
    if method == "POST":
        return path in ("/api/jobs", "/v1/audio/transcriptions")
    return method in ("GET", "HEAD") and SIBLING_READS.fullmatch(path) is not None


# ---------------------------------------------------------------------------- the owner's side
class SiblingTrust:
    """ASGI, outermost in the owner: a request relayed by a sibling (on the private Unix socket,
    with the shared secret) counts as its client's address; the two headers are removed from
    every request, so no client can name an address for itself."""

    def __init__(self, app, secret: str):
        self.app, self.secret = app, secret.encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] in ("http", "websocket"):
            headers = scope["headers"]
            if any(k in (SIBLING_HEADER, CLIENT_HEADER) for k, _ in headers):
                token = client = None
                kept = []
                for k, v in headers:
                    if k == SIBLING_HEADER:
                        token = v
                    elif k == CLIENT_HEADER:
                        client = v
                    else:
                        kept.append((k, v))
                scope = dict(scope, headers=kept)
                if scope.get("client") is None and token is not None and hmac.compare_digest(token, self.secret):
                    host = (client or b"").decode("latin-1")
                    scope["client"] = (host, 0) if host else None
        await self.app(scope, receive, send)


class WebSiblings:
    """The owner's siblings: a private directory (0700) with the hub's and the relay's sockets
    and the secret, the listening socket they share, and the processes."""

    def __init__(self, settings, runtime, count: int, argv: list[str], listener: socket.socket, *, bodies):
        """``bodies``: the owner app's ``PollBodies`` (a finished job's body is encoded once, for
        its own polls and its siblings')."""
        self.settings, self.argv, self.listener = settings, argv, listener
        self.dir = Path(tempfile.mkdtemp(prefix="sensevoice-web-"))
        self.secret = secrets.token_hex(32)
        secret_file = self.dir / "secret"
        secret_file.touch(mode=0o600)
        secret_file.write_text(self.secret)
        self.hub = SiblingHub(str(self.dir / "hub.sock"), self.secret, runtime.broker, runtime.view.remember,
                              lambda: owner_state(runtime), device=runtime.intake.uploads.resampler.device,
                              body_of=lambda job_id: final_body(runtime.view, bodies, job_id))
        runtime.on_purge.append(self.hub.forget)
        self.metrics_dir = self.dir / "metrics"  # the siblings' PROMETHEUS_MULTIPROC_DIR (private: 0700)
        self.metrics_dir.mkdir(mode=0o700)
        self.metrics = runtime.metrics
        self.metrics.count_siblings(str(self.metrics_dir))  # this process's /metrics adds theirs
        self.relay = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.relay.bind(str(self.dir / "relay.sock"))
        self.relay.listen(2048)
        self._count = count - 1
        self._procs: list[subprocess.Popen] = []
        self._stopped = threading.Event()
        self._watch = threading.Thread(target=self._keep_running, name="sensevoice-siblings", daemon=True)

    def start(self) -> None:
        self.hub.start()
        self._procs = [self._spawn(i) for i in range(self._count)]
        self._watch.start()
        logger.info("%d sibling web processes share the port (%s)", len(self._procs), self.dir)

    def _spawn(self, i: int) -> subprocess.Popen:
        app = Path(__file__).resolve().parent.parent.parent / "app_sensevoice.py"
        fd = self.listener.fileno()
        return subprocess.Popen([sys.executable, str(app), *self.argv, "--sibling-dir", str(self.dir),
                                 "--sibling-fd", str(fd)], pass_fds=(fd,), env=self.sibling_env())

    def sibling_env(self) -> dict[str, str]:
        """A sibling's environment: this one, with the owner's shares of the shared limits and
        prometheus_client's multiprocess mode in the owner's metrics directory."""
        return {**os.environ, **{f"SENSEVOICE_{name.upper()}": str(getattr(self.settings.limits, name))
                                 for name in SHARED_LIMITS},
                "PROMETHEUS_MULTIPROC_DIR": str(self.metrics_dir)}

    def _keep_running(self) -> None:
        """Start a sibling that exited again: after 1 s, or (one that keeps dying within 30 s of
        its start) after twice its last delay, up to 30 s."""
        n = len(self._procs)
        started, died, delay = [time.monotonic()] * n, [None] * n, [RESTART_DELAY_S] * n
        while not self._stopped.wait(RESTART_DELAY_S / 4):
            for i, proc in enumerate(self._procs):
                if proc.poll() is None or self._stopped.is_set():
                    continue
                now = time.monotonic()
                if died[i] is None:
                    died[i] = now
                    self.metrics.sibling_gone(proc.pid)
                    delay[i] = min(30.0, delay[i] * 2) if now - started[i] < 30 else RESTART_DELAY_S
                    logger.warning("sibling web process %d exited with %s; starting it again in %.0f s",
                                   i + 1, proc.returncode, delay[i])
                if now - died[i] >= delay[i]:
                    self._procs[i] = self._spawn(i)
                    started[i], died[i] = now, None

    def serve(self, app, **options) -> None:
        """Run the owner's server on the shared port and the relay socket until it stops; the
        siblings stop first (their submits in flight still reach the hub), then the owner's app.
        (uvicorn re-raises the signal it stopped on after ``run``: cleaning up after it is too late.)"""
        import uvicorn

        siblings = self

        class OwnerServer(uvicorn.Server):
            async def shutdown(self, sockets=None):
                await asyncio.to_thread(siblings.stop)
                await super().shutdown(sockets)

        public = [self.listener] if owner_accepts(self.settings, self._count + 1) else []  # (else: siblings only)
        OwnerServer(uvicorn.Config(SiblingTrust(app, self.secret), **options)).run(sockets=[*public, self.relay])

    def stop(self) -> None:
        if self._stopped.is_set():
            return
        self._stopped.set()
        for p in self._procs:
            if p.poll() is None:
                p.terminate()
        deadline = time.monotonic() + 10
        for p in self._procs:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
        self.hub.stop()
        logger.info("sibling web processes accepted %d jobs", self.hub.accepted)
        self.relay.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def owner_state(runtime) -> dict:
    """What a sibling's probes and admission read of the owner."""
    from pipeline.domain.errors import QueueFull

    broker = runtime.broker
    try:
        broker.check_capacity()
        full = False
    except QueueFull:
        full = True
    pool = runtime.pool
    return {"serving": runtime.health.state == "ready" and runtime.health.not_serving() is None,
            "depth": len(broker), "lanes": {str(int(k)): v for k, v in broker.queue_depth().items()},
            "free": pool.local_free_ratios() if pool is not None else [], "full": full}


def final_body(view, bodies, job_id: str) -> bytes | None:
    """A finished job's poll body as this process answers it (its snapshot, through its
    ``PollBodies``: no I/O, encoded once), for the siblings' polls; None when it is not held here
    or not finished."""
    from pipeline.domain.types import JobState

    job = view.get_cached(job_id)
    if job is None or job.state not in (JobState.DONE, JobState.FAILED):
        return None
    return bodies.body(job)


# ---------------------------------------------------------------------------- a sibling's side
class SiblingFront:
    """ASGI, a sibling's whole app: its own routes (``owned``) to the local app, the rest relayed."""

    def __init__(self, local, relay: OwnerRelay):
        self.local, self.relay = local, relay

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind == "lifespan" or (kind == "http" and owned(scope["method"], scope["path"])):
            return await self.local(scope, receive, send)
        if kind == "http":
            return await self.relay.http(scope, receive, send)
        if kind == "websocket":
            return await self.relay.websocket(scope, receive, send)


class OwnerRelay:
    """Relays HTTP (streamed both ways: uploads, event streams) and WebSockets to the owner."""

    def __init__(self, path: str, secret: str):
        self.path, self.secret = path, secret.encode()
        self._client = None

    def _http(self):
        import httpx

        if self._client is None:
            self._client = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(uds=self.path), base_url="http://owner",
                timeout=httpx.Timeout(connect=5.0, read=None, write=60.0, pool=30.0),
                limits=httpx.Limits(max_connections=1024, max_keepalive_connections=64))
        return self._client

    def _headers(self, scope, drop: frozenset = frozenset()) -> list[tuple[bytes, bytes]]:
        out = [(k, v) for k, v in scope["headers"] if k not in HOP_BY_HOP and k not in drop]
        client = scope.get("client")
        return out + [(SIBLING_HEADER, self.secret), (CLIENT_HEADER, (client[0] if client else "").encode())]

    @staticmethod
    def _target(scope) -> str:
        path = scope.get("raw_path") or scope["path"].encode()
        query = scope.get("query_string") or b""
        return (path + (b"?" + query if query else b"")).decode("latin-1")

    async def http(self, scope, receive, send) -> None:
        import httpx

        has_body = any(k in (b"content-length", b"transfer-encoding") for k, _ in scope["headers"])

        async def body():
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    raise ConnectionResetError("the client went away")
                yield message.get("body", b"")
                if not message.get("more_body"):
                    return

        client = self._http()
        request = client.build_request(scope["method"], self._target(scope), headers=self._headers(scope),
                                       content=body() if has_body else None)
        try:
            response = await client.send(request, stream=True)
        except httpx.TransportError:
            return await refuse(scope, send, NotReady("the server's main process does not answer; try again"))
        except ConnectionResetError:
            return  # the client went away while its body was relayed: no one to answer
        try:
            await send({"type": "http.response.start", "status": response.status_code,
                        "headers": [(k, v) for k, v in response.headers.raw if k.lower() not in HOP_BY_HOP]})
            async for chunk in response.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        except (httpx.TransportError, OSError):
            pass  # either end went away mid-answer: the connection closes
        finally:
            await response.aclose()

    async def websocket(self, scope, receive, send) -> None:
        from websockets.asyncio.client import unix_connect
        from websockets.exceptions import ConnectionClosed, InvalidStatus

        if (await receive())["type"] != "websocket.connect":
            return
        host = next((v for k, v in scope["headers"] if k == b"host"), b"owner").decode("latin-1")
        headers = [(k.decode("latin-1"), v.decode("latin-1"))
                   for k, v in self._headers(scope, drop=WS_OWN_HEADERS)]
        try:
            upstream = await unix_connect(self.path, f"ws://{host}{self._target(scope)}",
                                          additional_headers=headers, open_timeout=10, max_size=None,
                                          subprotocols=scope.get("subprotocols") or None, compression=None)
        except InvalidStatus as e:  # the owner refused the upgrade (a guard): the same answer
            response = e.response
            if "websocket.http.response" in scope.get("extensions", {}):
                await send({"type": "websocket.http.response.start", "status": response.status_code,
                            "headers": [(k.lower().encode("latin-1"), v.encode("latin-1"))
                                        for k, v in response.headers.raw_items()
                                        if k.lower().encode("latin-1") not in HOP_BY_HOP]})
                return await send({"type": "websocket.http.response.body", "body": response.body or b""})
            return await send({"type": "websocket.close", "code": 1013 if response.status_code >= 500 else 1008})
        except (OSError, asyncio.TimeoutError):
            return await send({"type": "websocket.close", "code": 1013})
        await send({"type": "websocket.accept", "subprotocol": upstream.subprotocol})

        async def down():
            try:
                async for message in upstream:
                    key = "text" if isinstance(message, str) else "bytes"
                    await send({"type": "websocket.send", key: message})
            except ConnectionClosed:
                pass
            code = upstream.close_code or 1000
            await send({"type": "websocket.close", "code": code, "reason": upstream.close_reason or ""})

        async def up():
            while True:
                message = await receive()
                if message["type"] == "websocket.disconnect":
                    await upstream.close(code=message.get("code", 1000))
                    return
                data = message.get("text") if message.get("text") is not None else message.get("bytes")
                await upstream.send(data)

        tasks = [asyncio.ensure_future(down()), asyncio.ensure_future(up())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for t in tasks:
                t.cancel()
            await upstream.close()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()


def sibling_app(settings, sibling_dir: str | Path, on_lost=None) -> SiblingFront:
    """A sibling web process's app: the api role over the owner's store (``settings``: the
    owner's, role api, no UI), the rest relayed to the owner."""
    from pipeline.serving.broker_sibling import SiblingBroker
    from pipeline.serving.runtime import build_runtime
    from pipeline.web.app import create_app

    folder = Path(sibling_dir)
    secret = (folder / "secret").read_text()
    deadline = time.monotonic() + 30
    while True:  # the owner's hub starts with it; a sibling started with the owner may be early
        try:
            broker = SiblingBroker(settings.server.data_dir, str(folder / "hub.sock"), secret, on_lost=on_lost)
            break
        except OSError:  # (no owner listens yet; a wrong secret raises AuthenticationError)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    runtime = build_runtime(settings, role="api", broker=broker)
    if not _counts_for_owner():
        logger.warning("PROMETHEUS_MULTIPROC_DIR is not set before prometheus_client was imported: the "
                       "owner's /metrics does not count what this web process answers")
    app = create_app(runtime=runtime)
    bodies = app.state.poll_bodies  # the owner's finished jobs' bodies: polls of them read no SQLite
    broker.hub.on_forget = bodies.forget  # (first: a purge is never missed after a body is kept)
    broker.hub.on_bodies = bodies.push
    return SiblingFront(app, OwnerRelay(str(folder / "relay.sock"), secret))


def _counts_for_owner() -> bool:
    """Whether this process's metrics are prometheus_client's multiprocess values (its environment
    named the owner's directory before the library was imported: ``WebSiblings.sibling_env``)."""
    from prometheus_client import values

    return getattr(values.ValueClass, "_multiprocess", False)


def run_sibling(settings, sibling_dir: str, fd: int) -> int:
    """A sibling web process (``app_sensevoice --sibling-dir``): serves on the inherited socket."""
    import uvicorn

    from pipeline.serving.broker_sibling import stop_self
    from pipeline.web.edge import uvicorn_options

    logging.getLogger("httpx").setLevel(logging.WARNING)  # (a line per relayed request otherwise)
    app = sibling_app(settings, sibling_dir, on_lost=stop_self)
    config = uvicorn.Config(app, log_level="warning", loop="uvloop", access_log=settings.server.access_log,
                            **uvicorn_options(settings))
    uvicorn.Server(config).run(sockets=[socket.socket(fileno=fd)])
    return 0
