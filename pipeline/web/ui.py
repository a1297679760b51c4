"""Gradio UI: a thin client of TranscriptionService.

Submit returns at once with a job id; a gr.Timer polls the job; the raw rich text goes to the browser,
where static/richtext.js renders badges and chips (escaping every piece of text).
"""

from __future__ import annotations

import hmac
import json
import logging
from pathlib import Path

import gradio as gr

from pipeline.web.api import job_json
from pipeline.domain.errors import Busy, SenseVoiceError
from pipeline.web.links import job_links
from pipeline.serving.service import TranscriptionService
from pipeline.domain.types import LANGUAGES, Job, JobState, Lane, TranscribeOptions
from pipeline.web.ui_guard import UploadSweeper, prepare_upload_dir, read_own_upload

logger = logging.getLogger("sensevoice.ui")

STATIC = Path(__file__).resolve().parents[2] / "static"
RENDER_JS = "(raw) => { window.SenseVoiceRich && window.SenseVoiceRich.renderInto('sv-result', raw || ''); return []; }"
# the review view: player (server copy, else the page's own upload), timeline, segment table, exports;
# the server copy and the exports through the job's links (signed when an API token is set)
REVIEW_JS = """(j) => {
  if (!window.SenseVoiceReview) return [];
  const page = document.querySelector('#sv-audio audio');
  let job = null;
  try { job = j ? JSON.parse(j) : null; } catch (e) { job = null; }
  const id = job && job.id ? String(job.id) : '';
  const own = (u) => typeof u === 'string' && u.charAt(0) === '/' && u.charAt(1) !== '/' &&
    u.charAt(1) !== '\\\\' ? u : '';
  const links = job && job.links ? job.links : {};
  window.SenseVoiceReview.renderInto('sv-review', j || '', {
    audioUrl: own(links.audio) || (id ? '/api/jobs/' + encodeURIComponent(id) + '/audio' : ''),
    fallbackAudioUrl: page ? page.src : ''});
  return [];
}"""


DEMO_BANNER = ("**Demo model**: hand-set weights for trying the app offline. "
               "Transcripts are not real speech recognition.")


def head_html() -> str:
    """Our scripts inlined into the page head (no extra route, works under any mount path)."""
    return "".join(f"<script>{(STATIC / name).read_text(encoding='utf-8')}</script>"
                   for name in ("richtext.js", "review.js"))


def css() -> str:
    sheets = [(STATIC / name).read_text(encoding="utf-8") for name in ("style.css", "review.css")]
    return "\n".join(sheets) + "\n.sv-hidden{display:none !important}\n"


def status_line(job: Job) -> str:
    progress = job.meta.get("progress")
    if job.state is JobState.QUEUED:
        if progress:
            return f"queued ({progress})"
        return f"queued, position {job.position}" if job.position else "queued"
    if job.state is JobState.RUNNING:
        return f"running ({progress})" if progress else "running"
    if job.state is JobState.DONE:
        return f"done in {job.duration_s:.2f} s ({job.audio_seconds:.1f} s of audio)"
    err = job.error.message if job.error else "unknown error"
    return f"failed: {err}"


def ui_login(settings):
    """Gradio's ``auth`` for the UI: SENSEVOICE_UI_AUTH's user:password when set; else, when an API
    token is set, any user name with the token as password; else None (no login, loopback use)."""
    if settings.ui_auth:
        user, sep, password = settings.ui_auth.partition(":")
        if not (user and sep and password):  # never a login with an empty password
            raise ValueError("SENSEVOICE_UI_AUTH must be 'user:password' (both non-empty)")
        return (user, password)
    token = settings.api_token
    if not token:
        return None

    def check(_username: str, password: str) -> bool:
        return hmac.compare_digest(str(password).encode(), token.encode())

    return check


