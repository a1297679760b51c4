"""Gradio UI: a thin client of the intake and the job view; the page's own script does the rest.

Submit returns at once with the job's live view (pipeline/web/routes/events.py ``live_view``). The
page script (static/app.js) then puts the job in the URL (``?job=ID``, plus the job's signed
``exp``/``sig`` when an API token is set), follows it over ``GET /api/jobs/{id}/events`` (Server-Sent
Events: pushed the moment the worker stores a state, no timer anywhere) and renders each state and
the result: static/richtext.js (chips of a short clip) and static/review.js (the review view of a
timed recording), every piece of text escaped. A reload, or a job reopened from the browser's recent
list, follows the job again from its URL.

Live mode (static/live.js, static/live-worklet.js): the page streams the microphone over the
WebSocket ``/api/stream`` and draws the growing transcript; the recording can then be saved as a
job through this UI's own submit (the Gradio upload route, then the ``submit`` endpoint below).

Labels are English and Chinese (gr.I18n, following the browser's language or the page's switch).
"""

from __future__ import annotations

import hmac
import io
import logging
import os
import secrets
import shutil
import subprocess
import threading
import time
import wave
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import numpy as np
import orjson

from pipeline.domain.errors import Busy, SenseVoiceError
from pipeline.domain.tags import AUTO_LANGUAGE, LANGUAGE_TABLE, NO_SPEECH, SAMPLE_RATE_HZ
from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
from pipeline.serving.intake import Intake
from pipeline.web.links import live_query
from pipeline.web.views import JobPages
from pipeline.web.ui_guard import UI_PATH, UploadSweeper, prepare_upload_dir, read_own_upload
from pipeline.web.vocab import vocab_script

logger = logging.getLogger("sensevoice.ui")

STATIC = next(p / "static" for p in Path(__file__).resolve().parents[1:3] if (p / "static").is_dir())  # installed | repo
SCRIPTS = ("richtext.js", "review.js", "app.js", "live-worklet.js", "live.js", "desk.js", "kiosk.js")  # inlined into the
# page head, in this order
SHEETS = ("style.css", "review.css", "app.css", "live.css", "desk.css")  # through Gradio's css (scoped to the app)
RAW_SHEETS = ("review.css", "app.css", "live.css", "desk.css")  # also in the head as written (see head_html)
# what the widget accepts besides audio/*: the video containers the decoder opens (the page
# script hands them to the Audio component as audio; pipeline/audio/decode.py ALLOWED_DEMUXERS)
VIDEO_TYPES = ("video/*", ".mp4", ".m4v", ".mov", ".mkv", ".webm", ".avi", ".ts", ".mts", ".wmv")
# the language choices, by the names their speakers use ("nospeech" is a model tag, not a choice)
LANGUAGE_CHOICES = (("Detect", AUTO_LANGUAGE),
                    *((lang.native, lang.code) for lang in LANGUAGE_TABLE if lang.code != NO_SPEECH))

# the page's words: English, and Chinese (zh), for the components Gradio draws (keys prefixed: not
# to shadow Gradio's own translation keys); static/app.js has the words it draws itself
WORDS = {
    "en": {
        "sv_title": "## SenseVoice speech recognition\nUpload or record audio, or a video: the "
                 "transcript shows its language, emotion and sound events.",
        "sv_demo": "**Demo model**: hand-set weights for trying the app offline. Transcripts are not "
                "real speech recognition.",
        "sv_audio": "Audio",  # (the upload widget: audio or video; browser tests find it by this label)
        "sv_language": "Language",
        "sv_detect": "Detect",
        "sv_itn": "Punctuation and numbers",
        "sv_itn_info": "Adds punctuation and writes numbers as digits (inverse text normalisation, ITN)",
        "sv_split": "Stereo call: one speaker per channel",
        "sv_hotwords": "Hotwords: words or names to favour, one a line (term or term:weight)",
        "sv_submit": "Transcribe",
        "sv_new": "New",
        "sv_sample_hello": "English greeting",
        "sv_sample_nihao": "Chinese greeting",
        "sv_sample_call": "A call (two speakers, 40 s)",
        # Gradio's status line says this key when an event completes; its own dictionaries lack
        # it (Gradio 6.31), so the page read "common.complete" in either language
        "common.complete": "Done",
    },
    "zh": {
        "sv_title": "## SenseVoice 语音识别\n上传或录制音频（或视频）：转写结果标出语种、情绪和声音事件。",
        "sv_demo": "**演示模型**：用于离线试用的手工权重，转写结果不是真正的语音识别。",
        "sv_audio": "音频（或视频）",
        "sv_language": "语种",
        "sv_detect": "自动检测",
        "sv_itn": "标点和数字",
        "sv_itn_info": "加标点，数字写成阿拉伯数字（逆文本正则化，ITN）",
        "sv_split": "立体声通话：每个声道一位说话人",
        "sv_hotwords": "热词：需要优先识别的词或名称，每行一个（词 或 词:权重）",
        "sv_submit": "转写",
        "sv_new": "新建",
        "sv_sample_hello": "英语问候",
        "sv_sample_nihao": "中文问候",
        "sv_sample_call": "一段通话（两位说话人，40 秒）",
        "common.complete": "完成",
    },
}


