"""The UI reads only files this server received through it, and the API token covers every route but
the probes: attacks found on a running server, replayed on a real server on loopback.

1. Gradio's event routes take a FileData whose ``path`` the client chooses; for a mounted app Gradio
   copied any path into its cache before our submit ran (``/dev/zero`` froze the server; any readable
   audio file became a job whose audio the API handed back). Now refused (403 path_refused) before
   Gradio sees the request, and again in submit.
2. With SENSEVOICE_API_TOKEN set, /metrics, /docs, /openapi.json, /redoc and the whole UI were open.
   Now the UI asks for a login, and its player / export links are signed per job.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from pipeline.web.links import job_links, link_key, sign
from pipeline.web.ui_guard import JSON_BODY_CAP, UPLOAD_DIR_NAME, own_upload, read_own_upload
from pipeline.web.vocab import vocab_script
from tests.conftest import LiveServer, make_settings
from tests.test_api import submit, wait_done

TOKEN = "s3cret-token"
BEARER = {"Authorization": f"Bearer {TOKEN}"}


def upload_dir(server) -> Path:
    return Path(os.path.realpath(server.settings.server.data_dir)) / UPLOAD_DIR_NAME


def gradio_blocks(server):
    for route in server.app.routes:
        if getattr(route, "path", None) == "/ui":
            return route.app.get_blocks()
    raise AssertionError("no UI mounted")


def files_under(path: Path) -> set[str]:
    return {str(p) for p in path.rglob("*")}


def file_data(path) -> dict:
    return {"path": path, "meta": {"_type": "gradio.FileData"}}


@pytest.fixture(scope="module")
def ui_server(demo_dir, tmp_path_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("ui-sec"))).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def token_server(demo_dir, tmp_path_factory):
    # this module sends many refused requests on purpose: the guessing throttle (which would lock
    # its address out after 20) is off here and tested in tests/test_auth_throttle.py
    server = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("ui-tok"),
                                      api_token=TOKEN, auth_failures_per_client=0)).start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def a_job(ui_server, clip_factory):
    """Another client's job: its spool file is a readable audio file on the server."""
    r = submit(ui_server, clip_factory("wav", 16000, 1))
    assert r.status_code == 202
    job = wait_done(ui_server, r.json()["id"])
    assert job["status"] == "done"
    return job["id"]


def submit_fn_index(server) -> int:
    config = httpx.get(server.url + "/ui/config", timeout=10).json()
    return next(d["id"] for d in config["dependencies"] if d.get("api_name") == "submit")


def event_request(server, route: str, payload) -> tuple[str, dict]:
    """The URL and JSON body a client would POST for ``payload`` (the submit event's first input)
    on ``route``; built before any timing starts (queue/join needs the config's fn_index)."""
    url = f"{server.url}/ui/gradio_api/{route}"
    data = [payload, "auto", True, False]
    if route == "call/v2/submit":  # named parameters
        return url, {"path": payload, "language": "auto", "use_itn": True, "split_channels": False}
    if route == "queue/join":
        return url, {"data": data, "fn_index": submit_fn_index(server),
                     "session_hash": uuid.uuid4().hex, "trigger_id": None, "event_data": None}
    return url, {"data": data}


def event_post(server, route: str, payload, **kw):
    url, body = event_request(server, route, payload)
    return httpx.post(url, json=body, timeout=10, **kw)


def targets(server, job_id: str, tmp: Path) -> dict[str, object]:
    data = Path(os.path.realpath(server.settings.server.data_dir))
    spool = str(server.runtime.broker.spool_path(job_id))
    ups = upload_dir(server)
    link_dir = ups / ("evil" + uuid.uuid4().hex[:8])
    link_dir.mkdir()
    (link_dir / "passwd.wav").symlink_to("/etc/passwd")
    (link_dir / "other.wav").symlink_to(spool)
    os.symlink(str(data), ups / link_dir.name / "up")  # a directory link inside the upload dir
    return {
        "dev_zero": "/dev/zero",
        "etc_passwd": "/etc/passwd",
        "job_store": str(data / "jobs.sqlite3"),
        "job_store_wal": str(data / "jobs.sqlite3-wal"),
        "other_jobs_spool": spool,
        "symlink_to_passwd": str(link_dir / "passwd.wav"),
        "symlink_to_spool": str(link_dir / "other.wav"),
        "through_dir_link": str(link_dir / "up" / "jobs.sqlite3"),
        "dotdot_escape": f"{ups}/../jobs.sqlite3",
        "relative": "../../../../../../etc/passwd",
        "url": f"{server.url}/healthz",
        "file_url": "file:///etc/passwd",
        "upload_dir_itself": str(ups),
    }


TARGETS = ["dev_zero", "etc_passwd", "job_store", "job_store_wal", "other_jobs_spool",
           "symlink_to_passwd", "symlink_to_spool", "through_dir_link", "dotdot_escape", "relative",
           "url", "file_url", "upload_dir_itself"]


