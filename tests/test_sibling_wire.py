"""The owner's sibling socket (pipeline/serving/sibling_hub.py, pipeline/serving/sibling_wire.py)
and its bounds: a connection is ``multiprocessing.connection``'s, authenticated by its HMAC
challenge with the shared secret before anything else is read from it (issue 36: a connection that
declared a 2 GiB first frame had it allocated before its secret was checked); a peer without the
secret is refused; a message longer than its bound -- a head over MAX_HEAD_BYTES, a payload over
what its head declared or over MAX_PAYLOAD_BYTES -- is refused on its length prefix, before its
bytes are read or room is made for them."""

from __future__ import annotations

import os
import socket
import struct
import threading
import time
from multiprocessing import Pipe
from multiprocessing.connection import AuthenticationError, Client

import numpy as np
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
GIB = 1 << 30


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def length_prefix(size: int) -> bytes:
    """multiprocessing.connection's length prefix of a message of ``size`` bytes."""
    return struct.pack("!i", size) if size < 0x7FFFFFFF else struct.pack("!i", -1) + struct.pack("!Q", size)


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
    """True when the hub closed the connection (within the socket's timeout); what the hub sent
    before (its challenge) is read and dropped."""
    try:
        while sock.recv(1 << 16):
            pass
        return True
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


def test_a_peer_without_the_secret_is_refused_and_the_hub_serves_on(hub):
    with pytest.raises(AuthenticationError):
        Client(hub.path, family="AF_UNIX", authkey=b"a guess")
    with pytest.raises(AuthenticationError):
        SiblingBroker(os.path.dirname(hub.path), hub.path, "a guess")
    bare = Client(hub.path, family="AF_UNIX", authkey=None)  # a peer that knows no secret and asks away
    try:
        assert bare.recv_bytes(256).startswith(b"#CHALLENGE#")
        bare.send_bytes(orjson.dumps({"op": "state", "rid": 1}))  # taken as its answer: wrong
        assert bare.recv_bytes(256) == b"#FAILURE#"
        with pytest.raises(EOFError):  # and closed, never answered
            bare.recv_bytes(256)
    finally:
        bare.close()
    assert not hub._conns
    still_serves(hub)


def test_a_2_gib_answer_to_the_challenge_is_refused_before_anything_is_allocated(hub):
    before = rss_bytes()
    sock = connect(hub)
    try:
        sock.sendall(length_prefix(2 * GIB) + b"\0" * 1024)
        started = time.monotonic()
        assert closed_by_hub(sock), "the hub waits for the rest of a 2 GiB answer"
        took = time.monotonic() - started
    finally:
        sock.close()
    grown = rss_bytes() - before
    print(f"hub closed a 2 GiB answer in {took * 1000:.0f} ms; RSS grew {grown / 2**20:.1f} MiB")
    assert grown < 256 << 20  # a reader that allocated the message grows by 2 GiB
    still_serves(hub)


@pytest.mark.parametrize("answer", [b"x" * 300, b"", orjson.dumps({"op": "hello", "secret": SECRET})])
def test_a_wrong_answer_to_the_challenge_is_closed_and_the_hub_serves_on(hub, answer):
    sock = connect(hub)
    try:
        sock.sendall(length_prefix(len(answer)) + answer)
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


def test_a_trusted_siblings_oversized_message_is_refused_without_allocating_it(hub):
    """Even a peer that proved the secret cannot make the owner allocate more than the bound: a
    head declared 3 GiB long is refused on its length prefix and its connection closed."""
    conn = Client(hub.path, family="AF_UNIX", authkey=SECRET.encode())
    before = rss_bytes()
    try:
        deadline = time.monotonic() + 10
        while not hub._conns:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        os.write(conn.fileno(), length_prefix(3 * GIB) + b"\0" * 1024)
        assert conn.poll(10)
        with pytest.raises((EOFError, ConnectionResetError)):  # closed by the hub, nothing answered
            conn.recv_bytes()
    finally:
        conn.close()
    assert rss_bytes() - before < 256 << 20
    deadline = time.monotonic() + 10
    while hub._conns:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    still_serves(hub)


def test_a_payload_longer_than_its_head_declared_is_refused_on_its_length():
    a, b = Pipe()
    with a, b:
        b_wire = wire.Wire(b)
        a.send_bytes(orjson.dumps({"op": "put", "n": 10}))
        os.write(a.fileno(), length_prefix(GIB))  # the payload's prefix only: 1 GiB, where 10 were declared
        before = rss_bytes()
        with pytest.raises(wire.WireClosed, match="bad message length"):
            b_wire.recv()
        assert rss_bytes() - before < 256 << 20
        b_wire.close()


@pytest.mark.parametrize("head", [
    {"op": "put", "n": wire.MAX_PAYLOAD_BYTES + 1},  # a payload over the bound
    {"op": "put", "n": -1},
    {"op": "put", "n": "10"},
    ["not", "an", "object"],
])
def test_a_head_declaring_what_this_side_does_not_take_is_refused(head):
    a, b = Pipe()
    with a, b:
        a.send_bytes(orjson.dumps(head))
        with pytest.raises(wire.WireClosed, match="not one of ours"):
            wire.Wire(b).recv()


def test_a_head_over_its_bound_is_refused_on_its_length():
    a, b = Pipe()
    with a, b:
        os.write(a.fileno(), length_prefix(wire.MAX_HEAD_BYTES + 1))
        with pytest.raises(wire.WireClosed, match="bad message length"):
            wire.Wire(b).recv()


def test_messages_cross_whole_and_those_that_arrive_together_are_ready_without_waiting():
    a, b = Pipe()
    sender, reader = wire.Wire(a), wire.Wire(b)
    for k in range(3):
        sender.send({"k": k})
    got = [reader.recv()]
    while reader.ready():
        got.append(reader.recv())
    assert [h["k"] for h, _ in got] == [0, 1, 2] and got[0][1] == b""  # and ready() did not wait
    big = memoryview(np.arange(300_000, dtype=np.float32))  # past a socket buffer: sent from a thread
    thread = threading.Thread(target=sender.send, args=({"k": 3}, big))
    thread.start()
    head, payload = reader.recv()
    thread.join()
    assert head == {"k": 3, "n": big.nbytes} and payload == bytes(big.cast("B")) and not reader.ready()
    sender.close()
    with pytest.raises(wire.WireClosed):
        reader.recv()
    reader.close()
