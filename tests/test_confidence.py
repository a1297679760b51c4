"""Confidence, tag scores and the language allow-list (issue 39): the host-side math on hand-made
posteriors, and the engine's figures against its own logits of the same pass (tiny model, CPU)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pipeline.domain.errors import InvalidOption
from pipeline.domain.tags import TOKEN_IDS
from pipeline.domain.types import TranscribeOptions
from pipeline.model import confidence
from pipeline.model.engine import N_QUERIES, SenseVoiceEngine
from pipeline.serving.records import SegmentResult, dump_options, load_options, transcript_from_pieces

# every tag an id: funasr's fixed ones, the others made up (past the vocabulary)
IDS = {**{n: 30_000 + k for k, n in enumerate(n for _, names in confidence.KINDS for n in names)}, **TOKEN_IDS}
VOCAB = confidence.TagVocab.from_pieces(lambda piece: IDS.get(piece[2:-2]))


# ---------------------------------------------------------------- the math
def test_a_token_is_as_sure_as_the_best_frame_of_its_run():
    logp = np.log(np.array([0.9, 0.5, 0.6, 0.8, 0.3, 0.2, 0.7], dtype=np.float32))
    run_starts = np.array([0, 1, 4, 5])  # runs [0], [1, 2, 3], [4], [5, 6]
    pos = np.array([1, 5])  # two tokens emitted (the others blank)
    got = np.exp(confidence.token_logprobs(logp, run_starts, pos, 7))
    assert np.allclose(got, [0.8, 0.7])
    assert len(confidence.token_logprobs(logp, run_starts, np.array([], dtype=np.int64), 7)) == 0


def test_word_probability_is_the_mean_of_its_pieces_and_avg_logprob_of_the_text_tokens():
    assert confidence.word_probability(np.log([0.5, 1.0])) == pytest.approx(0.75)
    lps = np.log(np.array([0.99, 0.5, 0.25]))
    assert confidence.avg_logprob(lps, np.array([False, True, True])) == pytest.approx(
        (np.log(0.5) + np.log(0.25)) / 2, abs=1e-4)
    assert confidence.avg_logprob(lps, np.zeros(3, dtype=bool)) is None


def _tags(**logits) -> np.ndarray:
    """[4, K] tag logits: -10 everywhere, the named tags' logits given."""
    t = np.full((4, len(VOCAB.ids)), -10.0, dtype=np.float32)
    for name, (frame, value) in logits.items():
        t[frame, VOCAB.names.index(name)] = value
    return t


def test_a_tag_probability_is_a_softmax_among_its_own_kind():
    tags = _tags(en=(0, 2.0), zh=(0, 2.0), HAPPY=(1, 5.0), Speech=(2, 0.0), withitn=(3, 3.0))
    tokens = [IDS["en"], IDS["HAPPY"], 777, IDS["withitn"], 9]
    pos = np.array([0, 1, 2, 3, 6])  # an unknown token at the event frame: no score for it
    probs = dict(confidence.tag_probs(tokens, pos, tags, VOCAB))
    assert probs["en"] == pytest.approx(0.5, abs=1e-3)  # en and zh tie; the others e^-12 away
    assert 0.99 < probs["HAPPY"] <= 1.0 and set(probs) == {"en", "HAPPY", "withitn"}


def test_the_allow_list_retakes_the_language_decision_among_the_allowed_ones():
    tags = _tags(ja=(0, 4.0), zh=(0, 3.0), en=(0, 1.0))
    lse = np.log(np.exp(4.0) + np.exp(3.0) + np.exp(1.0) + 100)  # the frame's whole vocabulary
    tokens, lps = [TOKEN_IDS["ja"], 42], np.array([4.0 - lse, -0.1])
    confidence.restrict_language(tokens, lps, np.array([0, 5]), tags, float(lps[0]), VOCAB, ("zh", "en"))
    assert tokens == [TOKEN_IDS["zh"], 42] and lps[0] == pytest.approx(3.0 - lse)
    probs = dict(confidence.tag_probs(tokens, np.array([0, 5]), tags, VOCAB, ("zh", "en")))
    assert probs["zh"] == pytest.approx(np.exp(3) / (np.exp(3) + np.exp(1) + np.exp(-10)), abs=1e-3)
    kept = [TOKEN_IDS["en"], 42]  # an allowed language stays; no-speech is always allowed
    confidence.restrict_language(kept, lps.copy(), np.array([0, 5]), tags, -1.0, VOCAB, ("en",))
    assert kept[0] == TOKEN_IDS["en"]
    quiet = [TOKEN_IDS["nospeech"]]
    confidence.restrict_language(quiet, np.array([-0.1]), np.array([0]), tags, -0.1, VOCAB, ("zh",))
    assert quiet == [TOKEN_IDS["nospeech"]]


