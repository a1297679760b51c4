"""Uploads decoded in separate processes: parallel to the server, and a crash costs one process."""

from __future__ import annotations

import os

import httpx
import pytest

from pipeline.decoder import Decoder
from pipeline.errors import DecoderCrashed, DecodeTimeout
from tests.conftest import LiveServer, make_settings
from tests.decoder_faults import crash_on_marker, hang_on_marker, process_id
from tests.test_api import submit, wait_done


def test_decoding_runs_outside_the_server_process():
    decoder = Decoder(2, target=process_id)
    try:
        pids = {decoder(b"x") for _ in range(8)}
        assert os.getpid() not in pids and 1 <= len(pids) <= 2
    finally:
        decoder.close()
    assert Decoder(0, target=process_id)(b"x") == os.getpid()  # 0 = in-process


def test_a_decoder_crash_costs_one_upload_and_the_pool_recovers(clip_factory):
    decoder = Decoder(2, target=crash_on_marker)
    good = open(clip_factory("wav", 16000, 1), "rb").read()
    try:
        assert decoder(good).sample_rate == 16000
        with pytest.raises(DecoderCrashed, match="crashed"):
            decoder(b"CRASH" + good)
        assert decoder(good).sample_rate == 16000  # a new pool serves the next upload
    finally:
        decoder.close()


def test_a_stuck_decoder_is_killed_after_the_timeout(clip_factory):
    decoder = Decoder(1, target=hang_on_marker, timeout_s=2.0)
    good = open(clip_factory("wav", 16000, 1), "rb").read()
    try:
        decoder.warm_up()
        stuck = next(iter(decoder._pool._processes.values()))  # the one process
        with pytest.raises(DecodeTimeout, match="longer than 2 s"):
            decoder(b"HANG" + good)
        stuck.join(5)
        assert not stuck.is_alive()  # killed, not left running
        assert decoder(good).sample_rate == 16000
    finally:
        decoder.close()


def test_server_answers_a_decoder_crash_and_serves_the_next_job(demo_dir, tmp_path, clip_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path / "d", decode_processes=2)).start()
    server.service.decoder.target = crash_on_marker
    clip = clip_factory("wav", 16000, 1)
    try:
        crafted = tmp_path / "crafted.wav"
        crafted.write_bytes(b"CRASH" + clip.read_bytes())
        r = submit(server, crafted)
        assert r.status_code == 415 and r.json()["error"]["code"] == "decoder_crashed"
        assert httpx.get(server.url + "/readyz").status_code == 200
        r = submit(server, clip)
        assert r.status_code == 202 and wait_done(server, r.json()["id"])["status"] == "done"
    finally:
        server.stop()
