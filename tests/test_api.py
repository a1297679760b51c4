"""Integration over real HTTP on loopback: the real app, the demo model, real media files."""

from __future__ import annotations

import time
import uuid

import httpx
import pytest

from tests.test_exports import check_subtitles, parse_srt


def submit(server, path, name=None, **form):
    with open(path, "rb") as f:
        return httpx.post(server.url + "/api/jobs", files={"file": (name or path.name, f)},
                          data={k: str(v) for k, v in form.items()}, timeout=60)


def wait_done(server, job_id, timeout=60.0) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        body = httpx.get(f"{server.url}/api/jobs/{job_id}", timeout=10).json()
        if body["status"] in ("done", "failed"):
            return body
        time.sleep(0.05)
    raise TimeoutError(job_id)


def test_health_and_ready(live_server):
    assert httpx.get(live_server.url + "/healthz").json() == {"status": "ok"}
    ready = httpx.get(live_server.url + "/readyz").json()
    assert ready["ready"] is True and ready["demo"] is True and "demo" in ready["model"]
    assert ready["warm"] is True  # a CPU model has nothing to compile or capture


def test_root_redirects_to_ui(live_server):
    r = httpx.get(live_server.url + "/", follow_redirects=False)
    assert r.status_code in (302, 307) and r.headers["location"].startswith("/ui")
    assert httpx.get(live_server.url + "/ui/", timeout=30).status_code == 200


@pytest.mark.parametrize("fmt,rate,channels", [("wav", 16000, 1), ("mp3", 44100, 2),
                                               ("opus", 48000, 1), ("m4a", 22050, 2)])
def test_submit_poll_result(live_server, clip_factory, fmt, rate, channels):
    r = submit(live_server, clip_factory(fmt, rate, channels), language="en", use_itn="true")
    assert r.status_code == 202, r.text
    body = r.json()
    assert set(body) >= {"id", "status", "position"} and body["status"] == "queued"
    uuid.UUID(body["id"])  # a full UUID
    done = wait_done(live_server, body["id"])
    assert done["status"] == "done", done
    res = done["result"]
    assert res["raw_text"].startswith("<|en|><|NEUTRAL|><|Speech|><|withitn|>")
    seg = res["segments"][0]
    assert (seg["language"], seg["emotion"], seg["events"], seg["itn"]) == ("en", "NEUTRAL", ["Speech"], "withitn")
    assert "speech" in res["text"] and "<|" not in res["text"]
    for k in ("created_at", "started_at", "finished_at", "duration_s"):
        assert done[k] is not None


def test_options_reach_the_model(live_server, clip_factory):
    r = submit(live_server, clip_factory("wav", 16000, 1), language="zh", use_itn="false")
    done = wait_done(live_server, r.json()["id"])
    assert done["result"]["raw_text"].startswith("<|zh|><|NEUTRAL|><|Speech|><|woitn|>")


def test_video_audio_track(live_server, clip_factory, media_dir):
    from tests.media import make_video_with_audio

    video = make_video_with_audio(media_dir / "with_audio.mp4", clip_factory("wav", 44100, 2))
    done = wait_done(live_server, submit(live_server, video).json()["id"])
    assert done["status"] == "done" and "speech" in done["result"]["text"]


def _bad_inputs(tmp_path, clip_factory, media_dir):
    from tests.media import make_video_without_audio

    text = tmp_path / "notes.wav"
    text.write_text("this is not audio at all\n" * 20)
    mp3 = clip_factory("mp3", 44100, 1).read_bytes()
    trunc = tmp_path / "truncated.mp3"
    trunc.write_bytes(mp3[:300])
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    silent_video = make_video_without_audio(media_dir / "no_audio.mp4")
    return [(text, (400, 415)), (trunc, (400, 415)), (empty, (400, 415)), (silent_video, (400,))]


def test_bad_inputs_get_errors_and_the_next_job_succeeds(live_server, tmp_path, clip_factory, media_dir):
    for path, statuses in _bad_inputs(tmp_path, clip_factory, media_dir):
        r = submit(live_server, path)
        assert r.status_code in statuses, (path.name, r.status_code, r.text)
        err = r.json()["error"]
        assert err["code"] and err["message"], err
    r = submit(live_server, clip_factory("wav", 16000, 1))
    assert wait_done(live_server, r.json()["id"])["status"] == "done"


