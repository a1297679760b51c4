"""Decode untrusted uploads in-process with PyAV; resample to 16 kHz with torchaudio.

Every upload is treated as hostile:

* the byte size is checked before decoding (``max_bytes``);
* paths are opened by Python, never handed to FFmpeg as URLs, so no FFmpeg protocol is reached;
* only local audio/video demuxers may run (``format_whitelist``, enforced by FFmpeg before a
  header is parsed, and checked again on the opened container); playlists and reference formats
  (hls, concat, sdp, image2, ...) are refused, and any nested open they might attempt is refused;
* a file whose headers declare more than ``max_seconds`` is refused before anything is decoded
  (a 6.7 MB opus file of 5 h of silence used to cost 41 s and 3.5 GB before the sample cap
  stopped it); the cap is enforced again while decoding by counting samples, for headers that lie;
* what decoding returns is bounded by a rate-independent budget, ``max_seconds`` at 16 kHz
  (:func:`output_budget`): the duration cap alone let a 160 KB FLAC declaring 48 kHz fill 2.7 GB.

Short audio at one of the :data:`COMMON_RATES` keeps its rate (the device resamples it with a
cached torchaudio kernel: the hot path, and the resampling funasr's references use). Anything
longer than :data:`NATIVE_MAX_SECONDS`, and any other rate, is converted to 16 kHz while it
decodes, with FFmpeg's resampler in bounded chunks (:class:`_MonoSink`), so the output never
exceeds the 16 kHz budget whatever rate the file declares, and :class:`Resampler` never builds a
kernel for an odd rate. :func:`load_audio_16k` decodes and resamples.
"""

from __future__ import annotations

import gc
import io
import logging
import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import BinaryIO

from typing import TYPE_CHECKING

import av
import av.error
import numpy as np

if TYPE_CHECKING:  # torch is imported where resampling happens: decoder processes never load it
    import torch
    import torchaudio

from pipeline.domain.errors import (
    AudioDecodeError,
    AudioTooLong,
    DecoderOutOfMemory,
    EmptyAudio,
    NoAudioStream,
    UploadTooLarge,
)
from pipeline.domain.tags import SAMPLE_RATE_HZ

logger = logging.getLogger("sensevoice.audio")

DEFAULT_MAX_SECONDS = 4 * 3600.0  # s, decoded-duration cap
MIN_AUDIO_SECONDS = 0.025  # s, shortest usable audio (400 samples at 16 kHz, one fbank window)
MAX_SKIPPED_PACKETS = 100  # packets the decoder may reject before the file counts as corrupt
TRUNCATION_SLACK_SECONDS = 0.5  # s, decoded shorter than announced by more than this: warn
SNIFF_BYTES = 64  # bytes read to name a refused text format in the error message

# Source rates the device resamples (torchaudio kernels, cached per rate: at most these nine). A
# kernel's size grows with rate / gcd(rate, 16000): for 8,001 Hz (gcd 1) it has 16,000 phases, and
# building and running it for 1 s of audio took ~20 CPU-s and 4 GB, kept for good in the cache.
# Every other rate is brought to 16 kHz by FFmpeg's resampler in the decoder (8,001 -> 16,000 Hz:
# 60 s of audio in 5 ms).
COMMON_RATES: frozenset[int] = frozenset(
    {8000, 11025, SAMPLE_RATE_HZ, 22050, 24000, 32000, 44100, 48000, 96000}
)

# Audio at a common rate up to this long keeps its rate (resampled on the device, like funasr's
# references); longer audio is converted to 16 kHz while decoding. Measured on 2 CPU cores: FFmpeg
# converts 48 -> 16 kHz at ~2,000x real time (5 min: 0.15 CPU-s in the decoder), against GPU
# work that is nearly free; but a 5 min clip at 96 kHz is already 115 MB of float32 (6x its 16 kHz
# size), and past the VAD threshold (30 s) recordings are split, not compared token for token.
NATIVE_MAX_SECONDS = 300.0  # s

# A header declaring more than max_seconds by this much refuses the file before decoding (encoder
# delay and padding make honest declarations overshoot by a few tens of ms).
DECLARED_SLACK_SECONDS = 1.0  # s

# Demuxers whose duration is, without a header that states it, FFmpeg's estimate from the first
# bit rate (or, for mpegts, from the first and last timestamps): a VBR mp3 without a Xing header
# that starts with silence declared 132.8 s for 60 s of audio. Those estimates never refuse a file
# (the sample cap still applies); an mp3 with a Xing/Info/VBRI header states its frame count.
ESTIMATED_DURATION_DEMUXERS: frozenset[str] = frozenset(
    {"mp3", "aac", "amr", "amrnb", "amrwb", "mpegts"}
)
MP3_HEADER_WINDOW = 4096  # bytes after an ID3v2 tag searched for a Xing/Info/VBRI header

