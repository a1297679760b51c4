"""Each error class carries its stable code, HTTP status and WebSocket close code: the JSON and the
close frames clients see. The table is the contract (it was read off the clients' view before the
codes moved into the classes); a new error class must be added here, with its codes chosen."""

from __future__ import annotations

import pytest

from pipeline.domain import errors
from pipeline.domain.errors import SenseVoiceError, WsClose

# class: (code, HTTP status, WebSocket close code)
CONTRACT = {
    "AudioDecodeError": ("unsupported_media", 415, 1008),
    "AudioGone": ("audio_deleted", 410, 1008),
    "AudioUnreadable": ("audio_unreadable", 500, 1011),
    "AudioTooLong": ("audio_too_long", 413, 1008),
    "BacklogFull": ("backlog_full", 503, 1013),
    "BrokerUnavailable": ("broker_unavailable", 503, 1013),
    "Busy": ("internal_error", 503, 1013),
    "ClientEventStreamLimit": ("too_many_event_streams_from_client", 429, 1008),
    "ClientUploadLimit": ("too_many_uploads_from_client", 429, 1013),
    "ClientBatchLimit": ("too_many_batches_from_client", 429, 1013),
    "ClientExportLimit": ("too_many_exports_from_client", 429, 1013),
    "CrossSiteRequest": ("cross_site_request", 403, 1008),
    "DecodeTimeout": ("decode_timeout", 415, 1008),
    "DecoderCrashed": ("decoder_crashed", 415, 1008),
    "DecoderOutOfMemory": ("decoder_out_of_memory", 413, 1008),
    "EmptyAudio": ("empty_audio", 400, 1008),
    "EventStreamsFull": ("event_streams_full", 503, 1013),
    "FrameTooLarge": ("frame_too_large", 413, 1009),
    "HeadersTooLarge": ("headers_too_large", 431, 1008),
    "HostNotAllowed": ("host_not_allowed", 400, 1008),
    "AmbiguousRequest": ("ambiguous_request", 400, 1008),
    "IdleTimeout": ("idle_timeout", 408, 1008),
    "InvalidMessage": ("invalid_message", 400, 1003),
    "InvalidOption": ("invalid_option", 400, 1008),
    "JobGone": ("job_purged", 410, 1008),
    "JobNotFound": ("job_not_found", 404, 1008),
    "LinkExpired": ("link_expired", 410, 1008),
    "LiveDecodeFailed": ("decode_failed", 500, 1011),
    "LiveAtCapacity": ("live_at_capacity", 503, 1013),
    "LiveOverloaded": ("live_overloaded", 503, 1013),
    "LiveWorkerLost": ("live_worker_lost", 503, 1013),
    "MemoryPressure": ("gpu_memory_low", 503, 1013),
    "ModelUnavailable": ("model_unavailable", 503, 1011),
    "NoAudioStream": ("no_audio_stream", 400, 1008),
    "NotReady": ("not_ready", 503, 1013),
    "PathRefused": ("path_refused", 403, 1008),
    "QueueFull": ("queue_full", 503, 1013),
    "ReadOnlyLink": ("read_only_link", 403, 1008),
    "RequestTimeout": ("request_timeout", 408, 1008),
    "ResultNotReady": ("result_not_ready", 409, 1008),
    "JobUnfinished": ("job_not_finished", 409, 1008),
    "SenseVoiceError": ("internal_error", 500, 1011),
    "StorageError": ("storage_error", 503, 1013),
    "StorageFull": ("storage_full", 507, 1011),
    "StreamTooLong": ("stream_too_long", 413, 1008),
    "StreamTimeLimit": ("stream_time_limit", 408, 1008),
    "QuietStreamYielded": ("quiet_stream_yielded", 503, 1013),
    "TooManyAuthFailures": ("too_many_auth_failures", 429, 1008),
    "TooManyExports": ("too_many_exports", 503, 1013),
    "TooManyStreams": ("too_many_streams", 503, 1013),
    "TooManyUploads": ("too_many_uploads", 503, 1013),
    "Unauthorized": ("unauthorized", 401, 1008),
    "UnsafeDirectory": ("unsafe_directory", 500, 1011),
    "UploadTooLarge": ("upload_too_large", 413, 1008),
    # the codes a failed job stores (its JSON's error.code); never raised to a client
    "JobFailed": ("internal_error", 500, 1011),
    "WorkerFailed": ("internal_error", 500, 1011),
    "DeviceFailed": ("device_error", 500, 1011),
    "InferenceFailed": ("inference_error", 500, 1011),
    "OutOfDeviceMemory": ("out_of_memory", 500, 1011),
    "QueueTimeout": ("queue_timeout", 500, 1011),
    "AudioLost": ("audio_lost", 500, 1011),
    "TooManyAttempts": ("too_many_attempts", 500, 1011),
    "SegmentationFailed": ("segmentation_failed", 500, 1011),
}


def _classes() -> dict[str, type[SenseVoiceError]]:
    return {name: cls for name, cls in vars(errors).items()
            if isinstance(cls, type) and issubclass(cls, SenseVoiceError)}


def test_every_error_class_is_in_the_contract():
    assert sorted(_classes()) == sorted(CONTRACT)


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_each_class_carries_its_codes(name):
    e = _classes()[name]("a message")
    assert (e.code, e.status, int(e.close_code)) == CONTRACT[name]
    assert e.message == str(e) == "a message"


def test_close_codes_are_rfc_6455_codes():
    assert {int(c) for c in WsClose} == {1000, 1001, 1003, 1008, 1009, 1011, 1013}
    for cls in _classes().values():
        assert isinstance(cls.close_code, WsClose)


def test_job_failure_codes_are_distinct():
    """A failed job's code names one cause (WorkerFailed keeps the base's internal_error)."""
    failures = [c for c in _classes().values() if issubclass(c, errors.JobFailed)]
    codes = [c.code for c in failures if c is not errors.WorkerFailed]
    assert len(codes) == len(set(codes))
