"""pipeline.domain.exports: every format parsed back by a small strict parser written here."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import re
import unicodedata

import pytest

from pipeline.domain.errors import InvalidOption
from pipeline.domain.exports import FORMATS, MEDIA_TYPES, ExportOptions, export, segment_spans
from pipeline.domain.richtext import to_transcript
from pipeline.domain.types import Segment, Transcript, Word

CLOCK = r"(\d{2,}):([0-5]\d):([0-5]\d)"  # HH:MM:SS, hours may pass 99
SRT_TIME = re.compile(rf"^{CLOCK},(\d{{3}}) --> {CLOCK},(\d{{3}})$")
VTT_TIME = re.compile(rf"^{CLOCK}\.(\d{{3}}) --> {CLOCK}\.(\d{{3}})$")
TXT_LINE = re.compile(r"^\[(\d{2,}:\d{2}:\d{2}\.\d{3}) - (\d{2,}:\d{2}:\d{2}\.\d{3})\] (.*)$")
VOICE = re.compile(r"^<v ([^<>&\n]*(?:&(?:amp|lt|gt);[^<>&\n]*)*)>(.*)</v>$")
CLASS_SPAN = re.compile(r"^<c((?:\.[A-Za-z0-9_-]+)+)>(.*)</c>$")
BARE_AMP = re.compile(r"&(?!amp;|lt;|gt;)")


# -- parsers ------------------------------------------------------------------------------------


def _seconds(h: str, m: str, s: str, ms: str) -> float:
    return int(h) * 3600 + int(m) * 60 + int(s) + int(ms) / 1000


def parse_srt(body: str) -> list[tuple[float, float, list[str]]]:
    """``[(start, end, lines)]``; fails on anything a strict SRT reader would reject."""
    assert "\r" not in body
    if not body:
        return []
    assert body.endswith("\n") and not body.endswith("\n\n\n")
    cues = []
    for n, block in enumerate(body.rstrip("\n").split("\n\n"), 1):
        lines = block.split("\n")
        assert lines[0] == str(n), block  # numbered from 1, in order
        m = SRT_TIME.match(lines[1])
        assert m, lines[1]
        text = lines[2:]
        assert text and all(line.strip() for line in text), block  # no blank line inside a cue
        assert not any("-->" in line for line in text)
        cues.append((_seconds(*m.groups()[:4]), _seconds(*m.groups()[4:]), text))
    return cues


def vtt_unescape(text: str) -> str:
    assert not BARE_AMP.search(text) and "<" not in text and ">" not in text, text
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def parse_vtt(body: str) -> list[tuple[float, float, list[tuple[str | None, str]]]]:
    """``[(start, end, [(speaker, text)])]``, entities decoded; a voice span around a line and a
    class span inside it are the only tags (the classes are dropped)."""
    assert "\r" not in body
    header, *blocks = body.rstrip("\n").split("\n\n")
    assert header == "WEBVTT"
    cues = []
    for block in blocks:
        lines = block.split("\n")
        m = VTT_TIME.match(lines[0])
        assert m, lines[0]
        out = []
        assert len(lines) > 1 and all(line.strip() for line in lines[1:]), block
        for line in lines[1:]:
            assert "-->" not in line
            v = VOICE.match(line)
            speaker, text = (vtt_unescape(v.group(1)), v.group(2)) if v else (None, line)
            c = CLASS_SPAN.match(text)
            out.append((speaker, vtt_unescape(c.group(2) if c else text)))
        cues.append((_seconds(*m.groups()[:4]), _seconds(*m.groups()[4:]), out))
    return cues


def check_timeline(cues: list) -> None:
    """Each cue has positive length; starts never go back; no cue overlaps the next."""
    for start, end, _ in cues:
        assert 0 <= start < end
    for a, b in itertools.pairwise(cues):
        assert a[0] <= b[0] and a[1] <= b[0], (a, b)


def body(transcript: Transcript, fmt: str, **kw) -> str:
    options = ExportOptions(**{k: v for k, v in kw.items() if k != "job_meta"})
    data, media = export(transcript, fmt, options, job_meta=kw.get("job_meta"))
    assert media == MEDIA_TYPES[fmt]
    return data.decode("utf-8")


# -- data ---------------------------------------------------------------------------------------


def seg(text, start=None, end=None, speaker=None, language="en", emotion="HAPPY",
        events=("Laughter",), itn="withitn") -> Segment:  # fmt: skip
    return Segment(language=language, emotion=emotion, events=tuple(events), itn=itn, text=text,
                   start=start, end=end, speaker=speaker)  # fmt: skip


CALL = Transcript(
    text="Hello there. Hi! How can I help?",
    raw_text="<|en|><|HAPPY|><|Laughter|><|withitn|>Hello there.<|en|><|NEUTRAL|><|Speech|>"
    "<|withitn|>Hi!<|en|><|SAD|><|Speech|><|withitn|>How can I help?",
    segments=(
        seg("Hello there.", 0.5, 2.25, speaker="agent"),
        seg("Hi!", 2.5, 3.0, speaker="caller", emotion="NEUTRAL", events=("Speech",)),
        seg("How can I help?", 62.5, 65.0, speaker="agent", emotion="SAD", events=("Speech",)),
    ),
)


# -- tests --------------------------------------------------------------------------------------


def test_formats_and_media_types():
    assert FORMATS == ("txt", "json", "srt", "vtt")
    for fmt in FORMATS:
        data, media = export(CALL, fmt)
        assert isinstance(data, bytes) and data.decode("utf-8")
        assert media == MEDIA_TYPES[fmt]
    assert MEDIA_TYPES["txt"] == "text/plain; charset=utf-8"
    assert MEDIA_TYPES["json"] == "application/json"
    assert MEDIA_TYPES["srt"].startswith("application/x-subrip")
    assert MEDIA_TYPES["vtt"].startswith("text/vtt")
    with pytest.raises(InvalidOption):
        export(CALL, "docx")


def test_srt_parses_back_with_speakers_and_tags_only_when_asked():
    cues = parse_srt(body(CALL, "srt"))
    check_timeline(cues)
    assert [(a, b) for a, b, _ in cues] == [(0.5, 2.25), (2.5, 3.0), (62.5, 65.0)]
    assert [t for _, _, t in cues] == [  # subtitles show no tags by default
        ["agent: Hello there."], ["caller: Hi!"], ["agent: How can I help?"]]
    assert "00:01:02,500 --> 00:01:05,000" in body(CALL, "srt")
    cues = parse_srt(body(CALL, "srt", tags=True))
    assert [(a, b) for a, b, _ in cues] == [(0.5, 2.25), (2.5, 3.0), (62.5, 65.0)]
    assert [t for _, _, t in cues] == [
        ["agent: [en] [HAPPY] [Laughter] Hello", "there."],  # 43 characters: two lines
        ["caller: [en] [NEUTRAL] [Speech] Hi!"],
        ["agent: [en] [SAD] [Speech] How can I help?"],
    ]


def test_vtt_parses_back_with_voice_spans():
    text = body(CALL, "vtt")
    assert text.startswith("WEBVTT\n\n")
    cues = parse_vtt(text)
    check_timeline(cues)
    assert [(a, b) for a, b, _ in cues] == [(0.5, 2.25), (2.5, 3.0), (62.5, 65.0)]
    assert [lines for _, _, lines in cues] == [
        [("agent", "Hello there.")], [("caller", "Hi!")], [("agent", "How can I help?")]]
    assert "00:01:02.500 --> 00:01:05.000" in text
    cues = parse_vtt(body(CALL, "vtt", tags=True))
    assert [lines for _, _, lines in cues] == [
        [("agent", "[en] [HAPPY] [Laughter] Hello"), ("agent", "there.")],  # one voice span a line
        [("caller", "[en] [NEUTRAL] [Speech] Hi!")],
        [("agent", "[en] [SAD] [Speech] How can I help?")],
    ]


def test_tags_as_vtt_classes():
    vtt = body(CALL, "vtt", tags=True, tag_style="class", hidden_tags=("Speech",))
    assert "<v agent><c.en.HAPPY.Laughter>Hello there.</c></v>" in vtt  # classes take no room
    assert "<v caller><c.en.NEUTRAL>Hi!</c></v>" in vtt and "[en]" not in vtt
    assert [lines for _, _, lines in parse_vtt(vtt)][0] == [("agent", "Hello there.")]
    srt = body(CALL, "srt", tags=True, tag_style="class")  # srt has no classes: no tags
    assert "[en]" not in srt and "agent: Hello there." in srt
    with pytest.raises(InvalidOption):
        ExportOptions(tag_style="bold")
    with pytest.raises(InvalidOption):
        ExportOptions(max_lines=0)


def test_txt_lines():
    lines = body(CALL, "txt").splitlines()
    assert len(lines) == len(CALL.segments)
    assert lines[2] == "[00:01:02.500 - 00:01:05.000] agent: [en] [SAD] [Speech] How can I help?"
    for line, s in zip(lines, CALL.segments):
        m = TXT_LINE.match(line)
        assert m and m.group(3).endswith(s.text)
    plain = body(CALL, "txt", tags=False, speaker=False).splitlines()
    assert plain[0] == "[00:00:00.500 - 00:00:02.250] Hello there."


def test_tags_and_speaker_options():
    for fmt in ("txt", "srt", "vtt"):
        out = body(CALL, fmt, tags=False)
        assert "[en]" not in out and "HAPPY" not in out and "Laughter" not in out
        out = body(CALL, fmt, speaker=False, tags=True)
        assert "agent" not in out and "caller" not in out and "<v " not in out
        assert "[en] [HAPPY] [Laughter] Hello there." in out
    assert "[en] [HAPPY] [Laughter] Hello there." in body(CALL, "txt")  # txt shows tags by default
    srt = parse_srt(body(CALL, "srt", tags=True, tag_format="({})",
                         hidden_tags=("Speech", "NEUTRAL")))
    assert srt[0][2] == ["agent: (en) (HAPPY) (Laughter) Hello", "there."]
    assert srt[1][2] == ["caller: (en) Hi!"]
    bare = seg("No tags.", 1.0, 2.0, language="", emotion="", events=())
    assert parse_srt(body(Transcript("No tags.", "No tags.", (bare,)), "srt", tags=True))[0][2] == [
        "No tags."]


NASTY = "<script>alert('x')</script> Tom & Jerry --> next\n\nline two\r\nthree\u2028four\tfive --->"
NASTY_LINE = "<script>alert('x')</script> Tom & Jerry -> next line two three four five ->"


def test_escaping_of_markup_arrows_and_newlines():
    t = Transcript(NASTY, NASTY, (seg(NASTY, 1.0, 4.0, speaker="a<b>&c\nd -->", events=()),))
    srt = body(t, "srt", tags=False)
    cues = parse_srt(srt)  # SRT is plain text: written as is (88 characters: two cues)
    check_timeline(cues)
    label = "a<b>&c d ->: "
    assert len(cues) == 2 and all(lines[0].startswith(label) for _, _, lines in cues)
    assert " ".join(" ".join(lines)[len(label):] for _, _, lines in cues) == NASTY_LINE
    vtt = body(t, "vtt", tags=False)
    assert "<script>" not in vtt and "&lt;script&gt;" in vtt and "Tom &amp; Jerry" in vtt
    lines = [line for _, _, cue in parse_vtt(vtt) for line in cue]
    assert {sp for sp, _ in lines} == {"a<b>&c d ->"}
    assert " ".join(text for _, text in lines) == NASTY_LINE
    txt = body(t, "txt", tags=False)
    assert txt.count("\n") == 1 and txt.endswith(f"a<b>&c d ->: {NASTY_LINE}\n")


def test_overlapping_and_unsorted_segments_become_a_clean_timeline():
    segs = (
        seg("left one", 0.0, 5.0, speaker="left"),
        seg("right one", 3.0, 7.0, speaker="right"),
        seg("right two", 6.0, 8.0, speaker="right"),
        seg("left two", 6.0, 9.0, speaker="left"),  # same start: joined under the previous cue
        seg("late", 20.0, 21.0, speaker="left"),
        seg("early", 1.0, 1.5, speaker="right"),  # out of order
    )
    t = Transcript("", "", segs)
    srt = parse_srt(body(t, "srt", tags=False))
    check_timeline(srt)
    assert [a for a, _, _ in srt] == [0.0, 1.0, 3.0, 6.0, 20.0]
    assert srt[3][2] == ["right: right two", "left: left two"]
    assert srt[0][1] == 1.0  # clipped to the next start
    vtt = parse_vtt(body(t, "vtt", tags=False))
    check_timeline(vtt)
    assert vtt[3][2] == [("right", "right two"), ("left", "left two")]
    every = [text for _, _, lines in vtt for _, text in lines]
    assert sorted(every) == sorted(s.text for s in segs)  # no text lost


def test_untimed_segments():
    one = Transcript("Hello.", "Hello.", (seg("Hello."),))
    cues = parse_srt(body(one, "srt", job_meta={"audio_seconds": 12.5}))
    # one segment spans the recording, but a subtitle cue lasts at most 7 s
    assert [(a, b) for a, b, _ in cues] == [(0.0, 7.0)]
    three = Transcript("", "", (seg("One."), seg("Two two."), seg("Three three three.")))
    cues = parse_srt(body(three, "srt", tags=False, job_meta={"audio_seconds": 9.0}))
    check_timeline(cues)
    assert cues[0][0] == 0.0 and cues[-1][1] == 9.0
    assert all(a[1] == b[0] for a, b in itertools.pairwise(cues))  # consecutive
    assert [t for _, _, t in cues] == [["One."], ["Two two."], ["Three three three."]]
    cues = parse_vtt(body(three, "vtt"))  # no duration known: estimated, still consecutive
    check_timeline(cues)
    assert cues[0][0] == 0.0 and all(b - a >= 1.0 for a, b, _ in cues)
    assert body(three, "txt", tags=False) == "One.\nTwo two.\nThree three three.\n"
    # a transcript with text but no segments still exports
    bare = Transcript("just text", "just text", ())
    assert parse_srt(body(bare, "srt"))[0][2] == ["just text"]
    assert body(bare, "txt") == "just text\n"


def test_empty_transcript_and_empty_segments():
    empty = Transcript("", "", ())
    assert body(empty, "srt") == ""
    assert body(empty, "vtt") == "WEBVTT\n"
    assert body(empty, "txt") == ""
    silent = Transcript("", "<|nospeech|><|EMO_UNKNOWN|><|Event_UNK|><|woitn|>",
                        (seg("", 0.0, 2.0, language="nospeech", emotion="EMO_UNKNOWN",
                             events=("Event_UNK",)),))  # fmt: skip
    tagged = parse_srt(body(silent, "srt", tags=True))
    assert tagged[0][2] == ["[nospeech] [EMO_UNKNOWN] [Event_UNK]"]
    assert body(silent, "srt") == ""  # nothing to show (no tags in subtitles by default): no cue
    assert body(silent, "srt", tags=True, tag_style="class") == ""  # classes alone show nothing
    assert parse_vtt(body(silent, "vtt", tags=False)) == []


def test_time_formatting_edges():
    t = Transcript("", "", (
        seg("tiny", 0.0004, 0.0006),  # rounds to one instant: gets 1 ms
        seg("backwards", 5.0, 4.0),  # end before start: 1 ms long
        seg("hours", 3725.5, 3726.0),
        seg("days", 100 * 3600 + 1.25, 100 * 3600 + 2.0),
    ))  # fmt: skip
    srt = body(t, "srt", tags=False)
    cues = parse_srt(srt)
    check_timeline(cues)
    assert cues[0][:2] == (0.0, 0.001) and cues[1][:2] == (5.0, 5.001)
    assert "01:02:05,500 --> 01:02:06,000" in srt and "100:00:01,250 --> 100:00:02,000" in srt
    assert "01:02:05.500 --> 01:02:06.000" in body(t, "vtt")


def test_json_round_trip():
    meta = {"id": "job-1", "audio_seconds": 65.0, "created_at": 1.5, "finished_at": None}
    unicode_call = dataclasses.replace(
        CALL, segments=(*CALL.segments, seg("你好，世界 😀", 66.0, 67.0, language="zh"))
    )
    data, media = export(unicode_call, "json", job_meta=meta)
    assert media == "application/json"
    assert "你好，世界 😀".encode() in data  # ensure_ascii off: UTF-8, not \\u escapes
    doc = json.loads(data)
    assert {k: doc[k] for k in meta} == meta
    assert Transcript.from_dict(doc["result"]) == unicode_call
    assert doc["result"] == json.loads(json.dumps(dataclasses.asdict(unicode_call)))
    # without job meta, and options do not change the JSON
    assert json.loads(export(CALL, "json", ExportOptions(tags=False))[0]) == {
        "result": json.loads(json.dumps(dataclasses.asdict(CALL)))
    }


def test_from_rich_text_end_to_end():
    raw = "<|en|><|HAPPY|><|Laughter|><|withitn|>Great!<|zh|><|NEUTRAL|><|BGM|><|woitn|>好的"
    t = to_transcript(raw, [(0.0, 1.5), (31.0, 33.5)])
    cues = parse_vtt(body(t, "vtt"))
    assert [(a, b) for a, b, _ in cues] == [(0.0, 1.5), (31.0, 33.5)]
    assert cues[1][2] == [(None, "好的")]
    assert parse_vtt(body(t, "vtt", tags=True))[1][2] == [(None, "[zh] [NEUTRAL] [BGM] 好的")]


@pytest.mark.parametrize("seed", range(25))
def test_random_transcripts_always_parse(seed):
    rng = random.Random(seed)
    alphabet = "ab <>&-\n\r\t>|\u2028é你😀"
    segs = []
    for _ in range(rng.randint(0, 12)):
        start = rng.uniform(0, 100) if rng.random() > 0.1 else None
        end = None if start is None else start + rng.uniform(-1, 10)
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 20)))
        speaker = rng.choice([None, "left", "right", "a<b&\n"])
        segs.append(seg(text, start, end, speaker=speaker))
    t = Transcript("", "", tuple(segs))
    for tags in (True, False):
        srt = parse_srt(body(t, "srt", tags=tags))
        vtt = parse_vtt(body(t, "vtt", tags=tags))
        check_timeline(srt)
        check_timeline(vtt)
        assert len(srt) == len(vtt)
        txt = body(t, "txt", tags=tags)
        assert txt.count("\n") <= len(segs) and "\r" not in txt
    assert Transcript.from_dict(json.loads(export(t, "json")[0])["result"]) == t


# -- subtitle rules -------------------------------------------------------------------------------

LONG_EN = (
    "Good morning, and thank you for calling the customer service line of the regional water "
    "company. My name is Sarah, and I will be helping you today with your account. Before we "
    "begin, could you please confirm your full name, the address of the property, and the "
    "account number printed at the top of your most recent bill? Thank you. I can see that your "
    "last payment was received on the fourteenth of March, and that the meter reading from the "
    "visit last week was considerably higher than usual, which is why this month's bill looks so "
    "much larger than the previous ones. Unusually high readings are often caused by a leaking "
    "toilet cistern or a dripping outside tap, so I would recommend checking both of those first."
)
LONG_ZH = (
    "您好，欢迎致电自来水公司客户服务热线，我是客服小王，很高兴为您服务。请问您是要查询账单还是办理业务？"
    "我看到您上个月的用水量比平时高了很多，这可能是因为家里的水管有轻微的漏水，或者马桶水箱一直在流水。"
    "建议您先关闭家里所有的水龙头，然后观察水表是否还在转动，如果水表还在转动，说明家里可能存在漏水的情况"
    "我们可以安排维修人员上门检查，请问您明天上午方便吗"
)


def engine_words(text: str, start: float, cjk: bool, pause_after: int = -1) -> tuple[Word, ...]:
    """Words as the engine times them: each word (or CJK character) and each punctuation mark
    its own Word, end to end at a speaking rate; a 2 s pause after word ``pause_after``."""
    pieces = re.findall(r"\S" if cjk else r"[\w']+|[^\w\s]", text)
    words, t = [], start
    for n, piece in enumerate(pieces):
        length = 0.22 if cjk else 0.05 + 0.055 * len(piece)
        words.append(Word(piece, round(t, 3), round(t + length, 3)))
        t += length + (2.0 if n == pause_after else 0.0)
    return tuple(words)


def line_fits(line: str, chars: int = 42, wide: int = 18) -> bool:
    """At most ``chars`` narrow characters a line, a wide (CJK) one counting chars / wide."""
    n_wide = sum(1 for ch in line if unicodedata.east_asian_width(ch) in "WF")
    return (len(line) - n_wide) * wide + n_wide * chars <= chars * wide


def check_subtitles(cues, text: str, cjk: bool = False, max_s: float = 7.0) -> None:
    """Every cue within the limits, in order, no overlaps, and the cues' text is the transcript's
    (never split inside a word: joined with single spaces, English text comes back exactly)."""
    check_timeline(cues)
    for start, end, lines in cues:
        assert 1 <= len(lines) <= 2, lines
        assert end - start <= max_s + 0.0005, (start, end)
        for line in lines:
            line = line[1] if isinstance(line, tuple) else line
            assert line_fits(line), (line, len(line))
    texts = [line[1] if isinstance(line, tuple) else line for _, _, ls in cues for line in ls]
    if cjk:
        assert "".join("".join(texts).split()) == "".join(text.split())
    else:
        assert " ".join(texts) == " ".join(text.split())


@pytest.mark.parametrize("text,cjk", [(LONG_EN, False), (LONG_ZH, True)], ids=["en", "zh"])
def test_long_segment_with_word_times_makes_subtitle_grade_cues(text, cjk):
    words = engine_words(text, 3.0, cjk, pause_after=len(engine_words(text, 0, cjk)) // 2)
    s = dataclasses.replace(seg(text, 3.0, words[-1].end), words=words, speaker=None)
    t = Transcript(text, text, (s,))
    srt, vtt = parse_srt(body(t, "srt")), parse_vtt(body(t, "vtt"))
    check_subtitles(srt, text, cjk)
    check_subtitles(vtt, text, cjk)
    assert [c[:2] for c in srt] == [c[:2] for c in vtt] and len(srt) >= 6
    starts = {round(w.start, 3) for w in words}
    ends = {round(w.end, 3) for w in words}
    for start, end, _ in srt:  # cues begin and end on word times
        assert start in starts and end in ends, (start, end)
    pause = next(w.end for a, b in itertools.pairwise(words) if b.start - a.end > 1.5 for w in (a,))
    assert any(b == pause for _, b, _ in srt)  # a pause ends a cue
    # cues end at punctuation where it can be had: most do here
    ending = [lines[-1][-1] for _, _, lines in srt]
    assert sum(ch in ".,?!。，？！" for ch in ending) >= 0.6 * len(ending), ending


@pytest.mark.parametrize("text,cjk", [(LONG_EN, False), (LONG_ZH, True)], ids=["en", "zh"])
def test_long_segment_without_word_times_is_shared_by_characters(text, cjk):
    t = Transcript(text, text, (seg(text, 40.0, 70.0),))  # a 30 s VAD piece
    cues = parse_srt(body(t, "srt"))
    check_subtitles(cues, text, cjk)
    assert cues[0][0] == 40.0 and cues[-1][1] <= 70.0 and len(cues) >= 5
    # tags and speaker labels count in the line width too
    tagged = dataclasses.replace(t, segments=(dataclasses.replace(t.segments[0], speaker="agent"),))
    cues = parse_srt(body(tagged, "srt", tags=True))
    check_timeline(cues)
    assert all(lines[0].startswith("agent: [en] [HAPPY] [Laughter] ") for _, _, lines in cues)
    assert all(line_fits(line) and len(lines) <= 2 for _, _, lines in cues for line in lines)


def test_segments_of_one_piece_share_its_span_instead_of_overlapping():
    """A VAD piece whose output holds several rich-text segments gives each the piece's span (the
    worker's assembly); their cues must follow one another, timed by the words on the first."""
    parts = ["Hello there, how are you doing today?", "我很好，谢谢你的关心。", "Great to hear that."]
    raw_words = engine_words(" ".join(parts[:1]), 10.0, False) + engine_words(parts[1], 13.0, True)
    raw_words += engine_words(parts[2], 16.0, False)
    segs = (dataclasses.replace(seg(parts[0], 10.0, 20.0), words=raw_words),
            seg(parts[1], 10.0, 20.0, language="zh", emotion="NEUTRAL"),
            seg(parts[2], 10.0, 20.0, emotion="NEUTRAL"))
    t = Transcript(" ".join(parts), "", segs)
    cues = parse_srt(body(t, "srt"))
    check_timeline(cues)
    assert [" ".join(lines) for _, _, lines in cues] == parts  # one cue each, none joined
    assert cues[1][0] == 13.0 and cues[2][0] == 16.0  # from the words
    untimed = dataclasses.replace(t, segments=tuple(dataclasses.replace(s, words=()) for s in segs))
    cues = parse_srt(body(untimed, "srt"))
    check_timeline(cues)
    assert [" ".join(lines) for _, _, lines in cues] == parts
    assert cues[0][0] == 10.0 and cues[-1][1] == 20.0  # shared by characters
    spans = segment_spans(untimed)
    assert spans[0][0] == 10.0 and spans[-1][1] == 20.0
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))


def test_cjk_lines_and_korean_words():
    zh = "这是一个非常长的句子没有任何标点符号需要在合适的地方断开才能放进两行字幕里面去"
    cues = parse_srt(body(Transcript(zh, zh, (seg(zh, 0.0, 6.0),)), "srt"))
    check_subtitles(cues, zh, cjk=True)
    assert max(len(line) for _, _, lines in cues for line in lines) <= 18
    assert len(cues) == 2  # 40 characters: more than 2 lines of 18
    ko = "안녕하세요 고객님 무엇을 도와드릴까요 오늘 요금 청구서에 대해서 문의하실 내용이 있으신가요"
    cues = parse_srt(body(Transcript(ko, ko, (seg(ko, 0.0, 6.0),)), "srt"))
    check_subtitles(cues, ko)  # Hangul is wide, but words break at spaces only


def test_limits_are_options_and_a_word_wider_than_a_line_stands_alone():
    url = "https://example.com/" + "a" * 60
    text = f"Please open {url} now."
    cues = parse_srt(body(Transcript(text, text, (seg(text, 0.0, 4.0),)), "srt"))
    check_timeline(cues)
    assert [line for _, _, lines in cues for line in lines].count(url) == 1  # never split
    t = Transcript(LONG_EN, LONG_EN, (seg(LONG_EN, 0.0, 60.0),))
    cues = parse_srt(body(t, "srt", max_line_chars=32, max_lines=1, max_cue_s=3.0))
    assert all(len(lines) == 1 and len(lines[0]) <= 32 and b - a <= 3.0005 for a, b, lines in cues)
    one = Transcript("Hi.", "Hi.", (seg("Hi.", 0.0, 30.0),))
    assert [c[:2] for c in parse_srt(body(one, "srt"))] == [(0.0, 7.0)]  # at most 7 s


