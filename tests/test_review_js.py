"""static/review.js (the QA review view) in a real headless Chromium (Debian's /usr/bin/chromium
via Playwright), with a real WAV served to the <audio> element through page.route."""

from __future__ import annotations

import io
import json
import math
import re
import struct
import wave
from pathlib import Path

import pytest

from pipeline.web.vocab import vocab_script

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "static"
RICH_JS = (STATIC / "richtext.js").read_text(encoding="utf-8")
REVIEW_JS = (STATIC / "review.js").read_text(encoding="utf-8")
CSS = (STATIC / "style.css").read_text(encoding="utf-8")
REVIEW_CSS = (STATIC / "review.css").read_text(encoding="utf-8")
PAGE = (
    f"<html><head><style>{CSS}</style><style>{REVIEW_CSS}</style>"
    f"{vocab_script()}<script>{RICH_JS}</script><script>{REVIEW_JS}</script></head>"
    "<body><div id=out></div></body></html>"
)
PAGE_NO_RICH = (
    f"<html><head><style>{REVIEW_CSS}</style><script>{REVIEW_JS}</script></head>"
    "<body><div id=out></div></body></html>"
)

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(
        not CHROMIUM.exists(),
        reason=f"{CHROMIUM} missing: apt-get install -y chromium to run the browser tests",
    ),
]

SECONDS = 6.0
HOST = "http://sv.test"
AUDIO = f"{HOST}/api/jobs/j1/audio"
UPLOAD = f"{HOST}/upload/mine.wav"
GONE = f"{HOST}/api/jobs/gone/audio"


def make_wav(seconds: float = SECONDS, rate: int = 16000) -> bytes:
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        frames = b"".join(
            struct.pack("<h", int(8000 * math.sin(2 * math.pi * 440 * i / rate)))
            for i in range(int(seconds * rate))
        )
        w.writeframes(frames)
    return buf.getvalue()


WAV = make_wav()


def audio_response(range_header: str | None) -> dict:
    """Like a real file server (FastAPI's FileResponse): byte ranges, so the media is seekable."""
    headers = {"Content-Type": "audio/wav", "Accept-Ranges": "bytes"}
    m = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
    if not m:
        return {"status": 200, "body": WAV, "headers": headers}
    first = int(m.group(1))
    last = min(int(m.group(2)) if m.group(2) else len(WAV) - 1, len(WAV) - 1)
    headers["Content-Range"] = f"bytes {first}-{last}/{len(WAV)}"
    return {"status": 206, "body": WAV[first:last + 1], "headers": headers}

SEGMENTS = [
    {"language": "en", "emotion": "NEUTRAL", "events": ["Speech"], "itn": "withitn",
     "text": "Thanks for calling, how can I help?", "start": 0.0, "end": 2.0, "speaker": "left"},
    {"language": "en", "emotion": "HAPPY", "events": ["Laughter", "Applause"], "itn": "withitn",
     "text": "Ha, great news!", "start": 2.0, "end": 3.5, "speaker": "right"},
    {"language": "zh", "emotion": "NEUTRAL", "events": ["Applause", "BGM"], "itn": "woitn",
     "text": "你好", "start": 3.5, "end": 6.0, "speaker": "left"},
]  # fmt: skip
JOB = {
    "id": "j1", "status": "done", "filename": "call.wav", "audio_seconds": SECONDS,
    "result": {"text": "...", "raw_text": "...", "segments": SEGMENTS},
}  # fmt: skip
OPTS = {"audioUrl": AUDIO}

XSS = "<img src=x onerror=window.__xss=1>"
XSS_MORE = [
    XSS,
    "<script>window.__xss=1</script>",
    '<svg onload="window.__xss=1"></svg>',
    '"><iframe src="javascript:window.__xss=1"></iframe>',
]


@pytest.fixture(scope="module")
def _tab(browser):
    pg = browser.new_page()
    pg.errors = []
    pg.requests = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))

    def serve(route):
        url = route.request.url
        pg.requests.append(url)
        if url.split("?")[0] in (AUDIO, UPLOAD):
            route.fulfill(**audio_response(route.request.headers.get("range")))
        else:  # GONE, and anything else (an injected <img src=x> would land here)
            route.fulfill(status=404, body="gone", headers={"Content-Type": "text/plain"})

    pg.route(f"{HOST}/**", serve)
    yield pg
    pg.close()


@pytest.fixture
def page(_tab):
    """A fresh document (about:blank first, so no global survives) per test."""
    _tab.goto("about:blank")
    _tab.set_content(PAGE)
    _tab.errors.clear()
    _tab.requests.clear()
    yield _tab
    assert _tab.errors == [], f"uncaught page errors: {_tab.errors}"


def render(page, job, opts=None) -> None:
    page.evaluate(
        "([job, opts]) =>"
        " window.SenseVoiceReview.render(document.getElementById('out'), job, opts)",
        [job, OPTS if opts is None else opts],
    )


def texts(page, selector):
    return page.locator(selector).all_text_contents()


def wait_metadata(page):
    page.wait_for_function("document.querySelector('#out audio.sv-player').readyState >= 1")


def current_time(page) -> float:
    return page.evaluate("document.querySelector('#out audio.sv-player').currentTime")


def wait_time_near(page, target, tol=0.3):
    page.wait_for_function(
        "([t, tol]) => Math.abs(document.querySelector('#out audio.sv-player').currentTime - t)"
        " <= tol",
        arg=[target, tol],
    )


def tags(page):
    return page.evaluate("window.SenseVoiceRich.TAGS")


