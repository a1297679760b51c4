"""Probes and metrics: every role serves them (a worker process serves only them)."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request
from fastapi.responses import JSONResponse, Response

from pipeline.serving.metrics import CONTENT_TYPE
from pipeline.serving.runtime import Runtime
from pipeline.web.auth import require_token, token_ok


def build_health_router(runtime: Runtime) -> APIRouter:
    from pipeline.doctor import DoctorCache

    settings, health = runtime.settings, runtime.health
    router = APIRouter()
    doctor = DoctorCache(settings)  # `sensevoice doctor`'s facts, refreshed in the background

    @router.get("/metrics", dependencies=[Depends(require_token(settings.server.token))])
    def metrics():  # Prometheus sends the bearer token
        return Response(runtime.metrics.render(), media_type=CONTENT_TYPE)

    @router.get("/healthz")
    async def healthz():
        return {"status": "ok"}

    @router.get("/readyz")
    async def readyz(request: Request):
        body = {"ready": health.ready, "state": health.state, "model": runtime.model_name,
                "demo": runtime.is_demo, "devices": runtime.devices,
                "warm": health.ready and runtime.warm}  # ready serves; warm serves at full speed
        reason = health.error or (health.unhealthy_reason() or health.unready_reason()
                                  if health.state == "ready" else None)
        if reason:
            body["error"] = reason
        if health.no_worker and not health.error:  # api-only process: nobody runs the jobs
            body["code"] = "no_worker"
        if token_ok(request.headers.get, settings.server.token):  # paths, versions: not for all
            body["details"] = doctor.details()  # never waits: the latest report (informational only)
        return JSONResponse(body, status_code=200 if health.ready else 503)

    return router
