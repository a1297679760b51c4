"""pipeline.audio.decode on real media: formats, rates, layouts, hostile uploads, caps, resampling.

Run alone with ``python -m pytest -q -p tests.fixtures_media tests/test_audio.py``.
"""

from __future__ import annotations

import io
import logging
import math
import struct
import time
import tracemalloc
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import torch

from pipeline.audio import decode as audio
from pipeline.audio.decode import (
    COMMON_RATES,
    DecodedAudio,
    Resampler,
    decode_audio,
    decode_audio_parts,
    load_audio_16k,
    output_budget,
)
from pipeline.domain.errors import (
    AudioDecodeError,
    AudioTooLong,
    EmptyAudio,
    NoAudioStream,
    UploadTooLarge,
)
from pipeline.domain.tags import SAMPLE_RATE_HZ
from tests.fixtures_media import ClipFactory, source_speech
from tests.media import (
    FORMATS,
    _ffmpeg,
    convert,
    long_opus,
    make_video_with_audio,
    make_video_without_audio,
    silence_flac,
    wav_duration,
    write_pcm_wav,
)

RATES = (8000, 22050, 44100, 48000)  # Hz
CHANNELS = (1, 2)
DURATION_TOLERANCE = 0.050  # s, decoded vs source duration
VIDEO_DURATION_TOLERANCE = 0.150  # s, muxing with a 10 fps video may trim the audio tail
LENGTH_TOLERANCE = 0.01  # fraction, resampled length vs ideal
LOSSLESS = ("wav", "wav_s24", "wav_f32", "flac")
PCM16_STEP = 1.0 / 32768  # one 16-bit quantisation step in [-1, 1]
OPUS_DECODE_RATE = 48000  # Hz, FFmpeg's Opus decoder always outputs 48 kHz


@pytest.fixture(scope="module")
def resampler() -> Resampler:
    return Resampler("cpu")


def pcm16_samples(path: Path) -> np.ndarray:
    """The int16 data of a 16-bit wav we made (frames x channels), read with Python's wave."""
    with wave.open(str(path), "rb") as wav:
        raw = wav.readframes(wav.getnframes())
        return np.frombuffer(raw, dtype="<i2").reshape(-1, wav.getnchannels())


