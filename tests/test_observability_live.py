"""A real Prometheus (Debian's binary, loopback, a temporary storage directory, a 1 s scrape
interval) scrapes real servers with the project's scrape configuration (deploy/observability/
build.py's ``static_config``, pointed at the loopback ports) and evaluates the project's alert rules,
in both topologies:

* embedded: one ``app_sensevoice.py --demo`` process (role all, SQLite), with an API token that
  Prometheus sends from its token file;
* distributed: a real redis-server, one ``--role api`` process (with the token) and one
  ``--role worker`` process (without), as tests/test_distributed.py starts them.

A few jobs, an unknown job's poll (a 404 with a code), an upload that is no audio (refused) and a
live stream (in the distributed topology also a job queued before any worker, which sets the
no-worker alert pending and then fails with queue_timeout) (tests/test_stream.py's
protocol) are sent; then Prometheus's HTTP API says: every metric the dashboard and the rules read
(``METRIC_LABELS``) exists with the labels they read it by, except the GPU-only ones (listed, with
the reason, in ``ABSENT``); every rule evaluates without error; every dashboard query parses and
runs; no series carries a job id.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.conftest import MODEL_CACHE, ROOT, free_port
from tests.prometheus_server import PrometheusServer
from tests.redis_server import RedisServer
from tests.test_distributed import Role
from tests.test_reliability import wait_ready
from tests.test_stream import _stream, speech  # noqa: F401  (speech: a fixture, used below)
from tests.test_observability import build

TOKEN = "obs-t0ken"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
JOBS = 3
QUEUE_TIMEOUT_S = 5  # the distributed worker's; its jobs otherwise wait milliseconds
NVML = "from NVML, which a CPU machine has not (tests/test_metrics.py covers them with a fake NVML)"
# metrics of METRIC_LABELS that cannot be present here, and why
ABSENT: dict[str, dict[str, str]] = {
    "embedded": {**{m: NVML for m in build.GPU_ONLY},
                 "sensevoice_broker_up": "the embedded topology has no broker"},
    "distributed": {m: NVML for m in build.GPU_ONLY},
}
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class Embedded:
    """``app_sensevoice.py --demo`` in a process of its own (the demo model from the tests'
    cache: ``<cache dir>/models`` is that cache)."""

    def __init__(self, tmp_path: Path):
        cache = tmp_path / "cache"
        cache.mkdir()
        (cache / "models").symlink_to(MODEL_CACHE.resolve(), target_is_directory=True)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(tmp_path / "server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, str(ROOT / "app_sensevoice.py"), "--demo", "--device", "cpu",
             "--port", str(self.port), "--data-dir", str(tmp_path / "data")],
            cwd=ROOT, stdout=self.log, stderr=self.log,
            env={**os.environ, "SENSEVOICE_CACHE_DIR": str(cache), "SENSEVOICE_API_TOKEN": TOKEN,
                 "SENSEVOICE_UI": "false"})

    def ready(self) -> "Embedded":
        wait_ready(self.url, self.proc)
        return self

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def prometheus_config(tmp_path: Path, targets: dict[str, list[str]]) -> dict:
    """The project's scrape configuration for these loopback targets, scraped every second,
    with the project's rules."""
    token = tmp_path / "token"
    token.write_text(TOKEN)
    config = build.static_config(targets, interval="1s", token_file=str(token))
    config["rule_files"] = [str(tmp_path / "prom" / name) for name in build.RULE_FILES]
    return config


def prometheus_for(tmp_path: Path, targets: dict[str, list[str]]) -> PrometheusServer:
    rules = {name: (build.HERE / name).read_text() for name in build.RULE_FILES}
    return PrometheusServer(tmp_path / "prom", prometheus_config(tmp_path, targets), files=rules).start()