@pytest.mark.parametrize("route", ["call/submit", "run/submit", "queue/join", "call/v2/submit"])
@pytest.mark.parametrize("target", TARGETS)
def test_event_routes_refuse_server_paths(ui_server, a_job, tmp_path, route, target):
    """The curl that froze the server (/dev/zero) and read any file (the store, another job's
    spool, via a symlink in the upload dir, a URL...): 403 path_refused at once, no job, nothing
    copied, the server answers."""
    path = targets(ui_server, a_job, tmp_path)[target]
    before_jobs = ui_server.runtime.broker.counts()
    before_files = files_under(upload_dir(ui_server))
    url, body = event_request(ui_server, route, file_data(path))
    t = time.monotonic()  # the refusal alone: the config fetch for queue/join is not timed
    r = httpx.post(url, json=body, timeout=10)
    took = time.monotonic() - t
    assert r.status_code == 403, (target, r.status_code, r.text[:300])
    assert r.json()["error"]["code"] == "path_refused"
    assert took < 1.0, took
    t = time.monotonic()
    assert httpx.get(ui_server.url + "/healthz", timeout=1.0).status_code == 200
    assert time.monotonic() - t < 1.0
    assert files_under(upload_dir(ui_server)) == before_files  # nothing copied into the cache
    assert ui_server.runtime.broker.counts() == before_jobs  # no job was created


def test_exact_curl_from_the_report(ui_server):
    """curl -H 'Content-Type: application/json' -d '{"data":[{"path":"/dev/zero","meta":
    {"_type":"gradio.FileData"}},"auto",true,false]}' http://HOST/ui/gradio_api/call/submit"""
    body = (b'{"data":[{"path":"/dev/zero","meta":{"_type":"gradio.FileData"}},"auto",true,false]}')
    r = httpx.post(ui_server.url + "/ui/gradio_api/call/submit", content=body,
                   headers={"Content-Type": "application/json"}, timeout=5)
    assert r.status_code == 403 and r.json()["error"]["code"] == "path_refused"


def test_server_answers_during_a_flood_of_hostile_submits(ui_server):
    """40 hostile submits from 8 threads while probing: every probe answers within 1 s."""
    stop = threading.Event()
    codes: list[int] = []

    def attack():
        with httpx.Client(timeout=10) as c:
            while not stop.is_set() and len(codes) < 40:
                for p in ("/dev/zero", "/etc/passwd", "/dev/urandom", "/proc/self/mem"):
                    codes.append(c.post(ui_server.url + "/ui/gradio_api/call/submit",
                                        json={"data": [file_data(p), "auto", True, False]}).status_code)

    threads = [threading.Thread(target=attack) for _ in range(8)]
    for th in threads:
        th.start()
    worst = 0.0
    try:
        while any(th.is_alive() for th in threads):
            t = time.monotonic()
            assert httpx.get(ui_server.url + "/healthz", timeout=1.0).status_code == 200
            assert httpx.get(ui_server.url + "/readyz", timeout=1.0).status_code == 200
            worst = max(worst, time.monotonic() - t)
            time.sleep(0.02)
    finally:
        stop.set()
        for th in threads:
            th.join(timeout=30)
    assert codes and set(codes) == {403}
    assert worst < 1.0


@pytest.mark.parametrize("where", ["event_data", "nested", "second_input", "no_meta"])
def test_paths_anywhere_in_the_body_are_refused(ui_server, where):
    bad = {"path": "/etc/passwd", "meta": {"_type": "gradio.FileData"}}
    if where == "event_data":
        body = {"data": [None, "auto", True, False], "event_data": {"x": [bad]}}
    elif where == "nested":
        body = {"data": [{"value": {"files": [[bad]]}}, "auto", True, False]}
    elif where == "second_input":
        body = {"data": [None, bad, True, False]}
    else:
        body = {"data": [{"path": "/etc/passwd"}, "auto", True, False]}
    r = httpx.post(ui_server.url + "/ui/gradio_api/call/submit", json=body, timeout=5)
    assert r.status_code == 403 and r.json()["error"]["code"] == "path_refused"


