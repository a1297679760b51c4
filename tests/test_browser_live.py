"""Live captions end to end (issue 14) in headless Debian chromium against the real server on
loopback: Chromium's fake microphone plays a WAV made with espeak-ng (two sentences with clear
pauses) into the page's Live mode, which streams it over the real WebSocket ``/api/stream``; the
partials show (provisional), then the finals (settled, with their chips); Stop ends the stream; the
recording saved as a job opens in the review view. A server that refuses the stream (too many live
streams, model not ready) is said plainly, in red. With an API token, the logged-in page streams
through its live link. A phone in dark mode fits."""

from __future__ import annotations

import shutil
import threading
import time
import wave
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import CHROMIUM_ARGS, LiveServer, make_settings
from tests.media import speech_wav

TOKEN = "live-s3cret"
SENTENCES = ("hello world, this is a test of live captions",
             "and here is the second sentence, after a pause")

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium not installed"),
              pytest.mark.skipif(not shutil.which("espeak-ng"), reason="the fake microphone's speech "
                                 "needs espeak-ng")]


@pytest.fixture(scope="module")
def mic_wav(media_dir) -> Path:
    """What the fake microphone says: 1 s of silence, a sentence, 2 s of silence, another, 3 s of
    silence (16 kHz mono; Chromium plays it in a loop)."""
    dst = media_dir / "live_mic.wav"
    if dst.exists():
        return dst
    parts = [np.zeros(16000, "<i2")]
    for i, text in enumerate(SENTENCES):
        with wave.open(str(speech_wav(media_dir / f"live_sentence_{i}.wav", text=text))) as w:
            assert w.getframerate() == 16000
            parts.append(np.frombuffer(w.readframes(w.getnframes()), "<i2"))
        parts.append(np.zeros(16000 * (2 + i), "<i2"))
    with wave.open(str(dst), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(np.concatenate(parts).tobytes())
    return dst


@pytest.fixture(scope="module")
def browser(mic_wav):
    """Chromium whose (fake) microphone plays ``mic_wav``, granted without a prompt."""
    from playwright.sync_api import sync_playwright

    args = CHROMIUM_ARGS + ["--use-fake-device-for-media-stream", "--use-fake-ui-for-media-stream",
                            f"--use-file-for-fake-audio-capture={mic_wav}",
                            "--autoplay-policy=no-user-gesture-required"]
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=shutil.which("chromium"), args=args)
        yield b
        b.close()


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    # one live stream at a time (the refusal test fills it); a saved recording over 4 s is split
    # into its speech pieces (the review view)
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("live-data"),
                                   max_live_streams=1, segment_threshold_s=4.0)).start()
    yield srv
    srv.stop()


@pytest.fixture
def page(server, browser):
    ctx = browser.new_context()
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    ctx.close()
    assert pg.errors == [], pg.errors


def open_live(page, url: str):
    page.goto(url + "/ui/?mode=live", wait_until="load")
    page.wait_for_selector("#sv-live .sv-live-toggle", timeout=30_000)
    assert page.evaluate("window.SenseVoiceLive.mode()") == "live"


def watch_transcript(page):
    """Record, in order, each time a partial or a final first appears on screen."""
    page.evaluate("""() => {
      window.__seen = [];
      const host = document.querySelector('#sv-live-transcript');
      new MutationObserver((records) => {
        for (const r of records) for (const n of r.addedNodes) {
          if (n.nodeType !== 1 || !n.classList.contains('sv-live-utt')) continue;
          window.__seen.push([n.classList.contains('sv-live-final') ? 'final' : 'partial',
                              performance.now(), n.textContent]);
        }
      }).observe(host, {subtree: true, childList: true});
    }""")


def panel(page) -> str:
    return page.locator("#sv-live").inner_text()


def stop(page):
    page.locator("#sv-live .sv-live-stop").click()
    page.wait_for_selector("#sv-live [data-phase=stopped]", timeout=30_000)


