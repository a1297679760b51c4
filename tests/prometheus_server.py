"""A real Prometheus for tests: Debian's ``prometheus`` binary on a free loopback port with its
storage in a temporary directory, started on a configuration the test writes (``PrometheusServer``),
and queried through its HTTP API. ``promtool`` runs Debian's promtool. Both fail the test (never
skip) when the package is missing: ``.ci/run`` installs it (apt ``prometheus``).
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml

from tests.conftest import free_port

PROMETHEUS = shutil.which("prometheus") or "/usr/bin/prometheus"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def need_binary(path: str) -> str:
    if not Path(path).is_file():
        pytest.fail(f"{path} is missing: apt-get install --no-install-recommends prometheus "
                    "(.ci/run does). These checks never skip.")
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([need_binary(PROMTOOL), *args], cwd=cwd, capture_output=True,
                          text=True, timeout=120)


class PrometheusServer:
    """``prometheus`` on 127.0.0.1:<free port>, config and data in ``directory``."""

    def __init__(self, directory: Path, config: dict, files: dict[str, str] | None = None):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        for name, text in (files or {}).items():  # rule files, file_sd target lists
            (self.dir / name).write_text(text)
        self.config = self.dir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None
        self.log = self.dir / "prometheus.log"

    def start(self, timeout: float = 60.0) -> "PrometheusServer":
        self.proc = subprocess.Popen(
            [need_binary(PROMETHEUS), f"--config.file={self.config}",
             f"--storage.tsdb.path={self.dir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--storage.tsdb.retention.time=1h", "--log.level=warn"],
            stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"))
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prometheus exited ({self.proc.returncode}): "
                                   f"{self.log.read_text(errors='replace')[-2000:]}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.stop()
        raise TimeoutError("prometheus did not become ready")

    def reload(self, config: dict) -> None:
        """Write a new configuration and have Prometheus load it (SIGHUP), as an operator does."""
        self.config.write_text(yaml.safe_dump(config, sort_keys=False))
        before = self.api("status/runtimeinfo")["lastConfigTime"]
        self.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        while self.api("status/runtimeinfo")["lastConfigTime"] == before:
            assert time.monotonic() < deadline, "prometheus did not reload its configuration"
            time.sleep(0.1)
        assert self.api("status/runtimeinfo")["reloadConfigSuccess"], self.log.read_text()[-2000:]

    def api(self, path: str, **params) -> dict | list:
        r = httpx.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = r.json()
        assert r.status_code == 200 and body["status"] == "success", body
        return body["data"]

    def series(self, match: str) -> list[dict[str, str]]:
        """The label sets of the series ``match`` selects, over the whole stored range."""
        return self.api("series", **{"match[]": match, "start": "0"})

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
