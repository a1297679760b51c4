"""The batch CLI and its REST client: real files in (espeak-ng / ffmpeg), mirrored outputs out, a
second run that resumes, a corrupt file that fails alone, a busy server that is waited for, an
interrupted run that leaves nothing half-written, and the README's example run as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch

from pipeline import cli
from pipeline.client import ApiError, Client, WaitTimeout, retry_after_seconds
from pipeline.domain.types import TranscribeOptions
from tests.conftest import MODEL_CACHE, ROOT, LiveServer, make_settings
from tests.media import convert

ALL = "txt,json,srt,vtt"
TOKEN = "cli-test-token"


def outputs(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}


def named(stem: str, formats: str = ALL) -> set[str]:
    return {f"{stem}.{f}" for f in formats.split(",")}


@pytest.fixture(scope="module")
def tree(tmp_path_factory, speech_clip, clip_factory) -> Path:
    """in/a/call.wav and in/b/call.wav (same name), in/b/sub/clip.mp3, in/b/sub/bad.wav (not audio),
    and what a walk must leave: a text file, a hidden file, a link out of the tree, a link loop."""
    root = tmp_path_factory.mktemp("tree")
    src = root / "in"
    for d in ("a", "b/sub"):
        (src / d).mkdir(parents=True)
    shutil.copy(speech_clip, src / "a" / "call.wav")
    convert(speech_clip, src / "b" / "call.wav", rate=22050)  # a different recording, same name
    shutil.copy(clip_factory("mp3", 44100, 2), src / "b" / "sub" / "clip.mp3")
    (src / "b" / "sub" / "bad.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot really")
    (src / "notes.txt").write_text("not audio")
    shutil.copy(speech_clip, src / ".hidden.wav")
    shutil.copy(speech_clip, root / "elsewhere.wav")
    (src / "outside.wav").symlink_to(root / "elsewhere.wav")
    (src / "b" / "loop").symlink_to(src, target_is_directory=True)
    return src


def run_local(*args, demo_dir, capsys) -> tuple[int, str, str]:
    code = cli.main([*map(str, args), "--model", str(demo_dir), "--device", "cpu", "--jobs", "2"])
    out, err = capsys.readouterr()
    return code, out, err


# -- local mode ------------------------------------------------------------------------------


def test_folder_walk_mirrors_the_tree_and_a_second_run_resumes(tree, demo_dir, tmp_path, capsys):
    out = tmp_path / "out"
    code, table, err = run_local(tree, "--output-dir", out, "--format", ALL, "--language", "en",
                                 demo_dir=demo_dir, capsys=capsys)
    assert code == 1  # one corrupt file: it fails alone
    expected = named("a/call") | named("b/call") | named("b/sub/clip")
    assert outputs(out) == expected  # mirrored: same-named files do not collide; no temp files
    assert "3 transcribed, 0 already done, 1 failed" in table
    assert re.search(r"b/sub/bad\.wav\s+unsupported_media: ", table)  # the reason, in the table
    for row in ("audio hours", "wall time", "x real time"):
        assert row in table
    assert "audio-h/s" in err and "4/4" in err  # the progress bar: files, audio-hours per second
    assert "outside.wav: a link pointing out of the folder walked" in err
    doc = json.loads((out / "a/call.json").read_text())
    assert doc["result"]["text"] and doc["audio_seconds"] > 1
    assert (out / "b/sub/clip.srt").read_text().startswith("1\n00:00:00,000 --> ")
    assert (out / "b/sub/clip.vtt").read_text().startswith("WEBVTT")

    kept = {p: (out / p).stat().st_mtime_ns for p in expected}
    (out / "b/call.json").unlink()  # an incomplete file: redone; complete ones are skipped
    code, table, _ = run_local(tree, "--output-dir", out, "--format", ALL, "--language", "en",
                               "--quiet", demo_dir=demo_dir, capsys=capsys)
    assert code == 1
    assert "1 transcribed, 2 already done, 1 failed" in table
    assert outputs(out) == expected
    for p in named("a/call") | named("b/sub/clip"):
        assert (out / p).stat().st_mtime_ns == kept[p], p  # untouched


def test_local_mode_takes_a_wavs_samples_as_they_are_and_gives_the_decoded_files_tokens(
        demo_dir, tmp_path, clip_factory):
    """A short mono 16 kHz 16-bit WAV is queued as its int16 samples (no float copy per file),
    the same recording as FLAC decoded to floats: the same transcript either way."""
    from pipeline.serving.runtime import build_runtime

    run = build_runtime(make_settings(demo_dir, tmp_path / "d"), "local")
    wav, flac = clip_factory("wav", 16000, 1).read_bytes(), clip_factory("flac", 16000, 1).read_bytes()
    opts = TranscribeOptions("en")
    assert run._short_pcm16(wav, opts).dtype == torch.int16 and run._short_pcm16(flac, opts) is None
    run.start()
    try:
        (a, sa), (b, sb) = run.submit(wav, opts), run.submit(flac, opts)
        assert sa == sb and a.result(120).raw_text == b.result(120).raw_text != ""
    finally:
        run.stop()


def test_globs_and_file_arguments_share_one_mirror_root(tree, tmp_path):
    plan = cli.make_plan([str(tree / "a" / "call.wav"), str(tree / "b" / "call.wav")], tmp_path, ["txt"])
    assert [t.out for t in plan.todo] == [tmp_path / "a" / "call", tmp_path / "b" / "call"]
    plan = cli.make_plan([f"{tree}/**/*.wav"], tmp_path, ["txt"])
    assert sorted(t.out.relative_to(tmp_path).as_posix() for t in plan.todo) == [
        "a/call", "b/call", "b/sub/bad"]  # hidden and out-of-tree links left out


def test_inputs_that_would_share_outputs_are_refused(tmp_path, speech_clip):
    (tmp_path / "in").mkdir()
    shutil.copy(speech_clip, tmp_path / "in" / "x.wav")
    convert(speech_clip, tmp_path / "in" / "x.flac")
    plan = cli.make_plan([str(tmp_path / "in")], tmp_path / "out", ["txt"])
    assert [t.path.name for t in plan.todo] == ["x.flac"]
    assert plan.failed[0][0].endswith("x.wav") and "would overwrite" in plan.failed[0][1]


def test_an_output_that_cannot_be_written_leaves_no_temporary_file(tmp_path):
    target = tmp_path / "call.txt"
    target.mkdir()  # the rename into place fails after the body is written
    with pytest.raises(OSError):
        cli.write_atomic(target, b"hello\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["call.txt"]
    cli.write_atomic(tmp_path / "sub" / "ok.txt", b"hello\n")
    assert (tmp_path / "sub" / "ok.txt").read_bytes() == b"hello\n"
    assert [p.name for p in (tmp_path / "sub").iterdir()] == ["ok.txt"]


def test_format_is_a_comma_list():
    assert cli.parse_args(["x", "--out", "o", "--format", "txt, SRT,txt"]).format == ("txt", "srt")
    with pytest.raises(SystemExit):
        cli.parse_args(["x", "--out", "o", "--format", "txt,docx"])


def test_languages_is_an_allow_list_checked_before_anything_runs(tmp_path, capsys):
    assert cli.parse_args(["x", "--out", "o", "--languages", " zh, en,zh"]).languages == ("zh", "en")
    assert cli.parse_args(["x", "--out", "o"]).languages == ()
    with pytest.raises(SystemExit) as e:
        cli.parse_args(["x", "--out", str(tmp_path / "o"), "--languages", "zh,xx"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --languages: unknown language xx; choose among zh,en,yue,ja,ko" in err
    assert not (tmp_path / "o").exists()


def _languages_found(out: Path) -> set[str]:
    docs = [json.loads(p.read_text()) for p in out.rglob("*.json")]
    assert docs
    return {s["language"] for d in docs for s in d["result"]["segments"]}


def test_local_mode_takes_the_language_decision_among_the_allowed(speech_clip, demo_dir, tmp_path,
                                                                  capsys):
    """English speech (detected 'en' when any language may be) with ``--languages ko,yue``: every
    segment's language is one of those, with its probability among them."""
    code, table, _ = run_local(speech_clip, "--output-dir", tmp_path / "any", "--format", "json",
                               demo_dir=demo_dir, capsys=capsys)
    assert code == 0, table
    assert _languages_found(tmp_path / "any") == {"en"}
    code, table, _ = run_local(speech_clip, "--output-dir", tmp_path / "out", "--format", "json",
                               "--languages", "ko,yue", demo_dir=demo_dir, capsys=capsys)
    assert code == 0, table
    assert _languages_found(tmp_path / "out") <= {"ko", "yue"}


