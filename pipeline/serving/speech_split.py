"""A long recording (or a split stereo call) cut by speech detection into the work items the
workers batch like any job: the server's long audio and the batch CLI's local mode split alike."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from pipeline.domain.tags import SAMPLE_RATE_HZ
from pipeline.domain.types import Lane, TranscribeOptions
from pipeline.serving.scheduler import WorkItem
from pipeline.serving.speakers import SpeakerLabeller, load_labeller

if TYPE_CHECKING:
    import torch

    from pipeline.audio.vad import Segmenter
    from pipeline.config import Settings

CHANNEL_NAMES = ("left", "right")  # speaker labels of a split stereo call (e.g. agent, customer)
SegmenterLoader = Callable[[], "Segmenter"]  # loads the segmenter (once: see LazySegmenter)
SpeakersLoader = Callable[[], "SpeakerLabeller"]  # loads the speaker model (once: serving/speakers.py)


def load_segmenter(max_segment_s: float, device: str) -> Segmenter:
    """silero-vad, loaded (on the first long recording: short ones never need it)."""
    from pipeline.audio.vad import Segmenter

    return Segmenter(max_segment_s=max_segment_s, device=device).load()


class LazySegmenter:
    """The segmenter, loaded on first use (once, whichever thread asks first)."""

    def __init__(self, max_segment_s: float, device: str):
        self.max_segment_s, self.device = max_segment_s, device
        self._segmenter: Segmenter | None = None
        self._lock = threading.Lock()

    def __call__(self) -> Segmenter:
        with self._lock:
            if self._segmenter is None:
                self._segmenter = load_segmenter(self.max_segment_s, self.device)
            return self._segmenter


class LazySpeakers:
    """The labeller, loaded on first use (once, whichever thread asks first)."""

    def __init__(self, settings: Settings, device: str,
                 loader: Callable[[Settings, str], SpeakerLabeller] = load_labeller):
        self.settings, self.device, self.loader = settings, device, loader
        self._labeller: SpeakerLabeller | None = None
        self._lock = threading.Lock()

    def __call__(self) -> SpeakerLabeller:
        with self._lock:
            if self._labeller is None:
                self._labeller = self.loader(self.settings, self.device)
            return self._labeller


def split_pieces(job_id: str, lane: Lane, options: TranscribeOptions, wave: torch.Tensor, segmenter: Segmenter,
                 progress: Callable[[float], None] = lambda f: None,
                 speakers: SpeakersLoader | None = None) -> list[WorkItem]:
    """VAD-split a long recording (``[n]``, or ``[channels, n]``: one speaker per channel) into
    work items in time order; ``progress`` hears the share split so far. A mono recording whose
    options ask for speakers is cut into one-speaker turns named by ``speakers()``'s labeller (a
    split stereo call's channels stay its speakers)."""
    channels = [(None, wave)] if wave.dim() == 1 else \
        [(name, wave[c]) for c, name in zip(range(wave.shape[0]), CHANNEL_NAMES)]
    spans = []
    if options.wants_speakers and wave.dim() == 1:
        if speakers is None:
            from pipeline.domain.errors import ModelUnavailable

            raise ModelUnavailable("speakers were asked for, but this process has no speaker model")
        channels = []
        spans = [(span, name, wave) for span, name in speakers().spans(wave, segmenter, options, progress)]
    for k, (speaker, ch) in enumerate(channels):
        def on_progress(f, k=k):
            progress((k + f) / len(channels))

        spans += [(span, speaker, ch) for span in segmenter.split(ch, on_progress=on_progress)]
    spans.sort(key=lambda t: (t[0].start, t[1] or ""))
    return [WorkItem(job_id, lane, options, span.end - span.start, audio=ch[span.start:span.end],
                     piece=n, pieces=len(spans), start_s=span.start / SAMPLE_RATE_HZ,
                     speaker=speaker)
            for n, (span, speaker, ch) in enumerate(spans)]
