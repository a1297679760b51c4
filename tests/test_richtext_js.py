"""static/richtext.js in a real headless Chromium (Debian's /usr/bin/chromium via Playwright)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from pipeline.domain.richtext import WHITESPACE, parse_rich_text
from pipeline.domain.tags import EMOTIONS, EVENTS, ITN_TAGS, LANGUAGES
from pipeline.web.vocab import vocab_script

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
JS = (ROOT / "static" / "richtext.js").read_text(encoding="utf-8")
CSS = (ROOT / "static" / "style.css").read_text(encoding="utf-8")
PAGE = (
    f"<html><head><style>{CSS}</style>{vocab_script()}<script>{JS}</script></head>"
    "<body><div id=out></div></body></html>"
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"{CHROMIUM} missing: apt-get install -y chromium to run the browser tests",
    ),
]

README = "<|en|><|HAPPY|><|Laughter|><|withitn|>That was great."
TWO = "<|en|><|NEUTRAL|><|Speech|><|withitn|>Hi.<|zh|><|SAD|><|BGM|><|woitn|>你好"

EMOJI = {
    "HAPPY": "😊", "SAD": "😔", "ANGRY": "😡", "NEUTRAL": "😐", "FEARFUL": "😰",
    "DISGUSTED": "🤢", "SURPRISED": "😮", "EMO_UNKNOWN": "❓",
    "BGM": "🎼", "Speech": "🗣️", "Applause": "👏", "Laughter": "😀", "Cry": "😭",
    "Sneeze": "🤧", "Breath": "😮‍💨", "Cough": "😷", "Sing": "🎤",
}  # fmt: skip


@pytest.fixture(scope="module")
def _tab(browser):
    pg = browser.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    pg.close()


@pytest.fixture
def page(_tab):
    """A fresh document (and window: about:blank first, so no stub or global survives) per test."""
    _tab.goto("about:blank")
    _tab.set_content(PAGE)
    _tab.errors.clear()
    yield _tab
    assert _tab.errors == [], f"uncaught page errors: {_tab.errors}"


def render(page, raw, opts=None):
    page.evaluate(
        "([raw, opts]) => {"
        " window.SenseVoiceRich.render(document.getElementById('out'), raw, opts); }",
        [raw, opts],
    )


def texts(page, selector):
    return page.locator(selector).all_text_contents()


# ---- the source itself ----


def test_source_is_safe_to_inline_and_builds_no_markup():
    assert JS.isascii(), "keep richtext.js ASCII (emoji as \\u escapes)"
    assert "</script" not in JS.lower()
    sinks = ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(")
    for sink in sinks:
        assert sink not in JS, sink


# ---- the one table ----


def test_tags_table(page):
    tags = page.evaluate("window.SenseVoiceRich.TAGS")
    assert set(tags["language"]) == set(LANGUAGES)
    assert set(tags["emotion"]) == set(EMOTIONS)
    assert set(tags["event"]) == set(EVENTS)
    assert set(tags["itn"]) == set(ITN_TAGS)
    # languages by the names their speakers use (issue 11), the English name in the title
    assert {k: v["name"] for k, v in tags["language"].items()} == {
        "zh": "中文", "en": "English", "yue": "粵語", "ja": "日本語", "ko": "한국어",
        "nospeech": "No speech"}
    assert tags["language"]["zh"]["title"] == "Language: Chinese"
    for name, emoji in EMOJI.items():
        kind = "emotion" if name in EMOTIONS else "event"
        assert tags[kind][name]["emoji"] == emoji, name
    event_emoji = [tags["event"][e]["emoji"] for e in EVENTS]
    assert len(set(event_emoji)) == len(event_emoji), "one emoji per event (Cough != Sneeze)"
    for kind in ("language", "emotion", "event", "itn"):
        classes = [entry["cls"] for entry in tags[kind].values()]
        assert len(set(classes)) == len(classes)
        assert all(re.fullmatch(r"sv-[a-z0-9-]+", c) for c in classes)
    for kind in ("language", "emotion", "event"):
        colors = [e["color"] for e in tags[kind].values()]
        assert all(re.fullmatch(r"\d{1,3} \d{1,3} \d{1,3}", c) for c in colors)
    assert page.evaluate("Object.isFrozen(window.SenseVoiceRich.TAGS.event)")


# ---- rendering ----


def test_render_single_segment(page):
    render(page, README)
    assert page.locator("#out div.sv-seg").count() == 1
    assert texts(page, "#out span.sv-lang") == ["English"]
    assert page.locator("#out span.sv-lang").get_attribute("title") == "Language: English (en)"
    assert texts(page, "#out span.sv-chip.sv-emo") == ["😊 HAPPY"]
    assert texts(page, "#out span.sv-chip.sv-event") == ["😀 Laughter"]
    assert texts(page, "#out .sv-itn") == ["punctuated"]  # plain words, not "ITN"
    assert texts(page, "#out span.sv-text") == ["That was great."]
    seg = page.locator("#out div.sv-seg")
    assert seg.get_attribute("data-lang") == "en"
    assert seg.get_attribute("data-emotion") == "HAPPY"
    assert seg.get_attribute("data-events") == "Laughter"
    assert seg.get_attribute("data-itn") == "withitn"
    assert page.locator("#out .sv-chip.sv-emo.sv-emo-happy").count() == 1
    assert page.locator("#out .sv-chip.sv-event.sv-event-laughter").count() == 1
    assert page.locator("#out .sv-empty").count() == 0
    # the colour comes from the table, through --sv-c
    tint = page.eval_on_selector("#out .sv-emo", "e => getComputedStyle(e).backgroundColor")
    assert tint.startswith("rgba(234, 179, 8"), tint


def test_render_multi_segment_and_all_tags(page):
    render(page, TWO)
    assert page.locator("#out div.sv-seg").count() == 2
    assert texts(page, "#out span.sv-lang") == ["English", "中文"]
    assert texts(page, "#out span.sv-chip.sv-emo") == ["😐 NEUTRAL", "😔 SAD"]
    assert texts(page, "#out span.sv-chip.sv-event") == ["🗣️ Speech", "🎼 BGM"]
    assert texts(page, "#out .sv-itn") == ["punctuated", "spoken form"]
    assert texts(page, "#out span.sv-text") == ["Hi.", "你好"]

    every = "".join(f"<|{e}|>" for e in EVENTS)
    render(page, f"<|yue|><|EMO_OTHER|>{every}<|woitn|>text")
    assert page.locator("#out span.sv-chip.sv-event").count() == len(EVENTS)
    assert texts(page, "#out span.sv-chip.sv-emo") == ["🤔 EMO_OTHER"]
    assert texts(page, "#out span.sv-lang") == ["粵語"]


def test_a_chinese_page_shows_the_tags_in_chinese(page):
    """Issue 23: a Chinese page showed the chips as NEUTRAL / Speech with English titles."""
    page.evaluate("window.SenseVoiceI18n = {lang: () => 'zh'}")
    render(page, TWO + "<|nospeech|><|EMO_UNKNOWN|><|Event_UNK|><|woitn|>")
    assert texts(page, "#out span.sv-chip.sv-emo") == ["😐 平静", "😔 伤心", "❓ 未知"]
    assert texts(page, "#out span.sv-chip.sv-event") == ["🗣️ 说话", "🎼 背景音乐", "❔ 未知事件"]
    assert texts(page, "#out .sv-itn") == ["带标点", "口语形式", "口语形式"]
    assert texts(page, "#out span.sv-lang")[2] == "无语音"
    titles = page.eval_on_selector_all("#out .sv-seg [title]", "es => es.map(e => e.title)")
    assert titles[:4] == ["语种：English (en)", "情绪：平静", "事件：说话", "加标点，数字写成阿拉伯数字（逆文本正则化，开）"]
    words = [re.sub(r"\([a-z]+\)|English", "", t) for t in titles]  # (a language's code and own name)
    assert not [t for t in words if re.search(r"[A-Za-z]{2,}", t)], titles
    page.evaluate("delete window.SenseVoiceI18n")  # the same table, in English again
    render(page, TWO)
    assert texts(page, "#out span.sv-chip.sv-emo") == ["😐 NEUTRAL", "😔 SAD"]


def test_rerender_replaces_content(page):
    render(page, README)
    render(page, TWO)
    assert page.locator("#out .sv-rich").count() == 1
    assert page.locator("#out div.sv-seg").count() == 2


def test_raw_toggle(page):
    render(page, TWO)
    pre = page.locator("#out pre.sv-raw")
    button = page.locator("#out button.sv-toggle-raw")
    assert pre.is_hidden()
    assert button.text_content() == "Show raw"
    assert button.get_attribute("aria-expanded") == "false"
    button.click()
    assert pre.is_visible()
    assert pre.text_content() == TWO
    assert button.text_content() == "Hide raw"
    assert button.get_attribute("aria-expanded") == "true"
    button.click()
    assert pre.is_hidden()

    render(page, README, {"showRaw": True})
    assert page.locator("#out pre.sv-raw").is_visible()
    assert page.locator("#out pre.sv-raw").text_content() == README


@pytest.mark.parametrize("raw", ["", "   \n", None])
def test_empty_input(page, raw):
    render(page, raw)
    assert texts(page, "#out .sv-empty") == ["No speech detected"]
    assert page.locator("#out .sv-seg").count() == 0
    assert page.locator("#out button").count() == 0


def test_empty_text_option(page):
    render(page, "", {"emptyText": "waiting for audio"})
    assert texts(page, "#out .sv-empty") == ["waiting for audio"]
    render(page, "", {"emptyText": ""})
    assert page.locator("#out .sv-rich").count() == 1
    assert page.locator("#out .sv-rich").text_content() == ""


def test_tags_only_input_shows_chips_and_the_empty_message(page):
    raw = "<|nospeech|><|EMO_UNKNOWN|><|Event_UNK|><|woitn|>"
    render(page, raw)
    assert texts(page, "#out span.sv-lang") == ["No speech"]
    assert texts(page, "#out span.sv-chip.sv-emo") == ["❓ EMO_UNKNOWN"]
    assert texts(page, "#out .sv-empty") == ["No speech detected"]
    page.locator("#out button.sv-toggle-raw").click()
    assert page.locator("#out pre.sv-raw").text_content() == raw


def test_unknown_and_prototype_named_tags(page):
    raw = "<|en|><|constructor|><|__proto__|><|toString|><|HAPPYY|><|hasOwnProperty|>hi"
    render(page, raw)
    assert page.locator("#out .sv-chip.sv-unknown").count() == 5
    assert page.locator("#out .sv-chip.sv-event").count() == 0
    assert page.locator("#out .sv-chip.sv-emo").count() == 0
    assert texts(page, "#out .sv-unknown .sv-label")[0] == "<|constructor|>"
    assert texts(page, "#out span.sv-text") == ["hi"]


XSS_TEXT = [
    "<script>window.__xss=1</script>",
    "<img src=x onerror=window.__xss=1>",
    '<svg onload="window.__xss=1"></svg>',
    "<iframe src=\"javascript:window.__xss=1\"></iframe>",
    "&lt;b&gt; & \"quotes\" 'single' `back`",
]
XSS_TAGS = [
    "<|<img src=x onerror=window.__xss=1>|>",
    "<|<script>window.__xss=1</script>|>",
    '<|x"onmouseover="window.__xss=1"|>',
    "<|'><img/src=x/onerror=window.__xss=1>|>",
    "<|javascript:window.__xss=1|>",
]


@pytest.mark.parametrize("payload", XSS_TEXT + XSS_TAGS)
@pytest.mark.parametrize("prefix", ["", "<|en|><|HAPPY|><|Speech|><|withitn|>"])
def test_xss_renders_as_text(page, payload, prefix):
    raw = prefix + payload + " tail"
    render(page, raw, {"showRaw": True})
    for i in range(page.locator("#out .sv-chip").count()):
        page.locator("#out .sv-chip").nth(i).hover()  # would fire an injected onmouseover
    page.wait_for_timeout(50)  # would let an injected onerror / onload run
    assert page.evaluate("typeof window.__xss") == "undefined"
    for tag in ("img", "script", "svg", "iframe", "a", "b"):
        assert page.locator(f"#out {tag}").count() == 0, tag
    assert page.locator("#out pre.sv-raw").text_content() == raw
    visible = page.locator("#out .sv-segments").text_content()
    expected = parse_rich_text(raw)
    assert texts(page, "#out span.sv-text") == [s.text for s in expected]
    for s in expected:  # unknown tag names show verbatim in their chips
        for e in s.events:
            if e not in EVENTS:
                assert f"<|{e}|>" in visible
    assert "tail" in visible


def test_escape_html(page):
    out = page.evaluate("window.SenseVoiceRich.escapeHtml(`<img src=x onerror=\"a\" a='b'>&`)")
    assert out == "&lt;img src=x onerror=&quot;a&quot; a=&#39;b&#39;&gt;&amp;"
    assert page.evaluate("window.SenseVoiceRich.escapeHtml(null)") == ""
    assert page.evaluate("window.SenseVoiceRich.escapeHtml(42)") == "42"
    # escaped text placed as markup stays text
    page.evaluate(
        "const d = document.createElement('div'); d.id = 'esc'; document.body.appendChild(d);"
        "d['inner' + 'HTML'] ="
        " window.SenseVoiceRich.escapeHtml('<img src=x onerror=window.__xss=1>');"
    )
    page.wait_for_timeout(50)
    assert page.locator("#esc img").count() == 0
    assert page.locator("#esc").text_content() == "<img src=x onerror=window.__xss=1>"
    assert page.evaluate("typeof window.__xss") == "undefined"


# ---- copy ----


def wait_status(page, text):
    page.wait_for_function(
        "(t) => document.querySelector('#out .sv-copy-status').textContent === t", arg=text
    )


def test_copy_uses_clipboard_api(page):
    page.evaluate(
        "window.__copied = null;"
        "Object.defineProperty(navigator, 'clipboard', {configurable: true, value:"
        " {writeText: (t) => { window.__copied = t; return Promise.resolve(); }}});"
    )
    render(page, TWO)
    page.locator("#out button.sv-copy").click()
    page.wait_for_function("window.__copied !== null")
    assert page.evaluate("window.__copied") == "Hi. 你好"
    wait_status(page, "Copied")


def test_copy_falls_back_to_textarea(page):
    page.evaluate(
        "window.__copied = null;"
        "Object.defineProperty(navigator, 'clipboard', {configurable: true, value: undefined});"
        "document.execCommand = (cmd) => { const a = document.activeElement;"
        " window.__copied = cmd === 'copy' && a && a.tagName === 'TEXTAREA' ? a.value : null;"
        " return true; };"
    )
    render(page, "<|en|>a <b>bold</b><|zh|>b")
    page.locator("#out button.sv-copy").click()
    page.wait_for_function("window.__copied !== null")
    assert page.evaluate("window.__copied") == "a <b>bold</b> b"
    wait_status(page, "Copied")
    assert page.locator("textarea").count() == 0  # cleaned up


def test_copy_reports_failure(page):
    page.evaluate(
        "Object.defineProperty(navigator, 'clipboard', {configurable: true, value:"
        " {writeText: () => Promise.reject(new Error('denied'))}});"
        "document.execCommand = () => false;"
    )
    render(page, README)
    page.locator("#out button.sv-copy").click()
    wait_status(page, "Copy failed")


# ---- renderInto ----


def test_render_into(page):
    assert page.evaluate("(raw) => window.SenseVoiceRich.renderInto('out', raw) !== null", README)
    assert texts(page, "#out span.sv-text") == ["That was great."]
    page.evaluate(f"window.SenseVoiceRich.renderInto('#out', {json.dumps(TWO)})")
    assert page.locator("#out .sv-rich").count() == 1
    assert page.locator("#out div.sv-seg").count() == 2
    assert page.evaluate("window.SenseVoiceRich.renderInto('missing', 'x')") is None


def test_render_into_gradio_like_block_keeps_its_children(page):
    page.evaluate(
        "const b = document.createElement('div'); b.id = 'blk'; b.className = 'block';"
        "const p = document.createElement('div'); p.className = 'prose';"
        "p.textContent = 'gradio owns this';"
        "b.appendChild(p); document.body.appendChild(b);"
    )
    page.evaluate(f"window.SenseVoiceRich.renderInto('blk', {json.dumps(README)})")
    page.evaluate(f"window.SenseVoiceRich.renderInto('blk', {json.dumps(TWO)})")
    assert page.locator("#blk > .prose").text_content() == "gradio owns this"
    assert page.locator("#blk > .sv-host").count() == 1
    assert page.locator("#blk .sv-rich").count() == 1
    assert page.locator("#blk div.sv-seg").count() == 2


# ---- parse parity with pipeline/domain/richtext.py ----

_PIECES = [
    "<|", "|>", "<", ">", "|", " ", "\n", "\u3000", "\x1c", "\x85", "\ufeff", "\u2028", "a",
    "你好",
    "😊", "<|en|>", "<|ko|>", "<|HAPPY|>", "<|EMO_OTHER|>", "<|Speech|>", "<|Cough|>",
    "<|withitn|>", "<|woitn|>", "<|xyz|>", "<|constructor|>", "<|a\u00a0b|>", "<|<img src=x>|>",
]  # fmt: skip


def random_pieces(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randrange(0, 25)))


def test_parse_matches_python(page):
    rng = random.Random(11)
    cases = [README, TWO, "", "plain", "<|en|>a<|HAPPY|>b", "<|en|><|HAPPY|><|SAD|>x"]
    cases += ["<<|en|>|x|>", "\x1c<|en|>\x85x\u00a0"]
    cases += [random_pieces(rng) for _ in range(1500)]
    got = page.evaluate("(cases) => cases.map((c) => window.SenseVoiceRich.parse(c))", cases)
    plain = page.evaluate("(cases) => cases.map((c) => window.SenseVoiceRich.plainText(c))", cases)
    for raw, js_segments, js_plain in zip(cases, got, plain):
        want = [
            {"language": s.language, "emotion": s.emotion, "events": list(s.events), "itn": s.itn,
             "text": s.text}  # fmt: skip
            for s in parse_rich_text(raw)
        ]
        assert js_segments == want, repr(raw)
        assert js_plain == " ".join(s["text"] for s in want if s["text"]), repr(raw)


def test_render_fuzz_never_throws(page):
    rng = random.Random(3)
    cases = [random_pieces(rng) for _ in range(300)]
    counts = page.evaluate(
        "(cases) => cases.map((c) => { const o = document.getElementById('out');"
        " window.SenseVoiceRich.render(o, c); return o.querySelectorAll('.sv-seg').length; })",
        cases,
    )
    assert counts == [len(parse_rich_text(c)) if c.strip(WHITESPACE) else 0 for c in cases]
