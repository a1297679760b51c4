"""The common ``POST /api/jobs`` answered without the framework (pipeline/web/fast_submit.py): the
same job and answer as the route, and every other request -- an option the route's validation
decides, a field twice, a malformed body, a query, a wrong token -- answered by the route itself,
with its body replayed unchanged. Real HTTP on loopback against the real app."""

from __future__ import annotations

import inspect

import httpx
import pytest
from fastapi import FastAPI, File, Form, UploadFile
from starlette.testclient import TestClient

from pipeline.web import fast_submit
from tests.test_api import wait_done

pytest_plugins = ["tests.fixtures_media"]


@pytest.fixture
def taken(monkeypatch):
    """The submits the fast path took (the route's are not counted)."""
    calls = []
    real = fast_submit.submit_bytes

    async def counting(*args, **kwargs):
        calls.append(args[4])  # the options it read
        return await real(*args, **kwargs)

    monkeypatch.setattr(fast_submit, "submit_bytes", counting)
    return calls


def post(server, files=None, data=None, **kw) -> httpx.Response:
    return httpx.post(server.url + "/api/jobs", files=files, data=data, timeout=60, **kw)


def test_the_common_submit_is_taken_and_answered_as_the_route_answers(live_server, speech_clip, taken):
    wav = speech_clip.read_bytes()
    r = post(live_server, files={"file": ("call é.wav", wav)},
             data={"language": "en", "use_itn": "False", "word_timestamps": "on", "model": "ignored"})
    assert r.status_code == 202, r.text
    body = r.json()
    assert set(body) == {"id", "status", "position"} and body["status"] == "queued"
    assert r.headers["location"] == f"/api/jobs/{body['id']}" and r.headers["content-type"] == "application/json"
    assert len(taken) == 1
    assert (taken[0].language, taken[0].use_itn, taken[0].word_timestamps, taken[0].ban_emo_unk) == \
        ("en", False, True, False)
    job = wait_done(live_server, body["id"])
    assert job["status"] == "done" and job["filename"] == "call é.wav" and job["result"]["text"]
    assert job["options"] == {"language": "en", "use_itn": False, "ban_emo_unk": False,
                              "split_channels": False, "word_timestamps": True}
    # the route, for the same upload with ?wait=: the same transcript
    waited = httpx.post(live_server.url + "/api/jobs", params={"wait": 60}, files={"file": ("a.wav", wav)},
                        data={"language": "en", "use_itn": "false", "word_timestamps": "true"}, timeout=90)
    assert waited.status_code == 200 and len(taken) == 1
    assert waited.json()["result"]["text"] == job["result"]["text"]


@pytest.mark.parametrize("data, files, status, code", [
    ({"language": "klingon"}, None, 400, "invalid_option"),
    ({"use_itn": "maybe"}, None, 400, "invalid_request"),
    ({"use_itn": " true"}, None, 400, "invalid_request"),
    ({}, {"other": ("a.wav", b"RIFF")}, 400, "invalid_request"),  # no 'file' part
    ({"language": "x" * 300}, None, 400, "invalid_option"),
])
def test_what_the_route_decides_is_answered_by_the_route(live_server, speech_clip, taken, data, files, status, code):
    r = post(live_server, files=files or {"file": ("a.wav", speech_clip.read_bytes())}, data=data)
    assert r.status_code == status and r.json()["error"]["code"] == code, r.text
    assert taken == []


def test_a_field_twice_or_a_second_file_goes_to_the_route(live_server, speech_clip, taken):
    wav = speech_clip.read_bytes()
    twice = post(live_server, files=[("file", ("a.wav", wav)), ("language", (None, "en")),
                                     ("language", (None, "zh"))])
    assert twice.status_code == 202, twice.text  # the route's own reading of it
    two_files = post(live_server, files=[("file", ("a.wav", wav)), ("file", ("b.wav", wav))])
    assert two_files.status_code in (202, 400), two_files.text
    assert taken == []


