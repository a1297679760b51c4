"""`sensevoice doctor`: the facts of this machine, each problem with a fix, bounded in time; and the
same report under /readyz's details, cached so that probes stay cheap."""

from __future__ import annotations

import json
import platform
import time

import av
import httpx
import pytest
import torch

from pipeline import doctor
from pipeline.config import Settings
from pipeline.doctor import DoctorCache, Status, run_checks
from pipeline.entry import main as sensevoice
from tests.conftest import LiveServer, free_port, make_settings
from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures)

TOKEN = "doctor-token"


def settings(tmp_path, **kw) -> Settings:
    return Settings(**{"device": "cpu", "data_dir": tmp_path / "data", "cache_dir": tmp_path / "cache",
                       **kw})


def test_a_healthy_machine_reports_its_versions(demo_dir, tmp_path):
    t0 = time.monotonic()
    report = run_checks(settings(tmp_path, model=str(demo_dir)))
    assert time.monotonic() - t0 < 15  # the hub probe is bounded, online or not
    assert report.ok, doctor.format_table(report)
    names = [c.name for c in report.checks]
    for name in ("python", "torch", "cuda", "pyav", "model", "hub", "data_dir"):
        assert name in names
    assert "broker" not in names  # embedded: nothing to reach
    assert platform.python_version() in report.check("python").detail
    assert report.check("torch").detail == torch.__version__
    pyav = report.check("pyav")
    assert pyav.status is Status.OK and av.__version__ in pyav.detail and "opus" in pyav.detail
    assert "model.pt" in report.check("model").detail
    assert "does not exist yet" in report.check("data_dir").detail
    if not torch.cuda.is_available():  # a CPU is slow, not broken
        assert report.check("cuda").status is Status.WARN and report.check("cuda").fix
    else:
        assert any(n.startswith("gpu:") for n in names)
    doc = report.to_dict()
    assert doc["ok"] is True and doc["checks"][0]["status"] == "ok"


def test_problems_fail_with_what_to_do(tmp_path):
    (tmp_path / "not-a-model").mkdir()
    (tmp_path / "file").write_text("x")
    t0 = time.monotonic()
    report = run_checks(settings(tmp_path, model=str(tmp_path / "not-a-model"),
                                 data_dir=tmp_path / "file" / "data",
                                 broker=f"redis://:secret@127.0.0.1:{free_port()}/0"))
    assert time.monotonic() - t0 < 15
    assert not report.ok
    model, data, broker = report.check("model"), report.check("data_dir"), report.check("broker")
    assert model.status is Status.FAIL and "missing config.yaml" in model.detail and "--demo" in model.fix
    assert data.status is Status.FAIL and "SENSEVOICE_DATA_DIR" in data.fix
    assert broker.status is Status.FAIL and "PING" in broker.detail and "secret" not in broker.detail
    unknown = run_checks(settings(tmp_path, model="no-such-model")).check("model")
    assert unknown.status is Status.FAIL and "not a hub name" in unknown.detail


def test_device_cuda_without_a_gpu_fails(tmp_path, demo_dir):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    cuda = run_checks(settings(tmp_path, model=str(demo_dir), device="cuda")).check("cuda")
    assert cuda.status is Status.FAIL and "nvidia-smi" in cuda.fix


def test_a_configured_broker_is_pinged(redis_url, tmp_path, demo_dir):  # noqa: F811
    broker = run_checks(settings(tmp_path, model=str(demo_dir), broker=redis_url)).check("broker")
    assert broker.status is Status.OK and "Redis " in broker.detail


def test_the_command_prints_a_table_and_exits_1_on_a_failure(tmp_path, demo_dir, capsys):
    base = ["doctor", "--device", "cpu", "--data-dir", str(tmp_path / "data")]
    assert sensevoice([*base, "--model", str(demo_dir)]) == 0
    table = capsys.readouterr().out
    assert table.startswith("check") and "python" in table and "0 failed" in table
    assert sensevoice([*base, "--model", "no-such-model"]) == 1
    table = capsys.readouterr().out
    assert "FAIL" in table and "-> pass --model DIR" in table
    assert sensevoice([*base, "--model", str(demo_dir), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["ok"] is True


def test_cache_answers_at_once_and_refreshes_in_the_background(tmp_path, demo_dir):
    cache = DoctorCache(settings(tmp_path, model=str(demo_dir)), ttl_s=3600)
    t0 = time.monotonic()
    assert cache.latest() is None and cache.details() == {"checking": True}
    assert time.monotonic() - t0 < 0.5  # never waits for the checks
    deadline = time.monotonic() + 30
    while cache.latest() is None:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first = cache.latest()
    assert cache.latest() is first  # cached within the ttl
    cache.ttl_s = 0
    cache.latest()  # stale: a refresh starts, the old report answers meanwhile
    while cache.latest() is first:
        assert time.monotonic() < deadline
        time.sleep(0.05)


@pytest.fixture(scope="module")
def token_server(demo_dir, tmp_path_factory):
    server = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("data"), api_token=TOKEN,
                                      ui=False)).start()
    yield server
    server.stop()


def test_readyz_details_carry_the_report_for_token_holders(token_server):
    deadline = time.monotonic() + 30
    while True:
        r = httpx.get(token_server.url + "/readyz", headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 200
        if "checks" in r.json()["details"]:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    details = r.json()["details"]
    assert details["ok"] is True
    assert {"python", "torch", "pyav", "model", "data_dir"} <= {c["name"] for c in details["checks"]}
    t0 = time.monotonic()
    for _ in range(20):  # probes stay cheap: the report is cached
        httpx.get(token_server.url + "/readyz", headers={"Authorization": f"Bearer {TOKEN}"})
    assert time.monotonic() - t0 < 5
    anonymous = httpx.get(token_server.url + "/readyz")  # a kubelet's probe: no paths, no versions
    assert anonymous.status_code == 200 and "details" not in anonymous.json()
