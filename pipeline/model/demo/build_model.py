"""Build local, offline SenseVoiceSmall model directories for tests and demos.

A built directory has the layout of the published ``iic/SenseVoiceSmall``
repository, so ``funasr.AutoModel(model=DIR, disable_update=True, ...)`` loads
it without any model hub:

    config.yaml                            architecture / frontend / tokenizer config
    configuration.json                     file_path_metas (relative file names)
    model.pt                               state dict of funasr's own SenseVoiceSmall
    am.mvn                                 Kaldi-text CMVN (<AddShift>/<Rescale>, 560 dims)
    chn_jpn_yue_eng_ko_spectok.bpe.model   sentencepiece model trained here
    tokens.json                            the pieces in id order
    README.md                              what this is (synthetic weights)
    sensevoice_build.json                  marker: variant, seed, params, builder_version

Variants (``VARIANTS``):

* ``tiny`` -- 64-dim encoder, 2 + 1 blocks, random weights (~1.8M params, 7.4 MB).
* ``full`` -- the published architecture, random weights (233,999,167 params, 936 MB).
* ``demo`` -- tiny architecture with hand-set weights (see :func:`rig_model`):
  ``generate()`` returns e.g. ``<|en|><|NEUTRAL|><|Speech|><|withitn|> speech``
  deterministically, the language tag following ``language=`` and the itn tag
  following ``use_itn``.

Output is byte-identical for the same (variant, seed), and matches
``/work/shared/reference/build_sensevoice_dir.py`` (``--rig`` == ``demo``) for
every file except README.md and the marker.  Heavy imports (torch, funasr,
sentencepiece) happen inside the functions that need them.

CLI::

    python -m pipeline.model.demo.build_model --variant full --out DIR
    python -m pipeline.model.demo.build_model --variant demo          # into the cache
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import shutil
import tempfile
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import yaml

from pipeline.domain.tags import (AUTO_LANGUAGE_ROW, EMOTION_QUERY_ROW, EVENT_QUERY_ROW, ITN_TABLE,
                                  LANGUAGE_TABLE, NO_SPEECH, SAMPLE_RATE_HZ, TOKEN_IDS)

# ----------------------------------------------------------------- constants
VARIANTS = ("tiny", "full", "demo")
BUILDER_VERSION = 1  # bump when the bytes of a built directory change

VOCAB_SIZE = 25055  # pieces in the real chn_jpn_yue_eng_ko_spectok.bpe.model
BPE_NAME = "chn_jpn_yue_eng_ko_spectok.bpe.model"
MARKER_NAME = "sensevoice_build.json"
MODEL_FILES = ("config.yaml", "configuration.json", "model.pt", "am.mvn", BPE_NAME,
               "tokens.json", "README.md")
CACHE_ENV = "SENSEVOICE_CACHE_DIR"
DEFAULT_CACHE_ROOT = Path("~/.cache/sensevoice-app/models")

# Encoder sizes (dims / heads / FFN units / SAN-M blocks / tp blocks); "full" is
# the published SenseVoiceSmall config.
ENCODERS = {
    "full": dict(output_size=512, attention_heads=4, linear_units=2048, num_blocks=50,
                 tp_blocks=20),
    "tiny": dict(output_size=64, attention_heads=4, linear_units=128, num_blocks=2,
                 tp_blocks=1),
}
ARCHITECTURE = {"tiny": "tiny", "full": "full", "demo": "tiny"}  # variant -> ENCODERS key
RIGGED = frozenset({"demo"})  # variants with hand-set weights and a flat am.mvn

ENCODER_COMMON = dict(
    dropout_rate=0.1, positional_dropout_rate=0.1, attention_dropout_rate=0.1,
    input_layer="pe", pos_enc_class="SinusoidalPositionEncoder", normalize_before=True,
    kernel_size=11, sanm_shfit=0, selfattention_layer_type="sanm",
)
FRONTEND_CONF = {  # fs in Hz, frame_length / frame_shift in ms, LFR: stack 7, hop 6
    "fs": SAMPLE_RATE_HZ, "window": "hamming", "n_mels": 80, "frame_length": 25,
    "frame_shift": 10, "lfr_m": 7, "lfr_n": 6, "cmvn_file": None,
}
FEATURE_DIM = FRONTEND_CONF["n_mels"] * FRONTEND_CONF["lfr_m"]  # 560 encoder inputs

# Training-only sections, kept for fidelity with the published config.yaml.
TRAINING_SECTIONS = {
    "dataset": "SenseVoiceCTCDataset",
    "dataset_conf": {
        "index_ds": "IndexDSJsonl", "batch_sampler": "EspnetStyleBatchSampler",
        "data_split_num": 32, "batch_type": "token", "batch_size": 14000,
        "max_token_length": 2000, "min_token_length": 60, "max_source_length": 2000,
        "min_source_length": 60, "max_target_length": 200, "min_target_length": 0,
        "shuffle": True, "num_workers": 4, "sos": 1, "eos": 2,
        "IndexDSJsonl": "IndexDSJsonl", "retry": 20,
    },
    "train_conf": {
        "accum_grad": 1, "grad_clip": 5, "max_epoch": 20, "keep_nbest_models": 10,
        "avg_nbest_model": 10, "log_interval": 100, "resume": True,
        "validate_interval": 10000, "save_checkpoint_interval": 10000,
    },
    "optim": "adamw",
    "optim_conf": {"lr": 0.00002},
    "scheduler": "warmuplr",
    "scheduler_conf": {"warmup_steps": 25000},
}

CONFIGURATION_JSON = {
    "framework": "pytorch",
    "task": "auto-speech-recognition",
    "model": {"type": "funasr"},
    "pipeline": {"type": "funasr-pipeline"},
    "model_name_in_hub": {"ms": "", "hf": ""},
    "file_path_metas": {  # funasr turns these into absolute paths at load time
        "init_param": "model.pt",
        "config": "config.yaml",
        "tokenizer_conf": {"bpemodel": BPE_NAME},
        "frontend_conf": {"cmvn_file": "am.mvn"},
    },
}

# ----------------------------------------------------------------- tokenizer constants
# Sentencepiece training corpus: sentences of these words (order matters: the
# seeded RNG picks by index, so reordering changes the built bytes).
CORPUS_WORDS = tuple("""
the of and to a in is it you that he was for on are with as i his they be at one have
this from or had by hot word but what some we can out other were all there when up use
your how said an each she which do their time if will way about many then them write
would like so these her long make thing see him two has look more day could go come did
number sound no most people my over know water than call first who may down side been
now find any new work part take get place made live where after back little only round
man year came show every good me give our under name very through just form sentence
great think say help low line differ turn cause much mean before move right boy old too
same tell does set three want air well also play small end put home read hand port large
spell add even land here must big high such follow act why ask men change went light
kind off need house picture try us again animal point mother world near build self earth
father head stand own page should country found answer school grow study still learn
plant cover food sun four between state keep eye never last let thought city tree cross
farm hard start might story saw far sea draw left late run while press close night real
life few north open seem together next white children begin got walk example ease paper
group always music those both mark often letter until mile river car feet care second
book carry took science eat room friend began idea fish mountain stop once base hear
horse cut sure watch color face wood main enough plain girl usual young ready above ever
red list though feel talk bird soon body dog family direct pose leave song measure door
product black short numeral class wind question happen complete ship area half rock
order fire south problem piece told knew pass since top whole king space heard best hour
better true during hundred five remember step early hold west ground interest reach fast
verb sing listen six table travel less morning ten simple several vowel toward war lay
against pattern slow center love person money serve appear road map rain rule govern
pull cold notice voice unit power town fine certain fly fall lead cry dark machine note
wait plan figure star box noun field rest correct able pound done beauty drive stood
contain front teach week final gave green oh quick develop ocean warm free minute strong
special mind behind clear tail produce fact street inch multiply nothing course stay
wheel full force blue object decide surface deep moon island foot system busy test
record boat common gold possible plane stead dry wonder laugh thousand ago ran check
game shape equate miss brought heat snow tire bring yes distant fill east paint language
among hello weather today sunny park speech recognition offline pipeline model audio
""".split())
CORPUS_SENTENCES = 20000
CORPUS_WORDS_PER_SENTENCE = (4, 14)  # inclusive range
CORPUS_PUNCTUATION = (".", "?", "!", ",")
TRAINED_VOCAB = 1000  # sentencepiece unigram size before extension to VOCAB_SIZE

# Language ids hard-coded in funasr/models/sense_voice/model.py (pipeline/domain/tags.py).
LANGUAGE_IDS = {lang.token_id: lang.code for lang in LANGUAGE_TABLE if lang.code != NO_SPEECH}
SPECIAL_START = min(LANGUAGE_IDS)  # first special-token id (zh); ids below are sub-words / fillers
NOSPEECH_ID = TOKEN_IDS[NO_SPEECH]  # end of the language block
LANGUAGE_TOKENS = {i: f"<|{code}|>" for i, code in LANGUAGE_IDS.items()}
# Other whisper-style codes filling the rest of the language block (order guessed).
LANGUAGE_FILL = tuple("""
de es ru fr pt tr pl ca nl ar sv it id hi fi vi he uk el ms cs ro da hu ta no th ur hr bg
lt la mi ml cy sk te fa lv bn sr az sl kn et mk br eu is hy ne mn bs kk sq sw gl mr pa si
km sn yo so af oc ka be tg sd gu am yi lo uz fo ht ps tk nn mt sa lb my bo tl mg as tt haw
ln ha ba jw su ceb ilo min ace ban bug mad mak
""".split())
# Positions of the tags funasr's code does not fix: guessed, for demo models only (the ids fixed
# in model.py -- nospeech, HAPPY..NEUTRAL, EMO_UNKNOWN, withitn/woitn -- come from TOKEN_IDS).
GUESSED_IDS = {
    # events
    24993: "Speech", 24994: "BGM", 24995: "Applause", 24996: "Laughter",
    24997: "Cry", 24998: "Sneeze", 24999: "Breath", 25000: "Cough",
    # emotions
    25005: "FEARFUL", 25006: "DISGUSTED", 25007: "SURPRISED", 25008: "EMO_OTHER",
    # more events
    25010: "Sing", 25011: "Speech_Noise", 25012: "GBG", 25013: "Event_UNK",
    25014: "Cough_Other", 25015: "Event_Other",
}
SPECIAL_TOKENS = {
    token_id: f"<|{name}|>"
    for token_id, name in sorted({**GUESSED_IDS, **{i: n for n, i in TOKEN_IDS.items()
                                                    if n not in LANGUAGE_IDS.values()}}.items())
}
# Single characters appended as NORMAL pieces up to SPECIAL_START (NFKC-stable).
FILLER_RANGES = (
    (0x4E00, 0x9FA6),  # CJK unified ideographs
    (0x3041, 0x3097),  # hiragana
    (0x30A1, 0x30FB),  # katakana
    (0xAC00, 0xD7A4),  # hangul syllables
)

# ----------------------------------------------------------------- CMVN constants
CMVN_SHIFT = -10.0  # added to log-mel features (about minus their mean)
CMVN_SHIFT_SLOPE = 2.0  # extra shift across the 80 mel bins (0 for rigged models)
CMVN_SCALE = 0.25  # multiplies shifted features (about 1 / std)

# ----------------------------------------------------------------- rig constants
# Prompt row of model.embed (lid / emo / event / textnorm queries) -> token emitted.
# (auto answers English; the event and emotion queries answer the NEUTRAL and Speech tags.)
RIG_PROMPT_TOKENS = {
    AUTO_LANGUAGE_ROW: "<|en|>",
    **{lang.query_row: f"<|{lang.code}|>" for lang in LANGUAGE_TABLE},
    EVENT_QUERY_ROW: "<|NEUTRAL|>", EMOTION_QUERY_ROW: "<|Speech|>",
    **{t.query_row: f"<|{t.name}|>" for t in ITN_TABLE},
}
RIG_SPEECH_PIECE = "\u2581speech"  # emitted for each voiced run
RIG_PROMPT_DIMS = 16  # encoder dims 0..15 carry the prompt one-hots
RIG_SPEECH_DIM = 16  # encoder dim carrying the voiced-speech score
RIG_EMBED_GAIN = 50.0  # prompt one-hot amplitude
RIG_TILT_GAIN = 6.0  # weight of (low-band minus high-band) log-mel energy
RIG_TILT_BIAS = 2.0  # speech score bias, in units of RIG_TILT_GAIN
RIG_LOW_BINS = range(0, 20)  # mel bins counted as "low band"
RIG_HIGH_BINS = range(60, 80)  # mel bins counted as "high band"
RIG_LFR_FRAMES = range(1, 7)  # which of the 7 stacked LFR frames are read
RIG_BLANK_BIAS = 5.0  # constant blank evidence
RIG_LOGIT_GAIN = 10.0  # CTC weight from an encoder dim to its token


@dataclass(frozen=True)
class BuildInfo:
    """Result of :func:`build_model_dir`."""

    variant: str
    path: Path
    params: int
    seconds: float


# ----------------------------------------------------------------- config
def _check_variant(variant: str) -> None:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; expected one of {VARIANTS}")


def make_config(variant: str) -> dict:
    """The config.yaml contents for ``variant`` (file paths are left to configuration.json)."""
    _check_variant(variant)
    encoder_conf = {**ENCODERS[ARCHITECTURE[variant]], **ENCODER_COMMON}
    return {
        "encoder": "SenseVoiceEncoderSmall",
        "encoder_conf": encoder_conf,
        "model": "SenseVoiceSmall",
        "model_conf": {"length_normalized_loss": True, "sos": 1, "eos": 2, "ignore_id": -1},
        "tokenizer": "SentencepiecesTokenizer",
        "tokenizer_conf": {"bpemodel": None, "unk_symbol": "<unk>", "split_with_space": True},
        "frontend": "WavFrontend",
        "frontend_conf": dict(FRONTEND_CONF),
        **TRAINING_SECTIONS,
    }


# ----------------------------------------------------------------- tokenizer
def special_tokens() -> dict[int, str]:
    """Map id -> piece for every id in ``SPECIAL_START .. VOCAB_SIZE - 1``."""
    out = {**LANGUAGE_TOKENS, **SPECIAL_TOKENS}
    languages = iter(LANGUAGE_FILL)
    for i in range(SPECIAL_START, NOSPEECH_ID):
        if i not in out:
            out[i] = f"<|{next(languages)}|>"
    n = 0
    for i in range(SPECIAL_START, VOCAB_SIZE):
        if i not in out:
            out[i] = f"<|SPECIAL_TOKEN_{n}|>"
            n += 1
    return out


def _filler_chars() -> Iterator[str]:
    for start, stop in FILLER_RANGES:
        for cp in range(start, stop):
            yield chr(cp)


def _write_corpus(path: Path, seed: int) -> None:
    rng = random.Random(seed)
    lo, hi = CORPUS_WORDS_PER_SENTENCE
    with open(path, "w", encoding="utf-8") as f:
        for _ in range(CORPUS_SENTENCES):
            n = rng.randint(lo, hi)
            sentence = " ".join(rng.choice(CORPUS_WORDS) for _ in range(n))
            f.write(sentence.capitalize() + rng.choice(CORPUS_PUNCTUATION) + "\n")


def _train_sentencepiece(seed: int):
    """Train a small unigram model on the synthetic corpus; return its ModelProto."""
    import sentencepiece as spm
    from sentencepiece import sentencepiece_model_pb2 as pb

    with tempfile.TemporaryDirectory() as td:
        corpus, prefix = Path(td) / "corpus.txt", Path(td) / "sp"
        _write_corpus(corpus, seed)
        spm.SentencePieceTrainer.train(
            input=str(corpus), model_prefix=str(prefix), vocab_size=TRAINED_VOCAB,
            model_type="unigram", character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2,
            pad_id=-1, num_threads=1, minloglevel=2, hard_vocab_limit=False,
        )
        proto = pb.ModelProto()
        proto.ParseFromString(prefix.with_suffix(".model").read_bytes())
    return proto


def _extend_vocab(proto) -> None:
    """Rewrite ``proto.pieces`` in place: specials, trained pieces, fillers, tags."""
    from sentencepiece import sentencepiece_model_pb2 as pb

    kind = pb.ModelProto.SentencePiece
    trained = [(p.piece, p.score) for p in proto.pieces if p.type == kind.NORMAL]
    del proto.pieces[:]

    def add(piece: str, score: float, typ: int) -> None:
        sp = proto.pieces.add()
        sp.piece, sp.score, sp.type = piece, score, typ

    add("<unk>", 0.0, kind.UNKNOWN)  # id 0 == CTC blank in SenseVoice
    add("<s>", 0.0, kind.CONTROL)  # id 1 == sos
    add("</s>", 0.0, kind.CONTROL)  # id 2 == eos
    seen = {"<unk>", "<s>", "</s>"}
    for piece, score in trained:
        add(piece, score, kind.NORMAL)
        seen.add(piece)
    filler_score = min(score for _, score in trained) - 1.0
    chars = (c for c in _filler_chars() if c not in seen)
    while len(proto.pieces) < SPECIAL_START:
        add(next(chars), filler_score, kind.NORMAL)
    specials = special_tokens()
    for i in range(SPECIAL_START, VOCAB_SIZE):  # USER_DEFINED: decode literally
        add(specials[i], 0.0, kind.USER_DEFINED)


def build_tokenizer(path: str | Path, seed: int = 0) -> list[str]:
    """Write the sentencepiece model to ``path``; return its pieces in id order."""
    import sentencepiece as spm

    proto = _train_sentencepiece(seed)
    _extend_vocab(proto)
    assert len(proto.pieces) == VOCAB_SIZE
    proto.trainer_spec.vocab_size = VOCAB_SIZE
    proto.trainer_spec.model_prefix = BPE_NAME.removesuffix(".model")
    proto.trainer_spec.input[:] = []
    Path(path).write_bytes(proto.SerializeToString())

    sp = spm.SentencePieceProcessor(model_file=str(path))
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())]
    expected = {**LANGUAGE_TOKENS, **SPECIAL_TOKENS}
    wrong = {i: pieces[i] for i, t in expected.items() if pieces[i] != t}
    if len(pieces) != VOCAB_SIZE or wrong:
        raise RuntimeError(f"tokenizer check failed: size {len(pieces)}, wrong ids {wrong}")
    return pieces



# ----------------------------------------------------------------- cmvn
def write_am_mvn(path: str | Path, dim: int = FEATURE_DIM, flat: bool = False) -> None:
    """Write a Kaldi-text CMVN file; ``flat`` drops the per-bin shift slope (rigged models)."""
    n_mels = FRONTEND_CONF["n_mels"]
    slope = 0.0 if flat else CMVN_SHIFT_SLOPE
    shift = " ".join(f"{CMVN_SHIFT - slope * ((i % n_mels) / float(n_mels)):.6f}"
                     for i in range(dim))
    scale = " ".join(f"{CMVN_SCALE:.6f}" for _ in range(dim))
    Path(path).write_text(
        "<Nnet>\n"
        f"<Splice> {dim} {dim}\n[ 0 ]\n"
        f"<AddShift> {dim} {dim}\n<LearnRateCoef> 0 [ {shift} ]\n"
        f"<Rescale> {dim} {dim}\n<LearnRateCoef> 0 [ {scale} ]\n"
        "</Nnet>\n",
        encoding="utf-8",
    )


# ----------------------------------------------------------------- model
def _construct(variant: str):
    """A SenseVoiceSmall for ``variant`` built through funasr's own classes."""
    # importing the module registers SenseVoiceSmall / SenseVoiceEncoderSmall in funasr
    from funasr.models.sense_voice.model import SenseVoiceSmall

    cfg = make_config(variant)
    return SenseVoiceSmall(encoder=cfg["encoder"], encoder_conf=cfg["encoder_conf"],
                           input_size=FEATURE_DIM, vocab_size=VOCAB_SIZE, **cfg["model_conf"])


