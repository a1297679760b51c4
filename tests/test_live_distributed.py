"""Live captions in the distributed topology (issue 22), end to end on loopback: a real
redis-server, two api processes (no model: they hold the streams, their speech detection and
endpointing) and two worker processes (the demo model: they only decode), each a real
`app_sensevoice.py`. The re-decodes travel through Redis (pipeline/serving/live_redis.py).

* a stream through each api process gets partials, and finals equal to the offline job's
  segments (same audio, same cuts);
* kill -9 of the worker holding a stream's re-decode, mid-utterance: the re-decode moves to the
  other worker within 2 s and the stream goes on to the same finals;
* kill -9 of the last worker mid-utterance: the stream ends with a named error (1013) within
  2 s, never a hang.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import redis

from tests.test_distributed import cluster  # noqa: F401  (fixture)
from tests.test_stream import Run, _stream as client_stream
from tests.test_stream import assert_finals_cover, assert_finals_match_offline, speech  # noqa: F401

LOST_AFTER_S = 0.5  # the test cluster's live_lost_after_s
MOVE_LIMIT_S = 2.0  # the bound: a dead worker's stream moves on or ends within this
CLAIMS = "sv:live:claims"
PAUSE_S = 0.7  # live_pause_s (default): silence that closes an utterance
ENV = {"SENSEVOICE_LIVE_LOST_AFTER_S": str(LOST_AFTER_S), "SENSEVOICE_SEGMENT_THRESHOLD_S": "1.0"}


def ws_url(api) -> str:
    return api.url.replace("http://", "ws://") + "/api/stream"


async def _stream(url: str, pcm: bytes) -> Run:
    """A real-time stream of ``pcm`` (test_stream's client: no token on this cluster)."""
    return await client_stream(url, pcm, headers=None, timeout_s=90)


def offline_segments(api, path) -> list[dict]:
    with open(path, "rb") as f:
        r = httpx.post(api.url + "/api/jobs", params={"wait": 60},
                       files={"file": ("speech.wav", f)}, timeout=90)
    assert r.status_code == 200, r.text
    return r.json()["result"]["segments"]


class Assassin(threading.Thread):
    """Waits until ``after_s`` into the stream, then kill -9s the first of ``workers`` seen holding
    a live re-decode (its claim in Redis), and times how long until that re-decode is no longer
    held by the dead worker (moved to another, or answered)."""

    def __init__(self, redis_url: str, workers: list, after_s: float):
        super().__init__(daemon=True)
        self.r = redis.Redis.from_url(redis_url)
        self.by_consumer = {f"{socket.gethostname()}:{w.proc.pid}".encode(): w for w in workers}
        self.after_s = after_s
        self.victim = None
        self.killed_at: float | None = None
        self.released_s: float | None = None  # kill -> the re-decode left the dead worker
        self.started = time.monotonic()

    def run(self) -> None:
        time.sleep(self.after_s)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            held = {rid: c for rid, c in self.r.hgetall(CLAIMS).items() if c in self.by_consumer}
            if held:
                rid, consumer = next(iter(held.items()))
                self.victim = self.by_consumer[consumer]
                self.victim.kill()
                self.killed_at = time.monotonic()
                while self.r.hget(CLAIMS, rid) == consumer and time.monotonic() < deadline:
                    time.sleep(0.002)
                self.released_s = time.monotonic() - self.killed_at
                return
            time.sleep(0.001)


def test_live_captions_through_two_apis_and_two_workers_survive_a_worker_kill(cluster, speech):
    redis_server, role = cluster
    api1, api2 = role("api", **ENV), role("api", **ENV)
    w1, w2 = role("worker", **ENV), role("worker", **ENV)
    for r in (api1, api2, w1, w2):
        r.ready()
    offline = offline_segments(api1, speech.path)

    async def both():
        return await asyncio.gather(_stream(ws_url(api1), speech.pcm),
                                    _stream(ws_url(api2), speech.pcm))

    for run in asyncio.run(both()):  # one stream through each api process, at once
        assert run.close_code == 1000 and run.error is None, run.messages[-3:]
        assert run.of("partial")
        assert_finals_cover(run.of("final"), speech)
        assert_finals_match_offline(run.of("final"), offline)
        # (the client's clock: each 100 ms frame is sent when it starts, as test_stream's client)
        print("per utterance, voiced start -> first partial, pause over -> final (s):", *(
            (round(min(t for t, m in run.messages if m["type"] == "partial"
                       and m["start"] == f["start"]) - a, 2),
             round(next(t for t, m in run.messages if m is f) - b - PAUSE_S, 2))
            for f, (a, b) in zip(run.of("final"), speech.spans)))

    from funasr_client import async_file_asr  # FunASR's protocol, on an api process too

    funasr_url = api2.url.replace("http://", "ws://") + "/api/stream/funasr"
    merged = asyncio.run(async_file_asr(speech.path, funasr_url, mode="2pass", svs_lang="en"))
    assert merged["text"] == " ".join(f["text"] for f in run.of("final"))

    # kill -9 the worker holding this stream's re-decode, inside the first sentence
    inside = speech.spans[0][0] + 1.0
    assassin = Assassin(redis_server.url, [w1, w2], after_s=inside)
    assassin.start()
    run = asyncio.run(_stream(ws_url(api1), speech.pcm))
    assassin.join(5)
    assert assassin.killed_at is not None, "no re-decode was seen held by a worker"
    assert assassin.released_s < MOVE_LIMIT_S, assassin.released_s
    print(f"kill -9 -> the re-decode moved to the other worker in {assassin.released_s:.3f} s")
    assert run.close_code == 1000 and run.error is None, run.messages[-3:]  # it went on ...
    assert_finals_cover(run.of("final"), speech)
    assert_finals_match_offline(run.of("final"), offline)  # ... to the same finals
    survivor = w2 if assassin.victim is w1 else w1
    metrics = dict(ln.rsplit(" ", 1) for ln in httpx.get(api1.url + "/metrics").text.splitlines()
                   if ln.startswith("sensevoice_live_"))
    assert float(metrics["sensevoice_live_redecodes_moved_total"]) >= 1, metrics
    assert float(metrics["sensevoice_live_lane_workers"]) >= 1, metrics

    # kill -9 the last worker mid-utterance: a named error, at once
    assassin = Assassin(redis_server.url, [survivor], after_s=inside)
    assassin.start()
    run = asyncio.run(_stream(ws_url(api2), speech.pcm))
    assassin.join(5)
    assert assassin.killed_at is not None
    assert run.error is not None and run.close_code == 1013, run.messages[-3:]
    assert run.error["code"] in ("live_worker_lost", "not_ready"), run.error
    error_at = run.started + next(t for t, m in run.messages if m is run.error)
    assert error_at - assassin.killed_at < MOVE_LIMIT_S, error_at - assassin.killed_at
    print(f"kill -9 of the last worker -> {run.error['code']} after "
          f"{error_at - assassin.killed_at:.3f} s")
    assert api1.proc.poll() is None and api2.proc.poll() is None