def rgb(triple: str) -> str:
    return "rgb(" + ", ".join(triple.split()) + ")"


# ---- the source ----


def test_source_is_ascii_and_builds_no_markup():
    assert REVIEW_JS.isascii(), "keep review.js ASCII (emoji as \\u escapes)"
    assert "</script" not in REVIEW_JS.lower()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "Function(", "setHTML"):  # fmt: skip
        assert sink not in REVIEW_JS, sink
    # no second emoji/colour table: every emoji and colour comes from SenseVoiceRich.TAGS
    assert "\\ud83d\\ude10" not in REVIEW_JS and "107 114 128" not in REVIEW_JS


def test_api_shape(page):
    assert page.evaluate("Object.keys(window.SenseVoiceReview).sort()") == [
        "exportName", "exportsBar", "formatTime", "renameSpeakers", "render",
        "renderInto"]  # fmt: skip
    fmt = page.evaluate(
        "[0, 1.25, 61.96, 3599.94, 3723.4, null].map(window.SenseVoiceReview.formatTime)")
    assert fmt == ["00:00.0", "00:01.3", "01:02.0", "59:59.9", "1:02:03.4", "--:--.-"]


# ---- table ----


def test_table_rows(page):
    render(page, JOB)
    rows = page.locator("#out table.sv-segments tbody tr.sv-row")
    assert rows.count() == 3
    assert [rows.nth(i).get_attribute("data-start") for i in range(3)] == ["0", "2", "3.5"]
    assert texts(page, "#out thead th") == ["Time", "Speaker", "Language", "Emotion", "Events",
                                            "Text"]  # fmt: skip
    assert texts(page, "#out td.sv-col-time") == [
        "00:00.0 – 00:02.0", "00:02.0 – 00:03.5", "00:03.5 – 00:06.0"]  # fmt: skip
    assert texts(page, "#out td.sv-col-speaker") == ["left", "right", "left"]
    assert texts(page, "#out td.sv-col-language") == ["English", "English", "中文"]  # names
    assert texts(page, "#out td.sv-col-emotion") == ["😐 NEUTRAL", "😊 HAPPY", "😐 NEUTRAL"]
    assert texts(page, "#out td.sv-col-events .sv-chip") == [
        "🗣️ Speech", "😀 Laughter", "👏 Applause", "👏 Applause", "🎼 BGM"]  # fmt: skip
    assert texts(page, "#out td.sv-col-text") == [s["text"] for s in SEGMENTS]
    assert texts(page, "#out .sv-review-title") == ["call.wav"]
    # style.css's flex column for div.sv-segments does not apply; rows share one column grid
    style = "(e) => getComputedStyle(e).display"
    assert page.eval_on_selector("#out table.sv-segments", style) != "flex"
    assert page.eval_on_selector("#out thead", "e => getComputedStyle(e).position") == "sticky"
    lefts = page.eval_on_selector_all(
        "#out tr",
        "rs => rs.map(r => [...r.children].map(c => Math.round(c.getBoundingClientRect().left)))",
    )
    assert all(row == lefts[0] for row in lefts), "columns line up"
    assert page.locator("#out table").get_attribute("role") == "table"
    assert page.locator("#out td[role=cell]").count() == 18


def test_every_row_shows_its_own_tags_also_when_they_repeat(page):
    """Issue 23: chips drawn only where the emotion changed read as "no emotion" on the rows
    between; each row, the result's segments and the timeline carry their own."""
    same = [dict(SEGMENTS[0], start=float(i), end=i + 1.0, text=f"line {i}") for i in range(4)]
    same[2] = dict(same[2], emotion="HAPPY", events=["Speech", "Laughter"])
    render(page, dict(JOB, result={"text": "", "raw_text": "", "segments": same}))
    assert texts(page, "#out td.sv-col-emotion") == ["😐 NEUTRAL", "😐 NEUTRAL", "😊 HAPPY", "😐 NEUTRAL"]
    assert [page.locator("#out tr.sv-row").nth(i).locator("td.sv-col-events .sv-chip").count()
            for i in range(4)] == [1, 1, 2, 1]
    titles = page.eval_on_selector_all("#out .sv-timeline rect[data-k] title",
                                       "ts => ts.map(t => t.textContent)")
    assert len(titles) == 4 and all("NEUTRAL" in t or "HAPPY" in t for t in titles), titles


def test_rows_sorted_by_time_and_no_speaker(page):
    segs = [dict(SEGMENTS[2], speaker=None), dict(SEGMENTS[0], speaker=None)]
    render(page, dict(JOB, result={"text": "", "raw_text": "", "segments": segs}))
    assert [r for r in texts(page, "#out td.sv-col-time")] == [
        "00:00.0 – 00:02.0", "00:03.5 – 00:06.0"]  # fmt: skip
    assert page.locator("#out tr.sv-row").nth(0).get_attribute("data-index") == "1"
    assert texts(page, "#out td.sv-col-speaker") == ["—", "—"]
    assert texts(page, "#out .sv-tl-label") == ["All"]
    assert page.locator("#out g.sv-tl-lane").count() == 1


# ---- summary ----