def head_html() -> str:
    """Our scripts, and the sheets' page-level rules, inlined into the page head (no extra route,
    works under any mount path). Gradio's ``css`` (:func:`css`) rewrites every rule under the
    app's root and drops what it does not know: the rules on <html> and <body> (app.css) and the
    container query of the narrow review table (review.css, ``!important`` there for this) work
    from this unrewritten copy."""
    sheets = "\n".join((STATIC / name).read_text(encoding="utf-8") for name in RAW_SHEETS)
    scripts = vocab_script() + "".join(f"<script>{(STATIC / name).read_text(encoding='utf-8')}</script>"
                                       for name in SCRIPTS)
    return f'<link rel="icon" href="/favicon.ico" sizes="any"><style>{sheets}</style>{scripts}'


def css() -> str:
    sheets = [(STATIC / name).read_text(encoding="utf-8") for name in SHEETS]
    return "\n".join(sheets) + "\n.sv-hidden{display:none !important}\n"


def status_line(job: Job) -> str:
    """The job's state in words, for API clients of the UI's submit (the page shows its own)."""
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


def refusal_view(code: str, message: str, retry_after: int | None = None) -> str:
    """The page's view of a submit that made no job (the page words it from the code). ``at``
    makes each one new: the same refusal twice still reaches the page (a change event)."""
    error = {"code": code, "message": message}
    if retry_after is not None:
        error["retry_after"] = retry_after
    return orjson.dumps({"id": None, "stage": "failed", "status": "refused", "error": error,
                         "at": time.time()}).decode()


def ui_login(settings):
    """Gradio's ``auth`` for the UI: SENSEVOICE_UI_AUTH's user:password when set; else, when an API
    token is set, any user name with the token as password; else None (no login, loopback use)."""
    if settings.ui.login:
        user, sep, password = settings.ui.login.partition(":")
        if not (user and sep and password):  # never a login with an empty password
            raise ValueError("SENSEVOICE_UI_AUTH must be 'user:password' (both non-empty)")
        return (user, password)
    token = settings.server.token
    if not token:
        return None

    def check(_username: str, password: str) -> bool:
        return hmac.compare_digest(str(password).encode(), token.encode())

    return check


