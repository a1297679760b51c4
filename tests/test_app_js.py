"""static/app.js (the page between the Submit click and the result) in headless Debian chromium:
its pure helpers, then its behaviour on a stand-in page with the elements the Gradio page has,
served from a fake origin whose job event streams are canned (page.route)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipeline.web.vocab import vocab_script

CHROMIUM = Path("/usr/bin/chromium")
ROOT = Path(__file__).resolve().parent.parent
STATIC = ROOT / "static"
APP_JS = (STATIC / "app.js").read_text(encoding="utf-8")
SCRIPTS = vocab_script() + "".join(f"<script>{(STATIC / n).read_text(encoding='utf-8')}</script>"
                                   for n in ("richtext.js", "review.js", "app.js"))
SHEETS = "".join(f"<style>{(STATIC / n).read_text(encoding='utf-8')}</style>"
                 for n in ("style.css", "review.css", "app.css"))
HOST = "http://app.test"
PAGE = (
    f"<html><head>{SHEETS}{SCRIPTS}</head><body>"
    "<div id=sv-topbar></div>"
    "<div id=sv-audio><input type=file accept='audio/*'></div>"
    "<button id=sv-submit>Transcribe</button>"
    "<div id=sv-state-view></div><div id=sv-result></div><div id=sv-review></div>"
    "<div id=sv-recent></div></body></html>"
)
JOB_ID = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
XSS = "<img src=x onerror=window.__xss=1>"

pytestmark = [
    pytest.mark.browser,
    pytest.mark.skipif(not CHROMIUM.exists(), reason=f"{CHROMIUM} missing"),
]


def view(stage: str, **kw) -> dict:
    base = {"id": JOB_ID, "status": {"done": "done", "failed": "failed"}.get(stage, "queued"),
            "stage": stage, "position": None, "percent": None, "pieces": None, "pieces_done": None,
            "filename": "call.wav", "created_at": 1_800_000_000.0, "finished_at": None,
            "audio_seconds": 5.0, "duration_s": None, "result": None, "error": None,
            "model": "ready", "links": {"events": f"/api/jobs/{JOB_ID}/events", "page": ""}}
    base.update(kw)
    return base


DONE = view("done", finished_at=1_800_000_000.4, duration_s=0.05,
            result={"text": "hello", "raw_text": "<|en|><|HAPPY|><|Speech|><|withitn|>hello",
                    "segments": [{"language": "en", "emotion": "HAPPY", "events": ["Speech"],
                                  "itn": "withitn", "text": "hello", "start": 0.0, "end": 5.0,
                                  "speaker": None}]},
            links={"audio": f"/api/jobs/{JOB_ID}/audio", "result": f"/api/jobs/{JOB_ID}/result",
                   "events": "", "page": ""})


def sse(*views: dict) -> str:
    return "".join(f"event: job\ndata: {json.dumps(v)}\n\n" for v in views)


@pytest.fixture(scope="module")
def _tab(browser):
    pg = browser.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    pg.streams = {}  # job id -> (status, body) of its events route
    pg.results = {}  # job id -> the JSON body of its result route (GET .../result)
    pg.hits = []

    def serve(route):
        url = route.request.url
        pg.hits.append(url)
        path = url[len(HOST):].split("?")[0]
        if path == "/ui/":
            return route.fulfill(status=200, body=PAGE, headers={"Content-Type": "text/html"})
        if path.startswith("/api/jobs/") and path.endswith("/events"):
            jid = path.split("/")[3]
            status, body = pg.streams.get(jid, (404, json.dumps(
                {"error": {"code": "job_not_found", "message": "no such job"}})))
            ctype = "text/event-stream" if status == 200 else "application/json"
            return route.fulfill(status=status, body=body, headers={"Content-Type": ctype})
        if path.startswith("/api/jobs/") and path.endswith("/result") and path.split("/")[3] in pg.results:
            return route.fulfill(status=200, body=json.dumps(pg.results[path.split("/")[3]]),
                                 headers={"Content-Type": "application/json"})
        return route.fulfill(status=404, body="", headers={"Content-Type": "text/plain"})

    pg.route(f"{HOST}/**", serve)
    yield pg
    pg.close()


@pytest.fixture
def page(_tab):
    _tab.goto(f"{HOST}/ui/")
    _tab.evaluate("localStorage.clear()")
    _tab.goto(f"{HOST}/ui/")
    _tab.evaluate("window.SenseVoiceApp.boot()")
    _tab.errors.clear()
    _tab.hits.clear()
    _tab.streams.clear()
    _tab.results.clear()
    yield _tab
    assert _tab.errors == [], _tab.errors


def app(page, expr: str, *args):
    return page.evaluate(f"(a) => window.SenseVoiceApp.{expr}", list(args) if args else None)


def state_text(page) -> str:
    return page.locator("#sv-state-view").inner_text()


# ---- the source ----


def test_source_is_ascii_and_builds_no_markup():
    assert APP_JS.isascii()
    for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(",
                 "Function(", "setHTML"):
        assert sink not in APP_JS, sink


# ---- pure helpers ----


def test_parse_sse_keeps_the_unfinished_tail(page):
    got = app(page, "parseSSE(a[0])", 'event: job\ndata: {"a":1}\n\n: keep-alive\n\nevent: jo')
    assert got == {"events": [{"event": "job", "data": '{"a":1}'}], "rest": "event: jo"}
    got = app(page, "parseSSE(a[0])", "data: x\r\ndata: y\r\n\r\nevent: error\ndata: {}\n\n")
    assert got["events"] == [{"event": "message", "data": "x\ny"}, {"event": "error", "data": "{}"}]
    assert got["rest"] == ""
    assert app(page, "parseSSE(a[0])", ": only a comment\n\n") == {"events": [], "rest": ""}


@pytest.mark.parametrize("query,ok", [
    ("exp=1800000000&sig=abc_DEF-123", True), ("?exp=1&sig=x", True), ("", False),
    ("exp=1&sig=x&job=y", False), ("exp=1&sig=<b>", False), ("exp=x&sig=y", False),
    ("sig=x&exp=1", False), ("exp=1&sig=" + "a" * 65, False)])  # fmt: skip
def test_page_query_takes_only_a_well_formed_signature(page, query, ok):
    assert app(page, "pageQuery(a[0])", query) == (query.lstrip("?") if ok else "")


def test_job_in_the_url(page):
    assert app(page, "jobFromSearch(a[0])", f"?job={JOB_ID}&exp=17&sig=abc") == {
        "id": JOB_ID, "query": "exp=17&sig=abc"}
    assert app(page, "jobFromSearch(a[0])", f"?job={JOB_ID}") == {"id": JOB_ID, "query": ""}
    for bad in ("?job=../x", "?job=", "", "?job=a%3Cb", "?job=" + "a" * 80):
        assert app(page, "jobFromSearch(a[0])", bad) is None, bad
    assert app(page, "searchWithJob(a[0], a[1], a[2])", "?__theme=dark&job=old", "n1",
               "exp=1&sig=s") == "?job=n1&exp=1&sig=s&__theme=dark"
    assert app(page, "searchWithJob(a[0], a[1], a[2])", "?job=old&exp=1&sig=s", "", "") == ""
    assert app(page, "searchWithJob(a[0], a[1], a[2])", "", "a b", "bad") == "?job=a%20b"


def test_words_helpers(page):
    assert app(page, "shortId(a[0])", JOB_ID) == "0b1c2d3e"
    assert [app(page, "formatSeconds(a[0])", s) for s in (0.2149, 12.34, 75.2, 3599.7, -1)] == [
        "0.21 s", "12.3 s", "1 min 15 s", "60 min 00 s", ""]
    assert app(page, "errorText(a[0])", {"code": "no_audio_stream", "message": "x"})["title"] == (
        "This file has no audio track")
    busy = app(page, "errorText(a[0])", {"code": "queue_full", "retry_after": 3})
    assert busy["title"] == "The server is busy" and busy["hint"] == "Try again in 3 s."
    assert app(page, "errorText(a[0])", {"code": "decode_timeout"})["code"] == "unsupported_media"
    other = app(page, "errorText(a[0])", {"code": "weird", "message": "Traceback: libfoo said no"})
    assert other["title"] == "The transcription failed" and "libfoo" not in other["hint"]
    # "too long" says the limit (issue 23), from the server's message
    long = app(page, "errorText(a[0])", {"code": "audio_too_long",
                                         "message": "the audio is longer than the 14400 s limit"})
    assert long["hint"] == "The limit here is 4 h: shorten it or split it, then try again."
    assert "90 s" in app(page, "errorText(a[0])", {"code": "audio_too_long",
                                                   "message": "longer than the 90 s limit"})["hint"]
    assert app(page, "errorText(a[0])", {"code": "audio_too_long"})["hint"] == (
        "Shorten it or split it, then try again.")


@pytest.mark.parametrize("v,title", [
    ({"stage": "loading", "position": 2}, "The model is loading: your job is number 2 in the queue"),
    ({"stage": "loading"}, "The model is loading: your job starts as soon as it is ready"),
    ({"stage": "queued", "position": 3}, "Queued: number 3 in the queue"),
    ({"stage": "segmenting", "percent": 26}, "Finding the speech in the recording\u2026 26 %"),
    ({"stage": "transcribing", "pieces": 17, "pieces_done": 4}, "Transcribing: 4 of 17 pieces done"),
    ({"stage": "transcribing"}, "Transcribing\u2026"),
    ({"stage": "done", "created_at": 10, "finished_at": 12.5}, "Done in 2.50 s"),
    ({"stage": "failed", "error": {"code": "job_purged"}}, "This job is no longer kept"),
])  # fmt: skip
def test_describe(page, v, title):
    d = app(page, "describe(a[0])", v)
    assert d["title"] == title
    assert d["kind"] == ("done" if v["stage"] == "done" else "error" if v["stage"] == "failed"
                         else "busy")
    assert "speech detected" not in json.dumps(d).lower()


def test_describe_done_counts_from_the_click(page):
    d = app(page, "describe(a[0], {wall: 0.183})", {"stage": "done", "created_at": 10,
                                                    "finished_at": 12.5, "audio_seconds": 5.0,
                                                    "duration_s": 0.04})
    assert d["title"] == "Done in 0.18 s"
    assert d["detail"] == "5.00 s of audio; 0.04 s of work on the server"


@pytest.mark.parametrize("got, announced, cut", [
    (0.16, 7.31, True), (7.31, 7.31, False), (7.0, 7.31, False), (6.7, 7.31, True),
    (0.16, float("nan"), False), (0.16, float("inf"), False), (0.16, 0, False), (None, 7.31, False)])
def test_truncated_is_the_clis_rule(page, got, announced, cut):
    """More than half a second short of what the file announces (decode.py's slack)."""
    assert app(page, "truncated(a[0], a[1])", got, announced) is cut


def wav_head(data_size: int, byte_rate: int = 32000, extra: bytes = b"") -> list[int]:
    fmt = (1).to_bytes(2, "little") + (1).to_bytes(2, "little") + (16000).to_bytes(4, "little") + \
        byte_rate.to_bytes(4, "little") + (2).to_bytes(2, "little") + (16).to_bytes(2, "little")
    body = b"WAVE" + extra + b"fmt " + len(fmt).to_bytes(4, "little") + fmt + \
        b"data" + data_size.to_bytes(4, "little") + b"\x00" * 64
    return list(b"RIFF" + min(len(body) + data_size, 0xFFFFFFFF).to_bytes(4, "little") + body)


@pytest.mark.parametrize("head, seconds", [
    (wav_head(int(7.31 * 32000)), 7.31),  # what the header says, whatever follows
    (wav_head(64000, extra=b"LIST" + (3).to_bytes(4, "little") + b"abc\x00"), 2.0),  # odd chunk padded
    (wav_head(0), None), (wav_head(0xFFFFFFFF), None),  # a streamed WAV says nothing
    (wav_head(64000, byte_rate=0), None), (list(b"ID3\x04" + b"\x00" * 60), None), ([], None)])
def test_the_length_a_wav_announces(page, head, seconds):
    got = page.evaluate("(a) => { const s = window.SenseVoiceApp.wavAnnounced(new Uint8Array(a).buffer);"
                        " return isFinite(s) ? s : null; }", head)
    assert got == (pytest.approx(seconds) if seconds is not None else None)


@pytest.mark.parametrize("english, chinese", [
    ("Drop Audio Here", "将音频拖放到此处"), ("- or -", "- 或 -"), ("Click to Upload", "点击上传"),
    ("Record audio", "录音"), ("Loading", "加载中"), ("Adjust playback speed to 1.5x", "播放速度调为 1.5×"),
    ("Skip backwards by 0.22000905 seconds", "后退 0.22 秒"), ("Skip forward by 1 second", "前进 1 秒"),
    ("Audio", None), ("Dropped Audio Here!", None), ("", None)])
def test_gradios_english_words_in_chinese(page, english, chinese):
    """Issue 23: words Gradio draws in English whatever its locale (exact matches only)."""
    assert app(page, "gradioZh(a[0])", english) == chinese


@pytest.mark.parametrize("name, mime, seconds", [
    ("call.wav", "audio/wav", 7.31),  # the header's length, whatever the bytes that follow
    ("clip.mp4", "video/mp4", None),  # a video's length is its longest track's: no claim
    ("call.mp3", "audio/mpeg", None),  # estimated from the bit rate: no claim
    ("notes.wav", "audio/wav", None)])  # not a WAV after all, and the player cannot read it
def test_the_length_a_chosen_file_announces(page, name, mime, seconds):
    head = wav_head(int(7.31 * 32000)) if seconds else list(b"\x00" * 64)
    got = page.evaluate("""async ([bytes, name, mime]) => {
        const file = new File([new Uint8Array(bytes)], name, {type: mime});
        const s = await window.SenseVoiceApp.announcedSeconds(file);
        return isFinite(s) ? s : null; }""", [head, name, mime])
    assert got == (pytest.approx(seconds) if seconds else None)


def test_recent_add_keeps_one_entry_per_job_newest_first(page):
    old = [{"id": f"j{i}"} for i in range(10)]
    got = app(page, "recentAdd(a[0], a[1])", old, {"id": "j5", "name": "new"})
    assert [e["id"] for e in got] == ["j5", "j0", "j1", "j2", "j3", "j4", "j6", "j7"]


def test_as_audio_file_retypes_videos_only(page):
    got = page.evaluate("""() => {
      const A = window.SenseVoiceApp;
      const f = (name, type) => A.asAudioFile(new File(['x'], name, {type}));
      return [f('a.mp4', 'video/mp4'), f('b.mkv', ''), f('c.mov', 'video/quicktime'),
              f('d.wav', 'audio/wav'), f('e.pdf', 'application/pdf'), f('f.webm', 'video/webm')]
        .map(x => [x.name, x.type]); }""")
    assert got == [["a.mp4", "audio/mp4"], ["b.mkv", "audio/mkv"], ["c.mov", "audio/quicktime"],
                   ["d.wav", "audio/wav"], ["e.pdf", "application/pdf"], ["f.webm", "audio/webm"]]


def test_reviewable(page):
    seg = {"start": 0, "end": 5, "speaker": None}
    one = {"result": {"segments": [seg, dict(seg)]}}  # a short clip's sub-segments
    two = {"result": {"segments": [seg, dict(seg, start=5, end=9)]}}
    call = {"result": {"segments": [dict(seg, speaker="left")]}}
    assert [app(page, "reviewable(a[0])", v) for v in (one, two, call, {})] == [
        False, True, True, False]


# ---- the page ----


def test_a_job_is_followed_to_its_result(page):
    page.streams[JOB_ID] = (200, sse(view("queued", position=1), view("transcribing"), DONE))
    app(page, "submitting()")
    assert page.locator("#sv-submit").is_disabled()
    assert "Sending" in state_text(page)
    app(page, "accepted(a[0])", json.dumps(view("queued", position=1)))
    page.wait_for_selector("#sv-state-view .sv-state-done")
    assert state_text(page).startswith("\u2713") or "Done in" in state_text(page)
    assert "Done in" in state_text(page)
    assert page.locator("#sv-submit").is_enabled()
    assert page.locator("#sv-result .sv-seg").count() == 1  # a short clip: the compact chips
    assert page.locator("#sv-review .sv-review").count() == 0  # no second player
    assert page.locator("#sv-result a.sv-export").count() == 4
    assert page.evaluate("location.search") == f"?job={JOB_ID}"
    assert any(h.endswith(f"/api/jobs/{JOB_ID}/events") for h in page.hits)
    assert page.locator("#sv-state-view .sv-jobid-short").inner_text() == "0b1c2d3e"
    assert page.locator("#sv-recent .sv-recent-open").get_attribute("data-job") == JOB_ID
    t = page.evaluate("window.SenseVoiceApp.timings")
    assert t["click"] <= t["accepted"] <= t["first"] <= t["done"] <= t["shown"]
    assert len(t["runs"]) >= 1


def test_a_result_left_out_of_the_final_event_is_fetched_once(page):
    # issue 19: a long recording's result is not pushed to every follower; the page fetches it
    signed = f"/api/jobs/{JOB_ID}/result?exp=1800086400&sig=abc_-1"
    omitted = {**DONE, "result": None, "result_omitted": True,
               "links": {**DONE["links"], "result": signed}}
    page.streams[JOB_ID] = (200, sse(view("transcribing"), omitted))
    page.results[JOB_ID] = {"id": JOB_ID, "result": DONE["result"]}
    app(page, "submitting()")
    app(page, "accepted(a[0])", json.dumps(view("queued", position=1)))
    page.wait_for_selector("#sv-result .sv-seg")
    assert "Done in" in state_text(page)
    assert page.locator("#sv-result .sv-seg").count() == 1
    fetched = [h for h in page.hits if "/result" in h]
    assert fetched == [HOST + signed]


def test_nothing_about_speech_while_a_job_runs(page):
    page.streams[JOB_ID] = (200, sse(view("segmenting", percent=40)))  # the stream then ends
    app(page, "submitting()")
    app(page, "accepted(a[0])", json.dumps(view("queued", position=2)))
    page.wait_for_selector("#sv-state-view [data-stage=segmenting]")
    assert page.locator("#sv-state-view progress").get_attribute("value") in ("0.4", None)
    assert "speech detected" not in page.locator("body").inner_text().lower()
    assert page.locator("#sv-submit").is_disabled()
    app(page, "reset()")


def test_a_refusal_is_an_error_in_plain_words(page):
    app(page, "submitting()")
    app(page, "accepted(a[0])", json.dumps({"id": None, "stage": "failed", "status": "refused",
                                            "error": {"code": "no_audio_stream",
                                                      "message": "the file has no audio track"}}))
    box = page.locator("#sv-state-view .sv-state-error")
    assert box.get_attribute("role") == "alert"
    assert "This file has no audio track" in box.inner_text()
    assert "Choose a recording, or a video with sound." in box.inner_text()
    color = page.eval_on_selector("#sv-state-view .sv-state-title", "e => getComputedStyle(e).color")
    assert color == "rgb(220, 38, 38)"  # red
    assert "speech detected" not in page.locator("body").inner_text().lower()
    assert page.locator("#sv-submit").is_enabled()
    assert page.evaluate("location.search") == ""


def test_a_submit_without_an_answer_says_so(page):
    app(page, "submitting()")
    app(page, "submitEnded()")
    page.wait_for_selector("#sv-state-view .sv-state-error")
    assert "The server did not answer" in state_text(page)
    assert page.locator("#sv-submit").is_enabled()


def test_a_gone_job_is_dropped_from_the_recent_list(page):
    page.evaluate("(id) => localStorage.setItem('sv-recent-jobs', JSON.stringify([{id, q: '',"
                  " name: 'old.wav', at: 1, stage: 'done'}]))", JOB_ID)
    page.evaluate("window.SenseVoiceApp.reset()")
    assert page.locator("#sv-recent .sv-recent-open").count() == 1
    page.locator("#sv-recent .sv-recent-open").click()  # 404: the route knows no stream
    page.wait_for_selector("#sv-state-view .sv-state-error")
    assert "This job is not known here" in state_text(page)
    assert page.locator("#sv-recent .sv-recent-open").count() == 0


def test_reload_follows_the_job_in_the_url(page):
    page.streams[JOB_ID] = (200, sse(DONE))
    page.goto(f"{HOST}/ui/?job={JOB_ID}&exp=1800000000&sig=abc")
    page.evaluate("window.SenseVoiceApp.boot()")
    page.wait_for_selector("#sv-result .sv-seg")
    assert f"/api/jobs/{JOB_ID}/events?exp=1800000000&sig=abc" in "".join(page.hits)
    assert "Done in 0.40 s" in state_text(page)  # from the job's own times (no click here)


def test_a_forged_query_never_reaches_the_request(page):
    page.goto(f"{HOST}/ui/?job={JOB_ID}&exp=1&sig=a%26job%3Dother")
    page.evaluate("window.SenseVoiceApp.boot()")
    page.wait_for_selector("#sv-state-view .sv-state-error")
    hit = next(h for h in page.hits if "/events" in h)
    assert hit == f"{HOST}/api/jobs/{JOB_ID}/events"  # the malformed signature was dropped


def test_reset_clears_everything(page):
    page.streams[JOB_ID] = (200, sse(DONE))
    app(page, "submitting()")
    app(page, "accepted(a[0])", json.dumps(view("queued")))
    page.wait_for_selector("#sv-result .sv-seg")
    assert app(page, "reset()") == [None, "", ""]
    assert page.evaluate("location.search") == ""
    assert page.locator("#sv-result .sv-seg").count() == 0
    assert page.locator("#sv-state-view .sv-state").count() == 0
    assert page.locator("#sv-submit").is_enabled()


def test_text_from_the_server_is_never_markup(page):
    page.streams[JOB_ID] = (200, sse(dict(DONE, filename=XSS)))
    app(page, "submitting()")
    app(page, "accepted(a[0])", json.dumps(view("queued", filename=XSS)))
    page.wait_for_selector("#sv-result .sv-seg")
    assert page.locator("#sv-recent .sv-recent-name").inner_text() == XSS
    app(page, "accepted(a[0])", json.dumps({"id": None, "stage": "failed",
                                            "error": {"code": XSS, "message": XSS}}))
    page.wait_for_timeout(100)
    assert page.evaluate("typeof window.__xss") == "undefined"
    assert page.locator("body img").count() == 0


def test_videos_are_handed_to_the_widget_as_audio(page):
    page.evaluate("""() => {
      window.__seen = [];
      document.querySelector('#sv-audio input').addEventListener('change',
        (e) => window.__seen.push([...e.target.files].map(f => [f.name, f.type])));
    }""")
    page.set_input_files("#sv-audio input", files=[{"name": "clip.mp4", "mimeType": "video/mp4",
                                                    "buffer": b"\x00\x00\x00\x18ftypmp42"}])
    assert page.evaluate("window.__seen") == [[["clip.mp4", "audio/mp4"]]]
    page.locator("#sv-audio").click()
    assert "video/*" in page.locator("#sv-audio input").get_attribute("accept")


def test_submit_clicks_do_nothing_while_a_job_runs(page):
    page.evaluate("window.__clicks = 0; document.querySelector('#sv-submit')"
                  ".addEventListener('click', () => window.__clicks++)")
    app(page, "submitting()")
    assert page.locator("#sv-submit").is_disabled()
    page.evaluate("document.querySelector('#sv-submit').disabled = false")  # as if re-rendered
    page.evaluate("document.querySelector('#sv-submit').click()")
    assert page.evaluate("window.__clicks") == 0
    app(page, "reset()")
    page.locator("#sv-submit").click()
    assert page.evaluate("window.__clicks") == 1


def test_chinese_words_when_chosen(page):
    page.evaluate("localStorage.setItem('sv-lang', 'zh')")
    page.goto(f"{HOST}/ui/")
    assert page.evaluate("navigator.language") == "zh-CN"  # what Gradio's own labels follow
    page.evaluate("window.SenseVoiceApp.boot()")
    assert page.evaluate("window.SenseVoiceI18n.lang()") == "zh"
    assert app(page, "describe(a[0])", {"stage": "queued", "position": 2})["title"] == (
        "\u6392\u961f\u4e2d\uff1a\u7b2c 2 \u4f4d")
    assert page.locator("#sv-topbar .sv-lang-switch.sv-current").get_attribute("data-lang") == "zh"
    assert page.evaluate("document.documentElement.lang") == "zh"
    page.evaluate("localStorage.removeItem('sv-lang')")


def test_the_language_follows_the_browser(page):
    assert app(page, "pickLang(a[0], a[1])", None, "zh-CN") == "zh"
    assert app(page, "pickLang(a[0], a[1])", None, "en-GB") == "en"
    assert app(page, "pickLang(a[0], a[1])", "en", "zh-TW") == "en"  # the switch wins


def test_tag_icons_do_not_need_an_emoji_font(page):
    page.streams[JOB_ID] = (200, sse(DONE))
    app(page, "open(a[0], '')", JOB_ID)
    page.wait_for_selector("#sv-result .sv-seg")
    marked = page.evaluate("document.documentElement.classList.contains('sv-no-emoji')")
    emoji = page.locator("#sv-result .sv-emo .sv-emoji")
    assert emoji.inner_text()  # the text stays (copy, screen readers)
    if marked:  # no emoji font here: a dot in the tag's colour instead of an empty box
        style = emoji.evaluate("e => [getComputedStyle(e).color, getComputedStyle(e).backgroundColor]")
        assert style == ["rgba(0, 0, 0, 0)", "rgb(234, 179, 8)"], style


def test_a_lost_connection_is_retried_then_said(page):
    """A stream that keeps failing is tried again with growing pauses, then the page says so (it
    does not retry for ever)."""
    tries = []

    def fail(route):
        tries.append(route.request.url)
        route.abort()

    page.route(f"{HOST}/api/jobs/{JOB_ID}/events", fail)
    try:
        app(page, "open(a[0], '')", JOB_ID)
        page.wait_for_selector("#sv-state-view .sv-state-error", timeout=20_000)
        assert "The server did not answer" in state_text(page)
        assert len(tries) == 6  # the first attempt and 5 retries (0.25 s .. 4 s apart)
        page.wait_for_timeout(600)
        assert len(tries) == 6 and page.locator("#sv-submit").is_enabled()
    finally:
        page.unroute(f"{HOST}/api/jobs/{JOB_ID}/events")