def test_summary_chips(page):
    render(page, JOB)
    emos = texts(page, "#out .sv-summary .sv-sum-emo")
    assert emos == ["😐 NEUTRAL 75%", "😊 HAPPY 25%"]
    shares = [int(re.search(r"(\d+)%$", t).group(1)) for t in emos]
    assert abs(sum(shares) - 100) <= 1
    assert texts(page, "#out .sv-summary .sv-sum-event") == [
        "👏 Applause ×2", "😀 Laughter ×1", "🎼 BGM ×1"]  # fmt: skip
    assert texts(page, "#out .sv-summary .sv-sum-lang") == ["English", "中文"]
    t = tags(page)
    happy = page.locator("#out .sv-sum-emo.sv-emo-happy")
    color = happy.evaluate("e => e.style.getPropertyValue('--sv-c')")
    assert color == t["emotion"]["HAPPY"]["color"]
    tint = happy.evaluate("e => getComputedStyle(e).backgroundColor")
    assert tint.startswith("rgba(234, 179, 8"), tint


def test_summary_percentages_round_to_100(page):
    segs = [
        {"language": "en", "emotion": e, "events": [], "itn": "", "text": "x", "start": i,
         "end": i + 1, "speaker": None}
        for i, e in enumerate(["HAPPY", "SAD", "ANGRY"])
    ]
    render(page, dict(JOB, audio_seconds=3, result={"text": "", "raw_text": "", "segments": segs}))
    shares = page.eval_on_selector_all(
        "#out .sv-sum-emo", "es => es.map(e => +e.getAttribute('data-share'))")
    assert sorted(shares) == [33, 33, 34] and sum(shares) == 100


def test_degrades_without_richtext(page):
    page.goto("about:blank")  # a new window: no SenseVoiceRich left over
    page.set_content(PAGE_NO_RICH)
    assert page.evaluate("typeof window.SenseVoiceRich") == "undefined"
    render(page, JOB)
    assert texts(page, "#out .sv-sum-emo") == ["NEUTRAL 75%", "HAPPY 25%"]
    assert texts(page, "#out .sv-sum-event")[0] == "Applause ×2"
    assert texts(page, "#out .sv-sum-lang") == ["EN", "ZH"]
    assert page.locator("#out rect.sv-tl-seg").count() == 3
    assert page.locator("#out tr.sv-row").count() == 3


# ---- timeline ----


def test_timeline_lanes_rects_and_events(page):
    render(page, JOB)
    svg = page.locator("#out svg.sv-timeline")
    assert svg.count() == 1
    assert svg.get_attribute("viewBox") == "0 0 6 80"
    assert svg.get_attribute("width") == "100%"
    assert texts(page, "#out .sv-tl-label") == ["left", "right"]
    lanes = page.locator("#out svg.sv-timeline g.sv-tl-lane")
    assert [lanes.nth(i).get_attribute("data-speaker") for i in range(2)] == ["left", "right"]
    assert page.locator("#out svg.sv-timeline g.sv-tl-lane").nth(0).evaluate(
        "g => Math.round(g.getBoundingClientRect().height)") == 40

    rects = page.eval_on_selector_all(
        "#out rect.sv-tl-seg",
        "rs => rs.map(r => ({lane: r.closest('g.sv-tl-lane').getAttribute('data-speaker'),"
        " x: +r.getAttribute('x'), y: +r.getAttribute('y'), w: +r.getAttribute('width'),"
        " start: r.getAttribute('data-start'), end: r.getAttribute('data-end'),"
        " fill: r.getAttribute('fill'), title: r.querySelector('title').textContent}))",
    )
    assert len(rects) == 3
    rects.sort(key=lambda r: float(r["start"]))  # document order is lane by lane
    t = tags(page)
    for r, s in zip(rects, SEGMENTS):
        lane = ["left", "right"].index(s["speaker"])
        assert r["lane"] == s["speaker"]
        assert lane * 40 <= r["y"] < (lane + 1) * 40
        assert r["x"] == s["start"] and abs(r["w"] - (s["end"] - s["start"])) < 1e-9
        assert float(r["start"]) == s["start"] and float(r["end"]) == s["end"]
        assert r["fill"] == rgb(t["emotion"][s["emotion"]]["color"])
        assert s["text"] in r["title"] and s["emotion"] in r["title"]
    assert "00:02.0 – 00:03.5" in rects[1]["title"]

    events = page.eval_on_selector_all(
        "#out .sv-tl-event",
        "es => es.map(e => [e.getAttribute('data-event'), +e.getAttribute('data-start'),"
        " e.getAttribute('data-lane'), e.querySelector('title').textContent])",
    )
    assert [e[:3] for e in events] == [
        ["Laughter", 2.0, "1"], ["Applause", 2.0, "1"],
        ["Applause", 3.5, "0"], ["BGM", 3.5, "0"]]  # fmt: skip
    assert events[0][3].startswith("😀 Laughter") and events[3][3].startswith("🎼 BGM")
    assert page.locator("#out .sv-tl-playhead").count() == 1


def test_timeline_click_seeks(page):
    render(page, JOB)
    wait_metadata(page)
    svg = page.locator("#out svg.sv-timeline")
    box = svg.bounding_box()
    svg.click(position={"x": box["width"] * 0.75, "y": 60})  # 4.5 s, in the "right" lane
    wait_time_near(page, 4.5, 0.15)
    x = float(page.locator("#out .sv-tl-playhead").get_attribute("x1"))
    assert abs(x - 4.5) < 0.15
    assert texts(page, "#out tr.sv-row.sv-active td.sv-col-time") == ["00:03.5 – 00:06.0"]
    assert page.locator("#out rect.sv-tl-seg.sv-active").get_attribute("data-start") == "3.5"


