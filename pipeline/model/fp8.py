"""FP8 (e4m3) matrix products for the encoder's linear layers (issue 43).

A quantised linear layer keeps its weight as ``float8_e4m3fn`` [N, K] with one fp32 scale per
output channel (``w ~ q * scale``, the row's amax mapped to e4m3's largest value, 448), quantised
once at load. Its input is quantised per token (row-wise, dynamic: each row's amax, every call);
the product is ``(xq @ wq.T) * sx * sw`` accumulated in fp32:

- on a CUDA device of compute capability 8.9+ (Hopper: H100/H200) by ``torch._scaled_mm`` with
  row-wise scales (``scale_a`` [M, 1], ``scale_b`` [1, N], fp32), out in bf16 (the row-wise kernels'
  output type) and cast to the compute dtype; the bias is added after (inductor fuses it, the cast
  and the next op into one kernel);
- anywhere else by :func:`emulated_mm`: the same quantised operands dequantised to fp32 and
  multiplied (CPU tests check scales, shapes and the tokens with it; the GPU test checks
  ``_scaled_mm`` against it).

Which layers: ``LAYER_SETS`` names the choices of :class:`~pipeline.config.EngineSettings`'s
``fp8_gemm``: ``ffn`` (the feed-forward's two linears, ~2/3 of a block's GEMM FLOPs) or ``all``
(also the attention's qkv and output projections). The CTC head and the FSMN taps stay 16-bit.
A layer whose dimensions ``_scaled_mm`` cannot take (not multiples of 16) stays 16-bit too.
The 16-bit path is untouched: a block without scales runs exactly the arithmetic it ran before.
"""

from __future__ import annotations

import logging
from typing import Iterable, Literal

import torch

logger = logging.getLogger("sensevoice.engine")

E4M3 = torch.float8_e4m3fn
E4M3_MAX = 448.0  # torch.finfo(float8_e4m3fn).max
AMAX_FLOOR = 1e-12  # an all-zero row gets this amax (scale ~2e-15): quantised to zeros, no NaN
MM_OUT = torch.bfloat16  # _scaled_mm's row-wise output type (then cast to the compute dtype)

# BlockWeights' (weight field, scale field) of each quantisable linear layer
LAYERS: dict[str, tuple[str, str]] = {
    "qkv": ("qkv_w", "qkv_s"),
    "out": ("out_w", "out_s"),
    "w1": ("w1", "w1_s"),
    "w2": ("w2", "w2_s"),
}
Fp8Mode = Literal["off", "ffn", "all"]
LAYER_SETS: dict[str, tuple[str, ...]] = {"off": (), "ffn": ("w1", "w2"), "all": ("qkv", "out", "w1", "w2")}


class Fp8Unsupported(RuntimeError):
    """FP8 GEMMs were asked for on a device that has none (a CUDA GPU before compute capability 8.9)."""


def layers_of(mode: str) -> tuple[str, ...]:
    """The layer names of a setting's value ('off', 'ffn', 'all'), or a named error."""
    try:
        return LAYER_SETS[mode]
    except KeyError:
        raise ValueError(f"fp8_gemm must be one of {sorted(LAYER_SETS)}, not {mode!r}") from None


def quantise_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] -> (q [N, K] e4m3 contiguous, scale [1, N] fp32): per output channel, w ~ q * scale."""
    if w.dim() != 2:
        raise ValueError(f"a linear weight is 2-D, got shape {tuple(w.shape)}")
    wf = w.detach().float()
    scale = wf.abs().amax(dim=1).clamp(min=AMAX_FLOOR) / E4M3_MAX  # [N]
    q = (wf / scale[:, None]).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3).contiguous()
    return q, scale[None, :].contiguous()


def quantise_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [M, K] -> (q [M, K] e4m3, scale [M, 1] fp32): per row (token), dynamic."""
    xf = x.float()
    scale = xf.abs().amax(dim=-1, keepdim=True).clamp(min=AMAX_FLOOR) / E4M3_MAX
    return (xf / scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3), scale


def emulated_mm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """The quantised product in fp32 on any device: (xq @ wq.T) * xs * ws, [M, N]."""
    return (xq.float() @ wq.float().t()) * xs * ws


def scaled_mm(xq: torch.Tensor, xs: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """The quantised product on a Hopper GPU (``torch._scaled_mm``, row-wise scales), [M, N] bf16."""
    return torch._scaled_mm(xq, wq.t(), scale_a=xs, scale_b=ws, out_dtype=MM_OUT)


def linear(x: torch.Tensor, wq: torch.Tensor, ws: torch.Tensor, bias: torch.Tensor | None,
           out_dtype: torch.dtype) -> torch.Tensor:
    """``F.linear(x, w, bias)`` with the e4m3 weight ``wq`` [N, K] and its scales ``ws`` [1, N]:
    x [..., K] quantised per token. Returns [..., N] in ``out_dtype``."""
    lead, k = x.shape[:-1], x.shape[-1]
    xq, xs = quantise_rows(x.reshape(-1, k))
    if x.is_cuda:
        y = scaled_mm(xq, xs, wq, ws)
    else:
        y = emulated_mm(xq, xs, wq, ws)
    if bias is not None:
        y = y + bias
    return y.to(out_dtype).view(*lead, wq.shape[0])


def gemm_ok(w: torch.Tensor) -> bool:
    """``_scaled_mm`` takes K and N multiples of 16."""
    return w.shape[0] % 16 == 0 and w.shape[1] % 16 == 0


def quantise_block(w, layers: Iterable[str]):
    """A copy of :class:`~pipeline.model.fused.BlockWeights` ``w`` with the named layers' weights in
    e4m3 and their scales set (the other tensors shared, not copied)."""
    fields = {}
    for name in layers:
        if name not in LAYERS:
            raise ValueError(f"not a quantisable layer: {name!r} (one of {sorted(LAYERS)})")
        wf, sf = LAYERS[name]
        weight = getattr(w, wf)
        if getattr(w, sf) is not None:
            raise ValueError(f"layer {name!r} is quantised already")
        if not gemm_ok(weight):
            logger.info("fp8: %s %s kept 16-bit (dimensions not multiples of 16)", name, tuple(weight.shape))
            continue
        fields[wf], fields[sf] = quantise_weight(weight)
    return w._replace(**fields)


def check_device(device: torch.device) -> None:
    """Refuse a CUDA GPU without FP8 matrix units (before compute capability 8.9)."""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        name = torch.cuda.get_device_name(device)
        raise Fp8Unsupported(f"fp8_gemm needs a GPU of compute capability 8.9+ (Ada, Hopper); {name} has none")


def quantise_model(model, layers: Iterable[str]) -> int:
    """Quantise the named layers of every block of a :class:`~pipeline.model.fused.FusedModel`
    in place (its 16-bit copies of them are dropped). Returns the number of e4m3 weights."""
    layers = tuple(layers)
    model.blocks = [(quantise_block(w, layers), spec) for w, spec in model.blocks]
    model.tp_blocks = [(quantise_block(w, layers), spec) for w, spec in model.tp_blocks]
    n = sum(getattr(w, LAYERS[name][1]) is not None for w, _ in model.blocks + model.tp_blocks for name in layers)
    logger.info("fp8: %d linear weights in e4m3 (%s)", n, ",".join(layers))
    return n