class Samples:
    """One-click sample recordings made by this project with espeak-ng (never third-party audio),
    generated on first use into ``<data_dir>/ui-samples`` and copied into the UI's upload
    directory for each use (the only place the UI reads from). None without espeak-ng."""

    RATE = SAMPLE_RATE_HZ
    TEXTS = {
        "hello": ("en-us", "Hello, and thanks for calling. How can I help you today?"),
        "nihao": ("cmn", "你好，欢迎使用语音识别。今天天气很好。"),
    }
    CALL = (  # (start s, channel, voice, text): a 40 s stereo call, agent left, customer right
        (1.0, 0, "en-us", "Good morning, thanks for calling. How can I help you?"),
        (7.0, 1, "en-gb", "Hi. I ordered a parcel last week and it has not arrived yet."),
        (15.0, 0, "en-us", "I am sorry to hear that. Let me check the tracking number for you."),
        (24.0, 1, "en-gb", "Thank you, that is great. I will wait for the email then."),
        (32.0, 0, "en-us", "You are welcome. Have a lovely day."),
    )
    CALL_SECONDS = 40.0

    def __init__(self, data_dir: str | Path, upload_dir: str):
        self.dir = Path(os.path.realpath(data_dir)) / "ui-samples"
        self.upload_dir = upload_dir
        self.espeak = shutil.which("espeak-ng")
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self.espeak is not None

    def _speak(self, voice: str, text: str) -> np.ndarray:
        done = subprocess.run([self.espeak, "-v", voice, "-s", "150", "--stdout", text],
                              capture_output=True, timeout=30, check=True)
        with wave.open(io.BytesIO(done.stdout)) as w:
            rate = w.getframerate()
            pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2").astype(np.float32)
        if rate != self.RATE:  # espeak-ng speaks at 22.05 kHz: linear resampling is enough here
            n = int(len(pcm) * self.RATE / rate)
            pcm = np.interp(np.linspace(0, len(pcm) - 1, n), np.arange(len(pcm)), pcm)
        return pcm.astype(np.float32)

    def _write(self, path: Path, frames: np.ndarray) -> None:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with wave.open(str(tmp), "wb") as w:
            w.setnchannels(1 if frames.ndim == 1 else frames.shape[1])
            w.setsampwidth(2)
            w.setframerate(self.RATE)
            w.writeframes(np.clip(frames, -32768, 32767).astype("<i2").tobytes())
        tmp.replace(path)

    def _make(self, name: str) -> Path:
        path = self.dir / f"{name}.wav"
        if path.exists():
            return path
        self.dir.mkdir(parents=True, exist_ok=True)
        if name == "call":
            frames = np.zeros((int(self.CALL_SECONDS * self.RATE), 2), dtype=np.float32)
            for start, channel, voice, text in self.CALL:
                pcm = self._speak(voice, text)
                at = int(start * self.RATE)
                n = min(len(pcm), len(frames) - at)
                frames[at:at + n, channel] = pcm[:n]
        else:
            frames = self._speak(*self.TEXTS[name])
        self._write(path, frames)
        return path

    NAMES = ("hello", "nihao", "call")

    def copy(self, name: str) -> str:
        """Sample ``name`` (one of NAMES) as a new file in the upload directory (what the Audio
        component gets): a copy, never a hard link (the UI reads only files with one link)."""
        if name not in self.NAMES:
            raise KeyError(name)
        with self._lock:
            src = self._make(name)
        folder = Path(self.upload_dir) / secrets.token_hex(16)
        folder.mkdir(mode=0o700)
        dst = folder / f"sample-{name}.wav"
        shutil.copyfile(src, dst)
        return str(dst)


def make_submit(intake: Intake, pages: JobPages, upload_dir: str):
    """The UI's submit (an event handler named ``submit``)."""
    settings = pages.settings

    def submit(path: str | None, language: str, use_itn: bool, split_channels: bool, hotwords: str = ""):
        """Accept one upload; returns (job id, a status line ending in "job <id>", the page's view
        of the job). The page follows the job itself (GET /api/jobs/{id}/events)."""
        if not path:
            message = "choose or record an audio file first"
            return "", f"error: {message}", refusal_view("no_file", message)
        try:
            # only a file Gradio received in this server's upload directory (checked again here:
            # AccessGuard refused any other path before Gradio saw the request)
            path, data = read_own_upload(path, upload_dir, settings.limits.max_upload_bytes)
            options = TranscribeOptions(language=language, use_itn=use_itn,
                                        split_channels=split_channels, hotwords=hotwords or "")
            job = intake.submit(data, filename=Path(path).name, options=options,
                                lane=Lane.INTERACTIVE)
            intake.own_file(job.id, path)  # Gradio's cached copy goes with the job
        except Busy as e:
            return "", f"busy, try again in {e.retry_after} s", refusal_view(e.code, e.message,
                                                                              e.retry_after)
        except SenseVoiceError as e:
            return "", f"error: {e.message}", refusal_view(e.code, e.message)
        view = orjson.dumps(pages.live_view(pages.view.get_cached(job.id) or job)).decode()
        return job.id, f"{status_line(job)} — job {job.id}", view

    return submit


def make_sample(samples: Samples, name: str):
    """The handler of one sample button: the sample into the Audio component (and the stereo
    box ticked for the call)."""
    def load():
        if not samples.available:
            raise gr.Error("samples need espeak-ng on the server")
        return samples.copy(name), name == "call"

    load.__name__ = f"sample_{name}"
    return load


