"""What the serving floor needs of an engine: the ``Engine`` protocol and the values it returns.

A worker (pipeline/serving/worker.py) owns one engine and calls exactly these members; the runtime
reads ``warm`` for /readyz. The real engine (:class:`pipeline.model.engine.SenseVoiceEngine`) and
every test or benchmark double implement all of them (tests/test_engine_protocol.py checks it), so
the worker calls them directly, with no defaults for an engine that lacks one. This module imports
no implementation.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, runtime_checkable

import torch

from pipeline.domain.types import TranscribeOptions, Word


@dataclass(frozen=True)
class EngineOutput:
    """One clip's transcript as the model emitted it: its token ids and its raw tagged text."""

    token_ids: tuple[int, ...]
    raw_text: str
    words: tuple[Word, ...] = ()  # seconds from the clip's start; only when asked
    # confidence from the same forward pass (pipeline/model/confidence.py); empty / None from an
    # engine that does not compute it
    token_logprobs: tuple[float, ...] = ()  # one per token id
    avg_logprob: float | None = None  # mean log probability of the text tokens
    tag_probs: tuple[tuple[str, float], ...] = ()  # (tag, probability among its kind) per query frame


@runtime_checkable
class PendingOutputs(Protocol):
    """A batch handed to the device: ``result`` waits for it (the finisher thread only)."""

    def result(self) -> list[EngineOutput]: ...


@dataclass(frozen=True)
class Finished:
    """A batch computed before it was handed back (an engine without a device queue)."""

    outputs: list[EngineOutput]

    def result(self) -> list[EngineOutput]:
        return self.outputs


@runtime_checkable
class Engine(Protocol):
    """Batched speech recognition on one device, owned by one worker thread."""

    device: torch.device  # where it computes: the worker binds its threads to a CUDA device

    def transcribe(self, waves: Sequence[torch.Tensor],
                   options: Sequence[TranscribeOptions]) -> list[EngineOutput]:
        """A batch of 16 kHz waves, one options each; waits for the results."""
        ...

    def transcribe_async(self, waves: Sequence[torch.Tensor],
                         options: Sequence[TranscribeOptions]) -> PendingOutputs:
        """The same batch, queued: returns before the device is done (the next may be queued)."""
        ...

    @property
    def has_idle_work(self) -> bool:
        """Background work is pending (a compile, graph captures): the worker polls faster and
        calls :meth:`idle_step` when nothing is queued."""
        ...

    def idle_step(self) -> bool:
        """One short piece of that work; True while more remains."""
        ...

    @property
    def has_hot_work(self) -> bool:
        """A shape runs slowly often enough to be worth :meth:`capture_hot` between batches."""
        ...

    def capture_hot(self) -> None:
        """Make the most often slow shape fast (the owning thread, between batches)."""
        ...

    @property
    def warm(self) -> bool:
        """Batches run at full speed from now (/readyz's "warm")."""
        ...

    def close(self) -> None:
        """Start no more background work and wait for what runs (a compile in a thread of its
        own): called once the worker has stopped, before the process may exit (a compile still
        running in the interpreter's exit aborted the batch CLI on the H200, status 134)."""
        ...
