"""The fast path: batched SenseVoiceSmall inference on one device.

features (batched fbank + LFR + CMVN on the device) -> per-item query embeddings (language, event,
emotion, itn) -> SAN-M encoder with SDPA attention, masks in the compute dtype and precomputed
positional encodings -> CTC head -> greedy decode on the device. Only token ids cross to the host.

Two implementations of the encoder+CTC+argmax core share the weights:
- the eager reference (:class:`EncoderCore`'s own blocks): the arithmetic tested token for token
  against funasr, and the path with ``fused=False``;
- the fused blocks (:mod:`pipeline.model.fused`): one torch.compile'd SAN-M block for all 70
  blocks and every shape, its kernels cached on disk; the default (uncompiled on a CPU).
On CUDA the core is then captured as CUDA graphs per (batch bucket, length bucket), lazily: the
worker asks for :meth:`SenseVoiceEngine.idle_step` when it has nothing to do, which compiles
(once, in a background thread) and then captures one wanted bucket at a time, in the worker's own
thread, so a capture never races the engine's user. Until a bucket exists its shape runs
uncaptured (compiled, or eager until the compile is done): the engine serves from the first second.
The eager reference's weights are funasr's own modules (:meth:`SenseVoiceEngine.from_automodel`),
used read-only; the service builds the fused path straight from the model directory instead
(:func:`pipeline.model.loading.load_engine`, :meth:`SenseVoiceEngine.from_model_dir_fast`,
:mod:`pipeline.model.fast_load`: no funasr import).

:meth:`SenseVoiceEngine.transcribe_async` queues a batch and returns before the GPU is done (the
worker finishes the previous batch meanwhile); :meth:`SenseVoiceEngine.transcribe` waits for it.
The members the worker calls are :class:`pipeline.model.protocol.Engine`'s.
"""

from __future__ import annotations

import logging
import threading
import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from pipeline.model import fused as fused_mod
from pipeline.model.features import BatchedFrontend, num_lfr_frames
from pipeline.model.protocol import EngineOutput
from pipeline.domain.tags import (AUTO_LANGUAGE, EMO_UNKNOWN_ID, EMOTION_QUERY_ROW, EVENT_QUERY_ROW,
                                  ITN_QUERY_ROWS, LANGUAGE_QUERY_ROWS, QUERY_EMBED_ROWS, SAMPLE_RATE_HZ)
from pipeline.domain.types import TranscribeOptions, Word
from pipeline.model import confidence
from pipeline.model import hotwords as hotwords_mod

logger = logging.getLogger("sensevoice.engine")