def layout(i18n: gr.I18n, samples: Samples) -> SimpleNamespace:
    """The page's components (static/app.js draws into the gr.HTML ones)."""
    c = SimpleNamespace()
    with gr.Row(elem_id="sv-header"):
        gr.Markdown(i18n("sv_title"), elem_id="sv-title")
        gr.HTML("", elem_id="sv-topbar")  # app.js: the language switch
    # the model may still be resolving when the UI is built: decide on each page load
    c.banner = gr.Markdown(i18n("sv_demo"), visible=False, elem_id="sv-demo-banner")
    with gr.Row(elem_id="sv-main"):
        with gr.Column(elem_id="sv-input", min_width=300):
            gr.HTML("", elem_id="sv-modes")  # live.js: the File | Live switch
            # no Share button: it only works on Hugging Face Spaces ("Must be on Spaces to share")
            c.audio = gr.Audio(sources=["upload", "microphone"], type="filepath",
                               label=i18n("sv_audio"), elem_id="sv-audio", buttons=["download"])
            gr.HTML("", elem_id="sv-live")  # live.js: Start/Stop, the state, Save as a job
            with gr.Row(elem_id="sv-options"):
                c.language = gr.Dropdown([(i18n("sv_detect"), AUTO_LANGUAGE), *LANGUAGE_CHOICES[1:]],
                                         value=AUTO_LANGUAGE,
                                         label=i18n("sv_language"), elem_id="sv-language",
                                         min_width=140)
                c.use_itn = gr.Checkbox(value=True, label=i18n("sv_itn"), info=i18n("sv_itn_info"),
                                        elem_id="sv-itn", min_width=160)
            c.split = gr.Checkbox(value=False, label=i18n("sv_split"), elem_id="sv-split")
            c.hotwords = gr.Textbox(value="", label=i18n("sv_hotwords"), lines=2, max_lines=8, elem_id="sv-hotwords")
            with gr.Row(elem_id="sv-actions"):
                c.submit = gr.Button(i18n("sv_submit"), variant="primary", elem_id="sv-submit",
                                     scale=3)
                c.new = gr.Button(i18n("sv_new"), elem_id="sv-new", scale=1)
            with gr.Row(elem_id="sv-samples", visible=samples.available):
                c.samples = {name: gr.Button(i18n(f"sv_sample_{name}"), size="sm",
                                             elem_id=f"sv-sample-{name}") for name in Samples.NAMES}
        with gr.Column(elem_id="sv-output", min_width=300):
            gr.HTML("", elem_id="sv-live-transcript")  # live.js: the live transcript
            gr.HTML("", elem_id="sv-state-view")  # app.js: the job's state, honestly worded
            gr.HTML("", elem_id="sv-result")  # richtext.js: a short clip's chips
    gr.HTML("", elem_id="sv-review")  # review.js: a timed recording's review view
    gr.HTML("", elem_id="sv-editor")  # desk.js: the review editor (corrections, flags, keys)
    gr.HTML("", elem_id="sv-recent")  # app.js: this browser's recent jobs
    gr.HTML("", elem_id="sv-desk")  # desk.js: many calls at once, the calls table
    # the channel from submit to the page script (and the text API clients of submit read)
    c.status = gr.Textbox(elem_id="sv-status", elem_classes=["sv-hidden"], show_label=False,
                          interactive=False)
    c.view = gr.Textbox(elem_id="sv-job", elem_classes=["sv-hidden"], show_label=False,
                        interactive=False)
    c.job_id = gr.State("")
    # live.js asks for a fresh live link through this event's endpoint (never drawn)
    c.live_link = gr.Button(visible=False, elem_id="sv-live-link")
    c.live_link_out = gr.Textbox(visible=False)
    return c


# Live captions (static/live.js): the most of a live recording the page keeps to save as a job,
# seconds (16 kHz 16-bit mono: 57.6 MB for 30 min in the browser's memory); lower when the server's
# upload size or audio length limits are (the saved WAV must pass them)
LIVE_KEEP_MAX_S = 30 * 60


def live_config(settings, enabled: bool = True) -> dict:
    """What static/live.js needs from the server: whether live captions are served here, where the
    stream and the UI's own routes are (upload, submit, and a fresh live link when an API token is
    set), and how much of a live recording the page may keep to save as a job."""
    # the page sends and keeps 16-bit mono at SAMPLE_RATE_HZ: a WAV header, then the samples
    by_size = (settings.limits.max_upload_bytes - 44) / (2 * SAMPLE_RATE_HZ)
    keep = int(max(0, min(LIVE_KEEP_MAX_S, settings.limits.max_audio_seconds, by_size)))
    api = UI_PATH + "/gradio_api"
    return {"enabled": bool(enabled and settings.live.max_streams > 0),
            "streamPath": "/api/stream", "linkPath": api + "/run/live_link" if settings.server.token else "",
            "uploadPath": api + "/upload", "submitPath": api + "/run/submit", "keepSeconds": keep}


