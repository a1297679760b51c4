"""pipeline.domain.richtext: SenseVoice rich text -> typed segments."""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import replace

import pytest

from pipeline.domain.tags import EMOTIONS, EVENTS, ITN_TAGS, LANGUAGES
from pipeline.domain.richtext import (
    TAG_RE,
    WHITESPACE,
    parse_rich_text,
    plain_text,
    to_transcript,
)
from pipeline.domain.types import Segment, Transcript


def seg(language="", emotion="", events=(), itn="", text="", start=None, end=None) -> Segment:
    return Segment(language, emotion, tuple(events), itn, text, start, end)


# ---- vocabulary ----


def test_vocabulary():
    assert LANGUAGES == ("zh", "en", "yue", "ja", "ko", "nospeech")
    assert EMOTIONS[:8] == (
        "HAPPY", "SAD", "ANGRY", "NEUTRAL", "FEARFUL", "DISGUSTED", "SURPRISED", "EMO_UNKNOWN",
    )  # fmt: skip
    assert "EMO_OTHER" in EMOTIONS
    assert EVENTS == (
        "BGM", "Speech", "Applause", "Laughter", "Cry", "Sneeze", "Breath", "Cough", "Sing",
        "Speech_Noise", "GBG", "Event_UNK",
    )  # fmt: skip
    assert ITN_TAGS == ("withitn", "woitn")
    names = LANGUAGES + EMOTIONS + EVENTS + ITN_TAGS
    assert len(set(names)) == len(names)
    assert all(TAG_RE.fullmatch(f"<|{n}|>") for n in names)


# ---- parse_rich_text ----


def test_single_segment_readme_example():
    raw = "<|en|><|HAPPY|><|Laughter|><|withitn|>That was great."
    want = seg("en", "HAPPY", ("Laughter",), "withitn", "That was great.")
    assert parse_rich_text(raw) == (want,)


def test_multi_segment():
    raw = "<|en|><|NEUTRAL|><|Speech|><|withitn|>Hi.<|zh|><|SAD|><|BGM|><|woitn|>你好。"
    assert parse_rich_text(raw) == (
        seg("en", "NEUTRAL", ("Speech",), "withitn", "Hi."),
        seg("zh", "SAD", ("BGM",), "woitn", "你好。"),
    )


def test_every_vocabulary_tag_is_classified():
    for lang in LANGUAGES:
        assert parse_rich_text(f"<|{lang}|>x")[0].language == lang
    for emo in EMOTIONS:
        assert parse_rich_text(f"<|{emo}|>x")[0].emotion == emo
    for ev in EVENTS:
        assert parse_rich_text(f"<|{ev}|>x")[0].events == (ev,)
    for itn in ITN_TAGS:
        assert parse_rich_text(f"<|{itn}|>x")[0].itn == itn


def test_several_events_keep_order():
    raw = "<|ja|><|SURPRISED|><|Applause|><|Laughter|><|BGM|><|withitn|>すごい"
    (s,) = parse_rich_text(raw)
    assert s.events == ("Applause", "Laughter", "BGM")
    assert s.text == "すごい"


def test_three_segments_with_empty_middle_segment():
    raw = (
        "<|en|><|HAPPY|><|Speech|><|withitn|>One."
        "<|nospeech|><|EMO_UNKNOWN|><|Event_UNK|><|woitn|>"
        "<|ko|><|ANGRY|><|Cough|><|woitn|>셋"
    )
    assert parse_rich_text(raw) == (
        seg("en", "HAPPY", ("Speech",), "withitn", "One."),
        seg("nospeech", "EMO_UNKNOWN", ("Event_UNK",), "woitn", ""),
        seg("ko", "ANGRY", ("Cough",), "woitn", "셋"),
    )


def test_no_tags():
    assert parse_rich_text("  just words  ") == (seg(text="just words"),)


def test_text_before_first_tag_is_its_own_segment():
    assert parse_rich_text("hello <|en|>world") == (seg(text="hello"), seg("en", text="world"))


def test_tag_after_text_starts_a_segment():
    assert parse_rich_text("<|en|>Hi<|HAPPY|>there") == (
        seg("en", text="Hi"),
        seg(emotion="HAPPY", text="there"),
    )


