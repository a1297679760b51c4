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