def make_live_link(settings):
    """The UI's ``live_link`` endpoint: a fresh signed live link (``exp=..&sig=..``, an hour) for
    the page's stream when an API token is set ("" without one). Behind the UI's login, like the
    page itself: the page never holds the token."""
    def live_link() -> str:
        return live_query(settings.server.token)

    return live_link


def on_live_load(settings, enabled: bool = True) -> str:
    """Gradio's load hook for Live: the config (numbers and fixed paths, JSON) and the page's
    current language and punctuation choices."""
    config = orjson.dumps(live_config(settings, enabled)).decode()
    return (f"(language, itn) => {{ window.SenseVoiceLive && window.SenseVoiceLive.boot({config},"
            " {language: language, useItn: itn}); return []; }")


ON_LIVE_LANGUAGE = ("(v) => { window.SenseVoiceLive && window.SenseVoiceLive.setOptions({language: v});"
                    " return []; }")
ON_LIVE_ITN = "(v) => { window.SenseVoiceLive && window.SenseVoiceLive.setOptions({useItn: v}); return []; }"


# the page script's hooks: the click time (the page measures "done in" from it) and Submit off at
# once; after the submit, one that ended without an answer (an internal error) says so; the
# answer; "New" (no server round trip)
ON_SUBMIT = ("(...args) => { window.SenseVoiceApp && window.SenseVoiceApp.submitting();"
             " return args; }")
ON_ENDED = "() => { window.SenseVoiceApp && window.SenseVoiceApp.submitEnded(); return []; }"
ON_VIEW = "(v) => { window.SenseVoiceApp && window.SenseVoiceApp.accepted(v); return []; }"
ON_NEW = "() => window.SenseVoiceApp ? window.SenseVoiceApp.reset() : [null, '', '']"
ON_LOAD = ("() => { window.SenseVoiceApp && window.SenseVoiceApp.boot(); "
           "window.SenseVoiceDesk && window.SenseVoiceDesk.boot(); return []; }")


def on_load(ui) -> str:
    """Gradio's load hook of the page: the app, the desk, and kiosk mode (static/kiosk.js: the
    setting's config, JSON; ``?kiosk=1`` turns it on without the setting)."""
    kiosk = orjson.dumps({"enabled": bool(ui.kiosk), "clear_s": float(ui.kiosk_clear_s)}).decode()
    return ON_LOAD.replace("return []; }", f"window.SenseVoiceKiosk && window.SenseVoiceKiosk.boot({kiosk}); "
                           "return []; }")


def wire(demo: gr.Blocks, c: SimpleNamespace, face: UiFace, submit, samples: Samples) -> None:
    settings = face.pages.settings
    demo.load(lambda: gr.Markdown(visible=face.is_demo()), None, c.banner, js=on_load(settings.ui))
    # Live captions: the page script streams the microphone itself; these hand it the choices
    # (live captions need a process that holds the model: not an api-role process)
    demo.load(None, [c.language, c.use_itn], None, js=on_live_load(settings, enabled=face.live))
    c.live_link.click(make_live_link(settings), None, c.live_link_out, queue=False,
                      show_progress="hidden", api_name="live_link")
    c.language.change(None, [c.language], None, js=ON_LIVE_LANGUAGE)
    c.use_itn.change(None, [c.use_itn], None, js=ON_LIVE_ITN)
    inputs = [c.audio, c.language, c.use_itn, c.split, c.hotwords]
    outputs = [c.job_id, c.status, c.view]
    # queue=False: one plain POST answers it (no queue join and event stream round trips: the
    # handler returns in milliseconds, the job itself waits in the service's own queue)
    c.submit.click(submit, inputs, outputs, js=ON_SUBMIT, queue=False, show_progress="hidden",
                   api_name="submit").then(None, None, None, js=ON_ENDED)
    for name, btn in c.samples.items():
        btn.click(make_sample(samples, name), None, [c.audio, c.split], concurrency_limit=None,
                  show_progress="hidden", api_name=False).success(
            submit, inputs, outputs, js=ON_SUBMIT, queue=False, show_progress="hidden",
            api_name=False).then(None, None, None, js=ON_ENDED)
    c.view.change(None, [c.view], None, js=ON_VIEW)
    c.new.click(None, None, [c.audio, c.status, c.view], js=ON_NEW)