def test_row_click_seeks_and_highlights(page):
    render(page, JOB)
    wait_metadata(page)
    assert current_time(page) == 0
    page.locator("#out tr.sv-row").nth(1).click()
    wait_time_near(page, 2.0, 0.5)  # play() may run on: a little past the start is fine
    row = page.locator("#out tr.sv-row").nth(1)
    assert "sv-selected" in row.get_attribute("class")
    assert "sv-active" in row.get_attribute("class")
    page.evaluate("document.querySelector('#out audio').pause()")

    page.locator("#out tr.sv-row").nth(2).locator("td.sv-col-text").click()
    wait_time_near(page, 3.5, 0.5)
    assert page.locator("#out tr.sv-row.sv-selected").count() == 1
    assert page.locator("#out tr.sv-row.sv-selected").get_attribute("data-start") == "3.5"
    page.evaluate("document.querySelector('#out audio').pause()")


def test_row_of_playing_segment_is_highlighted(page):
    render(page, JOB)
    wait_metadata(page)
    for t, start in [(1.0, "0"), (2.7, "2"), (5.0, "3.5"), (0.2, "0")]:
        page.evaluate("(t) => { document.querySelector('#out audio').currentTime = t; }", t)
        page.wait_for_function(
            "(s) => { const a = document.querySelectorAll('#out tr.sv-row.sv-active');"
            " return a.length === 1 && a[0].getAttribute('data-start') === s; }",
            arg=start,
        )
        assert page.locator("#out rect.sv-tl-seg.sv-active").count() == 1


def test_overlapping_speakers_both_highlighted(page):
    segs = [dict(SEGMENTS[0], end=3.0), dict(SEGMENTS[1], start=1.0, end=2.5), SEGMENTS[2]]
    render(page, dict(JOB, result={"text": "", "raw_text": "", "segments": segs}))
    wait_metadata(page)
    page.evaluate("document.querySelector('#out audio').currentTime = 2.0")
    page.wait_for_function("document.querySelectorAll('#out tr.sv-row.sv-active').length === 2")


# ---- audio sources ----


def test_fallback_audio_when_first_url_404s(page):
    render(page, JOB, {"audioUrl": GONE, "fallbackAudioUrl": UPLOAD})
    page.wait_for_function(
        "document.querySelector('#out audio').getAttribute('data-source') === 'fallback'"
        " && document.querySelector('#out audio').readyState >= 1"
    )
    audio = page.locator("#out audio.sv-player")
    assert audio.get_attribute("src") == UPLOAD
    assert audio.get_attribute("preload") == "metadata"
    assert audio.evaluate("a => a.controls") is True
    assert abs(audio.evaluate("a => a.duration") - SECONDS) < 0.05
    assert GONE in page.requests and UPLOAD in page.requests
    assert page.locator("#out .sv-audio-gone").count() == 0
    page.locator("#out tr.sv-row").nth(2).click()
    wait_time_near(page, 3.5, 0.5)
    page.evaluate("document.querySelector('#out audio').pause()")


def test_primary_audio_used_when_it_works(page):
    render(page, JOB, {"audioUrl": AUDIO, "fallbackAudioUrl": UPLOAD})
    wait_metadata(page)
    assert page.locator("#out audio").get_attribute("data-source") == "primary"
    assert UPLOAD not in page.requests


@pytest.mark.parametrize("opts", [{"audioUrl": GONE, "fallbackAudioUrl": GONE + "?x"},
                                  {"audioUrl": GONE}, {}])  # fmt: skip
def test_audio_no_longer_kept(page, opts):
    render(page, JOB, opts)
    page.wait_for_function(
        "document.querySelector('#out audio').getAttribute('data-source') === 'none'")
    note = page.locator("#out .sv-audio-gone")
    assert note.is_visible()
    assert "audio no longer kept" in note.text_content().lower()
    assert page.locator("#out audio").is_hidden()
    # the view still works without audio: clicking moves the playhead and highlights
    page.locator("#out tr.sv-row").nth(2).click()
    assert float(page.locator("#out .sv-tl-playhead").get_attribute("x1")) == 3.5
    assert page.locator("#out tr.sv-row.sv-active").get_attribute("data-start") == "3.5"


# ---- exports ----


def test_export_links(page):
    render(page, JOB)
    links = page.eval_on_selector_all(
        "#out a.sv-export",
        "as => as.map(a => [a.textContent, a.getAttribute('href'), a.hasAttribute('download')])",
    )
    assert links == [[f.upper(), f"/api/jobs/j1/result?format={f}", True]
                     for f in ("txt", "json", "srt", "vtt")]  # fmt: skip
    render(page, dict(JOB, id="a/b c"), {"audioUrl": AUDIO, "exportBase": "/sv/api/jobs/"})
    assert page.locator("#out a.sv-export").first.get_attribute("href") == (
        "/sv/api/jobs/a%2Fb%20c/result?format=txt")


# ---- safety ----


