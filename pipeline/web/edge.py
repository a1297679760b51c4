"""Guards at the edge of the server, before any application code runs.

Connection level (``EdgeHttpProtocol``, uvicorn's httptools protocol with deadlines and counts;
``http_protocol(settings)`` gives the class to pass as ``uvicorn.run(..., http=...)``):

* a header deadline: a connection that has not sent a request's complete headers within
  ``header_timeout_s`` of connecting (or of its last response) is closed; uvicorn itself has no
  such timeout, so a client trickling header bytes kept its descriptor for ever;
* a header size cap (``MAX_HEADER_BYTES``): httptools buffers an unfinished header line without a
  limit, so one fast connection could fill the memory within the deadline;
* a write-stall deadline (``WRITE_STALL_S``): a client that stops reading a response (its socket
  full, the server's write buffer over its high-water mark) for that long is disconnected, so
  stalled downloads cannot hold connections, tasks and open files for ever;
* connection counts per client address and in all: beyond ``max_connections_per_client`` a new
  connection is closed at once; at ``max_connections`` (0 = half the soft RLIMIT_NOFILE) the
  connection that has waited longest for its request headers is closed to make room (or, when all
  are busy with requests, the new one), so the process never runs out of file descriptors and a
  flood of idle connections does not lock out clients that send their requests.

Request level (``HostOriginGuard``, ASGI middleware in front of everything else, FastPolls too):

* the Host header must name this server (``allowed_hosts``): a DNS-rebinding page sends its own
  name and gets 400 host_not_allowed;
* a browser request from another site that could change state (any method but GET/HEAD/OPTIONS,
  and WebSocket upgrades) gets 403 cross_site_request: ``Sec-Fetch-Site: cross-site|same-site``,
  or an ``Origin`` that is not the request's own scheme://host[:port] (``null`` included).
  Requests without either header (curl, scripts, the python clients) pass;
* a request whose body could be read two ways gets 400 ambiguous_request (issue 36: with two
  ``Content-Type`` headers of different boundaries, a proxy reading the first inspects another
  body than the form parser, which reads the first too, or the fast submit, which read the last):
  a framing header (Content-Type, Content-Length, Transfer-Encoding) given twice, or a parameter
  of the Content-Type given twice (``boundary=a; boundary=b``: which one wins depends on the reader).

Request bodies (deadline, minimum rate, per-client upload slots) are guarded by
``pipeline.web.middleware.UploadLimit``, which reads the same settings.
"""

from __future__ import annotations

import ipaddress
import logging
import resource
import time

import orjson
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from pipeline.domain.errors import (AmbiguousRequest, CrossSiteRequest, HeadersTooLarge, HostNotAllowed,
                                    RequestTimeout, SenseVoiceError)

logger = logging.getLogger("sensevoice.edge")

MAX_HEADER_BYTES = 64 * 1024  # request line + headers; larger gets 431 (nginx: 4 x 8 KiB)
LINGER_S = 2.0  # after a 408/431 from the protocol, input is drained this long before closing
WRITE_STALL_S = 60.0  # a client that reads nothing of a response for this long is disconnected
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_BINDS = ("", "0.0.0.0", "::", "[::]")
SAFE_METHODS = frozenset(("GET", "HEAD", "OPTIONS"))
PROBE_PATHS = frozenset(("/healthz", "/readyz"))  # answered for any Host: orchestrator probes
FRAMING_HEADERS = (b"content-type", b"content-length", b"transfer-encoding")  # each at most once


# ---------------------------------------------------------------------------- client identity
def client_key(host: str | None) -> str | None:
    """The address limits are counted by: the IPv4 address, or the /64 of an IPv6 one (a single
    host usually owns a whole /64, so per-address limits would not bind it). None when unknown."""
    if not host:
        return None
    if ":" not in host:
        return host
    try:
        ip = ipaddress.IPv6Address(host.split("%", 1)[0])
    except ValueError:
        return host
    if ip.ipv4_mapped is not None:
        return str(ip.ipv4_mapped)
    if ip.is_loopback:
        return "::1"
    return str(ipaddress.IPv6Network((int(ip) >> 64 << 64, 64)))