N_QUERIES = 4  # prompt frames: language, event, emotion, itn
BLANK_ID = 0
LENGTH_BUCKET = 16  # LFR frames (~0.96 s): captured graphs pad up to a multiple of this (a 10 s
# clip's 171 frames pad to 176, 3 % of waste; 32 gave 192, 12 %)
FRAME_SECONDS = 0.06  # one LFR frame
PREFILL_BATCH = 16  # graphs of batches up to this, every length, are captured at the first idle moments
COVER_WASTE = 4.0  # a bucket not captured yet runs from a captured graph at most this many times its size
HOT_MISSES = 8  # a bucket run uncaptured (and uncovered) this often is captured between batches

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def _device_and_dtype(device: str, dtype: str) -> tuple[torch.device, torch.dtype]:
    """An indexed device, and the compute dtype (float32 on a CPU: fp16 matmuls there are slow
    and not what users expect)."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev, DTYPES["float32" if dev.type == "cpu" else dtype]


def _prompt_language(o: TranscribeOptions) -> str:
    """The language the prompt asks for: the option's, or the allow-list's only language."""
    if o.language == AUTO_LANGUAGE and len(o.languages) == 1:
        return o.languages[0]
    return o.language


def _round_up(n: int, m: int) -> int:
    return (n + m - 1) // m * m



PCM16_SCALE = 2.0 ** -15  # a 16-bit sample k is the wave value k / 32768


def as_float_wave(wave: torch.Tensor) -> torch.Tensor:
    """A wave as float32 in [-1, 1]: 16-bit PCM samples scaled by 1/32768 (exact), floats as they are."""
    if wave.dtype == torch.int16:
        return wave.float().mul_(PCM16_SCALE)
    return wave.float()

def gather_rows(waves: Sequence[torch.Tensor], out: torch.Tensor) -> torch.Tensor:
    """Host waves into the rows of ``out`` (batch x longest), each row's tail zeroed: the batch's
    one host copy (a shared file's mapped pages are read here for the first time). The pinned
    ``out`` of the CUDA path comes from torch's caching host allocator, reused once its transfer
    is done: no fresh pages per batch, no second copy as with pad + pin_memory."""
    rows = out.numpy()  # numpy's copy: one thread, no fork-join of torch's pool per 320 KB row
    for row, wave in zip(rows, waves):
        k = int(wave.shape[0])
        row[:k] = wave.numpy()
        row[k:] = 0
    return out


CLOSE_WAIT_S = 600.0  # close() waits this long at most for a compile in progress


def start_with_torch_threads(target: Callable[[], None], name: str) -> threading.Thread:
    """Start ``target`` in a daemon thread with the caller's torch intra-op thread count. The
    background compile needs it: the code it compiles is called by the worker's thread, and
    torch.compile's guards compare the count (a new thread starts from the process default,
    which a live stream's VAD thread may have set to 1 meanwhile: the worker's graph captures
    then failed on ``fail_on_recompile``, "num_threads" changed, on the H200)."""
    count = torch.get_num_threads()

    def run() -> None:
        torch.get_num_threads()  # a thread's count is set lazily on first use: touch it first
        torch.set_num_threads(count)
        target()

    thread = threading.Thread(target=run, name=name, daemon=True)
    thread.start()
    return thread


class EncoderCore(torch.nn.Module):
    """Encoder + CTC head + argmax over a padded batch, written for capture: no host syncs,
    no tensor creation that depends on data, masks in the compute dtype, SDPA attention."""

    def __init__(self, sv_model, dtype: torch.dtype, max_frames: int, fp32_residual: bool = False,
                 compiled: "fused_mod.CompiledBlocks | None" = None):
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
        # the fused path: the same weights as views, one compiled block function for all blocks
        self.fused_model = fused_mod.FusedModel.from_funasr(
            self.layers, self.tp_layers, enc.after_norm, enc.tp_norm, self.lo, self.pe, self.scale,
            dtype, self.fp32_residual, compiled)

    @property
    def compiled(self) -> "fused_mod.CompiledBlocks | None":
        return self.fused_model.compiled

    @compiled.setter
    def compiled(self, value: "fused_mod.CompiledBlocks | None") -> None:
        self.fused_model.compiled = value

    @property
    def fused(self) -> bool:
        """True once the compiled blocks are ready: forward then runs them."""
        return self.compiled is not None and self.compiled.ready

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

    def _prologue(self, x: torch.Tensor, lengths: torch.Tensor):
        return fused_mod.prologue(x, lengths, self.dtype, self.fp32_residual, self.scale, self.pe)

    @property
    def tag_ids(self) -> torch.Tensor:
        return self.fused_model.tag_ids

    @tag_ids.setter
    def tag_ids(self, value: torch.Tensor) -> None:
        self.fused_model.tag_ids = value

    def forward(self, x: torch.Tensor, lengths: torch.Tensor, ban_emo_unk: torch.Tensor,
                return_logits: bool = False, with_scores: bool = False):
        """x [B, T, 560] (queries + features, compute dtype); lengths [B] (frames, incl. queries);
        ban_emo_unk [B] bool. Returns argmax ids [B, T] (int64), or logits if asked, or
        (ids, logp, tags, hidden) ``with_scores`` (:func:`pipeline.model.fused.head`).
        Runs the fused blocks once they are ready, else the eager reference."""
        if self.fused:
            return self.forward_fused(x, lengths, ban_emo_unk, return_logits, with_scores=with_scores)
        return self.forward_eager(x, lengths, ban_emo_unk, return_logits, with_scores)

    def forward_fused(self, x, lengths, ban_emo_unk, return_logits: bool = False, compiled: bool | None = None,
                      with_scores: bool = False):
        return self.fused_model.forward_fused(x, lengths, ban_emo_unk, return_logits, compiled, with_scores)

    def forward_eager(self, x, lengths, ban_emo_unk, return_logits: bool = False, with_scores: bool = False):
        """The reference: funasr's arithmetic, block by block, uncompiled."""
        x, mask, key_mask = self._prologue(x, lengths)
        for layer in self.layers:
            x = self._layer(layer, x, mask, key_mask)
        x = self._ln(self.enc.after_norm, x)
        for layer in self.tp_layers:
            x = self._layer(layer, x, mask, key_mask)
        hidden = self._ln(self.enc.tp_norm, x).to(self.dtype)
        logits = self.lo(hidden)
        col = logits[:, :, EMO_UNKNOWN_ID]
        logits[:, :, EMO_UNKNOWN_ID] = torch.where(ban_emo_unk[:, None], float("-inf"), col)
        if return_logits:
            return logits
        if with_scores:
            ids = logits.argmax(-1)
            return ids, *fused_mod.scores(logits, self.tag_ids, ids), hidden
        return logits.argmax(-1)


