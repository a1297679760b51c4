"""A small Python client of the REST API: submit a recording, wait for its job, fetch an export.

    from pipeline.client import Client

    with Client("http://gpu-box:7860", token="...") as client:
        job_id = client.submit("call.mp3", {"language": "en", "word_timestamps": True})
        job = client.wait(job_id, timeout=600)      # the job's JSON, as GET /api/jobs/{id} answers
        srt = client.result(job_id, "srt")          # bytes: txt | json | srt | vtt

* Busy answers (503 with ``Retry-After``: queue full, too many uploads, GPU memory low, backlog
  full, not ready; 429 too many uploads from this client) are retried after the server's
  ``Retry-After`` (2 s when it sends none), for at most ``busy_timeout`` seconds in all; so are
  requests that never reached the server whole (refused connection: a server restarting). Any other refusal raises :class:`ApiError` with the
  server's status, stable code and message.
* Uploads stream from disk: a file is never read whole into memory here.
* What a server sends back is capped (issue 19: a hostile server's 3 GiB "result" took a CLI to
  9.5 GB and was written twice): a body over ``max_response_bytes`` (64 MiB; an error's over 64
  KiB) is cut off and raises :class:`ResponseTooLarge`, gzip or not; a job JSON that is not an
  object, or a job id that is not an id, raises :class:`BadResponse`.
* The cap holds for any content coding (issue 36: a 1.6 KB brotli answer, decoded by httpx in one
  call, took the CLI to 2.15 GB): only ``gzip`` is asked for, and whatever coding the server
  answers with (gzip, deflate, br, zstd, stacked) is decoded here a bounded piece at a time
  (``DECODE_CHUNK``), its compressed bytes capped too; a coding this client cannot decode within
  bounds (unknown, or br/zstd without a module that can) or a stream that does not decode raises
  :class:`BadResponse`.
* ``token`` is sent as ``Authorization: Bearer <token>``, as the server (and OpenAI's client) expect.
* httpx and the standard library only (no torch): a laptop can feed a remote GPU server.
  Thread-safe: one client may serve many threads (httpx's connection pool).

Written by hand because the API is four calls; an OpenAPI generator would bring more code than that.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import os
import re
import itertools
import threading
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Callable

import httpx

BUSY_STATUSES = (429, 503)  # back-pressure: nothing is wrong with the request, try again later
DEFAULT_RETRY_AFTER_S = 2.0  # s, when a busy answer carries no Retry-After
MAX_RETRY_AFTER_S = 300.0  # s, the longest single wait a server may ask for
FINISHED = ("done", "failed", "purged")  # job states that never change again
POLL_FIRST_S = 0.2  # s, the first poll interval; it grows by POLL_GROWTH up to POLL_MAX_S
POLL_GROWTH = 1.5
POLL_MAX_S = 2.0  # s
MAX_RESPONSE_BYTES = 64 * 1024 * 1024  # a job JSON or an export (a 4 h recording's is a few MB)
MAX_ERROR_BYTES = 64 * 1024  # an error answer's body (its JSON is under 1 KB)
DECODE_CHUNK = 64 * 1024  # the decoded bytes a content decoder gives at once (brotli: up to a block more)
MAX_CODINGS = 4  # stacked content codings ("gzip, br") a body may have
ACCEPT_ENCODING = "gzip"  # the only coding asked for (others are still decoded within bounds)
JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")  # what the server's ids look like


# transport errors raised before the request was sent whole: the server has no job from it
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError,
             httpx.WriteTimeout)


class ApiError(Exception):
    """The server refused a call: ``status`` (HTTP), ``code`` (stable, e.g. ``unsupported_media``),
    ``message``; ``retry_after`` (seconds) for busy answers, else ``None``."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after


class ResponseTooLarge(ApiError):
    """The server's answer was larger than this client reads (the rest was not read)."""

    def __init__(self, status: int, limit: int):
        super().__init__(status, "response_too_large",
                         f"the server's answer is larger than {limit} bytes; nothing was kept")


class BadResponse(ApiError):
    """The server's answer is not what the API sends (not JSON, not an object, a bad job id)."""

    def __init__(self, status: int, message: str):
        super().__init__(status, "bad_response", message)


class WaitTimeout(TimeoutError):
    """The job did not finish within the time :meth:`Client.wait` was given."""


