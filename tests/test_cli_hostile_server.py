"""``sensevoice transcribe --server URL`` against a server that lies (issue 19 row 6): a 3 GiB
"result" took the CLI to 9.5 GB of memory, was written twice and the run exited 0. Now answers are
read within caps (results and errors), a bad number is a clean per-file failure, and files are
written only inside --output-dir.

Issue 36: the cap held for gzip and chunked bodies only -- a 1.6 KB brotli answer (decoded by
httpx in one call) took the CLI to 2.15 GB. Now only gzip is asked for and any coding the server
answers with is decoded here a bounded piece at a time, or refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import zlib
from functools import cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from pipeline import cli
from pipeline import client as client_module
from pipeline.client import MAX_RESPONSE_BYTES, BadResponse, Client, ResponseTooLarge
from tests.conftest import ROOT

JOB = "0b1c2d3e-4f50-4a6b-8c7d-9e0f1a2b3c4d"
GIB = 1024 ** 3
MIB = 1024 ** 2

try:
    import brotli
except ImportError:
    brotli = None
try:
    import zstandard
except ImportError:
    zstandard = None
needs_brotli = pytest.mark.skipif(brotli is None or client_module._bounded_brotli() is None,
                                  reason="no brotli module that decodes within bounds")
needs_zstd = pytest.mark.skipif(zstandard is None, reason="no zstandard module")


def _zeros(size: int):
    block = b"\0" * MIB
    for _ in range(size // MIB):
        yield block


@cache
def bomb(coding: str, size: int) -> bytes:
    """``size`` zero bytes in ``coding``: a small body that decodes to a large one."""
    if coding == "br":
        c = brotli.Compressor(quality=5, lgwin=24)
        return b"".join([*(c.process(b) for b in _zeros(size)), c.finish()])
    if coding == "zstd":
        c = zstandard.ZstdCompressor(level=3).compressobj()
        return b"".join([*(c.compress(b) for b in _zeros(size)), c.flush()])
    c = zlib.compressobj(9, zlib.DEFLATED, {"gzip": 31, "deflate": 15}[coding])
    return b"".join([*(c.compress(b) for b in _zeros(size)), c.flush()])


def encoded(coding: str, data: bytes) -> bytes:
    if coding == "br":
        return brotli.compress(data)
    if coding == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    c = zlib.compressobj(6, zlib.DEFLATED, {"gzip": 31, "deflate": 15, "raw": -15}[coding])
    return c.compress(data) + c.flush()


class Hostile(BaseHTTPRequestHandler):
    """A fake server: ``mode`` (a class attribute) picks the lie."""

    mode = "huge_result"
    protocol_version = "HTTP/1.1"
    coded: tuple[str, bytes] = ("identity", b"")  # (Content-Encoding, body) of mode "coded"
    accept_encoding: list[str | None] = []  # what the client asked for, per request

    def log_message(self, *args) -> None:
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _endless(self, status: int, total: int) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(total))
        self.end_headers()
        chunk = b"\0" * (1 << 20)
        try:
            for _ in range(total // len(chunk)):
                self.wfile.write(chunk)
        except OSError:  # the client stopped reading: what it should do
            pass

    def _coded(self, status: int) -> None:
        coding, data = self.coded
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Encoding", coding)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        try:
            self.wfile.write(data)
        except OSError:
            pass

    def do_GET(self) -> None:  # noqa: N802
        type(self).accept_encoding.append(self.headers.get("Accept-Encoding"))
        if self.path == "/healthz":
            return self._json(200, {"status": "ok"})
        if self.path == f"/api/jobs/{JOB}":
            seconds = {"bad_number": "NaN", "not_a_number": "abc"}.get(self.mode, 5.0)
            if self.mode == "not_an_object":
                return self._json(200, ["done"])
            return self._json(200, {"id": JOB, "status": "done", "audio_seconds": seconds})
        if self.path.startswith(f"/api/jobs/{JOB}/result"):
            if self.mode == "huge_result":
                return self._endless(200, 3 * GIB)
            if self.mode == "huge_error":
                return self._endless(500, 3 * GIB)
            if self.mode == "coded":
                return self._coded(200)
            if self.mode == "coded_error":
                return self._coded(500)
            return self._json(200, {"result": {"text": "hi"}})
        self._json(404, {"error": {"code": "job_not_found", "message": "no"}})

    def do_POST(self) -> None:  # noqa: N802
        length = int(self.headers.get("Content-Length", "0"))
        self.rfile.read(length)
        job_id = "../../admin" if self.mode == "bad_id" else JOB
        self._json(202, {"id": job_id, "status": "queued"})


class QuietServer(ThreadingHTTPServer):
    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # (a client that hung up: expected)
            super().handle_error(request, client_address)


@pytest.fixture
def hostile():
    server = QuietServer(("127.0.0.1", 0), Hostile)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def one_file(tmp_path) -> Path:
    src = tmp_path / "in"
    src.mkdir()
    (src / "clip.wav").write_bytes(b"RIFF" + b"\0" * 100)
    return src


PEAK = ("import resource, sys; from pipeline.entry import main; code = main(sys.argv[1:]); "
        "print('MAXRSS_KB', resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, file=sys.stderr); "
        "sys.exit(code)")


def run_cli(hostile: str, one_file: Path, out: Path) -> tuple[subprocess.CompletedProcess, float]:
    """The CLI in a process of its own; its result and its peak RSS in MiB."""
    r = subprocess.run([sys.executable, "-c", PEAK, "transcribe", str(one_file), "--output-dir",
                        str(out), "--server", hostile, "--format", "txt,json", "--quiet"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    peak_kb = int(r.stderr.rsplit("MAXRSS_KB", 1)[1].split()[0])
    return r, peak_kb / 1024


def test_a_3_gib_result_is_refused_with_bounded_memory(hostile, one_file, tmp_path):
    Hostile.mode = "fine"
    ok, baseline_mb = run_cli(hostile, one_file, tmp_path / "ok")
    assert ok.returncode == 0, ok.stderr[-2000:]
    Hostile.mode = "huge_result"
    out = tmp_path / "out"
    r, peak_mb = run_cli(hostile, one_file, out)
    print(f"CLI peak RSS: {peak_mb:.0f} MiB against a 3 GiB answer ({baseline_mb:.0f} MiB for a "
          f"normal run)")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "response_too_large" in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert not [p for p in out.rglob("*") if p.is_file()]  # nothing written
    # a reader that kept the body would be over 3 GB: here at most the 64 MiB cap twice (the
    # chunks and their join) beyond a normal run
    assert peak_mb < baseline_mb + 2 * MAX_RESPONSE_BYTES / 2**20 + 64, (peak_mb, baseline_mb)


def test_a_huge_error_body_is_cut_and_its_status_kept(hostile):
    Hostile.mode = "huge_error"
    with Client(hostile, busy_timeout=0) as client:
        with pytest.raises(Exception) as e:
            client.result(JOB, "txt")
    assert getattr(e.value, "status", None) == 500 and not isinstance(e.value, ResponseTooLarge)


def test_a_small_cap_applies_to_results(hostile):
    Hostile.mode = "huge_result"
    with Client(hostile, max_response_bytes=1 << 20) as client, pytest.raises(ResponseTooLarge):
        client.result(JOB, "txt")


@pytest.mark.parametrize("mode,words", [("bad_number", "not a duration"),
                                        ("not_a_number", "not a number"),
                                        ("not_an_object", "bad_response"),
                                        ("bad_id", "bad_response")])
def test_lies_are_clean_per_file_failures(hostile, one_file, tmp_path, capsys, mode, words):
    Hostile.mode = mode
    code = cli.main([str(one_file), "--output-dir", str(tmp_path / "out"), "--server", hostile,
                     "--quiet"])
    captured = capsys.readouterr()
    assert code == 1
    assert words in captured.out + captured.err and "Traceback" not in captured.err


def test_outputs_are_written_only_inside_the_output_dir(hostile, tmp_path, capsys):
    Hostile.mode = "fine"
    src = tmp_path / "in"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "clip.wav").write_bytes(b"RIFF" + b"\0" * 100)
    (src / "top.wav").write_bytes(b"RIFF" + b"\0" * 100)
    out = tmp_path / "out"
    out.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, out / "sub")  # the mirror folder of in/sub is a link out
    code = cli.main([str(src), "--output-dir", str(out), "--server", hostile, "--quiet",
                     "--format", "json"])
    captured = capsys.readouterr()
    assert not list(elsewhere.iterdir()), "written through a link out of --output-dir"
    assert code == 1 and "outside" in captured.out + captured.err
    assert (out / "top.json").is_file()  # the other file is written as usual


def test_a_normal_answer_still_passes(hostile):
    Hostile.mode = "fine"
    with Client(hostile) as client:
        assert client.submit(b"RIFF") == JOB
        assert client.get(JOB)["status"] == "done"
        assert json.loads(client.result(JOB)) == {"result": {"text": "hi"}}
    with httpx.Client() as raw:  # (the fake server answers what it should)
        assert raw.get(hostile + "/healthz").status_code == 200
    assert BadResponse(200, "x").code == "bad_response"


# -- content codings (issue 36) ------------------------------------------------------------------
@needs_brotli
def test_a_brotli_bomb_is_refused_with_bounded_memory(hostile, one_file, tmp_path):
    """A ~2 KB answer that decodes to 2 GiB: before, the CLI's peak RSS was over 2 GB."""
    Hostile.mode = "fine"
    ok, baseline_mb = run_cli(hostile, one_file, tmp_path / "ok")
    assert ok.returncode == 0, ok.stderr[-2000:]
    Hostile.mode, Hostile.coded = "coded", ("br", bomb("br", 2 * GIB))
    out = tmp_path / "out"
    r, peak_mb = run_cli(hostile, one_file, out)
    print(f"CLI peak RSS: {peak_mb:.0f} MiB against a {len(Hostile.coded[1])} B brotli answer of "
          f"2 GiB ({baseline_mb:.0f} MiB for a normal run)")
    assert r.returncode == 1, r.stderr[-2000:]
    assert "response_too_large" in r.stdout + r.stderr and "Traceback" not in r.stderr
    assert not [p for p in out.rglob("*") if p.is_file()]
    assert peak_mb < baseline_mb + 2 * MAX_RESPONSE_BYTES / 2**20 + 64, (peak_mb, baseline_mb)


