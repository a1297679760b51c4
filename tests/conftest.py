"""Shared fixtures: model directories built offline (cached between runs), funasr reference models,
and a live server on loopback."""

from __future__ import annotations

import os
import socket
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# Live admission refuses new streams while re-decodes take over the budget (0.15 s by default, set
# for a server that has its cores to itself). On a CI machine running the suite's other servers
# beside it the demo model's re-decodes pass that at times, and a test about something else would
# be refused live_at_capacity; the tests that exercise admission set their own budget or load.
os.environ.setdefault("SENSEVOICE_LIVE_LATENCY_BUDGET_S", "5")

pytest_plugins = ["tests.fixtures_media"]

ROOT = Path(__file__).resolve().parent.parent
MODEL_CACHE = Path(os.environ.get("SENSEVOICE_TEST_CACHE", ROOT / ".cache" / "test-models"))


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_cuda: needs an NVIDIA GPU")
    config.addinivalue_line("markers", "browser: drives headless Debian chromium")


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "requires_cuda" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_dir() -> Path:
    from pipeline.model.demo import ensure_model_dir

    return Path(ensure_model_dir("tiny", cache_root=MODEL_CACHE))


@pytest.fixture(scope="session")
def demo_dir() -> Path:
    from pipeline.model.demo import ensure_model_dir

    return Path(ensure_model_dir("demo", cache_root=MODEL_CACHE))


@pytest.fixture(scope="session")
def tiny_am(tiny_dir):
    from pipeline.model.loading import load_automodel

    return load_automodel(tiny_dir, "cpu")


@pytest.fixture(scope="session")
def demo_am(demo_dir):
    from pipeline.model.loading import load_automodel

    return load_automodel(demo_dir, "cpu")


CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic"]


@pytest.fixture(scope="module")
def browser():
    """Headless Debian chromium driven by Playwright (never a downloaded browser)."""
    import shutil

    from playwright.sync_api import sync_playwright

    path = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        yield b
        b.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """The real app under uvicorn in a thread, on a loopback port."""

    def __init__(self, settings):
        import uvicorn

        from app_sensevoice import create_app

        self.settings = settings
        self.app = create_app(settings)
        self.runtime = self.app.state.runtime
        self.url = f"http://127.0.0.1:{settings.server.port}"
        from pipeline.web.edge import uvicorn_options

        # the connection guards main() runs with (header deadline, connection limits, WebSocket
        # message limits, forwarded addresses only from trusted proxies)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=settings.server.port, log_level="warning",
                                **uvicorn_options(settings))
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout: float = 120.0) -> "LiveServer":
        import httpx

        self.thread.start()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if self.runtime.health.state == "failed":
                raise RuntimeError(f"service failed to start: {self.runtime.health.error}")
            time.sleep(0.2)
        raise TimeoutError("server not ready")

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=15)


def make_settings(model_dir: Path, data_dir: Path, **kw):
    from pipeline.config import Settings

    return Settings(model=str(model_dir), device="cpu", data_dir=data_dir, port=free_port(),
                    cache_dir=MODEL_CACHE, **kw)


@pytest.fixture(scope="module")
def live_server(demo_dir, tmp_path_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("data"))).start()
    yield server
    server.stop()
