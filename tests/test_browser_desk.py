"""The reviewer's desk in headless Debian chromium (desktop and a 390 x 844 phone) against a real
server on loopback (issue 23): a batch of 20 files, the table's filters, sort and CSV; a call
opened from the table, edited, flagged and marked reviewed with the keyboard, kept after a reload
and a server restart and present in SRT/VTT/TXT/JSON; the phone scrolled to the result; the
Chinese page without the desk's English words."""

from __future__ import annotations

import csv
import io
import json
import os
import shutil
from pathlib import Path

import httpx
import pytest

from tests.conftest import LiveServer, make_settings
from tests.test_browser import open_ui

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(not shutil.which("chromium"), reason="Debian chromium not installed")]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("desk-ui")


@pytest.fixture(scope="module")
def server(demo_dir, data_dir):
    srv = LiveServer(make_settings(demo_dir, data_dir)).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def page(server, browser):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900}, accept_downloads=True)
    pg = ctx.new_page()
    yield pg
    ctx.close()


def boot_desk(page, server, query=""):
    open_ui(page, server, query)
    page.wait_for_selector("#sv-desk .sv-desk", timeout=30_000)


def rows(page) -> list[str]:
    return page.locator("#sv-desk tr.sv-call-row .sv-call-name").all_inner_texts()


# What a Chinese page may still write in Latin letters: names (the app's, file names, the English
# language's own name, the export formats), language codes in a title; transcripts are the speech's.
LATIN_OK = ("SenseVoice", "English", "ITN", "TXT", "JSON", "SRT", "VTT", "CSV", "zip", "J/K")
ENGLISH_LEFT = """([ok, skip]) => {
  const out = new Set();
  const clean = (t) => {
    let s = String(t || '');
    for (const w of ok) s = s.split(w).join(' ');
    s = s.replace(/[\\w.-]+\\.(wav|mp3|m4a|opus|ogg|flac|webm|mp4|mkv)\\b/gi, ' ')  // file names
         .replace(/\\([a-z]{2,8}\\)/g, ' ')  // a language code in a title
         .replace(/\\b[0-9a-f]{8}(-[0-9a-f]{4}){0,3}(-[0-9a-f]{12})?\\b/g, ' ');  // job ids
    return /[A-Za-z]{2,}/.test(s) ? String(t).trim().slice(0, 80) : '';
  };
  const shown = (e) => { const r = e.getBoundingClientRect(); const cs = getComputedStyle(e);
    return r.width > 0 && r.height > 0 && cs.visibility !== 'hidden' && cs.display !== 'none'; };
  const walk = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walk.nextNode()) {
    const e = walk.currentNode.parentElement;
    if (!e || e.closest('script, style, ' + skip) || !shown(e)) continue;
    const bad = clean(walk.currentNode.nodeValue);
    if (bad) out.add(bad);
  }
  document.querySelectorAll('[aria-label], [title], [placeholder]').forEach((e) => {
    if (e.closest(skip) || !(shown(e) || e.closest('#sv-audio'))) return;
    for (const a of ['aria-label', 'title', 'placeholder']) {
      const bad = e.hasAttribute(a) ? clean(e.getAttribute(a)) : '';
      if (bad) out.add(a + '=' + bad);
    }
  });
  return [...out];
}"""
# the speech's own words: the transcript, the editor's text, the model's raw output
TRANSCRIPTS = ".sv-text, .sv-raw, .sv-edit-text, .sv-edit-model-text, .sv-edit-input, .sv-live-text"


def wait_no_english(page, timeout_ms: int = 15_000) -> None:
    """Until no English is left on the page (the check english_left makes), or time out."""
    try:
        page.wait_for_function(f"(args) => ({ENGLISH_LEFT})(args).length === 0",
                               arg=[list(LATIN_OK), TRANSCRIPTS], timeout=timeout_ms)
    except Exception:
        pass  # the assertion that follows names what is left