def build_ui(service: TranscriptionService, upload_dir: str | None = None) -> gr.Blocks:
    """The UI; it reads audio only from ``upload_dir``, this server's Gradio upload directory
    (default <data_dir>/ui-uploads; mount_ui points Gradio's upload route there)."""
    settings = service.settings
    upload_dir = upload_dir or prepare_upload_dir(settings.data_dir)

    def submit(path: str | None, language: str, use_itn: bool, split_channels: bool):
        idle = gr.Timer(active=False)
        if not path:
            return "", "error: choose or record an audio file first", "", "", idle
        try:
            # only a file Gradio received in this server's upload directory (checked again here:
            # AccessGuard refused any other path before Gradio saw the request)
            path, data = read_own_upload(path, upload_dir, settings.max_upload_bytes)
            options = TranscribeOptions(language=language, use_itn=use_itn,
                                        split_channels=split_channels)
            job = service.submit(data, filename=Path(path).name, options=options,
                                 lane=Lane.INTERACTIVE)
            service.own_file(job.id, path)  # Gradio's cached copy goes with the job
        except Busy as e:
            return "", f"busy, try again in {e.retry_after} s", "", "", idle
        except SenseVoiceError as e:
            return "", f"error: {e.message}", "", "", idle
        return job.id, f"{status_line(job)} — job {job.id}", "", "", gr.Timer(active=True)

    def poll(job_id: str):
        if not job_id:
            return gr.skip(), gr.skip(), gr.skip(), gr.Timer(active=False)
        try:
            job = service.get_cached(job_id) or service.get(job_id)
        except SenseVoiceError as e:
            return f"error: {e.message}", "", "", gr.Timer(active=False)
        finished = job.state in (JobState.DONE, JobState.FAILED)
        raw = job.result.raw_text if job.result else ""
        review = ""
        if job.result:
            body = job_json(job)
            body["links"] = job_links(job, settings.api_token, settings.retention_hours)
            review = json.dumps(body, ensure_ascii=False)
        return f"{status_line(job)} — job {job.id}", raw, review, gr.Timer(active=not finished)

    # Gradio's upload cache holds the page's copy of each recording (the player's fallback): a
    # submitted one is deleted with its job (service.own_file); Gradio's delete_cache sweep catches
    # the uploads of this process never submitted, and UploadSweeper (run by the service's janitor)
    # the ones from before a restart
    retention_s = max(int(settings.retention_hours * 3600), 60)
    sweeper = UploadSweeper(upload_dir, retention_s, every_s=min(retention_s, 3600))
    sweeper.sweep()
    service.on_purge.append(sweeper)
    with gr.Blocks(title="SenseVoice", delete_cache=(min(retention_s, 3600), retention_s)) as demo:
        gr.Markdown("## SenseVoice speech recognition\nUpload or record audio (or a video); "
                    "the transcript shows language, emotion and audio events.")
        # the model may still be resolving when the UI is built: decide on each page load
        banner = gr.Markdown(DEMO_BANNER, visible=False, elem_id="sv-demo-banner")
        demo.load(lambda: gr.Markdown(visible=service.is_demo), None, banner)
        with gr.Row():
            with gr.Column():
                audio = gr.Audio(sources=["upload", "microphone"], type="filepath", label="Audio",
                                 elem_id="sv-audio")
                language = gr.Dropdown(list(LANGUAGES), value="auto", label="Language")
                use_itn = gr.Checkbox(value=True, label="ITN (punctuation and numbers)")
                split = gr.Checkbox(value=False, label="Stereo call: one speaker per channel",
                                    elem_id="sv-split")
                with gr.Row():
                    submit_btn = gr.Button("Submit", variant="primary", elem_id="sv-submit")
                    refresh_btn = gr.Button("Refresh", elem_id="sv-refresh")
            with gr.Column():
                status = gr.Textbox(label="Status", interactive=False, elem_id="sv-status")
                gr.HTML("", elem_id="sv-result")
                raw = gr.Textbox(elem_id="sv-raw", elem_classes=["sv-hidden"], show_label=False,
                                 interactive=False)
        gr.HTML("", elem_id="sv-review")
        review = gr.Textbox(elem_id="sv-review-json", elem_classes=["sv-hidden"], show_label=False,
                            interactive=False)
        job_id = gr.State("")
        timer = gr.Timer(settings.poll_interval_s, active=False)
        submit_btn.click(submit, [audio, language, use_itn, split], [job_id, status, raw, review, timer],
                         concurrency_limit=None)
        timer.tick(poll, [job_id], [status, raw, review, timer], concurrency_limit=None,
                   show_progress="hidden")
        refresh_btn.click(poll, [job_id], [status, raw, review, timer], concurrency_limit=None)
        raw.change(None, [raw], None, js=RENDER_JS)
        review.change(None, [review], None, js=REVIEW_JS)
    return demo