def test_interrupted_run_leaves_only_complete_outputs_and_resumes(tmp_path, speech_clip, demo_dir,
                                                                  capsys):
    src, out = tmp_path / "in", tmp_path / "out"
    src.mkdir()
    for n in range(60):
        os.link(speech_clip, src / f"clip{n:02d}.wav")
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipeline.cli", str(src), "--output-dir", str(out), "--format",
         "json,srt", "--model", str(demo_dir), "--device", "cpu", "--jobs", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # Ctrl-C as a terminal delivers it, whatever this process inherited: a suite started in the
        # background by a non-interactive shell ignores SIGINT, and so would the CLI
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 240
    while not (out.exists() and any(out.glob("*.srt"))):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # Ctrl-C while files are in flight
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stderr
    assert "interrupted" in stdout
    done = sorted(out.iterdir())
    assert not [p for p in done if p.name.startswith(".")]  # no temporary file left behind
    for p in done:  # every file under its final name is complete
        if p.suffix == ".json":
            assert json.loads(p.read_text())["result"]["text"]
        else:
            assert p.read_text().startswith("1\n") and p.read_text().endswith("\n")
    finished = sum(1 for p in done if p.suffix == ".srt" and (out / f"{p.stem}.json").exists())
    assert 1 <= finished < 60

    code, table, _ = run_local(src, "--output-dir", out, "--format", "json,srt", "--quiet",
                               demo_dir=demo_dir, capsys=capsys)
    assert code == 0
    assert f"{60 - finished} transcribed, {finished} already done, 0 failed" in table
    assert len(list(out.glob("*.json"))) == len(list(out.glob("*.srt"))) == 60


