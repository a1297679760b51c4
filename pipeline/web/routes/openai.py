"""OpenAI-compatible speech to text: ``POST /v1/audio/transcriptions`` and ``GET /v1/models``.

Code written for OpenAI's API (the official ``openai`` clients, Open WebUI, LiteLLM, agent SDKs)
works unchanged with ``base_url="http://HOST:PORT/v1"``. A request is one job of the service,
through the same upload limits, decoding, queue and batching as ``POST /api/jobs`` (in the
interactive lane); the handler waits for it on the event loop, holding no thread, at most
``Settings.request_wait_s``, then answers as OpenAI does.

* **Form fields**: ``file`` (required), ``model`` (any id ``GET /v1/models`` lists:
  ``sensevoice-small``, or ``whisper-1``, an alias so that unchanged OpenAI code works; omitted =
  ``sensevoice-small``), ``language`` (ISO-639-1 ``zh`` ``en`` ``ja`` ``ko``, or ``yue``; a region
  such as ``en-US`` or an English name such as ``english`` is read too; ``auto`` or none = detect;
  a comma list such as ``zh,en`` is an allow-list: the language is detected only among those;
  any other 400), ``response_format`` (``json`` | ``text`` | ``srt`` | ``vtt`` |
  ``verbose_json``), ``timestamp_granularities[]`` (``segment`` | ``word``). ``prompt`` is read
  as hotwords when it is a list of short terms (items separated by commas, semicolons or lines,
  each at most 4 words and 40 characters, ``term`` or ``term:weight``, and no sentence
  punctuation: ``"Kubernetes, New York:3"``; :func:`pipeline.domain.hotwords.hotwords_from_prompt`);
  prose is ignored, as are ``temperature`` and OpenAI's other fields: SenseVoice takes no text
  prompt. ``stream=true`` is refused (400). SenseVoice's own extras:
  ``split_channels`` (a stereo call, one speaker per channel), ``use_itn`` and, on a mono
  recording, ``speakers`` (the count, 1-16) or ``diarize=true`` (the count found) to label each
  segment ``Speaker 1``, ``Speaker 2``, ...; ``redact`` (``pii`` or a comma list of card, phone,
  email, id, digits: masked before the result is stored, pipeline/domain/redaction.py; verbose_json
  then lists ``redactions``, kinds and times), which the OpenAI client sends with ``extra_body``.
* **Answers**: ``json`` ``{"text", "usage"}``; ``text`` the text (``text/plain``); ``srt`` and
  ``vtt`` subtitles cut at the word times (pipeline/domain/exports.py: 2 lines of 42 characters,
  7 s at most; no tags); ``verbose_json`` ``{"task": "transcribe", "language" (a name, e.g.
  "english", as OpenAI writes it), "duration", "text", "segments", "usage"}`` and ``"words"``
  when word granularity is asked. Each segment has OpenAI's fields (``tokens`` empty,
  ``temperature``, ``avg_logprob`` the mean log probability of its text tokens from the CTC
  posteriors (0 where not computed); ``no_speech_prob`` 1 for a no-speech
  segment, else 0; ``compression_ratio`` as Whisper computes it) and what SenseVoice knows:
  ``language`` (its code), ``emotion``, ``events``, the tags' probabilities
  (``language_probability``, ``emotion_probability``, ``event_probability``) where computed and,
  for split calls and speakers asked for, ``speaker``. Words are those of the CTC alignment, punctuation left out, each
  with Whisper's ``probability`` where computed. Word times are computed for word granularity
  and for srt/vtt.
* **Errors** in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, with the
  status and stable ``code`` of the REST API (pipeline/domain/errors.py); ``type`` is
  ``invalid_request_error`` (4xx), ``authentication_error`` (401), ``permission_error`` (403),
  ``not_found_error`` (404), ``rate_limit_error`` (429) or ``server_error`` (5xx). A job not done
  within ``request_wait_s`` is 504 ``job_wait_timeout``, naming the job (its result stays at
  ``GET /api/jobs/{id}``), and a failed job 500 with the job's error code; both say
  ``x-should-retry: false`` (the client would otherwise send the audio again). Back-pressure
  (503/429 + ``Retry-After``) is retried by the client. Refusals by the upload middleware under
  /v1/ have this shape too (pipeline/web/errors.py ``refusal_response``).
* **Auth**: the API token, when set, as ``Authorization: Bearer <token>`` (the client's
  ``api_key``) or ``X-API-Key``.
"""

