"""The OpenAI-compatible API (pipeline/web/routes/openai.py), driven by the official ``openai``
client, unchanged, against the real app on loopback (demo model, real audio)."""

from __future__ import annotations

import re
import threading

import httpx
import openai
import pytest

from tests.conftest import LiveServer, make_settings
from tests.test_exports import check_subtitles, parse_srt, parse_vtt

TOKEN = "s3cret-token"
FORMATS = ("json", "text", "srt", "vtt", "verbose_json")


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    settings = make_settings(demo_dir, tmp_path_factory.mktemp("openai"), api_token=TOKEN, ui=False)
    live = LiveServer(settings).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def strict(demo_dir, tmp_path_factory):
    """Small uploads (120 kB) and a wait of 1 ms: refusals and the wait's time-out."""
    settings = make_settings(demo_dir, tmp_path_factory.mktemp("openai-strict"), ui=False,
                             max_upload_bytes=120_000, request_wait_s=0.001)
    live = LiveServer(settings).start()
    yield live
    live.stop()


def transcribe(client, path, **kw):
    with open(path, "rb") as f:
        return client.audio.transcriptions.create(file=f, model=kw.pop("model", "whisper-1"), **kw)


def spy_submits(monkeypatch, service) -> list:
    """Record the lane of each submit the service gets."""
    calls = []
    submit = service.submit

    def spy(*args, **kw):
        calls.append(kw.get("lane"))
        return submit(*args, **kw)

    monkeypatch.setattr(service, "submit", spy)
    return calls


def test_models_list_and_retrieve(client):
    assert [m.id for m in client.models.list()] == ["sensevoice-small", "whisper-1"]
    model = client.models.retrieve("whisper-1")
    assert model.id == "whisper-1" and model.object == "model" and model.owned_by == "sensevoice"
    with pytest.raises(openai.NotFoundError) as e:
        client.models.retrieve("gpt-5")
    assert e.value.code == "model_not_found" and e.value.type == "not_found_error"


@pytest.fixture(scope="module")
def reference(server, speech_clip):
    """The job as the REST API gives it, words included: what every format must agree with."""
    with open(speech_clip, "rb") as f:
        r = httpx.post(server.url + "/api/jobs", params={"wait": "60"}, timeout=120,
                       headers={"Authorization": f"Bearer {TOKEN}"}, files={"file": f},
                       data={"language": "en", "word_timestamps": "true"})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.mark.parametrize("fmt", FORMATS)
def test_every_response_format(server, client, speech_clip, fmt, reference, monkeypatch):
    from pipeline.domain.types import Lane

    lanes = spy_submits(monkeypatch, server.runtime.intake)
    out = transcribe(client, speech_clip, response_format=fmt, language="en")
    assert lanes == [Lane.INTERACTIVE]  # one job, through the same queue, interactive lane
    text = reference["result"]["text"]  # the demo model says "speech speech ..."
    assert text.startswith("speech")
    if fmt == "json":
        assert out.text == text and out.usage.type == "duration"
        assert out.usage.seconds == pytest.approx(reference["audio_seconds"], abs=0.001)
    elif fmt == "text":
        assert out == text + "\n"
    elif fmt == "srt":
        cues = parse_srt(out)
        check_subtitles(cues, text)
        # timed by the words (the first starts 30 ms in), not by the segment (at 0)
        assert cues[0][0] == reference["result"]["segments"][0]["words"][0]["start"] > 0
    elif fmt == "vtt":
        check_subtitles(parse_vtt(out), text)
    else:
        assert out.text == text and out.language == "english"
        assert out.duration == pytest.approx(reference["audio_seconds"], abs=0.001)
        assert out.words is None
        extra = out.model_extra
        assert extra["task"] == "transcribe"
        seg = out.segments[0]
        assert (seg.id, seg.start, seg.seek, seg.text, seg.tokens) == (0, 0.0, 0, text, [])
        assert seg.end == pytest.approx(out.duration, abs=0.01)
        assert seg.no_speech_prob == 0.0 and seg.temperature == 0.0 and seg.compression_ratio > 1
        # what SenseVoice knows, beside OpenAI's fields
        assert (seg.model_extra["language"], seg.model_extra["emotion"],
                seg.model_extra["events"]) == ("en", "NEUTRAL", ["Speech"])
        assert "speaker" not in seg.model_extra  # only split calls have speakers