def english_left(page) -> list[str]:
    """Every piece of text, label, title or placeholder on a Chinese page still in English."""
    return page.evaluate(ENGLISH_LEFT, [list(LATIN_OK), TRANSCRIPTS])


def test_batch_of_20_files_table_filters_sort_and_csv(page, server, clip_factory, long_call):
    clips = [clip_factory(fmt, rate, ch) for fmt, rate, ch in
             (("wav", 16000, 1), ("mp3", 44100, 2), ("opus", 48000, 1), ("m4a", 22050, 2))]
    files = [{"name": f"call-{i:02d}{clips[i % 4].suffix}", "mimeType": "application/octet-stream",
              "buffer": clips[i % 4].read_bytes()} for i in range(19)]
    files.append({"name": "long-call.wav", "mimeType": "audio/wav", "buffer": long_call.read_bytes()})
    boot_desk(page, server)
    page.locator("#sv-batch-files").set_input_files(files)
    page.wait_for_function("() => document.querySelectorAll('#sv-desk .sv-batch-item').length === 20",
                           timeout=60_000)
    page.wait_for_function("() => document.querySelectorAll('#sv-desk .sv-batch-done').length === 20",
                           timeout=180_000)
    page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 20",
                           timeout=30_000)
    # sort by name: one click ascending (names sort as text)
    page.locator("#sv-desk th[data-sort=name]").click()
    page.wait_for_function("() => document.querySelector('#sv-desk th[data-sort=name]')"
                           ".getAttribute('aria-sort') === 'ascending'")
    names = rows(page)
    assert names == sorted(names) and names[0] == "call-00.wav" and len(names) == 20
    page.locator("#sv-desk th[data-sort=name]").click()
    page.wait_for_function("() => document.querySelector('#sv-desk th[data-sort=name]')"
                           ".getAttribute('aria-sort') === 'descending'")
    assert rows(page)[0] == "long-call.wav"
    # quick filters in one click: nothing is flagged yet, then every call back
    page.locator("#sv-desk [data-filter=f_flagged]").click()
    page.wait_for_selector("#sv-desk .sv-desk-none", timeout=10_000)
    page.locator("#sv-desk [data-filter=f_flagged]").click()
    page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 20")
    # "customer angry > 20 %" and "has crying" in one click each (the demo model hears neutral
    # speech only: none), "not reviewed" keeps every call
    for quick, left in (("f_angry", 0), ("f_cry", 0), ("f_unreviewed", 20)):
        page.locator(f"#sv-desk [data-filter={quick}]").click()
        page.wait_for_selector(f"#sv-desk [data-filter={quick}].sv-on", timeout=10_000)
        if left:
            page.wait_for_function(
                f"() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === {left}")
        else:
            page.wait_for_selector("#sv-desk .sv-desk-none", timeout=10_000)
        page.locator(f"#sv-desk [data-filter={quick}]").click()
        page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 20")
    page.locator("#sv-desk .sv-desk-search").fill("long-call")
    page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 1")
    page.locator("#sv-desk .sv-desk-search").fill("")
    page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 20")
    with page.expect_download() as dl:
        page.locator("#sv-desk .sv-desk-csv").click()
    text = open(dl.value.path(), encoding="utf-8-sig").read()
    table = list(csv.reader(io.StringIO(text)))
    assert table[0][1] == "name" and len(table) == 21
    assert {r[1] for r in table[1:]} == {f["name"] for f in files}


def editor_title(page) -> str:
    return page.locator("#sv-editor .sv-editor-title").inner_text()


