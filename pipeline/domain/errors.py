"""Domain errors a user can meet. Each carries an HTTP status, a stable code, the WebSocket close
code a live stream ends with after its error frame, and a clear message.

Library errors (PyAV, torch, sqlite) are translated into these at the module boundary. A job that
fails stores the ``code`` of one of the :class:`JobFailed` classes (its ``error.code`` in the JSON
every client reads); the HTTP and WebSocket layers ask the error for its status and close code.
"""

from __future__ import annotations

import enum


class WsClose(enum.IntEnum):
    """WebSocket close codes (RFC 6455 7.4.1)."""

    NORMAL = 1000
    GOING_AWAY = 1001
    UNSUPPORTED_DATA = 1003  # a frame the protocol does not take
    POLICY_VIOLATION = 1008  # the client's request is refused (4xx)
    MESSAGE_TOO_BIG = 1009
    INTERNAL_ERROR = 1011  # the server failed (5xx)
    TRY_AGAIN_LATER = 1013  # back-pressure: nothing is wrong with the request


class SenseVoiceError(Exception):
    """Base class: ``status`` is the HTTP status, ``code`` a stable machine-readable name,
    ``close_code`` the WebSocket close code after the error frame of a live stream."""

    status: int = 500
    code: str = "internal_error"
    close_code: int = WsClose.INTERNAL_ERROR

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class AudioDecodeError(SenseVoiceError):
    """The upload is not audio we can decode (not a media file, truncated, unknown codec)."""

    status = 415
    code = "unsupported_media"
    close_code = WsClose.POLICY_VIOLATION


class DecoderCrashed(AudioDecodeError):
    """The decoder process died on this upload (a crafted or badly damaged file)."""

    code = "decoder_crashed"


class DecodeTimeout(AudioDecodeError):
    """Decoding this upload ran past the decode timeout (a crafted or badly damaged file)."""

    code = "decode_timeout"


class NoAudioStream(SenseVoiceError):
    """A media container that holds no audio track (e.g. a silent video)."""

    status = 400
    code = "no_audio_stream"
    close_code = WsClose.POLICY_VIOLATION


class EmptyAudio(SenseVoiceError):
    """Decoding succeeded but produced no (or too few) samples."""

    status = 400
    code = "empty_audio"
    close_code = WsClose.POLICY_VIOLATION


class AudioTooLong(SenseVoiceError):
    """The decoded duration exceeds the configured cap."""

    status = 413
    code = "audio_too_long"
    close_code = WsClose.POLICY_VIOLATION


class UploadTooLarge(SenseVoiceError):
    """The upload exceeds the byte cap."""

    status = 413
    code = "upload_too_large"
    close_code = WsClose.POLICY_VIOLATION


class InvalidOption(SenseVoiceError):
    """A request option (language, flags) is not valid."""

    status = 400
    code = "invalid_option"
    close_code = WsClose.POLICY_VIOLATION


class Busy(SenseVoiceError):
    """Back-pressure (503): nothing is wrong with the request; try again after ``retry_after`` s."""

    status = 503
    close_code = WsClose.TRY_AGAIN_LATER
    retry_after: int = 1  # seconds, sent as Retry-After

    def __init__(self, message: str, retry_after: int | None = None):
        super().__init__(message)
        if retry_after is not None:
            self.retry_after = retry_after


class QueueFull(Busy):
    """The bounded queue is full."""

    code = "queue_full"


class TooManyUploads(Busy):
    """The most uploads the server receives at once are in progress."""

    code = "too_many_uploads"


class MemoryPressure(Busy):
    """GPU admission control: free device memory is under the threshold."""

    code = "gpu_memory_low"
    retry_after = 5


class NotReady(SenseVoiceError):
    """The model is still loading / warming up, or the worker is unhealthy."""

    status = 503
    code = "not_ready"
    close_code = WsClose.TRY_AGAIN_LATER


class JobNotFound(SenseVoiceError):
    """No job with this id exists."""

    status = 404
    code = "job_not_found"
    close_code = WsClose.POLICY_VIOLATION


class JobGone(SenseVoiceError):
    """The job existed but its result and audio were purged after the retention period."""

    status = 410
    code = "job_purged"
    close_code = WsClose.POLICY_VIOLATION


class ResultNotReady(SenseVoiceError):
    """An export was asked for before the job finished (or of a failed job)."""

    status = 409
    code = "result_not_ready"
    close_code = WsClose.POLICY_VIOLATION


