"""static/live.js and static/live-worklet.js (the page's Live captions) in headless Debian chromium:
the pure helpers (downsampling, WAV header, URL, protocol, words), then the panel's behaviour on a
stand-in page whose WebSocket /api/stream is played by the test (page.route_web_socket) and whose
microphone is Chromium's fake device. The real server end to end: tests/test_browser_live.py."""

from __future__ import annotations

import io
import json
import wave
from pathlib import Path

import numpy as np
import pytest

from pipeline.web.vocab import vocab_script

from tests.conftest import CHROMIUM_ARGS

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "static"
LIVE_JS = (STATIC / "live.js").read_text(encoding="utf-8")
WORKLET_JS = (STATIC / "live-worklet.js").read_text(encoding="utf-8")
SCRIPTS = vocab_script() + "".join(f"<script>{(STATIC / n).read_text(encoding='utf-8')}</script>"
                                   for n in ("richtext.js", "review.js", "app.js", "live-worklet.js",
                                             "live.js"))
SHEETS = "".join(f"<style>{(STATIC / n).read_text(encoding='utf-8')}</style>"
                 for n in ("style.css", "review.css", "app.css", "live.css"))
HOST = "https://app.test"  # a secure context: the page may ask for the microphone
PAGE = (
    "<html><head><meta name=viewport content='width=device-width, initial-scale=1'>"
    f"{SHEETS}{SCRIPTS}</head><body>"
    "<div id=sv-topbar></div><div id=sv-modes></div>"
    "<div id=sv-audio><input type=file accept='audio/*'></div><div id=sv-live></div>"
    "<button id=sv-submit>Transcribe</button>"
    "<div id=sv-live-transcript></div>"
    "<div id=sv-state-view></div><div id=sv-result></div><div id=sv-review></div>"
    "<div id=sv-recent></div></body></html>"
)
XSS = "<img src=x onerror=window.__xss=1>"
CONFIG = {"streamPath": "/api/stream", "uploadPath": "/ui/gradio_api/upload",
          "submitPath": "/ui/gradio_api/run/submit", "keepSeconds": 2}

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} missing"),
]


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Chromium with its fake microphone, granted without a prompt, playing a 440 Hz tone (48 kHz,
    looped)."""
    from playwright.sync_api import sync_playwright

    tone = tmp_path_factory.mktemp("mic") / "tone.wav"
    t = np.arange(48000 * 3) / 48000
    with wave.open(str(tone), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(48000)
        w.writeframes((np.sin(2 * np.pi * 440 * t) * 12000).astype("<i2").tobytes())
    args = CHROMIUM_ARGS + ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                            f"--use-file-for-fake-audio-capture={tone}",
                            "--autoplay-policy=no-user-gesture-required"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=args)
        yield b
        b.close()


class Stream:
    """The test's side of the page's WebSocket: what the page sent; ``ws`` to answer it."""

    def __init__(self):
        self.ws = None
        self.urls: list[str] = []
        self.frames: list[bytes] = []
        self.texts: list[str] = []
        self.on_end = None  # called with the socket when the page sends {"type": "end"}
        self.on_open = None  # called with the socket instead of taking the stream (a refusal)

    def accept(self, ws):
        self.ws = ws
        self.urls.append(ws.url)
        if self.on_open:
            return self.on_open(ws)
        ws.on_message(self.message)

    def message(self, m):
        if isinstance(m, (bytes, bytearray)):
            self.frames.append(bytes(m))
            return
        self.texts.append(m)
        if json.loads(m).get("type") == "end" and self.on_end:
            self.on_end(self.ws)

    def send(self, **msg):
        self.ws.send(json.dumps(msg))


@pytest.fixture(scope="module")
def _tab(browser):
    pg = browser.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.posts = []

    def serve(route):
        url = route.request.url
        path = url[len(HOST):].split("?")[0]
        if path == "/ui/":
            return route.fulfill(status=200, body=PAGE, headers={"Content-Type": "text/html"})
        if route.request.method == "POST":
            pg.posts.append((path, route.request.post_data_buffer))
            return pg.answer(route, path)
        return route.fulfill(status=404, body="", headers={"Content-Type": "text/plain"})

    pg.route(f"{HOST}/**", serve)
    pg.route_web_socket("wss://app.test/api/stream**", lambda ws: pg.stream.accept(ws))
    yield pg
    pg.close()


@pytest.fixture
def page(_tab):
    _tab.stream = Stream()
    _tab.goto(f"{HOST}/ui/")
    _tab.evaluate("localStorage.clear()")
    _tab.goto(f"{HOST}/ui/")
    _tab.evaluate("([c]) => { window.SenseVoiceApp.boot(); window.SenseVoiceLive.boot(c,"
                  " {language: 'en', useItn: false}); }", [CONFIG])
    _tab.errors.clear()
    _tab.posts.clear()
    _tab.answer = lambda route, path: route.fulfill(status=500, body="{}")
    yield _tab
    _tab.evaluate("window.SenseVoiceLive.stop()")
    assert _tab.errors == [], _tab.errors


def live(page, expr: str, *args):
    return page.evaluate(f"(a) => window.SenseVoiceLive.{expr}", list(args) if args else None)


def panel(page) -> str:
    return page.locator("#sv-live").inner_text()


def listening(page):
    page.locator("#sv-live .sv-live-toggle").click()
    page.wait_for_selector("#sv-live [data-phase=listening]", timeout=15_000)
    page.wait_for_function("() => window.SenseVoiceLive.session().sentSamples > 3200", timeout=15_000)


# ---- the source ----


@pytest.mark.parametrize("src", [LIVE_JS, WORKLET_JS], ids=["live.js", "live-worklet.js"])
def test_source_is_ascii_and_builds_no_markup(src):
    assert src.isascii()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "Function(", "setHTML"):
        assert sink not in src, sink


# ---- pure helpers ----


def resample(page, rate: int, freq: float, seconds: float = 1.0, block: int = 128) -> np.ndarray:
    got = page.evaluate("""([rate, freq, seconds, block]) => {
      const R = new window.SenseVoiceLiveWorklet.Resampler(rate, 16000);
      const n = Math.round(rate * seconds); const out = [];
      for (let at = 0; at < n; at += block) {
        const b = new Float32Array(Math.min(block, n - at));
        for (let i = 0; i < b.length; i++) b[i] = 0.8 * Math.sin(2 * Math.PI * freq * (at + i) / rate);
        out.push(...R.push(b));
      }
      return out; }""", [rate, freq, seconds, block])
    return np.array(got)


@pytest.mark.parametrize("rate", [48000, 44100, 16000])
def test_the_worklet_downsamples_to_16k_without_aliasing(page, rate):
    tone = resample(page, rate, 440.0)
    assert abs(len(tone) - 16000) <= 2  # 1 s in, 1 s out, in any block size
    body = tone[200:-200]
    assert 0.75 < np.abs(body).max() < 0.85  # the speech band passes at its level
    crossings = np.count_nonzero(np.diff(np.signbit(body)))
    assert abs(crossings / 2 / (len(body) / 16000) - 440) < 5  # the same pitch
    if rate > 16000:  # a tone above 8 kHz would fold into the speech band: filtered out
        assert np.abs(resample(page, rate, 12000.0)[200:-200]).max() < 0.05


def test_pcm16_is_little_endian_and_clipped(page):
    got = page.evaluate("() => Array.from(new Uint8Array(window.SenseVoiceLiveWorklet.toPcm16("
                        "[0, 1, -1, 2, -2, 0.5, NaN])))")
    assert np.frombuffer(bytes(got), "<i2").tolist() == [0, 32767, -32768, 32767, -32768, 16384, 0]


def test_wav_header_makes_a_wav_python_reads(page):
    got = page.evaluate("""() => {
      const h = new Uint8Array(window.SenseVoiceLive.wavHeader(3, 16000));
      return Array.from(h).concat([1, 0, 2, 0, 255, 255]); }""")
    with wave.open(io.BytesIO(bytes(got))) as w:
        assert (w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()) == (1, 2, 16000, 3)
        assert np.frombuffer(w.readframes(3), "<i2").tolist() == [1, 2, -1]


def test_stream_url(page):
    loc = {"protocol": "https:", "host": "h.example:8443"}
    assert live(page, "streamUrl(a[0], a[1], a[2])", loc, "/api/stream",
                {"language": "zh", "useItn": False}) == (
        "wss://h.example:8443/api/stream?language=zh&use_itn=false&sample_rate=16000")
    plain = dict(loc, protocol="http:")
    assert live(page, "streamUrl(a[0], a[1], a[2], a[3])", plain, "//evil.example/x",
                {"language": "en&x=1"}, "exp=1&sig=a-b_c") == (
        "ws://h.example:8443/api/stream?language=auto&use_itn=true&sample_rate=16000&exp=1&sig=a-b_c")
    assert live(page, "streamUrl(a[0], a[1], a[2], a[3])", plain, "/api/stream", {}, "a=<b>").endswith(
        "sample_rate=16000")


def test_messages_partial_replaced_final_settles(page):
    got = page.evaluate("""() => {
      const L = window.SenseVoiceLive; const m = {finals: [], partial: null, error: null}; const seen = [];
      seen.push(L.applyMessage(m, {type: 'partial', text: 'hel', raw_text: '<|en|>hel', start: 0, end: 0.5}));
      seen.push(L.applyMessage(m, {type: 'partial', text: 'hello', raw_text: '<|en|>hello', start: 0,
                                   end: 0.9}));
      const p = m.partial.text;
      seen.push(L.applyMessage(m, {type: 'final', text: 'hello.', raw_text: '<|en|>hello.', start: 0,
                                   end: 1.1, segment: {language: 'en'}}));
      seen.push(L.applyMessage(m, {type: 'weird'}), L.applyMessage(m, null));
      seen.push(L.applyMessage(m, {type: 'error', code: 'too_many_streams', message: 'x', retry_after: 3}));
      return {seen, p, m}; }""")
    assert got["seen"] == ["partial", "partial", "final", None, None, "error"]
    assert got["p"] == "hello"
    m = got["m"]
    assert m["partial"] is None and [f["text"] for f in m["finals"]] == ["hello."]
    assert m["finals"][0]["end"] == 1.1 and m["finals"][0]["segment"] == {"language": "en"}
    assert m["error"] == {"code": "too_many_streams", "message": "x", "retry_after": 3}


@pytest.mark.parametrize("code,err,opened,stopping,why", [
    (1000, None, True, True, None), (1005, None, True, True, None),
    (1000, None, True, False, "ended"), (1006, None, True, False, "lost"),
    (1006, None, True, True, "lost"), (1006, None, False, False, "connect"),
    (1013, None, True, False, "busy"), (1008, None, True, False, "refused"),
    (1011, None, True, False, "other"), (1013, {"code": "too_many_streams"}, True, False, "too_many_streams"),
    (1000, {"code": "not_ready"}, True, True, "not_ready"),
])  # fmt: skip
def test_why_a_stream_ended(page, code, err, opened, stopping, why):
    assert live(page, "closeReason(a[0], a[1], a[2], a[3])", code, err, opened, stopping) == why


def test_words(page):
    assert live(page, "errorText(a[0])", {"code": "too_many_streams"})["title"] == (
        "Too many live captions are running on this server")
    busy = live(page, "errorText(a[0])", {"code": "queue_full", "retry_after": 7})
    assert busy["code"] == "busy" and busy["hint"] == "Try again in 7 s."
    other = live(page, "errorText(a[0])", {"code": "Traceback <b>", "message": "libfoo"})
    assert other["code"] == "other" and "libfoo" not in json.dumps(other)
    assert [live(page, "clock(a[0])", s) for s in (0, 9.9, 75, 3725)] == ["0:00", "0:09", "1:15", "1:02:05"]
    assert [live(page, "limitText(a[0])", s) for s in (45, 1800, 7200, 5400)] == [
        "45 s", "30 min", "2 h", "1 h 30 min"]
    assert live(page, "recordingName(new Date(2026, 0, 2, 3, 4, 5))") == "live-2026-01-02-030405.wav"
    for name, code in (("NotAllowedError", "mic_denied"), ("NotFoundError", "mic_missing"),
                       ("NotReadableError", "mic_busy"), ("TypeError", "other")):
        assert page.evaluate("(n) => window.SenseVoiceLive.micError({name: n})", name) == code
    assert live(page, "describe(a[0])", {"phase": "connecting"})["title"] == (
        "Waiting for the microphone\u2026")
    assert live(page, "describe(a[0])", {"phase": "stopped", "seconds": 65})["detail"] == "1:05 recorded"


def test_every_word_has_its_chinese(page):
    words = page.evaluate("window.SenseVoiceLive.words")
    assert set(words["en"]) == set(words["zh"])
    for key, en in words["en"].items():
        assert isinstance(words["zh"][key], type(en)), key


# ---- the panel ----


def test_the_mode_switch_swaps_the_input(page):
    assert live(page, "mode()") == "file"
    assert page.locator("#sv-live").is_hidden() and page.locator("#sv-audio").is_visible()
    page.locator("#sv-modes .sv-mode[data-mode=live]").click()
    assert live(page, "mode()") == "live"
    assert page.locator("#sv-live .sv-live-toggle").is_visible()
    assert page.locator("#sv-audio").is_hidden() and page.locator("#sv-state-view").is_hidden()
    assert "The first 2 s of a live recording can be saved as a job" in panel(page)
    assert page.evaluate("location.search") == "?mode=live"  # a reload stays in Live
    page.locator("#sv-modes .sv-mode[data-mode=file]").click()
    assert page.locator("#sv-live").is_hidden()
    assert page.evaluate("location.search") == ""


def test_live_in_the_url_opens_live(page):
    page.goto(f"{HOST}/ui/?mode=live")
    page.evaluate("([c]) => window.SenseVoiceLive.boot(c)", [CONFIG])
    assert live(page, "mode()") == "live"


def test_a_live_session_partials_finals_stop_and_the_sent_audio(page):
    page.locator("#sv-modes .sv-mode[data-mode=live]").click()
    listening(page)
    s = page.stream
    assert s.urls == ["wss://app.test/api/stream?language=en&use_itn=false&sample_rate=16000"]
    assert "Listening" in panel(page)
    assert page.locator("#sv-live .sv-live-toggle").inner_text().strip() == "Stop"
    s.send(type="partial", text="hel" + XSS, raw_text="<|en|><|NEUTRAL|><|Speech|><|woitn|>hel" + XSS,
           start=0.0, end=0.5)
    partial = page.locator("#sv-live-transcript .sv-live-partial")
    partial.wait_for()
    assert XSS in partial.inner_text()
    assert partial.evaluate("e => getComputedStyle(e.querySelector('.sv-seg')).fontStyle") == "italic"
    s.send(type="partial", text="hello", raw_text="<|en|><|NEUTRAL|><|Speech|><|woitn|>hello",
           start=0.0, end=0.9)
    page.wait_for_function("() => document.querySelector('#sv-live-transcript .sv-live-partial .sv-text')"
                           ".textContent === 'hello'")
    assert partial.count() == 1  # replaced in place
    s.send(type="final", text="hello there", raw_text="<|en|><|HAPPY|><|Laughter|><|woitn|>hello there",
           start=0.0, end=1.2, segment={"language": "en", "emotion": "HAPPY", "events": ["Laughter"]})
    final = page.locator("#sv-live-transcript .sv-live-final")
    final.wait_for()
    assert partial.count() == 0
    assert final.locator(".sv-lang").inner_text().strip() == "English"
    assert final.locator(".sv-chip.sv-emo").count() == 1 and final.locator(".sv-chip.sv-event").count() == 1
    assert final.locator(".sv-live-time").inner_text() == "0:00"
    s.send(type="partial", text="and", raw_text="<|en|>and", start=1.5, end=1.8)
    partial.wait_for()
    # stop: the page sends "end"; the server answers the last final and closes with 1000
    last = {"type": "final", "text": "and more", "raw_text": "<|en|>and more", "start": 1.5,
            "end": 2.0, "segment": {}}
    s.on_end = lambda ws: (ws.send(json.dumps(last)), ws.close(code=1000))
    page.locator("#sv-live .sv-live-toggle").click()
    page.wait_for_selector("#sv-live [data-phase=stopped]", timeout=15_000)
    assert [json.loads(t) for t in s.texts] == [{"type": "end"}]
    assert final.count() == 2 and partial.count() == 0
    assert "Stopped" in panel(page)
    pcm = b"".join(s.frames)
    assert len(pcm) % 2 == 0 and all(len(f) % 2 == 0 for f in s.frames)
    session = live(page, "session()")
    assert session["sentSamples"] == len(pcm) // 2 > 3200
    assert session["keptSamples"] == min(len(pcm) // 2, 2 * 16000)  # CONFIG keeps 2 s
    samples = np.frombuffer(pcm, "<i2")
    assert np.abs(samples).max() > 5000  # the fake microphone's tone, not silence
    crossings = np.count_nonzero(np.diff(np.signbit(samples[1600:])))
    assert abs(crossings / 2 / ((len(samples) - 1600) / 16000) - 440) < 10  # at 16 kHz
    assert page.locator("#sv-live .sv-live-save").is_enabled()
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator("#sv-live-transcript img").count() == 0


def test_save_submits_the_kept_wav_through_the_ui_submit(page):
    view = {"id": "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d", "stage": "queued", "status": "queued",
            "filename": "live.wav", "created_at": 1.0, "links": {"page": ""}}

    def answer(route, path):
        if path.endswith("/upload"):
            return route.fulfill(status=200, json=["/data/ui-uploads/abc/live.wav"])
        return route.fulfill(status=200, json={"data": [None, "queued", json.dumps(view)]})

    page.answer = answer
    page.locator("#sv-modes .sv-mode[data-mode=live]").click()
    listening(page)
    page.stream.on_end = lambda ws: ws.close(code=1000)
    page.locator("#sv-live .sv-live-toggle").click()
    page.wait_for_selector("#sv-live [data-phase=stopped]", timeout=15_000)
    page.locator("#sv-live .sv-live-save").click()
    page.wait_for_function("() => window.SenseVoiceLive.session().savedAs.length > 10", timeout=15_000)
    assert live(page, "mode()") == "file"  # the job's views are there
    (up_path, up_body), (sub_path, sub_body) = page.posts
    assert (up_path, sub_path) == ("/ui/gradio_api/upload", "/ui/gradio_api/run/submit")
    wav = up_body[up_body.index(b"RIFF"):]
    with wave.open(io.BytesIO(wav)) as w:
        assert (w.getframerate(), w.getnchannels(), w.getsampwidth()) == (16000, 1, 2)
        assert w.getnframes() == live(page, "session()")["keptSamples"] <= 2 * 16000
    assert b'filename="live-' in up_body
    data = json.loads(sub_body)["data"]
    assert data[0]["path"] == "/data/ui-uploads/abc/live.wav" and data[1:] == ["en", False, False, ""]  # language, itn, split, hotwords (ui.py inputs)
    assert page.evaluate("location.search") == f"?job={view['id']}"
    assert page.locator("#sv-live .sv-live-save").is_disabled()


def test_save_refused_is_said_by_the_job_view(page):
    page.answer = lambda route, path: route.fulfill(
        status=413, json={"error": {"code": "upload_too_large", "message": "x"}})
    page.locator("#sv-modes .sv-mode[data-mode=live]").click()
    listening(page)
    page.stream.on_end = lambda ws: ws.close(code=1000)
    page.locator("#sv-live .sv-live-toggle").click()
    page.wait_for_selector("#sv-live [data-phase=stopped]", timeout=15_000)
    page.locator("#sv-live .sv-live-save").click()
    page.wait_for_selector("#sv-state-view .sv-state-error")
    assert "The file is too large" in page.locator("#sv-state-view").inner_text()
    assert page.locator("#sv-live .sv-live-save").is_enabled()  # may be tried again


def test_a_refusal_is_an_error_in_plain_words(page):
    def refuse(ws):
        ws.send(json.dumps({"type": "error", "code": "too_many_streams", "message": XSS}))
        ws.close(code=1013)

    page.stream.on_open = refuse
    page.locator("#sv-modes .sv-mode[data-mode=live]").click()
    page.locator("#sv-live .sv-live-toggle").click()
    box = page.locator("#sv-live .sv-state-error")
    box.wait_for(timeout=15_000)
    assert "Too many live captions are running on this server" in box.inner_text()
    assert "Try again in a minute" in box.inner_text()
    assert XSS not in panel(page)  # the server's own message is not shown (worded from the code)
    assert box.get_attribute("role") == "alert"
    assert page.eval_on_selector("#sv-live .sv-state-error .sv-state-title",
                                 "e => getComputedStyle(e).color") == "rgb(220, 38, 38)"
    assert page.locator("#sv-live .sv-live-toggle").inner_text().strip() == "Start live captions"
    assert live(page, "session()")["mic"] is True
    assert page.locator("#sv-live .sv-live-save").count() == 0  # refused as it opened: nothing to save
    page.wait_for_function("() => !window.SenseVoiceLive.session().sampleRate")  # audio released


def test_a_blocked_microphone_says_what_to_do(page):
    page.evaluate("() => { navigator.mediaDevices.getUserMedia = () => Promise.reject("
                  "new DOMException('denied', 'NotAllowedError')); }")
    page.locator("#sv-modes .sv-mode[data-mode=live]").click()
    page.locator("#sv-live .sv-live-toggle").click()
    page.wait_for_selector("#sv-live .sv-state-error")
    assert "The microphone is blocked" in panel(page)
    assert "Allow this page to use the microphone" in panel(page)
    assert page.stream.urls == []  # no stream without a microphone


def test_a_lost_connection_keeps_the_transcript(page):
    page.locator("#sv-modes .sv-mode[data-mode=live]").click()
    listening(page)
    page.stream.send(type="final", text="kept", raw_text="<|en|>kept", start=0, end=1)
    page.wait_for_selector("#sv-live-transcript .sv-live-final")
    page.stream.send(type="partial", text="lost", raw_text="<|en|>lost", start=1, end=2)
    page.wait_for_selector("#sv-live-transcript .sv-live-partial")
    page.stream.ws.close(code=1011)
    page.wait_for_selector("#sv-live .sv-state-error")
    assert "Live captions stopped" in panel(page)
    assert page.locator("#sv-live-transcript .sv-live-final").inner_text().endswith("kept")
    assert page.locator("#sv-live-transcript .sv-live-partial").count() == 0  # never settled
    assert page.locator("#sv-live .sv-live-save").is_enabled()  # what was recorded can be saved


def test_chinese_words_when_chosen(page):
    page.evaluate("localStorage.setItem('sv-lang', 'zh')")
    page.goto(f"{HOST}/ui/")
    page.evaluate("([c]) => { window.SenseVoiceApp.boot(); window.SenseVoiceLive.boot(c); }", [CONFIG])
    try:
        assert page.locator("#sv-modes .sv-mode[data-mode=live]").inner_text().strip() == "\u5b9e\u65f6"
        page.locator("#sv-modes .sv-mode[data-mode=live]").click()
        start = page.locator("#sv-live .sv-live-toggle").inner_text().strip()
        assert start == "\u5f00\u59cb\u5b9e\u65f6\u5b57\u5e55"  # 开始实时字幕
    finally:
        page.evaluate("localStorage.removeItem('sv-lang')")


def test_a_phone_fits(browser):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    pg = ctx.new_page()
    try:
        pg.route(f"{HOST}/**", lambda route: route.fulfill(status=200, body=PAGE,
                                                           headers={"Content-Type": "text/html"}))
        pg.goto(f"{HOST}/ui/?mode=live")
        pg.evaluate("([c]) => window.SenseVoiceLive.boot(c)", [CONFIG])
        assert pg.evaluate("document.documentElement.scrollWidth") <= 390
        box = pg.locator("#sv-live .sv-live-toggle").bounding_box()
        assert box["width"] > 300 and box["height"] >= 44  # a thumb's target
    finally:
        ctx.close()


def test_stop_while_the_microphone_is_asked_for(page):
    page.evaluate("() => { window.__grant = null; navigator.mediaDevices.getUserMedia = () =>"
                  " new Promise((ok) => { window.__grant = ok; }); }")
    page.locator("#sv-modes .sv-mode[data-mode=live]").click()
    page.locator("#sv-live .sv-live-toggle").click()
    page.wait_for_selector("#sv-live [data-phase=connecting]")
    assert "Waiting for the microphone" in panel(page)
    page.locator("#sv-live .sv-live-toggle").click()  # Stop
    page.wait_for_selector("#sv-live [data-phase=stopped]")
    # the browser grants it late: the microphone is closed at once, nothing is streamed
    page.evaluate("""async () => {
      const ctx = new AudioContext(); const dst = ctx.createMediaStreamDestination();
      window.__late = dst.stream; window.__grant(dst.stream); }""")
    page.wait_for_function("() => window.__late.getTracks().every(t => t.readyState === 'ended')")
    page.wait_for_timeout(200)
    assert page.stream.urls == [] and live(page, "session()")["phase"] == "stopped"
    assert page.locator("#sv-live .sv-live-save").count() == 0