def new_model(variant: str, seed: int = 0):
    """A randomly initialised model (``torch.manual_seed(seed)``, caller's RNG untouched)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return _construct(variant)


def count_params(variant: str = "full") -> int:
    """Parameter count of ``variant``, from a model on the meta device (no memory, <1 s)."""
    import torch
    # Import funasr (and torchaudio) *outside* the meta context: tensors they create at
    # import time (e.g. torchaudio's kaldi EPSILON) would otherwise live on "meta".
    import funasr.models.sense_voice.model  # noqa: F401

    with torch.device("meta"):
        model = _construct(variant)
    return sum(p.numel() for p in model.parameters())


def _isolate_frames(encoder) -> None:
    """Zero attention, FSMN memory and FFN outputs: each frame is classified on its own."""
    for layer in [*encoder.encoders0, *encoder.encoders, *encoder.tp_encoders]:
        att = layer.self_attn
        for t in (att.linear_q_k_v.weight, att.linear_q_k_v.bias, att.fsmn_block.weight,
                  att.linear_out.weight, att.linear_out.bias,
                  layer.feed_forward.w_2.weight, layer.feed_forward.w_2.bias):
            t.zero_()


def _wire_first_layer(encoder, blank_dim: int) -> None:
    """First layer (560 -> d, no residual): its value projection carries the signal."""
    n_mels = FRONTEND_CONF["n_mels"]
    d = encoder.output_size()
    qkv = encoder.encoders0[0].self_attn.linear_q_k_v
    v0 = 2 * d  # value rows follow the query and key rows
    for r in range(RIG_PROMPT_DIMS):
        qkv.weight[v0 + r, r] = 1.0
    low = [n_mels * k + b for k in RIG_LFR_FRAMES for b in RIG_LOW_BINS]
    high = [n_mels * k + b for k in RIG_LFR_FRAMES for b in RIG_HIGH_BINS]
    for c in low:
        qkv.weight[v0 + RIG_SPEECH_DIM, c] = RIG_TILT_GAIN / len(low)
    for c in high:
        qkv.weight[v0 + RIG_SPEECH_DIM, c] = -RIG_TILT_GAIN / len(high)
    qkv.bias[v0 + RIG_SPEECH_DIM] = RIG_TILT_GAIN * RIG_TILT_BIAS
    qkv.bias[v0 + blank_dim] = RIG_BLANK_BIAS


def _wire_ctc(model, pieces: list[str], blank_dim: int) -> None:
    """CTC head: prompt dims -> their tags, speech dim -> '▁speech', blank dim -> blank."""
    index = {p: i for i, p in enumerate(pieces)}
    if RIG_SPEECH_PIECE not in index:
        raise RuntimeError(f"tokenizer lacks the piece {RIG_SPEECH_PIECE!r}")
    lo = model.ctc.ctc_lo
    lo.weight.zero_()
    lo.bias.zero_()
    for row, token in RIG_PROMPT_TOKENS.items():
        lo.weight[index[token], row] = RIG_LOGIT_GAIN
    lo.weight[0, blank_dim] = RIG_LOGIT_GAIN
    lo.weight[index[RIG_SPEECH_PIECE], RIG_SPEECH_DIM] = RIG_LOGIT_GAIN


def rig_model(model, pieces: list[str]):
    """Hand-set weights so the model behaves like a (very dumb) trained SenseVoice.

    The 4 prompt frames emit ``<|lang|><|NEUTRAL|><|Speech|><|withitn|/woitn|>``
    (language follows ``language=``, "auto" gives ``<|en|>``); frames whose
    spectrum tilts towards low frequencies (voiced speech) emit ``▁speech``,
    others blank.  Deterministic with dither 0; needs the flat am.mvn.
    """
    import torch

    encoder = model.encoder
    d = encoder.output_size()
    if d <= RIG_SPEECH_DIM + 1 or model.embed.weight.shape[1] != FEATURE_DIM:
        raise ValueError(f"cannot rig a model with d={d}")
    blank_dim = d - 1
    with torch.no_grad():
        model.embed.weight.zero_()
        for r in range(model.embed.weight.shape[0]):
            model.embed.weight[r, r] = RIG_EMBED_GAIN
        _isolate_frames(encoder)
        _wire_first_layer(encoder, blank_dim)
        _wire_ctc(model, pieces, blank_dim)
    return model


# ----------------------------------------------------------------- directory
def read_marker(model_dir: str | Path) -> dict | None:
    """The build marker of ``model_dir`` as a dict, or None if absent/unreadable."""
    try:
        data = json.loads((Path(model_dir) / MARKER_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_demo_model(model_dir: str | Path) -> bool:
    """True if ``model_dir`` was built here as the ``demo`` (rigged) variant."""
    marker = read_marker(model_dir)
    return bool(marker) and marker.get("variant") == "demo"


def _readme(variant: str, seed: int, params: int) -> str:
    kind = "hand-set" if variant in RIGGED else "random"
    return (f"# SYNTHETIC SenseVoiceSmall ({variant})\n\n"
            f"Weights are {kind} (seed {seed}), {params:,} parameters, built locally by "
            "pipeline.model.demo.build_model. Transcripts are meaningless: this directory is "
            "only for offline tests and demos.\n")


def _write_json(path: Path, obj, **kw) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, **kw)


def build_model_dir(out: str | Path, variant: str = "tiny", seed: int = 0) -> BuildInfo:
    """Write a complete model directory for ``variant`` into ``out`` (created if needed).

    The marker file is written last, so a directory with a marker is complete.
    """
    import torch

    _check_variant(variant)
    t0 = time.perf_counter()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER_NAME).unlink(missing_ok=True)
    with open(out / "config.yaml", "w", encoding="utf-8") as f:
        yaml.safe_dump(make_config(variant), f, sort_keys=False, allow_unicode=True)
    _write_json(out / "configuration.json", CONFIGURATION_JSON, indent=2)
    pieces = build_tokenizer(out / BPE_NAME, seed=seed)
    _write_json(out / "tokens.json", pieces, ensure_ascii=False)
    write_am_mvn(out / "am.mvn", flat=variant in RIGGED)

    model = new_model(variant, seed)
    if variant in RIGGED:
        rig_model(model, pieces)
    params = sum(p.numel() for p in model.parameters())
    torch.save(model.state_dict(), out / "model.pt")
    del model
    (out / "README.md").write_text(_readme(variant, seed, params), encoding="utf-8")
    _write_json(out / MARKER_NAME, {"variant": variant, "seed": seed, "params": params,
                                    "builder_version": BUILDER_VERSION}, indent=1)
    return BuildInfo(variant, out, params, round(time.perf_counter() - t0, 3))


# ----------------------------------------------------------------- cache
def default_cache_root() -> Path:
    """``$SENSEVOICE_CACHE_DIR`` or ``~/.cache/sensevoice-app/models``."""
    from pipeline.config import env_cache_dir

    return env_cache_dir() or DEFAULT_CACHE_ROOT.expanduser()


def _is_built(model_dir: Path, variant: str, seed: int) -> bool:
    marker = read_marker(model_dir)
    return (marker is not None
            and marker.get("variant") == variant
            and marker.get("seed") == seed
            and marker.get("builder_version") == BUILDER_VERSION
            and all((model_dir / name).is_file() for name in MODEL_FILES))


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive ``fcntl.flock`` on ``path`` (between processes and between threads)."""
    with open(path, "a+b") as fh:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh.fileno(), fcntl.LOCK_UN)