class _Graph:
    """One captured forward for a fixed (batch, frames) shape. Its input is a view of the engine's
    one shared input buffer (graphs never run at the same time: one thread owns the engine)."""

    def __init__(self, core: EncoderCore, x: torch.Tensor, pool, stream):
        batch, frames, _ = x.shape
        dev = x.device
        self.x = x
        self.lengths = torch.full((batch,), frames, device=dev, dtype=torch.long)
        self.ban = torch.zeros(batch, device=dev, dtype=torch.bool)
        self.x.zero_()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            core(self.x, self.lengths, self.ban, with_scores=True)  # the allocator's blocks, outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        # thread_local: another thread's CUDA work (decoding, speech detection, a live stream's
        # resampling) during this capture neither breaks it nor is refused
        with torch.cuda.graph(self.graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            self.ids, self.logp, self.tags, self.hidden = core(self.x, self.lengths, self.ban, with_scores=True)

    def run(self, x: torch.Tensor, lengths: torch.Tensor, ban: torch.Tensor):
        """(ids, logp, tags, hidden) of the batch, views of the graph's outputs (valid until its
        next run)."""
        b, t, _ = x.shape
        self.x.zero_()
        self.x[:b, :t].copy_(x)
        self.lengths.fill_(1)  # padded batch rows: one frame, ignored afterwards
        self.lengths[:b].copy_(lengths)
        self.ban.zero_()
        self.ban[:b].copy_(ban)
        self.graph.replay()
        return self.ids[:b, :t], self.logp[:b, :t], self.tags[:b], self.hidden[:b, :t]


@dataclass
class PendingBatch:
    """A batch queued on the device: its token ids arrive in host memory when ``event`` fires."""

    engine: "SenseVoiceEngine"
    host: torch.Tensor  # [B, T] int32, -1 where nothing is emitted
    runs: torch.Tensor | None  # [B, T] bool, run starts (word times, confidence)
    lengths: list[int]
    word_times: list[bool]
    event: "torch.cuda.Event | None"
    logp: torch.Tensor | None = None  # [B, T] fp32, each frame's best log softmax
    tags: torch.Tensor | None = None  # [B, 4, K] fp32, the tag vocabulary's logits at the query frames
    allowed: list[tuple[str, ...]] | None = None  # each item's language allow-list (() = any)
    hot: "hotwords_mod.HotSearch | None" = None  # the hotword rows' search (None: no row has hotwords)

    def result(self) -> list[EngineOutput]:
        """Wait for the ids (this thread only), write the hotword rows' winning terms over their
        greedy paths, then detokenise on the host."""
        if self.event is not None:
            self.event.synchronize()
        host = self.host.numpy()
        runs = self.runs.numpy() if self.runs is not None else None
        logp = self.logp.numpy() if self.logp is not None else None
        if self.hot is not None:
            hotwords_mod.rewrite(host, runs, logp, self.lengths, self.hot)
        scores = None
        if logp is not None and self.tags is not None:
            scores = (logp, self.tags.numpy(), self.allowed or [()] * len(self.lengths))
        return self.engine._host_decode(host, runs, self.lengths, self.word_times, scores)


class SenseVoiceEngine:
    """Batched SenseVoiceSmall on one device. Not thread-safe: one worker thread owns it (the
    background compile, the one exception, runs the fused blocks only on its own inputs)."""

    def __init__(self, sv_model, tokenizer, frontend: BatchedFrontend, device: str,
                 dtype: str = "float16", max_frames: int = 4096, fp32_residual: bool = False,
                 fused: bool = False, cache_dir: Path | None = None):
        self.device, self.dtype = _device_and_dtype(device, dtype)
        self.tokenizer = tokenizer
        self.frontend = frontend.to(self.device)
        model = sv_model
        if next(model.parameters()).device != self.device or next(model.parameters()).dtype != self.dtype:
            import copy

            model = copy.deepcopy(sv_model).to(device=self.device, dtype=self.dtype)
        model.eval()
        self.model = model
        self.max_frames = max_frames
        self.compiled: fused_mod.CompiledBlocks | None = None
        if fused:
            fused_mod.configure_cache(cache_dir)
            self.compiled = fused_mod.CompiledBlocks(compile=True)
        self.core = EncoderCore(model, self.dtype, max_frames, fp32_residual, self.compiled).eval()
        self._init_tag_vocab()
        with torch.inference_mode():
            self._queries = model.embed(self._query_rows()).to(self.dtype)  # [32, 4, 560]
        self._init_graph_state()

    # ------------------------------------------------------------------ set-up
    @classmethod
    def from_automodel(cls, am, device: str, dtype: str = "float16", fp32_residual: bool = False,
                       fused: bool = False, cache_dir: Path | None = None) -> "SenseVoiceEngine":
        frontend = BatchedFrontend(am.kwargs["frontend"].cmvn)
        return cls(am.model, am.kwargs["tokenizer"], frontend, device, dtype,
                   fp32_residual=fp32_residual, fused=fused, cache_dir=cache_dir)

    @classmethod
    def from_model_dir_fast(cls, model_dir, device: str, dtype: str = "float16",
                            fp32_residual: bool = False, cache_dir: Path | None = None,
                            compile: bool = True, max_frames: int = 4096) -> "SenseVoiceEngine | None":
        """The fused engine straight from a model directory, without importing funasr
        (:mod:`pipeline.model.fast_load`; ~15 s of a GPU server's start-up). Until the compile is
        done the same fused functions run uncompiled. ``None``: a directory this loader does not
        understand (load through funasr instead)."""
        from pipeline.model.fast_load import load_fast

        dev, dt = _device_and_dtype(device, dtype)
        if compile:
            fused_mod.configure_cache(cache_dir)
        compiled = fused_mod.CompiledBlocks(compile=compile)
        fast = load_fast(model_dir, str(dev), dt, fp32_residual, max_frames, compiled)
        if fast is None:
            return None
        self = cls.__new__(cls)
        self.device, self.dtype, self.max_frames = dev, dt, max_frames
        self.tokenizer = fast.tokenizer
        self.frontend = fast.frontend.to(dev)
        self.model = None  # no funasr modules: the fused path only
        self.compiled = compiled if compile else None
        self.core = fast.fused
        self._queries = fast.embed[self._query_rows()]
        self._init_tag_vocab()
        self._init_graph_state()
        return self

    def use_fp8(self, mode: str) -> tuple[str, ...]:
        """FP8 (e4m3) GEMMs for the fused encoder's linear layers named by ``mode`` ('off', 'ffn',
        'all': :mod:`pipeline.model.fp8`), weights quantised now. Before the compile and the first
        graph (those keep the weights they saw). Returns the layers quantised."""
        if mode != "off":
            if self._graphs or (self.compiled is not None and self.compiled.ready and self.compiled.compiles):
                raise RuntimeError("use_fp8 must come before the fused encoder is compiled or captured")
            if isinstance(self.core, EncoderCore) and self.compiled is None:
                raise ValueError("fp8_gemm needs the fused encoder (this engine runs the eager reference)")
        self.fp8_layers = getattr(self.core, "fused_model", self.core).use_fp8(mode)
        return self.fp8_layers

    def _init_tag_vocab(self) -> None:
        """The tag tokens of this model's vocabulary: the head's tag columns (confidence)."""
        def piece_id(piece: str) -> int | None:
            if getattr(self.tokenizer, "sp", None) is None:
                self.tokenizer.decode([0])  # funasr builds its processor lazily
            sp = self.tokenizer.sp
            tid = int(sp.piece_to_id(piece))
            return tid if sp.id_to_piece(tid) == piece else None

        self.tag_vocab = confidence.TagVocab.from_pieces(piece_id)
        self.core.tag_ids = torch.tensor(self.tag_vocab.ids or (0,), device=self.device, dtype=torch.long)

    def _query_rows(self) -> torch.Tensor:
        """Embedding rows of every (language, itn) prompt: [32, 4] (language, event, emotion, itn)."""
        return torch.tensor([[lid, EVENT_QUERY_ROW, EMOTION_QUERY_ROW, ITN_QUERY_ROWS[use_itn]]
                             for lid in range(QUERY_EMBED_ROWS) for use_itn in (True, False)],
                            device=self.device)

    def _init_graph_state(self) -> None:
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._graph_batches: list[int] = []
        self._graph_max_frames = 0
        self._wanted: list[tuple[int, int]] = []  # buckets to capture when idle, first first
        self._failed: set[tuple[int, int]] = set()  # buckets whose capture failed: never retried
        self._misses: dict[tuple[int, int], int] = {}  # wanted bucket -> batches run uncaptured
        self._settled = True  # the buckets planned at start have all been tried once
        self._pool = None
        self._stream = None
        self._input: torch.Tensor | None = None  # the graphs' one shared input buffer
        self._compile_thread: threading.Thread | None = None
        self._closed = False  # close(): no background work starts any more
        self.compile_error: BaseException | None = None
        self.startup_seconds: dict[str, float] = {}
        self.fp8_layers: tuple[str, ...] = ()  # use_fp8's

    @property
    def in_dim(self) -> int:
        return int(self._queries.shape[-1])

    def plan_graphs(self, batch_sizes: Sequence[int], max_seconds: float,
                    prefill_batch: int = PREFILL_BATCH) -> None:
        """Serve (batch bucket, length bucket) shapes from CUDA graphs, captured lazily by
        :meth:`idle_step` (~0.2 s each): every length bucket for batches up to ``prefill_batch``
        (a lone clip, the idle-latency case; the live lane's small batches of every utterance
        length) is queued now, smallest batches first; other buckets when a batch first needs
        one (meanwhile a larger captured graph may hold it: :meth:`_covering`). No GPU work here."""
        if self.device.type != "cuda" or not batch_sizes:
            return
        self._graph_batches = sorted(set(int(b) for b in batch_sizes))
        self._graph_max_frames = _round_up(num_lfr_frames(int(max_seconds * SAMPLE_RATE_HZ)) + N_QUERIES,
                                           LENGTH_BUCKET)
        self._wanted = [(b, t) for b in self._graph_batches if b <= prefill_batch
                        for t in range(LENGTH_BUCKET, self._graph_max_frames + 1, LENGTH_BUCKET)]
        self._settled = not self._wanted

    def capture_graphs(self, batch_sizes: Sequence[int], max_seconds: float) -> float:
        """Plan and capture every bucket now (benchmarks; the service captures lazily). Seconds."""
        if self.device.type != "cuda":
            return 0.0
        t0 = time.perf_counter()
        self.plan_graphs(batch_sizes, max_seconds, prefill_batch=max(batch_sizes))
        self.compile()
        while self._wanted:
            self.idle_step()
        secs = time.perf_counter() - t0
        self.startup_seconds["graph_capture"] = secs
        logger.info("captured %d CUDA graphs (batches %s, up to %d frames) in %.1f s",
                    len(self._graphs), self._graph_batches, self._graph_max_frames, secs)
        return secs

    def compile(self) -> float:
        """Compile the fused blocks on example shapes (a batch of one and of several, the shortest
        and the longest bucket), so that no later call compiles; then switch the core to them.
        Blocking; safe beside the worker's eager batches (inputs of its own). Seconds spent."""
        c = self.compiled
        if c is None or c.ready:
            return 0.0
        t0 = time.perf_counter()
        longest = max(self._graph_max_frames, LENGTH_BUCKET)
        shapes = [(2, LENGTH_BUCKET), (1, LENGTH_BUCKET), (max(self._graph_batches or [2]), longest)]
        with torch.inference_mode():
            for b, t in shapes:
                x = torch.zeros(b, t, self.in_dim, device=self.device, dtype=self.dtype)
                lengths = torch.full((b,), t, device=self.device, dtype=torch.long)
                self.core.forward_fused(x, lengths, torch.zeros(b, dtype=torch.bool, device=self.device),
                                        compiled=True, with_scores=True)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        c.compile_seconds = time.perf_counter() - t0
        c.ready = True
        self.startup_seconds["compile"] = c.compile_seconds
        logger.info("fused encoder compiled (or loaded from the cache) in %.1f s", c.compile_seconds)
        return c.compile_seconds

    def _compile_in_background(self) -> None:
        try:
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device)
            self.compile()
        except Exception as e:  # the eager reference keeps serving, and its graphs are captured
            self.compile_error = e
            self.core.compiled = None
            self.compiled = None
            logger.error("compiling the fused encoder failed; serving the eager path: %s", e,
                         exc_info=True)

    @property
    def has_idle_work(self) -> bool:
        """True while a compile or a wanted graph capture is pending (the worker polls faster)."""
        if self.compiled is not None and not self.compiled.ready:
            return True
        return bool(self._wanted)

    def idle_step(self) -> bool:
        """One short piece of background work, for the owning thread when it has nothing to do:
        start the compile (in a thread of its own), or capture one wanted graph (~10-100 ms).
        Returns True while more remains."""
        if self._closed:
            return False
        c = self.compiled
        if c is not None and not c.ready:
            if self._compile_thread is None:
                self._compile_thread = start_with_torch_threads(self._compile_in_background,
                                                                "sensevoice-compile")
            return True
        if not self._wanted:
            return False
        b, t = self._wanted.pop(0)
        self._misses.pop((b, t), None)
        if (b, t) not in self._graphs:
            self._capture(b, t)
        self._settled = self._settled or not self._wanted
        return bool(self._wanted)

    def close(self) -> None:
        """No more background work; wait for a compile in progress to end (it cannot be
        cancelled: torch.compile's threads and processes still running at the interpreter's exit
        aborted the batch CLI on the H200, "terminate called without an active exception")."""
        self._closed = True
        thread = self._compile_thread
        if thread is not None and thread.is_alive():
            logger.info("waiting for the fused encoder's compile to end before exiting")
            thread.join(CLOSE_WAIT_S)

    @property
    def warm(self) -> bool:
        """The compile is done and the graphs planned at start are captured: batches run at full
        speed from here (before, the eager path serves: /readyz is ready before it is warm)."""
        c = self.compiled
        return (c is None or c.ready) and self._settled

    @property
    def has_hot_work(self) -> bool:
        """True when a bucket has run uncaptured ``HOT_MISSES`` times (compile done): under a
        steady load the worker is seldom idle long enough for :meth:`idle_step`, and on the H200
        the embedded server's worker spent ~70 % of its time launching 64-clip batches op by op."""
        c = self.compiled
        if c is not None and not c.ready:
            return False
        return any(n >= HOT_MISSES for n in self._misses.values())

    def capture_hot(self) -> None:
        """Capture the bucket run uncaptured most often (~0.2 s once; the owning thread, between
        batches: what it costs once is what launching op by op cost every batch)."""
        if not self.has_hot_work:
            return
        key = max(self._misses, key=self._misses.get)
        del self._misses[key]
        if key in self._wanted:
            self._wanted.remove(key)
        if key not in self._graphs and key not in self._failed:
            self._capture(*key)
        self._settled = self._settled or not self._wanted

    def _capture(self, b: int, t: int) -> None:
        t0 = time.perf_counter()
        try:
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
                self._stream = torch.cuda.Stream(self.device)
                top = max(self._graph_batches) * self._graph_max_frames * self.in_dim
                self._input = torch.zeros(top, device=self.device, dtype=self.dtype)
            x = self._input[: b * t * self.in_dim].view(b, t, self.in_dim)
            guard = self.compiled.no_recompile() if self.compiled is not None else nullcontext()
            with torch.inference_mode(), torch.cuda.device(self.device), guard:
                self._graphs[(b, t)] = _Graph(self.core, x, self._pool, self._stream)
        except Exception as e:  # that shape keeps running uncaptured
            self._failed.add((b, t))
            logger.warning("capturing the CUDA graph for batch %d x %d frames failed: %s", b, t, e)
            return
        logger.debug("captured batch %d x %d frames in %.1f ms", b, t, (time.perf_counter() - t0) * 1e3)
        if not self._wanted:
            logger.info("CUDA graphs: %d captured", len(self._graphs))

    def warmup(self) -> float:
        t0 = time.perf_counter()
        wave = torch.zeros(SAMPLE_RATE_HZ, device=self.device)  # 1 s
        self.transcribe([wave], [TranscribeOptions()])
        secs = time.perf_counter() - t0
        self.startup_seconds["warmup"] = secs
        return secs

    # ------------------------------------------------------------------ inference
    def _to_device(self, t: torch.Tensor) -> torch.Tensor:
        """Host -> device without making the host wait for the GPU's queued work: pinned memory
        and an asynchronous copy on CUDA (a pageable copy waits for the stream to drain)."""
        if self.device.type != "cuda" or t.device.type == "cuda":
            return t.to(self.device)
        return t.pin_memory().to(self.device, non_blocking=True)

    def _padded(self, waves: Sequence[torch.Tensor]) -> torch.Tensor:
        """The waves as one zero-padded float32 batch on the device. Host waves cross in one
        asynchronous copy per sample type, gathered into pinned memory; 16-bit PCM waves (spooled
        WAV uploads, the distributed worker's) cross as int16 and are scaled on the device;
        waves already on the device are padded there (a batch may mix both: the embedded server's
        decoded uploads wait on the GPU, its WAV uploads' samples in their spool files)."""
        pad = torch.nn.utils.rnn.pad_sequence
        if all(w.device == self.device for w in waves):
            return pad([as_float_wave(w) for w in waves], batch_first=True)
        if self.device.type != "cuda":
            return pad([as_float_wave(w.to(self.device)) for w in waves], batch_first=True)
        n = max(int(w.shape[0]) for w in waves)
        groups: dict[torch.dtype, list[int]] = {}
        on_device: list[int] = []
        for i, w in enumerate(waves):
            if w.device == self.device:
                on_device.append(i)
            else:
                groups.setdefault(w.dtype if w.dtype == torch.int16 else torch.float32, []).append(i)
        parts = []
        for dtype, rows in groups.items():  # one copy: each wave into its row of pinned memory
            host = [waves[i] if waves[i].dtype == dtype else waves[i].float() for i in rows]
            width = max(int(w.shape[0]) for w in host)
            pinned = gather_rows(host, torch.empty((len(rows), width), dtype=dtype, pin_memory=True))
            parts.append((rows, as_float_wave(pinned.to(self.device, non_blocking=True))))
        if not on_device and len(parts) == 1 and parts[0][1].shape[1] == n:
            return parts[0][1]  # (the rows are the waves' order)
        out = torch.zeros((len(waves), n), dtype=torch.float32, device=self.device)
        for rows, batch in parts:
            out[torch.tensor(rows, device=self.device), :batch.shape[1]] = batch
        for i in on_device:
            out[i, :waves[i].shape[0]] = as_float_wave(waves[i])
        return out

    def features(self, waves: Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """16 kHz waves (1-D float32, any device) -> padded features on the device."""
        lengths = [int(w.shape[0]) for w in waves]
        batch = self._padded(waves)
        lens_t = self._to_device(torch.tensor(lengths))
        feats, _ = self.frontend(batch, lens_t)
        return feats, lens_t, [num_lfr_frames(n) for n in lengths]

    def encoder_inputs(self, feats: torch.Tensor, frames: Sequence[int],
                       options: Sequence[TranscribeOptions]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        rows = self._to_device(torch.tensor([LANGUAGE_QUERY_ROWS[_prompt_language(o)] * 2 + (0 if o.use_itn else 1)
                                             for o in options]))
        x = torch.cat([self._queries[rows], feats.to(self.dtype)], dim=1)
        lengths = self._to_device(torch.tensor([f + N_QUERIES for f in frames]))
        ban = self._to_device(torch.tensor([o.ban_emo_unk for o in options]))
        return x, lengths, ban

    def _pick_graph(self, b: int, t: int) -> _Graph | None:
        """The captured graph for this shape's bucket; a planned bucket not captured yet is
        wanted first (captured at the next idle moment) and the shape runs uncaptured now."""
        if not self._graph_batches or t > self._graph_max_frames:
            return None
        bb = next((g for g in self._graph_batches if g >= b), None)
        if bb is None:
            return None
        key = (bb, _round_up(t, LENGTH_BUCKET))
        graph = self._graphs.get(key)
        if graph is not None:
            return graph
        graph = self._covering(key)
        if key not in self._failed:
            if key in self._wanted:
                self._wanted.remove(key)
            self._wanted.insert(0, key)
            if graph is None:
                self._misses[key] = self._misses.get(key, 0) + 1
        return graph

    def _covering(self, key: tuple[int, int]) -> _Graph | None:
        """The smallest captured graph that holds a bucket (more rows, more frames: padded and
        ignored as a bucket's own are) within ``COVER_WASTE`` times its size. Under a steady load
        (live re-decodes every few ms) the worker is seldom idle long enough to capture a new
        bucket, and an uncaptured batch is launched op by op: on the H200, 94 live streams kept
        the worker thread busy launching kernels for batches the GPU ran in a fraction of it."""
        bb, tt = key
        best, best_size = None, COVER_WASTE * bb * tt
        for (gb, gt), graph in self._graphs.items():
            if gb >= bb and gt >= tt and gb * gt <= best_size:
                best, best_size = graph, gb * gt
        return best

    @torch.inference_mode()
    def forward_ids(self, x: torch.Tensor, lengths: torch.Tensor, ban: torch.Tensor) -> torch.Tensor:
        return self.forward_scored(x, lengths, ban)[0]

    @torch.inference_mode()
    def forward_scored(self, x: torch.Tensor, lengths: torch.Tensor, ban: torch.Tensor):
        """(ids [B, T], logp [B, T], tags [B, 4, K], hidden [B, T, D]) of one pass
        (:func:`pipeline.model.fused.head`)."""
        b, t, _ = x.shape
        if t > self.max_frames:
            raise ValueError(f"clip too long for one pass: {t} frames > {self.max_frames}")
        graph = self._pick_graph(b, t)
        if graph is not None:
            return graph.run(x, lengths, ban)
        return self.core(x, lengths, ban, with_scores=True)

    @torch.inference_mode()
    def transcribe(self, waves: Sequence[torch.Tensor],
                   options: Sequence[TranscribeOptions]) -> list[EngineOutput]:
        """Transcribe a batch of 16 kHz waves; each item has its own options."""
        return self.transcribe_async(waves, options).result()

    @torch.inference_mode()
    def transcribe_async(self, waves: Sequence[torch.Tensor],
                         options: Sequence[TranscribeOptions]) -> "PendingBatch":
        """Queue a batch on the device and return at once (on CUDA the host never waits for the
        GPU here): :meth:`PendingBatch.result` waits for its token ids and detokenises. The next
        batch may be queued before this one's result is read: the worker overlaps them."""
        samples = [int(w.shape[0]) for w in waves]
        frames = [num_lfr_frames(n) for n in samples]
        # the per-item integers in one host tensor and one copy (each small copy costs ~0.1 ms)
        small = self._to_device(torch.tensor([
            samples, [LANGUAGE_QUERY_ROWS[_prompt_language(o)] * 2 + (0 if o.use_itn else 1) for o in options],
            [f + N_QUERIES for f in frames], [int(o.ban_emo_unk) for o in options]], dtype=torch.int64))
        feats, _ = self.frontend(self._padded(waves), small[0])
        x = torch.cat([self._queries[small[1]], feats.to(self.dtype)], dim=1)
        lengths, ban = small[2], small[3].bool()
        ids, logp, tags, hidden = self.forward_scored(x, lengths, ban)
        hot = self._hot_search(ids, lengths, hidden, options)
        pending = self._launch_decode(ids, lengths, [f + N_QUERIES for f in frames],
                                      [o.word_timestamps for o in options], (logp, tags),
                                      [o.languages for o in options])
        pending.hot = hot
        return pending

    def _hot_search(self, ids: torch.Tensor, lengths: torch.Tensor, hidden: torch.Tensor,
                    options: Sequence[TranscribeOptions]) -> "hotwords_mod.HotSearch | None":
        """Queue the hotword search for the rows that carry hotwords (None when none does: the
        batch decodes as it always did). A term the vocabulary cannot spell is left out of its
        row's list (logged; the API refuses such a list where it holds the vocabulary)."""
        rows, tables = [], []
        for i, o in enumerate(options):
            if o.hotwords:
                table = self.hotword_tables.get(o.hotwords)
                if len(table.terms):
                    rows.append(i), tables.append(table)
        if not rows:
            return None
        fm = getattr(self.core, "fused_model", self.core)
        return hotwords_mod.search(hidden, ids, lengths, fm.lo_w, fm.lo_b, rows, tables)

    @property
    def hotword_tables(self) -> "hotwords_mod.TableCache":
        """The spelt hotword lists of this engine's vocabulary (built on first use)."""
        cache = getattr(self, "_hotword_tables", None)
        if cache is None:
            if getattr(self.tokenizer, "sp", None) is None:
                self.tokenizer.decode([0])  # funasr builds its processor lazily
            cache = self._hotword_tables = hotwords_mod.TableCache(self.tokenizer.sp)
        return cache

    def decode(self, ids: torch.Tensor, lengths: torch.Tensor,
               word_times: Sequence[bool] = ()) -> list[EngineOutput]:
        """Greedy CTC on the device (collapse repeats, drop blanks and padding), ids to host.
        Items with ``word_times`` also get words timed by their CTC runs (funasr's 60 ms rule)."""
        return self._launch_decode(ids, lengths, lengths.tolist(), word_times).result()

    def _launch_decode(self, ids: torch.Tensor, lengths: torch.Tensor, host_lengths: list[int],
                       word_times: Sequence[bool], scores: tuple[torch.Tensor, torch.Tensor] | None = None,
                       allowed: list[tuple[str, ...]] | None = None) -> "PendingBatch":
        t = ids.shape[1]
        valid = torch.arange(t, device=ids.device)[None, :] < lengths[:, None]
        starts = torch.ones_like(ids, dtype=torch.bool)  # a new run of one symbol starts here
        starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
        keep = starts & (ids != BLANK_ID) & valid
        kept = torch.where(keep, ids, -1).to(torch.int32)
        runs = (starts & valid) if (any(word_times) or scores is not None) else None
        cuda = ids.device.type == "cuda"
        host = kept.to("cpu", non_blocking=cuda)  # pinned by the copy itself when asynchronous
        host_runs = runs.to("cpu", non_blocking=cuda) if runs is not None else None
        logp = tags = None
        if scores is not None:  # [B, T] + [B, 4, K] floats: ~4 bytes a frame beside the ids' 4
            logp, tags = (s.to("cpu", non_blocking=cuda) for s in scores)
        event = None
        if cuda:
            event = torch.cuda.Event()
            event.record()
        return PendingBatch(self, host, host_runs, host_lengths, list(word_times), event, logp, tags, allowed)

    def _host_decode(self, host: np.ndarray, runs: np.ndarray | None, lens: list[int],
                     word_times: Sequence[bool], scores=None) -> list[EngineOutput]:
        """Token ids -> text (and words); with ``scores`` (logp, tags, allow-lists) the tokens'
        confidence, the tag probabilities and the allow-list (:mod:`pipeline.model.confidence`)."""
        outs = []
        vocab = self.tag_vocab
        for i, row in enumerate(host):
            pos = np.flatnonzero(row >= 0)
            tokens = row[pos].tolist()
            run_starts = np.flatnonzero(runs[i]) if runs is not None else None
            lps = None
            extra = {}
            if scores is not None:
                logp, tags, allowed = scores[0][i], scores[1][i], scores[2][i]
                lps = confidence.token_logprobs(logp, run_starts, pos, lens[i])
                if allowed:
                    confidence.restrict_language(tokens, lps, pos, tags, float(logp[0]), vocab, allowed)
                is_text = np.array([p >= N_QUERIES or vocab.column(t) is None for t, p in zip(tokens, pos)],
                                   dtype=bool)
                extra = {"token_logprobs": tuple(round(float(v), 4) for v in lps),
                         "avg_logprob": confidence.avg_logprob(lps, is_text),
                         "tag_probs": confidence.tag_probs(tokens, pos, tags, vocab, allowed)}
            words = ()
            if run_starts is not None and i < len(word_times) and word_times[i]:
                words = self._words(tokens, pos, run_starts, lens[i], lps)
            outs.append(EngineOutput(tuple(tokens), self.tokenizer.decode(tokens), words, **extra))
        return outs

    def _piece(self, token_id: int) -> str:
        """The SentencePiece piece of an id ('\u2581' marks a word start)."""
        if getattr(self.tokenizer, "sp", None) is None:
            self.tokenizer.decode([token_id])  # funasr builds its processor lazily
        return self.tokenizer.sp.id_to_piece(int(token_id))

    def _words(self, tokens: list[int], pos: np.ndarray, run_starts: np.ndarray, n: int,
               lps: np.ndarray | None = None):
        """Pieces -> words with times: a token spans its CTC run; times as funasr's
        output_timestamp (frame k of the speech -> k * 60 ms - 30 ms, clipped); with ``lps``
        (the tokens' log probabilities) each word's probability, the mean of its pieces'."""
        run_ends = np.append(run_starts[1:], n)
        end_of = dict(zip(run_starts.tolist(), run_ends.tolist()))
        limit = (n - N_QUERIES) * FRAME_SECONDS - 0.03
        words: list[list] = []
        for k, (tok, p) in enumerate(zip(tokens, pos.tolist())):
            piece = self._piece(tok)
            if p < N_QUERIES or piece.startswith("<|") or piece == "\u2581":
                continue  # the prompt's tags, and bare word separators
            start = max((p - N_QUERIES) * FRAME_SECONDS - 0.03, 0.0)
            end = min((end_of[p] - N_QUERIES) * FRAME_SECONDS - 0.03, limit)
            ascii_alpha = piece.isascii() and piece.isalpha()
            lp = [float(lps[k])] if lps is not None else []
            if words and not piece.startswith("\u2581") and ascii_alpha and words[-1][3]:
                words[-1][0] += piece  # a word continued by a sub-word piece
                words[-1][2] = end
                words[-1][4] += lp
            else:
                words.append([piece.lstrip("\u2581"), start, end, ascii_alpha, lp])
        return tuple(Word(w[0], round(w[1], 3), round(w[2], 3),
                          confidence.word_probability(w[4]) if w[4] else None) for w in words if w[0])