def test_missing_model_is_one_line_and_exit_2(speech_clip, tmp_path):
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", str(speech_clip), "--output-dir",
                        str(tmp_path / "out"), "--model", "no-such-model"],
                       cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "error: model 'no-such-model': no such directory and not a hub name"]
    assert r.stdout == "" and not (tmp_path / "out").exists()


def readme_cli_block() -> list[str]:
    """The commands of the README's fenced block that runs the CLI with --demo."""
    text = (ROOT / "README.md").read_text()
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        if "pipeline.cli" in block and "--demo" in block:
            return [line.split("  #")[0].strip() for line in block.splitlines()
                    if line.strip() and not line.startswith("#")]
    raise AssertionError("no CLI example with --demo in README.md")


def test_readme_cli_example_runs_as_written(tmp_path):
    """Run in a fresh folder, with .venv/bin/python as this interpreter and the demo model's
    cache pointed at the tests' prebuilt copy (what `make run` would build on first use)."""
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "models").symlink_to(MODEL_CACHE, target_is_directory=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SENSEVOICE_CACHE_DIR": str(cache)}
    for line in readme_cli_block():
        line = line.replace(".venv/bin/python", sys.executable)
        r = subprocess.run(line, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=300)
        assert r.returncode == 0, (line, r.stdout, r.stderr)
    written = [p for p in tmp_path.rglob("*") if p.is_file() and p.suffix in (".txt", ".srt")]
    assert written, "the example wrote no transcript"


# -- server mode and the client ---------------------------------------------------------------


class Refuser:
    """ASGI wrapper in front of the real app: the next queued answers to POST /api/jobs are
    refusals (status, Retry-After) sent before the app sees the request, as a busy server's."""

    def __init__(self, app):
        self.app = app
        self.pending: list[tuple[int, int]] = []
        self.posts: list[tuple[float, int]] = []  # (monotonic time, status answered)

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST" and scope["path"] == "/api/jobs":
            if self.pending:
                status, retry = self.pending.pop(0)
                self.posts.append((time.monotonic(), status))
                code = "queue_full" if status == 503 else "too_many_uploads_from_client"
                body = json.dumps({"error": {"code": code, "message": "busy (test)"}}).encode()
                await send({"type": "http.response.start", "status": status, "headers": [
                    (b"content-type", b"application/json"), (b"retry-after", str(retry).encode()),
                    (b"content-length", str(len(body)).encode())]})
                await send({"type": "http.response.body", "body": body})
                return
            self.posts.append((time.monotonic(), 202))
        await self.app(scope, receive, send)


@pytest.fixture(scope="module")
def busy_server(demo_dir, tmp_path_factory):
    """The real app with an API token, behind a Refuser."""
    server = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("data"), api_token=TOKEN,
                                      ui=False))
    server.refuser = Refuser(server.app)
    server.server.config.app = server.refuser
    server.start()
    yield server
    server.stop()


