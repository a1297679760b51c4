"""The backlog of long recordings is bounded, visible and on disk. Before: 42 uploads of 30 min of
silence (14 KB FLACs) in 45 s took the server from 2.4 to 6.7 GB while the queue depth said 0 (the
jobs waited for VAD in an unbounded executor holding their audio)."""

from __future__ import annotations

import re
import threading
import time

import httpx
import pytest

from pipeline.serving.admission import Backlog
from pipeline.domain.errors import BacklogFull
from tests.conftest import LiveServer, make_settings
from tests.test_api import submit, wait_done


def test_backlog_bounds_jobs_and_audio_seconds():
    backlog = Backlog(max_jobs=2, max_seconds=100.0, retry_after_s=7)
    backlog.admit("a", 40.0)
    with pytest.raises(BacklogFull, match="limit") as e:
        backlog.admit("b", 61.0)  # 101 s of audio
    assert e.value.retry_after == 7 and e.value.status == 503
    backlog.admit("b", 60.0)
    with pytest.raises(BacklogFull, match="2 long recordings"):
        backlog.check()
    backlog.admit("recovered", 500.0, force=True)  # an accepted job is never dropped
    assert backlog.snapshot() == (3, 600.0)
    assert backlog.release("a") and not backlog.release("a")
    assert backlog.snapshot() == (2, 560.0)


class _HeldSegmenter:
    """Stands in for silero-vad and holds every split until released (jobs pile up in the backlog)."""

    def __init__(self, real):
        self.real = real
        self.release = threading.Event()
        self.waves = []

    def split(self, wave, on_progress=None):
        self.waves.append(wave)
        assert self.release.wait(60)
        return self.real.split(wave, on_progress=on_progress)


def _wav_seconds(path) -> float:
    import wave

    with wave.open(str(path)) as w:
        return w.getnframes() / w.getframerate()


def _tone_wav(path, seconds: float, rate: int = 16000) -> None:
    import wave

    import numpy as np

    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        t = np.arange(int(seconds * rate)) / rate
        w.writeframes((np.sin(2 * np.pi * 440 * t) * 6000).astype("<i2").tobytes())


def _metric(text: str, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


def test_long_uploads_beyond_the_backlog_get_503_and_wait_on_disk(demo_dir, tmp_path, clip_factory):
    clip = clip_factory("wav", 16000, 1)  # speech, a few seconds: "long" past a 1 s threshold
    seconds = _wav_seconds(clip)
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", segment_threshold_s=1.0,
                                      segment_backlog_jobs=2, decode_processes=0)).start()
    long_audio = server.runtime.intake.long_audio
    held = _HeldSegmenter(long_audio.segmenter())
    long_audio._segmenter = held  # the splitter is slow now: a backlog builds up
    try:
        first, second = (submit(server, clip) for _ in range(2))
        assert first.status_code == 202 and second.status_code == 202
        r = submit(server, clip)
        assert r.status_code == 503 and r.json()["error"]["code"] == "backlog_full"
        assert int(r.headers["Retry-After"]) > 0
        short = tmp_path / "short.wav"  # short jobs do not count
        _tone_wav(short, 0.5)
        assert submit(server, short).status_code == 202
        metrics = httpx.get(server.url + "/metrics").text
        assert _metric(metrics, "sensevoice_backlog_jobs") == 2
        assert _metric(metrics, "sensevoice_backlog_audio_seconds") == pytest.approx(2 * seconds, abs=0.01)
        ids = [first.json()["id"], second.json()["id"]]
        waves = [long_audio.waves.path(j) for j in ids]
        assert all(p.exists() for p in waves)  # the waiting audio is on disk ...
        deadline = time.monotonic() + 10
        while len(held.waves) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(w.numpy().base is not None for w in held.waves)  # ... memory-mapped, not copied
        held.release.set()
        assert all(wait_done(server, j)["status"] == "done" for j in ids)
        assert not any(p.exists() for p in waves)  # deleted with the job's finish
        metrics = httpx.get(server.url + "/metrics").text
        assert _metric(metrics, "sensevoice_backlog_jobs") == 0
        assert submit(server, clip).status_code == 202  # room again
    finally:
        held.release.set()
        server.stop()