# Local audio/video demuxers that may run. FFmpeg names a demuxer by a comma list of aliases
# ("mov,mp4,m4a,3gp,3g2,mj2", "matroska,webm"); one alias on this list admits it.
ALLOWED_DEMUXERS: frozenset[str] = frozenset(
    {
        "wav", "w64", "flac", "mp3", "ogg", "matroska", "webm", "mov", "mp4", "m4a",
        "aac", "aiff", "caf", "au", "amr", "amrnb", "amrwb", "wv", "ape", "tta",
        "asf", "avi", "mpegts",
    }
)  # fmt: skip

# The main input is a Python file object (custom I/O) and needs no FFmpeg protocol. Nested opens
# (what a playlist or concat list would do) get a whitelist that names no protocol at all.
PROTOCOL_WHITELIST = "none"

# Text reference formats, named in the refusal message (FFmpeg does not report the probed name).
_REFERENCE_SIGNATURES: tuple[tuple[bytes, str], ...] = (
    (b"#EXTM3U", "hls (m3u8 playlist)"),
    (b"ffconcat version", "concat (ffconcat list)"),
    (b"[playlist]", "pls playlist"),
    (b"v=0", "sdp (session description)"),
)

AudioSource = str | os.PathLike | bytes | bytearray | BinaryIO


@dataclass(frozen=True)
class DecodedAudio:
    """Mono audio at its source rate (a common rate, when short) or at 16 kHz."""

    samples: np.ndarray  # float32, mono, 1-D, in [-1, 1]
    sample_rate: int  # Hz
    channels: int = 1  # channels in the source (samples are their average, or one of them)

    @property
    def seconds(self) -> float:
        """Duration in seconds."""
        return self.samples.size / self.sample_rate


@dataclass(frozen=True)
class DecodedParts:
    """Decoded audio as the blocks it was written in: what a decoder process sends back, block by
    block (joining them first would double its peak memory). See :func:`decode_audio_parts`."""

    parts: tuple[np.ndarray, ...]  # float32, mono, 1-D each, in order
    sample_rate: int  # Hz
    channels: int = 1

    @property
    def size(self) -> int:
        """Samples in all parts."""
        return sum(part.size for part in self.parts)

    def joined(self) -> DecodedAudio:
        """One contiguous array (a view when there is one part)."""
        if len(self.parts) == 1:
            samples = self.parts[0]
        else:
            samples = np.concatenate(self.parts) if self.parts else np.empty(0, np.float32)
        return DecodedAudio(samples, self.sample_rate, self.channels)


def output_budget(max_seconds: float) -> int:
    """The most samples decoding may return for ``max_seconds``: that duration at 16 kHz,
    whatever rate the file declares (4 h: 230.4 M float32 samples, 921.6 MB)."""
    return int(max_seconds * SAMPLE_RATE_HZ)


class _NestedOpenRefused(Exception):
    """Raised by :func:`_refuse_nested_open` when a demuxer tries to open another file or URL."""


def _refuse_nested_open(url: str, flags: int, options: dict) -> BinaryIO:
    """PyAV ``io_open`` callback: no demuxer may open anything beyond the upload itself."""
    raise _NestedOpenRefused(url)


# ---------------------------------------------------------------------------------------------
# Source handling
# ---------------------------------------------------------------------------------------------


def _check_size(size: int, max_bytes: int | None) -> None:
    """Raise :class:`UploadTooLarge` above the cap and :class:`EmptyAudio` for 0 bytes."""
    if max_bytes is not None and size > max_bytes:
        raise UploadTooLarge(f"the upload is {size} bytes; the limit is {max_bytes} bytes")
    if size == 0:
        raise EmptyAudio("the upload is empty (0 bytes): no audio samples")


def _prepare_fileobj(fileobj: BinaryIO, max_bytes: int | None) -> BinaryIO:
    """Return a readable object positioned at the start of the data, after the size checks.

    A seekable object is read from its start. A non-seekable one is read into memory (at most
    ``max_bytes + 1`` bytes) when a byte cap is given, so the cap holds for pipes too.
    """
    seekable = getattr(fileobj, "seekable", None)
    if seekable is not None and seekable():
        size = fileobj.seek(0, io.SEEK_END)
        fileobj.seek(0)
        _check_size(size, max_bytes)
        return fileobj
    if max_bytes is None:
        return fileobj
    data = _read_at_most(fileobj, max_bytes + 1)
    _check_size(len(data), max_bytes)
    return io.BytesIO(data)