def test_live_captions_grow_then_save_as_a_job(page, server):
    open_live(page, server.url)
    assert "The first 30 min of a live recording can be saved as a job" in panel(page)
    watch_transcript(page)
    page.locator("#sv-live .sv-live-start").click()
    page.wait_for_selector("#sv-live [data-phase=listening]", timeout=30_000)
    assert "Listening" in panel(page)
    # both sentences are settled at their pauses, while the microphone is still on
    page.wait_for_function("() => document.querySelectorAll('#sv-live-transcript .sv-live-final')"
                           ".length >= 2", timeout=60_000)
    seen = page.evaluate("window.__seen")
    kinds = [k for k, _, _ in seen]
    assert "partial" in kinds and kinds.index("partial") < kinds.index("final"), kinds  # provisional first
    assert page.evaluate("window.SenseVoiceLive.session().phase") == "listening"
    final = page.locator("#sv-live-transcript .sv-live-final").first
    assert final.locator(".sv-lang").count() == 1 and final.locator(".sv-chip").count() >= 1  # chips
    assert final.locator(".sv-text").inner_text().strip()
    stop(page)
    assert "Stopped" in panel(page)
    assert page.locator("#sv-live-transcript .sv-live-partial").count() == 0  # all settled
    session = page.evaluate("window.SenseVoiceLive.session()")
    finals = session["finals"]
    assert len(finals) >= 2
    assert all(f["start"] < f["end"] for f in finals)
    assert all(a["end"] <= b["start"] + 1e-6 for a, b in zip(finals, finals[1:]))  # in order
    assert finals[-1]["end"] <= session["sentSamples"] / 16000 + 0.05
    assert session["keptSamples"] == session["sentSamples"]
    # the recording as a normal job: the review view, the player, the downloads
    page.locator("#sv-live .sv-live-save").click()
    assert page.evaluate("window.SenseVoiceLive.mode()") == "file"
    page.wait_for_selector("#sv-review tr.sv-row", timeout=90_000)
    job = server.runtime.view.get(page.evaluate("new URLSearchParams(location.search).get('job')"))
    assert job.filename.startswith("live-") and job.filename.endswith(".wav")
    assert abs(job.audio_seconds - session["sentSamples"] / 16000) < 0.05
    assert page.locator("#sv-review tr.sv-row").count() >= 2
    assert page.locator("#sv-review audio.sv-player").count() == 1
    with page.expect_download() as d:
        page.locator("#sv-review a.sv-export[data-format=srt]").click()
    assert d.value.suggested_filename == job.filename[:-4] + ".srt"
    assert page.locator("#sv-live .sv-live-save").is_disabled()  # saved once
    page.screenshot(path=str(server.settings.server.data_dir / "ui-live-saved.png"), full_page=True)


def hold_the_only_stream(server, stop_event: threading.Event, opened: threading.Event):
    """A Python client holding the server's one live stream (silence) until ``stop_event``."""
    from websockets.sync.client import connect

    url = server.url.replace("http://", "ws://") + "/api/stream"
    with connect(url) as ws:
        opened.set()
        while not stop_event.wait(0.2):
            ws.send(bytes(6400))
        ws.send('{"type": "end"}')
        for _ in ws:  # the finals, then the close
            pass


def refused_start(page, server):
    open_live(page, server.url)
    page.locator("#sv-live .sv-live-start").click()
    box = page.locator("#sv-live .sv-state-error")
    box.wait_for(timeout=30_000)
    assert box.get_attribute("role") == "alert"
    assert page.eval_on_selector("#sv-live .sv-state-error .sv-state-title",
                                 "e => getComputedStyle(e).color") == "rgb(220, 38, 38)"
    assert page.locator("#sv-live .sv-live-start").is_enabled()  # may be tried again
    page.wait_for_function("() => !window.SenseVoiceLive.session().sampleRate")  # microphone off
    assert page.locator("#sv-live .sv-live-save").count() == 0  # nothing ran: nothing to save
    return box.inner_text()


def test_too_many_streams_is_said_plainly(page, server):
    done, opened = threading.Event(), threading.Event()
    holder = threading.Thread(target=hold_the_only_stream, args=(server, done, opened), daemon=True)
    holder.start()
    try:
        assert opened.wait(30)
        text = refused_start(page, server)
        assert "Too many live captions are running on this server" in text
        assert "Try again in a minute" in text
    finally:
        done.set()
        holder.join(30)
    # the slot is free again: the same button works
    registry = server.runtime.metrics.registry
    deadline = time.monotonic() + 10
    while registry.get_sample_value("sensevoice_live_streams") and time.monotonic() < deadline:
        time.sleep(0.05)
    page.locator("#sv-live .sv-live-start").click()
    page.wait_for_selector("#sv-live [data-phase=listening]", timeout=30_000)
    stop(page)


def test_a_model_not_ready_is_said_plainly(page, server):
    health = server.runtime.health
    health.set_state("loading")  # as while a model loads
    try:
        text = refused_start(page, server)
    finally:
        health.set_state("ready")
    assert "The speech model is not ready yet" in text and "Try again in a minute" in text


