"""pipeline/domain/redaction.py: the detectors on a fixture set of Chinese and English transcripts
with planted card, phone, e-mail and ID numbers (written and spoken) beside ordinary numbers (dates,
prices, times, quantities), the words and times of masked items, and the option's parsing.

``python -m tests.test_redaction`` prints the fixture figures (docs/BENCHMARKS.md)."""

from __future__ import annotations

import pytest

from pipeline.domain.errors import InvalidOption
from pipeline.domain.redaction import (
    KINDS,
    MASK_RE,
    Redaction,
    find_spans,
    luhn_ok,
    parse_redact,
    parse_redact_audio,
    redact_rich,
    redact_text,
    redact_across,
    redact_transcript,
    redactions_of,
    resident_id_ok,
)
from pipeline.domain.types import Segment, Transcript, Word
from pipeline.serving.records import transcript_from_pieces
from pipeline.serving.records import SegmentResult

VISA, MASTER, AMEX = "4111111111111111", "5500000000000004", "378282246310005"
ID_X, ID_4, ID_14 = "11010519491231002X", "320106199003071234", "440524188001010014"

# (transcript text, the kinds planted in it in order, ordinary numbers that must stay as they are)
PLANTED: list[tuple[str, list[str], list[str]]] = [
    # English, written (the model's ITN output)
    ("My card number is 4111 1111 1111 1111 and it expires on 2027-08-31.", ["card"],
     ["2027-08-31"]),
    ("Please charge 5500-0000-0000-0004 for $1,299.99.", ["card"], ["$1,299.99"]),
    ("The Amex is 3782 822463 10005, thanks.", ["card"], []),
    ("You can reach me at (415) 555-2671 after 6:30 pm.", ["phone"], ["6:30"]),
    ("My phone is 415-555-2671 and my order was 3 boxes.", ["phone"], ["3 boxes"]),
    ("Call +44 20 7946 0958 tomorrow.", ["phone"], []),
    ("Send it to john.smith@example.com by March 15, 2024.", ["email"], ["15, 2024"]),
    ("My account number is 0012 3456 7890 12 for the 250 dollar refund.", ["digits"],
     ["250 dollar"]),
    # English, spoken (no ITN, or the model kept the words)
    ("my card is four one one one one one one one one one one one one one one one", ["card"], []),
    ("Four one one one, one one one one, one one one one, one one one one.", ["card"], []),
    ("the number is four one five five five five two six seven one", ["phone"], []),
    ("it's oh four one five, double five five, two six seven one", ["phone"], []),
    ("email me at john dot smith at gmail dot com before nine", ["email"], ["nine"]),
    ("my address is j o h n at example dot org", ["email"], []),
    ("the reference is one two three four five six seven eight nine", ["digits"], []),
    # Chinese, written
    ("我的卡号是4111111111111111，有效期到2027年8月。", ["card"], ["2027年8月"]),
    ("我的手机号是13800138000，下午3点给我打电话。", ["phone"], ["3点"]),
    ("座机号码是010-62345678，价格是128元。", ["phone"], ["128元"]),
    ("请拨打+86 138 0013 8000联系我。", ["phone"], []),
    ("身份证号码是11010519491231002X，今年35岁。", ["id"], ["35岁"]),
    ("身份证是320106199003071234。", ["id"], []),
    ("邮箱是zhangsan@qq.com，订单金额是3,200元。", ["email"], ["3,200元"]),
    # Chinese, spoken (幺 for one, digits read one by one)
    ("我的手机是幺三八零零幺三八零零零", ["phone"], []),
    ("电话幺三八，零零幺三，八零零零，谢谢", ["phone"], []),
    ("卡号是四幺幺幺幺幺幺幺幺幺幺幺幺幺幺幺", ["card"], []),
    ("身份证号四四零五二四幺八八零零幺零幺零零幺四", ["id"], []),
    ("身份证号幺幺零幺零五幺九四九幺二三幺零零二叉", ["id"], []),
    ("邮箱是li dot ming艾特163点com", ["email"], []),
    # several in one transcript
    ("Card 4111 1111 1111 1111, phone 13800138000, email a.b@c.com, ID 440524188001010014.",
     ["card", "phone", "email", "id"], []),
    ("卡号5500000000000004，手机幺三九幺二三四五六七八，邮箱wang@163.com", ["card", "phone", "email"],
     []),
]

