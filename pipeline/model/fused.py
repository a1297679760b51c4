"""The fused encoder: one SAN-M block as a pure function of its weights, compiled once.

The eager :class:`~pipeline.model.engine.EncoderCore` runs each block as ~20 separate kernels;
two thirds of its GPU time was memory-bound work between the GEMMs (bias and residual adds, the
FSMN depthwise conv and its transposes, casts, LayerNorm). Here the same arithmetic is written so
that TorchInductor fuses everything between two GEMMs into one kernel:

- LayerNorm + the cast to the compute dtype: one kernel (the statistics in fp32);
- the FSMN memory (depthwise conv over time of the masked values) + its own residual + the mask:
  one hand-written kernel (:mod:`pipeline.model.kernels`; no conv, no transposes, no padded
  copy), accumulated and returned in fp32;
- attention output + memory + the block's residual + the next LayerNorm: one kernel;
- FFN: bias and ReLU in the first GEMM's epilogue, the second GEMM's bias in its own, the
  residual add one kernel;
- the CTC head's vocabulary padded to a multiple of 64 (25,055 rows sent cuBLAS to a slow
  unaligned kernel: 3.2 ms of 29 at 64 x 10 s), then the ban and the argmax in one reduction.

The residual stream stays fp32 when asked (the fidelity guarantee), and nothing is cast twice.
The block takes its weights as arguments, so one compiled graph serves all 50 + 20 blocks and
every (batch, frames) shape: batch and frames are marked dynamic; a batch of one is its own
specialisation (PyTorch specialises sizes 0 and 1). Compiled artefacts go to TorchInductor's
on-disk caches (``cache_dir/inductor``): the compile cost is paid once per machine, model shape
and torch version, never per start.

:func:`sanm_block` also runs uncompiled: that is how CPU tests check its arithmetic against the
eager reference block and funasr.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F

from pipeline.domain.tags import EMO_UNKNOWN_ID
from pipeline.model import fp8, kernels

logger = logging.getLogger("sensevoice.engine")


class BlockWeights(NamedTuple):
    """One SAN-M block's tensors (read-only views of funasr's parameters, in the compute dtype;
    LayerNorm parameters in the residual stream's dtype)."""

    ln1_w: torch.Tensor
    ln1_b: torch.Tensor
    qkv_w: torch.Tensor  # [3 D, D_in]
    qkv_b: torch.Tensor
    fsmn_w: torch.Tensor  # [D, K]: depthwise taps, column k multiplies frame t + k - left
    out_w: torch.Tensor  # [D, D]
    out_b: torch.Tensor
    ln2_w: torch.Tensor
    ln2_b: torch.Tensor
    w1: torch.Tensor  # [FFN, D]
    b1: torch.Tensor
    w2: torch.Tensor  # [D, FFN]
    b2: torch.Tensor
    # FP8 (:mod:`pipeline.model.fp8`): a layer with a scale [1, N] has its weight in e4m3
    qkv_s: torch.Tensor | None = None
    out_s: torch.Tensor | None = None
    w1_s: torch.Tensor | None = None
    w2_s: torch.Tensor | None = None


class BlockSpec(NamedTuple):
    """The constants of a block (the compiled graph specialises on them)."""

    heads: int
    left: int  # FSMN taps before the current frame
    residual: bool  # x + attention (False for the first block: 560 -> 512)
    eps: float


def block_weights(layer, dtype: torch.dtype, ln_dtype: torch.dtype) -> tuple[BlockWeights, BlockSpec]:
    """Views of one funasr ``EncoderLayerSANM``'s parameters, cast once."""
    att, ff = layer.self_attn, layer.feed_forward
    left, right = att.pad_fn.padding
    taps = att.fsmn_block.weight  # [D, 1, K]
    assert taps.shape[-1] == left + right + 1, "FSMN padding must cover the kernel"

    def c(t, dt=dtype):
        return t.detach().to(dt).contiguous()

    w = BlockWeights(
        c(layer.norm1.weight, ln_dtype), c(layer.norm1.bias, ln_dtype),
        c(att.linear_q_k_v.weight), c(att.linear_q_k_v.bias),
        c(taps[:, 0, :]),
        c(att.linear_out.weight), c(att.linear_out.bias),
        c(layer.norm2.weight, ln_dtype), c(layer.norm2.bias, ln_dtype),
        c(ff.w_1.weight), c(ff.w_1.bias), c(ff.w_2.weight), c(ff.w_2.bias),
    )  # fmt: skip
    spec = BlockSpec(att.h, left, layer.in_size == layer.size, float(layer.norm1.eps))
    return w, spec