def test_segment_spans_shortcut_gives_what_the_timeline_gives():
    """segment_spans answers a transcript whose segments are all timed, none sharing a piece,
    without the text units (the worker summarises every finished job with it): the same spans
    as the full timeline, on random transcripts of every kind (shared pieces, speakers, untimed)."""
    from pipeline.domain.exports import _items, _timeline

    rng = random.Random(7)
    for _ in range(300):
        segs, t = [], 0.0
        for _k in range(rng.randint(1, 6)):
            a = round(t + rng.random(), 3)
            b = round(a + rng.random() * 3, 3)
            same = segs and rng.random() < 0.3  # another segment of the previous piece
            s = seg("word " * rng.randint(0, 4), *(segs[-1].start, segs[-1].end) if same else (a, b))
            if rng.random() < 0.2:
                s = dataclasses.replace(s, speaker=rng.choice(["A", "B"]))
            if rng.random() < 0.05:
                s = dataclasses.replace(s, end=None)
            segs.append(s)
            t = b
        tr = Transcript("", "", tuple(segs))
        full = [(round(a, 3), round(max(a, b), 3)) for _, (a, b) in
                _timeline(_items(tr.segments, ExportOptions(tags=False, speaker=True)), 30.0)]
        assert segment_spans(tr, 30.0) == full