class JobUnfinished(SenseVoiceError):
    """A queued or running job was asked to be deleted or kept: only a finished job (done or
    failed) is; wait for its end (its events or a poll), then ask again."""

    status = 409
    code = "job_not_finished"
    close_code = WsClose.POLICY_VIOLATION


class AudioGone(SenseVoiceError):
    """The recording was deleted (done-and-delete setting, or retention)."""

    status = 410
    code = "audio_deleted"
    close_code = WsClose.POLICY_VIOLATION


class AudioUnreadable(SenseVoiceError, ValueError):
    """A job's stored recording is there but cannot be read back (a damaged file in the shared
    directory, or a file this process's settings cannot reach): the server's fault, logged.
    Also a ValueError, as a malformed stored value always was."""

    status = 500
    code = "audio_unreadable"


class Unauthorized(SenseVoiceError):
    """A REST call without the configured API token."""

    status = 401
    code = "unauthorized"
    close_code = WsClose.POLICY_VIOLATION


class ModelUnavailable(SenseVoiceError):
    """The model cannot be loaded (hub unreachable, missing files, config mismatch)."""

    status = 503
    code = "model_unavailable"


class DecoderOutOfMemory(AudioDecodeError):
    """Decoding this upload needed more memory than a decoder process may have."""

    status = 413
    code = "decoder_out_of_memory"


class StorageFull(SenseVoiceError):
    """The server's disk (or its file-size limit) is full: the upload could not be stored."""

    status = 507
    code = "storage_full"


class StorageError(Busy):
    """The job could not be stored for another I/O reason (try again)."""

    code = "storage_error"
    retry_after = 5


class BacklogFull(Busy):
    """Too many long recordings (jobs or audio hours) are waiting to be split and run."""

    code = "backlog_full"
    retry_after = 30


class ClientUploadLimit(Busy):
    """This client already has the most uploads in flight that one client may have."""

    status = 429
    code = "too_many_uploads_from_client"


class ClientBatchLimit(ClientUploadLimit):
    """This client already has the most batches (POST /api/batches) in progress one client may have."""

    code = "too_many_batches_from_client"


class EventStreamsFull(Busy):
    """A job has the most event streams (GET /api/jobs/{id}/events) one job may have."""

    code = "event_streams_full"
    retry_after = 5


class ClientEventStreamLimit(SenseVoiceError):
    """This client address holds the most event streams one client may hold."""

    status = 429
    code = "too_many_event_streams_from_client"
    close_code = WsClose.POLICY_VIOLATION


class TooManyExports(Busy):
    """The server builds the most CSV exports of the calls table it builds at once."""

    code = "too_many_exports"
    retry_after = 5


class ClientExportLimit(Busy):
    """This client address has the most CSV exports in progress that one client may have."""

    status = 429
    code = "too_many_exports_from_client"
    retry_after = 5


class ReadOnlyLink(SenseVoiceError):
    """A job's download link (or page link) was used to change the job: it opens reads only."""

    status = 403
    code = "read_only_link"
    close_code = WsClose.POLICY_VIOLATION


class LinkExpired(SenseVoiceError):
    """A signed link this server gave out has expired (not a failed sign-in: it is not counted)."""

    status = 410
    code = "link_expired"
    close_code = WsClose.POLICY_VIOLATION


class UnsafeDirectory(SenseVoiceError):
    """A directory the service writes private files to may be read or written by another user."""

    status = 500
    code = "unsafe_directory"


class TooManyAuthFailures(SenseVoiceError):
    """This client address failed to sign in too often; it waits until its window ends."""

    status = 429
    code = "too_many_auth_failures"
    close_code = WsClose.POLICY_VIOLATION


class RequestTimeout(SenseVoiceError):
    """The request body did not arrive in time (too slow, or stalled)."""

    status = 408
    code = "request_timeout"
    close_code = WsClose.POLICY_VIOLATION


class HeadersTooLarge(SenseVoiceError):
    """The request line and headers are larger than the server reads."""

    status = 431
    code = "headers_too_large"
    close_code = WsClose.POLICY_VIOLATION


class AmbiguousRequest(SenseVoiceError):
    """A request whose body could be read two ways (two Content-Type headers, a parameter of it
    given twice, two Content-Length or Transfer-Encoding headers): a proxy reading one way would
    inspect a different body than this server reads."""

    status = 400
    code = "ambiguous_request"
    close_code = WsClose.POLICY_VIOLATION


