"""Shared fixtures: model directories built offline (cached between runs), funasr reference models,
and a live server on loopback."""

from __future__ import annotations

import os
import random
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


# Every test has one tier marker (``pytest -m unit`` is the fast tier; ``-m "not e2e and not
# browser"`` leaves out the real processes and chromium). A test marked browser is browser; else its
# file's tier below; a file named in neither set is unit: no server, no redis-server, no process of
# the app (media made once per session are allowed). A unit test that starts a LiveServer or a
# redis-server fails and says to move its file.
TIERS = {
    "e2e": "real processes of the app (app_sensevoice.py, the CLI, fault_server.py, the package, make)",
    "integration": "an in-process server on loopback, a real redis-server, or the app's ASGI stack",
    "unit": "no server and no other process of the app",
    "browser": "drives headless Debian chromium",
}
E2E_FILES = {
    "test_cli", "test_cli_threads", "test_cli_cuda", "test_distributed", "test_live_distributed", "test_load_test_bench",
    "test_observability_live", "test_package", "test_private_dirs", "test_reliability",
    "test_settings_flags", "test_startup", "test_storage", "test_watchdog", "test_web_siblings",
}
INTEGRATION_FILES = {
    "test_api", "test_archive", "test_delete_api", "test_hotwords_api", "test_redaction_api", "test_speaker_api", "test_auth_throttle", "test_backlog", "test_broker_contract", "test_broker_redis",
    "test_calls_index", "test_cli_hostile_server", "test_decoder", "test_deploy", "test_doctor", "test_edge",
    "test_event_fanout", "test_events", "test_expired_links", "test_fast_submit", "test_forwarded",
    "test_hostile_batches", "test_hostile_exports", "test_live_fairness", "test_live_hostile",
    "test_live_lane_redis", "test_loading", "test_metrics", "test_observability", "test_openai",
    "test_realtime", "test_review_api", "test_stream", "test_submit_threads", "test_ui_heartbeat", "test_ui_security",
}
# Files whose assertions time the app against the wall clock tightly enough that a second pytest-xdist
# worker beside them on 2 cores makes them fail: `make test` runs them alone after the parallel run
# (`-m serial`). Chosen by evidence (docs/COVERAGE.md): test_live_fairness compares a real-time
# stream's finals with and without 8 fast senders (+1.5 s); test_live_distributed bounds a killed
# worker's re-decode moving on at 2 s across four app processes.
SERIAL_FILES = {"test_live_distributed", "test_live_fairness"}
SERIAL = "timing-sensitive: make test runs these alone, after the parallel run (tests/conftest.py SERIAL_FILES)"
# pytest-xdist hands each worker a whole file at a time, by default the files with the most tests
# first: a file of a few slow tests (app processes started and killed) handed out last kept one worker
# busy alone at the end. Under xdist these files go first, the longest first (seconds of their tests
# in one serial make test, --durations), then the others with the most tests first.
LONGEST_FIRST = (
    "test_reliability", "test_web_siblings", "test_distributed", "test_observability_live",
    "test_browser_desk", "test_watchdog", "test_load_test_bench", "test_realtime", "test_event_fanout",
    "test_browser_live", "test_hostile_exports",
)
_UNIT_GUARD = {"unit": False}  # True while a unit test is set up and runs: a server there is a mistake


def pytest_configure(config):
    config.addinivalue_line("markers", "requires_cuda: needs an NVIDIA GPU")
    for name, what in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {what} (tests/conftest.py TIERS)")
    config.addinivalue_line("markers", f"serial: {SERIAL}")


def pytest_ignore_collect(collection_path, config):
    """``-m serial`` alone (make test's second run) collects only SERIAL_FILES: the other files'
    imports would cost the run ~20 s for nothing (the marker comes from SERIAL_FILES only)."""
    if (config.getoption("markexpr", "") == "serial" and collection_path.suffix == ".py"
            and collection_path.name.startswith("test_") and collection_path.stem not in SERIAL_FILES):
        return True
    return None


def tier_of(item) -> str:
    if item.get_closest_marker("browser") or "browser" in getattr(item, "fixturenames", ()):
        return "browser"
    module = Path(str(item.fspath)).stem
    return "e2e" if module in E2E_FILES else "integration" if module in INTEGRATION_FILES else "unit"


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = tier_of(item)
        if not item.get_closest_marker(tier):
            item.add_marker(getattr(pytest.mark, tier))
        if Path(str(item.fspath)).stem in SERIAL_FILES:
            if not item.get_closest_marker("serial"):
                item.add_marker(pytest.mark.serial)
        elif item.get_closest_marker("serial"):
            raise pytest.UsageError(f"{item.nodeid}: a serial test's file goes in SERIAL_FILES (tests/conftest.py)")
    if os.environ.get("PYTEST_XDIST_WORKER"):  # make test passes --no-loadscope-reorder: this order holds
        items[:] = _longest_first(items)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "requires_cuda" in item.keywords:
            item.add_marker(skip)


def _longest_first(items: list) -> list:
    """Whole files, LONGEST_FIRST's in its order, then the rest by their number of tests (the most
    first), each file's tests in their own order."""
    files: dict[str, list] = {}
    for item in items:
        files.setdefault(Path(str(item.fspath)).stem, []).append(item)
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    order = sorted(files, key=lambda name: (0, rank[name]) if name in rank else (1, -len(files[name])))
    return [item for name in order for item in files[name]]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Before any fixture of ``item`` (a module-scoped server included) is set up."""
    _UNIT_GUARD["unit"] = item.get_closest_marker("unit") is not None


def refuse_server_in_unit_test(what: str) -> None:
    if _UNIT_GUARD["unit"]:
        raise RuntimeError(f"a unit test started {what}: name its file in INTEGRATION_FILES or "
                           "E2E_FILES in tests/conftest.py")


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


# Ports for servers the tests start are handed out below Linux's ephemeral range (32768-60999 by
# default), so no outgoing connection takes one before its server binds it (a server process binds
# seconds after its port is chosen), one after another (two ports asked for before either is bound
# differ), and from a slice of their own per pytest-xdist worker.
PORTS_LOW, PORTS_HIGH = 20000, 32768
_ports_lock = threading.Lock()
_next_port: list[int] = []


def _port_slice() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    count = max(int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")), index + 1)
    width = (PORTS_HIGH - PORTS_LOW) // count
    return range(PORTS_LOW + index * width, PORTS_LOW + (index + 1) * width)


def free_port() -> int:
    """A loopback port nothing listens on, not handed out before in this process (until its
    slice wraps around)."""
    ports = _port_slice()
    with _ports_lock:
        if not _next_port:
            _next_port.append(ports.start + random.randrange(len(ports)))
        for _ in range(len(ports)):
            port = _next_port[0]
            _next_port[0] = ports.start + (port + 1 - ports.start) % len(ports)
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", port))
                except OSError:  # in use (or in TIME_WAIT): the next one
                    continue
            return port
    raise RuntimeError(f"no free loopback port in {ports}")


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

        refuse_server_in_unit_test("a LiveServer")
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