def retry_after_seconds(value: str | None) -> float:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), clamped to
    [0, MAX_RETRY_AFTER_S]; :data:`DEFAULT_RETRY_AFTER_S` when absent or unreadable."""
    if not value:
        return DEFAULT_RETRY_AFTER_S
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError):
            return DEFAULT_RETRY_AFTER_S
    return min(max(seconds, 0.0), MAX_RETRY_AFTER_S)


def _form(options: Any) -> dict[str, str]:
    """Form fields of POST /api/jobs from a TranscribeOptions, a mapping, or None."""
    if options is None:
        return {}
    if dataclasses.is_dataclass(options) and not isinstance(options, type):
        options = dataclasses.asdict(options)
    if not isinstance(options, Mapping):
        raise TypeError(f"options must be a TranscribeOptions or a mapping, not {type(options).__name__}")
    return {k: (json.dumps(list(v), ensure_ascii=False) if k == "hotwords" else _field(v))  # a JSON list
            for k, v in options.items() if v is not None and not (isinstance(v, (tuple, list)) and not v)}


def _field(value: Any) -> str:
    """A form field's text: booleans as true/false, a list (``languages``) comma-separated."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (tuple, list)):
        return ",".join(str(v) for v in value)
    return str(value)


class _Undecodable(Exception):
    """A body that does not decode as its content coding says (or whose coding is not read here)."""


def _zlib_chunks(chunks: Iterable[bytes], wbits: int) -> Iterator[bytes]:
    """gzip / zlib / raw deflate, at most DECODE_CHUNK bytes per piece."""
    d = zlib.decompressobj(wbits)
    try:
        for chunk in chunks:
            while chunk and not d.eof:  # (bytes after the stream's end are ignored, as httpx does)
                out = d.decompress(chunk, DECODE_CHUNK)
                chunk = d.unconsumed_tail
                yield out
                while len(out) == DECODE_CHUNK and not chunk and not d.eof:  # output still held
                    out = d.decompress(b"", DECODE_CHUNK)
                    yield out
    except zlib.error as e:
        raise _Undecodable(str(e)) from None
    if not d.eof:
        raise _Undecodable("the compressed stream ends early")


def _deflate_chunks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    """HTTP's ``deflate``: zlib-wrapped as the RFC says, or raw as some servers send it."""
    chunks, head = iter(chunks), b""
    for chunk in chunks:
        head += chunk
        if len(head) >= 2:
            break
    wrapped = len(head) >= 2 and head[0] & 0x0F == 8 and int.from_bytes(head[:2], "big") % 31 == 0
    yield from _zlib_chunks(itertools.chain([head], chunks), zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)


def _bounded_brotli():
    """The ``brotli`` module when its decoder can bound its output (1.2+), else None."""
    try:
        import brotli
    except ImportError:
        return None
    return brotli if hasattr(brotli.Decompressor(), "can_accept_more_data") else None


def _brotli_chunks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    brotli = _bounded_brotli()
    if brotli is None:
        raise _Undecodable("br, which needs the brotli module (1.2 or later) to be read within bounds")
    d = brotli.Decompressor()
    try:
        for chunk in chunks:
            out = d.process(chunk, output_buffer_limit=DECODE_CHUNK)
            while out:  # output still held (with the input it kept): drained a piece at a time
                yield out
                out = d.process(b"", output_buffer_limit=DECODE_CHUNK)
    except brotli.error as e:
        raise _Undecodable(f"br: {e}") from None
    if not d.is_finished():
        raise _Undecodable("the compressed stream ends early")