class HostNotAllowed(SenseVoiceError):
    """The Host header names a host this server does not answer for (DNS-rebinding defence)."""

    status = 400
    code = "host_not_allowed"
    close_code = WsClose.POLICY_VIOLATION


class CrossSiteRequest(SenseVoiceError):
    """A browser request from another site that would change state (CSRF defence)."""

    status = 403
    code = "cross_site_request"
    close_code = WsClose.POLICY_VIOLATION


class PathRefused(SenseVoiceError):
    """A client named a server file that is not one of its own uploads."""

    status = 403
    code = "path_refused"
    close_code = WsClose.POLICY_VIOLATION


class BrokerUnavailable(Busy):
    """The broker (Redis) cannot be reached: nothing was accepted; try again."""

    code = "broker_unavailable"
    retry_after = 5


# ---------------------------------------------------------------------------- live captions
class TooManyStreams(Busy):
    """The server holds the most live caption streams it serves at once."""

    code = "too_many_streams"
    retry_after = 5


class LiveAtCapacity(TooManyStreams):
    """The live lane is at the load it keeps its latency under: a new stream must wait (its
    close code is TooManyStreams': 1013, try again later)."""

    code = "live_at_capacity"
    retry_after = 5


class LiveOverloaded(Busy):
    """A live stream's audio arrives faster than the server transcribes it, for too long."""

    code = "live_overloaded"


class IdleTimeout(SenseVoiceError):
    """A live stream sent nothing for too long."""

    status = 408
    code = "idle_timeout"
    close_code = WsClose.POLICY_VIOLATION


class FrameTooLarge(SenseVoiceError):
    """A live stream's frame is larger than the server takes."""

    status = 413
    code = "frame_too_large"
    close_code = WsClose.MESSAGE_TOO_BIG


class StreamTooLong(SenseVoiceError):
    """A live stream reached the longest audio one stream may send."""

    status = 413
    code = "stream_too_long"
    close_code = WsClose.POLICY_VIOLATION


class StreamTimeLimit(SenseVoiceError):
    """A live stream was open for the longest time one stream may be (wall clock, whatever it
    sent: a stream trickling a little audio never reaches the audio limit)."""

    status = 408
    code = "stream_time_limit"
    close_code = WsClose.POLICY_VIOLATION


class QuietStreamYielded(Busy):
    """Every live slot was held and a new stream asked for one: this stream, which sent almost
    no speech lately, was closed to give it its slot."""

    code = "quiet_stream_yielded"
    retry_after = 5


class InvalidMessage(SenseVoiceError):
    """A live stream's text frame is not one of the protocol's messages."""

    status = 400
    code = "invalid_message"
    close_code = WsClose.UNSUPPORTED_DATA


class LiveWorkerLost(SenseVoiceError):
    """Distributed topology: the worker decoding a live stream's audio stopped (killed, crashed)
    and no other worker could take the re-decode over; a new stream is served by a live one."""

    status = 503
    code = "live_worker_lost"
    close_code = WsClose.TRY_AGAIN_LATER


class LiveDecodeFailed(SenseVoiceError):
    """The model failed on a live stream's audio (the worker logged why)."""

    status = 500
    code = "decode_failed"


# ---------------------------------------------------------------------------- failed jobs
class JobFailed(SenseVoiceError):
    """An accepted job ended failed: its ``code`` and ``message`` are stored with the job (the
    ``error`` of its JSON), never raised to the client that submitted it."""

    code = "internal_error"


class WorkerFailed(JobFailed):
    """A bug in the worker while it ran or stored this job's batch (the worker goes on)."""


class DeviceFailed(JobFailed):
    """The GPU failed (a fatal device error): the worker stops and is restarted."""

    code = "device_error"


class InferenceFailed(JobFailed):
    """The model failed on this job's audio."""

    code = "inference_error"


class OutOfDeviceMemory(JobFailed):
    """The GPU ran out of memory on this clip alone (a batch is halved before that)."""

    code = "out_of_memory"


class QueueTimeout(JobFailed):
    """The job waited in the queue longer than the queue timeout."""

    code = "queue_timeout"


class AudioLost(JobFailed):
    """The job's stored audio could not be read back (spool or broker)."""

    code = "audio_lost"


class TooManyAttempts(JobFailed):
    """The job was interrupted (its worker died) too many times while running: given up."""

    code = "too_many_attempts"


class SegmentationFailed(JobFailed):
    """Splitting a long recording into speech pieces failed."""

    code = "segmentation_failed"