def _replace_dir(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst``; an existing ``dst`` is moved aside first, then deleted."""
    stale = None
    if dst.exists():
        stale = dst.with_name(f".{dst.name}.stale-{uuid.uuid4().hex}")
        os.replace(dst, stale)
    os.replace(src, dst)
    if stale is not None:
        shutil.rmtree(stale, ignore_errors=True)


def ensure_model_dir(variant: str = "tiny", cache_root: str | Path | None = None,
                     seed: int = 0) -> Path:
    """Return ``cache_root/sensevoice-{variant}-s{seed}``, building it once if needed.

    Builds happen in a temporary directory beside the target under a file lock
    and are moved into place with ``os.replace``, so concurrent callers (threads
    or processes) build once and never see a half-written directory.
    """
    _check_variant(variant)
    root = Path(cache_root).expanduser() if cache_root is not None else default_cache_root()
    target = root / f"sensevoice-{variant}-s{seed}"
    if _is_built(target, variant, seed):
        return target
    root.mkdir(parents=True, exist_ok=True)
    with _file_lock(root / f".{target.name}.lock"):
        if _is_built(target, variant, seed):  # built by someone else while we waited
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
        try:
            build_model_dir(tmp, variant, seed)
            tmp.chmod(0o755)  # mkdtemp makes it 0700
            _replace_dir(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return target


# ----------------------------------------------------------------- CLI
def main(argv: list[str] | None = None) -> int:
    """``python -m pipeline.model.demo.build_model --variant full --out DIR``.

    Without ``--out`` the directory is built in (or taken from) the cache.
    Prints a JSON summary.
    """
    ap = argparse.ArgumentParser(prog="python -m pipeline.model.demo.build_model",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--variant", choices=VARIANTS, default="tiny")
    ap.add_argument("--out", help="target directory (default: the cache, see --cache-root)")
    ap.add_argument("--cache-root", help=f"cache root (default: ${CACHE_ENV} or "
                                         f"{DEFAULT_CACHE_ROOT})")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--count-params", action="store_true",
                    help="only print the parameter count of --variant (nothing is written)")
    args = ap.parse_args(argv)

    if args.count_params:
        summary = {"variant": args.variant, "params": count_params(args.variant)}
    elif args.out:
        info = build_model_dir(args.out, args.variant, args.seed)
        summary = {**asdict(info), "path": str(info.path)}
    else:
        path = ensure_model_dir(args.variant, args.cache_root, args.seed)
        summary = {"variant": args.variant, "path": str(path), **(read_marker(path) or {})}
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
