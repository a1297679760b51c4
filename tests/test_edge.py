"""Edge guards (pipeline/web/edge.py, UploadLimit in pipeline/web/api.py): each attack is made on a real
server on loopback with raw sockets, with the protocol class main() runs (uvloop + httptools +
EdgeHttpProtocol). Other loopback addresses (127.0.0.2, ...) stand for other clients."""

from __future__ import annotations

import asyncio
import select
import socket
import threading
import time

import httpx
import pytest

from pipeline.web.middleware import UploadLimit
from pipeline.web.edge import (ConnectionLimits, allowed_hosts, client_key, connection_limit,
                           host_allowed, http_protocol, same_origin, split_host)
from tests.conftest import LiveServer, make_settings
from tests.test_api import wait_done

HEADER_TIMEOUT = 1.0
GRACE = 1.0
WRITE_STALL = 1.0


def edge_server(settings) -> LiveServer:
    """LiveServer, run as main() runs it: uvloop, and the edge protocol class."""
    import uvicorn

    server = LiveServer(settings)
    server.protocol = http_protocol(settings, write_stall_s=WRITE_STALL)
    config = uvicorn.Config(server.app, host="127.0.0.1", port=settings.server.port, log_level="warning",
                            loop="uvloop", http=server.protocol)
    server.server = uvicorn.Server(config)
    server.thread = threading.Thread(target=server.server.run, daemon=True)
    return server


@pytest.fixture(scope="module")
def edge(demo_dir, tmp_path_factory):
    settings = make_settings(demo_dir, tmp_path_factory.mktemp("edge"),
                             header_timeout_s=HEADER_TIMEOUT, body_grace_s=GRACE,
                             body_min_rate_bytes_s=8192, max_concurrent_uploads=2,
                             max_uploads_per_client=1, max_connections_per_client=20,
                             max_connections=120)
    server = edge_server(settings).start()
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _counts_return_to_zero(request):
    """After every test on the server: no upload slot and no connection is left counted."""
    yield
    if "edge" not in request.fixturenames:
        return
    server = request.getfixturevalue("edge")
    limit, conns = upload_limit(server), server.protocol.limits
    deadline = time.monotonic() + 10
    while (limit.in_flight or limit.per_client or conns.open) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert (limit.in_flight, limit.per_client) == (0, {})
    assert (conns.open, conns.by_client) == (0, {})


def upload_limit(server) -> UploadLimit:
    app = server.app.middleware_stack
    while not isinstance(app, UploadLimit):
        app = app.app
    return app


def connect(server, source: str = "127.0.0.1", timeout: float = 10.0) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.settings.server.port), timeout=timeout,
                                    source_address=(source, 0))


def read_until_closed(sock: socket.socket) -> bytes:
    data = b""
    try:
        while part := sock.recv(65536):
            data += part
    except ConnectionResetError:
        pass
    return data


def is_open(sock: socket.socket) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except ConnectionResetError:
        return False
    finally:
        sock.setblocking(True)


def client(source: str = "127.0.0.1", **kw) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=30, **kw)


def submit_from(server, path, source: str = "127.0.0.1", headers=None) -> httpx.Response:
    with client(source) as c, open(path, "rb") as f:
        return c.post(server.url + "/api/jobs", files={"file": (path.name, f)}, headers=headers)


def job_count(server) -> int:
    return sum(server.runtime.broker.counts().values())


def slow_upload(server, source: str, length: int = 10_000_000) -> socket.socket:
    """The headers of a large multipart upload, and its first bytes; the rest never comes."""
    sock = connect(server, source)
    sock.sendall(b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                 b"Content-Type: multipart/form-data; boundary=x\r\n"
                 b"Content-Length: %d\r\n\r\n--x\r\n"
                 b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
                 b"Content-Type: audio/wav\r\n\r\n" % length)
    return sock