@pytest.mark.parametrize("payload", XSS_MORE)
def test_xss_renders_as_text(page, payload):
    segs = [
        dict(SEGMENTS[0], text=payload, speaker=payload),
        dict(SEGMENTS[1], text=payload + " tail", emotion=payload, events=[payload, "Laughter"],
             language=payload),  # fmt: skip
    ]
    job = dict(JOB, id=payload, filename=payload, status="done",
               result={"text": payload, "raw_text": payload, "segments": segs})
    render(page, job)
    for i in range(page.locator("#out .sv-chip").count()):
        page.locator("#out .sv-chip").nth(i).hover()
    page.locator("#out rect.sv-tl-seg").first.hover()
    page.wait_for_timeout(100)  # would let an injected onerror / onload run
    assert page.evaluate("typeof window.__xss") == "undefined"
    for tag in ("img", "script", "iframe", "b"):
        assert page.locator(f"#out {tag}").count() == 0, tag
    assert page.locator("#out svg").count() == 1  # only the timeline itself
    assert texts(page, "#out td.sv-col-text") == [payload, payload + " tail"]
    assert texts(page, "#out td.sv-col-speaker")[0] == payload
    assert payload in texts(page, "#out .sv-tl-label")
    assert texts(page, "#out .sv-review-title") == [payload]
    assert page.locator("#out .sv-review").get_attribute("data-job") == payload
    assert page.locator("#out td.sv-col-emotion .sv-label").nth(1).text_content() == payload
    assert payload in texts(page, "#out .sv-sum-event .sv-label")
    assert page.locator("#out rect.sv-tl-seg title").first.text_content().endswith(payload)
    href = page.locator("#out a.sv-export").first.get_attribute("href")
    assert href.startswith("/api/jobs/") and "<" not in href and '"' not in href


# ---- short clips, empty and partial jobs ----


def test_null_timed_single_segment(page):
    seg = dict(SEGMENTS[1], start=None, end=None, speaker=None)
    result = {"text": "", "raw_text": "", "segments": [seg]}
    render(page, dict(JOB, audio_seconds=4.2, result=result))
    assert texts(page, "#out td.sv-col-time") == ["00:00.0 – 00:04.2"]
    rect = page.locator("#out rect.sv-tl-seg")
    assert rect.count() == 1
    assert float(rect.get_attribute("x")) == 0 and float(rect.get_attribute("width")) == 4.2
    assert page.locator("#out svg.sv-timeline").get_attribute("viewBox") == "0 0 4.2 40"
    assert texts(page, "#out .sv-sum-emo") == ["😊 HAPPY 100%"]
    assert texts(page, "#out .sv-tl-label") == ["All"]
    assert page.locator("#out .sv-tl-event").count() == 2
    page.locator("#out tr.sv-row").click()
    assert page.locator("#out tr.sv-row.sv-active").count() == 1


def test_several_untimed_segments_are_spread_and_marked(page):
    segs = [dict(s, start=None, end=None, speaker=None) for s in SEGMENTS]
    render(page, dict(JOB, result={"text": "", "raw_text": "", "segments": segs}))
    times = texts(page, "#out td.sv-col-time")
    assert len(times) == 3 and all(t.startswith("≈") for t in times)
    assert times[0].startswith("≈ 00:00.0") and times[-1].endswith("00:06.0")
    xs = page.eval_on_selector_all("#out rect.sv-tl-seg", "rs => rs.map(r => +r.getAttribute('x'))")
    assert xs == sorted(xs) and len(set(xs)) == 3


def test_segments_parsed_from_raw_text_when_missing(page):
    raw = "<|en|><|SAD|><|Cough|><|withitn|>Sorry."
    render(page, dict(JOB, result={"text": "Sorry.", "raw_text": raw, "segments": []}))
    assert texts(page, "#out td.sv-col-text") == ["Sorry."]
    assert texts(page, "#out .sv-sum-event") == ["😷 Cough ×1"]


def test_job_without_result(page):
    render(page, {"id": "q1", "status": "queued", "audio_seconds": 3, "result": None})
    assert "queued" in page.locator("#out .sv-review-empty").text_content()
    assert page.locator("#out table").count() == 0
    assert page.locator("#out a.sv-export").count() == 0
    render(page, dict(JOB, result={"text": "", "raw_text": "", "segments": []}))
    assert texts(page, "#out .sv-review-empty") == ["No speech detected"]
    assert page.locator("#out a.sv-export").count() == 4


def test_rerender_replaces_and_pauses(page):
    render(page, JOB)
    render(page, JOB)
    assert page.locator("#out .sv-review").count() == 1
    assert page.locator("#out audio").count() == 1


# ---- long recordings ----


def long_job(n: int) -> dict:
    emos = ["NEUTRAL", "HAPPY", "SAD", "ANGRY"]
    segs = [
        {"language": "en" if i % 3 else "zh", "emotion": emos[i % 4],
         "events": ["Speech"] + (["Laughter"] if i % 10 == 0 else []), "itn": "withitn",
         "text": f"segment {i} <b>x</b>", "start": i * 1.5, "end": i * 1.5 + 1.2,
         "speaker": "left" if i % 2 else "right"}
        for i in range(n)
    ]  # fmt: skip
    return {"id": "long", "status": "done", "audio_seconds": n * 1.5,
            "result": {"text": "", "raw_text": "", "segments": segs}}  # fmt: skip


def test_2000_segments_render_fast(page):
    job = long_job(2000)
    page.evaluate("(j) => { window.__job = j; }", job)
    ms = page.evaluate(
        "() => { const t0 = performance.now();"
        " window.SenseVoiceReview.render(document.getElementById('out'), window.__job,"
        " {});"  # no audio: the 6 s test tone is shorter than this recording
        " document.body.offsetHeight;"  # include style + layout
        " return performance.now() - t0; }"
    )
    assert ms < 5000, f"render took {ms:.0f} ms"  # a guard against quadratic work, not a benchmark
    assert page.locator("#out tr.sv-row").count() == 2000
    assert page.locator("#out rect.sv-tl-seg").count() == 2000
    assert page.locator("#out .sv-tl-event").count() == 200
    assert page.locator("#out g.sv-tl-lane").count() == 2
    # time updates: one binary search each, only the changed rows touched
    ms = page.evaluate(
        "() => { const a = document.querySelector('#out audio');"
        " const t0 = performance.now();"
        " for (let i = 0; i < 2000; i++) a.dispatchEvent(new Event('timeupdate'));"
        " return performance.now() - t0; }"
    )
    assert ms < 2000, f"2000 timeupdates took {ms:.0f} ms"  # no full re-render per update
    # seeking deep into the recording from the table highlights the right row
    page.locator("#out tr.sv-row").nth(1500).click()
    assert page.locator("#out tr.sv-row.sv-active").get_attribute("data-start") == "2250"
    assert float(page.locator("#out .sv-tl-playhead").get_attribute("x1")) == 2250