def scope_client_key(scope) -> str | None:
    client = scope.get("client")
    return client_key(client[0]) if client else None


def connection_limit(settings) -> int:
    """``max_connections``, or half the soft RLIMIT_NOFILE when it is 0 (the other half stays for
    the store, the spool, decoder pipes and the model files)."""
    if settings.limits.max_connections:
        return settings.limits.max_connections
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft <= 0:
        soft = 65536
    return max(16, soft // 2)


class _EveryFewSeconds:
    """A warning logged at most once per ``period`` s, with how many were left out (a flood of
    refused connections must not become a flood of log lines)."""

    def __init__(self, period: float = 10.0):
        self.period = period
        self.last = 0.0
        self.skipped = 0

    def warning(self, msg: str, *args) -> None:
        now = time.monotonic()
        if now - self.last < self.period:
            self.skipped += 1
            return
        if self.skipped:
            msg += " (%d similar since the last report)"
            args = (*args, self.skipped)
        self.last, self.skipped = now, 0
        logger.warning(msg, *args)


class ConnectionLimits:
    """Open connections in all and per client key; shared by every connection of one server.
    Only touched on the event loop: no lock.

    At the global limit a new connection does not simply lose: the connection that has waited
    longest for a request's headers (an idle or trickling one; each has a header deadline running)
    is closed to make room, so that a flood of idle connections cannot lock out a client that
    sends its request at once. Only when every open connection is busy with a request is the new
    one closed."""

    def __init__(self, total: int, per_client: int):
        self.total_limit = total  # 0 = none
        self.per_client_limit = per_client  # 0 = none
        self.open = 0
        self.by_client: dict[str, int] = {}
        self.waiting: dict[object, None] = {}  # connections waiting for headers, oldest first
        self.refused = 0  # connections closed at once, since start
        self.evicted = 0  # waiting connections closed to make room for a new one
        self.write_stalled = 0  # connections closed because they stopped reading
        self.log = _EveryFewSeconds()
        self.evict_log = _EveryFewSeconds()

    def acquire(self, key: str | None) -> str | None:
        """Count a new connection; or say why it must be closed (it is then not counted)."""
        if (self.per_client_limit and key is not None
                and self.by_client.get(key, 0) >= self.per_client_limit):
            reason = f"client {key} has {self.by_client[key]} connections open, the most one client may"
        elif self.total_limit and self.open >= self.total_limit and not self._evict_one():
            reason = f"{self.open} connections are open and busy, the most this server keeps"
        else:
            self.open += 1
            if key is not None:
                self.by_client[key] = self.by_client.get(key, 0) + 1
            return None
        self.refused += 1
        self.log.warning("connection refused: %s", reason)
        return reason

    def _evict_one(self) -> bool:
        for victim in self.waiting:
            del self.waiting[victim]
            victim.evict()  # its descriptor is closed now; it is released in connection_lost
            self.evicted += 1
            self.evict_log.warning("connection limit (%d) reached: closed the connection that had "
                                   "waited longest for its request (%d so far)", self.total_limit,
                                   self.evicted)
            return True
        return False

    def release(self, key: str | None) -> None:
        self.open -= 1
        if key is not None:
            n = self.by_client.get(key, 0) - 1
            if n > 0:
                self.by_client[key] = n
            else:
                self.by_client.pop(key, None)


def _raw_response(e: SenseVoiceError, reason: str) -> bytes:
    """A domain error as raw HTTP bytes, for answers the protocol sends before any app runs."""
    body = orjson.dumps({"error": {"code": e.code, "message": e.message}})
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (e.status, reason.encode(), len(body))) + body


