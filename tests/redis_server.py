"""A real redis-server for tests: a free loopback port, a temporary data directory, AOF on.

``RedisServer`` starts it (``--save '' --appendonly yes --appendfsync everysec``), waits for PING,
and can be killed with SIGKILL and restarted on the same port and directory (outage tests: what the
AOF held comes back). Fixtures: ``redis_server`` (the RedisServer) and ``redis_url`` (its URL).
Import them into a test module: ``from tests.redis_server import redis_server, redis_url``.
"""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def _free_port() -> int:
    from tests.conftest import free_port  # below the ephemeral range, a slice per xdist worker

    return free_port()


def _ping(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")  # "-LOADING ..." while the AOF loads
    except OSError:
        return False


class RedisServer:
    def __init__(self, data_dir: str | Path, port: int | None = None, appendfsync: str = "everysec"):
        self.dir = Path(data_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.port = port or _free_port()
        self.appendfsync = appendfsync
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> "RedisServer":
        from tests.conftest import refuse_server_in_unit_test

        refuse_server_in_unit_test("a redis-server")
        self.proc = subprocess.Popen(
            [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.dir),
             "--save", "", "--appendonly", "yes", "--appendfsync", self.appendfsync,
             "--daemonize", "no", "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                log = (self.dir / "redis.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"redis-server exited ({self.proc.returncode}): {log}")
            if _ping(self.port):
                return self
            time.sleep(0.02)
        self.stop()
        raise TimeoutError(f"redis-server on port {self.port} did not answer PING")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no final fsync (what a crash does)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def restart(self) -> "RedisServer":
        """Kill -9 (if running) and start again on the same port and directory."""
        self.kill()
        return self.start()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None


@contextmanager
def running_redis(data_dir: str | Path, appendfsync: str = "everysec") -> Iterator[RedisServer]:
    """A started RedisServer, stopped on exit (a port taken meanwhile is retried)."""
    last: Exception | None = None
    for _ in range(3):
        server = RedisServer(data_dir, appendfsync=appendfsync)
        try:
            server.start()
            break
        except (RuntimeError, TimeoutError) as e:  # e.g. the free port was taken meanwhile
            last = e
    else:
        raise last  # type: ignore[misc]
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def redis_server(tmp_path) -> Iterator[RedisServer]:
    with running_redis(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def redis_url(redis_server) -> str:
    return redis_server.url