def test_next_and_previous_call_without_going_back_to_the_table(page, server):
    """A row opens the call; Next / Previous call walk the table's order (here by name) in the
    review view, the table staying where it is, the row of the call on screen marked."""
    boot_desk(page, server)
    page.locator("#sv-desk th[data-sort=name]").click()
    page.wait_for_function("() => document.querySelector('#sv-desk th[data-sort=name]')"
                           ".getAttribute('aria-sort') === 'ascending'")
    names = rows(page)
    page.locator("#sv-desk tr.sv-call-row").nth(0).click()
    page.wait_for_function("(n) => (document.querySelector('#sv-editor .sv-editor-title') || {})"
                           ".textContent?.endsWith(n)", arg=names[0], timeout=60_000)
    for want, click in ((1, ".sv-next-call"), (2, ".sv-next-call"), (1, ".sv-prev-call")):
        page.locator(f"#sv-editor {click}").click()
        page.wait_for_function("(n) => (document.querySelector('#sv-editor .sv-editor-title') || {})"
                               ".textContent?.endsWith(n)", arg=names[want], timeout=60_000)
        page.wait_for_selector("#sv-editor .sv-edit-seg", timeout=30_000)
        assert rows(page) == names  # the table as it was
        current = page.locator("#sv-desk tr.sv-call-row.sv-current .sv-call-name").all_inner_texts()
        assert current == [names[want]]
    page.locator("#sv-editor .sv-prev-call").click()
    page.wait_for_function("(n) => (document.querySelector('#sv-editor .sv-editor-title') || {})"
                           ".textContent?.endsWith(n)", arg=names[0], timeout=60_000)
    page.locator("#sv-editor .sv-prev-call").click()  # the first call: nothing before it
    page.wait_for_timeout(500)
    assert editor_title(page).endswith(names[0])


def test_next_call_turns_the_table_s_page(page, server, clip_factory):
    """Past the last row of a page (25 calls) Next call turns the table's page and opens the call
    there; Previous comes back."""
    boot_desk(page, server)
    clip = clip_factory("wav", 16000, 1).read_bytes()
    page.locator("#sv-batch-files").set_input_files(
        [{"name": f"more-{i}.wav", "mimeType": "audio/wav", "buffer": clip} for i in range(6)])
    page.wait_for_function("() => document.querySelectorAll('#sv-desk .sv-batch-done').length === 6",
                           timeout=120_000)
    page.locator("#sv-desk th[data-sort=name]").click()
    page.wait_for_function("() => document.querySelector('#sv-desk th[data-sort=name]')"
                           ".getAttribute('aria-sort') === 'ascending'")
    page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 25")
    names = rows(page)
    assert names[-1] == "more-4.wav", names
    page.locator("#sv-desk tr.sv-call-row").nth(24).click()
    title = ("(n) => ((document.querySelector('#sv-editor .sv-editor-title') || {}).textContent || '')"
             ".endsWith(n)")
    page.wait_for_function(title, arg="more-4.wav", timeout=60_000)
    page.locator("#sv-editor .sv-next-call").click()
    page.wait_for_function(title, arg="more-5.wav", timeout=60_000)
    page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 1")
    assert rows(page) == ["more-5.wav"]
    page.locator("#sv-editor .sv-prev-call").click()
    page.wait_for_function(title, arg="more-4.wav", timeout=60_000)
    page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 25")
    assert rows(page) == names


def open_long_call(page):
    page.locator("#sv-desk .sv-desk-search").fill("long-call")
    page.wait_for_function("() => document.querySelectorAll('#sv-desk tr.sv-call-row').length === 1")
    page.locator("#sv-desk tr.sv-call-row").first.click()
    page.wait_for_selector("#sv-editor .sv-edit-seg", timeout=60_000)


