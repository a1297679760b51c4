"""bench/load_test.py reports a server that goes away mid-run instead of crashing (issue 36).

The load generator ran against the real server (bench/noop_server.py: its engine answers at once);
the server is killed (SIGKILL) while the submitters and pollers run. Before, the poller process
died on the refused connection and the load test ended in a traceback, with no table and no JSON.
Now the refused submits are counted as rejected (``connection_refused``), the accepted jobs it can
no longer follow as ``unknown``, and the table and load.json are written (exit code 1).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import MODEL_CACHE, free_port

ROOT = Path(__file__).resolve().parent.parent


def jobs_done(url: str) -> float:
    """Jobs the server finished with a transcript (its /metrics), 0 when it does not answer."""
    try:
        text = httpx.get(url + "/metrics", timeout=2).text
    except httpx.HTTPError:
        return 0.0
    return sum(float(v) for v in re.findall(r"^sensevoice_request_success_total\{[^}]*\} (\S+)$", text, re.M))


def test_the_load_test_reports_a_server_killed_mid_run(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "SENSEVOICE_CACHE_DIR": str(MODEL_CACHE), "PYTHONUNBUFFERED": "1"}
    server = subprocess.Popen(
        [sys.executable, str(ROOT / "bench" / "noop_server.py"), "--demo", "--device", "cpu",
         "--api-only", "--web-processes", "1", "--port", str(port), "--data-dir", str(tmp_path / "data")],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    load = None
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert server.poll() is None, "the no-op server exited at start"
            try:
                if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        else:
            raise AssertionError("the no-op server did not start")
        out = tmp_path / "out"
        load = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "load_test.py"), "--url", url, "--submitters", "2",
             "--pollers", "2", "--seconds", "5", "--clips", "1", "--finish-timeout", "30",
             "--gone-after", "2"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**env, "OUT": str(out)})
        # mid-run: once the load test has jobs done (and its pollers something to poll)
        deadline = time.monotonic() + 30
        while jobs_done(url) < 3 and time.monotonic() < deadline and load.poll() is None:
            time.sleep(0.1)
        assert jobs_done(url) >= 3, "the load test never got a job through"
        t_kill = time.monotonic()
        os.killpg(server.pid, signal.SIGKILL)
        server.wait(10)
        stdout, stderr = load.communicate(timeout=60)
        ended_after_kill = time.monotonic() - t_kill
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(10)
        if load is not None and load.poll() is None:
            load.kill()
            load.wait(10)

    assert "Traceback" not in stderr, stderr[-2000:]
    assert load.returncode == 1, (load.returncode, stdout[-1000:], stderr[-1000:])
    report = json.loads((out / "load.json").read_text())
    assert "| submitters |" in stdout and stdout.rstrip().endswith("|")  # the table, printed last
    assert report["accepted"] >= 3
    # the submits after the kill could not connect: refused, no job
    assert report["rejected_codes"].get("connection_refused", 0) > 0
    assert report["rejected"] == sum(report["rejected_codes"].values())
    # every accepted job is accounted for; the ones it could not follow any more are unknown
    assert report["completed"] + report["failed"] + report["lost"] + report["unknown"] == report["accepted"]
    assert report["unknown"] > 0 and report["lost"] == 0
    assert any("no server answered" in e for e in report["errors"]), report["errors"]
    # it stopped asking --gone-after (2 s) after the submitters ended, not at --finish-timeout (30 s)
    assert ended_after_kill < 25, ended_after_kill
