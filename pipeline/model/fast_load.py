"""Load SenseVoiceSmall for the fused GPU path straight from its directory, without funasr.

``import funasr`` imports every model it knows (with scikit-learn and transformers): 15 s in a fresh
process on the H200 machine, most of a server's start-up. The fused path needs only tensors, so
here they are read from ``model.pt`` (memory-mapped) and arranged as funasr's own modules would
hold them, from ``config.yaml``'s encoder settings; the tokenizer is SentencePiece itself (funasr's
``SentencepiecesTokenizer.decode`` is ``DecodeIds``) and the front end reads ``am.mvn``.

Only a directory this module understands is taken (SenseVoiceSmall, a SAN-M encoder with
pre-norm, the state dict's names and shapes as expected); anything else returns ``None`` and the
caller loads through funasr as before. ``tests/test_engine.py`` checks that an engine built here
gives the logits and tokens of one built through funasr.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from pathlib import Path

import torch

from pipeline.domain.errors import ModelUnavailable
from pipeline.model.features import BatchedFrontend
from pipeline.model.fused import BlockSpec, BlockWeights, FusedModel, Norm
from pipeline.model.model_files import REQUIRED_FILES, read_state_dict

logger = logging.getLogger("sensevoice.model")

BPE_MODEL = REQUIRED_FILES[3]  # chn_jpn_yue_eng_ko_spectok.bpe.model
LAYER_NORM_EPS = 1e-5  # funasr.models.sense_voice.model.LayerNorm (torch default)


class SentencePieceTokenizer:
    """What the engine uses of funasr's SentencepiecesTokenizer: ``decode`` and ``sp``."""

    def __init__(self, path: Path):
        import sentencepiece as spm

        self.sp = spm.SentencePieceProcessor()
        self.sp.load(str(path))

    def decode(self, ids) -> str:
        return self.sp.DecodeIds(list(ids))


@dataclass
class FastModel:
    """Everything :class:`~pipeline.model.engine.SenseVoiceEngine` needs, funasr-free."""

    fused: FusedModel
    embed: torch.Tensor  # [rows, 560] query embeddings
    tokenizer: SentencePieceTokenizer
    frontend: BatchedFrontend


def sinusoidal_pe(frames: int, depth: int) -> torch.Tensor:
    """funasr's SinusoidalPositionEncoder.encode for positions 1..frames (fp32, [frames, depth])."""
    positions = torch.arange(1, frames + 1, dtype=torch.float32)
    increment = torch.log(torch.tensor([10000.0])) / (depth / 2 - 1)
    inv = torch.exp(torch.arange(depth / 2).float() * (-increment))
    scaled = positions[:, None] * inv[None, :]
    return torch.cat([torch.sin(scaled), torch.cos(scaled)], dim=1)


def _encoder_conf(model_dir: Path) -> dict | None:
    import yaml

    try:
        cfg = yaml.safe_load((model_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    conf = cfg.get("encoder_conf") or {}
    if (cfg.get("model") != "SenseVoiceSmall" or cfg.get("encoder") != "SenseVoiceEncoderSmall"
            or conf.get("selfattention_layer_type", "sanm") != "sanm"
            or not conf.get("normalize_before", True) or conf.get("input_layer", "pe") != "pe"):
        return None
    return conf


def load_fast(model_dir: str | Path, device: str, dtype: torch.dtype, fp32_residual: bool,
              max_frames: int = 4096, compiled=None) -> FastModel | None:
    """The fused path's model from ``model_dir`` on ``device``, or ``None`` when the directory is
    not one this loader understands (the caller then loads through funasr)."""
    model_dir = Path(model_dir)
    conf = _encoder_conf(model_dir)
    if conf is None:
        return None
    sd = read_state_dict(model_dir / "model.pt")
    ln_dtype = torch.float32 if (fp32_residual and dtype != torch.float32) else dtype
    dev = torch.device(device)

    def t(name: str, dt: torch.dtype = dtype) -> torch.Tensor:
        if name not in sd:
            raise KeyError(name)
        return sd[name].to(device=dev, dtype=dt).contiguous()

    heads = int(conf.get("attention_heads", 4))
    kernel = int(conf.get("kernel_size", 11))
    left = (kernel - 1) // 2 + max(int(conf.get("sanm_shfit", 0)), 0)

    def block(prefix: str, residual: bool) -> tuple[BlockWeights, BlockSpec]:
        taps = t(f"{prefix}.self_attn.fsmn_block.weight")  # [D, 1, K]
        if taps.shape[-1] != kernel:
            raise KeyError(f"{prefix}.self_attn.fsmn_block.weight: kernel {taps.shape[-1]} != {kernel}")
        w = BlockWeights(
            t(f"{prefix}.norm1.weight", ln_dtype), t(f"{prefix}.norm1.bias", ln_dtype),
            t(f"{prefix}.self_attn.linear_q_k_v.weight"), t(f"{prefix}.self_attn.linear_q_k_v.bias"),
            taps[:, 0, :].contiguous(),
            t(f"{prefix}.self_attn.linear_out.weight"), t(f"{prefix}.self_attn.linear_out.bias"),
            t(f"{prefix}.norm2.weight", ln_dtype), t(f"{prefix}.norm2.bias", ln_dtype),
            t(f"{prefix}.feed_forward.w_1.weight"), t(f"{prefix}.feed_forward.w_1.bias"),
            t(f"{prefix}.feed_forward.w_2.weight"), t(f"{prefix}.feed_forward.w_2.bias"),
        )  # fmt: skip
        return w, BlockSpec(heads, left, residual, LAYER_NORM_EPS)

    try:
        blocks = [block("encoder.encoders0.0", residual=False)]
        n = int(conf.get("num_blocks", 50))
        blocks += [block(f"encoder.encoders.{i}", residual=True) for i in range(n - 1)]
        tp = [block(f"encoder.tp_encoders.{i}", residual=True) for i in range(int(conf.get("tp_blocks", 0)))]
        after = Norm(t("encoder.after_norm.weight", ln_dtype), t("encoder.after_norm.bias", ln_dtype), LAYER_NORM_EPS)
        tpn = Norm(t("encoder.tp_norm.weight", ln_dtype), t("encoder.tp_norm.bias", ln_dtype), LAYER_NORM_EPS)
        lo_w, lo_b = t("ctc.ctc_lo.weight"), t("ctc.ctc_lo.bias")
        embed = t("embed.weight")
    except KeyError as e:
        raise ModelUnavailable(f"{model_dir / 'model.pt'}: not the weights config.yaml describes "
                               f"(missing or odd tensor {e})") from e
    if (f"encoder.encoders.{n - 1}.norm1.weight" in sd or blocks[0][0].qkv_w.shape[1] != embed.shape[1]
            or blocks[0][0].out_w.shape[0] % heads):
        raise ModelUnavailable(f"{model_dir}: config.yaml and model.pt disagree on the encoder")
    d_model = blocks[0][0].out_w.shape[0]
    pe = sinusoidal_pe(max_frames, embed.shape[1]).to(dev, ln_dtype if ln_dtype == torch.float32 else dtype)
    fused = FusedModel(blocks, tp, after, tpn, lo_w, lo_b, pe, math.sqrt(d_model), dtype,
                       ln_dtype == torch.float32 and dtype != torch.float32, compiled)
    return FastModel(fused, embed, SentencePieceTokenizer(model_dir / BPE_MODEL),
                     BatchedFrontend.from_model_dir(model_dir))
