"""Real test media, made at test time with espeak-ng and ffmpeg and cached by file name.

Every maker returns early when its output exists, so a session directory holds each clip once.
Outputs are written under a temporary name and renamed, so a half-written file is never reused.
"""

from __future__ import annotations

import os
import subprocess
import wave
from collections.abc import Sequence
from pathlib import Path

import numpy as np

SPEECH_TEXT = "hello world, this is a test of speech recognition"
VIDEO_SIZE = "160x120"  # pixels, small to keep encoding fast
VIDEO_FPS = 10  # frames per second
SILENT_VIDEO_SECONDS = 1.0  # s

# ffmpeg codec arguments per test format. The output suffix is SUFFIXES.get(fmt, fmt).
FORMATS: dict[str, list[str]] = {
    "wav": ["-c:a", "pcm_s16le"],
    "wav_s24": ["-c:a", "pcm_s24le"],
    "wav_f32": ["-c:a", "pcm_f32le"],
    "flac": ["-c:a", "flac"],
    "mp3": ["-c:a", "libmp3lame", "-q:a", "4"],
    "ogg": ["-c:a", "libvorbis", "-q:a", "3"],  # ogg/vorbis
    "opus": ["-c:a", "libopus", "-b:a", "32k"],  # ogg/opus
    "m4a": ["-c:a", "aac", "-b:a", "64k"],  # mp4/aac
    "webm": ["-c:a", "libopus", "-b:a", "32k"],  # webm/opus
}
SUFFIXES = {"wav_s24": "wav", "wav_f32": "wav"}

# libopus encodes only at these rates (Hz); other rates are encoded at the nearest one.
OPUS_RATES = (8000, 12000, 16000, 24000, 48000)


def suffix_for(fmt: str) -> str:
    """The file suffix (without the dot) for a key of :data:`FORMATS`."""
    return SUFFIXES.get(fmt, fmt)


def encode_rate(fmt: str, rate: int) -> int:
    """The rate (Hz) ``fmt`` is encoded at for a requested ``rate`` (opus: nearest valid)."""
    if "libopus" in FORMATS[fmt]:
        return min(OPUS_RATES, key=lambda valid: abs(valid - rate))
    return rate