# ---------------------------------------------------------------------------- headers
def test_idle_and_slow_header_connections_are_closed_after_the_deadline(edge):
    idle = connect(edge)
    slow = connect(edge)
    t0 = time.monotonic()
    slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
    answers: dict[str, tuple[float, bytes]] = {}

    def trickle():  # a header byte every 0.2 s, for ever (it is never complete)
        try:
            while True:
                time.sleep(0.2)
                slow.sendall(b"a")
        except OSError:
            pass

    def wait(name, sock):
        data = read_until_closed(sock)
        answers[name] = (time.monotonic() - t0, data)

    threads = [threading.Thread(target=trickle, daemon=True),
               threading.Thread(target=wait, args=("idle", idle)),
               threading.Thread(target=wait, args=("slow", slow))]
    for t in threads:
        t.start()
    # a normal request is served meanwhile
    assert httpx.get(edge.url + "/healthz", timeout=5).status_code == 200
    for t in threads[1:]:
        t.join(10)
    idle.close()
    slow.close()
    assert HEADER_TIMEOUT * 0.9 <= answers["idle"][0] < HEADER_TIMEOUT + 2, answers
    assert answers["idle"][1] == b""  # nothing was asked: closed without an answer
    assert HEADER_TIMEOUT * 0.9 <= answers["slow"][0] < HEADER_TIMEOUT + 2, answers
    assert answers["slow"][1].startswith(b"HTTP/1.1 408"), answers
    assert b"request_timeout" in answers["slow"][1]


def test_slow_headers_of_a_keep_alive_request_are_cut_off_too(edge):
    """After a response, the next request's headers are due within the deadline (uvicorn's own
    keep-alive timer, 5 s, is cancelled by any byte the client sends)."""
    sock = connect(edge)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    first = b""
    while b'{"status":"ok"}' not in first:
        first += sock.recv(4096)
    t0 = time.monotonic()
    sock.sendall(b"GET /healthz HTTP/1.1\r\n")
    try:
        while time.monotonic() - t0 < 10 and not select.select([sock], [], [], 0.2)[0]:
            sock.sendall(b"X-A: b\r\n")  # a header line every 0.2 s, never the end
    except OSError:
        pass
    elapsed = time.monotonic() - t0  # until the server answered or closed
    rest = read_until_closed(sock)
    sock.close()
    assert elapsed < HEADER_TIMEOUT + 2, elapsed
    assert rest == b"" or rest.startswith(b"HTTP/1.1 408"), rest


def test_oversized_request_headers_get_431(edge):
    sock = connect(edge)
    sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: ")
    try:
        for _ in range(64):  # 4 MiB of one header line (httptools would buffer all of it)
            sock.sendall(b"a" * 65536)
    except OSError:
        pass  # closed under our feet: expected
    answer = read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]


# ---------------------------------------------------------------------------- connections
def test_connections_beyond_the_per_client_limit_are_closed_at_once(edge):
    per_client = edge.settings.limits.max_connections_per_client
    held = [connect(edge, "127.0.0.2") for _ in range(per_client)]
    t0 = time.monotonic()
    extra = [connect(edge, "127.0.0.2") for _ in range(5)]
    closed = [read_until_closed(s) for s in extra]
    took = time.monotonic() - t0
    try:
        assert closed == [b""] * 5 and took < HEADER_TIMEOUT / 2, took  # not the header deadline
        assert all(is_open(s) for s in held)
        assert edge.protocol.limits.by_client["127.0.0.2"] == per_client
        # another client is served meanwhile
        with client("127.0.0.3") as c:
            assert c.get(edge.url + "/healthz").status_code == 200
        # and so is the same client once it has closed one of its connections
        held.pop().close()
        time.sleep(0.1)
        with client("127.0.0.2") as c:
            assert c.get(edge.url + "/healthz").status_code == 200
    finally:
        for s in held + extra:
            s.close()