@dataclass(frozen=True)
class UiFace:
    """What the page needs of the process: accept uploads, show jobs, whether the model is the
    demo one, whether live captions are served here, and the retention hooks."""

    intake: Intake
    pages: JobPages
    is_demo: Callable[[], bool]
    live: bool
    on_purge: list


def build_ui(face: UiFace, upload_dir: str | None = None) -> gr.Blocks:
    """The UI; it reads audio only from ``upload_dir``, this server's Gradio upload directory
    (default <data_dir>/ui-uploads; mount_ui points Gradio's upload route there)."""
    settings = face.pages.settings
    upload_dir = upload_dir or prepare_upload_dir(settings.server.data_dir)
    samples = Samples(settings.server.data_dir, upload_dir)
    # Gradio's upload cache holds the page's copy of each recording (the player's fallback): a
    # submitted one is deleted with its job (Intake.own_file); Gradio's delete_cache sweep catches
    # the uploads of this process never submitted, and UploadSweeper (run by the service's janitor)
    # the ones from before a restart
    retention_s = max(int(settings.limits.retention_hours * 3600), 60)
    sweeper = UploadSweeper(upload_dir, retention_s, every_s=min(retention_s, 3600))
    sweeper.sweep()
    face.on_purge.append(sweeper)
    i18n = gr.I18n(**WORDS)
    with gr.Blocks(title="SenseVoice", delete_cache=(min(retention_s, 3600), retention_s)) as demo:
        demo.i18n_instance = i18n  # what mount_gradio_app(i18n=...) would set
        wire(demo, layout(i18n, samples), face, make_submit(face.intake, face.pages, upload_dir), samples)
    return demo


def mount_ui(app, runtime, pages: JobPages):
    """The Gradio UI at /ui (/ redirects there), hardened: its own upload directory
    (<data_dir>/ui-uploads, 0700: the only files the UI reads, see pipeline/web/ui_guard.py), a login
    whenever an API token or SENSEVOICE_UI_AUTH is set, no file access to the rest of the data
    directory, no internal errors shown, no monitoring route, no run history, capped uploads."""
    import gradio as gr
    from fastapi.responses import RedirectResponse


    @app.get("/", include_in_schema=False)
    async def root():
        return RedirectResponse(UI_PATH + "/")

    settings = runtime.settings
    upload_dir = prepare_upload_dir(settings.server.data_dir)
    # Gradio reads GRADIO_TEMP_DIR when it builds each component (its cache), when it builds the
    # mounted app (the upload route's folder) and in some checks at request time: never the
    # host-wide /tmp/gradio, whose files any other Gradio app on the host may have put there
    os.environ["GRADIO_TEMP_DIR"] = upload_dir
    blocks = build_ui(UiFace(runtime.intake, pages, lambda: runtime.is_demo, runtime.live_decode is not None,
                             runtime.on_purge), upload_dir)
    data_dir = os.path.realpath(settings.server.data_dir)
    blocked = {os.path.join(data_dir, name) for name in
               ("spool", "jobs.sqlite3", "jobs.sqlite3-wal", "jobs.sqlite3-shm", "jobs.sqlite3-journal")}
    blocked |= {e.path for e in os.scandir(data_dir) if e.name != os.path.basename(upload_dir)}
    app = gr.mount_gradio_app(
        app, blocks, path=UI_PATH, css=css(), head=head_html(), auth=ui_login(settings),
        show_error=False, max_file_size=settings.limits.max_upload_bytes, blocked_paths=sorted(blocked),
        enable_monitoring=False, footer_links=[], mcp_server=False, ssr_mode=False,
        run_history=False,
    )
    # pinned on the objects too: another app built later in this process cannot move them
    for block in [blocks, *blocks.blocks.values()]:
        block.GRADIO_CACHE = upload_dir
    for route in app.routes:
        if getattr(route, "path", None) == UI_PATH and hasattr(route.app, "uploaded_file_dir"):
            route.app.uploaded_file_dir = upload_dir
            app.state.gradio_app = route.app  # its login, for AccessGuard
    return app