def _run(cmd: Sequence[str]) -> None:
    """Run a tool; fail with its stderr."""
    done = subprocess.run(list(cmd), capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({done.returncode}): {done.stderr.strip()}")


def _tmp_name(dst: Path) -> Path:
    """A sibling of ``dst`` with the same suffix (ffmpeg picks the muxer by suffix)."""
    return dst.with_name(f".{dst.stem}.{os.getpid()}.tmp{dst.suffix}")


def _ffmpeg(args: Sequence[str], dst: Path) -> Path:
    """``ffmpeg -y -loglevel error ARGS tmp`` then rename the temporary file to ``dst``."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = _tmp_name(dst)
    _run(["ffmpeg", "-y", "-nostdin", "-loglevel", "error", *args, str(tmp)])
    tmp.replace(dst)
    return dst


def speech_wav(
    path: Path, text: str = SPEECH_TEXT, rate: int = 16000, stereo: bool = False
) -> Path:
    """Synthesised speech as 16-bit PCM wav at ``rate`` Hz, mono or stereo (cached)."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    raw = path.with_name(f".{path.stem}.espeak.wav")
    _run(["espeak-ng", "-w", str(raw), text])
    try:
        return convert(
            raw, path, rate=rate, channels=2 if stereo else 1, extra=["-c:a", "pcm_s16le"]
        )
    finally:
        raw.unlink(missing_ok=True)


def convert(
    src: Path,
    dst: Path,
    *,
    rate: int | None = None,
    channels: int | None = None,
    extra: Sequence[str] = (),
) -> Path:
    """Re-encode ``src`` to ``dst`` (format from the suffix) with ffmpeg (cached)."""
    if dst.exists():
        return dst
    args = ["-i", str(src), "-vn", "-map_metadata", "-1"]
    if rate is not None:
        args += ["-ar", str(rate)]
    if channels is not None:
        args += ["-ac", str(channels)]
    return _ffmpeg([*args, *extra], dst)


def _video_codecs(dst: Path) -> list[str]:
    """Video and audio codec arguments for a container chosen by suffix."""
    if dst.suffix == ".mkv":
        return ["-c:v", "libx264", "-preset", "ultrafast", "-c:a", "libopus", "-b:a", "32k"]
    return ["-c:v", "libx264", "-preset", "ultrafast", "-pix_fmt", "yuv420p", "-c:a", "aac"]


def make_video_with_audio(dst: Path, audio: Path) -> Path:
    """A small test-pattern video (mp4/mov/mkv by suffix) carrying ``audio`` (cached)."""
    if dst.exists():
        return dst
    pattern = f"testsrc=size={VIDEO_SIZE}:rate={VIDEO_FPS}"
    args = ["-f", "lavfi", "-i", pattern, "-i", str(audio), "-map", "0:v", "-map", "1:a"]
    return _ffmpeg([*args, "-shortest", *_video_codecs(dst)], dst)


def make_video_without_audio(dst: Path) -> Path:
    """A small test-pattern video with no audio track (cached)."""
    if dst.exists():
        return dst
    pattern = f"testsrc=size={VIDEO_SIZE}:rate={VIDEO_FPS}:duration={SILENT_VIDEO_SECONDS}"
    return _ffmpeg(["-f", "lavfi", "-i", pattern, "-an", "-c:v", "libx264", "-preset",
                    "ultrafast", "-pix_fmt", "yuv420p"], dst)  # fmt: skip


def make_clip(media_dir: Path, source: Path, fmt: str, rate: int, channels: int) -> Path:
    """``source`` encoded as ``fmt`` at ``rate`` Hz (opus: :func:`encode_rate`) (cached)."""
    dst = media_dir / f"clip_{fmt}_{rate}_{channels}ch.{suffix_for(fmt)}"
    return convert(source, dst, rate=encode_rate(fmt, rate), channels=channels, extra=FORMATS[fmt])


def write_pcm_wav(path: Path, samples: np.ndarray, rate: int) -> Path:
    """Write int16 ``samples`` (frames x channels, or 1-D) as a PCM wav with Python's wave."""
    data = np.asarray(samples, dtype=np.int16)
    channels = 1 if data.ndim == 1 else data.shape[1]
    with wave.open(str(path), "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(data.astype("<i2").tobytes())
    return path


def wav_duration(path: Path) -> float:
    """Duration in seconds of a PCM wav, from its header (trusted: we wrote it)."""
    with wave.open(str(path), "rb") as wav:
        return wav.getnframes() / wav.getframerate()


# ---------------------------------------------------------------------------------------------
# Hostile media: built byte by byte, in milliseconds, whatever their duration
# ---------------------------------------------------------------------------------------------

FLAC_BLOCK = 65535  # samples per frame, FLAC's largest: hours of silence in a few hundred KB


def _crc8(data: bytes) -> int:
    """FLAC frame-header CRC-8 (polynomial x^8 + x^2 + x + 1)."""
    crc = 0
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
    return crc


def _crc16_table() -> list[int]:
    table = []
    for n in range(256):
        crc = n << 8
        for _ in range(8):
            crc = ((crc << 1) ^ 0x8005) & 0xFFFF if crc & 0x8000 else (crc << 1) & 0xFFFF
        table.append(crc)
    return table


_CRC16 = _crc16_table()


def _crc16(data: bytes) -> int:
    """FLAC frame CRC-16 (polynomial x^16 + x^15 + x^2 + 1)."""
    crc = 0
    for byte in data:
        crc = ((crc << 8) & 0xFFFF) ^ _CRC16[(crc >> 8) ^ byte]
    return crc


def _utf8_number(n: int) -> bytes:
    """FLAC's UTF-8-like coding of a frame number (up to 31 bits)."""
    if n < 0x80:
        return bytes([n])
    for length, lead in ((2, 0xC0), (3, 0xE0), (4, 0xF0), (5, 0xF8), (6, 0xFC)):
        if n < 1 << (5 * length + 1):
            tail = [0x80 | (n >> (6 * i)) & 0x3F for i in range(length - 2, -1, -1)]
            return bytes([lead | n >> (6 * (length - 1))] + tail)
    raise ValueError(n)


def silence_flac(path: Path, seconds: float, rate: int, *, declared_seconds: float | None = None,
                 channels: int = 1) -> Path:
    """FLAC of ``seconds`` of digital silence at ``rate`` Hz (16-bit), written directly: constant
    subframes of :data:`FLAC_BLOCK` samples, ~15 bytes each (3.89 h at 48 kHz: ~150 KB, in well
    under a second). STREAMINFO declares ``declared_seconds`` (default: the truth; 0: unknown),
    so a header can lie. Not cached: cheap to make."""
    total = round(seconds * rate)
    declared = total if declared_seconds is None else round(declared_seconds * rate)
    info = (FLAC_BLOCK.to_bytes(2, "big") * 2 + bytes(6)
            + ((rate << 44) | ((channels - 1) << 41) | (15 << 36) | declared).to_bytes(8, "big")
            + bytes(16))  # fmt: skip
    out = bytearray(b"fLaC" + bytes([0x80]) + len(info).to_bytes(3, "big") + info)
    # block size code 0111 (16-bit size - 1 follows), rate from STREAMINFO; independent channels,
    # 16 bits per sample
    flags = bytes([0x70, ((channels - 1) << 4) | 0x08])
    subframes = bytes(3 * channels)  # per channel: CONSTANT subframe header, then the value 0
    frames = []
    for number, start in enumerate(range(0, total, FLAC_BLOCK)):
        size = min(FLAC_BLOCK, total - start)
        header = b"\xff\xf8" + flags + _utf8_number(number) + (size - 1).to_bytes(2, "big")
        header += bytes([_crc8(header)])
        frame = header + subframes
        frames.append(frame + _crc16(frame).to_bytes(2, "big"))
    out += b"".join(frames)
    path.write_bytes(bytes(out))
    return path


def long_opus(path: Path, seconds: float) -> Path:
    """Ogg/Opus of ``seconds`` of silence at 6 kb/s, the kind of bomb that declares hours in a few
    MB (ffmpeg: ~0.35 s per minute of audio, so keep it short in tests; cached)."""
    if path.exists():
        return path
    return _ffmpeg(["-f", "lavfi", "-i", "anullsrc=r=48000:cl=mono", "-t", f"{seconds:g}",
                    "-c:a", "libopus", "-b:a", "6k"], path)