def test_a_phone_in_dark_mode(server, browser):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True,
                              color_scheme="dark")
    pg = ctx.new_page()
    try:
        open_live(pg, server.url)
        pg.locator("#sv-live .sv-live-start").click()
        pg.wait_for_selector("#sv-live-transcript .sv-live-final", timeout=60_000)
        assert pg.evaluate("document.documentElement.scrollWidth") <= 390
        box = pg.locator("#sv-live .sv-live-stop").bounding_box()
        assert box["width"] > 300 and box["height"] >= 44  # a thumb's target
        # the transcript: light text on the dark page
        color = pg.eval_on_selector("#sv-live-transcript .sv-live-final .sv-text",
                                    "e => getComputedStyle(e).color")
        assert sum(int(c) for c in color[color.index("(") + 1:-1].split(",")[:3]) > 450, color
        pg.screenshot(path=str(server.settings.server.data_dir / "ui-live-phone.png"), full_page=True)
        stop(pg)
    finally:
        ctx.close()


@pytest.fixture(scope="module")
def token_server(demo_dir, tmp_path_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("live-token"),
                                   api_token=TOKEN)).start()
    yield srv
    srv.stop()


def test_with_a_token_the_logged_in_page_streams_through_its_live_link(token_server, browser):
    ctx = browser.new_context()
    page = ctx.new_page()
    try:
        page.goto(token_server.url + "/ui/?mode=live", wait_until="load")
        page.wait_for_selector("input[type=password]", timeout=30_000)
        page.locator("input[type=text], input:not([type])").first.fill("qa")
        page.locator("input[type=password]").first.fill(TOKEN)
        page.locator("button").filter(has_text="Login").first.click()
        page.wait_for_selector("#sv-live .sv-live-start", timeout=30_000)
        if page.evaluate("window.SenseVoiceLive.mode()") != "live":  # (the login page kept no query)
            page.locator("#sv-modes .sv-mode[data-mode=live]").click()
        sockets = []
        page.on("websocket", lambda ws: sockets.append(ws.url))
        page.locator("#sv-live .sv-live-start").click()
        page.wait_for_selector("#sv-live-transcript .sv-live-final", timeout=60_000)
        stream = next(u for u in sockets if "/api/stream" in u)
        assert "sig=" in stream and TOKEN not in stream  # a live link, never the token
        stop(page)
        # without the link the stream is refused, in words
        page.evaluate("window.SenseVoiceLive.boot({linkPath: '/ui/gradio_api/run/nothing'})")
        page.locator("#sv-live .sv-live-start").click()
        page.wait_for_selector("#sv-live .sv-state-error", timeout=30_000)
        assert "Not signed in for live captions" in panel(page)
    finally:
        ctx.close()


def test_the_page_sends_16k_audio_at_real_time(page, server):
    """The worklet's output rate, measured: the samples sent over a few seconds of wall time."""
    open_live(page, server.url)
    page.locator("#sv-live .sv-live-start").click()
    page.wait_for_selector("#sv-live [data-phase=listening]", timeout=30_000)
    first = page.evaluate("[performance.now(), window.SenseVoiceLive.session().sentSamples]")
    time.sleep(3)
    last = page.evaluate("[performance.now(), window.SenseVoiceLive.session().sentSamples]")
    device_rate = page.evaluate("window.SenseVoiceLive.session().sampleRate")
    rate = (last[1] - first[1]) / ((last[0] - first[0]) / 1000)
    assert 14000 < rate < 18000, (rate, device_rate)  # (the device's own rate: downsampled)
    stop(page)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_phone_live_captions_on_top_while_recording(server, browser, lang):
    """Issue 23: on a 390 x 844 phone the captions grew out of sight under the controls. While the
    microphone is on they come first (top of the screen) and the controls are compact."""
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    pg = ctx.new_page()
    try:
        pg.add_init_script(f"localStorage.setItem('sv-lang', '{lang}')")
        open_live(pg, server.url)
        pg.evaluate("window.scrollTo(0, document.body.scrollHeight)")
        pg.locator("#sv-live .sv-live-start").click()
        pg.wait_for_selector("#sv-live [data-phase=listening]", timeout=30_000)
        pg.wait_for_selector("#sv-live-transcript .sv-live-utt", timeout=60_000)
        assert pg.evaluate("document.body.classList.contains('sv-live-recording')")
        box = pg.evaluate("document.querySelector('#sv-live-transcript').getBoundingClientRect().toJSON()")
        controls = pg.evaluate("document.querySelector('#sv-live').getBoundingClientRect().toJSON()")
        assert 0 <= box["top"] < 844 / 2, box  # the captions on screen, in its upper half
        assert box["top"] < controls["top"], (box, controls)  # above the controls
        assert not pg.locator("#sv-options").is_visible()  # compact
        if lang == "zh":  # the Chinese page while recording: no English left on it
            from tests.test_browser_desk import english_left

            assert english_left(pg) == []
        assert pg.evaluate("document.documentElement.scrollWidth") <= 392
        stop(pg)
        assert not pg.evaluate("document.body.classList.contains('sv-live-recording')")
    finally:
        ctx.close()