def test_content_types(client, speech_clip):
    with open(speech_clip, "rb") as f:
        raw = client.audio.transcriptions.with_raw_response.create(
            file=f, model="sensevoice-small", response_format="text")
    assert raw.headers["content-type"].startswith("text/plain")
    with open(speech_clip, "rb") as f:
        raw = client.audio.transcriptions.with_raw_response.create(
            file=f, model="sensevoice-small", response_format="vtt")
    assert raw.headers["content-type"].startswith("text/vtt")
    assert raw.parse().startswith("WEBVTT")


def test_word_granularity(client, speech_clip, reference):
    out = transcribe(client, speech_clip, response_format="verbose_json",
                     timestamp_granularities=["word", "segment"])
    words = out.words
    assert [w.word for w in words] == reference["result"]["text"].split()
    assert [(w.start, w.end) for w in words] == [
        (w["start"], w["end"]) for w in reference["result"]["segments"][0]["words"]]
    assert all(0 <= w.start < w.end <= out.duration + 0.05 for w in words)
    assert all(a.end <= b.start for a, b in zip(words, words[1:]))
    assert len(out.segments) == 1 and out.language == "english"  # auto: the detected language


def test_languages(client, speech_clip):
    for language in ("en", "en-US", "english", "auto", "zh", "yue", "ja", "ko"):
        assert transcribe(client, speech_clip, language=language).text  # accepted
    for language in ("xx", "klingon", "nospeech"):
        with pytest.raises(openai.BadRequestError) as e:
            transcribe(client, speech_clip, language=language)
        err = e.value
        assert (err.status_code, err.type, err.param, err.code) == (
            400, "invalid_request_error", "language", "invalid_option")
        assert language in err.message and set(err.body) == {"message", "type", "param", "code"}


def test_model_names(client, speech_clip):
    assert transcribe(client, speech_clip, model="sensevoice-small").text
    assert transcribe(client, speech_clip, model="whisper-1").text
    with pytest.raises(openai.BadRequestError) as e:
        transcribe(client, speech_clip, model="gpt-4o-transcribe")
    assert (e.value.param, e.value.code) == ("model", "model_not_found")


def test_bad_fields_in_openai_error_shape(server, speech_clip):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = server.url + "/v1/audio/transcriptions"
    data = speech_clip.read_bytes()
    cases = [({"response_format": "docx"}, "response_format"),
             ({"timestamp_granularities[]": "char"}, "timestamp_granularities[]"),
             ({"stream": "true"}, "stream")]
    for form, param in cases:
        r = httpx.post(url, headers=auth, files={"file": ("a.wav", data)}, data=form, timeout=60)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == param and r.json()["error"]["type"] == (
            "invalid_request_error")
    r = httpx.post(url, headers=auth, data={"model": "whisper-1"}, timeout=60)  # no file
    assert r.status_code == 400 and r.json()["error"]["param"] == "file"
    # prompt and temperature are accepted and ignored; curl needs no model
    r = httpx.post(url, headers=auth, files={"file": ("a.wav", data)},
                   data={"prompt": "a call", "temperature": "0.2"}, timeout=60)
    assert r.status_code == 200 and r.json()["text"]
    r = httpx.get(server.url + "/v1/embeddings", headers=auth)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    schema = httpx.get(server.url + "/openapi.json", headers=auth).json()  # documented
    form = schema["paths"]["/v1/audio/transcriptions"]["post"]["requestBody"]
    assert "multipart/form-data" in form["content"]