def test_edit_flag_reviewed_with_the_keyboard_survive_reload_and_restart(
        page, server, demo_dir, data_dir):
    boot_desk(page, server)
    open_long_call(page)
    n = page.locator("#sv-editor .sv-edit-seg").count()
    assert n >= 2
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.keyboard.press("k")  # next segment
    assert page.locator("#sv-editor .sv-edit-seg.sv-current").get_attribute("data-index") == "1"
    page.keyboard.press("j")  # back
    assert page.locator("#sv-editor .sv-edit-seg.sv-current").get_attribute("data-index") == "0"
    page.evaluate("document.querySelector('#sv-editor audio').pause()")  # (J/K play the segment)
    page.keyboard.press("Space")
    page.wait_for_function("() => !document.querySelector('#sv-editor audio').paused", timeout=10_000)
    page.keyboard.press("Space")
    page.wait_for_function("() => document.querySelector('#sv-editor audio').paused", timeout=10_000)
    page.locator("#sv-speed").select_option("1.5")
    assert page.evaluate("document.querySelector('#sv-editor audio').playbackRate") == 1.5
    page.keyboard.press("l")
    assert "Looping" in page.locator("#sv-editor .sv-editor-status").inner_text()
    page.keyboard.press("l")
    page.keyboard.press("e")  # edit the current segment
    box = page.locator("#sv-editor textarea.sv-edit-input")
    box.fill("The reviewer's <b>words</b>")
    box.press("Enter")
    page.wait_for_selector("#sv-editor .sv-edit-seg.sv-corrected .sv-corrected-mark", timeout=10_000)
    page.evaluate("document.activeElement && document.activeElement.blur()")
    page.keyboard.press("f")  # flag it; the note field takes the focus
    note = page.locator("#sv-editor .sv-edit-note")
    note.wait_for(timeout=10_000)
    page.wait_for_function("() => document.activeElement && document.activeElement.classList.contains('sv-edit-note')")
    page.keyboard.type("<img src=x onerror=window.__xss=1> check")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.querySelector('#sv-editor .sv-editor-status').textContent.length > 0")
    page.locator("#sv-reviewed-box").check()
    page.wait_for_timeout(500)
    job_id = page.locator("#sv-editor .sv-edit-seg").first.evaluate(
        "() => new URLSearchParams(location.search).get('job')")
    page.wait_for_function(f"""async () => {{
        const r = await fetch('/api/jobs/{job_id}'); const j = await r.json();
        return j.review && j.review.reviewed && j.review.flagged === 1 && j.review.corrected === 1; }}""",
                           timeout=10_000)
    # a reload: the editor shows what the server kept
    page.reload(wait_until="load")
    page.wait_for_selector("#sv-editor .sv-edit-seg.sv-corrected", timeout=60_000)
    assert page.locator("#sv-editor .sv-edit-seg.sv-flagged .sv-edit-note").input_value() == \
        "<img src=x onerror=window.__xss=1> check"
    assert page.evaluate("window.__xss") is None  # a note is text, never markup
    assert page.locator("#sv-reviewed-box").is_checked()
    # the table shows the flag and the reviewed mark
    page.wait_for_function("() => [...document.querySelectorAll('#sv-desk .sv-call-flags')]"
                           ".some(td => td.textContent.includes('1'))", timeout=10_000)
    # a server restart: still there, and in every export
    url = page.url
    server.stop()
    again = LiveServer(server.settings).start()  # same data, same port: the page's origin
    try:
        page.goto(url, wait_until="load")
        page.wait_for_selector("#sv-editor .sv-edit-seg.sv-corrected", timeout=60_000)
        assert page.locator("#sv-reviewed-box").is_checked()
        base = f"{again.url}/api/jobs/{job_id}/result?format="
        for fmt in ("srt", "vtt", "txt", "json"):
            body = httpx.get(base + fmt, timeout=30).text
            assert "words" in body, fmt
        doc = json.loads(httpx.get(base + "json", timeout=30).text)
        seg = next(s for s in doc["result"]["segments"] if s["corrected"])
        assert seg["text"] == "The reviewer's <b>words</b>" and seg["model_text"] != seg["text"]
        assert doc["review"]["reviewed"] is True
        assert "[FLAGGED: <img src=x onerror=window.__xss=1> check]" in httpx.get(base + "txt").text
        # the README's picture of the desk, from this run (copied with SENSEVOICE_UPDATE_SCREENSHOT=1)
        page.wait_for_selector("#sv-desk tr.sv-call-row", timeout=30_000)
        page.evaluate("document.activeElement && document.activeElement.blur()")
        page.evaluate("window.scrollTo(0, 0)")
        page.wait_for_timeout(300)
        shot = data_dir / "desk.png"
        page.screenshot(path=str(shot), full_page=True)
        if os.environ.get("SENSEVOICE_UPDATE_SCREENSHOT") == "1":
            shutil.copyfile(shot, ROOT / "docs" / "desk.png")
    finally:
        again.stop()


