"""The desk's Keep and Delete in headless Debian chromium against a real server on loopback (issue
40): each call shows when it will be deleted; Keep moves that date (the server's answer); Delete
asks first (dismissed: nothing happens), then removes the call from the table, from this browser's
lists and from the server (its poll answers 410)."""

from __future__ import annotations

import shutil
import time

import httpx
import pytest

from tests.conftest import LiveServer, make_settings
from tests.test_browser_desk import boot_desk, rows

pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium not installed")]


@pytest.fixture(scope="module")
def server(demo_dir, tmp_path_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("delete-ui"), retention_hours=1.0,
                                   keep_max_days=7.0)).start()
    yield srv
    srv.stop()


def row_of(page, name: str):
    return page.locator("#sv-desk tr.sv-call-row", has=page.locator(".sv-call-name", has_text=name))


def test_keep_and_delete_a_call_from_the_desk(server, browser, clip_factory):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    page = ctx.new_page()
    try:
        clip = clip_factory("wav", 16000, 1)
        files = [{"name": name, "mimeType": "audio/wav", "buffer": clip.read_bytes()}
                 for name in ("keep-me.wav", "delete-me.wav")]
        boot_desk(page, server)
        page.locator("#sv-batch-files").set_input_files(files)
        page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row .sv-call-delete')"
                               ".length === 2", timeout=120_000)
        assert sorted(rows(page)) == ["delete-me.wav", "keep-me.wav"]
        kept = row_of(page, "keep-me.wav")
        before = kept.locator(".sv-call-exp").inner_text()
        assert before  # the date its retention ends
        kept.locator(".sv-call-keep").click()
        page.wait_for_function("(b) => { const r = [...document.querySelectorAll('#sv-desk tr.sv-call-row')]"
                               ".find(r => r.querySelector('.sv-call-name').textContent === 'keep-me.wav');"
                               " return r && r.querySelector('.sv-call-exp').textContent !== b; }",
                               arg=before, timeout=15_000)
        kept_id = kept.get_attribute("data-job")
        body = httpx.get(f"{server.url}/api/jobs/{kept_id}", timeout=10).json()
        assert body["expires_at"] > time.time() + 6.9 * 86400  # the cap, not the hour of retention

        doomed = row_of(page, "delete-me.wav")
        doomed_id = doomed.get_attribute("data-job")
        page.once("dialog", lambda d: d.dismiss())  # asked first: "no" leaves it
        doomed.locator(".sv-call-delete").click()
        page.wait_for_timeout(300)
        assert httpx.get(f"{server.url}/api/jobs/{doomed_id}", timeout=10).status_code == 200
        messages = []
        page.once("dialog", lambda d: (messages.append(d.message), d.accept()))
        doomed.locator(".sv-call-delete").click()
        page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 1",
                               timeout=15_000)
        assert "delete-me.wav" in messages[0]
        assert rows(page) == ["keep-me.wav"]
        assert httpx.get(f"{server.url}/api/jobs/{doomed_id}", timeout=10).status_code == 410
        stored = page.evaluate("() => (localStorage.getItem('sv-desk-jobs') || '') + "
                               "(localStorage.getItem('sv-recent-jobs') || '')")
        assert doomed_id not in stored and kept_id in stored
        page.reload()
        boot_desk(page, server)
        page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 1",
                               timeout=15_000)
    finally:
        ctx.close()
