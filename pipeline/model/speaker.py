"""CAM++ speaker embeddings (FunASR's ``iic/speech_campplus_sv_zh-cn_16k-common``), re-stated.

The network is FunASR's ``funasr/models/campplus`` (from 3D-Speaker) layer for layer, with the same
module names, so the hub's state dict (``campplus_cn_common.bin``) loads as it is:

* ``head`` (FCM): a 2-D front of two residual stages over (frequency, time); frequency is halved
  three times (80 -> 10 bins x 32 channels = 320 channels);
* ``xvector``: a TDNN (k=5, stride 2: half the frames), three dense CAM blocks (12, 24, 16 layers,
  growth 32, dilation 1, 2, 2) each followed by a transit halving the channels (128 -> 512 -> 256 ->
  640 -> 320 -> 832 -> 512), a batchnorm-relu, statistics pooling (mean and std over time) and a
  dense layer to 192 dims (batchnorm without affine).

Input: 80-dim kaldi fbank (povey window, no dither, samples in [-1, 1]) with the utterance mean
subtracted, as FunASR's ``extract_feature``; :class:`SpeakerFrontend` computes it for a whole batch
of equal-length windows in one vectorised pass on the waves' device. Embeddings are batched
(:meth:`SpeakerEmbedder.embed`), on the GPU when there.

Weights come from a local directory, the hub name (downloaded once, or failing fast with a clear
message when the hub is unreachable), or demo weights built offline
(:mod:`pipeline.model.demo.build_speaker`).
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipeline.domain.errors import ModelUnavailable
from pipeline.model.features import EPSILON, FFT_SIZE, FRAME_LENGTH, FRAME_SHIFT, PREEMPHASIS, _mel_matrix

logger = logging.getLogger("sensevoice.speaker")

DEFAULT_SPEAKER_MODEL = "iic/speech_campplus_sv_zh-cn_16k-common"
EMBEDDING_DIM = 192
FEAT_DIM = 80
WEIGHT_FILES = ("campplus_cn_common.bin", "model.pt", "pytorch_model.bin")  # the first found is read
POVEY_POWER = 0.85  # kaldi's povey window: a symmetric Hann window to the power 0.85


# ----------------------------------------------------------------------------- the network
class BasicResBlock(nn.Module):
    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_planes, planes, 3, stride=(stride, 1), padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Sequential(nn.Conv2d(in_planes, planes, 1, stride=(stride, 1), bias=False),
                                          nn.BatchNorm2d(planes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class FCM(nn.Module):
    """The 2-D front: ``[B, 80, T]`` -> ``[B, 320, T]``."""

    def __init__(self, m_channels: int = 32, feat_dim: int = FEAT_DIM, blocks: int = 2):
        super().__init__()
        self.in_planes = m_channels
        self.conv1 = nn.Conv2d(1, m_channels, 3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(m_channels)
        self.layer1 = self._make_layer(m_channels, blocks, stride=2)
        self.layer2 = self._make_layer(m_channels, blocks, stride=2)
        self.conv2 = nn.Conv2d(m_channels, m_channels, 3, stride=(2, 1), padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(m_channels)
        self.out_channels = m_channels * (feat_dim // 8)

    def _make_layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = []
        for s in [stride] + [1] * (blocks - 1):
            layers.append(BasicResBlock(self.in_planes, planes, s))
            self.in_planes = planes
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x.unsqueeze(1))))
        out = F.relu(self.bn2(self.conv2(self.layer2(self.layer1(out)))))
        b, c, f, t = out.shape
        return out.reshape(b, c * f, t)


def nonlinear(config: str, channels: int) -> nn.Sequential:
    """FunASR's ``get_nonlinear``: "batchnorm-relu", or "batchnorm_" (no affine)."""
    seq = nn.Sequential()
    for name in config.split("-"):
        if name == "relu":
            seq.add_module("relu", nn.ReLU(inplace=True))
        elif name == "batchnorm":
            seq.add_module("batchnorm", nn.BatchNorm1d(channels))
        elif name == "batchnorm_":
            seq.add_module("batchnorm", nn.BatchNorm1d(channels, affine=False))
        else:
            raise ValueError(f"unknown nonlinearity {name!r}")
    return seq


class TDNNLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1):
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, kernel_size, stride=stride,
                                padding=(kernel_size - 1) // 2, bias=False)
        self.nonlinear = nonlinear("batchnorm-relu", out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x))


