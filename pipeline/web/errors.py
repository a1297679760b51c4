"""How errors reach a client: the REST API's JSON ``{"error": {"code", "message"}}`` with the
error's status (Retry-After for back-pressure), and the same errors in OpenAI's shape under /v1/
(``{"error": {"message", "type", "param", "code"}}``) -- for the routes, the exception handlers and
the middleware that answers before the app."""

from __future__ import annotations

import logging

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from pipeline.domain.errors import (AudioDecodeError, AudioTooLong, Busy, EmptyAudio, NoAudioStream,
                                    SenseVoiceError, UploadTooLarge)
from pipeline.serving.records import storage_error

logger = logging.getLogger("sensevoice.api")

def error_response(status: int, code: str, message: str, headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"code": code, "message": message}}, status_code=status,
                        headers=headers)


def domain_response(e: SenseVoiceError) -> JSONResponse:
    """The answer to a domain error (back-pressure ones with Retry-After), for the exception
    handler and for middleware that answers before the app."""
    headers = {"Retry-After": str(e.retry_after)} if isinstance(e, Busy) else None
    return error_response(e.status, e.code, e.message, headers)


OPENAI_PREFIX = "/v1/"  # the OpenAI-compatible routes (pipeline/web/routes/openai.py)

def refusal_response(scope, e: SenseVoiceError) -> JSONResponse:
    """:func:`domain_response` for middleware, in OpenAI's error shape under /v1/ (so that the
    OpenAI clients read the refusals of uploads there as they read the routes' own errors)."""
    if scope.get("path", "").startswith(OPENAI_PREFIX):
        return openai_error_response(e)
    return domain_response(e)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(SenseVoiceError)
    async def _domain(_request: Request, e: SenseVoiceError):
        return domain_response(e)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, e: StarletteHTTPException):
        if isinstance(e.__cause__, OSError):  # FastAPI's "error parsing the body" over a failed write
            return await _storage(_request, e.__cause__)
        code = {404: "not_found", 405: "method_not_allowed"}.get(e.status_code, "invalid_request")
        return error_response(e.status_code, code, str(e.detail), getattr(e, "headers", None))

    @app.exception_handler(OSError)
    async def _storage(_request: Request, e: OSError):
        # a write that failed below our own code (the multipart parser spooling a large upload to
        # a temporary file on a full disk): JSON 507/503, not a plain-text 500
        logger.error("I/O error while handling a request: %s", e)
        return domain_response(storage_error(e))

    @app.exception_handler(RequestValidationError)
    async def _validation(_request: Request, e: RequestValidationError):
        parts = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors())
        return error_response(400, "invalid_request", parts or "invalid request")


# ---------------------------------------------------------------- OpenAI's shape (/v1/)
ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error",
               429: "rate_limit_error"}
FILE_ERRORS = (AudioDecodeError, NoAudioStream, EmptyAudio, AudioTooLong, UploadTooLarge)
NO_RETRY = {"x-should-retry": "false"}  # OpenAI clients obey it (a retry would upload again)


def error_type(status: int) -> str:
    if status >= 500:
        return "server_error"
    return ERROR_TYPES.get(status, "invalid_request_error")


def openai_error_response(e: SenseVoiceError, param: str | None = None,
                          headers: dict | None = None) -> JSONResponse:
    """``e`` as OpenAI answers errors: ``{"error": {"message", "type", "param", "code"}}``, the
    status of ``e``, Retry-After for back-pressure."""
    headers = dict(headers or {})
    if isinstance(e, Busy):
        headers["Retry-After"] = str(e.retry_after)
    if param is None:
        param = getattr(e, "param", None) or ("file" if isinstance(e, FILE_ERRORS) else None)
    body = {"message": e.message, "type": error_type(e.status), "param": param, "code": e.code}
    return JSONResponse({"error": body}, status_code=e.status, headers=headers or None)


class HTTPError(SenseVoiceError):
    def __init__(self, status: int, code: str, message: str):
        super().__init__(message)
        self.status, self.code = status, code


def openai_validation_response(e: RequestValidationError) -> JSONResponse:
    errors = e.errors()
    loc = [str(part) for part in errors[0]["loc"]] if errors else []
    param = loc[-1] if len(loc) > 1 and loc[0] in ("body", "query") else None
    message = "; ".join(f"{'.'.join(map(str, err['loc'][1:] or err['loc']))}: {err['msg']}"
                        for err in errors) or "invalid request"
    return openai_error_response(HTTPError(400, "invalid_request", message), param=param)


def openai_storage_response(e: OSError) -> JSONResponse:
    return openai_error_response(storage_error(e))
