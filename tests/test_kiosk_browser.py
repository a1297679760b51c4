"""Kiosk mode for demo stations (issue 40; static/kiosk.js) in headless Debian chromium against a
real server on loopback: with ``?kiosk=1`` (and with the SENSEVOICE_KIOSK setting, no query) the
page shows no recent jobs and no calls table and keeps the demo notice on screen; a visitor's
result is cleared by "Next visitor", or when the station stays untouched for ``kiosk_clear_s``:
the next visitor sees nothing of the last one (no result, no recording, no job address, no list
of jobs in the browser's storage, and Back does not lead to it)."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import LiveServer, make_settings
from tests.test_browser import choose, job_in_url, open_ui

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium not installed")]

CLEAR_S = 6.0

# what a visitor could see of an earlier one: the result, the recording, the job's address, the lists
LEFT_OVER = """() => ({
  result: (document.querySelector('#sv-result') || {}).innerText || '',
  review: (document.querySelector('#sv-review') || {}).innerText || '',
  audio: !!document.querySelector('#sv-audio audio[src]:not([src=""]), #sv-audio .waveform-container'),
  job: new URLSearchParams(location.search).get('job') || '',
  stored: (localStorage.getItem('sv-recent-jobs') || '') + (localStorage.getItem('sv-desk-jobs') || ''),
  recentShown: (() => { const e = document.querySelector('#sv-recent');
                        return !!e && getComputedStyle(e).display !== 'none' && e.offsetHeight > 0; })(),
  deskShown: (() => { const e = document.querySelector('#sv-desk');
                      return !!e && getComputedStyle(e).display !== 'none' && e.offsetHeight > 0; })(),
})"""


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("kiosk"))).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def kiosk_server(demo_dir, tmp_path_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("kiosk-set"), kiosk=True,
                                   kiosk_clear_s=CLEAR_S)).start()
    yield srv
    srv.stop()


def visit(page, server, clip, query: str) -> str:
    """A visitor transcribes a clip; the job's id."""
    open_ui(page, server, query)
    page.wait_for_selector("#sv-kiosk-bar #sv-kiosk-next", timeout=30_000)
    choose(page, clip)
    page.locator("#sv-submit").click()
    page.wait_for_selector("#sv-result .sv-seg", timeout=60_000)
    job = job_in_url(page)
    assert job
    return job


def assert_clean(page, last_job: str) -> None:
    page.wait_for_function("() => location.search === '?kiosk=1' && window.SenseVoiceKiosk"
                           " && window.SenseVoiceKiosk.active()", timeout=30_000)
    page.wait_for_selector("#sv-kiosk-bar", timeout=30_000)
    left = page.evaluate(LEFT_OVER)
    assert left == {"result": "", "review": "", "audio": False, "job": "", "stored": "",
                     "recentShown": False, "deskShown": False}, left
    assert last_job not in page.content()
    assert page.locator("#sv-kiosk-bar").is_visible()  # the notice, always


def test_next_visitor_sees_nothing_of_the_last_one(server, browser, clip_factory):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    try:
        # the station was used as an ordinary page before: its lists go at the kiosk's boot
        open_ui(page, server)
        page.evaluate("() => localStorage.setItem('sv-recent-jobs', JSON.stringify([{id: 'earlier-job'}]))")
        job = visit(page, server, clip_factory("wav", 16000, 1), "?kiosk=1")
        left = page.evaluate(LEFT_OVER)
        assert left["result"] and left["audio"] and left["job"] == job  # what the checks below must not find
        assert not left["recentShown"] and not left["deskShown"] and "earlier-job" not in left["stored"]
        assert page.locator("#sv-kiosk-bar").is_visible()
        assert "Demo station" in page.locator("#sv-kiosk-bar").inner_text()
        page.locator("#sv-kiosk-next").click()
        assert_clean(page, job)
        page.go_back()  # Back leads to the page before the kiosk, never to the visitor's job
        assert job not in page.url
    finally:
        ctx.close()


def test_an_idle_station_clears_itself_with_the_setting(kiosk_server, browser, clip_factory):
    ctx = browser.new_context(viewport={"width": 390, "height": 844})
    page = ctx.new_page()
    try:
        job = visit(page, kiosk_server, clip_factory("wav", 16000, 1), "")
        # nothing touched: cleared after CLEAR_S (the wait allows a loaded machine five times that)
        page.wait_for_function("() => !document.querySelector('#sv-result .sv-seg')", timeout=CLEAR_S * 5 * 1000)
        assert_clean(page, job)
    finally:
        ctx.close()