def test_empty_audio_message(live_server, tmp_path):
    import wave

    path = tmp_path / "zero.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"")
    r = submit(live_server, path)
    assert r.status_code == 400 and "no audio samples" in r.json()["error"]["message"]


def test_unknown_job_is_404_json(live_server):
    r = httpx.get(f"{live_server.url}/api/jobs/{uuid.uuid4()}")
    assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found"


def test_invalid_language_is_400(live_server, clip_factory):
    r = submit(live_server, clip_factory("wav", 16000, 1), language="klingon")
    assert r.status_code == 400 and "klingon" in r.json()["error"]["message"]


def test_upload_over_byte_cap_is_413(demo_dir, tmp_path):
    from tests.conftest import LiveServer, make_settings

    server = LiveServer(make_settings(demo_dir, tmp_path / "d", max_upload_bytes=10_000)).start()
    try:
        r = httpx.post(server.url + "/api/jobs", files={"file": ("big.wav", b"\0" * 500_000)})
        assert r.status_code == 413 and r.json()["error"]["code"] == "upload_too_large"
    finally:
        server.stop()


def test_queue_full_is_503_with_retry_after(live_server, clip_factory):
    sched = live_server.runtime.pool.scheduler
    old = sched.maxsize
    sched.maxsize = 0
    try:
        r = submit(live_server, clip_factory("wav", 16000, 1))
    finally:
        sched.maxsize = old
    assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
    assert r.json()["error"]["code"] == "queue_full"


