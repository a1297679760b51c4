"""The reviewer's desk's routes: many calls submitted at once (files, folders, zips), the calls
table with its reviews, and a call deleted or kept (its retention), each router given only the
parts it uses."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import APIRouter

from pipeline.web.routes.batches import build_batches_router
from pipeline.web.routes.calls import build_calls_router
from pipeline.web.routes.retention import build_retention_router

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

    from pipeline.serving.ports import CallsIndex, JobRemoval


def build_desk_router(settings, intake, view, calls: CallsIndex, removal: JobRemoval,
                      forget: list[Callable[[Iterable[str]], None]]) -> APIRouter:
    """``forget``: what a purge runs with the ids it removed (``Runtime.on_purge``), run on a delete too."""
    router = APIRouter()
    router.include_router(build_calls_router(settings, view, calls))  # calls table, reviews
    router.include_router(build_batches_router(settings, intake))  # many calls at once
    router.include_router(build_retention_router(settings, view, removal, forget))  # delete, keep
    return router
