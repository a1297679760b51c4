"""The fast path: batched SenseVoiceSmall inference on one device.

features (batched fbank + LFR + CMVN on the device) -> per-item query embeddings (language, event,
emotion, itn) -> SAN-M encoder with SDPA attention, masks in the compute dtype and precomputed
positional encodings -> CTC head -> greedy decode on the device. Only token ids cross to the host.

On CUDA the encoder+CTC+argmax core is captured as one CUDA graph per (batch bucket, length bucket)
at start-up; anything outside the captured buckets, and every CPU run, executes the same code eagerly.
The weights are funasr's own modules (loaded by ``pipeline.model.loading``), used read-only.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.model.features import BatchedFrontend, num_lfr_frames
from pipeline.domain.types import TranscribeOptions, Word

logger = logging.getLogger("sensevoice.engine")

N_QUERIES = 4  # prompt frames: language, event, emotion, itn
LID = {"auto": 0, "zh": 3, "en": 4, "yue": 7, "ja": 11, "ko": 12, "nospeech": 13}  # embed rows
ITN = {True: 14, False: 15}  # withitn, woitn embed rows
EVENT_ROW, EMO_ROW = 1, 2
BLANK_ID = 0
EMO_UNKNOWN_ID = 25009
LENGTH_BUCKET = 32  # LFR frames (~1.9 s): captured graphs pad up to a multiple of this
FRAME_SECONDS = 0.06  # one LFR frame

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class EngineOutput:
    token_ids: tuple[int, ...]
    raw_text: str
    words: tuple[Word, ...] = ()  # seconds from the clip's start; only when asked


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m


class EncoderCore(torch.nn.Module):
    """Encoder + CTC head + argmax over a padded batch, written for capture: no host syncs,
    no tensor creation that depends on data, masks in the compute dtype, SDPA attention."""

    def __init__(self, sv_model, dtype: torch.dtype, max_frames: int, fp32_residual: bool = False):
        super().__init__()
        self.fp32_residual = fp32_residual and dtype != torch.float32
        enc = sv_model.encoder
        self.enc = enc
        self.lo = sv_model.ctc.ctc_lo
        self.scale = enc.output_size() ** 0.5
        self.dtype = dtype
        in_dim = sv_model.embed.weight.shape[1]
        pos = torch.arange(1, max_frames + 1, device=self.lo.weight.device)[None, :]
        pe = enc.embed.encode(pos, in_dim, torch.float32)[0]  # [T, 560], fp32 like funasr
        self.register_buffer("pe", pe.to(torch.float32 if self.fp32_residual else dtype), persistent=False)
        self.layers = list(enc.encoders0) + list(enc.encoders)
        self.tp_layers = list(enc.tp_encoders)
        # LayerNorm parameters in the residual stream's dtype, cast once (not on every call)
        ln_dtype = torch.float32 if self.fp32_residual else dtype
        norms = [n for layer in self.layers + self.tp_layers for n in (layer.norm1, layer.norm2)]
        self._ln_params = {id(n): (n.weight.detach().to(ln_dtype), n.bias.detach().to(ln_dtype))
                           for n in norms + [enc.after_norm, enc.tp_norm]}

    def _layer(self, layer, x: torch.Tensor, mask: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
        """One SAN-M block. With fp32_residual the residual stream stays fp32 and only the
        matmuls/attention run in the compute dtype (like autocast)."""
        att = layer.self_attn
        b, t, _ = x.shape
        h = self._ln(layer.norm1, x).to(self.dtype)
        qkv = F.linear(h, att.linear_q_k_v.weight, att.linear_q_k_v.bias)
        q, k, v = qkv.split(att.h * att.d_k, dim=-1)
        # FSMN memory: depthwise conv over the masked values (zero padding like funasr's pad_fn)
        vm = v * mask
        left, right = att.pad_fn.padding
        if left == right:  # the conv's own zero padding: no padded copy of the values
            mem = F.conv1d(vm.transpose(1, 2), att.fsmn_block.weight, padding=left, groups=vm.shape[-1])
        else:
            mem = F.conv1d(att.pad_fn(vm.transpose(1, 2)), att.fsmn_block.weight, groups=vm.shape[-1])
        mem = (mem.transpose(1, 2) + vm) * mask
        heads = (b, t, att.h, att.d_k)
        o = F.scaled_dot_product_attention(
            q.view(heads).transpose(1, 2), k.view(heads).transpose(1, 2),
            v.view(heads).transpose(1, 2), attn_mask=key_mask,
        )
        o = F.linear(o.transpose(1, 2).reshape(b, t, -1), att.linear_out.weight, att.linear_out.bias)
        o = (o + mem).to(x.dtype)
        x = x + o if layer.in_size == layer.size else o
        ff = layer.feed_forward
        h = self._ln(layer.norm2, x).to(self.dtype)
        y = F.linear(F.relu(F.linear(h, ff.w_1.weight, ff.w_1.bias)), ff.w_2.weight, ff.w_2.bias)
        return x + y.to(x.dtype)

    def _ln(self, norm, x: torch.Tensor) -> torch.Tensor:
        """LayerNorm with the module's parameters, pre-cast to the residual stream's dtype."""
        w, b = self._ln_params[id(norm)]
        return F.layer_norm(x, norm.normalized_shape, w, b, norm.eps)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, ban_emo_unk: torch.Tensor,
                return_logits: bool = False):
        """x [B, T, 560] (queries + features, compute dtype); lengths [B] (frames, incl. queries);
        ban_emo_unk [B] bool. Returns argmax ids [B, T] (int64), or logits if asked."""
        t = x.shape[1]
        valid = torch.arange(t, device=x.device)[None, :] < lengths[:, None]  # [B, T] bool
        mask = valid[:, :, None].to(self.dtype)
        key_mask = valid[:, None, None, :]  # [B, 1, 1, T]: True = attend
        if self.fp32_residual:
            x = x.float()
        x = x * self.scale + self.pe[:t]
        for layer in self.layers:
            x = self._layer(layer, x, mask, key_mask)
        x = self._ln(self.enc.after_norm, x)
        for layer in self.tp_layers:
            x = self._layer(layer, x, mask, key_mask)
        logits = self.lo(self._ln(self.enc.tp_norm, x).to(self.dtype))
        col = logits[:, :, EMO_UNKNOWN_ID]
        logits[:, :, EMO_UNKNOWN_ID] = torch.where(ban_emo_unk[:, None], float("-inf"), col)
        if return_logits:
            return logits
        return logits.argmax(-1)


class _Graph:
    """One captured forward for a fixed (batch, frames) shape with static input/output buffers."""

    def __init__(self, core: EncoderCore, batch: int, frames: int, in_dim: int, pool, stream):
        dev = core.pe.device
        self.x = torch.zeros(batch, frames, in_dim, device=dev, dtype=core.dtype)
        self.lengths = torch.full((batch,), frames, device=dev, dtype=torch.long)
        self.ban = torch.zeros(batch, device=dev, dtype=torch.bool)
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels and the allocator outside capture
                core(self.x, self.lengths, self.ban)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool, stream=stream):
            self.ids = core(self.x, self.lengths, self.ban)

    def run(self, x: torch.Tensor, lengths: torch.Tensor, ban: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        self.x.zero_()
        self.x[:b, :t].copy_(x)
        self.lengths.fill_(1)  # padded batch rows: one frame, ignored afterwards
        self.lengths[:b].copy_(lengths)
        self.ban.zero_()
        self.ban[:b].copy_(ban)
        self.graph.replay()
        return self.ids[:b, :t]


class SenseVoiceEngine:
    """Batched SenseVoiceSmall on one device. Not thread-safe: one worker thread owns it."""

    def __init__(self, sv_model, tokenizer, frontend: BatchedFrontend, device: str,
                 dtype: str = "float16", max_frames: int = 4096, fp32_residual: bool = False):
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.device.type == "cpu":
            dtype = "float32"  # fp16 matmuls on CPU are slow and not what users expect
        self.dtype = DTYPES[dtype]
        self.tokenizer = tokenizer
        self.frontend = frontend.to(self.device)
        model = sv_model
        if next(model.parameters()).device != self.device or next(model.parameters()).dtype != self.dtype:
            import copy

            model = copy.deepcopy(sv_model).to(device=self.device, dtype=self.dtype)
        model.eval()
        self.model = model
        self.max_frames = max_frames
        self.core = EncoderCore(model, self.dtype, max_frames, fp32_residual).eval()
        q_rows = torch.tensor([[lid, EVENT_ROW, EMO_ROW, itn] for lid in range(16) for itn in (14, 15)],
                              device=self.device)
        with torch.inference_mode():
            self._queries = model.embed(q_rows).to(self.dtype)  # [32, 4, 560]
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._graph_batches: list[int] = []
        self._graph_max_frames = 0
        self.startup_seconds: dict[str, float] = {}

    # ------------------------------------------------------------------ set-up
    @classmethod
    def from_automodel(cls, am, device: str, dtype: str = "float16",
                       fp32_residual: bool = False) -> "SenseVoiceEngine":
        frontend = BatchedFrontend(am.kwargs["frontend"].cmvn)
        return cls(am.model, am.kwargs["tokenizer"], frontend, device, dtype,
                   fp32_residual=fp32_residual)

    def capture_graphs(self, batch_sizes: Sequence[int], max_seconds: float) -> float:
        """Capture one CUDA graph per (batch bucket, length bucket); returns seconds spent."""
        if self.device.type != "cuda":
            return 0.0
        t0 = time.perf_counter()
        max_frames = _round_up(num_lfr_frames(int(max_seconds * 16000)) + N_QUERIES, LENGTH_BUCKET)
        pool = torch.cuda.graph_pool_handle()
        stream = torch.cuda.Stream(self.device)
        in_dim = self._queries.shape[-1]
        with torch.inference_mode(), torch.cuda.device(self.device):
            # capture largest first so the shared pool is sized once
            for b in sorted(batch_sizes, reverse=True):
                for t in range(max_frames, 0, -LENGTH_BUCKET):
                    self._graphs[(b, t)] = _Graph(self.core, b, t, in_dim, pool, stream)
                logger.info("captured batch %d graphs (%.1f s so far)", b, time.perf_counter() - t0)
        torch.cuda.synchronize(self.device)
        self._graph_batches = sorted(batch_sizes)
        self._graph_max_frames = max_frames
        secs = time.perf_counter() - t0
        self.startup_seconds["graph_capture"] = secs
        logger.info("captured %d CUDA graphs (batches %s, up to %d frames) in %.1f s",
                    len(self._graphs), self._graph_batches, max_frames, secs)
        return secs

    def warmup(self) -> float:
        t0 = time.perf_counter()
        wave = torch.zeros(16000, device=self.device)
        self.transcribe([wave], [TranscribeOptions()])
        secs = time.perf_counter() - t0
        self.startup_seconds["warmup"] = secs
        return secs

    # ------------------------------------------------------------------ inference
    def features(self, waves: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """16 kHz waves (1-D float32, any device) -> padded features on the device."""
        lengths = [int(w.shape[0]) for w in waves]
        batch = torch.nn.utils.rnn.pad_sequence([w.to(self.device, torch.float32) for w in waves],
                                                batch_first=True)
        lens_t = torch.tensor(lengths, device=self.device)
        feats, _ = self.frontend(batch, lens_t)
        return feats, lens_t, [num_lfr_frames(n) for n in lengths]

    def encoder_inputs(self, feats: torch.Tensor, frames: Sequence[int],
                       options: Sequence[TranscribeOptions]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = torch.tensor([LID[o.language] * 2 + (0 if o.use_itn else 1) for o in options],
                            device=self.device)
        x = torch.cat([self._queries[rows], feats.to(self.dtype)], dim=1)
        lengths = torch.tensor([f + N_QUERIES for f in frames], device=self.device)
        ban = torch.tensor([o.ban_emo_unk for o in options], device=self.device)
        return x, lengths, ban

    def _pick_graph(self, b: int, t: int) -> _Graph | None:
        if not self._graphs or t > self._graph_max_frames:
            return None
        bb = next((g for g in self._graph_batches if g >= b), None)
        if bb is None:
            return None
        return self._graphs.get((bb, _round_up(t, LENGTH_BUCKET)))

    @torch.inference_mode()
    def forward_ids(self, x: torch.Tensor, lengths: torch.Tensor, ban: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        if t > self.max_frames:
            raise ValueError(f"clip too long for one pass: {t} frames > {self.max_frames}")
        graph = self._pick_graph(b, t)
        if graph is not None:
            return graph.run(x, lengths, ban)
        return self.core(x, lengths, ban)

    @torch.inference_mode()
    def transcribe(self, waves: Sequence[torch.Tensor],
                   options: Sequence[TranscribeOptions]) -> list[EngineOutput]:
        """Transcribe a batch of 16 kHz waves; each item has its own options."""
        feats, _, frames = self.features(waves)
        x, lengths, ban = self.encoder_inputs(feats, frames, options)
        ids = self.forward_ids(x, lengths, ban)
        return self.decode(ids, lengths, [o.word_timestamps for o in options])

    def decode(self, ids: torch.Tensor, lengths: torch.Tensor,
               word_times: Sequence[bool] = ()) -> list[EngineOutput]:
        """Greedy CTC on the device (collapse repeats, drop blanks and padding), ids to host.
        Items with ``word_times`` also get words timed by their CTC runs (funasr's 60 ms rule)."""
        t = ids.shape[1]
        valid = torch.arange(t, device=ids.device)[None, :] < lengths[:, None]
        starts = torch.ones_like(ids, dtype=torch.bool)  # a new run of one symbol starts here
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
        keep = starts & (ids != BLANK_ID) & valid
        host = torch.where(keep, ids, -1).to(torch.int32).cpu().numpy()
        runs = (starts & valid).cpu().numpy() if any(word_times) else None
        lens = lengths.tolist()
        outs = []
        for i, row in enumerate(host):
            pos = np.flatnonzero(row >= 0)
            tokens = row[pos].tolist()
            words = ()
            if runs is not None and i < len(word_times) and word_times[i]:
                words = self._words(tokens, pos, np.flatnonzero(runs[i]), lens[i])
            outs.append(EngineOutput(tuple(tokens), self.tokenizer.decode(tokens), words))
        return outs

    def _piece(self, token_id: int) -> str:
        """The SentencePiece piece of an id ('\u2581' marks a word start)."""
        if getattr(self.tokenizer, "sp", None) is None:
            self.tokenizer.decode([token_id])  # funasr builds its processor lazily
        return self.tokenizer.sp.id_to_piece(int(token_id))

    def _words(self, tokens: list[int], pos: np.ndarray, run_starts: np.ndarray, n: int):
        """Pieces -> words with times: a token spans its CTC run; times as funasr's
        output_timestamp (frame k of the speech -> k * 60 ms - 30 ms, clipped)."""
        run_ends = np.append(run_starts[1:], n)
        end_of = dict(zip(run_starts.tolist(), run_ends.tolist()))
        limit = (n - N_QUERIES) * FRAME_SECONDS - 0.03
        words: list[list] = []
        for tok, p in zip(tokens, pos.tolist()):
            piece = self._piece(tok)
            if p < N_QUERIES or piece.startswith("<|") or piece == "\u2581":
                continue  # the prompt's tags, and bare word separators
            start = max((p - N_QUERIES) * FRAME_SECONDS - 0.03, 0.0)
            end = min((end_of[p] - N_QUERIES) * FRAME_SECONDS - 0.03, limit)
            ascii_alpha = piece.isascii() and piece.isalpha()
            if words and not piece.startswith("\u2581") and ascii_alpha and words[-1][3]:
                words[-1][0] += piece  # a word continued by a sub-word piece
                words[-1][2] = end
            else:
                words.append([piece.lstrip("\u2581"), start, end, ascii_alpha])
        return tuple(Word(w[0], round(w[1], 3), round(w[2], 3)) for w in words if w[0])