HEADER_TIMEOUT_RESPONSE = _raw_response(
    RequestTimeout("the request headers did not arrive in time"), "Request Timeout")
HEADERS_TOO_LARGE_RESPONSE = _raw_response(
    HeadersTooLarge(f"the request line and headers are larger than {MAX_HEADER_BYTES} bytes"),
    "Request Header Fields Too Large")


# ---------------------------------------------------------------------------- connection guard
class HeadWithBody:
    """The transport one request's response is written through: its first write (the response
    head) is held until the next write, and both leave in one send (``writelines``); held alone,
    it leaves at the end of this turn of the event loop (a streaming response's head does not wait
    for its first event). Everything else passes straight through.

    uvicorn writes a response's head and body in two sends; on loopback each send does the
    receiving side's TCP work too, and under load_test the head's send alone was ~20 % of the event
    loop's GIL samples (py-spy --gil): one send per response instead of two."""

    __slots__ = ("_transport", "_loop", "_head", "_first")

    def __init__(self, transport, loop):
        self._transport, self._loop = transport, loop
        self._head: bytes | None = None
        self._first = True

    def write(self, data) -> None:
        if self._first:
            self._first = False
            self._head = bytes(data)
            self._loop.call_soon(self.flush)
        elif self._head is not None:
            head, self._head = self._head, None
            self._transport.writelines((head, data))
        else:
            self._transport.write(data)

    def flush(self) -> None:
        if self._head is not None:
            head, self._head = self._head, None
            if not self._transport.is_closing():
                self._transport.write(head)

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def __getattr__(self, name):
        return getattr(self._transport, name)


class EdgeHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a header deadline, a header size cap and connection
    counts. Use ``http_protocol(settings)``: it binds the limits (a class per server)."""

    limits: ConnectionLimits = ConnectionLimits(0, 0)
    header_timeout_s: float = 10.0
    max_header_bytes: int = MAX_HEADER_BYTES
    write_stall_s: float = WRITE_STALL_S

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._header_timer = None
        self._in_headers = False  # a request has begun and its headers are not complete
        self._header_bytes = 0
        self._key: str | None = None
        self._counted = False  # released exactly once, in connection_lost
        self._discarding = False  # answered and closing: what still comes is dropped
        self._write_timer = None  # armed while the client reads nothing of a response

    # -- connection lifetime
    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        key = client_key(self.client[0]) if self.client else None
        if self.limits.acquire(key) is not None:
            transport.close()
            return
        self._key, self._counted = key, True
        self._arm_header_timer()

    def connection_lost(self, exc) -> None:
        self._cancel_header_timer()
        self._cancel_write_timer()
        self._release()
        super().connection_lost(exc)

    # -- the write-stall deadline
    def pause_writing(self) -> None:
        super().pause_writing()
        if self._write_timer is None:
            self._write_timer = self.loop.call_later(self.write_stall_s, self._write_stalled)

    def resume_writing(self) -> None:
        super().resume_writing()
        self._cancel_write_timer()

    def _cancel_write_timer(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_stalled(self) -> None:
        self._write_timer = None
        self.limits.write_stalled += 1
        self.limits.log.warning("connection from %s closed: it read nothing of its response for "
                                "%g s", self._key, self.write_stall_s)
        self.transport.abort()

    def _release(self) -> None:
        if self._counted:
            self._counted = False
            self.limits.release(self._key)

    def handle_websocket_upgrade(self) -> None:
        # the WebSocket protocol takes the transport over, and gets its connection_lost: the
        # connection is released from there
        super().handle_websocket_upgrade()
        ws = self.transport.get_protocol()
        if ws is self:
            return
        lost = ws.connection_lost

        def connection_lost(exc, _lost=lost):
            try:
                _lost(exc)
            finally:
                self._release()

        ws.connection_lost = connection_lost

    # -- the header deadline
    def _arm_header_timer(self) -> None:
        self._cancel_header_timer()
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._header_timeout)
        self.limits.waiting[self] = None

    def _cancel_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        self.limits.waiting.pop(self, None)

    def evict(self) -> None:
        """Closed to make room for a new connection (the server is at its connection limit)."""
        self._cancel_header_timer()
        self.transport.abort()

    def _header_timeout(self) -> None:
        self._header_timer = None
        self.limits.waiting.pop(self, None)
        if self.transport.is_closing():
            return
        if self._in_headers and not self._responding():  # a request had begun: say why it ends
            self._answer_and_close(HEADER_TIMEOUT_RESPONSE)
        else:
            self.transport.close()

    def _responding(self) -> bool:
        """A response is being sent (a pipelined request's head is late): nothing may be written
        into the middle of it."""
        return self.cycle is not None and not self.cycle.response_complete

    def _answer_and_close(self, response: bytes) -> None:
        """Send ``response`` and close, lingering: what the client still sends is read and
        dropped for up to LINGER_S, so that closing with unread bytes (a TCP reset) does not
        destroy the answer before the client has read it."""
        self._cancel_header_timer()
        self._in_headers = False
        self._discarding = True
        self.transport.write(response)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self._header_timer = self.loop.call_later(LINGER_S, self.transport.close)
        self.limits.waiting[self] = None  # the first to go at the connection limit

    def data_received(self, data: bytes) -> None:
        if self._discarding:
            return
        was_in_headers = self._in_headers
        super().data_received(data)
        # bytes of an unfinished request head; a chunk in which a request began is not counted,
        # which leaves at most one read (256 KiB) beyond the cap
        if was_in_headers and self._in_headers:
            self._header_bytes += len(data)
            if self._header_bytes > self.max_header_bytes and not self.transport.is_closing():
                if self._responding():
                    self.transport.abort()
                else:
                    self._answer_and_close(HEADERS_TOO_LARGE_RESPONSE)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_headers = True
        self._header_bytes = 0
        if self._header_timer is None:  # e.g. a pipelined request while a response is running
            self._arm_header_timer()

    def on_headers_complete(self) -> None:
        self._in_headers = False
        self._cancel_header_timer()
        super().on_headers_complete()
        if self.cycle is not None and not isinstance(self.cycle.transport, HeadWithBody):
            self.cycle.transport = HeadWithBody(self.transport, self.loop)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # the next request's headers are due within the deadline too (uvicorn's keep-alive timer
        # only covers a connection that sends nothing, and any byte cancels it)
        if (not self.transport.is_closing() and self._header_timer is None
                and (self.cycle is None or self.cycle.response_complete)):
            self._arm_header_timer()


def http_protocol(settings, write_stall_s: float = WRITE_STALL_S) -> type[EdgeHttpProtocol]:
    """The protocol class for ``uvicorn.run(..., http=...)`` with this server's limits. Each call
    makes a class with its own counts (``cls.limits``)."""
    limits = ConnectionLimits(connection_limit(settings), settings.limits.max_connections_per_client)
    return type("EdgeHttpProtocol", (EdgeHttpProtocol,), {
        "limits": limits, "header_timeout_s": float(settings.limits.header_timeout_s),
        "write_stall_s": float(write_stall_s)})


def websocket_limits(settings) -> dict:
    """uvicorn's WebSocket options for this server: one message at most twice the largest live
    frame (the live route answers frames over the frame limit itself, with a reason) and 16
    messages buffered per connection, so that a live stream holds a bounded amount of memory in
    the protocol layer whatever its client sends (uvicorn's defaults: 16 MiB x 32)."""
    return {"ws_max_size": 2 * settings.live.max_frame_bytes, "ws_max_queue": 16}


def proxy_options(settings) -> dict:
    """uvicorn's X-Forwarded-For/-Proto options: believed only from ``trusted_proxies`` (none by
    default). uvicorn's own default trusts 127.0.0.1 (or ``FORWARDED_ALLOW_IPS``): a local
    client, or anything relayed from loopback, could then choose the address that the
    per-client limits and the sign-in throttle count it by (issue 19: 12 live streams over a
    limit of 8, a victim's address locked out by 20 wrong tokens sent in its name)."""
    trusted = [i.strip() for i in settings.server.trusted_proxies.split(",") if i.strip()]
    return {"proxy_headers": bool(trusted), "forwarded_allow_ips": trusted or None}


def uvicorn_options(settings, write_stall_s: float = WRITE_STALL_S) -> dict:
    """Every guard ``uvicorn.run``/``uvicorn.Config`` takes for this server: the edge protocol,
    the WebSocket message limits and the forwarded-address trust."""
    return {"http": http_protocol(settings, write_stall_s), **websocket_limits(settings),
            **proxy_options(settings)}


# ---------------------------------------------------------------------------- Host and Origin
def split_host(value: str) -> tuple[str, int | None]:
    """'Example.COM:8080' -> ('example.com', 8080); '[::1]:80' -> ('::1', 80); a trailing dot is
    dropped. A bad port gives port -1 (it matches nothing)."""
    value = value.strip().lower()
    port: int | None = None
    if value.startswith("["):
        end = value.find("]")
        if end < 0:
            return value, -1
        host, rest = value[1:end], value[end + 1:]
        if rest:
            if not rest.startswith(":"):
                return value, -1
            port = int(rest[1:]) if rest[1:].isdigit() else -1
    elif value.count(":") == 1:
        host, _, p = value.partition(":")
        port = int(p) if p.isdigit() else -1
    else:
        host = value  # a name, an IPv4 address, or a bare IPv6 address (no port)
    return host.rstrip("."), port


def allowed_hosts(settings) -> frozenset[str] | None:
    """The Host names this server answers (compared without the port, in lower case), or None
    for any ('*' in the list). Always the loopback names and the bound address when it is not a
    wildcard; plus the comma-separated ``allowed_hosts``. An entry '*.example.com' allows the
    subdomains of example.com."""
    names: set[str] = set(LOOPBACK_NAMES)
    bound = settings.server.host.strip().lower()
    if bound not in WILDCARD_BINDS:
        names.add(split_host(bound)[0] if bound.startswith("[") else bound.rstrip("."))
    for item in settings.server.allowed_hosts.split(","):
        item = item.strip()
        if not item:
            continue
        if item == "*":
            return None
        names.add(split_host(item)[0])
    return frozenset(names)


def host_allowed(host: str, allowed: frozenset[str] | None) -> bool:
    if allowed is None:
        return True
    if not host:
        return False
    if host in allowed:
        return True
    dot = host.find(".")
    while dot >= 0:  # '*.example.com' for a.example.com, a.b.example.com
        if "*" + host[dot:] in allowed:
            return True
        dot = host.find(".", dot + 1)
    return False


DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def same_origin(origin: str, scheme: str, host_header: str) -> bool:
    """``Origin`` equals the request's own scheme://host[:port] (default ports filled in)."""
    o_scheme, sep, rest = origin.strip().lower().partition("://")
    if not sep or not rest or "/" in rest:
        return False  # 'null', or not an origin
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
    if o_scheme != scheme:
        return False
    o_host, o_port = split_host(rest)
    r_host, r_port = split_host(host_header)
    default = DEFAULT_PORTS.get(scheme)
    return o_host == r_host and (o_port or default) == (r_port or default) and o_port != -1


def header_parameters(value: bytes) -> list[bytes]:
    """The parameter names of a header value like ``type; a=1; b="x;y"`` (lower case, in order;
    a ``;`` inside quotes separates nothing)."""
    names, segment, quoted, escaped = [], bytearray(), False, False
    for byte in value + b";":
        if escaped:
            escaped = False
        elif quoted and byte == 0x5C:  # backslash
            escaped = True
        elif byte == 0x22:  # double quote
            quoted = not quoted
        elif byte == 0x3B and not quoted:  # ;
            names.append(bytes(segment).partition(b"=")[0].strip().lower())
            segment.clear()
            continue
        segment.append(byte)
    return names[1:]  # (the first segment is the type itself)


def ambiguous_framing(headers) -> str | None:
    """Why a request's body could be read two ways (see the module's docstring), or None."""
    seen: dict[bytes, bytes] = {}
    for name, value in headers:
        name = name.lower()
        if name in FRAMING_HEADERS:
            if name in seen:
                return f"the {name.decode()} header is given twice"
            seen[name] = value
    params = header_parameters(seen.get(b"content-type", b""))
    if len(set(params)) != len(params):
        return "a parameter of the content-type header is given twice"
    return None


class HostOriginGuard:
    """ASGI middleware, the outermost of the app's own (in front of FastPolls): a Host this
    server does not answer for gets 400 host_not_allowed (DNS rebinding); a browser request from
    another site that could change state gets 403 cross_site_request (CSRF); a body that could
    be read two ways, 400 ambiguous_request. HTTP and WebSocket scopes. /healthz and /readyz answer any Host (probes address the server by its IP)."""

    def __init__(self, app, allowed: frozenset[str] | None, probe_paths=PROBE_PATHS):
        self.app = app
        self.allowed = allowed
        self.probe_paths = probe_paths

    async def __call__(self, scope, receive, send):
        kind = scope["type"]
        if kind != "http" and kind != "websocket":
            return await self.app(scope, receive, send)
        host = origin = fetch_site = None
        for name, value in scope["headers"]:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
            elif name == b"sec-fetch-site":
                fetch_site = value
        host_header = host.decode("latin-1") if host is not None else ""
        if self.allowed is not None and scope["path"] not in self.probe_paths:
            name = split_host(host_header)[0]
            if not host_allowed(name, self.allowed):
                return await refuse(scope, send, HostNotAllowed(
                    f"this server does not answer for host {name[:100]!r}; list it in "
                    "SENSEVOICE_ALLOWED_HOSTS to allow it"))
        if kind == "websocket" or scope["method"] not in SAFE_METHODS:
            site = fetch_site.lower() if fetch_site is not None else b""
            if site == b"cross-site" or site == b"same-site":
                return await refuse(scope, send, CrossSiteRequest(
                    f"a {site.decode()} browser request may not change anything here"))
            if origin is not None and not same_origin(origin.decode("latin-1"), scope["scheme"],
                                                      host_header):
                return await refuse(scope, send, CrossSiteRequest(
                    f"a request from origin {origin.decode('latin-1')[:100]!r} may not change "
                    "anything here"))
        if kind == "http" and (why := ambiguous_framing(scope["headers"])) is not None:
            return await refuse(scope, send, AmbiguousRequest(
                f"{why}: a request's body must be readable one way only"))
        await self.app(scope, receive, send)


async def refuse(scope, send, e: SenseVoiceError, headers: list[tuple[bytes, bytes]] = ()) -> None:
    """Answer ``e`` as JSON before the app runs, on an HTTP or a WebSocket scope (a WebSocket
    refusal is an HTTP answer to the upgrade where the server allows it, else a close)."""
    body = orjson.dumps({"error": {"code": e.code, "message": e.message}})
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), *headers]
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": e.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    elif "websocket.http.response" in (scope.get("extensions") or {}):
        await send({"type": "websocket.http.response.start", "status": e.status, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
    else:  # the server answers 403 to a close before accept
        await send({"type": "websocket.close", "code": 1008})


def replay_body(body: bytes, receive):
    """An ASGI ``receive`` that gives a body already read, once, then the connection's own
    messages (its disconnect): for middleware that read a request before passing it on."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed
