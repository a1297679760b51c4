"""pipeline.domain.exports: every format parsed back by a small strict parser written here."""

from __future__ import annotations

import dataclasses
import itertools
import json
import random
import re

import pytest

from pipeline.domain.errors import InvalidOption
from pipeline.domain.exports import FORMATS, MEDIA_TYPES, ExportOptions, export
from pipeline.domain.richtext import to_transcript
from pipeline.domain.types import Segment, Transcript

CLOCK = r"(\d{2,}):([0-5]\d):([0-5]\d)"  # HH:MM:SS, hours may pass 99
SRT_TIME = re.compile(rf"^{CLOCK},(\d{{3}}) --> {CLOCK},(\d{{3}})$")
VTT_TIME = re.compile(rf"^{CLOCK}\.(\d{{3}}) --> {CLOCK}\.(\d{{3}})$")
TXT_LINE = re.compile(r"^\[(\d{2,}:\d{2}:\d{2}\.\d{3}) - (\d{2,}:\d{2}:\d{2}\.\d{3})\] (.*)$")
VOICE = re.compile(r"^<v ([^<>&\n]*(?:&(?:amp|lt|gt);[^<>&\n]*)*)>(.*)</v>$")
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
    """``[(start, end, [(speaker, text)])]``, entities decoded; voice spans are the only tags."""
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
            out.append((vtt_unescape(v.group(1)), vtt_unescape(v.group(2))) if v
                       else (None, vtt_unescape(line)))  # fmt: skip
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


def test_srt_parses_back_with_tags_and_speakers():
    cues = parse_srt(body(CALL, "srt"))
    check_timeline(cues)
    assert [(a, b) for a, b, _ in cues] == [(0.5, 2.25), (2.5, 3.0), (62.5, 65.0)]
    assert [t for _, _, t in cues] == [
        ["agent: [en] [HAPPY] [Laughter] Hello there."],
        ["caller: [en] [NEUTRAL] [Speech] Hi!"],
        ["agent: [en] [SAD] [Speech] How can I help?"],
    ]
    assert "00:01:02,500 --> 00:01:05,000" in body(CALL, "srt")


def test_vtt_parses_back_with_voice_spans():
    text = body(CALL, "vtt")
    assert text.startswith("WEBVTT\n\n")
    cues = parse_vtt(text)
    check_timeline(cues)
    assert [(a, b) for a, b, _ in cues] == [(0.5, 2.25), (2.5, 3.0), (62.5, 65.0)]
    assert [lines for _, _, lines in cues] == [
        [("agent", "[en] [HAPPY] [Laughter] Hello there.")],
        [("caller", "[en] [NEUTRAL] [Speech] Hi!")],
        [("agent", "[en] [SAD] [Speech] How can I help?")],
    ]
    assert "00:01:02.500 --> 00:01:05.000" in text


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
        out = body(CALL, fmt, speaker=False)
        assert "agent" not in out and "caller" not in out and "<v " not in out
        assert "[en] [HAPPY] [Laughter] Hello there." in out
    srt = parse_srt(body(CALL, "srt", tag_format="({})", hidden_tags=("Speech", "NEUTRAL")))
    assert srt[0][2] == ["agent: (en) (HAPPY) (Laughter) Hello there."]
    assert srt[1][2] == ["caller: (en) Hi!"]
    bare = seg("No tags.", 1.0, 2.0, language="", emotion="", events=())
    assert parse_srt(body(Transcript("No tags.", "No tags.", (bare,)), "srt"))[0][2] == ["No tags."]


NASTY = "<script>alert('x')</script> Tom & Jerry --> next\n\nline two\r\nthree\u2028four\tfive --->"
NASTY_LINE = "<script>alert('x')</script> Tom & Jerry -> next line two three four five ->"


def test_escaping_of_markup_arrows_and_newlines():
    t = Transcript(NASTY, NASTY, (seg(NASTY, 1.0, 4.0, speaker="a<b>&c\nd -->", events=()),))
    srt = body(t, "srt", tags=False)
    cues = parse_srt(srt)
    assert cues[0][2] == [f"a<b>&c d ->: {NASTY_LINE}"]  # SRT is plain text: written as is
    vtt = body(t, "vtt", tags=False)
    assert "<script>" not in vtt and "&lt;script&gt;" in vtt and "Tom &amp; Jerry" in vtt
    assert parse_vtt(vtt)[0][2] == [("a<b>&c d ->", NASTY_LINE)]
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
    assert [(a, b) for a, b, _ in cues] == [(0.0, 12.5)]  # one segment spans the recording
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
    assert parse_srt(body(silent, "srt"))[0][2] == ["[nospeech] [EMO_UNKNOWN] [Event_UNK]"]
    assert body(silent, "srt", tags=False) == ""  # nothing to show: no cue
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
    assert cues[1][2] == [(None, "[zh] [NEUTRAL] [BGM] 好的")]


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
