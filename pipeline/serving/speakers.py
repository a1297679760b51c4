"""Speakers of a mono recording, for the split into pieces: speech spans (the segmenter) -> CAM++
embeddings (batched on the speech device) -> clusters -> each span cut into one-speaker turns named
``Speaker 1``, ``Speaker 2``, ... in order of first turn. A piece keeps its turn's name as the
``speaker`` a split stereo call's channel has, so every face (JSON, SRT/VTT, verbose_json, the
stores) shows it the way it shows a channel's.

The model is loaded once per process on first use
(:class:`pipeline.serving.speech_split.LazySpeakers`): the demo weights with
``--demo`` (built offline), else ``engine.speaker_model`` (a directory or the hub name; an unreachable
hub fails fast with :class:`~pipeline.domain.errors.ModelUnavailable`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from pipeline.audio.diarize import SpeakerCount, diarize
from pipeline.audio.vad import Span
from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import MAX_SPEAKERS, TranscribeOptions
from pipeline.model.speaker import SpeakerEmbedder, SpeakerModelSource

if TYPE_CHECKING:
    import torch

    from pipeline.audio.vad import Segmenter
    from pipeline.config import Settings

logger = logging.getLogger("sensevoice.speakers")

# cosine thresholds of the real CAM++ (FunASR's merge_thr for centroids; window pairs of one person
# score ~0.5-0.8 and of two ~0.0-0.3)
CENTROID_THRESHOLD = 0.78
LINK_THRESHOLD = 0.5


def speaker_name(index: int) -> str:
    return f"Speaker {index + 1}"


def speaker_count(options: TranscribeOptions) -> SpeakerCount:
    return SpeakerCount(exact=options.speakers, low=options.min_speakers or 1,
                        high=options.max_speakers or MAX_SPEAKERS)


@dataclass
class SpeakerLabeller:
    """Turns of a mono wave from ``embed`` (windows ``[N, samples]`` -> ``[N, dim]``)."""

    embed: Callable[[np.ndarray], np.ndarray]
    threshold: float = LINK_THRESHOLD

    def spans(self, wave: "torch.Tensor", segmenter: "Segmenter", options: TranscribeOptions,
              progress: Callable[[float], None] = lambda f: None) -> list[tuple[Span, str]]:
        """One-speaker spans of ``wave`` (``[n]``, 16 kHz) with their speaker's name, in time order."""
        t0 = time.perf_counter()
        spans = segmenter.split(wave, on_progress=lambda f: progress(0.5 * f))
        t1 = time.perf_counter()
        samples = wave.float().cpu().numpy() if hasattr(wave, "numpy") else np.asarray(wave, np.float32)
        found = diarize(samples, spans, self.embed, speaker_count(options), self.threshold)
        progress(1.0)
        logger.info("speakers: %.1f s of audio, %d spans -> %d turns of %d speakers; speech %.2f s, "
                    "speakers %.2f s", len(samples) / SAMPLE_RATE_HZ, len(spans), len(found),
                    len({t.speaker for t in found}), t1 - t0, time.perf_counter() - t1)
        return [(Span(t.start, t.end), speaker_name(t.speaker)) for t in found]


def _is_demo_dir(model: str) -> bool:
    """The ASR model is a demo directory (built offline): its speaker model is the demo one too."""
    from pipeline.model.demo import is_demo_model

    path = Path(model).expanduser()
    return path.is_dir() and is_demo_model(path)


def load_labeller(settings: "Settings", device: str) -> SpeakerLabeller:
    """The CAM++ labeller this process's settings name, on ``device``: the demo weights beside a
    demo ASR model (``--demo`` or a demo directory), else the speaker model."""
    from pipeline.model.speaker import resolve_speaker_model, weights_file

    if settings.engine.demo or _is_demo_dir(settings.engine.model):
        from pipeline.model.demo.build_speaker import ensure_speaker_dir

        path = ensure_speaker_dir(Path(settings.server.cache_dir) / "models")
        source = SpeakerModelSource(weights_file(path) or path, "demo", True)
    else:
        source = resolve_speaker_model(settings.engine.speaker_model, hub_timeout_s=settings.engine.hub_timeout_s)
    embedder = SpeakerEmbedder.load(source, device)
    logger.info("speaker model %s (%s) on %s", source.name, source.weights, device)
    return SpeakerLabeller(embedder.embed)