def read_upload(fileobj: BinaryIO, max_bytes: int) -> bytes:
    """All of an upload, reading at most one byte past the cap: UploadTooLarge beyond it."""
    data = _read_at_most(fileobj, max_bytes + 1)
    _check_size(len(data), max_bytes)
    return data


def _read_at_most(fileobj: BinaryIO, limit: int) -> bytes:
    """Read until EOF or ``limit`` bytes (a raw stream may return short reads). A body that comes
    in one read (a spooled upload) is returned as read: no buffer, no copies of it."""
    first = fileobj.read(limit)
    if not first or len(first) >= limit:
        return bytes(first)
    more = fileobj.read(limit - len(first))
    if not more:
        return bytes(first)
    buffer = bytearray(first)
    buffer += more
    while len(buffer) < limit:
        chunk = fileobj.read(limit - len(buffer))
        if not chunk:
            break
        buffer += chunk
    return bytes(buffer)


@contextmanager
def _open_source(source: AudioSource, max_bytes: int | None) -> Iterator[BinaryIO]:
    """Yield a binary file object for ``source``; files opened here are closed on exit."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        _check_size(len(source), max_bytes)
        yield io.BytesIO(source)
    elif isinstance(source, (str, os.PathLike)):
        # Opened by Python: a name such as "concat:a|b" or "http://..." never reaches FFmpeg.
        with open(source, "rb") as fileobj:
            _check_size(os.fstat(fileobj.fileno()).st_size, max_bytes)
            yield fileobj
    else:
        yield _prepare_fileobj(source, max_bytes)


def _sniff_reference_format(fileobj: BinaryIO) -> str | None:
    """Name a text reference format (playlist, concat list) from the first bytes, if one."""
    try:
        fileobj.seek(0)
        head = fileobj.read(SNIFF_BYTES).lstrip(b"\xef\xbb\xbf \t\r\n")
    except (OSError, ValueError):
        return None
    for signature, name in _REFERENCE_SIGNATURES:
        if head.startswith(signature):
            return name
    return None


def _mp3_states_duration(fileobj: BinaryIO) -> bool:
    """Whether an mp3 has a Xing, Info or VBRI header (a frame count) after its ID3v2 tag, so that
    FFmpeg's duration is stated rather than estimated from the first frame's bit rate.

    Reads at most ``10 + MP3_HEADER_WINDOW`` bytes and puts the file position back (the opened
    container reads through the same object and expects it where it left it).
    """
    try:
        position = fileobj.tell()
    except (OSError, ValueError, AttributeError):
        return False
    try:
        fileobj.seek(0)
        head = fileobj.read(10)
        start = 0
        if len(head) == 10 and head[:3] == b"ID3":
            size = (head[6] & 0x7F) << 21 | (head[7] & 0x7F) << 14 | (head[8] & 0x7F) << 7 | (
                head[9] & 0x7F)  # fmt: skip
            start = 10 + size + (10 if head[5] & 0x10 else 0)  # footer flag
        fileobj.seek(start)
        window = fileobj.read(MP3_HEADER_WINDOW)
        return any(tag in window for tag in (b"Xing", b"Info", b"VBRI"))
    except (OSError, ValueError):
        return False
    finally:
        try:
            fileobj.seek(position)
        except (OSError, ValueError):
            pass


# ---------------------------------------------------------------------------------------------
# Container
# ---------------------------------------------------------------------------------------------


def _open_container(fileobj: BinaryIO) -> av.container.InputContainer:
    """Open ``fileobj`` with the demuxer allow-list and no nested I/O.

    Raises :class:`AudioDecodeError` for anything FFmpeg cannot open or does not allow.
    """
    try:
        container = av.open(
            fileobj,
            mode="r",
            metadata_errors="ignore",
            container_options={
                "format_whitelist": ",".join(sorted(ALLOWED_DEMUXERS)),
                "protocol_whitelist": PROTOCOL_WHITELIST,
            },
            io_open=_refuse_nested_open,
        )
    except _NestedOpenRefused as e:
        raise AudioDecodeError(
            f"the file refers to another file or URL ({str(e)[:200]!r}); playlists and "
            "reference formats are not accepted"
        ) from e
    except av.error.FFmpegError as e:
        raise _open_error(fileobj, e) from e
    try:
        _check_demuxer(container.format.name)
    except AudioDecodeError:
        container.close()
        raise
    return container


def _open_error(fileobj: BinaryIO, error: av.error.FFmpegError) -> AudioDecodeError:
    """Translate a failed ``av.open``: a refused format, or not media at all."""
    detected = _sniff_reference_format(fileobj)
    # EINVAL from av.open is FFmpeg's "Format not on whitelist" (the probed name is not reported).
    if detected or isinstance(error, av.error.ArgumentError):
        return AudioDecodeError(
            f"container format refused: {detected or 'a format outside the allow-list'}; "
            "upload an audio or video file (wav, flac, mp3, ogg, opus, m4a, webm, mp4, mkv, ...)"
        )
    return AudioDecodeError(f"not a decodable audio or video file ({error.strerror})")


def _check_demuxer(name: str) -> None:
    """Refuse a container whose demuxer is not on :data:`ALLOWED_DEMUXERS`."""
    if not ALLOWED_DEMUXERS.intersection(name.split(",")):
        raise AudioDecodeError(f"container format {name!r} is not accepted")


def _audio_stream(container: av.container.InputContainer) -> av.audio.stream.AudioStream:
    """The best audio stream, or :class:`NoAudioStream`."""
    if not container.streams.audio:
        raise NoAudioStream("the file has no audio track")
    stream = container.streams.best("audio") or container.streams.audio[0]
    if stream.codec_context is None:
        raise AudioDecodeError(f"no decoder for the audio codec of this file ({stream.name})")
    return stream


# ---------------------------------------------------------------------------------------------
# Frame generators
# ---------------------------------------------------------------------------------------------


def _flush_decoder(stream: av.audio.stream.AudioStream) -> list[av.AudioFrame]:
    """Drain the frames a decoder still holds; a failing flush yields nothing."""
    try:
        return stream.codec_context.decode(None)
    except av.error.FFmpegError:
        return []


def _frames(
    container: av.container.InputContainer, stream: av.audio.stream.AudioStream
) -> Iterator[av.AudioFrame]:
    """Decode ``stream`` packet by packet, tolerant of damage once audio has been found.

    A packet the decoder rejects is skipped (at most :data:`MAX_SKIPPED_PACKETS`). A demuxer
    error after some audio ends the stream early with a warning (a truncated upload keeps what
    exists). If nothing decodes, the last error is raised.
    """
    decoded_any = False
    skipped = 0
    last_error: av.error.FFmpegError | None = None
    packets = container.demux(stream)
    while True:
        try:
            packet = next(packets)
        except StopIteration:
            break
        except av.error.MemoryError:
            raise  # out of memory is not the end of a truncated file
        except av.error.FFmpegError as e:
            if not decoded_any:
                raise
            logger.warning("the input ends early (%s); keeping the audio decoded so far", e)
            yield from _flush_decoder(stream)
            break
        try:
            frames = packet.decode()
        except av.error.InvalidDataError as e:
            skipped, last_error = skipped + 1, e
            if skipped > MAX_SKIPPED_PACKETS:
                raise
            continue
        decoded_any = decoded_any or bool(frames)
        yield from frames
    if skipped:
        logger.warning("skipped %d audio packets the decoder rejected", skipped)
    if not decoded_any and last_error is not None:
        raise last_error


class _RateConformer:
    """Resample frames whose rate differs from ``rate`` (a mid-stream change); pass others.

    One ``av.AudioResampler`` per distinct input setup (format, layout, rate), since a PyAV
    resampler refuses frames that do not match its first frame.
    """

    def __init__(self, rate: int):
        self.rate = rate
        self.used = False
        self._resampler: av.AudioResampler | None = None
        self._setup: tuple[str, str, int] | None = None

    def __call__(self, frame: av.AudioFrame) -> list[av.AudioFrame]:
        if frame.sample_rate == self.rate:
            return [*self.flush(), frame]
        setup = (frame.format.name, frame.layout.name, frame.sample_rate)
        out = []
        if setup != self._setup:
            out += self.flush()
            logger.info("sample rate changes mid-stream: %d -> %d Hz", frame.sample_rate, self.rate)
            self._resampler = av.AudioResampler(format="fltp", layout=frame.layout, rate=self.rate)
            self._setup, self.used = setup, True
        out += self._resampler.resample(frame)
        return out

    @property
    def idle(self) -> bool:
        """No resampler is open (frames at :attr:`rate` pass straight through)."""
        return self._resampler is None

    def flush(self) -> list[av.AudioFrame]:
        """Drain and drop the current resampler."""
        if self._resampler is None:
            return []
        out = self._resampler.resample(None)
        self._resampler, self._setup = None, None
        return out


def _at_first_rate(frames: Iterable[av.AudioFrame]) -> Iterator[av.AudioFrame]:
    """Yield ``frames`` all at the sample rate of the first one."""
    conformer: _RateConformer | None = None
    try:
        for frame in frames:
            conformer = conformer or _RateConformer(frame.sample_rate)
            if frame.sample_rate == conformer.rate and conformer.idle:
                yield frame  # the usual case, without the per-frame list of the slow path
            else:
                yield from conformer(frame)
        if conformer is not None:
            yield from conformer.flush()
    finally:
        # faster-whisper's note: PyAV resampler graphs may sit in reference cycles until the
        # garbage collector runs. Collect only when one was built (a rare mid-stream change).
        if conformer is not None and conformer.used:
            del conformer
            gc.collect()


# FFmpeg sample format name -> (numpy dtype, planar). Planar formats ("fltp") hold one buffer per
# channel; packed ones ("s16") one interleaved buffer. These are all of FFmpeg's sample formats.
_SAMPLE_FORMATS: dict[str, tuple[np.dtype, bool]] = {
    name + suffix: (np.dtype(dtype), suffix == "p")
    for name, dtype in {"u8": np.uint8, "s16": np.int16, "s32": np.int32, "s64": np.int64,
                        "flt": np.float32, "dbl": np.float64}.items()
    for suffix in ("", "p")
}  # fmt: skip

# Samples per channel converted to mono at a time. Converting as decoding goes, rather than at
# the end, releases each frame soon, so the decoder reuses its buffers instead of allocating new
# ones for every frame (a cost that grows with the decoder's buffer padding: AAC's is 2x).
BATCH_SAMPLES = 16384

# Mono output is written in blocks, never copied to grow (a doubling buffer reserves up to twice
# its content and holds 1.5x while it copies). The first block is sized from the announced
# duration (a size hint only: the cap still counts decoded samples; at most the output limit),
# so an honest file fills one block; later blocks grow with what was written, within these bounds.
PREALLOC_SLACK_SECONDS = 1.0  # s, added to the announced duration
MIN_BLOCK_SAMPLES = 1 << 16  # 256 KiB of float32
MAX_BLOCK_SAMPLES = 1 << 23  # 32 MiB of float32: the most a block's unused tail can reserve

# Mono samples handed to FFmpeg's resampler at a time when converting to 16 kHz (bounded chunks:
# its frames and our copies stay a few hundred KiB whatever the length).
RESAMPLE_CHUNK = 1 << 16


class _Blocks:
    """Growable float32 output that batches of mono samples are written into, block by block."""

    def __init__(self, first: int):
        self._parts: list[np.ndarray] = []  # full blocks, trimmed to what was written
        self._block = np.empty(max(int(first), 1), dtype=np.float32)
        self._used = 0  # samples written in the current block
        self.size = 0  # samples written in all

    def take(self, n: int) -> np.ndarray:
        """A writable view of the next ``n`` samples (a new block when the current one is full)."""
        if self._used + n > self._block.size:
            if self._used:
                self._parts.append(self._block[: self._used])
            grow = min(max(self.size // 4, MIN_BLOCK_SAMPLES), MAX_BLOCK_SAMPLES)
            self._block, self._used = np.empty(max(n, grow), dtype=np.float32), 0
        view = self._block[self._used : self._used + n]
        self._used += n
        self.size += n
        return view

    def parts(self) -> tuple[np.ndarray, ...]:
        """The samples written, in order. A lone block mostly unused (a header that announced
        more than the file holds) is copied, so the rest of it is released."""
        last = self._block[: self._used]
        if not self._parts and 2 * self._used < self._block.size:
            last = last.copy()
        return (*self._parts, last) if self._used else tuple(self._parts)


class _ToTargetRate:
    """FFmpeg's resampler (swr) from mono float32 at ``rate`` to 16 kHz, chunk by chunk."""

    def __init__(self, rate: int):
        self.rate = rate
        self._resampler = av.AudioResampler(format="flt", layout="mono", rate=SAMPLE_RATE_HZ)

    def __call__(self, mono: np.ndarray | None) -> Iterator[np.ndarray]:
        """The 16 kHz samples ``mono`` completes (``None``: flush), as views valid until the next
        call."""
        if mono is None:
            frames = self._resampler.resample(None)
        else:
            frame = av.AudioFrame.from_ndarray(mono.reshape(1, -1), format="flt", layout="mono")
            frame.sample_rate = self.rate
            frames = self._resampler.resample(frame)
        for frame in frames:
            yield np.frombuffer(frame.planes[0], np.float32, frame.samples)