def test_filled_slot_starts_a_segment():
    assert parse_rich_text("<|en|><|HAPPY|><|SAD|>x") == (
        seg("en", "HAPPY"),
        seg(emotion="SAD", text="x"),
    )
    # a language tag after non-language tags joins them (the slot is still free)
    assert parse_rich_text("<|HAPPY|><|en|>x") == (seg("en", "HAPPY", text="x"),)


def test_unknown_tags_are_kept_as_events_and_never_drop_text():
    raw = "<|en|><|FOO|><|HAPPY|><|Speech|><|x-y.z|><|withitn|>kept"
    want = seg("en", "HAPPY", ("FOO", "Speech", "x-y.z"), "withitn", "kept")
    assert parse_rich_text(raw) == (want,)
    # case matters: the vocabulary is exact
    want = seg(events=("happy", "speech", "EN"), text="t")
    assert parse_rich_text("<|happy|><|speech|><|EN|>t") == (want,)


def test_tags_only():
    assert parse_rich_text("<|en|><|NEUTRAL|><|Speech|><|woitn|>") == (
        seg("en", "NEUTRAL", ("Speech",), "woitn", ""),
    )
    assert plain_text("<|en|><|NEUTRAL|><|Speech|><|woitn|>") == ""


@pytest.mark.parametrize("raw", ["", None, "   ", "\n\t\u3000"])
def test_empty_and_blank(raw):
    assert parse_rich_text(raw) == ()
    assert plain_text(raw) == ""


def test_text_with_angle_brackets_and_pipes():
    raw = "<|en|><|NEUTRAL|><|Speech|><|withitn|>a < b | c > d, x<|y, <||>, <| sp |>, |>end"
    (s,) = parse_rich_text(raw)
    assert s.text == "a < b | c > d, x<|y, <||>, <| sp |>, |>end"


def test_markup_inside_a_fake_tag_is_text():
    raw = "<|<img src=x onerror=alert(1)>|>"
    assert parse_rich_text(raw) == (seg(text=raw),)
    script = "<script>alert(1)</script>"
    assert parse_rich_text("<|en|>" + script) == (seg("en", text=script),)


def test_nested_bracket_finds_inner_tag():
    assert parse_rich_text("<<|en|>|x|>") == (seg(text="<"), seg("en", text="|x|>"))


def test_internal_whitespace_is_kept():
    (s,) = parse_rich_text("<|en|>  two  spaces\nand a newline  ")
    assert s.text == "two  spaces\nand a newline"


# ---- plain_text ----


def test_plain_text():
    assert plain_text("<|en|><|HAPPY|><|Laughter|><|withitn|>That was great.") == "That was great."
    raw = "<|en|><|NEUTRAL|><|Speech|><|withitn|>Hi. <|zh|><|SAD|><|BGM|><|woitn|> 你好 "
    assert plain_text(raw) == "Hi. 你好"
    assert plain_text("<|en|>a<|nospeech|><|zh|>b") == "a b"  # empty segments add no space
    assert plain_text("no tags at all") == "no tags at all"


# ---- to_transcript ----


def test_to_transcript_with_times():
    raw = "<|en|><|NEUTRAL|><|Speech|><|withitn|>Hi.<|zh|><|SAD|><|BGM|><|woitn|>你好"
    t = to_transcript(raw, [(0.0, 1.5), (1.5, 3)])
    assert isinstance(t, Transcript)
    assert t.raw_text == raw
    assert t.text == "Hi. 你好"
    assert [(s.start, s.end) for s in t.segments] == [(0.0, 1.5), (1.5, 3.0)]
    assert all(isinstance(s.end, float) for s in t.segments)
    assert t.segments[1] == seg("zh", "SAD", ("BGM",), "woitn", "你好", 1.5, 3.0)
    assert Transcript.from_dict(t.to_dict()) == t


def test_to_transcript_without_times():
    t = to_transcript("<|en|>x")
    assert t.segments == (seg("en", text="x"),)
    assert t == Transcript("x", "<|en|>x", (seg("en", text="x"),))


def test_to_transcript_empty():
    assert to_transcript("") == Transcript("", "", ())
    assert to_transcript(None) == Transcript("", "", ())
    assert to_transcript("", []) == Transcript("", "", ())


def test_to_transcript_times_mismatch_leaves_times_unset(caplog):
    with caplog.at_level(logging.WARNING, logger="sensevoice.richtext"):
        t = to_transcript("<|en|>a<|zh|>b", [(0.0, 1.0)])
    assert [s.text for s in t.segments] == ["a", "b"]
    assert all(s.start is None and s.end is None for s in t.segments)
    assert "1 time spans for 2" in caplog.text


