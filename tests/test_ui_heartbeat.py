"""Gradio's session routes behind the UI's login (issue 19 row 8): ``/ui/gradio_api/heartbeat/{x}``
answered 200 and held a stream open for anyone, login or not."""

from __future__ import annotations

import httpx
import pytest

from tests.conftest import LiveServer, make_settings

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def login_server(demo_dir, tmp_path_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("hb"), api_token=TOKEN)).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("path", ["/ui/gradio_api/heartbeat/abc123",
                                  "/ui/gradio_api/stream/abc123/0/1/playlist.m3u8"])
def test_session_routes_need_the_login(login_server, path):
    r = httpx.get(login_server.url + path, timeout=5)  # no stream held: answered at once
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    forged = httpx.get(login_server.url + path, timeout=5,
                       cookies={"access-token-unsecure-x": "forged", "access-token-x": "forged"})
    assert forged.status_code == 401


def test_the_heartbeat_works_after_the_login(login_server):
    with httpx.Client(base_url=login_server.url, timeout=10) as c:
        r = c.post("/ui/login", data={"username": "me", "password": TOKEN})
        assert r.status_code == 200, r.text
        with c.stream("GET", "/ui/gradio_api/heartbeat/abc123") as hb:
            assert hb.status_code == 200
            assert next(hb.iter_text()).startswith("data: ALIVE")


def test_without_a_login_the_heartbeat_is_open(demo_dir, tmp_path):
    server = LiveServer(make_settings(demo_dir, tmp_path / "data")).start()
    try:
        with httpx.stream("GET", server.url + "/ui/gradio_api/heartbeat/abc123", timeout=10) as hb:
            assert hb.status_code == 200
            assert next(hb.iter_text()).startswith("data: ALIVE")
    finally:
        server.stop()