StreamResampler = _ToTargetRate  # live streams (pipeline/audio/stream_vad.py) resample frame by frame


class _MonoSink:
    """Where the mono batches of one decode go, bounded by the 16 kHz budget.

    Audio at 16 kHz is kept as it is. Audio at another of the :data:`COMMON_RATES` is kept at its
    rate while it is short (:data:`NATIVE_MAX_SECONDS` at most, and never more samples than the
    budget); when it gets longer (or announces that it will) what was kept is converted and the
    rest is converted as it decodes. Audio at any other rate is converted from the start. Either
    way the output holds at most :func:`output_budget` samples.
    """

    def __init__(self, rate: int, max_seconds: float, declared: float | None,
                 native_seconds: float):
        self.rate = rate
        self.budget = output_budget(max_seconds)  # samples
        if rate == SAMPLE_RATE_HZ:
            self.native_limit = self.budget  # the duration cap keeps it there: never converted
        elif rate in COMMON_RATES and (declared or 0.0) <= native_seconds:
            self.native_limit = min(native_seconds * rate, self.budget)
        else:
            self.native_limit = 0
        self._declared = declared
        self._convert: _ToTargetRate | None = None
        self._scratch = np.empty(0, dtype=np.float32)
        if self.native_limit:
            self.out = _Blocks(self._first_block(rate, self.native_limit))
        else:
            self._start_converting()

    def _first_block(self, rate: int, limit: float) -> int:
        return int(min(((self._declared or 0.0) + PREALLOC_SLACK_SECONDS) * rate, limit))

    def _start_converting(self) -> None:
        self._convert = _ToTargetRate(self.rate)
        self.out = _Blocks(self._first_block(SAMPLE_RATE_HZ, self.budget))

    def add(self, frames: list[av.AudioFrame], key: tuple[str, int], n: int,
            channel: int | None) -> None:
        """Write the mono mix (or ``channel``) of ``frames``, ``n`` samples, into the output."""
        if (self._convert is None and self.rate != SAMPLE_RATE_HZ
                and self.out.size + n > self.native_limit):
            kept = self.out.parts()
            logger.info("audio at %d Hz longer than %g s: converted to %d Hz while decoding",
                        self.rate, self.native_limit / self.rate, SAMPLE_RATE_HZ)
            self._start_converting()
            for part in kept:
                for start in range(0, part.size, RESAMPLE_CHUNK):
                    self._emit(self._convert(part[start : start + RESAMPLE_CHUNK]))
            del kept
        if self._convert is None:
            _write_mono(frames, key, self.out.take(n), channel)
            return
        if self._scratch.size < n:
            self._scratch = np.empty(n, dtype=np.float32)
        mono = self._scratch[:n]
        _write_mono(frames, key, mono, channel)
        self._emit(self._convert(mono))

    def _emit(self, chunks: Iterable[np.ndarray]) -> None:
        for chunk in chunks:
            room = self.budget - self.out.size  # the resampler may round up by a sample
            if room > 0 and chunk.size:
                count = min(chunk.size, room)
                self.out.take(count)[:] = chunk[:count]

    def finish(self, channels: int) -> DecodedParts:
        """The output, once every batch was added."""
        rate = self.rate
        if self._convert is not None:
            self._emit(self._convert(None))
            # no gc.collect() here: PyAV 18's resampler is not in a reference cycle (measured:
            # nothing to collect after one, and RSS flat over 1,500 of them with gc disabled)
            self._convert = None
            rate = SAMPLE_RATE_HZ
        return DecodedParts(self.out.parts(), rate, channels)


