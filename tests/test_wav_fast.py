"""16 kHz 16-bit PCM WAV read in the server's process (pipeline/audio/wav.py): bit-identical to
the decoder process's samples, and every other or odd file left to the decoder process."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from pipeline.audio.decode import decode_audio
from pipeline.audio.decoder_pool import Decoder
from pipeline.audio.wav import read_pcm16_wav
from pipeline.domain.errors import AudioTooLong, EmptyAudio
from tests.media import convert, speech_wav

MAX_S = 3600.0


@pytest.fixture(scope="module")
def clips(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("wavfast")
    mono = speech_wav(d / "mono.wav", rate=16000)
    return {
        "mono": mono,
        "stereo": speech_wav(d / "stereo.wav", rate=16000, stereo=True),
        # ffmpeg writes WAVE_FORMAT_EXTENSIBLE for more than 2 channels, or when asked
        "extensible": convert(mono, d / "ext.wav", extra=["-c:a", "pcm_s16le", "-rf64", "never",
                                                          "-write_bext", "1"]),
        "rate_22k": convert(mono, d / "r22.wav", rate=22050, extra=["-c:a", "pcm_s16le"]),
        "s24": convert(mono, d / "s24.wav", extra=["-c:a", "pcm_s24le"]),
        "f32": convert(mono, d / "f32.wav", extra=["-c:a", "pcm_f32le"]),
        "three": convert(mono, d / "three.wav", channels=3, extra=["-c:a", "pcm_s16le"]),
    }


def reference(data: bytes, channel: int | None = None) -> np.ndarray:
    return decode_audio(data, max_seconds=MAX_S, channel=channel).samples


@pytest.mark.parametrize("name", ["mono", "stereo", "extensible"])
@pytest.mark.parametrize("channel", [None, 0, 1])
def test_bit_identical_to_the_decoder(clips, name, channel):
    data = clips[name].read_bytes()
    fast = read_pcm16_wav(data, max_seconds=MAX_S, channel=channel)
    assert fast is not None and fast.sample_rate == 16000
    ref = reference(data, channel)
    assert fast.samples.dtype == np.float32 and fast.samples.shape == ref.shape
    assert np.array_equal(fast.samples, ref)  # bit for bit, not within a tolerance
    assert fast.channels == (2 if name == "stereo" else 1)


@pytest.mark.parametrize("name", ["rate_22k", "s24", "f32", "three"])
def test_other_formats_go_to_the_decoder(clips, name):
    assert read_pcm16_wav(clips[name].read_bytes(), max_seconds=MAX_S) is None


def _wav(pcm: bytes, *, channels=1, rate=16000, bits=16, extra_chunks=b"", data_size=None) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, channels, rate, rate * channels * bits // 8,
                      channels * bits // 8, bits)
    size = len(pcm) if data_size is None else data_size
    body = (b"WAVE" + extra_chunks + b"fmt " + struct.pack("<I", len(fmt)) + fmt
            + b"data" + struct.pack("<I", size) + pcm)
    return b"RIFF" + struct.pack("<I", len(body)) + body


def test_chunks_before_fmt_are_walked():
    pcm = (np.arange(16000, dtype=np.int16) - 8000).tobytes()
    data = _wav(pcm, extra_chunks=b"LIST" + struct.pack("<I", 4) + b"abcd")
    fast = read_pcm16_wav(data, max_seconds=MAX_S)
    assert fast is not None and np.array_equal(fast.samples, reference(data))


def test_an_odd_sized_chunk_is_left_to_the_decoder():
    """FFmpeg refuses this one (its probe); the fast path must not accept what it refuses."""
    odd = b"LIST" + struct.pack("<I", 3) + b"abc" + b"\x00"  # odd size, one pad byte
    assert read_pcm16_wav(_wav(np.zeros(16000, np.int16).tobytes(), extra_chunks=odd),
                          max_seconds=MAX_S) is None


def test_truncated_and_streamed_data_sizes_read_what_is_there():
    pcm = np.full(16000, 1000, dtype=np.int16).tobytes()
    for size in (10 * len(pcm), 0xFFFFFFFF):
        data = _wav(pcm, data_size=size)
        fast = read_pcm16_wav(data, max_seconds=MAX_S)
        assert fast is not None and fast.samples.size == 16000
        assert np.array_equal(fast.samples, reference(data))


@pytest.mark.parametrize("data", [
    b"", b"RIFF", b"RIFF\x00\x00\x00\x00WAVE",  # no chunks
    b"RIFF\x00\x00\x00\x00WAVEdata\x04\x00\x00\x00\x00\x00\x00\x00",  # data before fmt
    b"RIFF\x00\x00\x00\x00WAVEfmt \xff\xff\xff\x7f",  # a fmt chunk larger than the file
    b"ID3\x04" + bytes(100),
])
def test_malformed_or_foreign_bytes_go_to_the_decoder(data):
    assert read_pcm16_wav(data, max_seconds=MAX_S) is None


def test_many_chunks_stop_the_walk():
    junk = (b"junk" + struct.pack("<I", 0)) * 100_000  # 800 KB of empty chunks
    assert read_pcm16_wav(_wav(np.zeros(16000, np.int16).tobytes(), extra_chunks=junk),
                          max_seconds=MAX_S) is None


def test_caps_and_errors_stay_the_decoders():
    """Too long, too short: the fast path steps aside and the decoder process answers with its
    usual errors (the same messages as before the fast path existed)."""
    decoder = Decoder(1)
    try:
        long = _wav(np.zeros(16000 * 3, np.int16).tobytes())
        assert read_pcm16_wav(long, max_seconds=2.0) is None
        with pytest.raises(AudioTooLong):
            decoder(long, max_seconds=2.0)
        short = _wav(np.zeros(100, np.int16).tobytes())
        assert read_pcm16_wav(short, max_seconds=MAX_S) is None
        with pytest.raises(EmptyAudio):
            decoder(short, max_seconds=MAX_S)
        ok = _wav(np.ones(16000, np.int16).tobytes())
        assert np.array_equal(decoder(ok, max_seconds=MAX_S).samples,
                              Decoder(1, fast_wav=False)(ok, max_seconds=MAX_S).samples)
    finally:
        decoder.close()
