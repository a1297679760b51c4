"""The reviewer's desk's routes: many calls submitted at once (files, folders, zips) and the calls
table with its reviews, each router given only the parts it uses."""

from __future__ import annotations

from fastapi import APIRouter

from pipeline.web.routes.batches import build_batches_router
from pipeline.web.routes.calls import build_calls_router


def build_desk_router(settings, intake, view, broker) -> APIRouter:
    router = APIRouter()
    router.include_router(build_calls_router(settings, view, broker))  # calls table, reviews
    router.include_router(build_batches_router(settings, intake))  # many calls at once
    return router