def _write_mono(frames: list[av.AudioFrame], key: tuple[str, int], out: np.ndarray,
                channel: int | None = None) -> None:
    """Write the channel average of ``frames`` (all of sample format ``key``) into ``out``,
    float32 in [-1, 1] (exact for PCM <= 24 bit); or only ``channel`` when one is chosen."""
    name, channels = key
    if name not in _SAMPLE_FORMATS:
        raise AudioDecodeError(f"unsupported sample format {name!r}")
    dtype, planar = _SAMPLE_FORMATS[name]
    if channel is not None:
        _write_channel(frames, dtype, planar, channels, min(channel, channels - 1), out)
        return
    if planar:
        planes, counts = [f.planes for f in frames], [f.samples for f in frames]
        first, *others = (
            [np.frombuffer(p[c], dtype, n) for p, n in zip(planes, counts)] for c in range(channels)
        )  # per channel: its arrays across frames
        np.concatenate(first, out=out, casting="unsafe")
        for channel in others:
            out += np.concatenate(channel)
    else:
        packed = [np.frombuffer(f.planes[0], dtype, f.samples * channels) for f in frames]
        columns = np.concatenate(packed).reshape(-1, channels)  # de-interleave: column views
        np.copyto(out, columns[:, 0], casting="unsafe")
        for c in range(1, channels):
            out += columns[:, c]
    _scale_to_unit(out, dtype, channels)


