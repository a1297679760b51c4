"""The owner's sibling socket (pipeline/serving/sibling_hub.py) before a connection is trusted
(issue 36): a connection that declared a 2 GiB first frame had it allocated -- and sat waiting
for it -- before its secret was checked. Now the hello is read within HELLO_MAX_BYTES and a
connection without one is closed at once; a sibling that gave the secret sends frames of any
size up to MAX_PAYLOAD_BYTES as before."""

from __future__ import annotations

import os
import socket
import time

import orjson
import pytest

from pipeline.serving import sibling_hub
from pipeline.serving import sibling_wire as wire
from pipeline.serving.broker import EmbeddedBroker
from pipeline.serving.broker_sibling import SiblingBroker
from pipeline.serving.scheduler import Scheduler
from pipeline.serving.sibling_hub import SiblingHub

PAGE = os.sysconf("SC_PAGE_SIZE")
SECRET = "s3cret"


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


@pytest.fixture
def hub(tmp_path):
    hub = SiblingHub(str(tmp_path / "hub.sock"), SECRET, EmbeddedBroker(tmp_path, Scheduler(8)),
                     lambda job: None, dict)
    hub.start()
    yield hub
    hub.stop()


def connect(hub, timeout: float = 5) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(hub.path)
    sock.settimeout(timeout)
    return sock


def closed_by_hub(sock: socket.socket) -> bool:
    """True when the hub closed the connection (within the socket's timeout)."""
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def still_serves(hub) -> None:
    sib = SiblingBroker(os.path.dirname(hub.path), hub.path, SECRET)
    try:
        assert sib.hub.call("state") == {}
    finally:
        sib.close()


def test_a_2_gib_first_frame_is_refused_before_anything_is_allocated(hub):
    before = rss_bytes()
    head = orjson.dumps({"op": "hello", "secret": SECRET})  # even with the right secret in it
    sock = connect(hub)
    try:
        sock.sendall(wire.FRAME.pack(len(head), wire.MAX_PAYLOAD_BYTES) + head + b"\0" * 1024)
        started = time.monotonic()
        assert closed_by_hub(sock), "the hub waits for the rest of a 2 GiB hello"
        took = time.monotonic() - started
    finally:
        sock.close()
    grown = rss_bytes() - before
    print(f"hub closed a 2 GiB hello in {took * 1000:.0f} ms; RSS grew {grown / 2**20:.1f} MiB")
    assert grown < 256 << 20  # a reader that allocated the frame grows by 2 GiB
    still_serves(hub)


@pytest.mark.parametrize("hello", [
    orjson.dumps({"op": "hello", "secret": SECRET, "pad": "x" * wire.HELLO_MAX_BYTES}),  # too long
    orjson.dumps(["hello", SECRET]),  # not an object
    orjson.dumps({"op": "hello", "secret": "sécret"}),  # not ASCII (compare_digest's TypeError)
    b"{not json",
])
def test_a_bad_hello_is_closed_and_the_hub_serves_on(hub, hello):
    sock = connect(hub)
    try:
        sock.sendall(wire.FRAME.pack(len(hello), 0) + hello)
        assert closed_by_hub(sock)
    finally:
        sock.close()
    still_serves(hub)


def test_a_silent_connection_is_closed_after_the_hello_timeout(hub, monkeypatch):
    monkeypatch.setattr(sibling_hub, "HELLO_TIMEOUT_S", 0.3)
    sock = connect(hub, timeout=10)
    try:
        started = time.monotonic()
        assert closed_by_hub(sock) and time.monotonic() - started < 8
    finally:
        sock.close()
    still_serves(hub)


def test_the_reader_checks_the_declared_size_before_reading_on():
    """Structural: ``next(max_bytes=...)`` refuses on the 8 bytes of sizes alone; without a
    limit (a trusted connection) the same frame is read."""
    a, b = socket.socketpair()
    try:
        head = orjson.dumps({"op": "x"})
        a.sendall(wire.FRAME.pack(len(head), wire.MAX_PAYLOAD_BYTES))  # the sizes only, no more
        with pytest.raises(wire.WireClosed, match="at most 4096"):
            wire.FrameReader(b).next(max_bytes=wire.HELLO_MAX_BYTES)
    finally:
        a.close()
        b.close()
    a, b = socket.socketpair()
    try:
        a.sendall(wire.FRAME.pack(len(head), 10_000) + head + b"\1" * 10_000)
        got, payload = wire.FrameReader(b).next()
        assert got == {"op": "x"} and bytes(payload) == b"\1" * 10_000
    finally:
        a.close()
        b.close()