# ---- renderInto ----


def test_render_into(page):
    js = json.dumps(JOB)
    host = page.evaluate(
        "([j, o]) => { const h = window.SenseVoiceReview.renderInto('out', j, o);"
        " return h && h.id; }",
        [js, OPTS],
    )
    assert host == "out"
    assert page.locator("#out tr.sv-row").count() == 3
    # the same JSON again keeps the view (no player reset mid-playback)
    page.evaluate("document.querySelector('#out .sv-review').__mark = 1")
    page.evaluate("([j, o]) => window.SenseVoiceReview.renderInto('#out', j, o)", [js, OPTS])
    assert page.evaluate("document.querySelector('#out .sv-review').__mark") == 1
    # new JSON re-renders
    js2 = json.dumps(dict(JOB, result=dict(JOB["result"], segments=SEGMENTS[:2])))
    page.evaluate("([j, o]) => window.SenseVoiceReview.renderInto('out', j, o)", [js2, OPTS])
    assert page.locator("#out .sv-review").count() == 1
    assert page.locator("#out tr.sv-row").count() == 2
    # bad JSON, blank, a missing element
    page.evaluate("window.SenseVoiceReview.renderInto('out', '{nope')")
    assert texts(page, "#out .sv-review-error") == ["Could not read the job result."]
    page.evaluate("window.SenseVoiceReview.renderInto('out', '')")
    assert page.locator("#out *").count() == 0
    assert page.evaluate("window.SenseVoiceReview.renderInto('missing', '{}')") is None


def test_render_into_gradio_like_block_keeps_its_children(page):
    page.evaluate(
        "const b = document.createElement('div'); b.id = 'blk'; b.className = 'block';"
        "const p = document.createElement('div'); p.className = 'prose';"
        "p.textContent = 'gradio owns this';"
        "b.appendChild(p); document.body.appendChild(b);"
    )
    for segs in (SEGMENTS, SEGMENTS[:1]):
        job = json.dumps(dict(JOB, result=dict(JOB["result"], segments=segs)))
        page.evaluate("([j, o]) => window.SenseVoiceReview.renderInto('blk', j, o)", [job, OPTS])
    assert page.locator("#blk > .prose").text_content() == "gradio owns this"
    assert page.locator("#blk > .sv-review-host").count() == 1
    assert page.locator("#blk .sv-review").count() == 1
    assert page.locator("#blk tr.sv-row").count() == 1


# ---- issue 11: names, filters, downloads, narrow screens ----


def on_origin(page):
    """The test page served from HOST (an origin: localStorage and fetch work there)."""
    page.route(f"{HOST}/review.html", lambda r: r.fulfill(
        status=200, body=PAGE, headers={"Content-Type": "text/html; charset=utf-8"}))
    page.goto(f"{HOST}/review.html")
    page.evaluate("localStorage.clear()")


def test_speakers_can_be_renamed_everywhere_and_the_names_are_kept(page):
    on_origin(page)
    render(page, JOB)
    inputs = page.locator("#out input.sv-speaker-name")
    assert [inputs.nth(i).get_attribute("placeholder") for i in range(2)] == ["left", "right"]
    inputs.nth(0).fill("Agent")
    inputs.nth(1).fill(XSS)
    assert texts(page, "#out td.sv-col-speaker") == ["Agent", XSS, "Agent"]
    assert texts(page, "#out .sv-tl-label") == ["Agent", XSS]
    assert texts(page, "#out select.sv-filter-speaker option") == ["All speakers", "Agent", XSS]
    assert page.locator("#out img").count() == 0 and page.evaluate("typeof window.__xss") == "undefined"
    render(page, JOB)  # again (a reload): the names are this browser's, per job
    assert texts(page, "#out td.sv-col-speaker") == ["Agent", XSS, "Agent"]
    assert page.locator("#out input.sv-speaker-name").first.input_value() == "Agent"
    page.locator("#out input.sv-speaker-name").first.fill("")  # back to the channel's name
    assert texts(page, "#out td.sv-col-speaker")[0] == "left"
    render(page, dict(JOB, id="j2"))  # another job has its own
    assert texts(page, "#out td.sv-col-speaker")[1] == "right"


def test_filters_by_emotion_event_speaker_and_text(page):
    render(page, JOB)

    def shown():
        return page.eval_on_selector_all(
            "#out tr.sv-row", "rs => rs.filter(r => !r.hidden && r.offsetHeight > 0)"
            ".map(r => r.getAttribute('data-start'))")

    assert shown() == ["0", "2", "3.5"]
    page.select_option("#out select.sv-filter-emotion", "HAPPY")
    assert shown() == ["2"]
    assert page.locator("#out .sv-filter-count").inner_text() == "1 of 3 segments"
    assert page.locator("#out rect.sv-tl-seg.sv-dim").count() == 2
    page.select_option("#out select.sv-filter-emotion", "")
    page.select_option("#out select.sv-filter-event", "Applause")
    assert shown() == ["2", "3.5"]
    page.select_option("#out select.sv-filter-speaker", "left")
    assert shown() == ["3.5"]
    page.select_option("#out select.sv-filter-event", "")
    page.select_option("#out select.sv-filter-speaker", "")
    page.fill("#out input.sv-filter-search", "GREAT")
    assert shown() == ["2"]
    page.fill("#out input.sv-filter-search", "")
    assert shown() == ["0", "2", "3.5"] and page.locator("#out .sv-filter-count").inner_text() == ""