def test_an_unknown_language_in_the_list_is_a_clear_error_and_a_text_list_is_parsed():
    with pytest.raises(InvalidOption, match="'xx'"):
        TranscribeOptions(languages="zh,xx")
    with pytest.raises(InvalidOption, match="'nospeech'"):
        TranscribeOptions(languages=["nospeech"])
    o = TranscribeOptions(languages=" zh, en,zh,,auto")
    assert o.languages == ("zh", "en") and hash(o) == hash(TranscribeOptions(languages=("zh", "en")))
    assert TranscribeOptions(languages="auto").languages == ()
    assert load_options(dump_options(o)) == o
    assert "languages" not in dump_options(TranscribeOptions())  # a previous release reads it


def test_a_piece_carries_its_scores_into_the_transcripts_segment():
    piece = SegmentResult("j", 0, 0.0, 2.0, None, "<|en|><|HAPPY|><|Speech|><|withitn|>Hi.", (),
                          avg_logprob=-0.25, tag_probs=(("en", 0.9), ("HAPPY", 0.6), ("Speech", 0.8)))
    seg = transcript_from_pieces([piece]).segments[0]
    assert (seg.avg_logprob, seg.language_probability, seg.emotion_probability, seg.event_probability) == (
        -0.25, 0.9, 0.6, 0.8)
    d = transcript_from_pieces([piece]).to_dict()
    assert d["segments"][0]["avg_logprob"] == -0.25


# ---------------------------------------------------------------- the engine, one pass
@pytest.fixture(scope="module")
def engine(tiny_am):
    return SenseVoiceEngine.from_automodel(tiny_am, "cpu", "float32")


@pytest.fixture(scope="module")
def waves():
    rng = np.random.default_rng(3)
    return [torch.from_numpy((0.1 * rng.standard_normal(n)).astype(np.float32)) for n in (24_000, 40_000)]


def _logits(engine, waves, opts):
    f, _, frames = engine.features(waves)
    x, lens, ban = engine.encoder_inputs(f, frames, opts)
    with torch.inference_mode():
        return engine.core(x, lens, ban, return_logits=True).float(), lens


def test_token_confidence_is_the_log_softmax_of_the_same_pass(engine, waves):
    opts = [TranscribeOptions(word_timestamps=True), TranscribeOptions("en", False)]
    outs = engine.transcribe(waves, opts)
    logits, lens = _logits(engine, waves, opts)
    for i, out in enumerate(outs):
        lp = torch.log_softmax(logits[i, : int(lens[i])], -1)
        ids = lp.argmax(-1)
        best = lp.max(-1).values
        want, k = [], 0
        while k < len(ids):  # each run's best frame, for the runs that emit a token
            j = k
            while j + 1 < len(ids) and ids[j + 1] == ids[k]:
                j += 1
            if ids[k] != 0:
                want.append(float(best[k: j + 1].max()))
            k = j + 1
        assert len(out.token_logprobs) == len(out.token_ids) == len(want)
        assert np.allclose(out.token_logprobs, want, atol=2e-4)
        if out.avg_logprob is not None:  # the text tokens' mean: inside the tokens' range
            assert min(want) - 1e-3 <= out.avg_logprob <= max(want[N_QUERIES:] or want) + 1e-3
        names = [n for n, _ in out.tag_probs]
        assert all(0 < p <= 1 for _, p in out.tag_probs) and len(names) == len(set(names))
    assert all(w.probability is not None and 0 < w.probability <= 1 for w in outs[0].words)


@pytest.fixture(scope="module")
def demo_engine(demo_dir):
    """The demo model: its rigged weights write a language tag at the language frame."""
    return SenseVoiceEngine.from_model_dir_fast(demo_dir, "cpu", "float32", compile=False)


def test_scores_leave_the_tokens_alone_and_the_allow_list_changes_only_the_language(demo_engine, waves):
    engine = demo_engine
    plain = engine.transcribe(waves, [TranscribeOptions()] * 2)
    logits, lens = _logits(engine, waves, [TranscribeOptions()] * 2)
    for i, out in enumerate(plain):
        first = [n for n, _ in out.tag_probs][0]
        assert out.token_ids[0] == TOKEN_IDS[first]
        allowed = tuple(c for c in ("zh", "en", "ja", "ko", "yue") if c != first)[:2]
        masked = engine.transcribe([waves[i]], [TranscribeOptions(languages=allowed)])[0]
        cols = [TOKEN_IDS[c] for c in (*allowed, "nospeech")]
        want = cols[int(logits[i, 0, cols].argmax())]
        assert masked.token_ids[0] == want != out.token_ids[0]
        assert masked.token_ids[1:] == out.token_ids[1:]
        assert masked.token_logprobs[1:] == out.token_logprobs[1:]
        name, prob = masked.tag_probs[0]  # its probability among the allowed languages
        assert TOKEN_IDS[name] == want and 0 < prob <= 1


def test_ban_emo_unk_never_answers_unknown(engine, waves):
    outs = engine.transcribe(waves, [TranscribeOptions(ban_emo_unk=True)] * 2)
    for out in outs:
        assert TOKEN_IDS["EMO_UNKNOWN"] not in out.token_ids
        assert "EMO_UNKNOWN" not in dict(out.tag_probs)
