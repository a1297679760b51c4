"""The one composition root: ``build_runtime(settings) -> Runtime``.

The web app, the batch CLI, the benchmarks and the tests all get their parts here, from settings
alone, so that no caller wires a store, a queue, a worker and a model by hand. What the runtime holds
depends on the topology and role the settings choose (see ``Settings.broker`` / ``Settings.role``):

* embedded (``role=all``, no broker): SQLite store + in-process scheduler + one worker per device;
* ``role=api`` over Redis: the broker, the decoder pool, no model;
* ``role=worker`` over Redis: the broker, the model, one worker per device, the broker feeder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from pipeline.config import Settings
from pipeline.model.loading import ModelSource, resolve_model
from pipeline.serving.service import TranscriptionService

logger = logging.getLogger("sensevoice.runtime")


@dataclass(frozen=True)
class Runtime:
    """What one process runs. ``start`` loads and warms up (blocking: call it from a thread, or
    ``start_background``); ``stop`` drains and closes. ``service`` is the facade every front end
    (REST, UI, CLI) talks to."""

    settings: Settings
    service: TranscriptionService

    @property
    def source(self) -> ModelSource | None:
        return self.service.source

    def start(self) -> None:
        self.service.start()

    def start_background(self) -> None:
        self.service.start_background()

    def stop(self) -> None:
        self.service.stop()


def build_runtime(settings: Settings | None = None, *, resolve: bool = False,
                  source: ModelSource | None = None) -> Runtime:
    """Compose the process that ``settings`` describe. Nothing heavy happens here: the model loads
    in ``Runtime.start``. ``resolve=True`` finds the model now (a missing local directory or an
    unreachable hub raises :class:`~pipeline.domain.errors.ModelUnavailable` before a server
    starts); an api-role process never holds a model."""
    settings = settings or Settings()
    if source is None and resolve and settings.role != "api":
        source = resolve_model(settings)
    return Runtime(settings, TranscriptionService(settings, source))
