"""Hand-written kernels the compiled encoder calls as opaque ops (TorchInductor does not fuse them).

``sensevoice::fsmn_memory`` - the FSMN memory of a SAN-M block in one pass over the values:

    out[b, t, d] = (sum_k taps[d, k] * vm[b, t + k - left, d] + vm[b, t, d]) * mask[b, t]
    with vm = v * mask (zero outside [0, T))

accumulated in fp32 and returned in fp32. Left to TorchInductor, this arithmetic was inlined into
the next LayerNorm's looping reduction and recomputed there (94 us per block at 64 x 10 s on an
H200, 23 % of the encoder); as its own kernel it reads the values once. On CUDA it is a Triton
kernel; elsewhere the same arithmetic in PyTorch (:func:`fsmn_memory_reference`), which is also the
oracle of its tests (Triton's interpreter runs the kernel on the CPU there).
"""

from __future__ import annotations

import torch

try:  # Triton ships with CUDA builds of PyTorch; a CPU-only install has none
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only torch
    triton = None


def fsmn_memory_reference(v: torch.Tensor, mask: torch.Tensor, taps: torch.Tensor, left: int) -> torch.Tensor:
    """v [B, T, D] (any strides), mask [B, T] (1 = frame), taps [D, K]: the memory, fp32."""
    vm = v.float() * mask.float()[:, :, None]
    t, k = vm.shape[1], taps.shape[1]
    vp = torch.nn.functional.pad(vm, (0, 0, left, k - 1 - left))
    w = taps.float()
    acc = vp[:, 0:t] * w[:, 0]
    for j in range(1, k):
        acc = acc + vp[:, j:j + t] * w[:, j]
    return (acc + vm) * mask.float()[:, :, None]


if triton is not None:

    @triton.jit
    def _fsmn_kernel(v_ptr, m_ptr, w_ptr, o_ptr, T, D, svb, svt, smb, smt, sob, sot,
                     LEFT: tl.constexpr, K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr):
        b = tl.program_id(0)
        t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)[:, None]
        d = tl.program_id(2) * BLOCK_D + tl.arange(0, BLOCK_D)[None, :]
        d_ok = d < D
        acc = tl.zeros((BLOCK_T, BLOCK_D), dtype=tl.float32)
        for k in tl.static_range(K):
            s = t + (k - LEFT)
            s_ok = (s >= 0) & (s < T)
            vv = tl.load(v_ptr + b * svb + s * svt + d, mask=s_ok & d_ok, other=0.0).to(tl.float32)
            mm = tl.load(m_ptr + b * smb + s * smt, mask=s_ok, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + d * K + k, mask=d_ok, other=0.0).to(tl.float32)
            acc = acc + vv * mm * w
        t_ok = t < T
        mc = tl.load(m_ptr + b * smb + t * smt, mask=t_ok, other=0.0).to(tl.float32)
        vc = tl.load(v_ptr + b * svb + t * svt + d, mask=t_ok & d_ok, other=0.0).to(tl.float32)
        out = (acc + vc * mc) * mc
        tl.store(o_ptr + b * sob + t * sot + d, out, mask=t_ok & d_ok)


def fsmn_memory_triton(v: torch.Tensor, mask: torch.Tensor, taps: torch.Tensor, left: int) -> torch.Tensor:
    """The Triton kernel (CUDA, or the CPU under ``TRITON_INTERPRET=1``)."""
    b, t, d = v.shape
    k = taps.shape[1]
    assert v.stride(2) == 1 and taps.is_contiguous() and mask.dim() == 2
    out = torch.empty(b, t, d, device=v.device, dtype=torch.float32)
    block_t, block_d = 16, 128
    grid = (b, triton.cdiv(t, block_t), triton.cdiv(d, block_d))
    _fsmn_kernel[grid](v, mask, taps, out, t, d, v.stride(0), v.stride(1), mask.stride(0),
                       mask.stride(1), out.stride(0), out.stride(1), LEFT=left, K=k,
                       BLOCK_T=block_t, BLOCK_D=block_d, num_warps=4)
    return out


@torch.library.custom_op("sensevoice::fsmn_memory", mutates_args=())
def fsmn_memory(v: torch.Tensor, mask: torch.Tensor, taps: torch.Tensor, left: int) -> torch.Tensor:
    """The FSMN memory (module docstring): Triton on CUDA, PyTorch elsewhere. fp32 [B, T, D]."""
    if v.is_cuda and triton is not None:
        return fsmn_memory_triton(v, mask, taps, left)
    return fsmn_memory_reference(v, mask, taps, left)


@fsmn_memory.register_fake
def _fsmn_memory_fake(v, mask, taps, left):
    return v.new_empty(v.shape, dtype=torch.float32)