def test_filters_stay_fast_with_thousands_of_segments(page):
    page.evaluate("(j) => { window.__job = j; }", long_job(3000))
    page.evaluate("window.SenseVoiceReview.render(document.getElementById('out'), window.__job, {})")
    ms = page.evaluate(
        "() => { const s = document.querySelector('#out input.sv-filter-search');"
        " const t0 = performance.now();"
        " for (const q of ['s', 'se', 'seg', 'segment 29', 'segment 299', '']) {"
        "   s.value = q; s.dispatchEvent(new Event('input')); }"
        " document.body.offsetHeight; return performance.now() - t0; }")
    assert ms < 3000, ms  # a guard against quadratic work, not a benchmark
    page.fill("#out input.sv-filter-search", "segment 2999")
    assert page.locator("#out tr.sv-row:not([hidden])").count() == 1


def test_downloads_are_named_after_the_recording_with_the_speakers_names(page):
    on_origin(page)
    bodies = {
        "txt": "[00:00:00.000 - 00:00:02.000] left: [en] Thanks left: ok\nright: Ha\n",
        "srt": "1\n00:00:00,000 --> 00:00:02,000\nleft: Thanks\nright: Ha\n",
        "vtt": "WEBVTT\n\n00:00:00.000 --> 00:00:02.000\n<v left>Thanks</v>\n<v right>Ha</v>\n",
        "json": json.dumps({"id": "j1", "result": {"segments": [{"speaker": "left", "text": "x"},
                                                                {"speaker": "right", "text": "y"}]}}),
    }
    asked = []

    def result(route):
        asked.append(route.request.url)
        fmt = route.request.url.split("format=")[1].split("&")[0]
        route.fulfill(status=200, body=bodies[fmt], headers={
            "Content-Type": "text/plain; charset=utf-8",
            "Content-Disposition": f'attachment; filename="transcript-j1.{fmt}"'})

    page.route(f"{HOST}/api/jobs/j1/result**", result)
    render(page, JOB, {"audioUrl": AUDIO, "exportBase": f"{HOST}/api/jobs"})
    page.locator("#out input.sv-speaker-name").nth(0).fill("right")  # swapped names stay swapped
    page.locator("#out input.sv-speaker-name").nth(1).fill("Customer")
    got = {}
    for fmt in ("txt", "srt", "vtt", "json"):
        with page.expect_download() as d:
            page.locator(f"#out a.sv-export[data-format={fmt}]").click()
        assert d.value.suggested_filename == f"call.{fmt}"
        got[fmt] = Path(d.value.path()).read_text(encoding="utf-8")
    assert got["txt"] == ("[00:00:00.000 - 00:00:02.000] right: [en] Thanks left: ok\n"
                          "Customer: Ha\n")
    assert got["srt"] == "1\n00:00:00,000 --> 00:00:02,000\nright: Thanks\nCustomer: Ha\n"
    assert "<v right>Thanks</v>\n<v Customer>Ha</v>" in got["vtt"]
    assert [s["speaker"] for s in json.loads(got["json"])["result"]["segments"]] == [
        "right", "Customer"]
    # tags in subtitles: off by default (the server's default for srt/vtt); on asks for them
    box = page.locator("#out .sv-export-tags input")
    assert not box.is_checked()
    box.check()
    hrefs = page.eval_on_selector_all("#out a.sv-export", "as => as.map(a => a.getAttribute('href'))")
    assert [h.endswith("&tags=true") for h in hrefs] == [False, False, True, True]  # subtitles
    with page.expect_download():
        page.locator("#out a.sv-export[data-format=srt]").click()
    assert asked[-1].endswith("format=srt&tags=true")
    box.uncheck()
    assert not any("tags=" in h for h in page.eval_on_selector_all(
        "#out a.sv-export", "as => as.map(a => a.getAttribute('href'))"))
    page.unroute(f"{HOST}/api/jobs/j1/result**")


@pytest.mark.parametrize("name,expected", [
    ("call.wav", "call.srt"), ("meeting 2026-01-05.final.mp4", "meeting 2026-01-05.final.srt"),
    ("", "transcript-j1.srt"), ("a<b>:c?.mkv", "a b c.srt"), ("..", "transcript-j1.srt"),
    ("no-extension", "no-extension.srt")])  # fmt: skip
def test_export_name(page, name, expected):
    assert page.evaluate("([n]) => window.SenseVoiceReview.exportName({id: 'j1', filename: n},"
                         " 'srt')", [name]) == expected


def test_rename_speakers_leaves_the_text_alone(page):
    rename = "([f, t, n]) => window.SenseVoiceReview.renameSpeakers(f, t, n)"
    txt = "left: he said left: hi\n[00:00:01.000 - 00:00:02.000] left: x\nleftover: y\n"
    assert page.evaluate(rename, ["txt", txt, {"left": "A&B <x>"}]) == (
        "A&B <x>: he said left: hi\n[00:00:01.000 - 00:00:02.000] A&B <x>: x\nleftover: y\n")
    assert page.evaluate(rename, ["vtt", "<v left>a</v>", {"left": "A&B <x>"}]) == (
        "<v A&amp;B &lt;x&gt;>a</v>")
    assert page.evaluate(rename, ["srt", "1\nleft: a\n", {"left": "two\nlines --> here"}]) == (
        "1\ntwo lines -> here: a\n")
    assert page.evaluate(rename, ["srt", "left: a\n", {}]) == "left: a\n"
    assert page.evaluate(rename, ["json", "{not json", {"left": "A"}]) == "{not json"