@pytest.fixture(scope="module")
def phone_server(demo_dir, tmp_path_factory):
    srv = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("desk-phone"))).start()
    yield srv
    srv.stop()


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_phone_scrolls_to_the_result_and_fits(phone_server, browser, clip_factory, lang):
    ctx = browser.new_context(viewport={"width": 390, "height": 844}, is_mobile=True, has_touch=True)
    pg = ctx.new_page()
    try:
        pg.add_init_script(f"localStorage.setItem('sv-lang', '{lang}')")
        open_ui(pg, phone_server)
        if lang == "zh":  # the page as it opens, the empty upload widget's words included
            pg.wait_for_function("() => /点击上传/.test(document.querySelector('#sv-audio').innerText)",
                                 timeout=15_000)
            # Gradio's own words can be Chinese before the page's are (a loaded CI machine showed
            # 13 English texts left at that moment): wait for the page's, then check
            wait_no_english(pg)
            assert english_left(pg) == []
        # a text file: the app's own error box in the page's language, not Gradio's toast
        pg.locator("input[type=file]").first.set_input_files(
            {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"not audio"})
        pg.wait_for_function("() => document.querySelector('#sv-state-view').textContent.trim().length > 0",
                             timeout=10_000)
        said = pg.locator("#sv-state-view").inner_text()
        assert ("无法读取" if lang == "zh" else "cannot be read as audio or video") in said, said
        pg.wait_for_timeout(500)
        assert pg.locator(".toast-body, .toast-wrap .toast").count() == 0
        clip = clip_factory("wav", 16000, 1)
        pg.locator("input[type=file]").first.set_input_files(str(clip))
        pg.wait_for_selector("#sv-audio [data-testid^='waveform-']", timeout=30_000)
        # no Share button on the player (it only works on Hugging Face Spaces)
        labels = pg.eval_on_selector_all(
            "#sv-audio button", "bs => bs.map(b => (b.getAttribute('aria-label') || '') + ' ' + (b.title || ''))")
        assert labels and not [x for x in labels if "share" in x.lower() or "分享" in x], labels
        pg.evaluate("window.scrollTo(0, 0)")
        pg.locator("#sv-submit").click()
        pg.wait_for_selector("#sv-result .sv-seg", timeout=60_000)
        pg.wait_for_timeout(300)
        top = pg.evaluate("document.querySelector('#sv-state-view').getBoundingClientRect().top")
        assert -2 <= top < 844 * 0.6, top  # in view, not below the fold
        assert pg.evaluate("document.activeElement && document.activeElement.id") == "sv-state-view"
        pg.wait_for_selector("#sv-editor .sv-edit-seg", timeout=30_000)
        # the desk's table lists the call just made, without a reload
        pg.wait_for_function("(n) => [...document.querySelectorAll('#sv-desk .sv-call-name')]"
                             ".some(td => td.textContent === n)", arg=clip.name, timeout=15_000)
        width = pg.evaluate("document.documentElement.scrollWidth")
        assert width <= 392, width  # no sideways scrolling of the page
        detect = pg.locator("#sv-language input").input_value()
        assert detect == ("自动检测" if lang == "zh" else "Detect"), detect
        if lang == "zh":
            assert english_left(pg) == []
            desk = pg.locator("#sv-desk").inner_text() + pg.locator("#sv-editor").inner_text()
            for english in ("Calls", "Choose files", "Search", "Download CSV", "Reviewed", "Edit",
                            "Flag", "Speed", "Next call", "Keys:"):
                assert english not in desk, english
            result = pg.locator("#sv-result").inner_text()
            for english in ("Copy", "Show raw", "punctuated"):
                assert english not in result, english
            recent = pg.locator("#sv-recent").inner_text()
            assert "done" not in recent and "完成" in recent and "AM" not in recent and "PM" not in recent
    finally:
        ctx.close()


