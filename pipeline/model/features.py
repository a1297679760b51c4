"""Batched, device-resident SenseVoice front end: kaldi fbank -> LFR -> CMVN.

Reproduces funasr's ``WavFrontend`` (``funasr/frontends/wav_frontend.py``) as configured for
SenseVoiceSmall with ``dither=0``::

    WavFrontend(cmvn_file=am.mvn, fs=16000, window="hamming", n_mels=80, frame_length=25,
                frame_shift=10, lfr_m=7, lfr_n=6, dither=0.0)

which calls ``torchaudio.compliance.kaldi.fbank`` once per waveform on the CPU.  Here the whole
padded batch goes through one vectorised pass on whatever device the waves live on:

1. scale samples from [-1, 1] to int16 range (x 32768, funasr's ``upsacle_samples``);
2. frames of 400 samples every 160 samples (``unfold``; kaldi ``snip_edges=True``: only frames
   that fit entirely inside the item are counted);
3. per frame: remove the DC offset, pre-emphasis 0.97 (kaldi uses the frame's own first sample
   as x[-1]), symmetric Hamming window, zero-pad to 512, ``rfft``, power spectrum;
4. 80 triangular mel filters (20 Hz .. 8 kHz, kaldi mel scale), ``log(max(., float32 eps))``;
5. LFR m=7, n=6: output row j stacks fbank frames ``j*6-3 .. j*6+3``, clamped to the item's own
   ``[0, frames-1]`` (three copies of frame 0 on the left, the item's last frame repeated on the
   right) -> 560 dims, one row per 60 ms, ``ceil(frames / 6)`` rows;
6. CMVN from ``am.mvn``: ``(x + shift) * scale``;
7. rows past each item's length are zero.

Everything is float32 (the log-mel of int16-range power spectra needs it); callers cast later.
``forward`` has no Python loop over items or frames, no host sync and no per-call cache, so it
works under ``torch.inference_mode()`` and inside a CUDA graph capture for fixed shapes.

Known divergence: funasr shrinks the analysis window for clips shorter than 400 samples (25 ms)
and returns one frame; here such items get 0 frames (all-zero rows, ``feat_length`` 0).  Callers
should reject or pad clips that short.
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F

from pipeline.domain.tags import SAMPLE_RATE_HZ

__all__ = [
    "FRAME_LENGTH",
    "FRAME_SHIFT",
    "FFT_SIZE",
    "LFR_M",
    "LFR_N",
    "N_MELS",
    "FEAT_DIM",
    "PREEMPHASIS",
    "WAVE_SCALE",
    "LOW_FREQ_HZ",
    "EPSILON",
    "load_cmvn",
    "num_fbank_frames",
    "num_lfr_frames",
    "BatchedFrontend",
]

FRAME_LENGTH = 400  # samples (25 ms at 16 kHz)
FRAME_SHIFT = 160  # samples (10 ms at 16 kHz)
FFT_SIZE = 512  # samples: FRAME_LENGTH rounded up to a power of two (kaldi round_to_power_of_two)
N_MELS = 80  # mel filters per fbank frame
LFR_M = 7  # fbank frames stacked per LFR frame
LFR_N = 6  # fbank frames advanced per LFR frame (one LFR frame per 60 ms)
LFR_LEFT_PAD = (LFR_M - 1) // 2  # 3 copies of frame 0 on the left
FEAT_DIM = N_MELS * LFR_M  # 560 features per LFR frame
PREEMPHASIS = 0.97  # kaldi preemphasis_coefficient
WAVE_SCALE = 32768.0  # [-1, 1] float -> int16 range (funasr upsacle_samples: x * (1 << 15))
LOW_FREQ_HZ = 20.0  # kaldi default low_freq; high_freq 0 -> Nyquist (8 kHz)
EPSILON = torch.finfo(torch.float32).eps  # log floor, as torchaudio/kaldi (1.1920929e-07)


# ---------------------------------------------------------------------------------------------
# sizes


def num_fbank_frames(n_samples: int) -> int:
    """Kaldi ``snip_edges=True`` frame count for ``n_samples`` samples: 0 below one frame."""
    n_samples = int(n_samples)
    if n_samples < FRAME_LENGTH:
        return 0
    return 1 + (n_samples - FRAME_LENGTH) // FRAME_SHIFT


def num_lfr_frames(n_samples: int) -> int:
    """LFR frames (one per 60 ms) for ``n_samples`` samples: ``ceil(fbank_frames / 6)``."""
    return -(-num_fbank_frames(n_samples) // LFR_N)


# ---------------------------------------------------------------------------------------------
# CMVN


def _bracketed_vector(tokens: list[str], start: int, path: object) -> list[float]:
    """Numbers between the first ``[`` at or after ``start`` and the next ``]``."""
    try:
        open_at = tokens.index("[", start)
        close_at = tokens.index("]", open_at + 1)
    except ValueError:
        raise ValueError(f"{path}: unterminated '[ ... ]' vector in CMVN file") from None
    try:
        return [float(t) for t in tokens[open_at + 1 : close_at]]
    except ValueError as exc:
        raise ValueError(f"{path}: non-numeric CMVN value ({exc})") from None


def load_cmvn(path: str | os.PathLike) -> torch.Tensor:
    """Read a Kaldi nnet-text ``am.mvn`` into a float32 tensor ``[2, 560]``: (shift, scale).

    Same result as funasr's ``load_cmvn``: the vector after ``<AddShift> ... <LearnRateCoef> c``
    is row 0 (added), the one after ``<Rescale> ... <LearnRateCoef> c`` is row 1 (multiplied).
    Tolerates vectors that span several lines.
    """
    with open(path, "r", encoding="utf-8") as f:
        tokens = f.read().split()
    rows: dict[str, list[float]] = {}
    for i, tok in enumerate(tokens):
        if tok in ("<AddShift>", "<Rescale>"):
            j = i + 1
            # skip "<AddShift> in out" up to <LearnRateCoef> (funasr requires it on the next line)
            while j < len(tokens) and tokens[j] != "<LearnRateCoef>" and not tokens[j].startswith("<"):
                j += 1
            if j >= len(tokens) or tokens[j] != "<LearnRateCoef>":
                continue
            rows[tok] = _bracketed_vector(tokens, j + 2, path)
    missing = [k for k in ("<AddShift>", "<Rescale>") if k not in rows]
    if missing:
        raise ValueError(f"{path}: CMVN file has no {' / '.join(missing)} vector")
    shift, scale = rows["<AddShift>"], rows["<Rescale>"]
    if len(shift) != len(scale):
        raise ValueError(f"{path}: CMVN shift has {len(shift)} values but scale has {len(scale)}")
    return torch.tensor([shift, scale], dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# constant tensors (built exactly like torchaudio.compliance.kaldi, in float32)


def _hamming_window() -> torch.Tensor:
    """Symmetric Hamming window ``[400]`` (kaldi/torchaudio ``window_type="hamming"``)."""
    return torch.hamming_window(
        FRAME_LENGTH, periodic=False, alpha=0.54, beta=0.46, dtype=torch.float32
    )


def _mel_scale_scalar(freq: float) -> float:
    return 1127.0 * math.log(1.0 + freq / 700.0)


def _mel_matrix() -> torch.Tensor:
    """Mel filterbank ``[257, 80]`` (rfft bin x mel bin), the transpose of torchaudio's
    ``get_mel_banks(80, 512, 16000, 20, 0, ...)`` padded with a zero Nyquist column."""
    nyquist = 0.5 * SAMPLE_RATE_HZ
    fft_bin_width = SAMPLE_RATE_HZ / FFT_SIZE
    mel_low = _mel_scale_scalar(LOW_FREQ_HZ)
    mel_high = _mel_scale_scalar(nyquist)
    mel_delta = (mel_high - mel_low) / (N_MELS + 1)
    # Same op order and dtypes as torchaudio (float32 tensors, python-float scalars).
    b = torch.arange(N_MELS).unsqueeze(1)
    left = mel_low + b * mel_delta
    center = mel_low + (b + 1.0) * mel_delta
    right = mel_low + (b + 2.0) * mel_delta
    freqs = fft_bin_width * torch.arange(FFT_SIZE / 2)
    mel = (1127.0 * (1.0 + freqs / 700.0).log()).unsqueeze(0)
    up = (mel - left) / (center - left)
    down = (right - mel) / (right - center)
    banks = torch.max(torch.zeros(1), torch.min(up, down))  # [80, 256]
    banks = F.pad(banks, (0, 1))  # [80, 257]: the Nyquist bin has weight 0
    return banks.to(torch.float32).t().contiguous()  # [257, 80]


# ---------------------------------------------------------------------------------------------
# module


class BatchedFrontend(torch.nn.Module):
    """Padded waves ``[B, N]`` -> SenseVoice features ``[B, T, 560]`` in one vectorised pass.

    Buffers: ``window`` [400], ``mel`` [257, 80], ``cmvn`` [2, 560] (row 0 shift, row 1 scale).
    """

    window: torch.Tensor
    mel: torch.Tensor
    cmvn: torch.Tensor

    def __init__(self, cmvn: torch.Tensor):
        super().__init__()
        cmvn = torch.as_tensor(cmvn, dtype=torch.float32)
        if tuple(cmvn.shape) != (2, FEAT_DIM):
            raise ValueError(f"cmvn must have shape [2, {FEAT_DIM}], got {list(cmvn.shape)}")
        self.register_buffer("window", _hamming_window(), persistent=False)
        self.register_buffer("mel", _mel_matrix(), persistent=False)
        self.register_buffer("cmvn", cmvn.clone(), persistent=False)

    @classmethod
    def from_model_dir(cls, model_dir: str | os.PathLike) -> "BatchedFrontend":
        """Build from a SenseVoice model directory (reads ``model_dir/am.mvn``)."""
        return cls(load_cmvn(os.path.join(os.fspath(model_dir), "am.mvn")))

    def forward(
        self, waves: torch.Tensor, lengths: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Features for a padded batch.

        Args:
            waves: ``[B, N]`` float samples in [-1, 1], zero-padded past each item's length, on
                any device (the computation follows it).
            lengths: ``[B]`` integer sample counts (``<= N``). Keep them on ``waves.device``
                for a sync-free call (CPU lengths are copied over first).

        Returns:
            ``feats`` ``[B, T_max, 560]`` float32 with ``T_max = num_lfr_frames(N)`` (0 when
            ``N < 400``), rows past each item's length zero; ``feat_lengths`` ``[B]`` int64
            (``num_lfr_frames`` of each length), on ``waves.device``.
        """
        if waves.dim() != 2:
            raise ValueError(f"waves must be [B, N], got shape {list(waves.shape)}")
        device = waves.device
        f32 = torch.float32
        batch, n = waves.shape
        lengths = lengths.to(device=device, dtype=torch.int64).reshape(batch)
        window = self.window.to(device=device, dtype=f32)
        mel = self.mel.to(device=device, dtype=f32)
        cmvn = self.cmvn.to(device=device, dtype=f32)

        # -- per-item frame counts (tensor ops only: no host sync) --
        lengths = lengths.clamp(0, n)
        n_frames = torch.where(
            lengths >= FRAME_LENGTH,
            torch.div(lengths - FRAME_LENGTH, FRAME_SHIFT, rounding_mode="floor") + 1,
            torch.zeros_like(lengths),
        )  # [B]
        feat_lengths = torch.div(n_frames + (LFR_N - 1), LFR_N, rounding_mode="floor")  # [B]

        t_fbank = num_fbank_frames(n)  # static, from the padded width
        t_lfr = num_lfr_frames(n)
        if t_fbank == 0:  # every item shorter than one frame (static shape decision)
            return waves.new_zeros((batch, 0, FEAT_DIM), dtype=f32), feat_lengths
        x = waves.to(f32) * WAVE_SCALE

        # -- fbank: [B, t_fbank, 400] frames -> [B, t_fbank, 80] log-mel --
        frames = x.unfold(1, FRAME_LENGTH, FRAME_SHIFT)  # view, [B, t_fbank, 400]
        frames = frames - frames.mean(dim=-1, keepdim=True)  # remove DC offset
        prev = torch.cat((frames[..., :1], frames[..., :-1]), dim=-1)  # x[-1] := x[0]
        frames = (frames - PREEMPHASIS * prev) * window
        spec = torch.fft.rfft(frames, n=FFT_SIZE, dim=-1).abs().pow(2.0)  # [B, t_fbank, 257]
        logmel = torch.matmul(spec, mel).clamp_min(EPSILON).log()  # [B, t_fbank, 80]

        # -- LFR: one gather; row j takes frames clamp(j*6 + k - 3, 0, frames_i - 1), k < 7 --
        offsets = (
            torch.arange(t_lfr, device=device).unsqueeze(1) * LFR_N
            + torch.arange(LFR_M, device=device).unsqueeze(0)
            - LFR_LEFT_PAD
        ).reshape(1, t_lfr * LFR_M)  # [1, t_lfr*7]
        last = (n_frames - 1).clamp_min(0).unsqueeze(1)  # [B, 1]
        idx = torch.minimum(offsets.clamp_min(0), last)  # [B, t_lfr*7], each item's own last frame
        idx = idx.unsqueeze(-1).expand(batch, t_lfr * LFR_M, N_MELS)
        feats = torch.gather(logmel, 1, idx).reshape(batch, t_lfr, FEAT_DIM)

        # -- CMVN, then zero the rows past each item's length --
        feats = (feats + cmvn[0]) * cmvn[1]
        valid = torch.arange(t_lfr, device=device).unsqueeze(0) < feat_lengths.unsqueeze(1)
        feats = feats.masked_fill(~valid.unsqueeze(-1), 0.0)
        return feats, feat_lengths