def sine(seconds: float, rate: int, freq: float = 440.0, amplitude: float = 0.5) -> np.ndarray:
    """An int16 sine wave."""
    t = np.arange(round(seconds * rate)) / rate
    return np.round(amplitude * 32767 * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def wav_with_data_size(path: Path, seconds: float, rate: int, claimed_bytes: int) -> Path:
    """A mono 16-bit wav holding ``seconds`` of audio whose header claims ``claimed_bytes``."""
    write_pcm_wav(path, sine(seconds, rate), rate)
    data = bytearray(path.read_bytes())
    data_at = data.index(b"data") + 4
    data[data_at : data_at + 4] = struct.pack("<I", claimed_bytes)
    data[4:8] = struct.pack("<I", min(claimed_bytes + 36, 0xFFFFFFFF))
    path.write_bytes(bytes(data))
    return path


def wav_header(rate: int, claimed_bytes: int = 0xFFFFFFFF) -> bytes:
    """A canonical 44-byte mono 16-bit wav header."""
    fmt = struct.pack("<HHIIHH", 1, 1, rate, rate * 2, 2, 16)
    return (
        b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVE"
        + b"fmt " + struct.pack("<I", len(fmt)) + fmt
        + b"data" + struct.pack("<I", claimed_bytes)
    )  # fmt: skip


class EndlessWav(io.RawIOBase):
    """A non-seekable stream: a wav header, then silence forever. Counts the bytes handed out."""

    def __init__(self, rate: int):
        self.header = wav_header(rate)
        self.served = 0  # bytes

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:
        n = len(buffer)
        head = self.header[self.served : self.served + n]
        buffer[: len(head)] = head
        buffer[len(head) : n] = bytes(n - len(head))
        self.served += n
        return n


# ---------------------------------------------------------------------------------------------
# Formats, rates, layouts
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("channels", CHANNELS, ids=["mono", "stereo"])
@pytest.mark.parametrize("rate", RATES)
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_format_decodes_and_resamples(
    fmt: str,
    rate: int,
    channels: int,
    clip_factory: ClipFactory,
    media_dir: Path,
    resampler: Resampler,
) -> None:
    """Every format x rate x layout: mono float32, source duration, right 16 kHz length.

    Opus is encoded at the nearest rate libopus supports (8/12/16/24/48 kHz) and decodes at
    48 kHz, as Opus always does in FFmpeg.
    """
    clip = clip_factory(fmt, rate, channels)
    source_seconds = wav_duration(source_speech(media_dir, rate, channels))

    decoded = decode_audio(clip)

    assert decoded.samples.dtype == np.float32 and decoded.samples.ndim == 1
    assert decoded.sample_rate == (OPUS_DECODE_RATE if "libopus" in FORMATS[fmt] else rate)
    assert float(np.abs(decoded.samples).max()) <= 1.0
    assert float(np.abs(decoded.samples).max()) > 0.05  # real speech, not silence
    assert abs(decoded.seconds - source_seconds) <= DURATION_TOLERANCE

    waveform = resampler(decoded)
    ideal = decoded.samples.size * SAMPLE_RATE_HZ / decoded.sample_rate
    assert waveform.dtype == torch.float32 and waveform.ndim == 1
    assert abs(waveform.numel() - ideal) <= LENGTH_TOLERANCE * ideal


@pytest.mark.parametrize("fmt", LOSSLESS)
def test_lossless_stereo_is_exact_channel_average(
    fmt: str, clip_factory: ClipFactory, media_dir: Path
) -> None:
    """Lossless formats decode to exactly (L + R) / 2 of the 16-bit source."""
    pcm = pcm16_samples(source_speech(media_dir, 22050, 2))
    expected = pcm.astype(np.float32).mean(axis=1) / 32768

    decoded = decode_audio(clip_factory(fmt, 22050, 2))

    np.testing.assert_array_equal(decoded.samples, expected)


def test_downmix_averages_distinct_channels_without_clipping(tmp_path: Path) -> None:
    """Different left/right signals average exactly; full scale stays full scale (no clip)."""
    rate = 16000
    left, right = sine(0.5, rate, 440, 0.9), sine(0.5, rate, 660, 0.3)
    left[:100] = right[:100] = -32768  # both at negative full scale
    path = write_pcm_wav(tmp_path / "lr.wav", np.stack([left, right], axis=1), rate)

    decoded = decode_audio(path)

    expected = (left.astype(np.float32) + right.astype(np.float32)) / 2 / 32768
    np.testing.assert_allclose(decoded.samples, expected, atol=PCM16_STEP / 2, rtol=0)
    assert decoded.samples[0] == -1.0


def test_six_channel_wav_averages_all_channels(tmp_path: Path) -> None:
    """A 5.1 layout downmixes to the plain average of its six channels."""
    rate = 16000
    channels = np.stack([sine(0.3, rate, 200 * (i + 1), 0.1 * (i + 1)) for i in range(6)], axis=1)
    path = write_pcm_wav(tmp_path / "six.wav", channels, rate)

    decoded = decode_audio(path)

    expected = channels.astype(np.float64).mean(axis=1) / 32768
    np.testing.assert_allclose(decoded.samples, expected, atol=1e-6, rtol=0)


def test_mid_stream_rate_change_resamples_to_first_rate(
    clip_factory: ClipFactory, media_dir: Path, tmp_path: Path
) -> None:
    """Two mp3 streams of different rates back to back decode at the first one's rate."""
    first, second = clip_factory("mp3", 44100, 1), clip_factory("mp3", 22050, 1)
    joined = tmp_path / "joined.mp3"
    joined.write_bytes(first.read_bytes() + second.read_bytes())

    decoded = decode_audio(joined)

    expected = wav_duration(source_speech(media_dir, 44100, 1)) * 2
    assert decoded.sample_rate == 44100
    assert abs(decoded.seconds - expected) <= 2 * VIDEO_DURATION_TOLERANCE


@pytest.mark.parametrize("suffix", ["mp4", "mov", "mkv"])
def test_video_audio_track(suffix: str, speech_clip: Path, media_dir: Path) -> None:
    video = make_video_with_audio(media_dir / f"video.{suffix}", speech_clip)

    decoded = decode_audio(video)

    assert abs(decoded.seconds - wav_duration(speech_clip)) <= VIDEO_DURATION_TOLERANCE


def test_video_without_audio_is_no_audio_stream(media_dir: Path) -> None:
    video = make_video_without_audio(media_dir / "silent.mp4")
    with pytest.raises(NoAudioStream, match="no audio track"):
        decode_audio(video)


# ---------------------------------------------------------------------------------------------
# Sources
# ---------------------------------------------------------------------------------------------


def test_bytes_and_file_object_sources_match_path(clip_factory: ClipFactory) -> None:
    clip = clip_factory("m4a", 44100, 2)
    from_path = decode_audio(clip)

    from_bytes = decode_audio(clip.read_bytes())
    with clip.open("rb") as fileobj:
        fileobj.read(100)  # a seekable file object is read from its start
        from_file = decode_audio(fileobj)
    from_pipe = decode_audio(io.BufferedReader(_NonSeekable(clip.read_bytes())), max_bytes=10**7)

    for other in (from_bytes, from_file, from_pipe):
        assert other.sample_rate == from_path.sample_rate
        np.testing.assert_array_equal(other.samples, from_path.samples)


class _NonSeekable(io.RawIOBase):
    """A pipe-like reader over bytes."""

    def __init__(self, data: bytes):
        self._data = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray) -> int:
        return self._data.readinto(buffer)