@pytest.mark.parametrize("coding", [
    "gzip", "deflate",
    pytest.param("br", marks=needs_brotli), pytest.param("zstd", marks=needs_zstd)])
def test_a_bomb_in_any_coding_is_cut_at_the_cap(hostile, coding, monkeypatch):
    """Decoded a bounded piece at a time: no piece much larger than DECODE_CHUNK is ever made,
    and the answer is refused once the cap is passed."""
    pieces = []
    real = client_module.decoded_chunks

    def watched(raw, codings):
        for piece in real(raw, codings):
            pieces.append(len(piece))
            yield piece

    monkeypatch.setattr(client_module, "decoded_chunks", watched)
    Hostile.mode, Hostile.coded = "coded", (coding, bomb(coding, 256 * MIB))
    with Client(hostile, max_response_bytes=4 * MIB) as client, pytest.raises(ResponseTooLarge):
        client.result(JOB, "txt")
    piece = 2 * client_module.DECODE_CHUNK  # (brotli's buffer stops growing past its limit: a block over)
    assert pieces and max(pieces) <= piece, max(pieces)
    assert sum(pieces) <= 4 * MIB + piece  # it stopped at the cap


@pytest.mark.parametrize("coding", [
    "gzip", "deflate", "raw",
    pytest.param("br", marks=needs_brotli), pytest.param("zstd", marks=needs_zstd)])
