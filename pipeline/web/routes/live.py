"""Every face of the live captions over one :class:`~pipeline.serving.live.LiveHub`: the
project's own protocol and FunASR's (stream.py), and OpenAI's realtime transcription
(realtime.py). Each is a protocol adapter over the same live sessions; this router is where the
app (pipeline/web/api_face.py) and the deploy checks (tests/test_deploy.py) find them all."""

from __future__ import annotations

from fastapi import APIRouter

from pipeline.serving.live import LiveHub
from pipeline.web.routes.realtime import build_realtime_router
from pipeline.web.routes.stream import build_stream_router


def build_live_router(hub: LiveHub) -> APIRouter:
    """The live caption endpoints (WebSocket) of the process's streams."""
    router = APIRouter()
    for face in (build_stream_router(hub), build_realtime_router(hub)):
        router.routes.extend(face.routes)  # the routes themselves (include_router defers them)
    return router