def _write_channel(frames: list[av.AudioFrame], dtype: np.dtype, planar: bool, channels: int,
                   channel: int, out: np.ndarray) -> None:
    """Write one channel of ``frames`` into ``out`` (a split stereo call: one speaker each)."""
    if planar:
        np.concatenate([np.frombuffer(f.planes[channel], dtype, f.samples) for f in frames],
                       out=out, casting="unsafe")
    else:
        packed = [np.frombuffer(f.planes[0], dtype, f.samples * channels) for f in frames]
        np.copyto(out, np.concatenate(packed).reshape(-1, channels)[:, channel], casting="unsafe")
    _scale_to_unit(out, dtype, 1)


def _scale_to_unit(total: np.ndarray, dtype: np.dtype, channels: int) -> None:
    """Turn a channel sum of samples of ``dtype`` into their average in [-1, 1], in place."""
    if dtype == np.uint8:
        total *= np.float32(1.0 / channels)
        total -= np.float32(128.0)
        total *= np.float32(1.0 / 128.0)
    elif np.issubdtype(dtype, np.signedinteger):  # one multiply, as exact as two: 2**-k is exact
        total *= np.float32(1.0 / channels) * np.float32(2.0 ** -(8 * dtype.itemsize - 1))
    else:
        if channels > 1:
            total *= np.float32(1.0 / channels)
        np.clip(total, -1.0, 1.0, out=total)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------