ORDINARY: list[str] = [
    "The meeting is on 2024-03-15 at 10:30 and lasts 90 minutes.",
    "It costs $1,299.99, or 12,500 yuan, for 3 boxes.",
    "We shipped 1,250,000 units in 2023 and 2024, up 12.5 percent.",
    "From 2019-2024 the price rose from 3.50 to 4.20.",
    "Room 1204, floor 12, call back at 5 pm.",
    "one of them said no one would come at one or two",
    "I'll be there in five minutes, maybe ten, at half past three.",
    "二零二四年三月十五日下午三点半开会。",
    "这个三百五十块钱，那个一千二百元。",
    "一共三个人，第一个是张三，第二个是李四。",
    "订单12月3日发货，共5件，总价1,280.50元。",
    "他今年35岁，住在3栋1204室。",
    "会议在2024/03/15举行，持续2小时。",
    "The score was 3 to 1 and then 21-19.",
    "Look at this, dot the i's, one at a time.",
    "Version 3.11.4 was released on 12/05/2023.",
]


def _masks(text: str) -> list[str]:
    return [m.group()[1:-1].lower() for m in MASK_RE.finditer(text)]


def fixture_figures() -> dict[str, int]:
    """Planted items masked (with the right kind), false masks on the ordinary numbers."""
    planted = masked = wrong_kind = kept = ordinary = false = 0
    for text, kinds, keep in PLANTED:
        out, _ = redact_text(text, KINDS)
        found = _masks(out)
        planted += len(kinds)
        masked += min(len(found), len(kinds))
        wrong_kind += sum(1 for a, b in zip(found, kinds) if a != b) + abs(len(found) - len(kinds))
        kept += sum(1 for k in keep if k in out)
        ordinary += len(keep)
    for text in ORDINARY:
        out, _ = redact_text(text, KINDS)
        false += len(_masks(out))
    return {"planted": planted, "masked": masked, "wrong_kind": wrong_kind,
            "ordinary_kept": kept, "ordinary_planted_beside": ordinary,
            "ordinary_sentences": len(ORDINARY), "false_masks": false}


@pytest.mark.parametrize("text, kinds, keep", PLANTED)
def test_every_planted_item_is_masked_with_its_kind(text, kinds, keep):
    out, spans = redact_text(text, KINDS)
    assert _masks(out) == kinds, out
    assert [s.kind for s in spans] == kinds
    for k in keep:
        assert k in out, (k, out)
    for value in (VISA, MASTER, AMEX, ID_X, ID_4, ID_14, "13800138000", "2671", "smith", "zhangsan"):
        assert value not in out.replace(" ", "").replace("-", "")


@pytest.mark.parametrize("text", ORDINARY)
def test_ordinary_numbers_are_never_masked(text):
    assert redact_text(text, KINDS) == (text, [])


def test_fixture_figures():
    f = fixture_figures()
    assert f["masked"] == f["planted"] >= 30 and f["wrong_kind"] == 0
    assert f["false_masks"] == 0 and f["ordinary_kept"] == f["ordinary_planted_beside"]


def test_luhn_and_resident_id_checks():
    assert luhn_ok(VISA) and luhn_ok(MASTER) and luhn_ok(AMEX)
    assert not luhn_ok("4111111111111112")
    assert resident_id_ok(ID_X) and resident_id_ok(ID_4) and resident_id_ok(ID_14)
    assert not resident_id_ok("110105194912310021")  # the check character is X
    assert not resident_id_ok("110105194913310020")  # month 13


def test_a_card_failing_luhn_is_digits_not_card():
    out, _ = redact_text("card 4111 1111 1111 1112 please", KINDS)
    assert out == "card [DIGITS] please"
    assert redact_text("card 4111 1111 1111 1112 please", ("card",)) == (
        "card 4111 1111 1111 1112 please", [])


def test_only_the_kinds_asked_for():
    text = "card 4111111111111111, phone 13800138000, mail a@b.com"
    assert redact_text(text, ("phone",))[0] == "card 4111111111111111, phone [PHONE], mail a@b.com"
    assert redact_text(text, ("email", "card"))[0] == "card [CARD], phone 13800138000, mail [EMAIL]"
    # digits alone masks every long run, whatever it is
    assert redact_text(text, ("digits",))[0] == "card [DIGITS], phone [DIGITS], mail a@b.com"
    assert redact_text(text, ())[0] == text


def test_a_run_holding_a_phone_then_a_card_is_split():
    out, _ = redact_text("13800138000 4111 1111 1111 1111", KINDS)
    assert out == "[PHONE] [CARD]"


