"""Hotwords on every face of the real app (demo model, loopback): the REST field on jobs and
batches, the OpenAI ``prompt`` through the official client, FunASR's ``hotwords`` through the
published ``funasr-client``; each list reaches the engine with its job (the worker's hand-off)
and is stored with it; hostile lists are refused with the reason."""

from __future__ import annotations

import asyncio
import json

import httpx
import openai
import pytest
import torch

from pipeline.domain.hotwords import Hotword
from pipeline.web.links import live_query
from tests.conftest import LiveServer, make_settings
from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures)

TOKEN = "hot-token"


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    live = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("hotwords"), api_token=TOKEN,
                                    ui=False)).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def clip(speech_clip):
    return speech_clip


@pytest.fixture
def seen(server, monkeypatch) -> list:
    """The options of every item the engine is given (the worker's hand-off)."""
    got = []
    for worker in server.runtime.pool.workers:
        engine = worker.engine
        launch = engine.transcribe_async

        def spy(waves, options, launch=launch):
            got.extend(options)
            return launch(waves, options)

        monkeypatch.setattr(engine, "transcribe_async", spy)
    return got


def _headers():
    return {"Authorization": f"Bearer {TOKEN}"}


def _submit(server, path, **fields):
    with open(path, "rb") as f:
        return httpx.post(server.url + "/api/jobs?wait=60", headers=_headers(), files={"file": f},
                          data=fields, timeout=90)


def test_rest_hotwords_reach_the_engine_and_are_stored_with_the_job(server, clip, seen):
    r = _submit(server, clip, hotwords="Kubernetes\nNew York:3")
    assert r.status_code == 200, r.text
    job = server.runtime.broker.get(r.json()["id"])
    want = (Hotword("Kubernetes"), Hotword("New York", 3.0))
    assert job.options.hotwords == want
    assert any(o.hotwords == want for o in seen)


def test_rest_hotwords_as_a_json_list(server, clip, seen):
    r = _submit(server, clip,
                hotwords=json.dumps(["speech:4", {"term": "北京"}]))
    assert r.status_code == 200, r.text
    assert server.runtime.broker.get(r.json()["id"]).options.hotwords == (Hotword("speech", 4.0), Hotword("北京"))


@pytest.mark.parametrize("hotwords, message", [
    ("\n".join(f"term{i}" for i in range(10_000)), "at most 1000"),
    ("Kubernetes:99", "between 0.1 and 10"),
    ("<|en|>", "tag"),
    ("hello\nzzqx", "cannot spell 'zzqx' (unknown: zz)"),  # the demo vocabulary lacks the piece zz
])
def test_hostile_lists_are_refused_with_the_reason(server, clip, hotwords, message):
    r = _submit(server, clip, hotwords=hotwords)
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "invalid_option" and message in r.json()["error"]["message"]


def test_a_batch_gives_its_list_to_every_recording(server, clip):
    path = clip
    with open(path, "rb") as a, open(path, "rb") as b:
        r = httpx.post(server.url + "/api/batches", headers=_headers(), timeout=90,
                       files=[("files", ("a.wav", a)), ("files", ("b.wav", b))], data={"hotwords": "speech:3"})
    assert r.status_code == 200, r.text
    ids = [j["id"] for j in r.json()["jobs"]]
    assert len(ids) == 2
    for job_id in ids:
        assert server.runtime.broker.get(job_id).options.hotwords == (Hotword("speech", 3.0),)


def test_openai_prompt_of_terms_is_read_as_hotwords_and_prose_is_not(server, clip, seen):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key=TOKEN, max_retries=0, timeout=120)
    path = clip
    with open(path, "rb") as f:
        client.audio.transcriptions.create(file=f, model="whisper-1", prompt="Kubernetes, New York:3")
    assert seen[-1].hotwords == (Hotword("Kubernetes"), Hotword("New York", 3.0))
    with open(path, "rb") as f:
        client.audio.transcriptions.create(file=f, model="whisper-1", prompt="A talk about Kubernetes.")
    assert seen[-1].hotwords == ()


def test_funasr_client_hotwords_are_honoured(server, clip, seen):
    from funasr_client import async_file_asr

    path = clip
    uri = server.url.replace("http", "ws") + "/api/stream/funasr?" + live_query(TOKEN)
    asyncio.run(async_file_asr(path, uri, mode="offline", hotwords={"speech": 20, "北京": 40}))
    assert any(o.hotwords == (Hotword("speech", 2.0), Hotword("北京", 4.0)) for o in seen)


def test_a_list_of_the_most_terms_allowed_is_decoded(server, clip, seen):
    letters = "abcdefghij"
    terms = [f"hello {a}{b}{c}" for a in letters for b in letters for c in letters]  # 1,000
    r = _submit(server, clip, hotwords="\n".join(terms))
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "done" and "speech" in r.json()["result"]["text"]
    assert any(len(o.hotwords) == 1000 for o in seen)


def test_openai_realtime_prompt_of_terms_is_read_as_hotwords(server, clip, seen):
    import base64
    import wave

    import numpy as np
    from openai import AsyncOpenAI

    with wave.open(str(clip)) as w:
        pcm16k = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).astype(np.float32)
    n24 = int(len(pcm16k) * 1.5)
    pcm = np.interp(np.arange(n24) / 1.5, np.arange(len(pcm16k)), pcm16k).astype(np.int16)
    pcm = np.concatenate([pcm, np.zeros(24_000, dtype=np.int16)]).tobytes()  # a pause ends the turn
    session = {"type": "transcription",
               "audio": {"input": {"format": {"type": "audio/pcm", "rate": 24_000},
                                   "transcription": {"model": "gpt-4o-transcribe", "language": "en",
                                                     "prompt": "Kubernetes, New York:3"},
                                   "turn_detection": {"type": "server_vad"}}}}

    async def go():
        client = AsyncOpenAI(api_key=TOKEN, base_url=server.url + "/v1", max_retries=0)
        async with client.realtime.connect(extra_query={"intent": "transcription"}) as conn:
            await conn.recv()
            await conn.session.update(session=session)
            await conn.recv()
            for i in range(0, len(pcm), 9600):
                await conn.input_audio_buffer.append(audio=base64.b64encode(pcm[i:i + 9600]).decode())
            while True:
                event = await asyncio.wait_for(conn.recv(), 60)
                if event.type.endswith("transcription.completed"):
                    return event

    assert asyncio.run(go()).transcript
    assert any(o.hotwords == (Hotword("Kubernetes"), Hotword("New York", 3.0)) for o in seen)


def test_the_redis_store_keeps_a_jobs_hotwords_and_hands_them_to_the_worker(redis_url):  # noqa: F811
    import time
    import uuid

    from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
    from pipeline.serving.broker_redis import RedisBroker
    from pipeline.serving.scheduler import WorkItem

    options = TranscribeOptions("en", hotwords="Kubernetes\nNew York:3")
    job = Job(str(uuid.uuid4()), JobState.QUEUED, options, Lane.BULK, time.time(), 1.0, filename="call.wav")
    broker = RedisBroker(redis_url, retention_s=60, queue_size=10)
    try:
        broker.create(job, b"upload")
        broker.put(WorkItem(job.id, job.lane, options, 16_000, audio=torch.zeros(16_000)))
        assert broker.get(job.id).options.hotwords == options.hotwords
        (item,) = broker.claim("w1", 10, 0)
        assert item.options.hotwords == (Hotword("Kubernetes"), Hotword("New York", 3.0))
    finally:
        broker.close()