def _fill_to_the_global_limit(edge, opening: bytes) -> list[socket.socket]:
    limits = edge.protocol.limits
    per_client = edge.settings.limits.max_connections_per_client
    room = limits.total_limit - limits.open
    held = []
    for i in range(room):
        held.append(connect(edge, f"127.0.1.{i // per_client + 1}"))
        if opening:
            held[-1].sendall(opening)
    deadline = time.monotonic() + 5
    while limits.open < limits.total_limit and time.monotonic() < deadline:
        time.sleep(0.01)
    assert limits.open == limits.total_limit
    return held


def test_at_the_global_limit_the_longest_waiting_connection_makes_room(edge):
    """A flood of idle connections up to max_connections: a new client still gets in (the
    connection that has waited longest for its headers is closed for it) and is served."""
    limits = edge.protocol.limits
    held = _fill_to_the_global_limit(edge, b"")
    try:
        evicted = limits.evicted
        with client("127.0.0.9") as c:
            assert c.get(edge.url + "/healthz").status_code == 200
        assert limits.evicted == evicted + 1
        assert not is_open(held[0]) and all(is_open(s) for s in held[1:])
        assert limits.open <= limits.total_limit
    finally:
        for s in held:
            s.close()


def test_at_the_global_limit_busy_connections_are_kept_and_the_new_one_closed(edge):
    """When every open connection is busy with a request (here: bodies still coming), a new
    connection is closed at once; the server holds no more descriptors than max_connections."""
    limits = edge.protocol.limits
    held = _fill_to_the_global_limit(edge, b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                     b"Content-Type: multipart/form-data; boundary=x\r\n"
                                     b"Content-Length: 1000\r\n\r\n--x\r\n")
    try:
        time.sleep(0.1)
        assert not limits.waiting  # all have sent their headers
        t0 = time.monotonic()
        refused = connect(edge, "127.0.0.9")
        assert read_until_closed(refused) == b"" and time.monotonic() - t0 < GRACE / 2
        refused.close()
        assert limits.open == limits.total_limit and all(is_open(s) for s in held)
    finally:
        for s in held:
            s.close()