def test_token_as_the_client_sends_it(server, speech_clip):
    wrong = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        transcribe(wrong, speech_clip)
    assert e.value.code == "unauthorized" and e.value.type == "authentication_error"
    with pytest.raises(openai.AuthenticationError):
        wrong.models.list()
    r = httpx.get(server.url + "/v1/models")  # no token at all
    assert r.status_code == 401 and set(r.json()["error"]) == {"message", "type", "param", "code"}


def test_non_audio_file(client, tmp_path):
    notes = tmp_path / "notes.mp3"
    notes.write_text("this is not audio at all\n" * 50)
    with pytest.raises(openai.APIStatusError) as e:
        transcribe(client, notes)
    err = e.value
    assert err.status_code == 415 and err.param == "file" and err.type == "invalid_request_error"
    assert err.code == "unsupported_media"


def test_split_call_segments_carry_speakers(client, long_call):
    out = transcribe(client, long_call, response_format="verbose_json", language="en",
                     extra_body={"split_channels": "true"})
    speakers = [s.model_extra["speaker"] for s in out.segments]
    assert set(speakers) == {"left", "right"}
    starts = [s.start for s in out.segments]
    assert starts == sorted(starts) and out.duration == pytest.approx(48.0, abs=0.1)
    srt = transcribe(client, long_call, response_format="srt",
                     extra_body={"split_channels": "true"})
    cues = parse_srt(srt)
    assert {lines[0].split(":")[0] for _, _, lines in cues} == {"left", "right"}


def test_concurrent_requests(server, speech_clip):
    """More requests at once than one client may upload at once (4): each gives its upload slot
    back once its job is submitted, and a client that meets the limit retries after Retry-After."""
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, timeout=120)
    results, errors = [], []

    def one():
        try:
            results.append(transcribe(client, speech_clip).text)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=one) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors and len(results) == 8 and len(set(results)) == 1


def test_a_waiting_request_holds_no_upload_slot():
    """UploadLimit counts a large upload until its handler has submitted the job
    (release_upload_slot), not while the handler then waits for the job."""
    import asyncio

    from starlette.requests import Request

    from pipeline.web.middleware import UploadLimit, release_upload_slot

    async def scenario():
        submitted, finish = asyncio.Event(), asyncio.Event()

        async def app(scope, receive, send):
            while (await receive()).get("more_body"):
                pass
            release_upload_slot(Request(scope))  # what submit_upload does after the submit
            submitted.set()
            await finish.wait()  # the wait for the job
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"{}"})

        limit = UploadLimit(app, max_bytes=10**6, max_in_flight=1, max_per_client=1)

        async def receive():
            return {"type": "http.request", "body": b"\0" * 100_000, "more_body": False}

        async def send(message):
            pass

        scope = {"type": "http", "method": "POST", "path": "/v1/audio/transcriptions",
                 "client": ("10.0.0.1", 1), "headers": [(b"content-length", b"100000")]}
        task = asyncio.create_task(limit(dict(scope), receive, send))
        await submitted.wait()
        assert (limit.in_flight, limit.per_client) == (0, {})  # free while it waits
        finish.set()
        await task
        assert (limit.in_flight, limit.per_client) == (0, {})  # and released only once

    asyncio.run(scenario())


def test_host_and_origin_guard_cover_v1(server, speech_clip):
    auth = {"Authorization": f"Bearer {TOKEN}"}
    url = server.url + "/v1/audio/transcriptions"
    files = {"file": ("a.wav", speech_clip.read_bytes())}
    r = httpx.post(url, headers={**auth, "Origin": "http://evil.example"}, files=files)
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_site_request"
    r = httpx.get(server.url + "/v1/models", headers={**auth, "Host": "evil.example"})
    assert r.status_code == 400 and r.json()["error"]["code"] == "host_not_allowed"