def test_bodies_that_are_not_json_or_too_large_are_refused(ui_server):
    url = ui_server.url + "/ui/gradio_api/queue/join"
    r = httpx.post(url, content=b"data=/etc/passwd", timeout=5,
                   headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert r.status_code == 400
    big = b'{"data": ["' + b"a" * (JSON_BODY_CAP + 10) + b'"]}'
    r = httpx.post(url, content=big, headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 413

    def chunks():  # no Content-Length: the cap holds while the body streams
        yield b'{"data": ["'
        for _ in range(20):
            yield b"a" * 65536
        yield b'"]}'

    r = httpx.post(url, content=chunks(), headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code == 413
    deep = b"[" * 100_000 + b"]" * 100_000
    r = httpx.post(url, content=deep, headers={"Content-Type": "application/json"}, timeout=10)
    assert r.status_code in (400, 413)
    # not an object, or too many values (Gradio's own validation of such a body cost 160 ms of
    # CPU a request): 400 before Gradio parses it
    for junk in ("[" + "[]," * 2000 + "[]]", '{"data": [' + "0," * 1500 + "0]}", '"x"', "1"):
        r = httpx.post(url, content=junk.encode(), headers={"Content-Type": "application/json"},
                       timeout=10)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_option", junk[:20]
    # Gradio's screen-recording route (multipart, runs ffmpeg) is not used by this UI
    r = httpx.post(ui_server.url + "/ui/gradio_api/process_recording", timeout=10,
                   files={"video": ("a.mp4", b"\0" * 1000)})
    assert r.status_code == 400
    assert httpx.get(ui_server.url + "/healthz", timeout=1).status_code == 200


def test_file_route_serves_only_own_uploads(ui_server, a_job, tmp_path):
    t = targets(ui_server, a_job, tmp_path)
    for name in ("symlink_to_passwd", "symlink_to_spool", "other_jobs_spool", "job_store",
                 "etc_passwd", "dev_zero", "url"):
        r = httpx.get(f"{ui_server.url}/ui/gradio_api/file={t[name]}", timeout=5)
        assert r.status_code == 403, (name, r.status_code)
        assert "root:" not in r.text
    # a real upload through the UI's upload route is served back (the Audio component's preview)
    r = httpx.post(ui_server.url + "/ui/gradio_api/upload", timeout=10,
                   files={"files": ("mine.wav", b"RIFF0000WAVEfmt ")})
    assert r.status_code == 200, r.text
    (path,) = r.json()
    assert path.startswith(str(upload_dir(ui_server)) + "/")
    got = httpx.get(f"{ui_server.url}/ui/gradio_api/file={path}", timeout=5)
    assert got.status_code == 200 and got.content == b"RIFF0000WAVEfmt "


def test_ui_upload_and_submit_still_work(ui_server, clip_factory, tmp_path):
    """The real flow, through gradio_client: upload into this server's own 0700 directory (not the
    host-wide /tmp/gradio), submit, transcript."""
    from gradio_client import Client, handle_file

    clip = tmp_path / f"ok-{uuid.uuid4().hex}.wav"
    shutil.copy(clip_factory("wav", 16000, 1), clip)
    client = Client(ui_server.url + "/ui/", verbose=False)
    status, *_ = client.predict(handle_file(str(clip)), "auto", True, False, api_name="/submit")
    assert "job " in status, status
    job = wait_done(ui_server, status.rsplit("job ", 1)[1])
    assert job["status"] == "done" and "speech" in job["result"]["text"]
    ups = upload_dir(ui_server)
    assert stat.S_IMODE(ups.stat().st_mode) == 0o700
    assert len(list(ups.rglob(clip.name))) == 1
    assert not list(Path("/tmp/gradio").rglob(clip.name))  # the host-wide dir is not used


def test_submit_checks_again_without_the_guard(ui_server, a_job, tmp_path):
    """Layer (c): the UI's submit itself, called directly (as if the middleware had let a request
    through): refuses every hostile path, creates no job, deletes nothing."""
    blocks = gradio_blocks(ui_server)
    fn = next(f.fn for f in blocks.fns.values() if f.name == "submit")
    t = targets(ui_server, a_job, tmp_path)
    spool = Path(t["other_jobs_spool"])
    for name in TARGETS:
        job_id, status, *_ = fn(t[name], "auto", True, False)
        assert job_id == "" and status.startswith("error:"), (name, status)
    assert spool.exists()  # own_file was never handed a foreign path


def test_read_own_upload(tmp_path):
    root = tmp_path / "ups"
    root.mkdir()
    root = os.path.realpath(root)
    ok = Path(root, "abc", "a.wav")
    ok.parent.mkdir()
    ok.write_bytes(b"RIFF" + b"\0" * 100)
    assert read_own_upload(str(ok), root, 1000) == (str(ok), ok.read_bytes())
    fifo = Path(root, "abc", "fifo.wav")
    os.mkfifo(fifo)
    (Path(root) / "link.wav").symlink_to(ok)
    from pipeline.domain.errors import PathRefused, UploadTooLarge

    t = time.monotonic()
    for bad in (str(fifo), str(Path(root) / "link.wav"), str(ok.parent), root, "/dev/zero",
                "/etc/passwd", f"{root}/abc/../abc/a.wav", f"{root}//abc/a.wav", "abc/a.wav",
                f"{root}/abc/a.wav\x00", None, 7):
        with pytest.raises(PathRefused):
            read_own_upload(bad, root, 1000)
    assert time.monotonic() - t < 1  # a FIFO is never opened for a blocking read
    with pytest.raises(UploadTooLarge):
        read_own_upload(str(ok), root, 10)
    assert own_upload(str(ok), root) == str(ok)


# ---------------------------------------------------------------------------- the API token
@pytest.mark.parametrize("route,protected", [
    ("/healthz", False), ("/readyz", False),  # probes stay open
    ("/metrics", True), ("/docs", True), ("/docs/oauth2-redirect", True), ("/openapi.json", True),
    ("/redoc", True), (f"/api/jobs/{uuid.uuid4()}", True), (f"/api/jobs/{uuid.uuid4()}/audio", True),
    (f"/api/jobs/{uuid.uuid4()}/result", True)],
    # the same test ids in every process that collects them (pytest-xdist compares them)
    ids=lambda v: str(v).replace(v[10:46], "<new id>") if str(v).startswith("/api/jobs/") else None)
def test_each_route_with_and_without_the_token(token_server, route, protected):
    bare = httpx.get(token_server.url + route, timeout=10)
    wrong = httpx.get(token_server.url + route, timeout=10, headers={"Authorization": "Bearer nope"})
    good = httpx.get(token_server.url + route, timeout=10, headers=BEARER)
    key = httpx.get(token_server.url + route, timeout=10, headers={"X-API-Key": TOKEN})
    if protected:
        assert bare.status_code == 401 and wrong.status_code == 401, (bare.status_code, wrong.status_code)
        assert bare.json()["error"]["code"] == "unauthorized"
    else:
        assert bare.status_code == 200
    expected = 404 if route.startswith("/api/jobs/") else 200
    assert good.status_code == expected and key.status_code == expected, (good.status_code, good.text[:200])


@pytest.mark.parametrize("route", ["/metrics", "/docs", "/openapi.json", "/redoc"])
def test_without_a_token_these_stay_open(ui_server, route):
    assert httpx.get(ui_server.url + route, timeout=10).status_code == 200


def login(server, username="anyone", password=TOKEN) -> httpx.Client:
    c = httpx.Client(base_url=server.url, timeout=30)
    r = c.post("/ui/login", data={"username": username, "password": password})
    assert r.status_code == 200, r.text
    return c


def test_ui_refuses_every_route_without_the_login(token_server, clip_factory):
    """Gradio's upload, queue/join, call, run and file= routes of the mounted UI answer 401 without
    the login cookie, whatever the API token header says."""
    wav = Path(clip_factory("wav", 16000, 1)).read_bytes()
    c = login(token_server)  # a real upload, to have a valid path for file= and submit
    try:
        r = c.post("/ui/gradio_api/upload", files={"files": ("a.wav", wav)})
        assert r.status_code == 200
        (path,) = r.json()
        assert c.get(f"/ui/gradio_api/file={path}").status_code == 200
        assert c.get("/ui/config").status_code == 200
    finally:
        c.close()
    for headers in ({}, BEARER):
        with httpx.Client(base_url=token_server.url, timeout=30, headers=headers) as anon:
            assert anon.post("/ui/gradio_api/upload", files={"files": ("b.wav", wav)}).status_code == 401
            assert anon.get(f"/ui/gradio_api/file={path}").status_code == 401
            assert anon.get("/ui/config").status_code == 401
            assert anon.get("/ui/gradio_api/info").status_code == 401
            for route in ("call/submit", "run/submit", "queue/join"):
                body = {"data": [file_data(path), "auto", True, False], "fn_index": 0,
                        "session_hash": "x"}
                r = anon.post(f"/ui/gradio_api/{route}", json=body)
                assert r.status_code == 401, (route, r.status_code, r.text[:200])
    assert not list(upload_dir(token_server).rglob("b.wav"))  # the refused upload left nothing


# values for the path parameters of Gradio's routes (a walk over them needs some value for each)
ROUTE_PARAMS = {"path": "index.js", "path_or_url": "a.wav", "url_path": "x", "api_name": "submit",
                "event_id": "e1", "session_hash": "s1", "run": "0", "component_id": "1",
                "segment_id": "0", "ext": "ts", "size": "192", "key": "k", "id": "1",
                "environment": "x", "type": "js", "file_name": "x.js"}


@pytest.fixture(scope="module")
def ui_auth_server(demo_dir, tmp_path_factory):
    """A UI login from SENSEVOICE_UI_AUTH alone (no API token)."""
    server = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("ui-auth"), ui_auth="alice:pw",
                                      auth_failures_per_client=0)).start()
    yield server
    server.stop()


def gradio_routes(server) -> list[tuple[str, str, str]]:
    """(method, path under /ui with sample parameters, the route's path) for every route of the
    mounted Gradio app, read from the live app (routers it includes too): a route a later Gradio
    adds is walked without anyone listing it."""
    import re

    from fastapi.routing import iter_route_contexts

    out = []
    for route in iter_route_contexts(server.app.state.gradio_app.routes):
        if route.path is None:
            continue
        path = "/ui" + re.sub(r"\{(\w+)(:\w+)?\}", lambda m: ROUTE_PARAMS[m.group(1)], route.path)
        for method in sorted(getattr(route, "methods", None) or {"GET"}):
            out.append((method, path, route.path))
    return out


def ask_without_login(client: httpx.Client, method: str, path: str) -> int | str:
    """The status of one request without a login; an event stream left open counts as answered."""
    body = {"data": [], "fn_index": 0, "session_hash": "s1", "event_id": "e1"}
    try:
        with client.stream(method, path, **({"json": body} if method == "POST" else {})) as r:
            return r.status_code
    except httpx.ReadTimeout:
        return "an open stream"


@pytest.mark.parametrize("server_name", ["token_server", "ui_auth_server"])
def test_every_gradio_route_but_the_login_page_needs_the_login(request, server_name):
    """Issue 36: /reset and /cancel (and /startup-events, /token, /app_id, /user, /openapi.json)
    answered without a UI login. Every route of the live Gradio app is asked without one: only
    the login page, the login, logout and the frontend's static files answer; the rest 401."""
    from pipeline.web.ui_guard import public_ui_route

    server = request.getfixturevalue(server_name)
    routes = gradio_routes(server)
    assert {("POST", "/ui/gradio_api/reset"), ("POST", "/ui/gradio_api/cancel"),
            ("POST", "/ui/gradio_api/queue/join"), ("GET", "/ui/gradio_api/queue/data"),
            ("GET", "/ui/config")} <= {(m, p) for m, p, _ in routes}, routes
    open_routes, public = [], []
    with httpx.Client(base_url=server.url, timeout=3, headers=BEARER) as anon:  # the API token is no login
        for method, path, route in routes:
            status = ask_without_login(anon, method, path)
            if public_ui_route(method, path):
                public.append((method, route, status))
            elif status != 401:
                open_routes.append((method, route, status))
    assert not open_routes, f"answered without the UI login: {open_routes}"
    # the login page, its files and the login itself still answer without one
    assert {(m, r) for m, r, _ in public} >= {("GET", "/"), ("POST", "/login"), ("GET", "/theme.css"),
                                               ("GET", "/assets/{path:path}"), ("GET", "/static/{path:path}")}
    assert all(status != 401 for _, _, status in public), public
    assert len(public) < 15  # an allow-list: a handful, never most of Gradio


@pytest.mark.parametrize("route", ["reset", "reset/", "cancel"])
def test_reset_and_cancel_need_the_login(token_server, route):
    """The exact calls of the report: a well-formed reset / cancel body, 401 without the login (with
    the API token or without), answered once signed in."""
    body = {"event_id": uuid.uuid4().hex, "session_hash": uuid.uuid4().hex, "fn_index": 0}
    for headers in ({}, BEARER):
        r = httpx.post(f"{token_server.url}/ui/gradio_api/{route}", json=body, headers=headers, timeout=10)
        assert r.status_code == 401, (headers, r.status_code, r.text[:200])
        assert r.json()["error"]["code"] == "unauthorized"
    c = login(token_server)
    try:
        assert c.post(f"/ui/gradio_api/{route}", json=body).status_code == 200
    finally:
        c.close()


def test_a_ui_websocket_waits_for_the_login_too():
    """Gradio 6.31 has no WebSocket route; one a later Gradio adds under /ui is closed (1008)
    before it reaches the app when the browser has not signed in."""
    import asyncio

    from pipeline.web.ui_guard import AccessGuard

    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "websocket.accept"})

    class NoLogin:  # a mounted Gradio app with a login, no tokens issued
        auth = ("u", "p")
        cookie_id = "c"
        tokens: dict = {}

    guard = AccessGuard(app, token=TOKEN, upload_dir="/nonexistent", ui_app=NoLogin)
    for path in ("/ui/gradio_api/ws", "/ui/"):
        sent = []

        async def send(message, sent=sent):
            sent.append(message)

        async def receive():
            return {"type": "websocket.connect"}

        scope = {"type": "websocket", "path": path, "headers": [], "query_string": b""}
        asyncio.run(guard(scope, receive, send))
        assert sent == [{"type": "websocket.close", "code": 1008, "reason": "sign in to the UI first"}]
    assert reached == []
    asyncio.run(guard({"type": "websocket", "path": "/api/stream", "headers": []}, receive, send))
    assert reached == ["/api/stream"]  # outside the UI: not this guard's