class _ChunkFile:
    """A file-like ``read`` over an iterator of chunks (what zstandard's stream reader reads)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks, self._left = iter(chunks), b""

    def read(self, size: int = -1) -> bytes:
        if not self._left:
            self._left = next(self._chunks, b"")
        n = len(self._left) if size is None or size < 0 else size
        out, self._left = self._left[:n], self._left[n:]
        return out


def _zstd_chunks(chunks: Iterable[bytes]) -> Iterator[bytes]:
    try:
        import zstandard
    except ImportError:
        raise _Undecodable("zstd, which needs the zstandard module") from None
    reader = zstandard.ZstdDecompressor().stream_reader(_ChunkFile(chunks), read_size=DECODE_CHUNK,
                                                        read_across_frames=True)
    try:
        while out := reader.read(DECODE_CHUNK):
            yield out
    except zstandard.ZstdError as e:
        raise _Undecodable(f"zstd: {e}") from None


DECODERS = {"gzip": lambda c: _zlib_chunks(c, zlib.MAX_WBITS | 16), "x-gzip": lambda c: _zlib_chunks(c, zlib.MAX_WBITS | 16),
            "deflate": _deflate_chunks, "br": _brotli_chunks, "zstd": _zstd_chunks}


def decoded_chunks(raw: Iterable[bytes], codings: list[str]) -> Iterator[bytes]:
    """``raw`` (the body as sent) decoded through ``codings`` (Content-Encoding's, in the order
    applied), about DECODE_CHUNK bytes at most at once per coding; _Undecodable for a coding
    this client does not read."""
    codings = [c for c in (c.strip().lower() for c in codings) if c and c != "identity"]
    if len(codings) > MAX_CODINGS:
        raise _Undecodable(f"{len(codings)} stacked content codings")
    stream: Iterable[bytes] = raw
    for coding in reversed(codings):
        if coding not in DECODERS:
            raise _Undecodable(f"{coding[:40]!r}, a content coding this client does not read")
        stream = DECODERS[coding](stream)
    return iter(stream)


def read_capped(response: httpx.Response, limit: int) -> httpx.Response:
    """``response`` (opened with ``stream=True``) read whole if it is at most ``limit`` bytes,
    as sent and after content decoding (done here, a bounded piece at a time: never httpx's
    decoders, which decode a chunk whole), as a closed, fully read response; ResponseTooLarge
    otherwise, BadResponse when its content coding is not read here or does not decode."""
    try:
        codings = response.headers.get_list("content-encoding", split_commas=True)
        declared = response.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:  # (the bytes as sent: capped too)
            raise ResponseTooLarge(response.status_code, limit)
        sent = 0

        def raw() -> Iterator[bytes]:
            nonlocal sent
            # a transport that answers from memory (httpx.MockTransport) hands over a body read already
            pieces = [response.content] if response.is_stream_consumed else response.iter_raw()
            for chunk in pieces:
                sent += len(chunk)
                if sent > limit:  # a coding that decodes to little from endless input
                    raise ResponseTooLarge(response.status_code, limit)
                yield chunk

        chunks, size = [], 0
        body = raw()
        first = next(body, None)  # (an empty body has nothing to decode, whatever its coding)
        try:
            for chunk in decoded_chunks(itertools.chain([first], body), codings) if first else ():
                size += len(chunk)
                if size > limit:
                    raise ResponseTooLarge(response.status_code, limit)
                chunks.append(chunk)
        except _Undecodable as e:
            raise BadResponse(response.status_code, f"the server's answer cannot be read: {e}") from None
    finally:
        response.close()
    headers = [(k, v) for k, v in response.headers.multi_items()
               if k.lower() not in ("content-encoding", "content-length", "transfer-encoding")]
    return httpx.Response(response.status_code, headers=headers, content=b"".join(chunks),
                          request=response.request)


def json_object(response: httpx.Response) -> dict:
    """The answer's JSON object; BadResponse when it is not one."""
    try:
        body = response.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise BadResponse(response.status_code, "the server's answer is not a JSON object")
    return body


def _error(response: httpx.Response) -> ApiError:
    """The server's ``{"error": {"code", "message"}}`` (or OpenAI's shape) as an ApiError."""
    code, message = f"http_{response.status_code}", response.text[:500]
    try:
        err = response.json().get("error")
        if isinstance(err, dict):
            code = str(err.get("code") or err.get("type") or code)
            message = str(err.get("message") or message)
    except (ValueError, AttributeError):
        pass
    retry = (retry_after_seconds(response.headers.get("retry-after"))
             if response.status_code in BUSY_STATUSES else None)
    return ApiError(response.status_code, code, message, retry)


