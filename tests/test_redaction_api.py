"""Redaction on the faces of the real app (demo model, loopback), over both stores: the REST field on
jobs and batches, OpenAI's extra form field through the official client; the masked text, words,
exports, calls table and CSV, the per-job list (kinds and times, never values), and that the
unredacted text reaches neither store. The engine's output is replaced by a transcript with planted
personal data (the demo model says nothing of the kind)."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from pipeline.domain.types import Word
from pipeline.model.protocol import EngineOutput, Finished
from tests.conftest import LiveServer, make_settings
from tests.redis_server import RedisServer

TOKEN = "redact-token"
PLANTED = ("My card is 4111 1111 1111 1111, call 13800138000 or mail john.smith@example.com. "
           "The order of 2024-03-15 cost $1,299.99.")
# what must never be read back (digit groups with their space: a bare "4111" can be part of a
# timestamp's or an id's digits)
SECRETS = ("4111 1111", "1111 1111", "13800138000", "john.smith", "example.com")
ORDINARY = ("2024-03-15", "$1,299.99")
RAW = "<|en|><|NEUTRAL|><|Speech|><|withitn|>" + PLANTED


def _output(options) -> EngineOutput:
    words = ()
    if options.word_timestamps:  # as the engine makes them: a word a piece, 0.3 s each
        texts = PLANTED.replace(",", " ,").replace(". ", " . ").split()
        words = tuple(Word(t, round(0.3 * i, 3), round(0.3 * i + 0.25, 3), 0.9)
                      for i, t in enumerate(texts))
    return EngineOutput(token_ids=(1, 2, 3), raw_text=RAW, words=words, avg_logprob=-0.1)


@pytest.fixture(scope="module", params=["sqlite", "redis"])
def server(request, demo_dir, tmp_path_factory):
    redis = None
    extra = {}
    if request.param == "redis":
        redis = RedisServer(tmp_path_factory.mktemp("redact-redis")).start()
        extra["broker"] = redis.url
    live = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp(f"redact-{request.param}"),
                                    api_token=TOKEN, ui=False, **extra)).start()
    for worker in live.runtime.pool.workers:  # the model "says" the planted transcript
        worker.engine.transcribe_async = lambda waves, options: Finished([_output(o) for o in options])
    yield live
    live.stop()
    if redis is not None:
        redis.stop()


def _headers():
    return {"Authorization": f"Bearer {TOKEN}"}


def _submit(server, clip, **fields) -> httpx.Response:
    with open(clip, "rb") as f:
        return httpx.post(server.url + "/api/jobs?wait=60", headers=_headers(), files={"file": f},
                          data=fields, timeout=90)


def _stored(server, job_id) -> str:
    """Everything the store holds of the job, as text."""
    job = server.runtime.broker.get(job_id)
    return json.dumps(job.result.to_dict(), ensure_ascii=False) + job.result.raw_text


def test_rest_redact_pii_masks_text_words_exports_and_store(server, speech_clip):
    r = _submit(server, speech_clip, redact="pii", word_timestamps="true")
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["options"]["redact"] == "card,phone,email,id,digits"
    text = job["result"]["text"]
    assert text == ("My card is [CARD], call [PHONE] or mail [EMAIL]. "
                    "The order of 2024-03-15 cost $1,299.99.")
    words = [w["text"] for s in job["result"]["segments"] for w in s["words"]]
    assert "[CARD]" in words and "[PHONE]" in words and "[EMAIL]" in words
    # the list: kinds and times, never the values
    assert [d["kind"] for d in job["redactions"]] == ["card", "phone", "email"]
    card = job["redactions"][0]
    assert card["start"] == 0.9 and card["end"] == 0.9 + 3 * 0.3 + 0.25
    body = r.text + _stored(server, job["id"])
    for secret in SECRETS:
        assert secret not in body
    for fmt in ("txt", "json", "srt", "vtt"):
        out = httpx.get(f"{server.url}/api/jobs/{job['id']}/result?format={fmt}", headers=_headers())
        assert out.status_code == 200
        assert "[CARD]" in out.text and not any(s in out.text for s in SECRETS), fmt
    # the calls table and its CSV: nothing to find, nothing to read
    found = httpx.post(server.url + "/api/calls", headers=_headers(),
                       json={"all": True, "query": {"q": "4111"}})
    assert found.status_code == 200 and all(row["id"] != job["id"] for row in found.json()["rows"])
    csv = httpx.post(server.url + "/api/calls", headers=_headers(), json={"all": True, "format": "csv"})
    assert csv.status_code == 200 and job["id"] in csv.text
    assert not any(s in csv.text for s in SECRETS)


def test_without_redact_the_text_is_as_the_model_said_it(server, speech_clip):
    r = _submit(server, speech_clip)
    assert r.status_code == 200, r.text
    assert r.json()["result"]["text"] == PLANTED and "redactions" not in r.json()
    assert all(s in _stored(server, r.json()["id"]) for s in SECRETS)
    found = httpx.post(server.url + "/api/calls", headers=_headers(),
                       json={"all": True, "query": {"q": "4111"}})  # (the search looks in the text)
    assert any(row["id"] == r.json()["id"] for row in found.json()["rows"])


def test_only_the_kinds_asked_for_and_times_of_the_piece_without_words(server, speech_clip):
    r = _submit(server, speech_clip, redact="card")
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["result"]["text"].startswith("My card is [CARD], call 13800138000")
    assert job["redactions"] == [{"kind": "card", "start": 0.0,
                                  "end": job["result"]["segments"][0]["end"]}]
    for ordinary in ORDINARY:
        assert ordinary in job["result"]["text"]


def test_an_unknown_kind_is_refused_with_its_name(server, speech_clip):
    r = _submit(server, speech_clip, redact="card,ssn")
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_option" and "'ssn'" in r.json()["error"]["message"]


def test_batches_take_redact(server, speech_clip):
    with open(speech_clip, "rb") as f:
        data = f.read()
    r = httpx.post(server.url + "/api/batches", headers=_headers(), timeout=90,
                   files=[("files", ("a.wav", data)), ("files", ("b.wav", data))],
                   data={"redact": "phone,email", "redact_audio": "beep"})
    assert r.status_code == 200, r.text
    for entry in r.json()["jobs"]:
        for _ in range(600):
            got = httpx.get(f"{server.url}/api/jobs/{entry['id']}", headers=_headers(), timeout=30)
            if got.json()["status"] in ("done", "failed"):
                break
            time.sleep(0.1)
        text = got.json()["result"]["text"]
        assert "[PHONE]" in text and "[EMAIL]" in text and "4111 1111" in text
        assert got.json()["options"]["redact_audio"] == "beep"
        audio = httpx.get(f"{server.url}/api/jobs/{entry['id']}/audio", headers=_headers(), timeout=60)
        assert audio.status_code == 200 and audio.headers["content-type"] == "audio/wav"


def test_openai_client_sends_redact_as_an_extra_field(server, speech_clip):
    client = openai.OpenAI(api_key=TOKEN, base_url=server.url + "/v1", max_retries=0)
    with open(speech_clip, "rb") as f:
        out = client.audio.transcriptions.create(
            model="sensevoice-small", file=f, response_format="verbose_json",
            timestamp_granularities=["word"], extra_body={"redact": "pii"})
    body = out.model_dump()
    assert "[CARD]" in body["text"] and "[EMAIL]" in body["text"]
    assert not any(s in json.dumps(body) for s in SECRETS)
    assert "[PHONE]" in [w["word"] for w in body["words"]]
    assert [r["kind"] for r in body["redactions"]] == ["card", "phone", "email"]
    with open(speech_clip, "rb") as f:
        srt = client.audio.transcriptions.create(model="sensevoice-small", file=f,
                                                 response_format="srt", extra_body={"redact": "card"})
    assert "[CARD]" in srt and "13800138000" in srt and "1111 1111" not in srt
    with open(speech_clip, "rb") as f, pytest.raises(openai.BadRequestError, match="ssn"):
        client.audio.transcriptions.create(model="sensevoice-small", file=f,
                                           extra_body={"redact": "ssn"})


def test_json_export_lists_what_was_masked(server, speech_clip):
    job = _submit(server, speech_clip, redact="pii", word_timestamps="true").json()
    doc = httpx.get(f"{server.url}/api/jobs/{job['id']}/result?format=json", headers=_headers()).json()
    assert doc["redactions"] == job["redactions"] and len(doc["redactions"]) == 3


def test_cli_redact_through_the_server_and_a_usage_error_for_an_unknown_kind(server, speech_clip,
                                                                              tmp_path, capsys):
    from pipeline import cli

    out = tmp_path / "out"
    code = cli.main([str(speech_clip), "--out", str(out), "--server", server.url, "--token", TOKEN,
                     "--redact", "pii", "--format", "txt,json", "--quiet"])
    assert code == 0
    txt = (out / (speech_clip.stem + ".txt")).read_text()
    doc = json.loads((out / (speech_clip.stem + ".json")).read_text())
    assert "[CARD]" in txt and not any(s in txt + json.dumps(doc) for s in SECRETS)
    assert [r["kind"] for r in doc["redactions"]] == ["card", "phone", "email"]
    with pytest.raises(SystemExit) as e:
        cli.main([str(speech_clip), "--out", str(out), "--redact", "card,ssn"])
    assert e.value.code == 2 and "unknown redact kind 'ssn'" in capsys.readouterr().err


def _pcm(clip) -> bytes:
    import wave

    with wave.open(str(clip)) as w:
        assert w.getframerate() == 16000 and w.getnchannels() == 1
        return w.readframes(w.getnframes())


def test_live_streams_mask_every_caption(server, speech_clip):
    """FunASR's protocol (``redact`` in its first JSON) and /api/stream (``?redact=``): each message
    the client reads carries masks, never a planted value."""
    import asyncio

    import websockets

    from pipeline.web.links import live_query

    pcm, ws_base = _pcm(speech_clip), server.url.replace("http", "ws")

    async def funasr() -> list[dict]:
        async with websockets.connect(f"{ws_base}/api/stream/funasr?{live_query(TOKEN)}",
                                      subprotocols=["binary"], proxy=None) as ws:
            await ws.send(json.dumps({"mode": "2pass", "wav_name": "call", "is_speaking": True,
                                      "redact": "pii"}))
            for i in range(0, len(pcm), 3200):
                await ws.send(pcm[i:i + 3200])
            await ws.send(json.dumps({"is_speaking": False}))
            got = []
            while not (got and got[-1].get("is_end")):
                got.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            return got

    async def native() -> list[dict]:
        async with websockets.connect(f"{ws_base}/api/stream?redact=card,email&{live_query(TOKEN)}",
                                      proxy=None) as ws:
            for i in range(0, len(pcm), 3200):
                await ws.send(pcm[i:i + 3200])
            await ws.send(json.dumps({"type": "end"}))
            got = []
            try:
                while True:
                    got.append(json.loads(await asyncio.wait_for(ws.recv(), 60)))
            except websockets.ConnectionClosedOK:
                return got

    messages = asyncio.run(funasr())
    finals = [m for m in messages if m.get("mode") == "2pass-offline" and m["text"]]
    assert finals and all("[CARD]" in m["text"] and "[EMAIL]" in m["text"] for m in finals)
    assert not any(s in json.dumps(messages, ensure_ascii=False) for s in SECRETS)
    messages = asyncio.run(native())
    finals = [m for m in messages if m["type"] == "final"]
    assert finals and all("[CARD]" in m["text"] and "13800138000" in m["text"] for m in finals)
    assert not any(s in json.dumps(messages) for s in ("4111 1111", "john.smith"))


def test_funasr_protocol_refuses_an_unknown_kind_in_its_shape(server):
    import asyncio

    import websockets

    from pipeline.web.links import live_query

    async def go():
        async with websockets.connect(
                f"{server.url.replace('http', 'ws')}/api/stream/funasr?{live_query(TOKEN)}",
                subprotocols=["binary"], proxy=None) as ws:
            await ws.send(json.dumps({"mode": "2pass", "is_speaking": True, "redact": ["card", "ssn"]}))
            return json.loads(await asyncio.wait_for(ws.recv(), 30))

    answer = asyncio.run(go())
    assert answer["code"] == "invalid_option" and "'ssn'" in answer["error"]


def test_a_long_split_call_is_masked_piece_by_piece(server, long_call):
    """A stereo call split by channel and speech (its pieces stored one by one, then joined): every
    piece's text and words masked, the per-job list timed within each piece."""
    r = _submit(server, long_call, redact="pii", split_channels="true", word_timestamps="true")
    assert r.status_code == 200, r.text
    job = r.json()
    segments = [s for s in job["result"]["segments"] if s["text"]]
    assert len(segments) >= 2 and {s["speaker"] for s in segments} == {"left", "right"}
    assert all("[CARD]" in s["text"] and "[PHONE]" in s["text"] for s in segments)
    assert len(job["redactions"]) == 3 * len(segments)
    for item, seg in zip(job["redactions"][::3], segments):
        assert seg["start"] <= item["start"] < item["end"] <= seg["end"] + 1
    leaked = [s for s in SECRETS if s in r.text + _stored(server, job["id"])]
    assert not leaked, (leaked, r.text[:3000])


