"""Speakers on the faces of the real app (demo ASR model, loopback): POST /api/jobs with
``speakers``/``diarize``, the job's JSON (``speaker`` per segment), SRT/VTT (the speaker on each
cue, as a split stereo call's channel), OpenAI's ``verbose_json``; hostile counts refused; the
CLI's ``--speakers``. The app's own speaker model is the demo CAM++ (random: it does not separate
voices, tests/test_speaker_pipeline.py), so one test swaps in the pitch double to check the labels
end to end, and one keeps the demo weights to check they load and label."""

from __future__ import annotations

import shutil

import httpx
import numpy as np
import pytest

from pipeline.serving.speakers import SpeakerLabeller
from tests.conftest import LiveServer, make_settings
from tests.media import write_pcm_wav
from tests.speaker_calls import two_voice_call
from tests.test_speaker_pipeline import pitch_embed

pytestmark = pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="needs espeak-ng")
TOKEN = "speaker-token"


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    live = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("speakers"), api_token=TOKEN,
                                    ui=False)).start()
    yield live
    live.stop()


@pytest.fixture(scope="module")
def call_wav(tmp_path_factory):
    wave, truth = two_voice_call(tmp_path_factory.mktemp("speaker-call"))
    path = tmp_path_factory.mktemp("speaker-wav") / "call.wav"
    write_pcm_wav(path, np.clip(wave * 32767, -32768, 32767).astype(np.int16), 16_000)
    return path, truth


def _submit(server, path, **fields):
    with open(path, "rb") as f:
        return httpx.post(server.url + "/api/jobs?wait=120", headers={"Authorization": f"Bearer {TOKEN}"},
                          files={"file": f}, data=fields, timeout=180)


@pytest.mark.parametrize("fields, message", [
    ({"speakers": "0", "diarize": "true"}, "speakers=0"),
    ({"speakers": "50"}, "speakers=50"),
    ({"speakers": "two"}, "whole number"),
    ({"min_speakers": "4", "max_speakers": "2"}, "min_speakers=4"),
])
def test_bad_counts_are_refused(server, call_wav, fields, message):
    r = _submit(server, call_wav[0], **fields)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_option", r.text
    assert message in r.json()["error"]["message"]


def test_segments_carry_their_speaker_on_every_face(server, call_wav, monkeypatch):
    path, truth = call_wav
    monkeypatch.setattr(server.runtime.intake.long_audio, "_load_speakers", lambda: SpeakerLabeller(pitch_embed))
    r = _submit(server, path, speakers="2", word_timestamps="true")
    assert r.status_code == 200, r.text
    job = r.json()
    segments = job["result"]["segments"]
    assert {s["speaker"] for s in segments} == {"Speaker 1", "Speaker 2"}
    assert segments[0]["speaker"] == "Speaker 1"
    # each segment lies within a true turn of the voice its name maps to
    for s in segments:
        mid = (s["start"] + s["end"]) / 2
        voice = next((t.voice for t in truth if t.start_s - 0.5 <= mid <= t.end_s + 0.5), None)
        assert voice is not None and s["speaker"] == f"Speaker {voice + 1}", (s, truth)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    srt = httpx.get(f"{server.url}/api/jobs/{job['id']}/result?format=srt", headers=headers).text
    vtt = httpx.get(f"{server.url}/api/jobs/{job['id']}/result?format=vtt", headers=headers).text
    assert "Speaker 1: " in srt and "Speaker 2: " in srt
    assert "<v Speaker 1>" in vtt and "<v Speaker 2>" in vtt
    with open(path, "rb") as f:
        v = httpx.post(server.url + "/v1/audio/transcriptions", headers={"Authorization": f"Bearer {TOKEN}"},
                       files={"file": f}, data={"response_format": "verbose_json", "speakers": "2"},
                       timeout=180)
    assert v.status_code == 200, v.text
    assert {s["speaker"] for s in v.json()["segments"]} == {"Speaker 1", "Speaker 2"}


def test_the_demo_speaker_model_loads_and_labels(server, call_wav):
    r = _submit(server, call_wav[0], diarize="true", max_speakers="3")
    assert r.status_code == 200, r.text
    names = {s["speaker"] for s in r.json()["result"]["segments"]}
    assert names and names <= {"Speaker 1", "Speaker 2", "Speaker 3"}


def test_without_speakers_a_mono_call_has_none(server, call_wav):
    r = _submit(server, call_wav[0])
    assert r.status_code == 200 and all(s.get("speaker") is None for s in r.json()["result"]["segments"])


def test_the_cli_takes_speakers_and_refuses_bad_counts(tmp_path, capsys):
    from pipeline.cli import parse_args

    args = parse_args(["a.wav", "--output-dir", str(tmp_path), "--speakers", "2"])
    assert args.speakers == 2 and not args.diarize
    assert parse_args(["a.wav", "--output-dir", str(tmp_path), "--speakers", "0"]).speakers is None
    assert parse_args(["a.wav", "--output-dir", str(tmp_path), "--diarize"]).diarize
    for bad in ("50", "two", "-1"):
        with pytest.raises(SystemExit) as e:
            parse_args(["a.wav", "--output-dir", str(tmp_path), "--speakers", bad])
        assert e.value.code == 2
    assert "--speakers" in capsys.readouterr().err