def test_metrics_endpoint_counts_jobs_and_batches(live_server, clip_factory):
    done = wait_done(live_server, submit(live_server, clip_factory("wav", 16000, 1)).json()["id"])
    assert done["status"] == "done"
    text = httpx.get(live_server.url + "/metrics").text
    lines = {ln.split(" ")[0]: ln.split(" ")[-1] for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert float(lines['sensevoice_request_success_total{lane="bulk"}']) >= 1
    assert float(lines['sensevoice_execution_count_total{device="cpu"}']) >= 1
    assert float(lines['sensevoice_inference_count_total{device="cpu"}']) >= 1
    assert 'sensevoice_jobs{state="done"}' in lines and "sensevoice_queue_depth" in lines
    assert any(k.startswith("sensevoice_queue_duration_seconds_bucket") for k in lines)


def _srt_cues(text: str) -> list[tuple[float, float, str]]:
    import re

    out = []
    for block in text.strip().split("\n\n"):
        lines = block.splitlines()
        m = re.match(r"(\d+):(\d+):(\d+),(\d+) --> (\d+):(\d+):(\d+),(\d+)$", lines[1])
        h1, m1, s1, ms1, h2, m2, s2, ms2 = map(int, m.groups())
        out.append((h1 * 3600 + m1 * 60 + s1 + ms1 / 1000, h2 * 3600 + m2 * 60 + s2 + ms2 / 1000,
                    " ".join(lines[2:])))
    return out


def test_long_recording_segments_and_exports(live_server, long_call):
    """> 30 s: split by VAD into timed segments, assembled in order; exports parse back."""
    r = submit(live_server, long_call, language="en")
    assert r.status_code == 202
    done = wait_done(live_server, r.json()["id"], timeout=120)
    assert done["status"] == "done", done
    segs = done["result"]["segments"]
    assert len(segs) >= 2
    starts = [s["start"] for s in segs]
    assert starts == sorted(starts) and all(s["end"] > s["start"] for s in segs)
    assert segs[0]["start"] < 4 and segs[-1]["start"] > 25  # speech at 2-7 s ... 32-37 s
    base = f"{live_server.url}/api/jobs/{done['id']}/result"
    srt = httpx.get(base, params={"format": "srt"})
    assert srt.status_code == 200 and srt.headers["content-type"].startswith("application/x-subrip")
    cues = _srt_cues(srt.text)
    assert len(cues) >= len(segs)  # a segment is one cue or more (subtitle limits)
    assert all(a[1] <= b[0] for a, b in zip(cues, cues[1:]))  # ordered, no overlaps
    check_subtitles(parse_srt(srt.text), done["result"]["text"])  # 2 x 42 characters, 7 s
    assert "[en]" not in srt.text  # no tags in subtitles by default
    tagged = _srt_cues(httpx.get(base, params={"format": "srt", "tags": "true"}).text)
    assert "[en] [NEUTRAL] [Speech]" in tagged[0][2]
    vtt = httpx.get(base, params={"format": "vtt", "tags": "false"}).text
    assert vtt.startswith("WEBVTT") and "[en]" not in vtt
    vtt = httpx.get(base, params={"format": "vtt", "tags": "true", "tag_style": "class"}).text
    assert "<c.en.NEUTRAL.Speech>" in vtt and "[en]" not in vtt
    assert "[en] [NEUTRAL] [Speech]" in httpx.get(base, params={"format": "txt"}).text
    js = httpx.get(base, params={"format": "json"}).json()
    assert js["result"]["segments"] == segs
    assert httpx.get(base, params={"format": "txt"}).text.count("\n") == len(segs)
    assert httpx.get(base, params={"format": "doc"}).status_code == 400
    assert httpx.get(base, params={"format": "vtt", "tag_style": "bold"}).status_code == 400
    audio = httpx.get(f"{live_server.url}/api/jobs/{done['id']}/audio")
    assert audio.status_code == 200 and audio.headers["content-type"] == "audio/wav"
    assert audio.content == long_call.read_bytes()


def test_result_of_unfinished_or_unknown_job(live_server):
    assert httpx.get(f"{live_server.url}/api/jobs/{uuid.uuid4()}/result").status_code == 404


def test_stereo_call_split_into_speakers(live_server, long_call, clip_factory):
    """split_channels: each channel is a speaker, merged into one timeline in time order."""
    r = submit(live_server, long_call, language="en", split_channels="true")
    done = wait_done(live_server, r.json()["id"], timeout=120)
    assert done["status"] == "done", done
    segs = done["result"]["segments"]
    speakers = [s["speaker"] for s in segs]
    assert set(speakers) == {"left", "right"}
    assert [s["start"] for s in segs] == sorted(s["start"] for s in segs)
    first_right = next(s for s in segs if s["speaker"] == "right")
    assert 9 < first_right["start"] < 13  # the right channel first speaks at 11 s
    vtt = httpx.get(f"{live_server.url}/api/jobs/{done['id']}/result", params={"format": "vtt"}).text
    assert "<v left>" in vtt and "<v right>" in vtt
    mono = wait_done(live_server, submit(live_server, clip_factory("wav", 16000, 1),
                                         split_channels="true").json()["id"])
    assert {s["speaker"] for s in mono["result"]["segments"]} == {None}  # mono keeps one speaker


def test_word_timestamps_in_long_recording(live_server, long_call):
    r = submit(live_server, long_call, language="en", word_timestamps="true")
    done = wait_done(live_server, r.json()["id"], timeout=120)
    assert done["options"]["word_timestamps"] is True  # the job says what was asked of it
    segs = [s for s in done["result"]["segments"] if s["text"]]
    assert segs and all(s["words"] for s in segs)
    for s in segs:  # absolute times inside their segment
        assert all(s["start"] - 0.05 <= w["start"] < w["end"] <= s["end"] + 0.05 for w in s["words"])
    # issue 39: the pieces' scores survive the store (each piece a stored row, then reassembled)
    assert len(done["result"]["segments"]) >= 2
    for s in segs:
        assert s["avg_logprob"] <= 0 and 0 < s["language_probability"] <= 1
        assert 0 < s["emotion_probability"] <= 1 and 0 < s["event_probability"] <= 1
        assert all(0 < w["probability"] <= 1 for w in s["words"])


def test_one_hour_recording_on_cpu_with_bounded_memory(demo_dir, tmp_path, long_call):
    """A 1-hour file through the whole service on CPU (tiny demo model): it completes, reports
    progress while running, and the process's peak RSS grows by a bounded amount."""
    import resource
    import wave

    import numpy as np

    from pipeline.serving.runtime import build_runtime
    from pipeline.domain.types import JobState, Lane, TranscribeOptions
    from tests.conftest import make_settings

    with wave.open(str(long_call)) as w:
        rate = w.getframerate()
        stereo = np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16).reshape(-1, 2)
    mono = stereo.max(axis=1)  # both speakers on one channel
    hour = np.tile(mono, int(np.ceil(3600 * rate / len(mono))))[: 3600 * rate]
    path = tmp_path / "hour.wav"
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(hour.tobytes())
    data = path.read_bytes()
    del hour, mono, stereo
    runtime = build_runtime(make_settings(demo_dir, tmp_path / "d"))
    runtime.start()
    try:
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
        job = runtime.intake.submit(data, filename="hour.wav", options=TranscribeOptions("en"),
                                    lane=Lane.BULK)
        seen = set()
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            j = runtime.view.get(job.id)
            if j.meta.get("progress"):
                seen.add(j.meta["progress"].split()[0])
            if j.state in (JobState.DONE, JobState.FAILED):
                break
            time.sleep(0.2)
        growth_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    finally:
        runtime.stop()
    assert j.state is JobState.DONE, j.error
    segs = j.result.segments
    assert len(segs) > 100 and segs[-1].end > 3500
    assert "segment" in seen  # "segment k of n" while running
    # the hour is 115 MB as int16 and 230 MB as float32 at 16 kHz: a few copies at most
    assert growth_mib < 1500, f"peak RSS grew by {growth_mib:.0f} MiB"
    print(f"1-hour file on CPU: {len(segs)} segments, peak RSS growth {growth_mib:.0f} MiB")