# ---- robustness ----

_PIECES = [
    "<|", "|>", "<", ">", "|", "||", " ", "\n", "\t", "\u3000", "\x1c", "\x85", "\ufeff", "\x00",
    "a", "Hi.", "你好", "😊", "&amp;", '"', "'", "<|en|>", "<|zh|>", "<|HAPPY|>", "<|SAD|>",
    "<|EMO_OTHER|>", "<|Speech|>", "<|Laughter|>", "<|withitn|>", "<|woitn|>", "<|xyz|>",
    "<|constructor|>", "<|__proto__|>", "<|<img src=x onerror=alert(1)>|>", "<script>",
]  # fmt: skip


def random_rich(rng: random.Random) -> str:
    """A random string dense in tag fragments, real tags, odd whitespace and markup."""
    out = []
    for _ in range(rng.randrange(0, 30)):
        if rng.random() < 0.8:
            out.append(rng.choice(_PIECES))
        else:
            out.append(chr(rng.choice([rng.randrange(0x20, 0x7F), rng.randrange(0xA0, 0xD7FF)])))
    return "".join(out)


def _drop_ws(s: str) -> str:
    return "".join(c for c in s if c not in WHITESPACE)


def check_invariants(raw: str) -> None:
    segments = parse_rich_text(raw)
    for s in segments:
        assert s.language in LANGUAGES + ("",)
        assert s.emotion in EMOTIONS + ("",)
        assert s.itn in ITN_TAGS + ("",)
        assert all(TAG_RE.fullmatch(f"<|{e}|>") for e in s.events)
        assert s.text == s.text.strip(WHITESPACE)
        assert TAG_RE.search(s.text) is None
        assert s.language or s.emotion or s.itn or s.events or s.text  # never an empty segment
    # no non-tag text is lost, none is invented, order is kept
    assert _drop_ws(TAG_RE.sub("", raw)) == _drop_ws(plain_text(raw))
    assert to_transcript(raw).text == plain_text(raw)
    assert to_transcript(raw).raw_text == raw


def test_fuzz_random_strings():
    rng = random.Random(20240531)
    for _ in range(5000):
        check_invariants(random_rich(rng))


def test_fuzz_arbitrary_unicode():
    rng = random.Random(7)
    for _ in range(2000):
        raw = "".join(chr(rng.randrange(0, 0x10FFFF)) for _ in range(rng.randrange(0, 40)))
        check_invariants(raw)


def test_fuzz_hypothesis():
    hypothesis = pytest.importorskip("hypothesis", reason="hypothesis not installed")
    st = hypothesis.strategies
    piece = st.one_of(st.sampled_from(_PIECES), st.text(max_size=5))
    text = st.lists(piece, max_size=30).map("".join)

    @hypothesis.settings(max_examples=500, deadline=None)
    @hypothesis.given(text)
    def check(raw):
        check_invariants(raw)

    check()


def test_linear_time_on_long_inputs():
    t0 = time.perf_counter()
    (s,) = parse_rich_text("<|en|>" + "<|Speech|>" * 100_000 + "x")
    assert len(s.events) == 100_000
    assert len(parse_rich_text("<|en|>word " * 50_000)) == 50_000
    assert plain_text("<|" * 100_000 + "|>" * 100_000) != ""
    assert time.perf_counter() - t0 < 10.0


def test_to_json_is_to_dict_as_json():
    """The stored JSON of a transcript (orjson, straight from the dataclasses) reads back as
    to_dict and as the same transcript: words, speakers, times, text that is not ASCII."""
    from pipeline.domain.types import Word

    raw = "<|en|><|NEUTRAL|><|Speech|><|withitn|>Hi.<|zh|><|SAD|><|BGM|><|woitn|>你好"
    t = to_transcript(raw, [(0.0, 1.5), (1.5, 3)])
    s0 = replace(t.segments[0], speaker="left", words=(Word("Hi.", 0.1, 0.4),))
    t = replace(t, segments=(s0, t.segments[1]))
    text = t.to_json()
    assert "你好" in text  # not escaped
    assert json.loads(text) == json.loads(json.dumps(t.to_dict()))
    assert Transcript.from_dict(json.loads(text)) == t