def _collect(
    frames: Iterable[av.AudioFrame], max_seconds: float, declared: float | None,
    channel: int | None = None, native_seconds: float = NATIVE_MAX_SECONDS,
) -> DecodedParts:
    """Convert frames to mono in batches of one sample format (at most :data:`BATCH_SAMPLES`),
    raising :class:`AudioTooLong` as soon as the cap is passed; the output goes through a
    :class:`_MonoSink` (at most the 16 kHz budget). ``declared`` (s, from the headers) only sizes
    the output and picks the output rate."""
    sink: _MonoSink | None = None
    batch: list[av.AudioFrame] = []
    key: tuple[str, int] | None = None
    rate = total = batched = 0  # Hz, samples, samples
    limit = 0.0  # samples
    for frame in frames:
        n = frame.samples
        if not n:
            continue  # an empty frame may have no sample buffers at all
        if sink is None:
            rate = frame.sample_rate
            sink = _MonoSink(rate, max_seconds, declared, native_seconds)
            limit = max_seconds * rate
        total += n
        if total > limit:
            raise AudioTooLong(f"the audio is longer than the {max_seconds:g} s limit")
        frame_key = (frame.format.name, frame.layout.nb_channels)
        if batch and (frame_key != key or batched >= BATCH_SAMPLES):
            sink.add(batch, key, batched, channel)
            batch, batched = [], 0
        key = frame_key
        batch.append(frame)
        batched += n
    if batch:
        sink.add(batch, key, batched, channel)
    if not rate or total < MIN_AUDIO_SECONDS * rate:
        got = f"{total / rate * 1000:.1f} ms" if rate else "nothing"
        raise EmptyAudio(
            f"no audio samples: decoding gave {got}, less than {MIN_AUDIO_SECONDS * 1000:g} ms"
        )
    return sink.finish(key[1])