def test_server_mode_retries_busy_answers_after_retry_after(busy_server, tree, tmp_path, capsys):
    busy_server.refuser.posts.clear()
    busy_server.refuser.pending[:] = [(503, 1), (429, 1)]
    out = tmp_path / "out"
    code = cli.main([str(tree / "a" / "call.wav"), str(tree / "b" / "call.wav"), "--output-dir",
                     str(out), "--format", "txt,srt", "--server", busy_server.url, "--token", TOKEN,
                     "--jobs", "1", "--language", "en"])
    table, _ = capsys.readouterr()
    assert code == 0, table
    assert outputs(out) == named("a/call", "txt,srt") | named("b/call", "txt,srt")
    assert "2 transcribed, 0 already done, 0 failed" in table
    posts = busy_server.refuser.posts
    assert [s for _, s in posts] == [503, 429, 202, 202]
    assert posts[1][0] - posts[0][0] >= 0.95 and posts[2][0] - posts[1][0] >= 0.95  # Retry-After


def test_server_mode_sends_the_allow_list(busy_server, speech_clip, tmp_path, capsys):
    """``--languages`` reaches the server's job (the client sends it as 'ko,yue'); without it the
    job has none (an empty list is not sent)."""
    code = cli.main([str(speech_clip), "--output-dir", str(tmp_path / "out"), "--format", "json",
                     "--server", busy_server.url, "--token", TOKEN, "--quiet", "--languages", "ko,yue"])
    table, _ = capsys.readouterr()
    assert code == 0, table
    assert _languages_found(tmp_path / "out") <= {"ko", "yue"}
    with Client(busy_server.url, TOKEN) as client:
        job = client.wait(client.submit(speech_clip, TranscribeOptions(languages=("ko", "yue"))))
        assert job["options"]["languages"] == "ko,yue"
        job = client.wait(client.submit(speech_clip, TranscribeOptions(language="en")))
        assert job["status"] == "done" and "languages" not in job["options"]


def test_server_mode_failures_are_per_file(busy_server, tree, tmp_path, capsys):
    out = tmp_path / "out"
    (out / "sub" / "clip.txt").mkdir(parents=True)  # an output that cannot be put in place
    code = cli.main([str(tree / "b"), "--output-dir", str(out), "--server", busy_server.url,
                     "--token", TOKEN, "--quiet"])
    table, _ = capsys.readouterr()
    assert code == 1
    assert "1 transcribed, 0 already done, 2 failed" in table
    assert outputs(out) == {"call.txt"}  # and no temporary file
    assert re.search(r"sub/bad\.wav\s+unsupported_media: ", table)
    assert re.search(r"sub/clip\.mp3\s+cannot write .*sub/clip\.txt: Is a directory", table)


