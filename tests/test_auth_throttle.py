"""Guessing the token or the UI password costs the guesser: after N failed sign-ins from one address
(401s on any route, failed UI logins, live streams refused for their token) the address gets 429
too_many_auth_failures + Retry-After until its window ends, the right token included. Real server
on loopback."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import websockets

from pipeline.web.auth_throttle import MAX_CLIENTS, AuthFailures
from tests.conftest import LiveServer, make_settings

TOKEN = "right-token-0123456789"
LIMIT = 5


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    live = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("throttle"), api_token=TOKEN,
                                    auth_failures_per_client=LIMIT, auth_failure_window_s=2.0)).start()
    yield live
    live.stop()


def wait_out(server):
    """Until the address is let in again (the window is 2 s)."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = httpx.get(server.url + "/api/jobs", headers={"Authorization": f"Bearer {TOKEN}"})
        if r.status_code != 429:
            return
        time.sleep(0.2)
    raise AssertionError("still refused after the window")


def test_wrong_tokens_then_429_for_everyone_at_that_address_until_the_window_ends(server):
    wait_out(server)
    good = {"Authorization": f"Bearer {TOKEN}"}
    ok = httpx.get(server.url + "/api/jobs/00000000-0000-4000-8000-000000000000", headers=good)
    assert ok.status_code == 404  # the right token: no failure counted
    for n in range(LIMIT):
        r = httpx.get(server.url + "/api/jobs/x", headers={"Authorization": f"Bearer guess{n}"})
        assert r.status_code == 401
    refused = httpx.get(server.url + "/api/jobs/x", headers=good)
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "too_many_auth_failures"
    assert 1 <= int(refused.headers["retry-after"]) <= 2
    assert httpx.get(server.url + "/v1/models", headers={"Authorization": "Bearer x"}).status_code == 429
    assert httpx.get(server.url + "/healthz").status_code == 200  # probes are no sign-in
    wait_out(server)
    assert httpx.get(server.url + "/v1/models", headers=good).status_code == 200


def test_failed_ui_logins_count(server):
    wait_out(server)
    for n in range(LIMIT):
        r = httpx.post(server.url + "/ui/login", data={"username": "u", "password": f"guess{n}"})
        assert r.status_code == 400
    r = httpx.post(server.url + "/ui/login", data={"username": "u", "password": TOKEN})
    assert r.status_code == 429
    wait_out(server)
    r = httpx.post(server.url + "/ui/login", data={"username": "u", "password": TOKEN})
    assert r.status_code == 200


def test_live_streams_refused_for_their_token_count(server):
    wait_out(server)
    url = server.url.replace("http://", "ws://") + "/api/stream"

    async def attempt(token: str):
        messages = []
        try:
            async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {token}"},
                                          proxy=None) as ws:
                async for m in ws:
                    messages.append(m)
        except websockets.InvalidStatus as e:
            return e.response.status_code
        except websockets.ConnectionClosed:
            pass  # the refusal's close (1008) after its error frame
        return messages

    for n in range(LIMIT):
        messages = asyncio.run(attempt(f"guess{n}"))
        assert isinstance(messages, list) and '"unauthorized"' in messages[0]
    assert asyncio.run(attempt(TOKEN)) == 429  # refused before the upgrade


def test_the_table_of_failing_addresses_is_bounded():
    now = [0.0]
    table = AuthFailures(limit=2, window_s=10, clock=lambda: now[0])
    table.failed("a")
    assert table.retry_after("a") == 0
    table.failed("a")
    assert table.retry_after("a") == 10 and table.retry_after("b") == 0
    now[0] = 10.5
    assert table.retry_after("a") == 0  # the window ended
    for n in range(MAX_CLIENTS + 10):
        table.failed(f"c{n}")
    assert len(table._clients) <= MAX_CLIENTS


def test_many_failing_addresses_cost_constant_time_each():
    """A guesser rotating through addresses (an IPv6 prefix holds many /64s) fills the table: each
    new failure stays cheap (no scan of the table) and the oldest windows are forgotten first."""
    import time

    now = [0.0]
    table = AuthFailures(limit=3, window_s=1e9, clock=lambda: now[0])
    for n in range(MAX_CLIENTS):
        now[0] = n
        table.failed(f"old{n}")
    t = time.perf_counter()
    for n in range(2000):
        now[0] = MAX_CLIENTS + n
        table.failed(f"new{n}")
    per_failure = (time.perf_counter() - t) / 2000
    assert len(table._clients) == MAX_CLIENTS
    assert "old0" not in table._clients and "old1999" not in table._clients
    assert "old2000" in table._clients and "new1999" in table._clients
    assert per_failure < 1e-3, per_failure  # a scan of 100,000 entries takes ~10 ms
