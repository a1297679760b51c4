"""Decode untrusted uploads in-process with PyAV; resample to 16 kHz with torchaudio.

Every upload is treated as hostile:

* the byte size is checked before decoding (``max_bytes``);
* paths are opened by Python, never handed to FFmpeg as URLs, so no FFmpeg protocol is reached;
* only local audio/video demuxers may run (``format_whitelist``, enforced by FFmpeg before a
  header is parsed, and checked again on the opened container); playlists and reference formats
  (hls, concat, sdp, image2, ...) are refused, and any nested open they might attempt is refused;
* the duration cap is enforced while decoding by counting samples, never from header durations,
  so memory stays bounded by the cap even when a header lies.

Decoding keeps the source sample rate; :class:`Resampler` converts to :data:`SAMPLE_RATE` on a
device. :func:`load_audio_16k` does both.
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

from .errors import AudioDecodeError, AudioTooLong, EmptyAudio, NoAudioStream, UploadTooLarge
from .types import SAMPLE_RATE

logger = logging.getLogger("sensevoice.audio")

DEFAULT_MAX_SECONDS = 4 * 3600.0  # s, decoded-duration cap
MIN_AUDIO_SECONDS = 0.025  # s, shortest usable audio (400 samples at 16 kHz, one fbank window)
MAX_SKIPPED_PACKETS = 100  # packets the decoder may reject before the file counts as corrupt
TRUNCATION_SLACK_SECONDS = 0.5  # s, decoded shorter than announced by more than this: warn
SNIFF_BYTES = 64  # bytes read to name a refused text format in the error message

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
    """Mono audio at the source sample rate."""

    samples: np.ndarray  # float32, mono, 1-D, in [-1, 1]
    sample_rate: int  # Hz
    channels: int = 1  # channels in the source (samples are their average, or one of them)

    @property
    def seconds(self) -> float:
        """Duration in seconds."""
        return self.samples.size / self.sample_rate


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
    """Read until EOF or ``limit`` bytes (a raw stream may return short reads)."""
    buffer = bytearray()
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

# The mono output is one buffer sized up front, so no final concatenation touches fresh memory
# twice. The announced duration is only a size hint (the cap still counts decoded samples): the
# buffer holds it plus slack, at most the cap and PREALLOC_MAX_SECONDS, and grows if it was short.
PREALLOC_SLACK_SECONDS = 1.0  # s, added to the announced duration
PREALLOC_MAX_SECONDS = 600.0  # s, most reserved on a header's word


class _MonoBuffer:
    """Growable float32 output that batches of mono samples are written into."""

    def __init__(self, rate: int, max_seconds: float, declared: float | None):
        self.limit = max_seconds * rate  # samples, the cap
        seconds = min((declared or 0.0) + PREALLOC_SLACK_SECONDS, PREALLOC_MAX_SECONDS)
        self._data = np.empty(int(min(seconds * rate, self.limit)), dtype=np.float32)
        self.size = 0  # samples written

    def take(self, n: int) -> np.ndarray:
        """A writable view of the next ``n`` samples; the buffer doubles (within the cap) if full."""
        end = self.size + n
        if end > self._data.size:
            grown = np.empty(int(min(max(end, 2 * self._data.size), self.limit)), np.float32)
            grown[: self.size] = self._data[: self.size]
            self._data = grown
        view = self._data[self.size : end]
        self.size = end
        return view

    def samples(self) -> np.ndarray:
        """The samples written: a view, or a copy when most of the buffer went unused."""
        written = self._data[: self.size]
        return written.copy() if 2 * self.size < self._data.size else written


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
    channel: int | None = None,
) -> DecodedAudio:
    """Convert frames to mono in batches of one sample format (at most :data:`BATCH_SAMPLES`),
    raising :class:`AudioTooLong` as soon as the cap is passed (memory stays bounded by the cap).
    ``declared`` (s, from the headers) only sizes the output buffer."""
    out: _MonoBuffer | None = None
    batch: list[av.AudioFrame] = []
    key: tuple[str, int] | None = None
    rate = total = batched = 0  # Hz, samples, samples
    limit = 0.0  # samples
    for frame in frames:
        n = frame.samples
        if not n:
            continue  # an empty frame may have no sample buffers at all
        if out is None:
            rate = frame.sample_rate
            out = _MonoBuffer(rate, max_seconds, declared)
            limit = out.limit
        total += n
        if total > limit:
            raise AudioTooLong(f"the audio is longer than the {max_seconds:g} s limit")
        frame_key = (frame.format.name, frame.layout.nb_channels)
        if batch and (frame_key != key or batched >= BATCH_SAMPLES):
            _write_mono(batch, key, out.take(batched), channel)
            batch, batched = [], 0
        key = frame_key
        batch.append(frame)
        batched += n
    if batch:
        _write_mono(batch, key, out.take(batched), channel)
    if not rate or total < MIN_AUDIO_SECONDS * rate:
        got = f"{total / rate * 1000:.1f} ms" if rate else "nothing"
        raise EmptyAudio(
            f"no audio samples: decoding gave {got}, less than {MIN_AUDIO_SECONDS * 1000:g} ms"
        )
    return DecodedAudio(samples=out.samples(), sample_rate=rate, channels=key[1])


def _declared_seconds(
    container: av.container.InputContainer, stream: av.audio.stream.AudioStream
) -> float | None:
    """The duration the headers announce (for diagnostics and buffer sizing; limits never trust it)."""
    if stream.duration and stream.time_base:
        return float(stream.duration * stream.time_base)
    if container.duration:
        return container.duration / av.time_base
    return None


def _warn_if_truncated(decoded: DecodedAudio, declared: float | None) -> None:
    """Log a warning when much less audio decoded than the headers announce."""
    if declared is not None and declared - decoded.seconds > TRUNCATION_SLACK_SECONDS:
        logger.warning(
            "decoded %.2f s of the %.2f s the file announces: it looks truncated",
            decoded.seconds,
            declared,
        )


def _decode_container(container: av.container.InputContainer, max_seconds: float,
                      channel: int | None = None) -> DecodedAudio:
    """Decode the best audio stream of an opened container (see :func:`decode_audio`)."""
    stream = _audio_stream(container)
    frames = _at_first_rate(_frames(container, stream))
    try:
        decoded = _collect(frames, max_seconds, _declared_seconds(container, stream), channel)
    finally:
        frames.close()  # before the container closes, also when a cap stopped decoding
    _warn_if_truncated(decoded, _declared_seconds(container, stream))
    return decoded


def decode_audio(
    source: AudioSource,
    *,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    max_bytes: int | None = None,
    channel: int | None = None,
) -> DecodedAudio:
    """Decode the best audio track of ``source`` to mono float32 at its own sample rate
    (the average of its channels, or only ``channel``, clamped to the last one, when given).

    ``source`` is a path, the file's bytes, or a binary file object (a seekable one is read from
    its start). Raises :class:`UploadTooLarge` (over ``max_bytes``, before decoding),
    :class:`AudioTooLong` (over ``max_seconds``, while decoding), :class:`NoAudioStream`,
    :class:`EmptyAudio` (shorter than 25 ms) or :class:`AudioDecodeError` (anything else).
    """
    if not max_seconds > 0:
        raise ValueError(f"max_seconds must be positive, got {max_seconds}")
    with _open_source(source, max_bytes) as fileobj:
        container = _open_container(fileobj)
        try:
            return _decode_container(container, max_seconds, channel)
        except av.error.FFmpegError as e:
            raise AudioDecodeError(f"the audio track cannot be decoded ({e.strerror})") from e
        finally:
            container.close()


class Resampler:
    """Resample to 16 kHz on a device with torchaudio.

    One cached ``torchaudio.transforms.Resample`` (default ``sinc_interp_hann``) per source
    rate, built on first use and moved to the device; the cache is guarded by a lock, and the
    transforms themselves are stateless, so one instance may serve many threads.
    """

    def __init__(self, device: str | torch.device = "cpu"):
        import torch

        self.device = torch.device(device)
        self._transforms: dict[int, torchaudio.transforms.Resample] = {}
        self._lock = threading.Lock()

    def transform(self, rate: int) -> torchaudio.transforms.Resample:
        """The cached transform from ``rate`` Hz to 16 kHz."""
        with self._lock:
            transform = self._transforms.get(rate)
            if transform is None:
                import torchaudio

                transform = torchaudio.transforms.Resample(orig_freq=rate, new_freq=SAMPLE_RATE)
                transform = transform.to(self.device)
                self._transforms[rate] = transform
            return transform

    def __call__(self, audio: DecodedAudio) -> torch.Tensor:
        """1-D float32 tensor on :attr:`device` at 16 kHz."""
        import torch

        waveform = torch.from_numpy(audio.samples).to(self.device, dtype=torch.float32)
        if audio.sample_rate == SAMPLE_RATE:
            return waveform
        with torch.no_grad():
            return self.transform(audio.sample_rate)(waveform)


def load_audio_16k(
    source: AudioSource,
    *,
    resampler: Resampler,
    max_seconds: float = DEFAULT_MAX_SECONDS,
    max_bytes: int | None = None,
) -> torch.Tensor:
    """Decode ``source`` (see :func:`decode_audio`) and resample it to 16 kHz on the device."""
    return resampler(decode_audio(source, max_seconds=max_seconds, max_bytes=max_bytes))
