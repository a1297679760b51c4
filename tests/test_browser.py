"""End to end in headless Debian chromium: upload a clip in the Gradio UI, see the chips appear
without pressing refresh; a transcript containing HTML renders as text."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import LiveServer, make_settings

XSS = " <img src=x onerror=window.__xss=1><script>window.__xss=2</script>"

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium not installed")]


class HostileTokenizer:
    """Test double for the model's tokenizer: real decode, then HTML appended to the transcript."""

    def __init__(self, inner):
        self.inner = inner
        self.enabled = False

    def decode(self, ids):
        text = self.inner.decode(ids)
        return text + XSS if self.enabled else text


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("ui-data"),
                                   poll_interval_s=0.3)).start()
    for w in srv.service.workers:
        w.engine.tokenizer = HostileTokenizer(w.engine.tokenizer)
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def page(server, browser):
    pg = browser.new_page()
    yield pg
    pg.close()


def _upload_and_submit(page, server, clip):
    page.goto(server.url + "/", wait_until="load")
    page.wait_for_selector("#sv-submit", timeout=30_000)
    page.locator("input[type=file]").first.set_input_files(str(clip))
    page.wait_for_selector("audio, .waveform-container, [data-testid='waveform-Audio']", timeout=30_000)
    page.locator("#sv-submit").click()


def _transcribe(page, server, clip):
    _upload_and_submit(page, server, clip)
    page.wait_for_selector("#sv-result .sv-seg", timeout=60_000)


def test_upload_renders_chips_without_refresh(page, server, clip_factory):
    _transcribe(page, server, clip_factory("mp3", 44100, 2))
    assert page.locator("#sv-result .sv-lang").first.inner_text().strip() != ""
    emo = page.locator("#sv-result .sv-chip.sv-emo").first.inner_text()
    assert "NEUTRAL" in emo or "😐" in emo
    assert page.locator("#sv-result .sv-chip.sv-event").count() >= 1
    assert "speech" in page.locator("#sv-result .sv-text").first.inner_text()
    assert "Demo model" in page.locator("#sv-demo-banner").inner_text()  # said plainly
    status = page.locator("#sv-status textarea, #sv-status input").first.input_value()
    assert status.startswith("done in")
    page.screenshot(path=str(server.settings.data_dir / "ui.png"), full_page=True)


def test_html_in_transcript_renders_as_text(page, server, clip_factory):
    for w in server.service.workers:
        w.engine.tokenizer.enabled = True
    try:
        _transcribe(page, server, clip_factory("wav", 16000, 1))
    finally:
        for w in server.service.workers:
            w.engine.tokenizer.enabled = False
    text = page.locator("#sv-result .sv-text").first.inner_text()
    assert "<img src=x onerror=window.__xss=1>" in text and "<script>" in text
    assert page.evaluate("window.__xss") is None
    assert page.locator("#sv-result img, #sv-result script").count() == 0


def test_long_recording_review_table_timeline_and_seek(page, server, long_call):
    """A long clip (> 30 s): VAD segments, the segment table and timeline appear; clicking a
    segment moves the player."""
    _upload_and_submit(page, server, long_call)
    page.wait_for_selector("#sv-review tr.sv-row", timeout=90_000)
    rows = page.locator("#sv-review tr.sv-row")
    assert rows.count() >= 2
    assert page.locator("#sv-review svg.sv-timeline rect.sv-tl-seg").count() == rows.count()
    assert page.locator("#sv-review .sv-summary .sv-sum-emo").count() >= 1
    last = rows.nth(rows.count() - 1)
    start = float(last.get_attribute("data-start"))
    assert start > 10
    page.wait_for_function("() => { const a = document.querySelector('#sv-review audio.sv-player');"
                           " return a && a.readyState >= 1; }", timeout=30_000)
    last.click()
    page.wait_for_function(
        f"() => Math.abs(document.querySelector('#sv-review audio.sv-player').currentTime - {start}) < 0.5",
        timeout=15_000)
    hrefs = [a.get_attribute("href") for a in page.locator("#sv-review a.sv-export").all()]
    assert any(h.endswith("format=srt") for h in hrefs)