def truncated_wav(tmp_path) -> tuple[Path, bytes]:
    """A 7.31 s WAV, and its first 0.16 s with the header that still announces 7.31 s."""
    import wave

    import numpy as np

    full = tmp_path / "full.wav"
    with wave.open(str(full), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((np.sin(np.arange(int(7.31 * 16000)) / 9) * 8000).astype("<i2").tobytes())
    return full, full.read_bytes()[:44 + 2 * int(0.16 * 16000)]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_a_truncated_file_is_said_to_be_truncated(phone_server, browser, tmp_path, lang):
    """Issue 23: a truncated WAV showed "Done ... 0.16 s of audio" and nothing else; the CLI said
    "it looks truncated: 0.16 s of the 7.31 s the file announces". The page says it too, with both
    lengths (the WAV header read in the page: the browser's player stops at the bytes there are)."""
    full, cut = truncated_wav(tmp_path)
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    try:
        pg.add_init_script(f"localStorage.setItem('sv-lang', '{lang}')")
        open_ui(pg, phone_server)
        pg.locator("input[type=file]").first.set_input_files(
            {"name": "cut.wav", "mimeType": "audio/wav", "buffer": cut})
        pg.wait_for_selector("#sv-audio [data-testid^='waveform-']", timeout=30_000)
        pg.locator("#sv-submit").click()
        pg.wait_for_selector("#sv-state-view [data-stage=done]", timeout=60_000)
        warning = pg.locator("#sv-state-view .sv-state-warning")
        warning.wait_for(timeout=30_000)
        text = warning.inner_text()
        assert ("不完整" if lang == "zh" else "truncated") in text, text
        assert "0.16 s" in text and "7.31 s" in text, text
        if lang == "zh":
            return
        # the whole file: no warning
        pg.locator("#sv-new").click()
        pg.locator("input[type=file]").first.set_input_files(str(full))
        pg.wait_for_selector("#sv-audio [data-testid^='waveform-']", timeout=30_000)
        pg.locator("#sv-submit").click()
        pg.wait_for_function("() => /7\\.31 s/.test(document.querySelector('#sv-state-view').textContent)",
                             timeout=60_000)
        pg.wait_for_timeout(1000)  # (the length is read in the background)
        assert pg.locator("#sv-state-view .sv-state-warning").count() == 0
    finally:
        ctx.close()


def test_a_truncated_file_in_a_batch_is_said_to_be_truncated(phone_server, browser, tmp_path):
    """The desk's batch list warns the same way, on the truncated call only."""
    full, cut = truncated_wav(tmp_path)
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    try:
        boot_desk(pg, phone_server)
        pg.locator("#sv-batch-files").set_input_files([
            {"name": "cut-call.wav", "mimeType": "audio/wav", "buffer": cut},
            {"name": "whole-call.wav", "mimeType": "audio/wav", "buffer": full.read_bytes()}])
        pg.wait_for_function("() => document.querySelectorAll('#sv-desk .sv-batch-done').length === 2",
                             timeout=120_000)
        warned = pg.locator("#sv-desk .sv-batch-item:has(.sv-batch-warning) .sv-batch-name").all_inner_texts()
        assert warned == ["cut-call.wav"]
        text = pg.locator("#sv-desk .sv-batch-warning").inner_text()
        assert "truncated" in text and "0.16 s" in text and "7.31 s" in text, text
    finally:
        ctx.close()