class CAMLayer(nn.Module):
    """Context-aware masking: a local conv scaled by a gate from the utterance and 100-frame means."""

    SEG_LEN = 100

    def __init__(self, bn_channels: int, out_channels: int, kernel_size: int, dilation: int,
                 reduction: int = 2):
        super().__init__()
        self.linear_local = nn.Conv1d(bn_channels, out_channels, kernel_size,
                                      padding=(kernel_size - 1) // 2 * dilation, dilation=dilation,
                                      bias=False)
        self.linear1 = nn.Conv1d(bn_channels, bn_channels // reduction, 1)
        self.relu = nn.ReLU(inplace=True)
        self.linear2 = nn.Conv1d(bn_channels // reduction, out_channels, 1)
        self.sigmoid = nn.Sigmoid()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear_local(x)
        t = x.shape[-1]
        seg = F.avg_pool1d(x, kernel_size=self.SEG_LEN, stride=self.SEG_LEN, ceil_mode=True)
        seg = seg.repeat_interleave(self.SEG_LEN, dim=-1)[..., :t]
        context = x.mean(-1, keepdim=True) + seg
        return y * self.sigmoid(self.linear2(self.relu(self.linear1(context))))


class CAMDenseTDNNLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, bn_channels: int, kernel_size: int,
                 dilation: int):
        super().__init__()
        self.nonlinear1 = nonlinear("batchnorm-relu", in_channels)
        self.linear1 = nn.Conv1d(in_channels, bn_channels, 1, bias=False)
        self.nonlinear2 = nonlinear("batchnorm-relu", bn_channels)
        self.cam_layer = CAMLayer(bn_channels, out_channels, kernel_size, dilation)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.cam_layer(self.nonlinear2(self.linear1(self.nonlinear1(x))))


class CAMDenseTDNNBlock(nn.ModuleList):
    def __init__(self, num_layers: int, in_channels: int, growth: int, bn_channels: int,
                 kernel_size: int, dilation: int):
        super().__init__()
        for i in range(num_layers):
            self.add_module(f"tdnnd{i + 1}", CAMDenseTDNNLayer(in_channels + i * growth, growth,
                                                               bn_channels, kernel_size, dilation))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self:
            x = torch.cat([x, layer(x)], dim=1)
        return x


class TransitLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.nonlinear = nonlinear("batchnorm-relu", in_channels)
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(self.nonlinear(x))


class StatsPool(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([x.mean(dim=-1), x.std(dim=-1, unbiased=True)], dim=-1)


class DenseLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.linear = nn.Conv1d(in_channels, out_channels, 1, bias=False)
        self.nonlinear = nonlinear("batchnorm_", out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.nonlinear(self.linear(x.unsqueeze(-1)).squeeze(-1))


class CAMPPlus(nn.Module):
    """CAM++: fbank ``[B, T, 80]`` -> embedding ``[B, 192]`` (FunASR's defaults)."""

    BLOCKS = ((12, 3, 1), (24, 3, 2), (16, 3, 2))  # (layers, kernel size, dilation)

    def __init__(self, feat_dim: int = FEAT_DIM, embedding_size: int = EMBEDDING_DIM,
                 growth_rate: int = 32, bn_size: int = 4, init_channels: int = 128):
        super().__init__()
        self.head = FCM(feat_dim=feat_dim)
        self.xvector = nn.Sequential(OrderedDict(
            [("tdnn", TDNNLayer(self.head.out_channels, init_channels, 5, stride=2))]))
        channels = init_channels
        for i, (layers, kernel, dilation) in enumerate(self.BLOCKS):
            self.xvector.add_module(f"block{i + 1}", CAMDenseTDNNBlock(
                layers, channels, growth_rate, bn_size * growth_rate, kernel, dilation))
            channels += layers * growth_rate
            self.xvector.add_module(f"transit{i + 1}", TransitLayer(channels, channels // 2))
            channels //= 2
        self.xvector.add_module("out_nonlinear", nonlinear("batchnorm-relu", channels))
        self.xvector.add_module("stats", StatsPool())
        self.xvector.add_module("dense", DenseLayer(channels * 2, embedding_size))
        for m in self.modules():
            if isinstance(m, (nn.Conv1d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight.data)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, feats: torch.Tensor) -> torch.Tensor:
        return self.xvector(self.head(feats.permute(0, 2, 1)))


# ----------------------------------------------------------------------------- the front end
def _povey_window() -> torch.Tensor:
    return torch.hann_window(FRAME_LENGTH, periodic=False, dtype=torch.float32).pow(POVEY_POWER)


class SpeakerFrontend(nn.Module):
    """Equal-length waves ``[B, N]`` in [-1, 1] -> mean-normalised kaldi fbank ``[B, T, 80]``:
    ``torchaudio.compliance.kaldi.fbank(wave, num_mel_bins=80)`` (povey window, dither 0,
    snip_edges) per row, minus its mean over time, as FunASR's ``extract_feature``."""

    window: torch.Tensor
    mel: torch.Tensor

    def __init__(self):
        super().__init__()
        self.register_buffer("window", _povey_window(), persistent=False)
        self.register_buffer("mel", _mel_matrix(), persistent=False)

    def forward(self, waves: torch.Tensor) -> torch.Tensor:
        if waves.dim() != 2 or waves.shape[1] < FRAME_LENGTH:
            raise ValueError(f"waves must be [B, N >= {FRAME_LENGTH}], got {list(waves.shape)}")
        frames = waves.float().unfold(1, FRAME_LENGTH, FRAME_SHIFT)
        frames = frames - frames.mean(dim=-1, keepdim=True)
        prev = torch.cat((frames[..., :1], frames[..., :-1]), dim=-1)
        frames = (frames - PREEMPHASIS * prev) * self.window.to(frames.device)
        spec = torch.fft.rfft(frames, n=FFT_SIZE, dim=-1).abs().pow(2.0)
        logmel = torch.matmul(spec, self.mel.to(frames.device)).clamp_min(EPSILON).log()
        return logmel - logmel.mean(dim=1, keepdim=True)


# ----------------------------------------------------------------------------- loading
@dataclass(frozen=True)
class SpeakerModelSource:
    """A resolved speaker-model weights file and what it is."""

    weights: Path
    name: str  # what the user asked for
    is_demo: bool


def weights_file(directory: Path) -> Path | None:
    for name in WEIGHT_FILES:
        if (directory / name).is_file():
            return directory / name
    return None


def resolve_speaker_model(name: str, *, hub_timeout_s: float) -> SpeakerModelSource:
    """``name`` (a local directory, a weights file or a hub name) as a weights file;
    :class:`ModelUnavailable` saying what to do when none can be had. (The demo weights:
    :func:`pipeline.model.demo.build_speaker.ensure_speaker_dir`.)"""
    from pipeline.model.loading import _hub_cache_candidates, hub_reachable, HUB_HOST

    path = Path(name).expanduser()
    if path.exists():
        found = weights_file(path) if path.is_dir() else path
        if found is None:
            raise ModelUnavailable(f"{path} is not a CAM++ speaker model directory (none of "
                                   f"{', '.join(WEIGHT_FILES)} in it)")
        return SpeakerModelSource(found, name, is_demo=False)
    for cached in _hub_cache_candidates(name):
        if cached.is_dir() and (found := weights_file(cached)) is not None:
            return SpeakerModelSource(found, name, is_demo=False)
    if "/" not in name:
        raise ModelUnavailable(f"speaker model {name!r}: no such directory and not a hub name")
    if not hub_reachable(hub_timeout_s):
        raise ModelUnavailable(
            f"cannot reach the model hub ({HUB_HOST}) to download the speaker model {name!r} and it "
            "is not in the local cache. Connect once, or pass a local directory with "
            "--speaker-model DIR (SENSEVOICE_SPEAKER_MODEL=DIR), or use --demo.")
    from pipeline.model.loading import _download

    found = weights_file(_download(name))
    if found is None:
        raise ModelUnavailable(f"the hub's {name!r} holds none of {', '.join(WEIGHT_FILES)}")
    return SpeakerModelSource(found, name, is_demo=False)


def load_campplus(weights: Path | None, device: str = "cpu") -> CAMPPlus:
    """CAM++ with ``weights`` (a state dict file; None: the random initialisation), in eval mode."""
    model = CAMPPlus()
    if weights is not None:
        try:
            state = torch.load(weights, map_location="cpu", weights_only=True)
        except Exception as e:  # a truncated or foreign file: many types, one meaning
            raise ModelUnavailable(f"{weights}: not a readable CAM++ state dict ({e})") from e
        if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
            state = state["state_dict"]
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ModelUnavailable(f"{weights}: not CAM++ weights (missing {len(missing)} tensors, "
                                   f"e.g. {missing[:2]}; unexpected {len(unexpected)}, e.g. {unexpected[:2]})")
    return model.to(device).eval()


# ----------------------------------------------------------------------------- embedding
class SpeakerEmbedder:
    """Batched embeddings of equal-length windows on one device. Thread-safe for callers that
    do not share a call (torch modules in eval mode under ``inference_mode``)."""

    def __init__(self, model: CAMPPlus, device: str = "cpu", batch_size: int = 256):
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.frontend = SpeakerFrontend().to(self.device)
        self.batch_size = int(batch_size)

    @classmethod
    def load(cls, source: SpeakerModelSource, device: str = "cpu") -> "SpeakerEmbedder":
        return cls(load_campplus(source.weights, device), device)

    def embed(self, windows: np.ndarray | torch.Tensor) -> np.ndarray:
        """``[N, samples]`` float waves (16 kHz) -> L2-normalised embeddings ``[N, 192]`` float32."""
        x = torch.as_tensor(windows)
        if x.dim() != 2:
            raise ValueError(f"windows must be [N, samples], got {list(x.shape)}")
        if x.shape[0] == 0:
            return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
        out = []
        with torch.inference_mode():
            for i in range(0, x.shape[0], self.batch_size):
                chunk = x[i:i + self.batch_size].to(self.device, torch.float32, non_blocking=True)
                emb = self.model(self.frontend(chunk))
                out.append(F.normalize(emb.float(), dim=-1))
            return torch.cat(out).cpu().numpy()
