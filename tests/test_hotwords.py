"""Hotwords: the list a client sends (pipeline/domain/hotwords.py) and the biased CTC decoding
(pipeline/model/hotwords.py), on crafted logit matrices where the answer is known, and through
the engine on the tiny model."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from pipeline.domain.errors import InvalidOption
from pipeline.domain.hotwords import (DEFAULT_WEIGHT, MAX_TERMS, Hotword, hotwords_from_funasr,
                                      hotwords_from_prompt, parse_hotwords)
from pipeline.domain.types import TranscribeOptions
from pipeline.model import hotwords as hw
from pipeline.serving.records import dump_options, load_options

V = 10  # a crafted vocabulary: 0 blank, 1..9 pieces
TAG = 9  # what the four prompt frames emit


# ---------------------------------------------------------------------- the list a client sends
def test_text_one_term_a_line_with_optional_weights():
    got = parse_hotwords("Kubernetes\n  New York:3.5 \n\nratio 3:2:1\n")
    assert got == (Hotword("Kubernetes", DEFAULT_WEIGHT), Hotword("New York", 3.5), Hotword("ratio 3:2", 1.0))


def test_json_list_of_texts_objects_and_pairs():
    got = parse_hotwords(json.dumps(["a:2", {"term": "b", "weight": 4}, ["c", 0.5], {"term": "d"}]))
    assert [(h.term, h.weight) for h in got] == [("a", 2.0), ("b", 4.0), ("c", 0.5), ("d", DEFAULT_WEIGHT)]


def test_empty_list_is_none_and_duplicates_keep_the_highest_weight():
    assert parse_hotwords("") == parse_hotwords("  \n ") == parse_hotwords([]) == parse_hotwords(None) == ()
    assert parse_hotwords("x:1\nx:3\nx") == (Hotword("x", 3.0),)
    assert TranscribeOptions(hotwords="").hotwords == ()


@pytest.mark.parametrize("value, message", [
    ("\n".join(f"t{i}" for i in range(10_000)), f"at most {MAX_TERMS}"),
    ("x:0", "between"), ("x:11", "between"), ("x:nan", "not a number"), ("x:inf", "not a number"),
    ("a" * 101, "longer than"), ("<|en|>", "tag"), ("a\x00b", "control"),
    ("[1, 2]", "each item"), ('[{"term": "a", "extra": 1}]', "object item"), ("[oops", "JSON list"),
    ({"term": "a"}, "give a list"),
])
def test_hostile_lists_are_refused_with_the_reason(value, message):
    with pytest.raises(InvalidOption, match=message):
        TranscribeOptions(hotwords=value)


def test_a_10000_term_json_list_is_refused_before_any_term_is_read():
    with pytest.raises(InvalidOption, match="10000 terms"):
        parse_hotwords(json.dumps([f"t{i}" for i in range(10_000)]))


def test_hotwords_are_stored_with_the_options_and_read_back():
    o = TranscribeOptions("en", hotwords="Kubernetes\nNew York:3")
    text = dump_options(o)
    assert json.loads(text)["hotwords"] == [["Kubernetes", 2.0], ["New York", 3.0]]
    assert load_options(text) == o and load_options(text).hotwords == o.hotwords
    assert "hotwords" not in json.loads(dump_options(TranscribeOptions("en")))  # old workers read the rest


@pytest.mark.parametrize("prompt, terms", [
    ("Kubernetes, New York, 北京", ("Kubernetes", "New York", "北京")),
    ("Kubernetes:4\nPostgres", ("Kubernetes", "Postgres")),
    ("开会、周报；季度目标", ("开会", "周报", "季度目标")),
    ("Kubernetes", ("Kubernetes",)),
    ("The meeting is about Kubernetes.", ()),
    ("a call about billing, refunds and the new pricing plan for teams", ()),
    ("Who is speaking?", ()),
    ("", ()),
    (None, ()),
])
def test_openai_prompt_reads_as_hotwords_only_when_it_is_a_list_of_short_terms(prompt, terms):
    assert tuple(h.term for h in hotwords_from_prompt(prompt)) == terms


@pytest.mark.parametrize("value, expected", [
    ('{"阿里巴巴": 20, "hello world": 40}', (("阿里巴巴", 2.0), ("hello world", 4.0))),
    ({"x": 500, "y": 0}, (("x", 10.0), ("y", 0.1))),  # bounded, as every weight is
    ("阿里巴巴 20\nhello world 40\nplain\n\n", (("阿里巴巴", 2.0), ("hello world", 4.0), ("plain", 2.0))),
    ("", ()),
])
def test_funasr_hotwords_as_its_clients_send_them(value, expected):
    assert tuple((h.term, h.weight) for h in hotwords_from_funasr(value)) == expected


@pytest.mark.parametrize("value, message", [
    ("{oops", "JSON object"), ('{"x": "heavy"}', "not a number"), ([1, 2], "JSON object"),
    (json.dumps({f"t{i}": 20 for i in range(10_000)}), "at most 1000"),
])
def test_hostile_funasr_hotwords_are_refused(value, message):
    with pytest.raises(InvalidOption, match=message):
        hotwords_from_funasr(value)


# ---------------------------------------------------------------------- the biased decoding
def _frames(*symbols: int, margin: float = 8.0) -> np.ndarray:
    """Logits [T, V] whose argmax is ``symbols`` (after the four prompt frames), every other
    symbol ``margin`` below."""
    rows = [TAG] * hw.FIRST_FRAME + list(symbols)
    x = np.full((len(rows), V), -margin, dtype=np.float32)
    for t, s in enumerate(rows):
        x[t, s] = 0.0
    return x


def _decode(matrices: list[np.ndarray], tables: list[hw.TermTable | None], device: str = "cpu") -> list[list[int]]:
    """Greedy CTC on the matrices, with each row's table (None: no hotwords), through the
    search and the host rewrite the engine uses; the text tokens of each row."""
    t_len = max(m.shape[0] for m in matrices)
    logits = torch.full((len(matrices), t_len, V), -30.0)
    for i, m in enumerate(matrices):
        logits[i, : m.shape[0]] = torch.from_numpy(m)
    lengths = torch.tensor([m.shape[0] for m in matrices])
    ids = logits.argmax(-1)
    starts = torch.ones_like(ids, dtype=torch.bool)
    starts[:, 1:] = ids[:, 1:] != ids[:, :-1]
    valid = torch.arange(t_len)[None, :] < lengths[:, None]
    host = torch.where(starts & (ids != 0) & valid, ids, -1).numpy().copy()
    runs = (starts & valid).numpy().copy()
    logp = np.zeros(ids.shape, dtype=np.float32)
    rows = [i for i, t in enumerate(tables) if t is not None]
    if rows:  # identity projection: the hidden state is the logits
        dev = torch.device(device)
        found = hw.search(logits.to(dev), ids.to(dev), lengths.to(dev), torch.eye(V, device=dev),
                          torch.zeros(V, device=dev), rows, [tables[i] for i in rows])
        if dev.type == "cuda":
            torch.cuda.synchronize()
        hw.rewrite(host, runs, logp, lengths.tolist(), found)
    return [[int(v) for v in row[hw.FIRST_FRAME:] if v >= 0] for row in host]


def _table(*terms: tuple[list[int], float]) -> hw.TermTable:
    return hw.table([(str(ids), ids, w) for ids, w in terms])


def test_a_second_best_term_is_promoted_and_the_rest_stays():
    x = _frames(0, 1, 0, 2, 2, 0, 3, 0)
    x[7:9, 5] = -1.0  # piece 5 is second best, one nat below piece 2, where 2 is said
    assert _decode([x], [None]) == [[1, 2, 3]]
    assert _decode([x], [_table(([5], 2.0))]) == [[1, 5, 3]]


def test_a_weight_below_the_audio_deficit_changes_nothing():
    x = _frames(0, 1, 0, 2, 2, 0, 3, 0)
    x[7:9, 5] = -1.0
    assert _decode([x], [_table(([5], 0.5))]) == [[1, 2, 3]]


def test_a_term_absent_from_the_audio_does_not_appear():
    x = _frames(0, 1, 0, 2, 2, 0, 3, 0, margin=15.0)
    assert _decode([x], [_table(([5], 10.0), ([6, 7], 10.0), ([5, 6, 7, 8], 10.0))]) == [[1, 2, 3]]


def test_a_multi_piece_term_wins_on_its_total_not_piece_by_piece():
    x = _frames(0, 4, 0, 6, 0, 3, 0)  # "4 6" said; the term is "4 7 ..." where 7 is close to 6
    x[7, 7] = -3.0  # 3 nats below: more than one piece's weight, less than the term's
    assert _decode([x], [_table(([4, 7], 2.0))]) == [[4, 7, 3]]
    x[7, 7] = -5.0  # now more than the whole term's bonus (2 x 2)
    assert _decode([x], [_table(([4, 7], 2.0))]) == [[4, 6, 3]]


def test_a_term_with_a_repeated_piece_takes_a_blank_between_them():
    x = _frames(0, 4, 4, 4, 0, 3, 0)  # greedy writes 4 once
    x[6, 0] = -0.5  # a blank in the middle of the run is nearly as likely
    assert _decode([x], [_table(([4, 4], 2.0))]) == [[4, 4, 3]]


def test_a_term_already_written_changes_nothing():
    x = _frames(0, 4, 0, 7, 0, 3, 0)
    assert _decode([x], [_table(([4, 7], 2.0), ([5], 1.0))]) == [[4, 7, 3]]


def test_each_row_of_a_batch_has_its_own_list_and_rows_without_any_are_untouched():
    x = _frames(0, 1, 0, 2, 2, 0, 3, 0)
    x[7:9, 5] = -1.0
    x[10, 6] = -1.5
    got = _decode([x, x, x, x[:9]], [None, _table(([5], 2.0)), _table(([6], 2.0)), _table(([5], 2.0))])
    assert got == [[1, 2, 3], [1, 5, 3], [1, 2, 6], [1, 5]]


@pytest.mark.requires_cuda
def test_the_search_on_the_gpu_decides_as_on_the_cpu():
    x = _frames(0, 1, 0, 2, 2, 0, 3, 0, 4, 0, 6, 0)
    x[7:9, 5] = -1.0
    x[14, 7] = -3.0  # 7 close to 6 where 6 is said
    cases = ([x, x, x[:9]], [None, _table(([5], 2.0), ([4, 7], 2.0)), _table(([5], 0.5))])
    assert _decode(*cases, device="cuda") == _decode(*cases) == [[1, 2, 3, 4, 6], [1, 5, 3, 4, 7], [1, 2]]


def test_two_terms_never_write_over_the_same_frames():
    x = _frames(0, 1, 0, 2, 0, 3, 0)
    x[7, 5] = -1.0
    x[7, 6] = -0.5
    assert _decode([x], [_table(([5], 2.0), ([6], 2.0))]) == [[1, 6, 3]]  # the better gain wins


def test_the_prompt_frames_are_never_biased():
    x = _frames(0, 1, 0)
    x[: hw.FIRST_FRAME, 5] = -0.1  # nearly the prompt's tag there; 8 nats below everywhere else
    assert _decode([x], [_table(([5], 2.0))]) == [[1]]
    x[hw.FIRST_FRAME, 5] = -0.1  # the same right after the prompt: promoted
    assert _decode([x], [_table(([5], 2.0))]) == [[5, 1]]


# ---------------------------------------------------------------------- spelling
@pytest.fixture(scope="module")
def sp(demo_dir):
    import sentencepiece as spm

    proc = spm.SentencePieceProcessor()
    proc.load(str(demo_dir / "chn_jpn_yue_eng_ko_spectok.bpe.model"))
    return proc


def test_terms_are_spelt_as_the_model_writes_them(sp):
    table = hw.spell(sp, parse_hotwords("hello world\n北京"))
    assert table.terms == ("hello world", "北京")
    first = [sp.id_to_piece(int(i)) for i in table.tokens[0] if i > 0]
    assert first == ["\u2581hello", "\u2581world"]  # English: word starts
    second = [sp.id_to_piece(int(i)) for i in table.tokens[1] if i > 0]
    assert second == ["北", "京"]  # Chinese: no word-start mark mid-sentence
    assert table.bonus.tolist() == [2 * DEFAULT_WEIGHT, 2 * DEFAULT_WEIGHT]


def test_a_term_the_vocabulary_cannot_spell_is_reported(sp):
    with pytest.raises(hw.Unspellable, match="cannot spell 'zzqx'.*unknown: zz"):
        hw.spell(sp, parse_hotwords("hello\nzzqx"))
    with pytest.raises(hw.Unspellable, match="cannot spell"):
        hw.spell(sp, parse_hotwords("\u0101\u0102"))
    lenient = hw.spell(sp, parse_hotwords("hello\nzzqx"), strict=False)  # the engine: left out
    assert lenient.terms == ("hello",)


def test_the_api_check_reads_the_configured_model_directory(demo_dir, tmp_path):
    from pipeline.model.loading import hotword_checker
    from tests.conftest import make_settings

    check = hotword_checker(make_settings(demo_dir, tmp_path))
    check(parse_hotwords("hello\n北京"))
    with pytest.raises(hw.Unspellable, match="cannot spell 'zzqx'"):
        check(parse_hotwords("hello\nzzqx"))
    elsewhere = hotword_checker(make_settings(tmp_path / "no-model-here", tmp_path))
    elsewhere(parse_hotwords("zzqx"))  # no vocabulary on this host: the engine's lenient spelling


def test_a_term_of_too_many_pieces_is_refused(sp):
    with pytest.raises(InvalidOption, match="at most 64"):
        hw.spell(sp, parse_hotwords("北京" * 40))


def test_the_table_cache_spells_a_list_once(sp):
    cache = hw.TableCache(sp, size=2)
    words = parse_hotwords("hello")
    assert cache.get(words) is cache.get(words) is cache.get(parse_hotwords("hello"))
    cache.get(parse_hotwords("a"))
    cache.get(parse_hotwords("b"))
    assert len(cache._by_value) == 2


# ---------------------------------------------------------------------- through the engine
@pytest.fixture(scope="module")
def engine(tiny_dir):
    from pipeline.model.engine import SenseVoiceEngine

    return SenseVoiceEngine.from_model_dir_fast(tiny_dir, "cpu", "float32", compile=False)


@pytest.fixture(scope="module")
def waves():
    rng = np.random.default_rng(1)
    return [torch.from_numpy((0.1 * rng.standard_normal(n)).astype(np.float32)) for n in (48_000, 30_000, 48_000)]


def test_engine_rows_without_hotwords_keep_their_tokens_bit_for_bit(engine, waves):
    plain = [TranscribeOptions("en")] * 3
    base = engine.transcribe(waves, plain)
    mixed = engine.transcribe(waves, [plain[0], TranscribeOptions("en", hotwords="hello:10"), plain[2]])
    for k in (0, 2):
        assert mixed[k].token_ids == base[k].token_ids
        assert mixed[k].token_logprobs == base[k].token_logprobs
    # the tiny model's weights are random: every piece is close to the argmax somewhere, and a
    # heavy weight writes the term in; its row's other tokens stay outside the term's span
    assert "hello" in mixed[1].raw_text and "hello" not in base[1].raw_text
    assert len(mixed[1].token_logprobs) == len(mixed[1].token_ids)


def test_engine_with_an_unspellable_term_boosts_the_rest(engine, waves, caplog):
    out = engine.transcribe(waves[:1], [TranscribeOptions("en", hotwords="hello:10\nzzqx")])
    assert "hello" in out[0].raw_text
    assert "cannot spell 'zzqx'" in caplog.text


# ---------------------------------------------------------------------- the CLI
def test_cli_reads_a_hotwords_file_and_refuses_a_bad_one(tmp_path, capsys):
    from pipeline.cli import parse_args

    good = tmp_path / "terms.txt"
    good.write_text("Kubernetes\nNew York:3\n", encoding="utf-8")
    args = parse_args(["a.wav", "--output-dir", str(tmp_path), "--hotwords", str(good)])
    assert args.hotwords == (Hotword("Kubernetes"), Hotword("New York", 3.0))
    assert parse_args(["a.wav", "--output-dir", str(tmp_path)]).hotwords == ()
    huge = tmp_path / "huge.txt"
    huge.write_text("\n".join(f"t{i}" for i in range(10_000)), encoding="utf-8")
    for bad, message in ((huge, "at most 1000"), (tmp_path / "missing.txt", "cannot read")):
        with pytest.raises(SystemExit) as e:
            parse_args(["a.wav", "--output-dir", str(tmp_path), "--hotwords", str(bad)])
        assert e.value.code == 2 and message in capsys.readouterr().err
