"""``POST /api/jobs`` in its common form without the framework (:class:`FastSubmit`).

The route (pipeline/web/routes/jobs.py) reads an upload through FastAPI's routing, dependencies,
Starlette's form parser (the file spooled into a temporary file and read back) and its response
classes: on two cores under load that was a tenth of a web process's CPU beside the submit itself.
This middleware answers the request that a client almost always sends -- no query string, the token
if one is set, a multipart body of one file part and the route's own option fields -- by
parsing the body once (python-multipart, as Starlette does) and submitting it exactly as the route
does (``submit_bytes``: the same intake, thread limiter and answer as pipeline/web/submit.py's). Any other request, and any
body it does not take as the route would (an option value the route's validation decides, a field
twice, a part too many), goes to the route with its body replayed unchanged: the route stays the
one definition of errors. It sits inside the upload guards (size, time, slots) and the Host/Origin
and sign-in guards, and buffers only bodies of a declared length up to ``MAX_BYTES`` (a larger one
goes to the route, whose parser spools it to disk).

Issue 36: the rule is that this answers exactly what the route answers, so every body that could
be read two ways goes to the route (it answered 202 where the route answered 400): a framing
header or a Content-Type parameter given twice (:func:`pipeline.web.edge.ambiguous_framing`: the
edge refuses those before either runs), a Content-Type parameter besides the boundary (a charset
changes how the route decodes names and values), any part name given twice (the route reads the
last of a name: a plain ``file`` field after the file part is its 400), a ``file`` part that is not
a file, a part without a name, a part whose Content-Disposition (or one of its parameters) is
given twice.

Its fields are the route's: :func:`declared_form` reads them from the route's declaration (FastAPI's
own reading of its ``File`` and ``Form`` parameters) at the first submit, so an option added to the
route is read here too. A declaration it cannot read exactly as the route does (a field that is no
option of :class:`TranscribeOptions`, a type besides ``bool`` and ``str``, a constraint, a required
option, a header or cookie parameter, a required query) turns the fast path off, logged: every submit
then goes to the route (tests/test_fast_submit.py fails on it). Kept because it pays (issue 37; a no-op
engine, 2 shared cores, with and without it interleaved in one run, twice): 8 submits of a 10 s WAV
at a time +26 % and +38 % jobs/s, sequential ones +35 % and +6 % (latency-bound, noisy), 12-25 % less
server CPU per submit in every pair."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass

import orjson
from anyio import CapacityLimiter, to_thread
from fastapi import params
from fastapi.routing import APIRoute, iter_route_contexts
from pydantic_core import PydanticUndefined
from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header
from starlette.datastructures import Headers, UploadFile

from pipeline.domain.errors import SenseVoiceError
from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.serving.records import storage_error
from pipeline.web.auth import token_ok
from pipeline.web.edge import ambiguous_framing, header_parameters, replay_body
from pipeline.web.errors import domain_response

logger = logging.getLogger("sensevoice.api")

PATH = "/api/jobs"
TRUE, FALSE = frozenset(("1", "true", "t", "yes", "y", "on")), frozenset(("0", "false", "f", "no", "n", "off"))
MAX_PARTS = 8  # more: the route's parser decides
MAX_BYTES = 16 << 20  # a larger body (or one without a length) goes to the route, which spools it to disk
MAX_FIELD_BYTES = 256  # an option value longer than this: the route decides


@dataclass(frozen=True)
class SubmitForm:
    """The route's form as declared: the upload's field name, and each option field's type
    (``bool`` or ``str``) and default, by the name a client sends."""

    file: str
    options: dict[str, tuple[type, object]]


def declared_form(app) -> SubmitForm | None:
    """The form of ``app``'s ``POST /api/jobs`` route, from FastAPI's reading of its parameters;
    None when the route declares anything this module cannot take exactly as the route does."""
    routes = [c.original_route for c in iter_route_contexts(app.routes)  # (included routers too)
              if c.path == PATH and "POST" in (c.methods or ())]
    if len(routes) != 1 or not isinstance(routes[0], APIRoute):
        return _off(f"{len(routes)} routes of POST {PATH}")
    dependant = routes[0].dependant
    if dependant.header_params or dependant.cookie_params or dependant.path_params:
        return _off("it reads headers, cookies or path parameters")
    if any(q.field_info.is_required() for q in dependant.query_params):  # (a query goes to the route)
        return _off("it requires a query parameter")
    known = {f.name for f in dataclasses.fields(TranscribeOptions)}
    file, options = None, {}
    for param in dependant.body_params:
        info = param.field_info
        if info.metadata or param.alias != param.name or param.alias in options or param.alias == file:
            return _off(f"{param.alias!r} is constrained, renamed or declared twice")
        if isinstance(info, params.File):
            if not (isinstance(info.annotation, type) and issubclass(info.annotation, UploadFile)) or file:
                return _off(f"its file field {param.alias!r} is no single UploadFile")
            file = param.alias
        elif isinstance(info, params.Form) and info.annotation in (bool, str) and param.name in known \
                and info.default is not PydanticUndefined:
            options[param.alias] = (info.annotation, info.default)
        else:
            return _off(f"its field {param.alias!r} is no bool or str option of TranscribeOptions "
                        "with a default, nor the one upload")
    if file is None:
        return _off("it declares no upload")
    return SubmitForm(file, options)


def _off(why: str) -> None:
    logger.warning("the fast submit is off, every POST %s goes to the route: %s", PATH, why)
    return None


_UNREAD = object()


class FastSubmit:
    """ASGI middleware: the common ``POST /api/jobs`` submitted here, everything else passed on."""

    def __init__(self, app, intake, token: str):
        self.app, self.intake, self.token = app, intake, token
        self.form: SubmitForm | None | object = _UNREAD  # the route's, read at the first submit

    async def __call__(self, scope, receive, send):
        if (scope["type"] != "http" or scope["method"] != "POST" or scope["path"] != PATH
                or scope.get("query_string") or not token_ok(Headers(scope=scope).get, self.token)):
            return await self.app(scope, receive, send)
        if self.form is _UNREAD:
            self.form = declared_form(scope["app"])
        form = self.form
        if form is None:
            return await self.app(scope, receive, send)
        boundary, length = _boundary_and_length(scope)
        if boundary is None or length is None or length > MAX_BYTES:
            return await self.app(scope, receive, send)
        body = bytearray()
        while True:
            message = await receive()  # (the upload guard outside bounds its size and time)
            if message["type"] == "http.disconnect":
                return  # the client went away: nobody to answer
            body += message.get("body", b"")
            if not message.get("more_body", False):
                break
        parsed = _parse(form, boundary, body)
        if parsed is None:
            return await self.app(scope, replay_body(bytes(body), receive), send)
        data, filename, options = parsed
        del body
        try:
            job = await submit_bytes(scope["app"].state, self.intake, data, filename, options, Lane.BULK)
        except SenseVoiceError as e:
            return await domain_response(e)(scope, receive, send)
        except OSError as e:  # a write that failed below the store's own checks: as the app's handler
            logger.error("I/O error while handling a request: %s", e)
            return await domain_response(storage_error(e))(scope, receive, send)
        answer = orjson.dumps({"id": job.id, "status": job.state.value, "position": job.position})
        await send({"type": "http.response.start", "status": 202, "headers": [
            (b"content-type", b"application/json"), (b"content-length", str(len(answer)).encode()),
            (b"location", f"{PATH}/{job.id}".encode())]})
        await send({"type": "http.response.body", "body": answer})


async def submit_bytes(state, intake, data: bytes, filename: str, options: TranscribeOptions,
                       lane: Lane):
    """An upload already read, submitted as the route's ``submit_upload`` submits: in the thread
    pool, under the same limiter (``state``: the app's)."""
    return await to_thread.run_sync(lambda: intake.submit(data, filename=filename, options=options, lane=lane),
                                    limiter=submit_limiter(state, intake))


def submit_limiter(state, intake) -> CapacityLimiter:
    """The threads that submits may take at once (``limits.submit_threads``), one limiter per app
    (made on its event loop, at the first submit), for the route and this middleware alike."""
    limiter = getattr(state, "submit_limiter", None)
    if limiter is None:
        limiter = state.submit_limiter = CapacityLimiter(intake.settings.limits.submit_threads)
    return limiter


def _boundary_and_length(scope) -> tuple[bytes | None, int | None]:
    """A multipart body's boundary and its declared length (the server holds a body to it);
    None for either when the route must decide (a header that could be read two ways, a
    parameter besides the boundary, a chunked body)."""
    if ambiguous_framing(scope["headers"]) is not None:
        return None, None
    boundary = length = None
    for name, value in scope["headers"]:
        name = name.lower()
        if name == b"content-type":
            kind, params = parse_options_header(value)
            if kind != b"multipart/form-data" or header_parameters(value) != [b"boundary"]:
                return None, None
            boundary = params.get(b"boundary")
        elif name == b"content-length":
            length = int(value) if value.isdigit() and len(value) < 12 else None
        elif name == b"transfer-encoding":
            return None, None
    return boundary or None, length


class _TooManyParts(Exception):
    pass


class _Part:
    __slots__ = ("headers", "chunks", "field", "value")

    def __init__(self):
        self.headers: list[tuple[bytes, bytes]] = []
        self.chunks: list[bytes] = []
        self.field = self.value = b""


def _parse(form: SubmitForm, boundary: bytes, body: bytearray) -> tuple[bytes, str, TranscribeOptions] | None:
    """The upload, its filename and the options, as the route would read them; None when the
    route must decide (anything this does not take exactly as the route would)."""
    parts: list[_Part] = []

    def on_part_begin():
        if len(parts) == MAX_PARTS:
            raise _TooManyParts  # (the route's parser decides; no need to read on)
        parts.append(_Part())

    def on_header_field(data, start, end):
        parts[-1].field += data[start:end]

    def on_header_value(data, start, end):
        parts[-1].value += data[start:end]

    def on_header_end():
        part = parts[-1]
        part.headers.append((part.field.lower(), part.value))
        part.field = part.value = b""

    def on_part_data(data, start, end):
        parts[-1].chunks.append(data[start:end])

    parser = MultipartParser(boundary, {"on_part_begin": on_part_begin, "on_header_field": on_header_field,
                                        "on_header_value": on_header_value, "on_header_end": on_header_end,
                                        "on_part_data": on_part_data})
    try:
        parser.write(body)
        parser.finalize()
    except Exception:  # malformed, or too many parts: the route's parser gives its answer
        return None
    if parser.state != MultipartState.END:  # a body cut short
        return None
    upload: tuple[bytes, str] | None = None
    fields: dict[str, str] = {}
    names: set[str] = set()
    for part in parts:
        dispositions = [value for name, value in part.headers if name == b"content-disposition"]
        if len(dispositions) != 1:
            return None
        _, params = parse_options_header(dispositions[0])
        given = header_parameters(dispositions[0])
        if b"name" not in params or len(set(given)) != len(given):
            return None
        name = _decoded(params[b"name"])
        if name in names:  # (the route reads the last part of a name)
            return None
        names.add(name)
        if b"filename" in params:
            if name != form.file:
                return None
            upload = (b"".join(part.chunks), _decoded(params[b"filename"]))
        elif name == form.file:  # a plain field where the route wants a file: its 400
            return None
        elif name in form.options:
            value = b"".join(part.chunks)
            if len(value) > MAX_FIELD_BYTES:
                return None
            try:
                fields[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                return None
        # (any other field: the route ignores it too)
    if upload is None:
        return None
    values: dict[str, object] = {}
    for name, (kind, default) in form.options.items():
        if name not in fields:
            values[name] = default
        elif kind is str:
            values[name] = fields[name]
        else:
            value = fields[name].lower()
            if value not in TRUE and value not in FALSE:
                return None
            values[name] = value in TRUE
    try:
        options = TranscribeOptions(**values)
    except SenseVoiceError:  # (an unknown language: the route's answer)
        return None
    return upload[0], upload[1], options


def _decoded(value: bytes) -> str:
    """A part's name or filename as Starlette's parser decodes it (UTF-8, else Latin-1)."""
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError:
        return value.decode("latin-1")