class Client:
    """A client of one server. ``busy_timeout``: the longest a call keeps retrying busy answers
    and refused connections (seconds); ``timeout``: httpx's per-request timeout (seconds);
    ``transport``: an httpx transport (tests)."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 300.0,
                 busy_timeout: float = 3600.0, transport: httpx.BaseTransport | None = None,
                 sleep: Callable[[float], None] = time.sleep,
                 max_response_bytes: int = MAX_RESPONSE_BYTES):
        headers = {"Accept-Encoding": ACCEPT_ENCODING}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self.base_url = base_url.rstrip("/")
        self.busy_timeout = busy_timeout
        self.max_response_bytes = max_response_bytes
        self.sleep = sleep
        self.retries = 0  # busy answers and refused connections retried so far (all threads)
        self._lock = threading.Lock()
        self._http = httpx.Client(base_url=self.base_url, headers=headers, transport=transport,
                                  timeout=httpx.Timeout(timeout, connect=10.0))

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # -- calls ----------------------------------------------------------------------------------

    def health(self) -> bool:
        """True when the server answers ``/healthz`` (raises httpx.HTTPError when unreachable)."""
        return self._send(self._http.build_request("GET", "/healthz")).status_code == 200

    def _send(self, request: httpx.Request) -> httpx.Response:
        """Send ``request`` and read its answer within the caps (an error's is smaller)."""
        response = self._http.send(request, stream=True)
        limit = self.max_response_bytes if response.is_success else MAX_ERROR_BYTES
        try:
            return read_capped(response, limit)
        except (ResponseTooLarge, BadResponse):
            if response.is_success:
                raise
            # an error's body cut off (or unreadable): its status is still the answer
            return httpx.Response(response.status_code, headers={
                k: v for k, v in response.headers.items() if k.lower() == "retry-after"},
                content=b"", request=request)

    def submit(self, audio: str | os.PathLike | bytes, options: Any = None, *,
               filename: str | None = None) -> str:
        """Upload ``audio`` (a path, streamed from disk, or bytes) with ``options`` (a
        TranscribeOptions or a mapping of the form fields: language, use_itn, ban_emo_unk,
        split_channels, word_timestamps, languages: a list or "zh,en"); the new job's id."""
        fields = _form(options)

        def post() -> httpx.Response:
            if isinstance(audio, (bytes, bytearray, memoryview)):
                files = {"file": (filename or "audio", bytes(audio), "application/octet-stream")}
                return self._send(self._http.build_request("POST", "/api/jobs", data=fields,
                                                           files=files))
            path = Path(audio)
            with path.open("rb") as f:  # reopened on each attempt: a retry sends it whole again
                files = {"file": (filename or path.name, f, "application/octet-stream")}
                return self._send(self._http.build_request("POST", "/api/jobs", data=fields,
                                                           files=files))

        response = self._call(post)
        job_id = json_object(response).get("id")
        if not isinstance(job_id, str) or not JOB_ID.match(job_id):
            raise BadResponse(response.status_code, f"the server's job id {str(job_id)[:80]!r} "
                              "is not an id")
        return job_id

    def get(self, job_id: str) -> dict:
        """The job's JSON (status, audio_seconds, result, error, ...)."""
        return json_object(self._call(
            lambda: self._send(self._http.build_request("GET", f"/api/jobs/{job_id}")),
            idempotent=True))

    def wait(self, job_id: str, timeout: float = 3600.0) -> dict:
        """Poll the job until it is done, failed or purged; its JSON. Raises :class:`WaitTimeout`
        after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        interval = POLL_FIRST_S
        while True:
            job = self.get(job_id)
            if job.get("status") in FINISHED:
                return job
            left = deadline - time.monotonic()
            if left <= 0:
                raise WaitTimeout(f"job {job_id} still {job.get('status')} after {timeout:g} s")
            self.sleep(min(interval, left))
            interval = min(interval * POLL_GROWTH, POLL_MAX_S)

    def result(self, job_id: str, format: str = "json", **params: Any) -> bytes:
        """The finished job's export as ``format`` (txt | json | srt | vtt); ``params`` are passed
        as query parameters (e.g. ``tags=False``)."""
        query = {"format": format, **{k: ("true" if v else "false") if isinstance(v, bool) else v
                                      for k, v in params.items()}}
        return self._call(lambda: self._send(self._http.build_request(
            "GET", f"/api/jobs/{job_id}/result", params=query)), idempotent=True).content

    # -- retries --------------------------------------------------------------------------------

    def _call(self, send: Callable[[], httpx.Response], idempotent: bool = False) -> httpx.Response:
        """``send()`` until it is not busy, retrying after Retry-After for at most busy_timeout.
        A request that was never sent whole (connection refused, a write cut off) cannot have
        created a job: retried for any call. Other transport errors (a reset while the answer
        was awaited) are retried only for ``idempotent`` calls: a POST the server may have
        accepted is not sent twice."""
        deadline = time.monotonic() + self.busy_timeout
        while True:
            try:
                response = send()
            except httpx.TransportError as e:
                retryable = idempotent or isinstance(e, _NOT_SENT)
                if not retryable or time.monotonic() + DEFAULT_RETRY_AFTER_S > deadline:
                    raise
                self._pause(DEFAULT_RETRY_AFTER_S)
                continue
            if response.is_success:
                return response
            error = _error(response)
            if error.retry_after is None or time.monotonic() + error.retry_after > deadline:
                raise error
            self._pause(error.retry_after)

    def _pause(self, seconds: float) -> None:
        with self._lock:
            self.retries += 1
        self.sleep(seconds)