def test_a_malformed_body_or_a_stranger_gets_the_routes_answer(live_server, speech_clip, taken):
    broken = b"--xyz\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF"  # no end
    r = httpx.post(live_server.url + "/api/jobs", content=broken, timeout=30,
                   headers={"content-type": "multipart/form-data; boundary=xyz"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_request", r.text  # (the route's)
    assert taken == []
    headerless = b"--xyz\r\n\r\nabc\r\n--xyz--\r\n"
    r = httpx.post(live_server.url + "/api/jobs", content=headerless, timeout=30,
                   headers={"content-type": "multipart/form-data; boundary=xyz"})
    assert r.status_code == 400, r.text
    r = httpx.post(live_server.url + "/api/jobs", content=speech_clip.read_bytes(), timeout=30,
                   headers={"content-type": "audio/wav"})
    assert r.status_code == 400, r.text
    assert taken == []


def test_a_token_is_checked_before_the_body_is_read(demo_dir, tmp_path, speech_clip, taken):
    from tests.conftest import LiveServer, make_settings

    server = LiveServer(make_settings(demo_dir, tmp_path, api_token="s3cret")).start()
    try:
        files = {"file": ("a.wav", speech_clip.read_bytes())}
        refused = post(server, files=files)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
        assert taken == []
        ok = post(server, files=files, headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 202 and len(taken) == 1
    finally:
        server.stop()


def test_more_parts_than_a_submit_has_go_to_the_route(live_server, speech_clip, taken):
    extra = [(f"x{i}", (None, "1")) for i in range(fast_submit.MAX_PARTS)]  # fields the route ignores
    r = post(live_server, files=[("file", ("a.wav", speech_clip.read_bytes())), *extra])
    assert r.status_code == 202 and taken == [], r.text


def test_a_large_or_chunked_body_goes_to_the_route(live_server, speech_clip, taken, monkeypatch):
    """Only a body of a declared length up to MAX_BYTES is held in memory here; the route's parser
    spools a larger one to disk."""
    wav = speech_clip.read_bytes()
    monkeypatch.setattr(fast_submit, "MAX_BYTES", len(wav) // 2)
    assert post(live_server, files={"file": ("a.wav", wav)}).status_code == 202 and taken == []
    monkeypatch.setattr(fast_submit, "MAX_BYTES", 16 << 20)
    request = httpx.Request("POST", live_server.url + "/api/jobs", files={"file": ("a.wav", wav)})
    chunks = iter([request.read()])  # the same body without a length: chunked
    chunked = httpx.post(live_server.url + "/api/jobs", content=(c for c in chunks), timeout=60,
                         headers={"content-type": request.headers["content-type"]})
    assert chunked.status_code == 202 and taken == [], chunked.text
    assert post(live_server, files={"file": ("a.wav", wav)}).status_code == 202 and len(taken) == 1


def test_a_failed_write_is_the_routes_storage_answer(live_server, speech_clip, taken, monkeypatch):
    """An OSError below the store's own checks (the app's handler makes JSON 507/503 of it for
    the route) gets the same JSON answer here, not a plain-text 500."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(live_server.runtime.intake, "submit", full)
    wav = speech_clip.read_bytes()
    fast = post(live_server, files={"file": ("a.wav", wav)})
    route = httpx.post(live_server.url + "/api/jobs", params={"wait": 1}, files={"file": ("a.wav", wav)}, timeout=60)
    assert len(taken) == 1 and fast.status_code == route.status_code == 507, (fast.text, route.text)
    assert fast.json() == route.json() and fast.json()["error"]["code"] == "storage_full"


# -- bodies that could be read two ways (issue 36): the fast path answered 202 where the route
# answered 400; now each goes to the route (or is refused at the edge), and the answers match
def multipart(boundary: str, parts: list[tuple[str, bytes]]) -> bytes:
    """A multipart body of (part headers, part data), written by hand (httpx would tidy it)."""
    out = b""
    for headers, data in parts:
        out += f"--{boundary}\r\n{headers}\r\n\r\n".encode("latin-1") + data + b"\r\n"
    return out + f"--{boundary}--\r\n".encode()


def file_part(wav: bytes, name: str = "file") -> tuple[str, bytes]:
    return (f'Content-Disposition: form-data; name="{name}"; filename="a.wav"', wav)


def field(name: str, value: bytes) -> tuple[str, bytes]:
    return (f'Content-Disposition: form-data; name="{name}"', value)


def fast_and_route(server, body: bytes, headers) -> tuple[httpx.Response, httpx.Response]:
    """The same request as the fast path would take it, and with a query (the route's own)."""
    fast = httpx.post(server.url + "/api/jobs", content=body, headers=headers, timeout=60)
    route = httpx.post(server.url + "/api/jobs", params={"wait": 0}, content=body, headers=headers,
                       timeout=60)
    return fast, route


def same_answer(fast: httpx.Response, route: httpx.Response) -> None:
    assert fast.status_code == route.status_code, (fast.text, route.text)
    if fast.status_code >= 400:
        assert fast.json() == route.json(), (fast.text, route.text)
    else:
        assert set(fast.json()) == set(route.json()) == {"id", "status", "position"}


MULTIPART = "multipart/form-data; boundary=xyz"


@pytest.mark.parametrize("case, parts, status", [
    ("a plain file field after the file part", lambda wav: [file_part(wav), field("file", b"x")], 400),
    ("a plain file field before the file part", lambda wav: [field("file", b"x"), file_part(wav)], 202),
    ("a plain file field only", lambda wav: [field("file", wav)], 400),
    ("an ignored field twice", lambda wav: [file_part(wav), field("model", b"a"), field("model", b"b")], 202),
    ("a part without a name", lambda wav: [file_part(wav), ("Content-Disposition: form-data", b"x")], 400),
    ("a part's disposition twice", lambda wav: [
        ('Content-Disposition: form-data; name="file"; filename="a.wav"\r\n'
         'Content-Disposition: form-data; name="other"; filename="b.wav"', wav)], None),
    ("a disposition's name twice", lambda wav: [
        ('Content-Disposition: form-data; name="other"; name="file"; filename="a.wav"', wav)], None),
])
def test_a_part_that_could_be_read_two_ways_gets_the_routes_answer(live_server, speech_clip, taken,
                                                                     case, parts, status):
    body = multipart("xyz", parts(speech_clip.read_bytes()))
    fast, route = fast_and_route(live_server, body, {"content-type": MULTIPART})
    same_answer(fast, route)
    assert status is None or fast.status_code == status, (case, fast.text)
    assert taken == [], case


@pytest.mark.parametrize("content_types", [
    ["multipart/form-data; boundary=xyz", "multipart/form-data; boundary=abc"],  # body: the first's
    ["multipart/form-data; boundary=abc", "multipart/form-data; boundary=xyz"],  # body: the last's
    ["multipart/form-data; boundary=abc; boundary=xyz"],
    ["multipart/form-data; boundary=xyz; Boundary=abc"],
    ["multipart/form-data; boundary=xyz", "text/plain"],
])
def test_a_content_type_that_could_be_read_two_ways_is_refused_by_name(live_server, speech_clip, taken,
                                                                       content_types):
    body = multipart("xyz", [file_part(speech_clip.read_bytes())])
    headers = [("content-type", value) for value in content_types]
    fast, route = fast_and_route(live_server, body, headers)
    same_answer(fast, route)
    assert fast.status_code == 400 and fast.json()["error"]["code"] == "ambiguous_request", fast.text
    assert taken == []


def test_a_charset_goes_to_the_route(live_server, speech_clip, taken):
    """A charset changes how the route decodes names and values: the route decides."""
    body = multipart("xyz", [file_part(speech_clip.read_bytes()), field("language", b"en")])
    fast, route = fast_and_route(live_server, body, {"content-type": MULTIPART + "; charset=latin-1"})
    same_answer(fast, route)
    assert fast.status_code == 202 and taken == []


def test_duplicated_framing_headers_never_reach_the_fast_path(live_server, speech_clip, taken):
    """Two Content-Length or Transfer-Encoding headers: refused before the app (by the HTTP
    parser or the edge) on the headers alone, never submitted here. (Only the headers are sent:
    a server that closes on a refusal while body bytes it never read are in flight resets the
    connection, and the reset can drop its 400 before the client reads it. A server that waited
    for the body instead of refusing would time this test out.)"""
    import socket

    body = multipart("xyz", [file_part(speech_clip.read_bytes())])
    host, port = live_server.url.split("//")[1].split(":")
    for extra in (f"Content-Length: {len(body)}\r\nContent-Length: {len(body)}\r\n",
                  f"Content-Length: {len(body)}\r\nTransfer-Encoding: chunked\r\n"):
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            sock.sendall(f"POST /api/jobs HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: {MULTIPART}\r\n"
                         f"{extra}Connection: close\r\n\r\n".encode())
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400"), answer[:200]
    assert taken == []


def test_the_fast_path_itself_passes_ambiguous_headers_on():
    """Behind the edge these never arrive; the fast path still reads no header two ways."""
    def scope(*headers):
        return {"headers": [(n.encode(), v.encode()) for n, v in headers]}

    ok = scope(("content-type", MULTIPART), ("content-length", "10"))
    assert fast_submit._boundary_and_length(ok) == (b"xyz", 10)
    for bad in [scope(("content-type", MULTIPART), ("Content-Type", "multipart/form-data; boundary=a"),
                      ("content-length", "10")),
                scope(("content-type", MULTIPART), ("content-length", "10"), ("Content-Length", "10")),
                scope(("content-type", MULTIPART), ("content-length", "10"), ("transfer-encoding", "chunked")),
                scope(("content-type", MULTIPART + "; boundary=a"), ("content-length", "10")),
                scope(("content-type", MULTIPART + "; charset=utf-8"), ("content-length", "10"))]:
        assert fast_submit._boundary_and_length(bad)[0] is None, bad


# -- the fast path's fields are the route's (issue 37): read from its declaration, never copied
def route_form(app) -> dict[str, tuple[object, object]]:
    """The route's File and Form parameters as its endpoint's signature declares them: name ->
    (annotation, default). Read independently of fast_submit.declared_form."""
    from fastapi import params
    from fastapi.routing import iter_route_contexts

    [endpoint] = [c.endpoint for c in iter_route_contexts(app.routes)
                  if c.path == "/api/jobs" and "POST" in (c.methods or ())]
    return {p.name: (p.annotation, p.default.default) for p in inspect.signature(endpoint, eval_str=True).parameters.values()
            if isinstance(p.default, params.Form)}  # (File is a Form)


def test_the_fast_path_reads_every_field_the_route_declares(live_server, speech_clip, taken):
    declared = route_form(live_server.app)
    form = fast_submit.declared_form(live_server.app)
    assert form is not None, "the route declares a field the fast path cannot read: it is off"
    assert {form.file, *form.options} == set(declared)
    assert {name: (kind, default) for name, (kind, default) in form.options.items()} == \
        {name: declared[name] for name in form.options}
    assert post(live_server, files={"file": ("a.wav", speech_clip.read_bytes())}).status_code == 202
    assert len(taken) == 1  # the server's own fast path is on


SAMPLES = {"language": "en", "languages": "zh,ja", "hotwords": "kubernetes", "redact": "card,phone", "redact_audio": "beep",
           "speakers": "2", "min_speakers": "2", "max_speakers": "3"}  # a str option's value other than its default (add one per new str option)


def test_each_option_of_the_route_gives_the_same_job_both_ways(live_server, speech_clip, taken):
    """Each option the route declares, sent with a value other than its default, through the fast
    path and through the route: the same options on both jobs (an option the fast path dropped or
    read differently fails here)."""
    wav = speech_clip.read_bytes()
    declared = route_form(live_server.app)
    options = {name: (kind, default) for name, (kind, default) in declared.items() if kind in (bool, str)}
    assert set(declared) - set(options) == {"file"}
    for name, (kind, default) in options.items():
        assert kind is bool or name in SAMPLES, f"give SAMPLES a value of the route's new option {name!r}"
        value = str(not default).lower() if kind is bool else SAMPLES[name]
        assert value != str(default).lower()
        before = len(taken)
        fast = post(live_server, files={"file": ("a.wav", wav)}, data={name: value})
        route = httpx.post(live_server.url + "/api/jobs", params={"wait": 0}, files={"file": ("a.wav", wav)},
                           data={name: value}, timeout=60)
        assert fast.status_code == route.status_code == 202, (name, fast.text, route.text)
        assert len(taken) == before + 1, name
        jobs = [httpx.get(f"{live_server.url}/api/jobs/{r.json()['id']}", timeout=30).json() for r in (fast, route)]
        assert jobs[0]["options"] == jobs[1]["options"], name
        assert str(jobs[0]["options"][name]).lower() == value, name


def _app_with(endpoint):
    app = FastAPI()
    app.post("/api/jobs", status_code=202)(endpoint)
    return app


def test_a_field_the_fast_path_cannot_read_as_the_route_does_turns_it_off():
    """A route whose form gains a field the fast path cannot read exactly as the route does (no
    option of TranscribeOptions, another type, a constraint, a required option) has every submit
    answered by the route: nothing the client sent is dropped on the way."""
    async def today(file: UploadFile = File(...), language: str = Form("auto"), use_itn: bool = Form(True)):
        return {"route": True}

    async def callback(file: UploadFile = File(...), language: str = Form("auto"), callback_url: str = Form("")):
        return {"route": True}

    async def typed(file: UploadFile = File(...), use_itn: int = Form(1)):
        return {"route": True}

    async def constrained(file: UploadFile = File(...), language: str = Form("auto", max_length=8)):
        return {"route": True}

    async def required(file: UploadFile = File(...), language: str = Form(...)):
        return {"route": True}

    async def no_upload(language: str = Form("auto")):
        return {"route": True}

    form = fast_submit.declared_form(_app_with(today))
    assert form == fast_submit.SubmitForm("file", {"language": (str, "auto"), "use_itn": (bool, True)})
    for endpoint in (callback, typed, constrained, required, no_upload):
        assert fast_submit.declared_form(_app_with(endpoint)) is None, endpoint.__name__
    app = _app_with(callback)
    app.add_middleware(fast_submit.FastSubmit, intake=None, token="")  # (an intake would be called)
    with TestClient(app) as client:
        r = client.post("/api/jobs", files={"file": ("a.wav", b"RIFF")}, data={"callback_url": "http://x"})
    assert r.status_code == 202 and r.json() == {"route": True}, r.text