def test_untimed_sub_segments_share_their_piece(page):
    """A VAD piece (2-8 s) in which the model started three segments: each gets a share of the
    piece by its text length (marked approximate), not the whole piece."""
    base = {"language": "en", "emotion": "NEUTRAL", "events": [], "itn": "withitn",
            "start": 2.0, "end": 8.0, "speaker": "left"}
    segs = [dict(base, text="a" * 10), dict(base, text="b" * 20), dict(base, text="c" * 30),
            dict(base, text="next piece", start=8.0, end=9.0)]
    render(page, dict(JOB, audio_seconds=10, result={"text": "", "raw_text": "", "segments": segs}))
    rows = page.eval_on_selector_all(
        "#out tr.sv-row", "rs => rs.map(r => [+r.getAttribute('data-start'), +r.getAttribute('data-end')])")
    assert rows == [[2, 3], [3, 5], [5, 8], [8, 9]]
    times = texts(page, "#out td.sv-col-time")
    assert [t.startswith("≈") for t in times] == [True, True, True, False]


def test_narrow_view_stacks_rows_text_first(page):
    page.set_viewport_size({"width": 390, "height": 844})
    try:
        segs = [dict(s, text=s["text"] + " " + "a long sentence that wraps " * 4) for s in SEGMENTS]
        render(page, dict(JOB, result={"text": "", "raw_text": "", "segments": segs}))
        wrap = page.eval_on_selector("#out .sv-table-wrap", "w => [w.scrollWidth, w.clientWidth]")
        assert wrap[0] <= wrap[1], wrap  # no horizontal scrolling inside the table
        assert page.evaluate("document.documentElement.scrollWidth") <= 390
        box = page.eval_on_selector("#out .sv-table-wrap", "w => w.getBoundingClientRect().toJSON()")
        for cell in page.eval_on_selector_all(
                "#out tr.sv-row td.sv-col-text", "cs => cs.map(c => c.getBoundingClientRect().toJSON())"):
            assert box["left"] <= cell["left"] and cell["right"] <= box["right"] + 0.5
        first = page.eval_on_selector(
            "#out tr.sv-row", "r => [r.querySelector('.sv-col-text').getBoundingClientRect().top,"
            " r.querySelector('.sv-col-time').getBoundingClientRect().top]")
        assert first[0] < first[1]  # the text first
        assert page.eval_on_selector("#out thead", "t => t.getBoundingClientRect().height") <= 1
    finally:
        page.set_viewport_size({"width": 1280, "height": 720})


def test_words_follow_the_page_language(page):
    page.evaluate("window.SenseVoiceI18n = {lang: () => 'zh'}")
    render(page, JOB)
    assert texts(page, "#out thead th") == ["时间", "说话人", "语种", "情绪", "事件", "文字"]
    assert texts(page, "#out .sv-exports .sv-sum-heading") == ["下载"]
    page.evaluate("delete window.SenseVoiceI18n")
    render(page, JOB)
    assert texts(page, "#out thead th")[0] == "Time"


def test_timeline_labels_do_not_overlap_on_a_phone(page):
    """Issue 23: at 390 px the axis held 8 labels and they ran together ("00:0000:05")."""
    page.set_viewport_size({"width": 390, "height": 844})
    page.set_content(PAGE)
    render(page, JOB)
    boxes = page.eval_on_selector_all(
        "#out .sv-tl-tick", "ts => ts.map(t => t.getBoundingClientRect().toJSON())")
    assert 2 <= len(boxes) <= 5, boxes
    for a, b in zip(boxes, boxes[1:]):
        assert a["right"] + 4 <= b["left"], (a, b)
    page.set_viewport_size({"width": 1280, "height": 800})
    page.set_content(PAGE)
    render(page, JOB)
    assert page.locator("#out .sv-tl-tick").count() == 7  # 0..6 s, one a second, on a desktop


def test_header_length_rounds_as_the_state_line_does(page):
    """Issue 23: the header said 09:18 where the state said 9 min 19 s (558.6 s)."""
    render(page, {**JOB, "audio_seconds": 558.6})
    assert page.locator("#out .sv-review-meta").inner_text().startswith("09:19")


def test_no_speaker_column_for_one_unnamed_speaker(page):
    """Issue 23: a one-speaker file showed a Speaker column of dashes."""
    mono = [{**seg, "speaker": None} for seg in SEGMENTS]
    render(page, {**JOB, "result": {**JOB["result"], "segments": mono}})
    assert page.locator("#out th.sv-col-speaker").is_hidden()
    assert all(page.locator("#out td.sv-col-speaker").nth(i).is_hidden()
               for i in range(page.locator("#out td.sv-col-speaker").count()))
    text = page.locator("#out tr.sv-row td.sv-col-text").first.bounding_box()
    time = page.locator("#out tr.sv-row td.sv-col-time").first.bounding_box()
    assert text["width"] > 100 and time["width"] > 50  # the grid has no empty column
    page.set_content(PAGE)
    render(page, JOB)
    assert page.locator("#out th.sv-col-speaker").is_visible()
