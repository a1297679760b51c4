"""Uploads decoded in separate processes: parallel to the server; a crash, a hang, a malformed
reply or a file too big for a decoder's memory costs that upload and that process only; no
decoder outlives the server, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import tracemalloc
from pathlib import Path

import httpx
import numpy as np
import pytest

from pipeline.audio.decode import decode_audio
from pipeline.audio.decoder_pool import DEFAULT_TARGET, Decoder, default_memory_limit
from pipeline.domain.errors import (
    AudioTooLong,
    DecoderCrashed,
    DecoderOutOfMemory,
    DecodeTimeout,
    UploadTooLarge,
)
from tests.conftest import LiveServer, make_settings
from tests.decoder_faults import crash_on_marker, hang_on_marker, malformed_reply, process_id
from tests.media import silence_flac
from tests.test_api import submit, wait_done

ROOT = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
# A decoder starts at ~205 MiB of address space (PyAV, numpy); this leaves room to start and to
# decode a short clip, not to hold 2 h of 16 kHz output (461 MB).
SMALL_MEMORY_MB = 320


def alive(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def still_alive(pids, timeout: float = 5.0) -> list[int]:
    """Those of ``pids`` still alive after up to ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while (left := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def vm_kib(pid: int, key: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def silence_flac_bytes() -> bytes:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return silence_flac(Path(d) / "s.flac", 1.0, 16000).read_bytes()


@pytest.fixture(scope="module")
def good(clip_factory) -> bytes:
    return clip_factory("wav", 16000, 1).read_bytes()


def test_decoding_runs_outside_the_server_process():
    decoder = Decoder(2, target=process_id)
    try:
        pids = {int(decoder(b"x").samples[0]) for _ in range(8)}
        assert os.getpid() not in pids and 1 <= len(pids) <= 2
        assert pids <= set(decoder.pids())
    finally:
        decoder.close()
    assert int(Decoder(0, target=process_id)(b"x").samples[0]) == os.getpid()  # 0 = in-process


def test_a_decoder_process_returns_what_decoding_here_returns(clip_factory):
    decoder = Decoder(1)
    try:
        for fmt, rate in (("flac", 44100), ("m4a", 22050), ("opus", 48000)):
            data = clip_factory(fmt, rate, 2).read_bytes()
            for channel in (None, 1):
                here = decode_audio(data, channel=channel)
                there = decoder(data, max_seconds=60, max_bytes=len(data), channel=channel)
                assert (there.sample_rate, there.channels) == (here.sample_rate, here.channels)
                np.testing.assert_array_equal(there.samples, here.samples)
        with pytest.raises(UploadTooLarge):
            decoder(data, max_bytes=len(data) - 1)
        with pytest.raises(AudioTooLong, match="1 s limit"):  # an error crosses with its message
            decoder(data, max_seconds=1)
    finally:
        decoder.close()


def test_a_crash_costs_only_its_upload(good):
    decoder = Decoder(2, target=crash_on_marker)
    decoder.warm_up()
    before = set(decoder.pids())
    results: list = []

    def steady() -> None:
        for _ in range(10):
            results.append(decoder(good).sample_rate)

    try:
        other = threading.Thread(target=steady)
        other.start()
        with pytest.raises(DecoderCrashed, match="crashed on this file"):
            decoder(b"CRASH" + good)
        other.join()
        assert results == [16000] * 10  # the upload decoding beside it never noticed
        crashed = before - set(decoder.pids())
        assert len(crashed) == 1 and still_alive(crashed) == []
        assert decoder(good).sample_rate == 16000  # a new process serves the next upload
    finally:
        decoder.close()


def test_a_stuck_decoder_is_killed_after_the_timeout_alone(good):
    decoder = Decoder(2, target=hang_on_marker, timeout_s=1.5)
    decoder.warm_up()
    before = set(decoder.pids())
    results: list = []
    stop = threading.Event()

    def steady() -> None:
        while not stop.is_set():
            results.append(decoder(good).sample_rate)

    other = threading.Thread(target=steady)
    try:
        other.start()
        t0 = time.monotonic()
        with pytest.raises(DecodeTimeout, match="longer than 1.5 s"):
            decoder(b"HANG" + good)
        assert 1.5 <= time.monotonic() - t0 < 5
        stop.set()
        other.join()
        assert len(results) >= 2 and set(results) == {16000}
        stuck = before - set(decoder.pids())
        assert len(stuck) == 1 and still_alive(stuck) == []  # killed, not left running
        assert [pid for pid in before - stuck if alive(pid)] == list(before - stuck)
        assert decoder(good).sample_rate == 16000
    finally:
        stop.set()
        decoder.close()


@pytest.mark.parametrize("kind", ["pickle", "magic", "huge", "over_budget", "rate", "channels",
                                  "status", "long_message", "error_with_samples", "short"])
def test_a_malformed_reply_is_refused_and_never_unpickled(kind, tmp_path, good):
    """A decoder taken over by a crafted file writes its own reply: the server reads fixed
    headers, checks each field before it allocates, and never unpickles anything."""
    marker = tmp_path / "unpickled"
    decoder = Decoder(1, target=malformed_reply, timeout_s=30)
    try:
        decoder.warm_up()
        (pid,) = decoder.pids()
        t0 = time.monotonic()
        with pytest.raises(DecoderCrashed):
            decoder(kind.encode() + b" " + str(marker).encode(), max_seconds=60)
        assert time.monotonic() - t0 < 5  # refused on the header, not at the timeout
        assert not marker.exists()
        assert still_alive([pid]) == [] and decoder.pids() == []
        decoder.target = DEFAULT_TARGET
        assert decoder(good).sample_rate == 16000
    finally:
        decoder.close()


def test_long_48k_silence_decodes_to_the_16k_budget_with_bounded_memory(tmp_path):
    """30 min of 48 kHz silence (a 26 KB FLAC) cost the server +2.5 GB: it comes back at 16 kHz,
    and neither side holds much more than those samples."""
    flac = silence_flac(tmp_path / "silence_30m_48k.flac", 1800, 48000).read_bytes()
    decoder = Decoder(1)
    try:
        decoder.warm_up()
        (pid,) = decoder.pids()
        tracemalloc.start()
        try:
            audio = decoder(flac, max_seconds=4 * 3600, max_bytes=200 * MIB)
            _, parent_peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert audio.sample_rate == 16000 and audio.samples.size == 1800 * 16000
        assert not audio.samples.any()
        output = audio.samples.nbytes  # 115.2 MB
        assert parent_peak <= output + 4 * MIB
        # the decoder's peak: its samples at 16 kHz, once, and its ~50 MiB of code and buffers
        # (at 48 kHz in a doubling buffer, then pickled, it was over 4x that)
        assert vm_kib(pid, "VmHWM") * 1024 <= output + 150 * MIB
        assert vm_kib(pid, "VmPeak") * 1024 <= default_memory_limit()
        # and it keeps none of them for the next upload (a loop variable once held the last
        # part: a second 4 h upload then ran out of address space)
        assert vm_kib(pid, "VmRSS") * 1024 <= 100 * MIB
        peak = vm_kib(pid, "VmPeak")
        assert decoder(flac, max_seconds=4 * 3600).samples.size == audio.samples.size
        assert vm_kib(pid, "VmPeak") <= peak + 1024  # the same space again, not twice
    finally:
        decoder.close()


def test_a_file_over_the_memory_limit_fails_alone(tmp_path, good):
    """2 h of 48 kHz silence with no duration in its header: the 16 kHz output outgrows a small
    address-space limit while decoding. That upload gets DecoderOutOfMemory, the next decodes."""
    flac = silence_flac(tmp_path / "silence_2h.flac", 7200, 48000, declared_seconds=0)
    decoder = Decoder(1, memory_mb=SMALL_MEMORY_MB)
    try:
        decoder.warm_up()
        first = decoder.pids()
        with pytest.raises(DecoderOutOfMemory, match=f"{SMALL_MEMORY_MB} MiB"):
            decoder(flac.read_bytes(), max_seconds=4 * 3600)
        assert still_alive(first) == []  # its heap is suspect after a failed allocation
        assert decoder(good).sample_rate == 16000
        assert decoder.pids() != first
        with pytest.raises(DecoderOutOfMemory):  # an upload the decoder cannot even hold
            decoder(bytes(150 * MIB))
        assert decoder(good).sample_rate == 16000
    finally:
        decoder.close()


def test_a_decoder_that_cannot_start_is_the_servers_error_not_the_uploads(good):
    """A limit too small to import PyAV: warm_up says so; an upload gets a RuntimeError (500),
    never a decoder error that would blame the file. (A 16 kHz PCM WAV needs no decoder process
    at all: pipeline/audio/wav.py.)"""
    decoder = Decoder(1, memory_mb=64)
    try:
        with pytest.raises(RuntimeError, match="did not start .*64 MiB"):
            decoder.warm_up()
        with pytest.raises(RuntimeError, match="did not start"):
            decoder(silence_flac_bytes())
        assert decoder(good).samples.size > 0  # read in this process
        assert decoder.pids() == []
    finally:
        decoder.close()


def test_a_decoder_is_replaced_after_its_share_of_uploads():
    decoder = Decoder(1, target=process_id, tasks_per_process=3)
    try:
        pids = [int(decoder(b"x").samples[0]) for _ in range(7)]
        assert pids[0:3] == [pids[0]] * 3 and pids[3:6] == [pids[3]] * 3 and pids[6] != pids[3]
        assert still_alive(pids[:6]) == []
    finally:
        decoder.close()


def test_close_leaves_no_decoder_even_a_busy_one(good):
    decoder = Decoder(2, target=hang_on_marker)
    decoder.warm_up()
    pids = decoder.pids()
    assert len(pids) == 2 and all(alive(pid) for pid in pids)
    errors: list = []

    def stuck() -> None:
        try:
            decoder(b"HANG" + good)
        except DecoderCrashed as e:
            errors.append(e)

    busy = threading.Thread(target=stuck)
    busy.start()
    time.sleep(0.3)
    decoder.close()
    busy.join(5)
    assert not busy.is_alive() and len(errors) == 1  # its caller got an answer at once
    assert still_alive(pids) == [] and decoder.pids() == []


SERVER_SCRIPT = textwrap.dedent("""
    import os, sys, threading, time
    sys.path.insert(0, sys.argv[1])
    from pipeline.audio.decoder_pool import Decoder
    decoder = Decoder(2, target="tests.decoder_faults:hang_on_marker")
    decoder.warm_up()
    good = open(sys.argv[2], "rb").read()
    decoder(good)
    threading.Thread(target=decoder, args=(b"HANG" + good,), daemon=True).start()
    time.sleep(0.5)  # one decoder is now busy for an hour: only the kernel can stop it
    print(" ".join(map(str, decoder.pids())), flush=True)
    if sys.stdin.readline().strip() == "exit3":
        os._exit(3)  # what the server does on a fatal GPU error
    time.sleep(60)
""")


@pytest.mark.parametrize("end", ["SIGKILL", "SIGTERM", "exit3"])
def test_no_decoder_outlives_its_server(end, clip_factory):
    """kill -9, SIGTERM or os._exit(3) of a process that started decoders (one of them busy,
    so the end of its input does not stop it): every decoder is gone, and it started no
    forkserver or resource tracker to leave behind."""
    server = subprocess.Popen(
        [sys.executable, "-c", SERVER_SCRIPT, str(ROOT), str(clip_factory("wav", 16000, 1))],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(pid) for pid in server.stdout.readline().split()]
        assert len(pids) == 2 and all(alive(pid) for pid in pids)
        children = [int(pid) for task in Path(f"/proc/{server.pid}/task").iterdir()
                    for pid in (task / "children").read_text().split()]
        assert sorted(children) == sorted(pids)  # the decoders, and nothing else
        for pid in pids:
            assert b"pipeline.audio.decode_worker" in Path(f"/proc/{pid}/cmdline").read_bytes()
        if end == "exit3":
            server.stdin.write("exit3\n")
            server.stdin.flush()
        else:
            server.send_signal(getattr(signal, end))
        assert server.wait(10) == {"SIGKILL": -9, "SIGTERM": -15, "exit3": 3}[end]
        assert still_alive(pids) == []
    finally:
        server.kill()
        server.wait()


def test_server_answers_decoder_faults_and_serves_the_next_job(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", decode_processes=2)).start()
    decoder = server.runtime.intake.uploads.decoder
    decoder.target = crash_on_marker
    clip = clip_factory("wav", 16000, 1)
    try:
        crafted = tmp_path / "crafted.wav"
        crafted.write_bytes(b"CRASH" + clip.read_bytes())
        r = submit(server, crafted)
        assert r.status_code == 415 and r.json()["error"]["code"] == "decoder_crashed"
        assert httpx.get(server.url + "/readyz").status_code == 200

        decoder.close()  # the next processes start with a small address-space limit
        decoder.memory_limit = SMALL_MEMORY_MB * MIB
        big = silence_flac(tmp_path / "silence_2h.flac", 7200, 48000, declared_seconds=0)
        r = submit(server, big)
        assert r.status_code == 413 and r.json()["error"]["code"] == "decoder_out_of_memory"
        assert httpx.get(server.url + "/readyz").status_code == 200

        r = submit(server, clip)
        assert r.status_code == 202 and wait_done(server, r.json()["id"])["status"] == "done"
    finally:
        server.stop()
