"""What the UI may touch on the server, and the routes the API token guards outside /api.

Gradio's event routes take a FileData whose ``path`` the client chooses, and for a mounted app Gradio
never checks it (``processing_utils._check_allowed`` returns early unless ``launch()`` ran): it
copies whatever it is given into its cache before our function runs (``/dev/zero`` froze the server;
any readable file became a job whose audio the API handed back). So:

* this server has its own upload directory, ``<data_dir>/ui-uploads`` (mode 0700), the only place
  Gradio's upload route writes to and the only place the UI reads from (:func:`prepare_upload_dir`);
* :class:`AccessGuard`, an ASGI middleware in front of the app, reads the JSON body of every POST
  under /ui (at most ``JSON_BODY_CAP`` bytes, else 413) and refuses (403 ``path_refused``) any object
  with a string ``path`` that is not the canonical path of a regular file inside that directory
  (or more than ``MAX_FILES`` of them), before Gradio sees it; a body that is not a small JSON
  object (at most ``MAX_NODES`` values) gets 400, except on the upload and login routes. It also
  refuses ``/ui/gradio_api/file=`` reads of anything else, and asks for the API token on the
  framework's own /docs, /redoc and /openapi.json when one is set;
* when the UI has a login (an API token or SENSEVOICE_UI_AUTH), every route under /ui answers 401
  until the browser has signed in, except an allow-list (:func:`public_ui_route`): the page (Gradio
  draws its login form there), the login and logout, and the frontend's built files the login page
  loads. An allow-list, not a list of what to refuse: Gradio checks the login route by route and
  left some out (``/reset``, ``/cancel``, ``/heartbeat``, ``/startup-events``, ``/token``,
  ``/app_id``, ``/openapi.json`` answered without one: issue 36), and a route a later Gradio adds
  is refused until it is named here;
* the UI's submit checks again and opens the file without following links or blocking
  (:func:`read_own_upload`);
* a file the UI reads or serves has one hard link and belongs to this service's user: a hard link
  planted in the directory (to the job store, say: issue 19) is refused, as is the directory
  itself at start when another user owns it or may write to it.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path

from starlette.datastructures import Headers
from starlette.requests import HTTPConnection
from starlette.responses import JSONResponse

from pipeline.audio.decode import read_upload
from pipeline.domain.errors import InvalidOption, PathRefused, SenseVoiceError, Unauthorized, UploadTooLarge
from pipeline.serving.private_dir import ensure_private_dir
from pipeline.web.edge import replay_body

logger = logging.getLogger("sensevoice.ui")

UI_PATH = "/ui"  # where mount_ui mounts Gradio
UPLOAD_DIR_NAME = "ui-uploads"
# A UI event body is well under 2 KiB. Parsing and walking a hostile body holds the GIL, so these
# bound what one request costs the event loop: 1 MiB of nested lists took 100 ms to parse and
# 45,000 paths 570 ms to check; a 64 KiB body of 21,000 empty lists that passed cost Gradio 160 ms
# of CPU (its validation, and full garbage collections of this large heap). A refusal costs the
# server about 0.3 ms of CPU.
JSON_BODY_CAP = 64 * 1024  # bytes
MAX_FILES = 16  # file objects in one UI request (this UI sends one)
MAX_NODES = 1000  # JSON values in one UI request (this UI's are under 40), counted before parsing
DOCS_PATHS = frozenset({"/docs", "/docs/oauth2-redirect", "/redoc", "/openapi.json"})
# bodies Gradio parses itself and that never name a server file: the upload (multipart, streamed
# into the upload directory, capped by max_file_size) and the login form
PASS_THROUGH = frozenset({UI_PATH + "/gradio_api/upload", UI_PATH + "/login", UI_PATH + "/login/"})
FILE_ROUTES = (UI_PATH + "/gradio_api/file=", UI_PATH + "/gradio_api/file/")
# What the UI answers without its login, when it has one (everything else under UI_PATH: 401). GET
# or HEAD: the page (without a login Gradio draws only its login form: no config, no components)
# and logout (it only clears the login cookie); the frontend's built files, the same for everyone,
# that the login page loads (its scripts and sheets, Gradio's fonts, the theme); POST: the login.
PUBLIC_PAGES = frozenset({UI_PATH, UI_PATH + "/", UI_PATH + "/logout", UI_PATH + "/theme.css",
                          UI_PATH + "/favicon.ico", UI_PATH + "/robots.txt"})
PUBLIC_ASSET_DIRS = (UI_PATH + "/assets/", UI_PATH + "/static/", UI_PATH + "/svelte/")
LOGIN_ROUTES = frozenset({UI_PATH + "/login", UI_PATH + "/login/"})
URL_SCHEMES = ("http:", "https:", "ftp:", "file:", "data:", "//", "\\\\")


def prepare_upload_dir(data_dir: str | Path) -> str:
    """Create (0700) and return the canonical path of this server's Gradio upload directory; an
    existing one must be ours and writable by no one else (UnsafeDirectory otherwise)."""
    base = os.path.realpath(data_dir)
    os.makedirs(base, exist_ok=True)
    path = os.path.join(base, UPLOAD_DIR_NAME)
    ensure_private_dir(path, "UI upload directory")
    os.chmod(path, 0o700)
    return path


class UploadSweeper:
    """Deletes files in the upload directory older than ``max_age_s`` (at most every ``every_s``;
    called by the service's janitor through ``on_purge``). Gradio's own ``delete_cache`` sweep
    only knows the files of the running process: without this, uploads from before a restart
    would stay in the (persistent) data directory for ever. Never follows a link."""

    def __init__(self, root: str, max_age_s: float, every_s: float):
        self.root = root
        self.max_age_s = max_age_s
        self.every_s = every_s
        self._last = 0.0

    def __call__(self, _purged=None) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self.sweep()

    def sweep(self, now: float | None = None) -> int:
        cutoff = (time.time() if now is None else now) - self.max_age_s
        removed = 0
        for dirpath, dirnames, filenames in os.walk(self.root, topdown=False, followlinks=False):
            for name in filenames + dirnames:
                path = os.path.join(dirpath, name)
                try:
                    st = os.lstat(path)
                    if stat.S_ISDIR(st.st_mode):
                        if not os.listdir(path):
                            os.rmdir(path)
                    elif st.st_ctime < cutoff:
                        os.unlink(path)
                        removed += 1
                except OSError:
                    continue
        if removed:
            logger.info("ui uploads: deleted %d files older than %.0f s", removed, self.max_age_s)
        return removed


def own_file(st: os.stat_result) -> bool:
    """A regular file with one link (a hard link to a file elsewhere -- the job store, another
    job's upload -- has two or more), created by this service's user."""
    return stat.S_ISREG(st.st_mode) and st.st_nlink == 1 and st.st_uid == os.geteuid()


def own_upload(path: object, root: str) -> str | None:
    """``path`` when it is the canonical absolute path of a regular file strictly inside ``root``
    (itself canonical): no symlink anywhere, no ``..``, no URL, no device, no second hard link,
    created by this service's user (:func:`own_file`); else None. Nothing is opened, so a FIFO
    or a device costs one lstat at most."""
    if not isinstance(path, str) or not path or "\x00" in path or len(path) > 4096:
        return None
    if path.lower().startswith(URL_SCHEMES) or not path.startswith("/"):
        return None
    if os.path.realpath(path) != path:  # a symlink on the way, '..', '//', a trailing '/'
        return None
    if not path.startswith(root.rstrip("/") + "/"):
        return None
    try:
        st = os.lstat(path)
    except (OSError, ValueError):
        return None
    return path if own_file(st) else None


def read_own_upload(path: object, root: str, max_bytes: int) -> tuple[str, bytes]:
    """The bytes of one of this server's uploads: re-checked, opened with O_NOFOLLOW | O_NONBLOCK
    (a swapped-in link or FIFO cannot redirect or block the read), a regular file, at most
    ``max_bytes``. PathRefused / UploadTooLarge otherwise."""
    real = own_upload(path, root)
    if real is None:
        raise PathRefused("this file is not one of this server's uploads: upload it first")
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(real, flags)
    except OSError as e:
        raise PathRefused("the upload could not be opened (it may have expired): upload it again") from e
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        opened = f"/proc/self/fd/{fd}"
        # the inode opened: one link, ours, still at a path inside the upload directory
        if not own_file(st) or (
                os.path.exists(opened) and own_upload(os.path.realpath(opened), root) is None):
            raise PathRefused("this file is not one of this server's uploads: upload it first")
        if st.st_size > max_bytes:
            raise UploadTooLarge(f"upload larger than {max_bytes} bytes")
        return real, read_upload(f, max_bytes)


def refused_path(data, root: str) -> str | None:
    """The first file path in the decoded JSON ``data`` (the string value of a "path" key, in an
    object at any depth: what Gradio takes for a file) that is not one of this server's uploads,
    or a note when there are more than MAX_FILES of them or more than MAX_NODES values in all;
    None when every one is."""
    files = nodes = 0
    stack = [data]
    while stack:
        item = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            return f"(more than {MAX_NODES} values)"
        if isinstance(item, dict):
            path = item.get("path")
            if isinstance(path, str):
                files += 1
                if files > MAX_FILES:
                    return f"(more than {MAX_FILES} files)"
                if own_upload(path, root) is None:
                    return path
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return None


def body_error(data, root: str) -> SenseVoiceError | None:
    """Why a decoded UI request body is refused, or None."""
    if not isinstance(data, dict):  # every JSON body Gradio takes is an object
        return InvalidOption("a UI request body must be a JSON object")
    bad = refused_path(data, root)
    if bad is None:
        return None
    if bad == f"(more than {MAX_NODES} values)":
        return InvalidOption(f"a UI request body holds at most {MAX_NODES} values")
    return PathRefused("the UI reads only files uploaded to this server through it")


def is_ui_path(path: str) -> bool:
    return path == UI_PATH or path.startswith(UI_PATH + "/")


def error_response(e: SenseVoiceError) -> JSONResponse:
    return JSONResponse({"error": {"code": e.code, "message": e.message}}, status_code=e.status)


def public_ui_route(method: str, path: str) -> bool:
    """Whether ``method path`` (under UI_PATH) is answered without the UI's login: the login
    page, the login itself, logout and the frontend's static files; nothing else."""
    if method in ("GET", "HEAD"):
        return path in PUBLIC_PAGES or path.startswith(PUBLIC_ASSET_DIRS)
    return method == "POST" and path in LOGIN_ROUTES


def token_or_ui_login(request, token: str) -> bool:
    """The API token, or (for the page) a signed-in UI session when the UI has a login; always
    true when neither is configured (then the API is open anyway)."""
    from pipeline.web.auth import token_ok

    if token_ok(request.headers.get, token):
        return True
    gradio_app = getattr(request.app.state, "gradio_app", None)
    return (gradio_app is not None and getattr(gradio_app, "auth", None) is not None
            and signed_in(gradio_app, request.scope))


def signed_in(gradio_app, scope) -> bool:
    """Whether the request carries a login of the mounted Gradio app (its session cookie, as
    Gradio's own ``login_check`` reads it); True when the UI asks for no login."""
    if gradio_app is None or getattr(gradio_app, "auth", None) is None:
        return True
    cookies = HTTPConnection(scope).cookies
    cookie_id = gradio_app.cookie_id
    token = cookies.get(f"access-token-{cookie_id}") or cookies.get(f"access-token-unsecure-{cookie_id}")
    return token is not None and gradio_app.tokens.get(token) is not None


class AccessGuard:
    """ASGI middleware: the API token on /docs, /redoc, /openapi.json (when one is set), and what
    the mounted UI may read on the server (see the module docstring). From ``settings``, or from
    ``token`` and ``upload_dir`` (None: no UI served)."""

    def __init__(self, app, settings=None, token: str = "", upload_dir: str | None = None,
                 ui_app=lambda: None):
        self.app = app
        self.ui_app = ui_app  # () -> the mounted Gradio app (its login), once mounted
        self.token = settings.server.token if settings is not None else token
        # the UI asks for a login (pipeline/web/ui.py ui_login): until Gradio is mounted (its
        # login unknown), nothing under UI_PATH but the public routes is let through
        self.ui_login = bool(self.token or (settings is not None and settings.ui.login))
        if settings is not None and settings.ui.enabled:
            upload_dir = prepare_upload_dir(settings.server.data_dir)
        self.upload_dir = upload_dir
        from pipeline.web.auth import token_ok

        self._token_ok = token_ok

    def _ui_open(self, method: str, scope) -> bool:
        """Whether this request under UI_PATH may reach Gradio as far as the login goes."""
        if public_ui_route(method, scope["path"]):
            return True
        gradio_app = self.ui_app()
        if gradio_app is None:
            return not self.ui_login
        return signed_in(gradio_app, scope)

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path: str = scope["path"]
        if scope["type"] == "websocket":
            # Gradio 6.31 has no WebSocket route; one a later Gradio adds waits for the login too
            if is_ui_path(path) and self.upload_dir is not None and not self._ui_open("WEBSOCKET", scope):
                return await send({"type": "websocket.close", "code": 1008,
                                   "reason": "sign in to the UI first"})
            return await self.app(scope, receive, send)
        if self.token and path in DOCS_PATHS:
            if not self._token_ok(Headers(scope=scope).get, self.token):
                return await error_response(Unauthorized(
                    "missing or wrong API token (send 'Authorization: Bearer <token>')"))(
                    scope, receive, send)
            return await self.app(scope, receive, send)
        if self.upload_dir is None or not is_ui_path(path):
            return await self.app(scope, receive, send)
        method = scope.get("method", "GET")
        if not self._ui_open(method, scope):
            return await error_response(Unauthorized("sign in to the UI first"))(scope, receive, send)
        if method in ("GET", "HEAD"):
            for prefix in FILE_ROUTES:
                if path.startswith(prefix) and own_upload(path[len(prefix):], self.upload_dir) is None:
                    return await error_response(PathRefused(
                        "only this server's own uploads can be read here"))(scope, receive, send)
            return await self.app(scope, receive, send)
        if method == "OPTIONS" or path in PASS_THROUGH:
            return await self.app(scope, receive, send)
        await self._checked_body(scope, receive, send)

    async def _checked_body(self, scope, receive, send):
        declared = Headers(scope=scope).get("content-length", "")
        too_large = UploadTooLarge(f"a UI request body is at most {JSON_BODY_CAP} bytes")
        if declared.isdigit() and int(declared) > JSON_BODY_CAP:
            return await error_response(too_large)(scope, receive, send)
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            if message["type"] != "http.request":
                continue
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > JSON_BODY_CAP:
                return await error_response(too_large)(scope, receive, send)
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body:
            # before parsing: a body of many small values would allocate as many objects (and,
            # in this large heap, set off slow full garbage collections)
            if body.count(b",") + body.count(b"[") + body.count(b"{") > MAX_NODES:
                return await error_response(InvalidOption(
                    f"a UI request body holds at most {MAX_NODES} values"))(scope, receive, send)
            try:
                data = json.loads(body)  # the parser Starlette's request.json() uses
            except (ValueError, RecursionError):
                return await error_response(InvalidOption(
                    "a UI request body must be JSON"))(scope, receive, send)
            refusal = body_error(data, self.upload_dir)
            if refusal is not None:
                return await error_response(refusal)(scope, receive, send)
        await self.app(scope, replay_body(body, receive), send)