def test_load_audio_16k(clip_factory: ClipFactory, resampler: Resampler) -> None:
    clip = clip_factory("flac", 48000, 2)
    decoded = decode_audio(clip)

    waveform = load_audio_16k(clip, resampler=resampler)

    assert waveform.dtype == torch.float32 and waveform.device.type == "cpu"
    assert waveform.numel() == math.ceil(decoded.samples.size * SAMPLE_RATE_HZ / 48000)


# ---------------------------------------------------------------------------------------------
# Hostile and broken uploads
# ---------------------------------------------------------------------------------------------


def test_text_renamed_wav_is_decode_error(tmp_path: Path) -> None:
    fake = tmp_path / "notes.wav"
    fake.write_text("this is not audio, just a text file renamed to .wav\n" * 20)
    with pytest.raises(AudioDecodeError, match="not a decodable audio"):
        decode_audio(fake)


def test_random_bytes_are_decode_error() -> None:
    noise = np.random.default_rng(0).integers(0, 256, 20_000, dtype=np.uint8).tobytes()
    with pytest.raises(AudioDecodeError):
        decode_audio(noise)


@pytest.mark.parametrize("kind", ["path", "bytes", "fileobj"])
def test_zero_length_upload(kind: str, tmp_path: Path) -> None:
    empty = tmp_path / "empty.wav"
    empty.write_bytes(b"")
    source = {"path": empty, "bytes": b"", "fileobj": io.BytesIO()}[kind]
    with pytest.raises(EmptyAudio, match=r"empty .*no audio samples"):
        decode_audio(source)


def test_header_only_and_too_short_wav_are_empty(tmp_path: Path) -> None:
    header_only = write_pcm_wav(tmp_path / "header.wav", np.zeros(0, np.int16), 16000)
    short = write_pcm_wav(tmp_path / "short.wav", sine(0.010, 16000), 16000)  # 10 ms
    for path in (header_only, short):
        with pytest.raises(EmptyAudio, match="no audio samples"):
            decode_audio(path)
    assert decode_audio(write_pcm_wav(tmp_path / "ok.wav", sine(0.025, 16000), 16000)).seconds