def test_a_fair_answer_in_any_coding_is_read(hostile, coding):
    data = json.dumps({"result": {"text": "hi " * 100_000}}).encode()  # larger than a piece
    Hostile.mode = "coded"
    Hostile.coded = ("deflate" if coding == "raw" else coding, encoded(coding, data))
    with Client(hostile) as client:
        assert client.result(JOB, "json") == data


def test_only_gzip_is_asked_for(hostile):
    Hostile.mode, Hostile.accept_encoding = "fine", []
    with Client(hostile) as client:
        client.result(JOB)
    assert Hostile.accept_encoding == ["gzip"]


@pytest.mark.parametrize("coding, body, words", [
    ("compress", b"\x1f\x9d\x90abc", "does not read"),  # a coding nobody decodes here
    ("gzip", b"not gzip at all", "cannot be read"),
    ("gzip", encoded("gzip", b"{}" * 1000)[:20], "ends early"),
    ("gzip, gzip, gzip, gzip, gzip", b"x", "stacked"),
])
def test_an_unreadable_coding_is_a_named_error(hostile, coding, body, words):
    Hostile.mode, Hostile.coded = "coded", (coding, body)
    with Client(hostile, busy_timeout=0) as client, pytest.raises(BadResponse) as e:
        client.result(JOB, "json")
    assert e.value.code == "bad_response" and words in e.value.message
    Hostile.mode = "coded_error"  # an error's body that cannot be read: its status is the answer
    with Client(hostile, busy_timeout=0) as client, pytest.raises(Exception) as e:
        client.result(JOB, "json")
    assert getattr(e.value, "status", None) == 500 and not isinstance(e.value, BadResponse)


def test_stacked_codings_are_decoded_within_the_cap(hostile):
    Hostile.mode = "coded"
    inner = bomb("gzip", 256 * MIB)  # ~250 KB
    Hostile.coded = ("gzip, gzip", encoded("gzip", inner))
    with Client(hostile, max_response_bytes=4 * MIB) as client, pytest.raises(ResponseTooLarge):
        client.result(JOB, "txt")
    Hostile.coded = ("gzip, deflate", encoded("deflate", encoded("gzip", b'{"a": 1}')))
    with Client(hostile) as client:
        assert client.result(JOB, "json") == b'{"a": 1}'


def test_endless_compressed_bytes_are_capped_as_sent(hostile):
    """A stream that decodes to nothing (empty stored blocks, forever) is capped by the bytes
    sent, not only by the bytes decoded."""
    empty_blocks = b"\x00\x00\x00\xff\xff" * (2 * MIB // 5)  # raw deflate: empty stored blocks
    Hostile.mode, Hostile.coded = "coded", ("deflate", empty_blocks)
    with Client(hostile, max_response_bytes=1 * MIB) as client, pytest.raises(ResponseTooLarge):
        client.result(JOB, "txt")