def _wav(data: bytes):
    import io
    import wave

    import numpy as np

    with wave.open(io.BytesIO(data)) as w:
        rate, channels = w.getframerate(), w.getnchannels()
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").reshape(-1, channels)
    return rate, pcm


@pytest.mark.parametrize("mode", ["silence", "beep"])
def test_redact_audio_masks_the_spans_of_the_recording_served_back(server, speech_clip, mode):
    import numpy as np

    r = _submit(server, speech_clip, redact="pii", redact_audio=mode)  # (word times: implied)
    assert r.status_code == 200, r.text
    job = r.json()
    assert job["options"]["redact_audio"] == mode
    audio = httpx.get(f"{server.url}/api/jobs/{job['id']}/audio", headers=_headers(), timeout=60)
    assert audio.status_code == 200 and audio.headers["content-type"] == "audio/wav"
    rate, served = _wav(audio.content)
    _, original = _wav(speech_clip.read_bytes())
    assert rate == 16000 and served.shape == original.shape
    card = job["redactions"][0]  # 0.9 .. 2.05 s: inside the clip
    a, b = int((card["start"] - 0.1) * rate), int((card["end"] + 0.1) * rate)
    assert b < len(original) and np.abs(original[a:b]).max() > 1000  # speech was there
    inside = served[a + 1:b - 1, 0].astype(float)
    if mode == "silence":
        assert not inside.any()
    else:  # a 1 kHz tone: its spectrum's peak
        peak_hz = np.argmax(np.abs(np.fft.rfft(inside))) * rate / len(inside)
        assert abs(peak_hz - 1000) < 20 and np.abs(inside).max() > 5000
    before = int(0.7 * rate)  # before the first item (padded): the recording as it was
    assert np.abs(served[:before].astype(int) - original[:before].astype(int)).max() <= 1
    # a job without redact_audio: the upload as it was sent
    plain = _submit(server, speech_clip, redact="pii").json()
    same = httpx.get(f"{server.url}/api/jobs/{plain['id']}/audio", headers=_headers(), timeout=60)
    assert same.content == speech_clip.read_bytes()


def test_redact_audio_alone_masks_every_kind_and_an_unknown_mode_is_refused(server, speech_clip):
    job = _submit(server, speech_clip, redact_audio="silence").json()
    assert job["options"]["redact"] == "card,phone,email,id,digits" and len(job["redactions"]) == 3
    bad = _submit(server, speech_clip, redact_audio="scramble")
    assert bad.status_code == 400 and "scramble" in bad.json()["error"]["message"]