def test_ui_login_takes_the_api_token_as_password(token_server, clip_factory):
    with httpx.Client(base_url=token_server.url, timeout=30) as c:
        assert c.post("/ui/login", data={"username": "anyone", "password": "nope"}).status_code == 400
        assert c.post("/ui/login", data={"username": "anyone", "password": ""}).status_code in (400, 422)
    from gradio_client import Client, handle_file

    with pytest.raises(Exception):
        Client(token_server.url + "/ui/", verbose=False)  # no login: the app's config is refused
    client = Client(token_server.url + "/ui/", verbose=False, auth=("qa", TOKEN))
    status, *_ = client.predict(handle_file(str(clip_factory("wav", 16000, 1))), "auto", True, False,
                                api_name="/submit")
    job = wait_done_token(token_server, status.rsplit("job ", 1)[1])
    assert job["status"] == "done"


def test_ui_auth_setting_is_the_login_when_set(demo_dir, tmp_path):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", api_token=TOKEN,
                                      ui_auth="alice:pa:ss")).start()
    try:
        with httpx.Client(base_url=server.url, timeout=30) as c:
            assert c.post("/ui/login", data={"username": "alice", "password": TOKEN}).status_code == 400
            assert c.post("/ui/login", data={"username": "bob", "password": "pa:ss"}).status_code == 400
            assert c.get("/ui/config").status_code == 401
            assert c.post("/ui/login", data={"username": "alice", "password": "pa:ss"}).status_code == 200
            assert c.get("/ui/config").status_code == 200
    finally:
        server.stop()