def sanm_block(x: torch.Tensor, mask: torch.Tensor, key_mask: torch.Tensor, w: BlockWeights,
               spec: BlockSpec) -> torch.Tensor:
    """One SAN-M block (pre-norm), the arithmetic of ``EncoderCore._layer``.

    x [B, T, D_in] in the residual stream's dtype; mask [B, T, 1] in the compute dtype (1 = frame);
    key_mask [B, 1, 1, T] bool (True = attend). Returns [B, T, D] in x's dtype."""
    dtype = w.qkv_b.dtype  # (the weight's, unless it is e4m3)
    b, t, _ = x.shape
    d = w.out_w.shape[0]
    h = F.layer_norm(x, (x.shape[-1],), w.ln1_w, w.ln1_b, spec.eps).to(dtype)
    qkv = _linear(h, w.qkv_w, w.qkv_b, w.qkv_s)
    q, k, v = qkv.split(d, dim=-1)
    mem = kernels.fsmn_memory(v, mask[:, :, 0], w.fsmn_w, spec.left)  # fp32, its own kernel
    heads = (b, t, spec.heads, d // spec.heads)
    o = F.scaled_dot_product_attention(
        q.view(heads).transpose(1, 2), k.view(heads).transpose(1, 2),
        v.view(heads).transpose(1, 2), attn_mask=key_mask,
    )
    o = _linear(o.transpose(1, 2).reshape(b, t, d), w.out_w, w.out_b, w.out_s)
    o = (o.float() + mem).to(x.dtype)
    x = x + o if spec.residual else o
    h = F.layer_norm(x, (d,), w.ln2_w, w.ln2_b, spec.eps).to(dtype)
    # bias + ReLU in the GEMM's epilogue (cuBLASLt; inductor keeps this op as it is)
    if w.w1_s is None:
        hidden = torch._addmm_activation(w.b1, h.reshape(b * t, d), w.w1.t())
    else:
        hidden = F.relu(fp8.linear(h.reshape(b * t, d), w.w1, w.w1_s, w.b1, dtype))
    y = _linear(hidden, w.w2, w.b2, w.w2_s).view(b, t, d)
    return x + y.to(x.dtype)


def _linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """``F.linear``; with a scale, the e4m3 weight's product (:func:`pipeline.model.fp8.linear`)."""
    if scale is None:
        return F.linear(x, weight, bias)
    return fp8.linear(x, weight, scale, bias, bias.dtype)


QUERY_FRAMES = 4  # the first output frames answer the prompt: language, emotion, event, itn


def head(x: torch.Tensor, ln_w: torch.Tensor, ln_b: torch.Tensor, eps: float, lo_w: torch.Tensor,
         lo_b: torch.Tensor, ban_emo_unk: torch.Tensor, emo_unknown_id: int,
         tag_ids: torch.Tensor | None = None):
    """Final LayerNorm, CTC projection, the EMO_UNKNOWN ban and the argmax (ids [B, T] int64).

    With ``tag_ids`` [K] it also returns, from the same logits (no second pass), the confidence
    of every frame's argmax, ``logp`` [B, T] fp32 = its log softmax (max - logsumexp: one more
    reduction over the vocabulary, fused with the argmax's when compiled), and the tag vocabulary's
    logits at the query frames, ``tags`` [B, 4, K] fp32 (the language allow-list and the tag
    scores are decided from these on the host), and the projection's input ``hidden`` [B, T, D]
    (the hotword search, :mod:`pipeline.model.hotwords`, scores its terms' pieces from it; it is
    the matmul's operand, already in memory)."""
    h = F.layer_norm(x, (x.shape[-1],), ln_w, ln_b, eps).to(lo_w.dtype)
    logits = F.linear(h, lo_w, lo_b)
    col = torch.arange(logits.shape[-1], device=logits.device) == emo_unknown_id
    logits = logits.masked_fill(col & ban_emo_unk[:, None, None], float("-inf"))
    ids = logits.argmax(-1)
    if tag_ids is None:
        return ids
    return ids, *scores(logits, tag_ids, ids), h


def scores(logits: torch.Tensor, tag_ids: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(log softmax of each frame's best token [B, T] fp32, the query frames' logits of the tag
    ids [B, 4, K] fp32) from banned logits [B, T, V] and their argmax ``ids``. On a CPU (eager,
    no graph to capture) only the frames that emit a token are scored (blank frames, most of
    them, get 0: no token's confidence reads them): there the logsumexp over the vocabulary was
    as slow as the demo model's whole encoder."""
    tags = logits[:, :QUERY_FRAMES].index_select(-1, tag_ids).float()
    if logits.device.type == "cpu":
        emits = ids != 0
        picked = logits[emits].float()  # [N, V]
        logp = torch.zeros(ids.shape, dtype=torch.float32, device=logits.device)
        best = picked.amax(-1, keepdim=True)
        logp[emits] = picked.sub_(best).exp_().sum(-1).log_().neg_()  # (picked is a copy)
        return logp, tags
    wide = logits.float()
    return wide.amax(-1) - torch.logsumexp(wide, -1), tags


@dataclass(frozen=True)
class Norm:
    weight: torch.Tensor
    bias: torch.Tensor
    eps: float


class FusedModel:
    """The encoder + CTC head as tensors and the functions above: everything the fast path needs,
    with no funasr module in it. Built from a funasr model (:meth:`from_funasr`, beside the eager
    reference) or straight from a model directory's weights (:mod:`pipeline.model.fast_load`).
    Runs the compiled functions once ``compiled.ready``, the same functions uncompiled before."""

    def __init__(self, blocks: list[tuple[BlockWeights, BlockSpec]], tp_blocks: list[tuple[BlockWeights, BlockSpec]],
                 after_norm: Norm, tp_norm: Norm, lo_w: torch.Tensor, lo_b: torch.Tensor,
                 pe: torch.Tensor, scale: float, dtype: torch.dtype, fp32_residual: bool,
                 compiled: "CompiledBlocks | None" = None):
        self.blocks, self.tp_blocks = blocks, tp_blocks
        self.after_norm, self.tp_norm = after_norm, tp_norm
        self.lo_w, self.lo_b = lo_w, lo_b
        self.pe, self.scale, self.dtype = pe, scale, dtype
        self.fp32_residual = fp32_residual
        self.compiled = compiled
        rows = (lo_w.shape[0] + 63) // 64 * 64  # the CTC rows padded (bias -inf: never chosen)
        self.lo_w_padded = torch.zeros(rows, lo_w.shape[1], device=lo_w.device, dtype=lo_w.dtype)
        self.lo_b_padded = torch.full((rows,), float("-inf"), device=lo_b.device, dtype=lo_b.dtype)
        self.lo_w_padded[: lo_w.shape[0]] = lo_w
        self.lo_b_padded[: lo_b.shape[0]] = lo_b
        # the tag vocabulary's ids (languages, emotions, events, itn): the engine sets its own
        self.tag_ids = torch.zeros(1, device=lo_w.device, dtype=torch.long)

    @classmethod
    def from_funasr(cls, layers, tp_layers, after_norm, tp_norm, lo, pe: torch.Tensor, scale: float,
                    dtype: torch.dtype, fp32_residual: bool, compiled: "CompiledBlocks | None"):
        """Views of a funasr encoder's parameters (already on the device, in the compute dtype)."""
        ln_dtype = torch.float32 if fp32_residual else dtype

        def norm(n):
            return Norm(n.weight.detach().to(ln_dtype), n.bias.detach().to(ln_dtype), float(n.eps))

        return cls([block_weights(layer, dtype, ln_dtype) for layer in layers],
                   [block_weights(layer, dtype, ln_dtype) for layer in tp_layers],
                   norm(after_norm), norm(tp_norm), lo.weight.detach(), lo.bias.detach(), pe, scale,
                   dtype, fp32_residual, compiled)

    @property
    def fused(self) -> bool:
        return True

    def use_fp8(self, mode: str) -> tuple[str, ...]:
        """The linear layers ``mode`` names ('off', 'ffn', 'all') in e4m3 from now on
        (:mod:`pipeline.model.fp8`); a CUDA device without fp8 units is refused. The layers."""
        layers = fp8.layers_of(mode)
        if layers:
            fp8.check_device(self.lo_w.device)
            if self.lo_w.device.type == "cpu":
                logger.warning("fp8 GEMMs on a CPU run the emulation (tests): slower than the 16-bit path")
            fp8.quantise_model(self, layers)
        return layers

    def _functions(self):
        c = self.compiled
        if c is not None and c.ready:
            return c.block, c.head, c.mark
        return sanm_block, head, _no_mark

    def __call__(self, x, lengths, ban_emo_unk, return_logits: bool = False, with_scores: bool = False):
        return self.forward_fused(x, lengths, ban_emo_unk, return_logits, with_scores=with_scores)

    def forward_fused(self, x, lengths, ban_emo_unk, return_logits: bool = False, compiled: bool | None = None,
                      with_scores: bool = False):
        """x [B, T, D_in] (compute dtype), lengths [B], ban_emo_unk [B] bool -> ids [B, T] (or
        logits; or (ids, logp, tags, hidden) ``with_scores``: :func:`head`). ``compiled=True`` runs the
        compiled functions even before ``ready`` (compiling)."""
        block, head_fn, mark = self._functions()
        if compiled and self.compiled is not None:
            block, head_fn, mark = self.compiled.block, self.compiled.head, self.compiled.mark
        x, mask, key_mask = prologue(x, lengths, self.dtype, self.fp32_residual, self.scale, self.pe)
        mark((mask, (0, 1)), (key_mask, (0, 3)), (ban_emo_unk, (0,)))
        for n, (w, spec) in enumerate(self.blocks + self.tp_blocks):
            if n == len(self.blocks):
                an = self.after_norm
                x = F.layer_norm(x, (x.shape[-1],), an.weight, an.bias, an.eps)
            mark((x, (0, 1)))
            x = block(x, mask, key_mask, w, spec)
        tn = self.tp_norm
        if return_logits:  # fidelity checks: the same head, uncompiled, logits kept
            h = F.layer_norm(x, (x.shape[-1],), tn.weight, tn.bias, tn.eps)
            logits = F.linear(h.to(self.dtype), self.lo_w, self.lo_b)
            col = torch.arange(logits.shape[-1], device=logits.device) == EMO_UNKNOWN_ID
            return logits.masked_fill(col & ban_emo_unk[:, None, None], float("-inf"))
        mark((x, (0, 1)))
        return head_fn(x, tn.weight, tn.bias, tn.eps, self.lo_w_padded, self.lo_b_padded, ban_emo_unk,
                       EMO_UNKNOWN_ID, self.tag_ids if with_scores else None)


def prologue(x: torch.Tensor, lengths: torch.Tensor, dtype: torch.dtype, fp32_residual: bool,
             scale: float, pe: torch.Tensor):
    """Masks from the lengths (frames [B, T, 1] in the compute dtype; keys [B, 1, 1, T] bool) and
    the scaled input plus the positional encoding, in the residual stream's dtype."""
    t = x.shape[1]
    valid = torch.arange(t, device=x.device)[None, :] < lengths[:, None]  # [B, T] bool
    if fp32_residual:
        x = x.float()
    return x * scale + pe[:t], valid[:, :, None].to(dtype), valid[:, None, None, :]


def _no_mark(*_):
    pass




def configure_cache(cache_dir: Path | None) -> None:
    """Point TorchInductor's on-disk caches (FX graphs, AOT autograd, Triton kernels) at the
    service's cache directory, unless the operator set ``TORCHINDUCTOR_CACHE_DIR`` already."""
    if cache_dir is None or os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return
    path = Path(cache_dir) / "inductor"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    try:  # read when inductor's config is first imported; set it too in case it already was
        import torch._inductor.config as cfg

        cfg.fx_graph_cache = True
        cfg.autotune_local_cache = True
    except Exception:  # pragma: no cover - an older or newer torch without these knobs
        pass
    logger.info("compiled kernels cached in %s", path)


class CompiledBlocks:
    """torch.compile'd :func:`sanm_block` and :func:`head`, shared by every block of a model.

    ``ready`` turns true once :meth:`compile` has run each specialisation (batch of one, batch of
    several; the first block and the others) on example shapes, so later calls never compile -
    in particular never inside a CUDA-graph capture (:meth:`no_recompile` makes that an error)."""

    def __init__(self, compile: bool = True):
        """``compile=False`` runs the same functions uncompiled (CPU tests of their arithmetic)."""
        self.compiles = compile
        if compile:
            import torch._dynamo

            torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 16)
            self.block = torch.compile(sanm_block, fullgraph=True)
            self.head = torch.compile(head, fullgraph=True)
        else:
            self.block, self.head = sanm_block, head
        self.ready = not compile
        self.compile_seconds = 0.0

    def mark(self, *tensors_dims: tuple[torch.Tensor, tuple[int, ...]]) -> None:
        """Batch and frames are dynamic (one graph for every bucket); sizes 0/1 specialise."""
        if not self.compiles:
            return
        for t, dims in tensors_dims:
            for d in dims:
                if t.shape[d] > 1:
                    torch._dynamo.maybe_mark_dynamic(t, d)

    def no_recompile(self):
        """A context in which a call that would compile raises instead (graph capture)."""
        if not self.compiles:
            return contextlib.nullcontext()
        return torch.compiler.set_stance("fail_on_recompile")