def test_parse_redact():
    assert parse_redact("pii") == KINDS
    assert parse_redact(" Phone , card,phone") == ("card", "phone")
    assert parse_redact(["email"]) == ("email",)
    assert parse_redact("") == parse_redact(None) == parse_redact("none") == ()
    with pytest.raises(InvalidOption, match="unknown redact kind 'ssn'"):
        parse_redact("card,ssn")
    with pytest.raises(InvalidOption):
        parse_redact(5)
    assert parse_redact_audio("Beep") == "beep" and parse_redact_audio("") == ""
    with pytest.raises(InvalidOption, match="redact_audio"):
        parse_redact_audio("scramble")


def _en_words():
    # as the engine makes them: SentencePiece pieces, digits and punctuation words of their own
    texts = ["My", "card", "is", "4", "111", "1", "111", "1", "111", "1", "111", "and", "me", "at",
             "a", "b", "@", "c", ".", "com", "."]
    return [Word(t, round(1 + 0.3 * i, 3), round(1.25 + 0.3 * i, 3), 0.9) for i, t in enumerate(texts)]


def test_words_and_times_of_a_masked_item():
    raw = "<|en|><|NEUTRAL|><|Speech|><|withitn|>My card is 4111 1111 1111 1111 and me at ab@c.com."
    r = redact_rich(raw, _en_words(), KINDS, span=(1.0, 9.0))
    assert r.raw_text == "<|en|><|NEUTRAL|><|Speech|><|withitn|>My card is [CARD] and me at [EMAIL]."
    assert [w.text for w in r.words] == ["My", "card", "is", "[CARD]", "and", "me", "at",
                                         "[EMAIL]", "."]
    card = r.words[3]
    assert (card.start, card.end) == (1.9, 4.25)  # the first digit's start, the last one's end
    assert r.redactions == (Redaction("card", 1.9, 4.25), Redaction("email", 5.2, 6.95))


def test_without_words_the_piece_span_is_the_time():
    r = redact_rich("<|zh|><|NEUTRAL|><|Speech|><|woitn|>电话幺三八零零幺三八零零零", (), ("phone",),
                    span=(12.0, 15.5))
    assert r.raw_text.endswith("电话[PHONE]") and r.redactions == (Redaction("phone", 12.0, 15.5),)


def test_each_text_part_of_rich_text_and_tags_untouched():
    raw = ("<|en|><|NEUTRAL|><|Speech|><|withitn|>Card 4111 1111 1111 1111."
           "<|zh|><|HAPPY|><|Speech|><|withitn|>手机13800138000。")
    words = [Word(t, float(i), float(i) + 0.5) for i, t in enumerate(
        ["Card", "4111", "1111", "1111", "1111", ".", "手", "机", "138", "0013", "8000", "。"])]
    r = redact_rich(raw, words, KINDS, span=(0.0, 12.0))
    assert r.raw_text == ("<|en|><|NEUTRAL|><|Speech|><|withitn|>Card [CARD]."
                          "<|zh|><|HAPPY|><|Speech|><|withitn|>手机[PHONE]。")
    assert [w.text for w in r.words] == ["Card", "[CARD]", ".", "手", "机", "[PHONE]", "。"]
    # through the worker's transcript builder and back to the per-job list
    piece = SegmentResult("j", 0, 0.0, 12.0, None, r.raw_text, r.words)
    t = transcript_from_pieces([piece])
    assert t.text == "Card [CARD]. 手机[PHONE]。"
    assert redactions_of(t) == [Redaction("card", 1.0, 4.5), Redaction("phone", 8.0, 10.5)]


def test_redactions_of_without_words_uses_segment_times():
    t = Transcript(text="x", raw_text="x", segments=(
        Segment("en", "NEUTRAL", ("Speech",), "withitn", "call [PHONE] or [EMAIL]", 3.0, 7.0),
        Segment("en", "NEUTRAL", ("Speech",), "withitn", "nothing", 7.0, 9.0)))
    assert redactions_of(t) == [Redaction("phone", 3.0, 7.0), Redaction("email", 3.0, 7.0)]
    assert [r.to_dict()["kind"] for r in redactions_of(t)] == ["phone", "email"]


def test_redact_transcript_masks_text_words_and_raw_text():
    seg = Segment("en", "NEUTRAL", ("Speech",), "withitn", "my card is 4111 1111 1111 1111",
                  0.0, 5.0, words=tuple(Word(t, i * 0.5, i * 0.5 + 0.4) for i, t in enumerate(
                      ["my", "card", "is", "4111", "1111", "1111", "1111"])))
    t = Transcript(text=seg.text, raw_text="<|en|><|NEUTRAL|><|Speech|><|withitn|>" + seg.text,
                   segments=(seg,))
    out = redact_transcript(t, KINDS)
    assert out.text == "my card is [CARD]" and VISA[:4] not in out.raw_text
    assert [w.text for w in out.segments[0].words] == ["my", "card", "is", "[CARD]"]
    assert redact_transcript(t, ()) is t