def wait_done_token(server, job_id, timeout=60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = httpx.get(f"{server.url}/api/jobs/{job_id}", headers=BEARER, timeout=10).json()
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(0.05)
    raise TimeoutError(job_id)


def submit_token(server, clip) -> str:
    with open(clip, "rb") as f:
        r = httpx.post(server.url + "/api/jobs", files={"file": ("a.wav", f)}, headers=BEARER,
                       timeout=30)
    assert r.status_code == 202
    assert wait_done_token(server, r.json()["id"])["status"] == "done"
    return r.json()["id"]


def test_signed_links_open_their_own_job_only(token_server, clip_factory):
    settings = token_server.settings
    a = submit_token(token_server, clip_factory("wav", 16000, 1))
    b = submit_token(token_server, clip_factory("mp3", 44100, 2))
    job_a = token_server.runtime.view.get(a)
    links = job_links(job_a, settings.server.token, settings.limits.retention_hours)
    assert TOKEN not in links["audio"] and "sig=" in links["audio"] and "exp=" in links["audio"]
    url = token_server.url
    audio = httpx.get(url + links["audio"], timeout=10)
    assert audio.status_code == 200
    assert audio.content == token_server.runtime.broker.spool_path(a).read_bytes()
    srt = httpx.get(url + links["result"] + "&format=srt", timeout=10)
    assert srt.status_code == 200 and "-->" in srt.text
    assert httpx.get(url + links["result"], timeout=10).status_code == 200
    # the same signature on another job, another route, or altered: 401
    query = links["audio"].split("?", 1)[1]
    for other in (f"/api/jobs/{b}/audio?{query}", f"/api/jobs/{b}/result?{query}",
                  f"/api/jobs/{a}?{query}"):
        assert httpx.get(url + other, timeout=10).status_code == 401, other
    exp = int(query.split("exp=")[1].split("&")[0])
    sig = query.split("sig=")[1]
    flipped = ("A" if sig[0] != "A" else "B") + sig[1:]
    for bad in (f"exp={exp}&sig={flipped}", f"exp={exp + 1}&sig={sig}", f"exp={exp}",
                f"sig={sig}", f"exp={exp}&sig=", f"exp=-1&sig={sig}", f"exp={exp}&sig={sig}x" * 30):
        assert httpx.get(f"{url}/api/jobs/{a}/audio?{bad}", timeout=10).status_code == 401, bad
    # expired: a correctly signed link whose time has passed (410 link_expired, not a failed
    # sign-in: tests/test_expired_links.py)
    past = int(time.time()) - 5
    old = sign(link_key(TOKEN), a, past)
    assert httpx.get(f"{url}/api/jobs/{a}/audio?exp={past}&sig={old}", timeout=10).status_code == 410
    # signed with another token's key
    other_key = sign(link_key("another-token"), a, exp)
    assert httpx.get(f"{url}/api/jobs/{a}/audio?exp={exp}&sig={other_key}", timeout=10).status_code == 401
    # valid until the job's retention ends
    assert exp == int(-(-(job_a.finished_at + settings.limits.retention_hours * 3600) // 1))


def test_signed_links_without_a_token_are_plain_routes(ui_server, a_job):
    job = ui_server.runtime.view.get(a_job)
    links = job_links(job, "", 24.0)
    assert links == {"audio": f"/api/jobs/{a_job}/audio", "result": f"/api/jobs/{a_job}/result"}


@pytest.mark.browser
@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium not installed")
def test_browser_with_a_token_logs_in_and_plays_through_signed_links(token_server, browser,
                                                                    long_call):
    """In chromium: the login page, then upload + submit; the review player loads the server's copy
    (signed link, no fallback) and the export links download with their signature."""
    ctx = browser.new_context()
    page = ctx.new_page()
    try:
        page.goto(token_server.url + "/ui/", wait_until="load")
        page.wait_for_selector("input[type=password]", timeout=30_000)
        page.locator("input[type=text], input:not([type])").first.fill("qa")
        page.locator("input[type=password]").first.fill(TOKEN)
        page.locator("button").filter(has_text="Login").first.click()
        page.wait_for_selector("#sv-submit", timeout=30_000)
        page.locator("input[type=file]").first.set_input_files(str(long_call))
        page.wait_for_selector("audio, .waveform-container, [data-testid='waveform-Audio']",
                               timeout=30_000)
        page.locator("#sv-submit").click()
        page.wait_for_selector("#sv-review tr.sv-row", timeout=90_000)
        page.wait_for_function("() => { const a = document.querySelector('#sv-review audio.sv-player');"
                               " return a && a.readyState >= 1; }", timeout=30_000)
        player = page.locator("#sv-review audio.sv-player")
        assert player.get_attribute("data-source") == "primary"
        assert "sig=" in player.get_attribute("src")
        hrefs = [a.get_attribute("href") for a in page.locator("#sv-review a.sv-export").all()]
        srt = next(h for h in hrefs if h.endswith("format=srt"))
        assert "sig=" in srt
        got = page.evaluate("async (u) => { const r = await fetch(u); return [r.status, await r.text()]; }",
                            srt)
        assert got[0] == 200 and "-->" in got[1]
        assert page.evaluate("async (u) => (await fetch(u)).status",
                             srt.split("?")[0] + "?format=srt") == 401
    finally:
        ctx.close()


@pytest.mark.parametrize("value", [["/etc/passwd"], {"path": "/dev/zero"}, 7, None])
def test_a_path_that_is_not_a_string_reads_nothing(ui_server, value):
    """Gradio takes only a string ``path`` for a file; anything else fails its validation. Any
    string inside is still checked (the nested dict here is refused)."""
    before_jobs = ui_server.runtime.broker.counts()
    before_files = files_under(upload_dir(ui_server))
    r = event_post(ui_server, "call/submit", {"path": value, "meta": {"_type": "gradio.FileData"}})
    if isinstance(value, dict):
        assert r.status_code == 403
    elif r.status_code == 200:
        events = httpx.get(f"{ui_server.url}/ui/gradio_api/call/submit/{r.json()['event_id']}",
                           timeout=10).text
        assert "event: error" in events or "error:" in events
    assert ui_server.runtime.broker.counts() == before_jobs
    assert files_under(upload_dir(ui_server)) == before_files


@pytest.mark.browser
@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium not installed")
@pytest.mark.parametrize("result,expected", [
    ("/api/jobs/j1/result?exp=9&sig=abc", "/api/jobs/j1/result?exp=9&sig=abc&format=srt"),
    ("/api/jobs/j1/result", "/api/jobs/j1/result?format=srt"),
    ("//evil.example/x?", "/api/jobs/j1/result?format=srt"),  # not a path on this server
    ("/\\evil.example/x?", "/api/jobs/j1/result?format=srt"),
    ("javascript:alert(1)//", "/api/jobs/j1/result?format=srt"),
    (7, "/api/jobs/j1/result?format=srt")])
def test_review_js_export_links_use_the_jobs_own_link(browser, result, expected):
    static = Path(__file__).resolve().parent.parent / "static"
    page = browser.new_page()
    try:
        page.set_content("<html><head>" + vocab_script() +
                         "<script>" + (static / "richtext.js").read_text() +
                         "</script><script>" + (static / "review.js").read_text() +
                         "</script></head><body><div id=out></div></body></html>")
        job = {"id": "j1", "status": "done", "links": {"result": result},
               "result": {"text": "hi", "raw_text": "<|en|><|NEUTRAL|><|Speech|><|withitn|>hi",
                          "segments": [{"language": "en", "emotion": "NEUTRAL", "events": ["Speech"],
                                        "itn": "withitn", "text": "hi", "start": 0.0, "end": 1.0}]}}
        page.evaluate("(j) => window.SenseVoiceReview.render(document.getElementById('out'), j, {})",
                      job)
        hrefs = page.eval_on_selector_all("#out a.sv-export", "as => as.map(a => a.getAttribute('href'))")
        assert expected in hrefs and len(hrefs) == 4
    finally:
        page.close()


def test_upload_sweeper_deletes_old_uploads_and_never_follows_links(tmp_path):
    """Uploads from before a restart (Gradio's own sweep forgets them) go after the retention."""
    from pipeline.web.ui_guard import UploadSweeper, prepare_upload_dir

    root = prepare_upload_dir(tmp_path / "data")
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    outside = tmp_path / "keep.wav"
    outside.write_bytes(b"x")
    (Path(root) / "abc").mkdir()
    (Path(root) / "abc" / "a.wav").write_bytes(b"RIFF")
    (Path(root) / "abc" / "link.wav").symlink_to(outside)
    (Path(root) / "dirlink").symlink_to(tmp_path)
    sweeper = UploadSweeper(root, max_age_s=3600, every_s=60)
    assert sweeper.sweep() == 0 and (Path(root) / "abc" / "a.wav").exists()  # young
    assert sweeper.sweep(now=time.time() + 7200) == 3
    assert os.listdir(root) == [] and outside.exists() and (tmp_path / "keep.wav").exists()


@pytest.mark.parametrize("ui_auth", ["alice", "alice:", ":pw"])
def test_a_ui_login_without_a_password_is_a_configuration_error(ui_auth):
    from pipeline.config import Settings
    from pipeline.web.ui import ui_login

    with pytest.raises(ValueError):
        ui_login(Settings(ui_auth=ui_auth, api_token=TOKEN))
    check = ui_login(Settings(ui_auth="", api_token=TOKEN))
    assert check("anyone", TOKEN) and not check("anyone", "") and not check("anyone", TOKEN + "x")
    assert ui_login(Settings(ui_auth="", api_token="")) is None


def test_many_files_in_one_request_are_refused(ui_server):
    """Each path costs a few syscalls on the event loop: a request names at most MAX_FILES."""
    from pipeline.web.ui_guard import MAX_FILES

    r = httpx.post(ui_server.url + "/ui/gradio_api/upload", timeout=10,
                   files={"files": ("many.wav", b"RIFF....WAVE")})
    (path,) = r.json()
    many = {"data": [None, "auto", True, False], "event_data": [file_data(path)] * (MAX_FILES + 1)}
    r = httpx.post(ui_server.url + "/ui/gradio_api/call/submit", json=many, timeout=10)
    assert r.status_code == 403 and r.json()["error"]["code"] == "path_refused"
    few = {"data": [None, "auto", True, False], "event_data": [file_data(path)] * MAX_FILES}
    assert httpx.post(ui_server.url + "/ui/gradio_api/call/submit", json=few, timeout=10).status_code == 200


# ---------------------------------------------------------------------------- issue 11: the page's push
def events_status(server, job_id: str, query: str = "", headers: dict | None = None) -> int:
    """The status of GET /api/jobs/{id}/events (the stream is closed at once)."""
    url = f"{server.url}/api/jobs/{job_id}/events" + (f"?{query}" if query else "")
    with httpx.stream("GET", url, timeout=30, headers=headers or {}) as r:
        return r.status_code


def test_job_events_need_the_token_or_the_jobs_own_link(token_server, clip_factory):
    """The stream a page follows is guarded like the job's audio and result: the API token, or
    that job's own signed link; another job's signature or an altered one: 401; an expired one:
    410 link_expired."""
    a = submit_token(token_server, clip_factory("wav", 16000, 1))
    b = submit_token(token_server, clip_factory("mp3", 44100, 2))
    job_a = token_server.runtime.view.get(a)
    view = token_server.app.state.pages.live_view(job_a)
    assert TOKEN not in json.dumps(view)
    page_q = view["links"]["page"]
    link_q = job_links(job_a, TOKEN, token_server.settings.limits.retention_hours)["audio"].split("?", 1)[1]
    assert events_status(token_server, a) == 401
    assert events_status(token_server, a, headers={"Authorization": "Bearer nope"}) == 401
    assert events_status(token_server, a, headers=BEARER) == 200
    assert events_status(token_server, a, headers={"X-API-Key": TOKEN}) == 200
    assert events_status(token_server, a, page_q) == 200
    # a download link (the one that travels) does not open the stream, which carries the page's
    # review link (issue 36); the page's link does not open the downloads either
    assert events_status(token_server, a, link_q) == 403
    assert httpx.get(f"{token_server.url}/api/jobs/{a}/result?{page_q}", timeout=10).status_code == 403
    assert view["links"]["events"] == f"/api/jobs/{a}/events?{page_q}"
    for q in (page_q, link_q):
        assert events_status(token_server, b, q) == 401  # not another job's
    exp, sig = (p.split("=", 1)[1] for p in page_q.split("&"))
    flipped = ("A" if sig[0] != "A" else "B") + sig[1:]
    past = int(time.time()) - 5
    for bad in (f"exp={exp}&sig={flipped}", f"exp={int(exp) + 1}&sig={sig}", f"exp={exp}",
                f"exp={exp}&sig={sign(link_key('another-token', 'page'), a, int(exp))}"):
        assert events_status(token_server, a, bad) == 401, bad
    assert events_status(token_server, a, f"exp={past}&sig={sign(link_key(TOKEN, 'page'), a, past)}") == 410
    assert events_status(token_server, str(uuid.uuid4()), headers=BEARER) == 404
    # the body of a refused stream says nothing about the job
    r = httpx.get(f"{token_server.url}/api/jobs/{a}/events", timeout=10)
    assert r.json()["error"]["code"] == "unauthorized" and a not in r.text


def test_job_events_without_a_token_are_as_open_as_the_api(ui_server, a_job):
    assert events_status(ui_server, a_job) == 200
    assert events_status(ui_server, str(uuid.uuid4())) == 404


def test_the_ui_submit_hands_the_page_a_signed_link_never_the_token(token_server, clip_factory):
    """What the page puts in its URL (?job=ID&exp=..&sig=..) opens that job's stream and nothing
    else; the token never reaches the page."""
    from pipeline.web.links import verify

    blocks = gradio_blocks(token_server)
    fn = next(f.fn for f in blocks.fns.values() if f.name == "submit")
    folder = upload_dir(token_server) / uuid.uuid4().hex
    folder.mkdir()
    path = folder / "mine.wav"
    shutil.copy(clip_factory("wav", 16000, 1), path)
    job_id, status, view = fn(str(path), "auto", True, False)
    assert job_id and status.endswith(f"job {job_id}")
    assert TOKEN not in view
    body = json.loads(view)
    exp, sig = (p.split("=", 1)[1] for p in body["links"]["page"].split("&"))
    assert verify(link_key(TOKEN, "page"), job_id, exp, sig)
    assert not verify(link_key(TOKEN), job_id, exp, sig)  # not a download link
    assert body["stage"] in ("queued", "transcribing", "done")


def test_a_video_upload_keeps_the_guarantees(ui_server, media_dir, speech_clip):
    """The widget takes videos now: one goes through the same upload directory and the same
    checks, and is transcribed from there."""
    from gradio_client import Client, handle_file

    from tests.media import make_video_with_audio

    video = make_video_with_audio(media_dir / f"v-{uuid.uuid4().hex[:8]}.mp4", speech_clip)
    client = Client(ui_server.url + "/ui/", verbose=False)
    status, *_ = client.predict(handle_file(str(video)), "auto", True, False, api_name="/submit")
    job = wait_done(ui_server, status.rsplit("job ", 1)[1])
    assert job["status"] == "done" and "speech" in job["result"]["text"]
    assert len(list(upload_dir(ui_server).rglob(video.name))) == 1
    assert not list(Path("/tmp/gradio").rglob(video.name))


def test_sample_clips_are_written_only_into_the_upload_directory(ui_server):
    from pipeline.web.ui import Samples

    samples = Samples(ui_server.settings.server.data_dir, str(upload_dir(ui_server)))
    if not samples.available:
        pytest.skip("samples need espeak-ng")
    path = samples.copy("hello")
    assert own_upload(path, str(upload_dir(ui_server))) == path  # a regular file the UI may read
    assert read_own_upload(path, str(upload_dir(ui_server)), 10**7)[1][:4] == b"RIFF"
    with pytest.raises(KeyError):
        samples.copy("../../etc/passwd")


@pytest.mark.browser
@pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium not installed")
def test_browser_a_url_with_another_jobs_signature_shows_nothing_of_it(token_server, browser,
                                                                       clip_factory):
    """?job=B with job A's signature: the page gets 401 and says the link is not valid; B's
    transcript never reaches it."""
    a = submit_token(token_server, clip_factory("wav", 16000, 1))
    b = submit_token(token_server, clip_factory("mp3", 44100, 2))
    from pipeline.web.views import page_query

    q = page_query(token_server.runtime.view.get(a), TOKEN, token_server.settings.limits.retention_hours)
    ctx = browser.new_context()
    page = ctx.new_page()
    try:
        page.goto(token_server.url + "/ui/", wait_until="load")
        page.wait_for_selector("input[type=password]", timeout=30_000)
        page.locator("input[type=text], input:not([type])").first.fill("qa")
        page.locator("input[type=password]").first.fill(TOKEN)
        page.locator("button").filter(has_text="Login").first.click()
        page.wait_for_selector("#sv-submit", timeout=30_000)
        page.goto(f"{token_server.url}/ui/?job={b}&{q}", wait_until="load")
        page.wait_for_selector("#sv-state-view .sv-state-error", timeout=30_000)
        assert "This link is not valid" in page.locator("#sv-state-view").inner_text()
        assert page.locator("#sv-result .sv-seg, #sv-review tr.sv-row").count() == 0
        page.goto(f"{token_server.url}/ui/?job={a}&{q}", wait_until="load")  # its own: shown
        page.wait_for_selector("#sv-result .sv-seg", timeout=30_000)
    finally:
        ctx.close()