def test_a_client_that_stops_reading_its_response_is_disconnected(edge, tmp_path):
    """A download the client never reads (its socket full, the server's write buffer full) is
    cut off after the write-stall deadline: it holds no connection, task or file for ever."""
    import wave

    path = tmp_path / "silence.wav"  # 5 min, 9.6 MB: more than every socket buffer holds
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"\0" * (2 * 16000 * 300))
    r = submit_from(edge, path)
    assert r.status_code == 202, r.text
    limits = edge.protocol.limits
    stalled = limits.write_stalled
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(10)
    sock.connect(("127.0.0.1", edge.settings.server.port))
    sock.sendall(f"GET /api/jobs/{r.json()['id']}/audio HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    t0 = time.monotonic()
    while limits.write_stalled == stalled and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    took = time.monotonic() - t0
    received = len(read_until_closed(sock))
    sock.close()
    assert limits.write_stalled == stalled + 1 and WRITE_STALL * 0.9 <= took < WRITE_STALL + 3, took
    assert received < path.stat().st_size
    wait_done(edge, r.json()["id"])


# ---------------------------------------------------------------------------- bodies
def test_slow_bodies_get_408_and_free_their_slots(edge, clip_factory):
    """Two uploads trickling 2 B/s take both upload slots; after the grace period each gets 408
    request_timeout and its slot is free: a normal upload then succeeds."""
    large = clip_factory("wav", 44100, 2)  # ~0.5 MB: a counted upload
    slow = [slow_upload(edge, "127.0.0.2"), slow_upload(edge, "127.0.0.3")]
    t0 = time.monotonic()
    answers: list[tuple[float, bytes]] = [None, None]

    def trickle(i, sock):
        try:
            while True:
                sock.sendall(b"ab")
                time.sleep(1)
        except OSError:
            pass

    def wait(i, sock):
        data = read_until_closed(sock)
        answers[i] = (time.monotonic() - t0, data)

    threads = [threading.Thread(target=f, args=(i, s), daemon=True)
               for i, s in enumerate(slow) for f in (trickle, wait)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    r = submit_from(edge, large, "127.0.0.4")
    assert r.status_code == 503 and r.json()["error"]["code"] == "too_many_uploads"
    for t in threads:
        t.join(10)
    for s in slow:
        s.close()
    for took, data in answers:
        assert data.startswith(b"HTTP/1.1 408") and b"request_timeout" in data, data[:300]
        assert b"connection: close" in data.lower()
        assert GRACE * 0.9 <= took < GRACE + 3, took
    assert upload_limit(edge).in_flight == 0
    r = submit_from(edge, large, "127.0.0.4")
    assert r.status_code == 202, r.text
    assert wait_done(edge, r.json()["id"])["status"] == "done"


def test_per_client_upload_limit_is_429(edge, clip_factory):
    """A client with an upload in progress (steady, fast enough) may not start another one: 429
    with Retry-After; another client may."""
    large = clip_factory("wav", 44100, 2)
    sock = slow_upload(edge, "127.0.0.1")
    stop = threading.Event()

    def steady():  # 32 KiB/s: well above the minimum rate
        try:
            while not stop.wait(0.25):
                sock.sendall(b"\0" * 8192)
        except OSError:
            pass

    t = threading.Thread(target=steady, daemon=True)
    t.start()
    try:
        time.sleep(0.3)
        assert upload_limit(edge).per_client == {"127.0.0.1": 1}
        r = submit_from(edge, large, "127.0.0.1")
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_uploads_from_client"
        assert int(r.headers["retry-after"]) >= 1
        r = submit_from(edge, large, "127.0.0.5")
        assert r.status_code == 202, r.text
        assert is_open(sock)  # the steady upload is still going
    finally:
        stop.set()
        t.join(5)
        sock.close()
    assert wait_done(edge, r.json()["id"])["status"] == "done"


def test_slots_are_released_once_whatever_the_outcome(edge, clip_factory, tmp_path):
    """Accepted, refused before and while streaming, timed out, abandoned: after each response
    the slot counts are back to zero (never negative, never left over)."""
    limit = upload_limit(edge)
    large = clip_factory("wav", 44100, 2)
    not_audio = tmp_path / "x.wav"
    not_audio.write_bytes(b"\0" * 200_000)

    def settled():
        deadline = time.monotonic() + 5
        while (limit.in_flight or limit.per_client) and time.monotonic() < deadline:
            time.sleep(0.02)
        return limit.in_flight, dict(limit.per_client)

    r = submit_from(edge, large)
    assert r.status_code == 202 and settled() == (0, {})
    assert submit_from(edge, not_audio).status_code == 415 and settled() == (0, {})
    sock = slow_upload(edge, "127.0.0.1", length=edge.settings.limits.max_upload_bytes * 2)
    answer = sock.recv(4096)  # a declared length over the cap: refused before the body
    sock.close()
    assert answer.startswith(b"HTTP/1.1 413") and settled() == (0, {})
    sock = slow_upload(edge, "127.0.0.1")  # abandoned mid-body
    time.sleep(0.3)
    assert limit.in_flight == 1
    sock.close()
    assert settled() == (0, {})
    sock = slow_upload(edge, "127.0.0.1")  # timed out
    assert read_until_closed(sock).startswith(b"HTTP/1.1 408")
    sock.close()
    assert settled() == (0, {})
    assert submit_from(edge, large).status_code == 202 and settled() == (0, {})


def _run(coro):
    return asyncio.run(coro)


async def _app_after_response(scope, receive, send):
    """Reads the body, answers, then keeps working (a background task) and fails."""
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
    _app_after_response.in_flight_after_response = _app_after_response.limit.in_flight
    raise RuntimeError("after the response")


def test_slot_is_released_when_the_response_is_sent_and_only_once():
    limit = UploadLimit(_app_after_response, max_bytes=10**6, max_in_flight=2, max_per_client=2)
    _app_after_response.limit = limit
    scope = {"type": "http", "method": "POST", "path": "/x", "client": ("10.0.0.1", 1),
             "headers": [(b"content-length", b"100000")]}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b"\0" * 100000, "more_body": False}

    async def send(message):
        sent.append(message)

    with pytest.raises(RuntimeError):
        _run(limit(scope, receive, send))
    assert _app_after_response.in_flight_after_response == 0  # freed with the final message
    assert (limit.in_flight, limit.per_client) == (0, {})  # and not again in the finally


def test_body_deadline_and_minimum_rate_in_the_middleware():
    async def app(scope, receive, send):
        while (await receive()).get("more_body"):
            pass
        await send({"type": "http.response.start", "status": 202, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    def run(chunks, interval, **kw):
        limit = UploadLimit(app, max_bytes=10**9, max_in_flight=4, **kw)
        scope = {"type": "http", "method": "POST", "path": "/x", "client": ("10.0.0.1", 1),
                 "headers": [(b"transfer-encoding", b"chunked")]}
        sent = []

        async def receive():
            await asyncio.sleep(interval)
            chunks[0] -= 1
            return {"type": "http.request", "body": b"\0" * 1000, "more_body": chunks[0] > 0}

        async def send(message):
            sent.append(message)

        async def main():
            t0 = time.monotonic()
            await limit(scope, receive, send)
            return time.monotonic() - t0

        took = _run(main())
        assert limit.in_flight == 0
        return sent[0]["status"], took

    # 1000 B every 50 ms = 20 kB/s: above a 8 kB/s minimum, below a 40 kB/s one
    assert run([10], 0.05, min_rate_bytes_s=8000, grace_s=0.2)[0] == 202
    status, took = run([100], 0.05, min_rate_bytes_s=40000, grace_s=0.2)
    assert status == 408 and took < 0.5
    # the whole body must come within body_timeout_s, however fast it is
    status, took = run([100], 0.05, body_timeout_s=0.3)
    assert status == 408 and 0.25 < took < 0.6
    assert run([5], 0.05, body_timeout_s=0.6)[0] == 202


# ---------------------------------------------------------------------------- Host and Origin
def test_cross_origin_upload_is_refused_and_creates_no_job(edge, clip_factory):
    wav = clip_factory("wav", 16000, 1)
    before = job_count(edge)
    for headers in ({"Origin": "https://evil.example"}, {"Origin": "null"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"},
                    {"Origin": f"http://127.0.0.1:{edge.settings.server.port + 1}"},
                    {"Origin": f"https://127.0.0.1:{edge.settings.server.port}"}):
        r = submit_from(edge, wav, headers=headers)
        assert r.status_code == 403, (headers, r.status_code)
        assert r.json()["error"]["code"] == "cross_site_request"
    assert job_count(edge) == before
    # the same origin (a page of this server), and clients that send neither header, may
    for headers in ({"Origin": edge.url, "Sec-Fetch-Site": "same-origin"},
                    {"Origin": f"http://localhost:{edge.settings.server.port}",
                     "Host": f"localhost:{edge.settings.server.port}"},
                    {"Sec-Fetch-Site": "none"}, {}):
        r = submit_from(edge, wav, headers=headers)
        assert r.status_code == 202, (headers, r.text)
    assert job_count(edge) == before + 4
    # reading is not state-changing: a cross-site GET is left to the browser's CORS rules
    assert httpx.get(edge.url + "/healthz", headers={"Origin": "https://evil.example"}).status_code == 200


def test_rebinding_host_is_refused_on_polls_and_the_ui(edge, clip_factory):
    r = submit_from(edge, clip_factory("wav", 16000, 1))
    job_id = r.json()["id"]
    wait_done(edge, job_id)
    assert edge.runtime.view.get_cached(job_id) is not None  # FastPolls would answer it
    port = edge.settings.server.port
    for path in (f"/api/jobs/{job_id}", f"/api/jobs/{job_id}/result", "/ui/", "/metrics", "/"):
        for host in ("evil.example", f"evil.example:{port}", "127.0.0.1.evil.example"):
            r = httpx.get(edge.url + path, headers={"Host": host})
            assert r.status_code == 400, (path, host, r.status_code)
            assert r.json()["error"]["code"] == "host_not_allowed"
            assert job_id not in r.text
    for host in (f"127.0.0.1:{port}", f"LOCALHOST:{port}", "localhost", f"[::1]:{port}"):
        r = httpx.get(f"{edge.url}/api/jobs/{job_id}", headers={"Host": host})
        assert r.status_code == 200 and r.json()["status"] == "done", host
    assert httpx.get(edge.url + "/ui/", timeout=30).status_code == 200
    # probes answer whatever Host an orchestrator sends
    assert httpx.get(edge.url + "/healthz", headers={"Host": "10.1.2.3:7860"}).status_code == 200
    # a raw request with no Host at all (HTTP/1.0) is refused too
    sock = connect(edge)
    sock.sendall(f"GET /api/jobs/{job_id} HTTP/1.0\r\n\r\n".encode())
    answer = read_until_closed(sock)
    sock.close()
    assert answer.startswith(b"HTTP/1.1 400") and b"host_not_allowed" in answer


@pytest.mark.parametrize("headers,status", [
    ({"Host": "evil.example"}, b"400"),
    ({"Origin": "https://evil.example"}, b"403"),
    ({"Sec-Fetch-Site": "cross-site"}, b"403"),
])
def test_websocket_upgrades_are_guarded(edge, headers, status):
    sock = connect(edge)
    head = {"Host": f"127.0.0.1:{edge.settings.server.port}", "Upgrade": "websocket",
            "Connection": "Upgrade", "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==",
            "Sec-WebSocket-Version": "13", **headers}
    sock.sendall(("GET /ui/anything HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in head.items())
                  + "\r\n").encode())
    answer = b""
    while b"\r\n\r\n" not in answer:
        part = sock.recv(4096)
        if not part:
            break
        answer += part
    sock.close()
    assert answer.startswith(b"HTTP/1.1 " + status), answer[:200]


# ---------------------------------------------------------------------------- settings
def test_allowed_hosts_setting(tmp_path):
    from pipeline.config import Settings

    loopback = {"localhost", "127.0.0.1", "::1"}
    assert allowed_hosts(Settings()) == loopback  # bound to 127.0.0.1 by default
    assert allowed_hosts(Settings(host="0.0.0.0")) == loopback
    assert allowed_hosts(Settings(host="::")) == loopback
    assert allowed_hosts(Settings(host="192.168.1.20")) == loopback | {"192.168.1.20"}
    assert allowed_hosts(Settings(host="fe80::1")) == loopback | {"fe80::1"}
    got = allowed_hosts(Settings(host="0.0.0.0",
                                 allowed_hosts=" ASR.Example.com:8443, [2001:db8::5], *.lan., ,"))
    assert got == loopback | {"asr.example.com", "2001:db8::5", "*.lan"}
    assert allowed_hosts(Settings(allowed_hosts="asr.example.com,*")) is None

    assert host_allowed("asr.example.com", got) and host_allowed("box.lan", got)
    assert host_allowed("a.b.lan", got) and not host_allowed("lan", got)
    assert not host_allowed("evil.example", got) and not host_allowed("", got)
    assert not host_allowed("asr.example.com.evil.example", got)
    assert host_allowed("anything", None)

    assert split_host("Example.COM.:8080") == ("example.com", 8080)
    assert split_host("[::1]:7860") == ("::1", 7860) and split_host("[::1]") == ("::1", None)
    assert split_host("::1") == ("::1", None) and split_host("x:abc") == ("x", -1)

    assert same_origin("http://127.0.0.1:7860", "http", "127.0.0.1:7860")
    assert same_origin("http://localhost", "http", "LOCALHOST:80")
    assert same_origin("https://asr.example.com", "https", "asr.example.com")
    assert same_origin("http://127.0.0.1:7860", "ws", "127.0.0.1:7860")
    assert not same_origin("null", "http", "127.0.0.1:7860")
    assert not same_origin("http://127.0.0.1:7861", "http", "127.0.0.1:7860")
    assert not same_origin("https://127.0.0.1:7860", "http", "127.0.0.1:7860")
    assert not same_origin("http://evil.example", "http", "127.0.0.1")


def test_connection_settings():
    import resource

    from pipeline.config import Settings

    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert connection_limit(Settings()) == max(16, soft // 2)
    assert connection_limit(Settings(max_connections=100)) == 100
    cls = http_protocol(Settings(max_connections=100, max_connections_per_client=7,
                                 header_timeout_s=3))
    assert (cls.limits.total_limit, cls.limits.per_client_limit, cls.header_timeout_s) == (100, 7, 3.0)
    assert http_protocol(Settings()).limits is not cls.limits  # a server's own counts

    limits = ConnectionLimits(total=3, per_client=2)
    assert limits.acquire("a") is None and limits.acquire("a") is None
    assert "client a" in limits.acquire("a")
    assert limits.acquire("b") is None and "connections are open" in limits.acquire("c")
    for key in ("a", "a", "b"):
        limits.release(key)
    assert (limits.open, limits.by_client, limits.refused) == (0, {}, 2)

    assert client_key("10.0.0.1") == "10.0.0.1" and client_key(None) is None
    assert client_key("::ffff:10.0.0.1") == "10.0.0.1" and client_key("::1") == "::1"
    assert client_key("2001:db8:1:2:aaaa::1") == client_key("2001:db8:1:2:bbbb::9") == "2001:db8:1:2::/64"


class _Transport:
    def __init__(self):
        self.sent: list[bytes] = []  # one entry per send
        self.closed = False

    def write(self, data):
        self.sent.append(bytes(data))

    def writelines(self, parts):
        self.sent.append(b"".join(parts))

    def is_closing(self):
        return self.closed

    def close(self):
        self.closed = True

    def get_extra_info(self, name, default=None):
        return "info"


class _Loop:
    def __init__(self):
        self.soon = []

    def call_soon(self, fn):
        self.soon.append(fn)

    def turn(self):
        soon, self.soon = self.soon, []
        for fn in soon:
            fn()


def test_a_response_head_leaves_with_its_body_in_one_send():
    from pipeline.web.edge import HeadWithBody

    raw, loop = _Transport(), _Loop()
    t = HeadWithBody(raw, loop)
    t.write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert raw.sent == []  # held for the body
    t.write(b"body")
    t.write(b"more")  # later writes pass straight through
    loop.turn()
    assert raw.sent == [b"HTTP/1.1 200 OK\r\n\r\nbody", b"more"]
    assert t.get_extra_info("peername") == "info"


def test_a_head_alone_leaves_at_the_end_of_the_loop_turn_and_before_a_close():
    from pipeline.web.edge import HeadWithBody

    raw, loop = _Transport(), _Loop()
    streaming = HeadWithBody(raw, loop)
    streaming.write(b"HEAD")  # an event stream's head: its first event may come much later
    loop.turn()
    assert raw.sent == [b"HEAD"]
    raw2 = _Transport()
    closing = HeadWithBody(raw2, _Loop())
    closing.write(b"HEAD")
    closing.close()
    assert raw2.sent == [b"HEAD"] and raw2.closed
