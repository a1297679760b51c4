"""A mono 16 kHz 16-bit PCM WAV upload's bytes are its audio: the embedded store's job reads its
samples from the spooled upload (mapped, ``SpooledPcm16``) instead of a float copy made at the
submit -- the samples the decoder would return, value for value, and so the same tokens."""

from __future__ import annotations

import io
import wave

import numpy as np
import pytest
import torch

from pipeline.audio.decode import decode_audio
from pipeline.audio.wav import Pcm16Layout, pcm16_mono_layout, read_pcm16_wav
from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.model.engine import as_float_wave
from pipeline.serving.broker_sqlite import JobStore, SpooledPcm16
from tests.conftest import make_settings

pytest_plugins = ["tests.fixtures_media"]


def wav(samples: np.ndarray, rate: int = 16000, channels: int = 1) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(channels)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.astype("<i2").tobytes())
    return buf.getvalue()


def test_the_layout_names_the_samples_the_fast_reader_scales():
    pcm = np.random.default_rng(0).integers(-32768, 32767, 16000, dtype=np.int16)
    data = wav(pcm)
    layout = pcm16_mono_layout(data, max_seconds=60)
    assert layout == Pcm16Layout(44, 16000) and layout.seconds == 1.0
    samples = np.frombuffer(data, dtype="<i2", count=layout.frames, offset=layout.offset)
    assert np.array_equal(samples, pcm)
    decoded = read_pcm16_wav(data, max_seconds=60).samples
    assert np.array_equal(samples.astype(np.float32) * np.float32(2.0 ** -15), decoded)
    # what is not a mono 16 kHz 16-bit WAV within the limits is decoded instead
    assert pcm16_mono_layout(wav(np.repeat(pcm, 2), channels=2), max_seconds=60) is None
    assert pcm16_mono_layout(wav(pcm, rate=8000), max_seconds=60) is None
    assert pcm16_mono_layout(data, max_seconds=0.5) is None  # over the duration cap
    assert pcm16_mono_layout(wav(pcm[:100]), max_seconds=60) is None  # shorter than one window
    assert pcm16_mono_layout(b"RIFF\0\0\0\0WAVEjunk", max_seconds=60) is None


def test_spooled_samples_are_mapped_and_outlive_the_file(tmp_path):
    store = JobStore(tmp_path)
    pcm = np.arange(-8000, 8000, dtype=np.int16)
    data = wav(pcm)
    store.spool("j1", data)
    audio = store.spooled_audio("j1", pcm16_mono_layout(data, max_seconds=60))
    assert audio == SpooledPcm16(store.spool_path("j1"), 44, 16000)
    first = audio.load()
    store.delete_spool("j1")  # a mapping keeps its pages
    assert first.dtype == torch.int16 and torch.equal(first, torch.from_numpy(pcm))
    with pytest.raises(FileNotFoundError):
        audio.load()
    store.spool("j2", data[:1000])  # never happens (spooled whole, fsync'd): refused, no SIGBUS
    with pytest.raises(ValueError):
        SpooledPcm16(store.spool_path("j2"), 44, 16000).load()


def test_a_wav_submit_queues_its_spooled_samples_and_others_their_decoded_wave(demo_dir, tmp_path, clip_factory):
    """Through the intake of an embedded runtime: the WAV job's item maps its spool file (the
    samples the decoder gives, exactly); a FLAC of the same samples is decoded as before."""
    from pipeline.serving.runtime import build_runtime

    runtime = build_runtime(make_settings(demo_dir, tmp_path / "d"))
    try:
        path = clip_factory("wav", 16000, 1)
        data = path.read_bytes()
        job = runtime.intake.submit(data, filename="a.wav", options=TranscribeOptions("en"), lane=Lane.BULK)
        flac = runtime.intake.submit(clip_factory("flac", 16000, 1).read_bytes(), filename="a.flac",
                                     options=TranscribeOptions("en"), lane=Lane.BULK)
        items = {i.job_id: i for i in runtime.broker.claim("t", 8)}
        spooled, decoded = items[job.id].audio, items[flac.id].audio
        assert isinstance(spooled, SpooledPcm16) and spooled.path == runtime.broker.spool_path(job.id)
        want = torch.from_numpy(decode_audio(data).samples)
        assert torch.equal(as_float_wave(spooled.load()), want)
        assert items[job.id].n_samples == want.numel() and job.audio_seconds == want.numel() / 16000
        assert isinstance(decoded, torch.Tensor) and torch.equal(decoded, want)  # lossless: the same samples
    finally:
        runtime.stop()