def traffic(api_url: str, clip: Path, pcm: bytes) -> tuple[list[str], dict]:
    """JOBS jobs to the end, an unknown job's poll, an upload that is no audio, one live stream;
    the job ids and how the stream ended."""
    ids = []
    for _ in range(JOBS):
        with open(clip, "rb") as f:
            r = httpx.post(api_url + "/api/jobs", params={"wait": 60}, headers=AUTH,
                           files={"file": ("clip.wav", f)}, timeout=90)
        assert r.status_code == 200 and r.json()["status"] == "done", r.text
        ids.append(r.json()["id"])
    r = httpx.get(api_url + "/api/jobs/00000000-0000-4000-8000-000000000000", headers=AUTH)
    assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found"
    r = httpx.post(api_url + "/api/jobs", headers=AUTH, timeout=60,
                   files={"file": ("notes.wav", b"these are not the samples you are looking for")})
    assert r.status_code == 415, r.text  # refused before it became a job
    ws = api_url.replace("http://", "ws://") + "/api/stream?language=en"
    run = asyncio.run(_stream(ws, pcm[: 16000 * 2 * 3], speed=None, headers=AUTH))
    return ids, {"close": run.close_code, "error": run.error}


def started(role: Role, timeout: float = 120) -> None:
    """An api process is up and started (readyz says why it is not ready: no worker)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            body = httpx.get(role.url + "/readyz", timeout=2).json()
            if body.get("state") == "ready":
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline and role.proc.poll() is None, "the api did not start"
        time.sleep(0.2)


def wait_alert(prom: PrometheusServer, name: str, timeout: float = 30) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        alerts = [a for a in prom.api("alerts")["alerts"] if a["labels"]["alertname"] == name]
        if alerts:
            return alerts[0]
        assert time.monotonic() < deadline, f"{name} never became pending"
        time.sleep(0.3)


def wait_for(prom: PrometheusServer, query: str, at_least: float, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        result = prom.api("query", query=query)["result"]
        if result and float(result[0]["value"][1]) >= at_least:
            return
        assert time.monotonic() < deadline, f"{query} did not reach {at_least}: {result}"
        time.sleep(0.5)


def check(prom: PrometheusServer, topology: str, job_ids: list[str]) -> dict[str, set[str]]:
    """What the rules and the dashboard need is there; returns each metric's label names."""
    absent = ABSENT[topology]
    found: dict[str, set[str]] = {}
    for metric, labels in build.METRIC_LABELS.items():
        series = prom.series(metric)
        if metric in absent:
            assert not series, f"{metric} is listed as absent ({absent[metric]}) but exists"
            continue
        assert series, f"{topology}: no series {metric}"
        found[metric] = set().union(*(s.keys() for s in series))
        missing = labels - found[metric]
        assert not missing, f"{topology}: {metric} lacks the labels {missing}: {series[:3]}"
        assert {"job", "instance", "component"} <= found[metric]
    # every rule evaluates on real data without error
    groups = prom.api("rules")["groups"]
    rules = [r for g in groups for r in g["rules"]]
    deadline = time.monotonic() + 30
    while any(r.get("lastEvaluation", "").startswith("0001") for r in rules):
        assert time.monotonic() < deadline, "the rules were never evaluated"
        time.sleep(0.5)
        rules = [r for g in prom.api("rules")["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == set(build.alert_rules())
    bad = [(r["name"], r.get("lastError")) for r in rules if r["health"] != "ok"]
    assert not bad, bad
    # every dashboard query parses and runs (Grafana's $__rate_interval: a minute here)
    dash = json.loads((build.HERE / "grafana/dashboards/sensevoice.json").read_text())
    for expr in build.dashboard_exprs(dash):
        assert build.metrics_in(expr) <= set(found) | set(absent), expr  # each found here
        prom.api("query", query=expr.replace("$__rate_interval", "1m"))
    for rule in build.alert_rules().values():
        assert build.metrics_in(rule["expr"]) <= set(found) | set(absent), rule["alert"]
    # no label value anywhere is a job id (ours, or any UUID)
    everything = prom.series('{__name__=~"sensevoice_.+"}')
    assert len(everything) > 50
    for s in everything:
        for k, v in s.items():
            assert not UUID_RE.search(v) and not any(j in v for j in job_ids), (k, v)
    return found


def test_prometheus_scrapes_the_embedded_topology(demo_dir, clip_factory, speech, tmp_path):  # noqa: F811
    server = Embedded(tmp_path)
    prom = None
    try:
        server.ready()
        prom = prometheus_for(tmp_path, {"all": [f"127.0.0.1:{server.port}"]})
        ids, live = traffic(server.url, clip_factory("wav", 16000, 1), speech.pcm)
        assert live["close"] == 1000, live
        wait_for(prom, "sum(sensevoice_request_success_total)", JOBS)
        wait_for(prom, "sum(sensevoice_live_streams_admitted_total)", 1)
        wait_for(prom, 'sum(sensevoice_http_refusals_total{code="job_not_found"})', 1)
        up = prom.api("query", query="up")["result"]
        assert [(r["metric"]["job"], r["value"][1]) for r in up] == [("sensevoice", "1")]
        found = check(prom, "embedded", ids)
        assert found["sensevoice_workers_alive"] >= {"component"}
    finally:
        if prom is not None:
            prom.stop()
        server.stop()


def test_prometheus_scrapes_the_distributed_topology(demo_dir, clip_factory, speech, tmp_path):  # noqa: F811
    """Before any worker runs, a job is queued: the no-worker alert goes pending on the api's
    real series; the job waits longer than the worker's queue time-out and, once the worker
    comes (added to Prometheus's configuration and reloaded), fails with queue_timeout: a real
    failure series (the jobs after it are fresh)."""
    redis_server = RedisServer(tmp_path / "redis").start()
    api = Role("api", redis_server.url, tmp_path / "api-data", demo_dir, tmp_path / "api.log",
               SENSEVOICE_API_TOKEN=TOKEN, SENSEVOICE_UI="false")
    worker, prom = None, None
    clip = clip_factory("wav", 16000, 1)
    try:
        started(api)  # no worker yet: readyz answers 503 no_worker
        prom = prometheus_for(tmp_path, {"api": [f"127.0.0.1:{api.port}"]})
        with open(clip, "rb") as f:
            early = httpx.post(api.url + "/api/jobs", headers=AUTH, files={"file": ("a.wav", f)},
                               timeout=60)
        assert early.status_code == 202, early.text
        queued_at = time.monotonic()
        pending = wait_alert(prom, "SenseVoiceNoWorker")
        # (pending for its first minute; firing after, on a machine slow enough)
        assert pending["state"] in ("pending", "firing") and pending["labels"]["lane"] == "bulk", pending
        time.sleep(max(0.0, queued_at + QUEUE_TIMEOUT_S + 1 - time.monotonic()))
        worker = Role("worker", redis_server.url, tmp_path / "worker-data", demo_dir,
                      tmp_path / "worker.log", SENSEVOICE_QUEUE_TIMEOUT_S=str(QUEUE_TIMEOUT_S))
        worker.ready(), api.ready()
        prom.reload(prometheus_config(tmp_path, {"api": [f"127.0.0.1:{api.port}"],
                                                 "worker": [f"127.0.0.1:{worker.port}"]}))
        wait_for(prom, "count(up == 1)", 2)
        ids, live = traffic(api.url, clip, speech.pcm)
        assert live["close"] == 1000, live  # an api process serves live captions (issue 22)
        failed = httpx.get(f"{api.url}/api/jobs/{early.json()['id']}", headers=AUTH).json()
        assert (failed["status"], failed["error"]["code"]) == ("failed", "queue_timeout"), failed
        ids.append(failed["id"])
        wait_for(prom, 'sum(sensevoice_request_failure_total{code="queue_timeout",lane="bulk"})', 1)
        wait_for(prom, "sum(sensevoice_request_success_total)", JOBS)
        wait_for(prom, "sum(sensevoice_live_streams_admitted_total)", 1)
        wait_for(prom, 'sum(sensevoice_live_captions_total{kind="final"})', 1)
        wait_for(prom, "min(sensevoice_broker_up)", 1)
        wait_for(prom, "max(sensevoice_workers_alive)", 1)
        up = prom.api("query", query="up")["result"]
        assert sorted((r["metric"]["job"], r["value"][1]) for r in up) == [
            ("sensevoice-api", "1"), ("sensevoice-worker", "1")]
        check(prom, "distributed", ids)
        # the worker's series come from the worker, the HTTP ones from the api
        jobs_of = {s["job"] for s in prom.series("sensevoice_request_success_total")}
        assert jobs_of == {"sensevoice-worker"}
    finally:
        if prom is not None:
            prom.stop()
        for role in (api, worker):
            if role is not None:
                role.stop()
        redis_server.stop()