from __future__ import annotations

import zlib
from collections import Counter
from typing import TYPE_CHECKING

from fastapi import APIRouter, Depends, File, Form, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline.domain.errors import InvalidOption, SenseVoiceError
from pipeline.domain.hotwords import hotwords_from_prompt
from pipeline.domain.tags import AUTO_LANGUAGE, LANGUAGE_TABLE, NO_SPEECH
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from pipeline.web.auth import require_token
from pipeline.web.errors import (NO_RETRY, HTTPError, openai_error_response, openai_storage_response,
                                 openai_validation_response)
from pipeline.web.submit import submit_upload, wait_finished

if TYPE_CHECKING:
    from pipeline.serving.intake import Intake
    from pipeline.serving.job_view import JobView

MODELS = ("sensevoice-small", "whisper-1")  # the first is the model; the others are aliases
MODEL_CREATED = 1720051200  # unix seconds: SenseVoiceSmall's release (2024-07-04)
RESPONSE_FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
GRANULARITIES = ("segment", "word")
LANGUAGE_NAMES = {lang.code: lang.english.lower()  # as OpenAI names them: "english"
                  for lang in LANGUAGE_TABLE if lang.code != NO_SPEECH}
LANGUAGES = {AUTO_LANGUAGE: AUTO_LANGUAGE, "zh-yue": "yue", **{code: code for code in LANGUAGE_NAMES},
             **{name: code for code, name in LANGUAGE_NAMES.items()}}


class InvalidParam(InvalidOption):
    """A form field OpenAI's API would refuse (400), naming it as OpenAI's ``param``."""

    def __init__(self, message: str, param: str, code: str = InvalidOption.code):
        super().__init__(message)
        self.param = param
        self.code = code


class ModelNotFound(SenseVoiceError):
    status = 404
    code = "model_not_found"


class JobWaitTimeout(SenseVoiceError):
    """The job did not finish within ``request_wait_s`` (it goes on; its result stays readable)."""

    status = 504
    code = "job_wait_timeout"


class JobFailedError(SenseVoiceError):
    """The job failed (its own error code and message)."""

    status = 500

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code