def test_truncated_mp3_without_audio_is_decode_error(clip_factory: ClipFactory) -> None:
    """The first 300 bytes of an mp3 hold no decodable frame."""
    mp3 = clip_factory("mp3", 44100, 1).read_bytes()
    with pytest.raises(AudioDecodeError):
        decode_audio(mp3[:300])


@pytest.fixture
def playlists(speech_clip: Path, tmp_path: Path) -> dict[str, Path]:
    """An m3u8 playlist and ffconcat lists that point to a real local wav (absolute, relative)."""
    local = tmp_path / "target.wav"
    local.write_bytes(speech_clip.read_bytes())
    files = {
        "hls": "#EXTM3U\n#EXT-X-TARGETDURATION:10\n#EXTINF:3.0,\n{}\n#EXT-X-ENDLIST\n",
        "concat": "ffconcat version 1.0\nfile '{}'\n",
    }
    made = {}
    for name, template in files.items():
        for label, target in (("abs", str(local)), ("rel", local.name)):
            path = tmp_path / f"{name}_{label}.{'m3u8' if name == 'hls' else 'ffconcat'}"
            path.write_text(template.format(target))
            made[f"{name}_{label}"] = path
    return made


@pytest.mark.parametrize("which", ["hls_abs", "hls_rel", "concat_abs", "concat_rel"])
def test_playlists_are_refused(
    which: str, playlists: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(playlists[which].parent)  # a relative entry would resolve to the real wav
    with pytest.raises(AudioDecodeError, match=which.split("_")[0]):
        decode_audio(playlists[which])
    with pytest.raises(AudioDecodeError, match=which.split("_")[0]):
        decode_audio(playlists[which].read_bytes())


@pytest.mark.parametrize("which", ["hls_abs", "hls_rel", "concat_abs", "concat_rel"])
def test_playlists_refused_even_past_the_demuxer_allow_list(
    which: str, playlists: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defence in depth: with hls/concat wrongly allowed, nested opens still fail."""
    monkeypatch.chdir(playlists[which].parent)
    monkeypatch.setattr(audio, "ALLOWED_DEMUXERS", audio.ALLOWED_DEMUXERS | {"hls", "concat"})
    with pytest.raises(AudioDecodeError):
        decode_audio(playlists[which])


@pytest.mark.parametrize("name", ["hls,applehttp", "concat", "image2", "sdp", "lavfi", "data"])
def test_opened_container_outside_allow_list_is_refused(name: str) -> None:
    with pytest.raises(AudioDecodeError, match=name):
        audio._check_demuxer(name)


def test_allowed_container_names_pass() -> None:
    for name in ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm", "wav", "ogg", "mp3", "flac"):
        audio._check_demuxer(name)


# ---------------------------------------------------------------------------------------------
# Caps
# ---------------------------------------------------------------------------------------------


def test_max_bytes(speech_clip: Path) -> None:
    size = speech_clip.stat().st_size
    data = speech_clip.read_bytes()
    for source in (speech_clip, data, io.BytesIO(data), io.BufferedReader(_NonSeekable(data))):
        with pytest.raises(UploadTooLarge, match=f"{size - 1} bytes"):
            decode_audio(source, max_bytes=size - 1)
    assert decode_audio(speech_clip, max_bytes=size).seconds > 1


@pytest.fixture(scope="module")
def ten_second_clips(media_dir: Path) -> list[Path]:
    wav = write_pcm_wav(media_dir / "tone_10s.wav", sine(10.0, 16000), 16000)
    return [wav, convert(wav, media_dir / "tone_10s.mp3", extra=FORMATS["mp3"])]


def test_duration_cap(ten_second_clips: list[Path]) -> None:
    for clip in ten_second_clips:
        with pytest.raises(AudioTooLong, match="2 s limit"):
            decode_audio(clip, max_seconds=2)
        assert decode_audio(clip, max_seconds=10.5).seconds == pytest.approx(10.0, abs=0.05)


def test_wav_header_claiming_tiny_size_stays_within_cap(tmp_path: Path) -> None:
    """The header says 0.1 s, the file holds 5 s: the result never exceeds the cap."""
    path = wav_with_data_size(tmp_path / "tiny.wav", 5.0, 16000, claimed_bytes=3200)
    try:
        decoded = decode_audio(path, max_seconds=2)
    except AudioTooLong:
        return
    assert decoded.seconds <= 2


def test_wav_header_claiming_huge_size_is_capped(tmp_path: Path) -> None:
    path = wav_with_data_size(tmp_path / "huge.wav", 5.0, 16000, claimed_bytes=0xFFFFFFF0)
    with pytest.raises(AudioTooLong):
        decode_audio(path, max_seconds=2)
    assert decode_audio(path, max_seconds=6).seconds == pytest.approx(5.0, abs=0.01)


def test_endless_stream_is_cut_at_the_cap_with_bounded_memory() -> None:
    """An endless wav stream stops soon after the cap; memory stays near the cap's size."""
    rate, cap = 16000, 2.0
    stream = EndlessWav(rate)
    tracemalloc.start()
    try:
        with pytest.raises(AudioTooLong):
            decode_audio(io.BufferedReader(stream), max_seconds=cap)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    cap_bytes = int(cap * rate * 2)  # s16 input
    assert stream.served <= cap_bytes + 1_000_000
    assert peak <= 4 * cap * rate * 4 + 1_000_000  # a few float32 copies of the cap, plus slack


def test_invalid_max_seconds(speech_clip: Path) -> None:
    with pytest.raises(ValueError):
        decode_audio(speech_clip, max_seconds=0)


# ---------------------------------------------------------------------------------------------
# Resampler
# ---------------------------------------------------------------------------------------------


def test_resampler_caches_one_transform_per_rate() -> None:
    resampler = Resampler()
    first = resampler.transform(44100)
    assert resampler.transform(44100) is first
    assert resampler.transform(22050) is not first

    with ThreadPoolExecutor(8) as pool:
        built = list(pool.map(resampler.transform, [8000] * 32))
    assert all(transform is built[0] for transform in built)

    audio_44k = DecodedAudio(np.zeros(44100, np.float32), 44100)
    assert resampler(audio_44k).numel() == SAMPLE_RATE_HZ
    assert resampler.transform(44100) is first


def test_resampler_passes_16k_through() -> None:
    resampler = Resampler(torch.device("cpu"))
    samples = np.random.default_rng(1).uniform(-1, 1, 1600).astype(np.float32)

    out = resampler(DecodedAudio(samples, SAMPLE_RATE_HZ))

    assert out.dtype == torch.float32 and out.device.type == "cpu"
    np.testing.assert_array_equal(out.numpy(), samples)
    assert resampler._transforms == {}


def test_resampler_preserves_a_tone() -> None:
    """A 440 Hz tone at 44.1 kHz is still a 440 Hz tone at 16 kHz."""
    tone = sine(1.0, 44100).astype(np.float32) / 32768
    out = Resampler()(DecodedAudio(tone, 44100)).numpy()
    spectrum = np.abs(np.fft.rfft(out))
    assert np.argmax(spectrum) * SAMPLE_RATE_HZ / out.size == pytest.approx(440, abs=2)


@pytest.mark.parametrize("fmt", ["mp3", "flac"])
def test_truncated_file_decodes_what_exists_and_warns(
    fmt: str, clip_factory: ClipFactory, caplog: pytest.LogCaptureFixture
) -> None:
    data = clip_factory(fmt, 44100, 1).read_bytes()
    full = decode_audio(data).seconds
    with caplog.at_level(logging.WARNING, logger="sensevoice.audio"):
        half = decode_audio(data[: len(data) // 2])
    assert 0.2 < half.seconds < full - 0.5
    assert any(record.name == "sensevoice.audio" for record in caplog.records)


# ---------------------------------------------------------------------------------------------
# Hostile rates and durations: a budget independent of the declared rate
# ---------------------------------------------------------------------------------------------

MIB = 1024 * 1024


def traced_peak(call):
    """``call()`` and the peak of Python/numpy allocations while it ran (bytes)."""
    tracemalloc.start()
    try:
        result = call()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def snr_db(reference: np.ndarray, other: np.ndarray) -> float:
    n = min(reference.size, other.size)
    error = reference[:n] - other[:n]
    return float(10 * np.log10(np.sum(reference[:n] ** 2) / np.sum(error**2)))


def test_long_48k_audio_comes_back_at_16k_within_the_budget(tmp_path: Path) -> None:
    """30 min of silence declared at 48 kHz (a 26 KB FLAC): 16 kHz samples, allocated once."""
    flac = silence_flac(tmp_path / "silence_30m_48k.flac", 1800, 48000)
    assert flac.stat().st_size < 40_000

    decoded, peak = traced_peak(lambda: decode_audio(flac))

    assert decoded.sample_rate == SAMPLE_RATE_HZ and decoded.samples.size == 1800 * SAMPLE_RATE_HZ
    assert decoded.samples.size <= output_budget(audio.DEFAULT_MAX_SECONDS)
    assert peak <= decoded.samples.nbytes + 2 * MIB  # at 48 kHz it was 3x that, doubling


def test_a_header_that_lies_short_is_still_held_to_the_budget(tmp_path: Path) -> None:
    """A FLAC declaring 10 s that holds 30 min: kept at 48 kHz while short, converted to 16 kHz
    once it outgrows that, refused at the cap; memory follows the budget, not the rate."""
    flac = silence_flac(tmp_path / "lies.flac", 1800, 48000, declared_seconds=10)

    tracemalloc.start()
    try:
        with pytest.raises(AudioTooLong, match="600 s limit"):
            decode_audio(flac, max_seconds=600)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    budget_bytes = 4 * output_budget(600)  # 38.4 MB
    assert peak <= 2 * budget_bytes + 2 * MIB  # the 48 kHz part, then its 16 kHz copy

    decoded = decode_audio(flac, max_seconds=3600)
    assert decoded.sample_rate == SAMPLE_RATE_HZ
    assert abs(decoded.samples.size - 1800 * SAMPLE_RATE_HZ) <= 2


def test_converting_while_decoding_matches_device_resampling(clip_factory: ClipFactory) -> None:
    """FFmpeg's resampler in the decoder (long audio) and torchaudio's on the device (short
    audio) agree on speech: same length, aligned, 38 dB apart (they differ near 8 kHz); and
    switching mid-way gives exactly what converting from the start gives."""
    clip = clip_factory("wav", 44100, 1)
    native = decode_audio(clip)
    on_device = Resampler()(native).numpy()

    from_start = decode_audio_parts(clip, native_seconds=0).joined()
    switched = decode_audio_parts(clip, native_seconds=1.0).joined()

    assert native.sample_rate == 44100 and from_start.sample_rate == SAMPLE_RATE_HZ
    assert abs(from_start.samples.size - on_device.size) <= 1
    assert snr_db(on_device, from_start.samples) > 30
    np.testing.assert_array_equal(switched.samples, from_start.samples)


def test_an_odd_rate_is_converted_while_decoding_and_never_gets_a_kernel(tmp_path: Path) -> None:
    """1 s at 8,001 Hz cost ~20 CPU-s and 4 GB in a torchaudio kernel kept for good: FFmpeg's
    resampler brings it to 16 kHz in milliseconds and the device resampler refuses the rate."""
    wav = write_pcm_wav(tmp_path / "odd.wav", sine(1.0, 8001), 8001)
    resampler = Resampler()

    t0 = time.perf_counter()
    decoded = decode_audio(wav)
    waveform = resampler(decoded)
    elapsed = time.perf_counter() - t0

    assert elapsed < 1.0
    assert decoded.sample_rate == SAMPLE_RATE_HZ and abs(decoded.samples.size - SAMPLE_RATE_HZ) <= 2
    spectrum = np.abs(np.fft.rfft(waveform.numpy()))
    assert np.argmax(spectrum) * SAMPLE_RATE_HZ / waveform.numel() == pytest.approx(440, abs=2)
    assert resampler._transforms == {}
    with pytest.raises(ValueError, match="8001 Hz"):
        resampler.transform(8001)
    with pytest.raises(ValueError, match="8001 Hz"):
        resampler(DecodedAudio(np.zeros(8001, np.float32), 8001))
    assert resampler._transforms == {}


def test_the_resampler_cache_holds_only_the_common_rates() -> None:
    resampler = Resampler()
    for rate in sorted(COMMON_RATES):
        resampler.transform(rate)
    for rate in (8001, 12000, 44101, 64000, 192000):
        with pytest.raises(ValueError):
            resampler.transform(rate)
    assert set(resampler._transforms) == COMMON_RATES and len(COMMON_RATES) == 9


@pytest.fixture(scope="module")
def declared_bombs(media_dir: Path) -> dict[str, Path]:
    """Files whose headers state they are long: 3.89 h of FLAC, 2 min of Ogg/Opus."""
    return {
        "flac": silence_flac(media_dir / "bomb_3h53_48k.flac", 14004, 48000),
        "opus": long_opus(media_dir / "bomb_2min.opus", 120),
    }


@pytest.mark.parametrize("kind,max_seconds", [("flac", 3600), ("opus", 30)])
def test_a_declared_duration_over_the_cap_is_refused_before_decoding(
    kind: str, max_seconds: float, declared_bombs: dict[str, Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 5 h opus bomb (6.7 MB) took 41 s and 3.5 GB to reach the sample cap: a header that
    states more than the cap refuses the file before one packet is decoded."""
    data = declared_bombs[kind].read_bytes()

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoding started")

    with monkeypatch.context() as patch:
        patch.setattr(audio, "_frames", no_decoding)
        t0 = time.perf_counter()
        with pytest.raises(AudioTooLong, match=f"{max_seconds} s limit .*declares"):
            decode_audio(data, max_seconds=max_seconds)
        assert time.perf_counter() - t0 < 0.5
    if kind == "opus":  # under the cap it decodes (3.89 h of FLAC would take ~10 s here)
        assert decode_audio(data, max_seconds=150).seconds == pytest.approx(120, abs=0.1)


def test_bit_rate_estimates_never_refuse_but_stated_mp3_durations_do(tmp_path: Path) -> None:
    """An mp3 without a Xing header gets a duration estimated from its first frames (silence, a
    low bit rate: 38 s for 20 s of audio); only a stated one (Xing/Info) may refuse the file."""
    mix = ["-f", "lavfi", "-i", "anullsrc=r=44100:cl=mono:d=10", "-f", "lavfi", "-i",
           "sine=f=440:r=44100:d=10", "-filter_complex", "[0][1]concat=n=2:v=0:a=1",
           "-c:a", "libmp3lame", "-q:a", "2"]
    estimated = _ffmpeg([*mix, "-write_xing", "0"], tmp_path / "no_xing.mp3")
    stated = _ffmpeg(mix, tmp_path / "xing.mp3")
    with audio._open_source(estimated, None) as fileobj:
        container = audio._open_container(fileobj)
        declared = audio._declared_seconds(container, audio._audio_stream(container))
        container.close()
    assert declared > 30  # the estimate overshoots

    assert decode_audio(estimated, max_seconds=25).seconds == pytest.approx(20, abs=0.2)
    with pytest.raises(AudioTooLong, match="declares 20"):
        decode_audio(stated, max_seconds=15)
    assert decode_audio(stated, max_seconds=25).seconds == pytest.approx(20, abs=0.2)
