"""A frozen event loop is not healthy: the watchdog sees it and the process exits for a restart.
Before, a request that blocked the loop (the UI reading /dev/zero) froze healthz, readyz, polls and
SIGTERM for good while the watchdog, which only watched the GPU workers, saw nothing wrong."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import pytest

from tests.conftest import ROOT, free_port
from tests.test_reliability import wait_ready


def test_a_frozen_event_loop_exits_3_and_the_supervisor_restarts_it(demo_dir, tmp_path):
    port, log = free_port(), tmp_path / "supervisor.log"
    url = f"http://127.0.0.1:{port}"
    server_cmd = [sys.executable, str(ROOT / "tests" / "fault_server.py"), "freeze",
                  str(tmp_path / "injected"), "--model", str(demo_dir), "--device", "cpu",
                  "--port", str(port), "--data-dir", str(tmp_path / "data"), "--api-only"]
    code = f"import sys; from app_sensevoice import supervise; sys.exit(supervise({server_cmd!r}))"
    env = {**os.environ, "SENSEVOICE_LOOP_STALL_TIMEOUT_S": "2"}
    with open(log, "wb") as out:
        sup = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=out,
                               stderr=out)
    try:
        wait_ready(url, sup)
        frozen_at = time.monotonic()
        try:
            httpx.get(url + "/freeze", timeout=1)
        except httpx.HTTPError:
            pass  # the loop is blocked: no answer
        with pytest.raises((httpx.TimeoutException, httpx.ReadError)):  # not served: blocked,
            httpx.get(url + "/healthz", timeout=1)  # or the process already exited for a restart
        deadline = time.monotonic() + 60
        while b"restarting" not in log.read_bytes() and time.monotonic() < deadline:
            time.sleep(0.2)
        text = log.read_text(errors="replace")
        assert "event loop has not answered" in text, text
        assert "server exited with 3; restarting" in text, text
        assert time.monotonic() - frozen_at < 20  # stall timeout 2 s + the janitor's period
        wait_ready(url, sup)  # the restarted server answers again
        assert httpx.get(url + "/healthz", timeout=2).status_code == 200
        sup.send_signal(signal.SIGTERM)
        assert sup.wait(30) == 0
    finally:
        if sup.poll() is None:
            sup.kill()