def test_fast_poll_path_answers_what_the_route_answers(live_server, clip_factory):
    """Polls of jobs in memory are answered by the FastPolls middleware without the framework;
    the body must be the route's own (the same job read cold from SQLite), byte for byte."""
    job_id = submit(live_server, clip_factory("wav", 16000, 1)).json()["id"]
    wait_done(live_server, job_id)
    view = live_server.runtime.view
    fast = httpx.get(f"{live_server.url}/api/jobs/{job_id}")
    cached = view.get_cached(job_id)
    view.forget([job_id])  # the next poll goes through the route and SQLite
    cold = httpx.get(f"{live_server.url}/api/jobs/{job_id}")
    view.remember(cached)
    assert fast.status_code == cold.status_code == 200
    assert fast.headers["content-type"] == cold.headers["content-type"] == "application/json"
    assert fast.content == cold.content and fast.json()["status"] == "done"
    # only the exact path is answered fast; the rest is the app's (here its trailing-slash redirect)
    assert httpx.get(f"{live_server.url}/api/jobs/{job_id}/").status_code == 307


def test_one_shot_wait_answers_the_finished_job(live_server, clip_factory):
    """POST /api/jobs?wait=S: 200 with the job as GET /api/jobs/{id} answers it, once done."""
    r = submit_waiting(live_server, clip_factory("wav", 16000, 1), "60", language="en")
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "done" and "speech" in body["result"]["text"]
    assert r.headers["location"] == f"/api/jobs/{body['id']}"
    assert httpx.get(f"{live_server.url}/api/jobs/{body['id']}").json() == body


@pytest.mark.parametrize("wait", ["-1", "abc", "", "nan", "inf", "1e400"])
def test_one_shot_wait_must_be_seconds(live_server, clip_factory, wait):
    r = submit_waiting(live_server, clip_factory("wav", 16000, 1), wait)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "invalid_option" and "wait" in err["message"]


def test_one_shot_wait_is_capped_and_falls_back_to_202(demo_dir, tmp_path, clip_factory):
    """A wait longer than request_wait_s is cut to it; a job not done by then is a 202 as
    without ?wait= (split_channels takes the slower path of long recordings)."""
    from tests.conftest import LiveServer, make_settings

    server = LiveServer(make_settings(demo_dir, tmp_path / "d", ui=False,
                                      request_wait_s=0.001)).start()
    try:
        r = submit_waiting(server, clip_factory("wav", 16000, 1), "600", split_channels="true")
        assert r.status_code == 202, r.text
        body = r.json()
        assert set(body) == {"id", "status", "position"} and body["status"] in ("queued", "running")
        assert r.headers["location"] == f"/api/jobs/{body['id']}"
        assert wait_done(server, body["id"])["status"] == "done"
    finally:
        server.stop()


def submit_waiting(server, path, wait, **form):
    with open(path, "rb") as f:
        return httpx.post(server.url + "/api/jobs", params={"wait": wait},
                          files={"file": (path.name, f)},
                          data={k: str(v) for k, v in form.items()}, timeout=120)
