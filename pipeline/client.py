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
* ``token`` is sent as ``Authorization: Bearer <token>``, as the server (and OpenAI's client) expect.
* httpx and the standard library only (no torch): a laptop can feed a remote GPU server.
  Thread-safe: one client may serve many threads (httpx's connection pool).

Written by hand because the API is four calls; an OpenAPI generator would bring more code than that.
"""

from __future__ import annotations

import dataclasses
import email.utils
import os
import threading
import time
from collections.abc import Mapping
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


# transport errors raised before the request was sent whole: the server has no job from it
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout, httpx.WriteError,
             httpx.WriteTimeout)


class ApiError(Exception):
    """The server refused a call: ``status`` (HTTP), ``code`` (stable, e.g. ``unsupported_media``),
    ``message``; ``retry_after`` (seconds) for busy answers, else ``None``."""

    def __init__(self, status: int, code: str, message: str, retry_after: float | None = None):
        super().__init__(f"{code}: {message}")
        self.status, self.code, self.message, self.retry_after = status, code, message, retry_after


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
    return {k: ("true" if v else "false") if isinstance(v, bool) else str(v)
            for k, v in options.items() if v is not None}


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
                 sleep: Callable[[float], None] = time.sleep):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.base_url = base_url.rstrip("/")
        self.busy_timeout = busy_timeout
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
        return self._http.get("/healthz").status_code == 200

    def submit(self, audio: str | os.PathLike | bytes, options: Any = None, *,
               filename: str | None = None) -> str:
        """Upload ``audio`` (a path, streamed from disk, or bytes) with ``options`` (a
        TranscribeOptions or a mapping of the form fields: language, use_itn, ban_emo_unk,
        split_channels, word_timestamps); the new job's id."""
        fields = _form(options)

        def post() -> httpx.Response:
            if isinstance(audio, (bytes, bytearray, memoryview)):
                files = {"file": (filename or "audio", bytes(audio), "application/octet-stream")}
                return self._http.post("/api/jobs", data=fields, files=files)
            path = Path(audio)
            with path.open("rb") as f:  # reopened on each attempt: a retry sends it whole again
                files = {"file": (filename or path.name, f, "application/octet-stream")}
                return self._http.post("/api/jobs", data=fields, files=files)

        return str(self._call(post).json()["id"])

    def get(self, job_id: str) -> dict:
        """The job's JSON (status, audio_seconds, result, error, ...)."""
        return self._call(lambda: self._http.get(f"/api/jobs/{job_id}"), idempotent=True).json()

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
        return self._call(lambda: self._http.get(f"/api/jobs/{job_id}/result", params=query),
                          idempotent=True).content

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
