"""The base of every engine double (tests and bench/): the honest no-op answers of an engine that
computes at once on the CPU and has no background work, given once. A double only writes its
``transcribe``; tests/test_engine_protocol.py checks that each one is a full
:class:`pipeline.model.protocol.Engine`."""

from __future__ import annotations

from typing import Sequence

import torch

from pipeline.domain.types import TranscribeOptions
from pipeline.model.protocol import EngineOutput, Finished


class EngineDouble:
    """An engine that computes when it is handed a batch: nothing to compile or capture, warm at once."""

    device = torch.device("cpu")

    def transcribe(self, waves: Sequence[torch.Tensor],
                   options: Sequence[TranscribeOptions]) -> list[EngineOutput]:
        raise NotImplementedError

    def transcribe_async(self, waves: Sequence[torch.Tensor],
                         options: Sequence[TranscribeOptions]) -> Finished:
        return Finished(self.transcribe(waves, options))  # raises here, as a launch that fails

    @property
    def has_idle_work(self) -> bool:
        return False

    def idle_step(self) -> bool:
        return False

    @property
    def has_hot_work(self) -> bool:
        return False

    def capture_hot(self) -> None:
        return None

    @property
    def warm(self) -> bool:
        return True

    def close(self) -> None:
        return None