def _declared_seconds(
    container: av.container.InputContainer, stream: av.audio.stream.AudioStream
) -> float | None:
    """The duration the headers announce (the stream's, else the container's), if any."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / av.time_base
    return None


def _duration_is_stated(container: av.container.InputContainer, fileobj: BinaryIO) -> bool:
    """Whether the declared duration comes from the file's headers, not FFmpeg's estimate from
    the bit rate (see :data:`ESTIMATED_DURATION_DEMUXERS`)."""
    names = set(container.format.name.split(","))
    if not names & ESTIMATED_DURATION_DEMUXERS:
        return True
    return "mp3" in names and _mp3_states_duration(fileobj)


def _refuse_declared_too_long(declared: float | None, max_seconds: float) -> None:
    """:class:`AudioTooLong` before decoding, for a file whose headers state a longer duration
    than the cap (a bomb of silence refused in milliseconds, not after decoding the cap)."""
    if declared is not None and declared > max_seconds + DECLARED_SLACK_SECONDS:
        raise AudioTooLong(f"the audio is longer than the {max_seconds:g} s limit "
                           f"(the file declares {declared:.1f} s)")


def _warn_if_truncated(decoded: DecodedParts, declared: float | None) -> None:
    """Log a warning when much less audio decoded than the headers announce."""
    seconds = decoded.size / decoded.sample_rate
    if declared is not None and declared - seconds > TRUNCATION_SLACK_SECONDS:
        logger.warning(
            "decoded %.2f s of the %.2f s the file announces: it looks truncated",
            seconds,
            declared,
        )


def _decode_container(container: av.container.InputContainer, fileobj: BinaryIO,
                      max_seconds: float, channel: int | None = None,
                      native_seconds: float = NATIVE_MAX_SECONDS) -> DecodedParts:
    """Decode the best audio stream of an opened container (see :func:`decode_audio`)."""
    stream = _audio_stream(container)
    declared = _declared_seconds(container, stream)
    if declared is not None and _duration_is_stated(container, fileobj):
        _refuse_declared_too_long(declared, max_seconds)
    frames = _at_first_rate(_frames(container, stream))
    try:
        decoded = _collect(frames, max_seconds, declared, channel, native_seconds)
    finally:
        frames.close()  # before the container closes, also when a cap stopped decoding
    _warn_if_truncated(decoded, declared)
    return decoded


def decode_audio_parts(
    source: AudioSource,
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    max_bytes: int | None = None,
    channel: int | None = None,
    native_seconds: float = NATIVE_MAX_SECONDS,
) -> DecodedParts:
    """:func:`decode_audio`, with the samples left in the blocks they were written in (what a
    decoder process sends back). ``native_seconds``: audio at a common rate up to this long keeps
    its rate (0: everything at 16 kHz)."""
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    with _open_source(source, max_bytes) as fileobj:
        container = _open_container(fileobj)
        try:
            return _decode_container(container, fileobj, max_seconds, channel, native_seconds)
        except MemoryError as e:  # numpy, or ENOMEM inside FFmpeg (an address-space limit)
            raise DecoderOutOfMemory(
                "decoding this file needs more memory than a decoder may use") from e
        except av.error.FFmpegError as e:
            raise AudioDecodeError(f"the audio track cannot be decoded ({e.strerror})") from e
        finally:
            container.close()


def decode_audio(
    source: AudioSource,
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    max_bytes: int | None = None,
    channel: int | None = None,
) -> DecodedAudio:
    """Decode the best audio track of ``source`` to mono float32 (the average of its channels,
    or only ``channel``, clamped to the last one, when given): at its own rate when that is one of
    the :data:`COMMON_RATES` and the audio is at most :data:`NATIVE_MAX_SECONDS` long, else at
    16 kHz. Never more than :func:`output_budget` samples.

    ``source`` is a path, the file's bytes, or a binary file object (a seekable one is read from
    its start). Raises :class:`UploadTooLarge` (over ``max_bytes``, before decoding),
    :class:`AudioTooLong` (over ``max_seconds``: declared by the headers, before decoding, or
    counted while decoding), :class:`NoAudioStream`, :class:`EmptyAudio` (shorter than 25 ms),
    :class:`DecoderOutOfMemory` (FFmpeg could not allocate) or :class:`AudioDecodeError`
    (anything else).
    """
    return decode_audio_parts(
        source, max_seconds=max_seconds, max_bytes=max_bytes, channel=channel
    ).joined()


class Resampler:
    """Resample to 16 kHz on a device with torchaudio, from one of the :data:`COMMON_RATES`.

    One cached ``torchaudio.transforms.Resample`` (default ``sinc_interp_hann``) per source
    rate, built on first use and moved to the device; the cache is guarded by a lock, and the
    transforms themselves are stateless, so one instance may serve many threads. Any other rate is
    refused with ``ValueError`` rather than given a kernel (see :data:`COMMON_RATES`: the decoder
    converts those to 16 kHz), so the cache never holds more than those nine kernels.
    """

    def __init__(self, device: str | torch.device = "cpu"):
        import torch

        self.device = torch.device(device)
        self._transforms: dict[int, torchaudio.transforms.Resample] = {}
        self._lock = threading.Lock()

    def transform(self, rate: int) -> torchaudio.transforms.Resample:
        """The cached transform from ``rate`` Hz (one of :data:`COMMON_RATES`) to 16 kHz."""
        if rate not in COMMON_RATES:
            raise ValueError(f"no device resampling from {rate} Hz: only from "
                             f"{sorted(COMMON_RATES)} (the decoder converts other rates)")
        with self._lock:
            transform = self._transforms.get(rate)
            if transform is None:
                import torchaudio

                transform = torchaudio.transforms.Resample(orig_freq=rate, new_freq=SAMPLE_RATE_HZ)
                transform = transform.to(self.device)
                self._transforms[rate] = transform
            return transform

    def __call__(self, audio: DecodedAudio) -> torch.Tensor:
        """1-D float32 tensor on :attr:`device` at 16 kHz."""
        import torch

        if audio.sample_rate != SAMPLE_RATE_HZ:
            transform = self.transform(audio.sample_rate)  # refuses an odd rate before any copy
        waveform = torch.from_numpy(audio.samples).to(self.device, dtype=torch.float32)
        if audio.sample_rate == SAMPLE_RATE_HZ:
            return waveform
        with torch.no_grad():
            return transform(waveform)


def load_audio_16k(
    source: AudioSource,
    *,
    resampler: Resampler,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    max_bytes: int | None = None,
) -> torch.Tensor:
    """Decode ``source`` (see :func:`decode_audio`) and resample it to 16 kHz on the device."""
    return resampler(decode_audio(source, max_seconds=max_seconds, max_bytes=max_bytes))
