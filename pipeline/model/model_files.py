"""What a SenseVoiceSmall model directory holds, and reading its checkpoint: the one place both
loaders (:mod:`pipeline.model.loading`, which resolves and builds, and
:mod:`pipeline.model.fast_load`, the project's own builder) take them from, so neither imports the
other."""

from __future__ import annotations

from pathlib import Path

REQUIRED_FILES = ("config.yaml", "model.pt", "am.mvn", "chn_jpn_yue_eng_ko_spectok.bpe.model")


def read_state_dict(weights: Path) -> dict:
    """A checkpoint's tensors, memory-mapped (only what is used is read), on the CPU."""
    import torch

    try:
        sd = torch.load(weights, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:  # a legacy (non-zip) checkpoint cannot be memory-mapped
        sd = torch.load(weights, map_location="cpu", weights_only=True)
    return sd.get("state_dict", sd) if isinstance(sd, dict) else sd