def test_oversized_upload(strict, tmp_path):
    client = openai.OpenAI(base_url=strict.url + "/v1", api_key="any", max_retries=0)
    huge = tmp_path / "huge.wav"  # refused by the upload middleware from its declared length
    huge.write_bytes(b"\0" * 400_000)
    with pytest.raises(openai.APIStatusError) as e:
        transcribe(client, huge)
    assert e.value.status_code == 413 and e.value.code == "upload_too_large"
    assert e.value.type == "invalid_request_error"  # the middleware's refusal, OpenAI's shape
    big = tmp_path / "big.wav"  # within the middleware's slack: refused by the route's read
    big.write_bytes(b"\0" * 150_000)
    with pytest.raises(openai.APIStatusError) as e:
        transcribe(client, big)
    assert (e.value.status_code, e.value.code, e.value.param) == (413, "upload_too_large", "file")


def test_wait_timeout_is_504_naming_the_job(strict, speech_clip, monkeypatch):
    """Past request_wait_s: 504, the job named, no retry by the client (it would upload again);
    the job goes on and its result is at /api/jobs/{id}."""
    lanes = spy_submits(monkeypatch, strict.runtime.intake)
    client = openai.OpenAI(base_url=strict.url + "/v1", api_key="any", max_retries=2)
    with pytest.raises(openai.InternalServerError) as e:  # split_channels: the slower long path
        transcribe(client, speech_clip, extra_body={"split_channels": "true"})
    err = e.value
    assert (err.status_code, err.code, err.type) == (504, "job_wait_timeout", "server_error")
    assert err.response.headers["x-should-retry"] == "false" and len(lanes) == 1
    job_id = re.search(r"job ([0-9a-f-]{36})", err.message).group(1)
    from tests.test_api import wait_done

    assert wait_done(strict, job_id)["status"] == "done"


def test_confidence_in_verbose_json_and_the_job(client, speech_clip, reference):
    """Whisper's avg_logprob per segment and probability per word, from the CTC posteriors; the
    tags' probabilities beside them (issue 39)."""
    seg = reference["result"]["segments"][0]
    assert seg["avg_logprob"] is not None and seg["avg_logprob"] <= 0
    assert 0 < seg["language_probability"] <= 1 and 0 < seg["emotion_probability"] <= 1
    assert all(0 < w["probability"] <= 1 for w in seg["words"])
    out = transcribe(client, speech_clip, response_format="verbose_json", language="en",
                     timestamp_granularities=["word"])
    got = out.segments[0]
    assert got.avg_logprob == seg["avg_logprob"]
    assert got.model_extra["emotion_probability"] == seg["emotion_probability"]
    assert [w.model_extra["probability"] for w in out.words] == [w["probability"] for w in seg["words"]]


def test_a_language_list_is_an_allow_list(server, client, speech_clip):
    """``language=zh,ja``: the demo model says English; the decision is taken among zh and ja."""
    out = transcribe(client, speech_clip, response_format="verbose_json", language="zh,ja")
    assert {s.model_extra["language"] for s in out.segments} <= {"zh", "ja", "nospeech"}
    assert out.text
    with pytest.raises(openai.BadRequestError) as e:
        transcribe(client, speech_clip, language="zh,xx")
    assert (e.value.status_code, e.value.param, e.value.code) == (400, "language", "invalid_option")
    assert "xx" in e.value.message
    headers = {"Authorization": f"Bearer {TOKEN}"}
    for value, status in (("en,xx", 400), ("zh, ja", 200)):
        with open(speech_clip, "rb") as f:
            r = httpx.post(server.url + "/api/jobs", params={"wait": "60"}, timeout=120, headers=headers,
                           files={"file": f}, data={"languages": value})
        assert r.status_code == status, r.text
        if status == 400:
            assert r.json()["error"]["code"] == "invalid_option" and "'xx'" in r.json()["error"]["message"]
        else:
            assert {s["language"] for s in r.json()["result"]["segments"]} <= {"zh", "ja", "nospeech"}