def test_hostile_text_never_raises():
    for text in ("", "\x00" * 50, "@" * 1000, "1" * 5000, "at dot " * 500, "一" * 3000, "X" * 100,
                 "<|zh|>" * 100, "+" + "(1) " * 400, "1 " * 3000, "幺 " * 3000, "a-" * 5000 + "@"):
        redact_text(text, KINDS)
        redact_rich(text, [Word("1", 0.0, 1.0)], KINDS)
    assert find_spans("1" * 5000, KINDS)[0].kind == "digits"



def test_the_option_is_validated_and_stored_with_the_job():
    from pipeline.domain.types import TranscribeOptions
    from pipeline.serving.records import dump_options, load_options

    assert TranscribeOptions(redact="pii").redact == KINDS
    assert TranscribeOptions(redact="phone, card") == TranscribeOptions(redact=("card", "phone"))
    assert TranscribeOptions(redact="").redact == TranscribeOptions(redact=None).redact == ()
    with pytest.raises(InvalidOption, match="unknown redact kind 'ssn'"):
        TranscribeOptions(redact="card,ssn")
    o = TranscribeOptions(redact="email,id", languages="zh,en")
    assert load_options(dump_options(o)) == o
    assert "redact" not in dump_options(TranscribeOptions())  # rows of before read as they did
    o = TranscribeOptions(redact_audio="Beep")  # alone: every kind
    assert (o.redact, o.redact_audio) == (KINDS, "beep") and load_options(dump_options(o)) == o
    assert o.word_timestamps  # (the spans to mask are the words' times)
    assert TranscribeOptions(redact="card", redact_audio="silence").redact == ("card",)
    with pytest.raises(InvalidOption, match="unknown redact_audio 'scramble'"):
        TranscribeOptions(redact_audio="scramble")


def test_a_live_partial_masks_digit_runs_that_may_still_be_growing():
    partial = "<|en|><|NEUTRAL|><|Speech|><|withitn|>my card is 4111 11"
    assert redact_rich(partial, (), KINDS).raw_text == partial  # (not yet a card)
    assert redact_rich(partial, (), KINDS, eager=True).raw_text.endswith("my card is [DIGITS]")
    assert redact_rich(partial, (), ("email",), eager=True).raw_text == partial  # no digit kind asked
    short = "<|en|><|NEUTRAL|><|Speech|><|withitn|>at 5 pm, 3 boxes"
    assert redact_rich(short, (), KINDS, eager=True).raw_text == short




def _seg(text, start, speaker=None, words=()):
    return Segment("en", "NEUTRAL", ("Speech",), "withitn", text, start, start + 2.0, speaker, words)


def test_an_item_said_across_two_segments_is_masked_in_both():
    head = "<|en|><|NEUTRAL|><|Speech|><|withitn|>"
    words = (Word("my", 10.0, 10.2), Word("number", 10.3, 10.6), Word("is", 10.7, 10.8),
             Word("one", 11.0, 11.2), Word("three", 11.3, 11.5), Word("eight", 11.6, 11.9))
    segs = (_seg("my number is one three eight", 10.0, "left", words),
            _seg("hello there", 11.0, "right"),
            _seg("zero zero one three, eight zero zero zero", 12.0, "left"),
            _seg("thanks, 2024 was good", 14.0, "left"))
    t = Transcript(text="", raw_text="".join(head + s.text for s in segs), segments=segs)
    out = redact_across(t, KINDS)
    assert [s.text for s in out.segments] == ["my number is [PHONE]", "hello there", "[PHONE]",
                                              "thanks, 2024 was good"]
    assert [w.text for w in out.segments[0].words] == ["my", "number", "is", "[PHONE]"]
    assert (out.segments[0].words[-1].start, out.segments[0].words[-1].end) == (11.0, 11.9)
    assert "three eight" not in out.raw_text and "zero zero" not in out.raw_text
    assert out.raw_text.count("[PHONE]") == 2 and "2024 was good" in out.raw_text
    # an item within one segment (the piece's own pass) and other speakers: untouched here
    assert redact_across(Transcript("", "", segs[1:2] + segs[3:]), KINDS).segments == segs[1:2] + segs[3:]



if __name__ == "__main__":
    print(fixture_figures())