class OpenAIRoute(APIRoute):
    """A route whose every error (the token, the form's validation, the service's errors) is
    answered in OpenAI's shape, not the REST API's."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except SenseVoiceError as e:
                no_retry = NO_RETRY if e.status in (500, 504) else None
                return openai_error_response(e, headers=no_retry)
            except RequestValidationError as e:
                return openai_validation_response(e)
            except StarletteHTTPException as e:
                if isinstance(e.__cause__, OSError):  # the body could not be spooled (a full disk)
                    return openai_storage_response(e.__cause__)
                code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code,
                                                                          "invalid_request")
                return openai_error_response(HTTPError(e.status_code, code, str(e.detail)))
            except OSError as e:
                return openai_storage_response(e)

        return route


def model_card(model_id: str) -> dict:
    return {"id": model_id, "object": "model", "created": MODEL_CREATED, "owned_by": "sensevoice"}


def sensevoice_language(value: str | None) -> str:
    """An OpenAI ``language`` as a SenseVoice language (InvalidParam if it names none)."""
    text = (value or "").strip().lower().replace("_", "-")
    if not text:
        return AUTO_LANGUAGE
    code = LANGUAGES.get(text) or LANGUAGES.get(text.split("-")[0])  # "en-US": en
    if code is None:
        raise InvalidParam(f"language {value[:40]!r} is not one SenseVoice knows; use one of "
                           f"{', '.join(sorted(c for c in LANGUAGES if len(c) <= 3))} "
                           "(ISO-639-1, or yue), or auto", param="language")
    return code


def sensevoice_languages(value: str | None) -> tuple[str, tuple[str, ...]]:
    """An OpenAI ``language`` as (the prompt's language, the allow-list): one name is the
    prompt's language; a comma list (``zh,en``) detects among those (auto, allow-list)."""
    parts = [p for p in (value or "").split(",") if p.strip()]
    if len(parts) <= 1:
        return sensevoice_language(value), ()
    codes = tuple(dict.fromkeys(sensevoice_language(p) for p in parts if p.strip().lower() != AUTO_LANGUAGE))
    if len(codes) == 1:
        return codes[0], ()
    return AUTO_LANGUAGE, codes


def _model(value: str | None) -> str:
    name = (value or MODELS[0]).strip()
    if name.lower() not in MODELS:
        raise InvalidParam(f"the model {name[:60]!r} does not exist here; use one of "
                           f"{', '.join(MODELS)}", param="model", code="model_not_found")
    return name


def _granularities(values: list[str]) -> set[str]:
    asked = {v.strip().lower() for v in values if v.strip()}
    unknown = asked - set(GRANULARITIES)
    if unknown:
        raise InvalidParam(f"unknown timestamp granularity {sorted(unknown)[0][:40]!r}; use "
                           f"{' or '.join(GRANULARITIES)}", param="timestamp_granularities[]")
    return asked


def compression_ratio(text: str) -> float:
    """As Whisper computes it: UTF-8 bytes over their zlib-compressed bytes."""
    data = text.encode("utf-8")
    return round(len(data) / len(zlib.compress(data)), 4) if data else 0.0


def detected_language(job: Job) -> str:
    """The language to report: the one asked for, else the segments' (by the length of their
    text), as OpenAI names it ("english")."""
    code = job.options.language
    if code == AUTO_LANGUAGE:
        weights = Counter()
        for seg in job.result.segments if job.result else ():
            weights[seg.language] += len(seg.text) + 1
        code = weights.most_common(1)[0][0] if weights else ""
    return LANGUAGE_NAMES.get(code, code or "unknown")


def verbose_json(job: Job, words: bool) -> dict:
    """OpenAI's ``verbose_json``, with each segment's SenseVoice tags (see the module docstring)."""
    from pipeline.domain.exports import redaction_list, segment_spans

    result = job.result
    spans = segment_spans(result, job.audio_seconds)
    segments = []
    for n, (seg, (start, end)) in enumerate(zip(result.segments, spans)):
        item = {"id": n, "seek": round(start * 100), "start": start, "end": end, "text": seg.text,
                "tokens": [], "temperature": 0.0,
                "avg_logprob": seg.avg_logprob if seg.avg_logprob is not None else 0.0,
                "compression_ratio": compression_ratio(seg.text),
                "no_speech_prob": 1.0 if seg.language == NO_SPEECH else 0.0,
                "language": seg.language, "emotion": seg.emotion, "events": list(seg.events)}
        for key in ("language_probability", "emotion_probability", "event_probability"):
            if getattr(seg, key) is not None:
                item[key] = getattr(seg, key)
        if seg.speaker is not None:
            item["speaker"] = seg.speaker
        segments.append(item)
    body = {"task": "transcribe", "language": detected_language(job),
            "duration": round(job.audio_seconds, 3), "text": result.text, "segments": segments,
            "usage": _usage(job)}
    if job.options.redact:  # what was masked: kinds and times, never the values
        body["redactions"] = redaction_list(result)
    if words:
        body["words"] = [{"word": w.text, "start": w.start, "end": w.end,
                          **({"probability": w.probability} if w.probability is not None else {})}
                         for seg in result.segments for w in seg.words
                         if any(ch.isalnum() for ch in w.text)]
    return body


def _usage(job: Job) -> dict:
    return {"type": "duration", "seconds": round(job.audio_seconds, 3)}


def render(job: Job, response_format: str, granularities: set[str]) -> Response:
    """The answer for a finished job (CPU work for a long transcript: call in the thread pool)."""
    from pipeline.domain.exports import export

    result = job.result
    if response_format == "json":
        return JSONResponse({"text": result.text, "usage": _usage(job)})
    if response_format == "text":
        return PlainTextResponse(result.text + "\n")
    if response_format == "verbose_json":
        return JSONResponse(verbose_json(job, "word" in granularities))
    body, media = export(result, response_format, job_meta={"audio_seconds": job.audio_seconds})
    return Response(body, media_type=media)


def build_openai_router(settings, intake: Intake, view: JobView) -> APIRouter:
    router = APIRouter(route_class=OpenAIRoute)
    auth = [Depends(require_token(settings.server.token))]

    @router.get("/v1/models", dependencies=auth)
    async def list_models():
        """The model ids ``model`` accepts (OpenAI's list shape)."""
        return {"object": "list", "data": [model_card(m) for m in MODELS]}

    @router.get("/v1/models/{model_id}", dependencies=auth)
    async def get_model(model_id: str):
        if model_id.lower() not in MODELS:
            raise ModelNotFound(f"the model {model_id[:60]!r} does not exist here")
        return model_card(model_id.lower())

    @router.post("/v1/audio/transcriptions", dependencies=auth)
    async def transcriptions(
            request: Request,
            file: UploadFile = File(...),
            model: str | None = Form(None),
            language: str | None = Form(None),
            prompt: str | None = Form(None),  # hotwords when a list of short terms, else ignored
            response_format: str = Form("json"),
            temperature: str | None = Form(None),  # accepted, ignored (greedy decoding)
            granularities: list[str] = Form([], alias="timestamp_granularities[]"),
            granularities_plain: list[str] = Form([], alias="timestamp_granularities"),
            stream: str | None = Form(None),
            split_channels: bool = Form(False),
            use_itn: bool = Form(True),
            speakers: str = Form(""),  # the count on a mono recording (1-16); "" or 0: off
            diarize: bool = Form(False),  # speakers labelled, their count found
            redact: str = Form("")):  # personal data masked: "pii" or a comma list of kinds
        """Transcribe one file and answer when it is done (OpenAI's API; see the module
        docstring for the fields and answers)."""
        _model(model)
        if response_format not in RESPONSE_FORMATS:
            raise InvalidParam(f"unknown response_format {response_format[:40]!r}; use one of "
                               f"{', '.join(RESPONSE_FORMATS)}", param="response_format")
        asked = _granularities(granularities + granularities_plain)
        if (stream or "").strip().lower() in ("true", "1"):
            raise InvalidParam("streaming is not supported here; send stream=false",
                               param="stream")
        prompt_language, allowed = sensevoice_languages(language)
        options = TranscribeOptions(
            language=prompt_language, languages=allowed, use_itn=use_itn,
            split_channels=split_channels, hotwords=hotwords_from_prompt(prompt),
            speakers=speakers, diarize=diarize, redact=redact,
            word_timestamps="word" in asked or response_format in ("srt", "vtt"))
        job = await submit_upload(request, intake, file, options, Lane.INTERACTIVE)
        waited = settings.limits.request_wait_s
        job = await wait_finished(view, job.id, waited)
        if job.state is JobState.FAILED or (job.state is JobState.DONE and job.result is None):
            error = job.error
            raise JobFailedError(error.code if error else "job_failed",
                                 f"job {job.id} failed: {error.message if error else 'no result'}")
        if job.state is not JobState.DONE:
            raise JobWaitTimeout(
                f"job {job.id} did not finish within {waited:g} s (it is {job.state.value}); "
                f"it goes on: its result will be at GET /api/jobs/{job.id}")
        return await run_in_threadpool(render, job, response_format, asked)

    @router.api_route("/v1/{rest:path}", methods=["GET", "POST", "PUT", "PATCH", "DELETE"],
                      include_in_schema=False)
    async def not_found(rest: str):
        raise HTTPError(404, "not_found", f"no route /v1/{rest[:100]} here (this server has "
                         "/v1/audio/transcriptions and /v1/models)")

    return router
