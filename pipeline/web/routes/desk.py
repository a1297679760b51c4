"""The reviewer's desk's routes: many calls submitted at once (files, folders, zips) and the calls
table with its reviews, each router given only the parts it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

from pipeline.web.routes.batches import build_batches_router
from pipeline.web.routes.calls import build_calls_router

if TYPE_CHECKING:
    from pipeline.serving.ports import CallsIndex


def build_desk_router(settings, intake, view, calls: CallsIndex) -> APIRouter:
    router = APIRouter()
    router.include_router(build_calls_router(settings, view, calls))  # calls table, reviews
    router.include_router(build_batches_router(settings, intake))  # many calls at once
    return router