def test_server_mode_wrong_token_or_no_server_is_one_line_exit_2(busy_server, tree, tmp_path, capsys):
    args = [str(tree / "a"), "--output-dir", str(tmp_path / "out"), "--quiet"]
    assert cli.main([*args, "--server", busy_server.url, "--token", "wrong"]) == 2
    assert capsys.readouterr().err.strip().startswith(f"error: {busy_server.url} refused the token")
    assert cli.main([*args, "--server", "http://127.0.0.1:9"]) == 2
    assert capsys.readouterr().err.strip().count("\n") == 0


def test_client_submit_wait_result(busy_server, speech_clip):
    from pipeline.domain.types import TranscribeOptions

    with Client(busy_server.url, TOKEN) as client:
        job_id = client.submit(speech_clip, TranscribeOptions(language="en", word_timestamps=True))
        job = client.wait(job_id, timeout=120)
        assert job["status"] == "done" and job["audio_seconds"] > 1
        assert json.loads(client.result(job_id, "json"))["result"]["text"] == job["result"]["text"]
        assert client.result(job_id, "vtt").startswith(b"WEBVTT")
        assert client.result(job_id, "txt", tags=False).strip()
        same = client.wait(client.submit(speech_clip.read_bytes(), {"language": "en"},
                                         filename="bytes.wav"), timeout=120)
        assert same["status"] == "done" and same["filename"] == "bytes.wav"


def test_client_errors_carry_the_servers_code(busy_server):
    with Client(busy_server.url, TOKEN) as client:
        with pytest.raises(ApiError) as e:
            client.submit(b"not audio at all", filename="x.wav")
        assert (e.value.status, e.value.code) == (415, "unsupported_media")
        with pytest.raises(ApiError) as e:
            client.get("0" * 32)
        assert e.value.status == 404
    with Client(busy_server.url) as anonymous, pytest.raises(ApiError) as e:
        anonymous.submit(b"x", filename="x.wav")
    assert (e.value.status, e.value.code) == (401, "unauthorized")


def test_client_honours_retry_after_within_its_busy_timeout(busy_server, speech_clip):
    refuser = busy_server.refuser
    with Client(busy_server.url, TOKEN) as client:
        refuser.pending[:] = [(503, 1)]
        t0 = time.monotonic()
        client.wait(client.submit(speech_clip), timeout=120)
        assert time.monotonic() - t0 >= 1.0 and client.retries == 1
    with Client(busy_server.url, TOKEN, busy_timeout=0.5) as impatient:
        refuser.pending[:] = [(503, 1)]
        with pytest.raises(ApiError) as e:
            impatient.submit(speech_clip)
        assert (e.value.status, e.value.code, e.value.retry_after) == (503, "queue_full", 1.0)


def test_client_wait_times_out_and_connection_refused_is_retried_then_raised():
    def slow(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"id": "j", "status": "running"})

    naps: list[float] = []
    with Client("http://test", transport=httpx.MockTransport(slow), sleep=naps.append) as client:
        with pytest.raises(WaitTimeout):
            client.wait("j", timeout=0)
    with Client("http://127.0.0.1:9", busy_timeout=3, sleep=naps.append) as client:
        with pytest.raises(httpx.ConnectError):
            client.submit(b"x", filename="x.wav")
        assert client.retries >= 1


def test_retry_after_header_values():
    assert retry_after_seconds("3") == 3.0
    assert retry_after_seconds(None) == retry_after_seconds("soon") == 2.0
    assert retry_after_seconds("99999") == 300.0
    when = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 30))
    assert 25 <= retry_after_seconds(when) <= 31
