"""Metrics: the exposition parses with prometheus_client's parser (families, types, units), counters
and histograms add up under threads, label values are escaped, scrape-time gauges come from
callbacks, the NVML sampler works with a fake NVML and stays quiet without one; over real HTTP a
long recording is counted (and logged) once, refusals are counted by their code and the HTTP
requests by route template."""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from pipeline.serving.metrics import CONTENT_TYPE, LATENCY_BUCKETS, Metrics, nvml_ids
from tests.test_api import submit, wait_done


# ---------------------------------------------------------------------- the exposition, parsed
@dataclass
class Exposition:
    """What prometheus_client's own parser reads back: families (name without ``_total``) with
    their type, help and unit, and every sample."""
    families: dict = field(default_factory=dict)
    samples: list[tuple[str, dict[str, str], float]] = field(default_factory=list)

    @property
    def type(self) -> dict[str, str]:
        return {name: f.type for name, f in self.families.items()}

    def get(self, name: str, **labels: str) -> list[float]:
        return [v for n, ls, v in self.samples if n == name and labels.items() <= ls.items()]

    def one(self, name: str, **labels: str) -> float:
        values = self.get(name, **labels)
        assert len(values) == 1, (name, labels, values)
        return values[0]


def parse(text: str) -> Exposition:
    assert text.endswith("\n")
    out = Exposition()
    for fam in text_string_to_metric_families(text):
        assert fam.name not in out.families, f"second family {fam.name}"
        out.families[fam.name] = fam
        out.samples += [(s.name, dict(s.labels), s.value) for s in fam.samples]
    return out


def scrape(m: Metrics) -> Exposition:
    return parse(m.render())


# ---------------------------------------------------------------------- a fake NVML
class FakeNvmlError(Exception):
    pass


@dataclass
class FakeGpu:
    uuid: str
    used: int = 3 << 30
    total: int = 141 << 30
    temp: int = 41
    power_mw: int = 123_456
    clock: int = 1980
    util: int = 37
    no_power: bool = False


class FakeNvml:
    NVML_TEMPERATURE_GPU = 0
    NVML_CLOCK_SM = 1

    def __init__(self, gpus: list[FakeGpu]):
        self.gpus = gpus
        self.inits = 0
        self.shutdowns = 0

    def nvmlInit(self):
        self.inits += 1

    def nvmlShutdown(self):
        self.shutdowns += 1

    def nvmlDeviceGetHandleByIndex(self, i):
        if not 0 <= i < len(self.gpus):
            raise FakeNvmlError("Invalid Argument")
        return self.gpus[i]

    def nvmlDeviceGetHandleByUUID(self, uuid):
        return next(g for g in self.gpus if g.uuid == uuid)

    def nvmlDeviceGetUUID(self, h):
        return h.uuid.encode()  # older pynvml returns bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        return type("Memory", (), {"used": h.used, "free": h.total - h.used, "total": h.total})()

    def nvmlDeviceGetTemperature(self, h, sensor):
        assert sensor == self.NVML_TEMPERATURE_GPU
        return h.temp

    def nvmlDeviceGetPowerUsage(self, h):
        if h.no_power:
            raise FakeNvmlError("Not Supported")
        return h.power_mw

    def nvmlDeviceGetClockInfo(self, h, kind):
        assert kind == self.NVML_CLOCK_SM
        return h.clock

    def nvmlDeviceGetUtilizationRates(self, h):
        return type("Utilization", (), {"gpu": h.util, "memory": 5})()


class NoDriverNvml(FakeNvml):
    def __init__(self):
        super().__init__([])

    def nvmlInit(self):
        raise FakeNvmlError("NVML Shared Library Not Found")


GPU_NAMES = ("sensevoice_gpu_memory_used_bytes", "sensevoice_gpu_memory_free_bytes",
             "sensevoice_gpu_memory_total_bytes", "sensevoice_gpu_temperature_celsius",
             "sensevoice_gpu_power_watts", "sensevoice_gpu_sm_clock_hertz",
             "sensevoice_gpu_utilization_ratio")


@pytest.fixture
def no_visible_env(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)


# ---------------------------------------------------------------------- format
def test_families_types_units_and_names():
    m = Metrics(["cuda:0"])
    m.request_success("bulk", 12.5)
    m.request_failure("interactive", "out_of_memory")
    m.rejected("queue_full")
    m.observe_queues("bulk", [0.02])
    m.observe_compute(0.1, 4, "cuda:0")
    m.observe_http("GET", "/api/jobs/{job_id}", 404, 0.003, "job_not_found")
    m.set_queue_depth_fn(lambda: 3)
    m.set_jobs_by_state_fn(lambda: {"queued": 3})
    exp = scrape(m)
    assert set(exp.type.values()) <= {"counter", "gauge", "histogram", "info"}
    for name, fam in exp.families.items():
        assert fam.documentation, name
        if not name.startswith("sensevoice_"):
            assert name.startswith(("process_", "python_")), name
            continue
        if fam.type == "counter":  # the family drops _total; every sample carries it
            assert {s.name for s in fam.samples} <= {name + "_total"}, name
        assert not name.endswith(("_ms", "_us", "_mhz")), f"{name}: not a base unit"
    kinds = {"sensevoice_request_success": "counter", "sensevoice_request_failure": "counter",
             "sensevoice_request_rejected": "counter", "sensevoice_audio_seconds": "counter",
             "sensevoice_queue_duration_seconds": "histogram",
             "sensevoice_compute_duration_seconds": "histogram",
             "sensevoice_inference_count": "counter", "sensevoice_execution_count": "counter",
             "sensevoice_http_requests": "counter", "sensevoice_http_refusals": "counter",
             "sensevoice_http_request_duration_seconds": "histogram",
             "sensevoice_build_info": "gauge", "sensevoice_queue_depth": "gauge",
             "sensevoice_jobs": "gauge", "process_cpu_seconds": "counter",
             "process_resident_memory_bytes": "gauge"}
    assert {n: exp.type.get(n) for n in kinds} == kinds
    assert exp.one("sensevoice_audio_seconds_total", lane="bulk") == 12.5
    assert exp.one("sensevoice_http_refusals_total", route="/api/jobs/{job_id}", status="404",
                   code="job_not_found") == 1
    assert exp.one("process_cpu_seconds_total") >= 0
    assert CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"


def test_build_info_says_what_runs():
    import platform

    info = scrape(Metrics(["cuda:0", "cuda:1"])).families["sensevoice_build_info"].samples
    assert len(info) == 1 and info[0].value == 1
    labels = info[0].labels
    assert labels["version"] == "0.1.0" and labels["device"] == "cuda:0,cuda:1"
    assert labels["python"] == platform.python_version() and labels["torch"]


def test_each_metrics_has_its_own_registry():
    a, b = Metrics(["cpu"]), Metrics(["cpu"])  # a second one in a process: no duplicate names
    a.request_success("bulk")
    assert scrape(a).one("sensevoice_request_success_total", lane="bulk") == 1
    assert scrape(b).get("sensevoice_request_success_total") == []


def test_fresh_metrics_have_zero_series_per_device():
    exp = scrape(Metrics(["cuda:0", "cuda:1"]))
    for dev in ("cuda:0", "cuda:1"):
        assert exp.one("sensevoice_inference_count_total", device=dev) == 0
        assert exp.one("sensevoice_execution_count_total", device=dev) == 0
        assert exp.one("sensevoice_compute_duration_seconds_count", device=dev) == 0
    for lane in ("interactive", "bulk"):
        assert exp.one("sensevoice_queue_duration_seconds_count", lane=lane) == 0
        assert exp.one("sensevoice_request_failure_total", lane=lane, code="queue_timeout") == 0
    assert exp.get("sensevoice_request_success_total") == []
    assert "sensevoice_request_success" in exp.type  # family announced before its first sample


def test_counters_increase():
    m = Metrics(["cuda:0"])
    for _ in range(3):
        m.request_success("bulk", 2.0)
    m.request_success("interactive")
    m.request_failure("bulk", "out_of_memory")
    m.request_failure("bulk", "out_of_memory")
    m.request_failure("bulk", "audio_lost")
    m.rejected("queue_full")
    m.observe_compute(0.5, 8, "cuda:0")
    m.observe_compute(0.25, 2, "cuda:0")
    exp = scrape(m)
    assert exp.one("sensevoice_request_success_total", lane="bulk") == 3
    assert exp.one("sensevoice_request_success_total", lane="interactive") == 1
    assert exp.one("sensevoice_audio_seconds_total", lane="bulk") == 6.0
    assert exp.one("sensevoice_request_failure_total", lane="bulk", code="out_of_memory") == 2
    assert exp.one("sensevoice_request_failure_total", lane="bulk", code="audio_lost") == 1
    assert exp.one("sensevoice_request_rejected_total", reason="queue_full") == 1
    assert exp.one("sensevoice_inference_count_total", device="cuda:0") == 10
    assert exp.one("sensevoice_execution_count_total", device="cuda:0") == 2
    assert exp.one("sensevoice_compute_duration_seconds_sum", device="cuda:0") == pytest.approx(0.75)
    m.request_success("bulk")
    assert scrape(m).one("sensevoice_request_success_total", lane="bulk") == 4


def test_http_refusal_codes_never_mint_series():
    m = Metrics([])
    m.observe_http("post", "/api/jobs", 400, 0.01, "invalid_request")
    m.observe_http("POST", "/api/jobs", 400, 0.01, "Robert'); DROP TABLE")
    m.observe_http("GET", "unmatched", 404, 0.01, None)
    m.observe_http("GET", "/healthz", 200, 0.01, None)
    exp = scrape(m)
    assert exp.one("sensevoice_http_requests_total", method="POST", route="/api/jobs",
                   status="400") == 2
    assert exp.one("sensevoice_http_refusals_total", code="invalid_request") == 1
    assert exp.one("sensevoice_http_refusals_total", route="/api/jobs", code="other") == 1
    assert exp.one("sensevoice_http_refusals_total", route="unmatched", code="none") == 1
    assert exp.get("sensevoice_http_refusals_total", route="/healthz") == []
    assert exp.one("sensevoice_http_request_duration_seconds_count", method="GET",
                   route="/healthz") == 1


def test_enum_labels_become_lower_case_names():
    from pipeline.domain.types import Lane

    m = Metrics([])
    m.request_success(Lane.INTERACTIVE)
    assert scrape(m).one("sensevoice_request_success_total", lane="interactive") == 1


def test_histogram_buckets_are_cumulative_and_inf_equals_count():
    m = Metrics(["cuda:0"])
    waits = [0.0, 0.0005, 0.001, 0.0011, 0.3, 1.0, 59.9, 60.0, 61.0, 3600.0, -1.0]
    for w in waits:
        m.observe_queues("bulk", [w])
    exp = scrape(m)
    buckets = [(ls["le"], v) for n, ls, v in exp.samples
               if n == "sensevoice_queue_duration_seconds_bucket" and ls["lane"] == "bulk"]
    bounds = [float(le) for le, _ in buckets]
    assert bounds == [*LATENCY_BUCKETS, math.inf] and buckets[-1][0] == "+Inf"
    counts = [v for _, v in buckets]
    assert counts == sorted(counts), "buckets must be cumulative"
    total = exp.one("sensevoice_queue_duration_seconds_count", lane="bulk")
    assert counts[-1] == total == len(waits)
    assert exp.one("sensevoice_queue_duration_seconds_count", lane="interactive") == 0
    by_le = dict(buckets)
    assert by_le["0.001"] == 4  # le is inclusive; the negative wait counts as 0
    assert by_le["1.0"] == 7
    assert by_le["60.0"] == 9
    clean = sum(max(w, 0.0) for w in waits)
    assert exp.one("sensevoice_queue_duration_seconds_sum", lane="bulk") == pytest.approx(clean)


def test_compute_histogram_per_device():
    m = Metrics(["cuda:0", "cuda:1"])
    m.observe_compute(0.004, 1, "cuda:0")
    m.observe_compute(2.0, 64, "cuda:1")
    exp = scrape(m)
    assert exp.one("sensevoice_compute_duration_seconds_bucket", device="cuda:0", le="0.005") == 1
    assert exp.one("sensevoice_compute_duration_seconds_bucket", device="cuda:1", le="0.005") == 0
    assert exp.one("sensevoice_compute_duration_seconds_bucket", device="cuda:1", le="+Inf") == 1
    assert exp.one("sensevoice_compute_duration_seconds_sum", device="cuda:1") == 2.0


@pytest.mark.parametrize("code", ['say "hi"', "back\\slash", "two\nlines", '\\"\n\\n', "ü 日本"])
def test_label_values_are_escaped(code):
    m = Metrics([])
    m.request_failure("bulk", code)
    text = m.render()
    line = next(ln for ln in text.splitlines()  # (the known codes' series are at 0)
                if ln.startswith("sensevoice_request_failure_total{") and ln.endswith(" 1.0"))
    escaped = code.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    assert f'code="{escaped}"' in line
    assert parse(text).one("sensevoice_request_failure_total", lane="bulk", code=code) == 1


# ---------------------------------------------------------------------- scrape-time gauges
def test_gauges_come_from_callbacks_at_scrape_time():
    m = Metrics([])
    assert "sensevoice_queue_depth" not in scrape(m).type  # no callback, no gauge
    depth = [5]
    m.set_queue_depth_fn(lambda: depth[0])
    m.set_jobs_by_state_fn(lambda: {"queued": depth[0], "running": 2, "done": 10, "failed": 1})
    exp = scrape(m)
    assert exp.type["sensevoice_queue_depth"] == "gauge" and exp.type["sensevoice_jobs"] == "gauge"
    assert exp.one("sensevoice_queue_depth") == 5
    assert {ls["state"]: v for n, ls, v in exp.samples if n == "sensevoice_jobs"} == {
        "queued": 5, "running": 2, "done": 10, "failed": 1}
    depth[0] = 0
    assert scrape(m).one("sensevoice_queue_depth") == 0
    assert scrape(m).one("sensevoice_jobs", state="queued") == 0


def test_a_failing_callback_leaves_its_gauge_out(caplog):
    m = Metrics([])
    m.set_queue_depth_fn(lambda: 1 / 0)
    m.set_jobs_by_state_fn(lambda: {"done": 1})
    with caplog.at_level(logging.WARNING, logger="sensevoice.metrics"):
        exp = scrape(m)
    assert "sensevoice_queue_depth" not in exp.type
    assert exp.one("sensevoice_jobs", state="done") == 1
    assert any("queue depth" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------- threads
def test_updates_from_8_threads_are_exact():
    m = Metrics(["cuda:0", "cuda:1"])
    n_threads, n = 8, 2_000
    barrier = threading.Barrier(n_threads)

    def hammer(t: int):
        barrier.wait()
        dev = f"cuda:{t % 2}"
        for i in range(n):
            m.request_success("bulk")
            m.request_failure("bulk", "oom")
            m.rejected("queue_full")
            m.observe_queues("interactive", [0.001])
            m.observe_compute(0.002, 3, dev)
            if i % 500 == 0:
                m.render()  # scrapes race with updates

    threads = [threading.Thread(target=hammer, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    exp, total = scrape(m), n_threads * n
    assert exp.one("sensevoice_request_success_total", lane="bulk") == total
    assert exp.one("sensevoice_request_failure_total", lane="bulk", code="oom") == total
    assert exp.one("sensevoice_request_rejected_total", reason="queue_full") == total
    assert exp.one("sensevoice_queue_duration_seconds_count", lane="interactive") == total
    assert exp.one("sensevoice_queue_duration_seconds_bucket", lane="interactive",
                   le="0.001") == total
    for dev in ("cuda:0", "cuda:1"):
        assert exp.one("sensevoice_execution_count_total", device=dev) == total // 2
        assert exp.one("sensevoice_inference_count_total", device=dev) == 3 * total // 2
        assert exp.one("sensevoice_compute_duration_seconds_count", device=dev) == total // 2


# ---------------------------------------------------------------------- NVML
def gpu_names(exp: Exposition) -> set[str]:
    return {n for n, _, _ in exp.samples if n.startswith("sensevoice_gpu_")} | {
        n for n in exp.type if n.startswith("sensevoice_gpu_")}


def test_without_nvml_there_are_no_gpu_metrics_and_no_error(caplog, no_visible_env):
    m = Metrics(["cuda:0"], nvml=NoDriverNvml())
    with caplog.at_level(logging.INFO, logger="sensevoice.metrics"):
        m.start()
        m.start()
        exp = scrape(m)
        m.stop()
    assert gpu_names(exp) == set()
    notes = [r for r in caplog.records if "NVML not available" in r.getMessage()]
    assert len(notes) == 1 and notes[0].levelno == logging.INFO


def test_cpu_service_never_touches_nvml():
    fake = FakeNvml([FakeGpu("GPU-0")])
    m = Metrics(["cpu"], nvml=fake)
    m.start()
    assert gpu_names(scrape(m)) == set() and fake.inits == 0
    m.stop()


def test_real_pynvml_start_stop_does_not_raise():
    m = Metrics(["cuda:0"], nvml_interval_s=0.05)  # real pynvml: gauges on a GPU host, none elsewhere
    m.start()
    try:
        exp = scrape(m)
    finally:
        m.stop()
    names = gpu_names(exp)
    assert names == set() or "sensevoice_gpu_memory_total_bytes" in names


def test_fake_nvml_gauges_with_labels_and_units(no_visible_env):
    fake = FakeNvml([FakeGpu("GPU-aaa"), FakeGpu("GPU-bbb", used=1 << 30, temp=55, util=100)])
    m = Metrics(["cuda:0", "cuda:1"], nvml_interval_s=60, nvml=fake)
    m.start()
    try:
        exp = scrape(m)  # start samples once before it returns
    finally:
        m.stop()
    assert gpu_names(exp) == set(GPU_NAMES)
    for name in GPU_NAMES:
        assert exp.type[name] == "gauge" and exp.families[name].documentation
        assert [ls for n, ls, _ in exp.samples if n == name] == [
            {"device": "cuda:0", "gpu_uuid": "GPU-aaa"}, {"device": "cuda:1", "gpu_uuid": "GPU-bbb"}]
    a, b = {"device": "cuda:0"}, {"device": "cuda:1"}
    assert exp.one("sensevoice_gpu_memory_used_bytes", **a) == 3 << 30
    assert exp.one("sensevoice_gpu_memory_free_bytes", **b) == (141 << 30) - (1 << 30)
    assert exp.one("sensevoice_gpu_memory_total_bytes", **b) == 141 << 30
    assert exp.one("sensevoice_gpu_temperature_celsius", **b) == 55
    assert exp.one("sensevoice_gpu_power_watts", **a) == pytest.approx(123.456)
    assert exp.one("sensevoice_gpu_sm_clock_hertz", **a) == 1980e6
    assert exp.one("sensevoice_gpu_utilization_ratio", **a) == pytest.approx(0.37)
    assert exp.one("sensevoice_gpu_utilization_ratio", **b) == 1.0
    assert fake.inits == fake.shutdowns == 1
    assert gpu_names(scrape(m)) == set(), "stopped: no stale GPU gauges"


def test_sampler_follows_cuda_visible_devices(monkeypatch):
    fake = FakeNvml([FakeGpu("GPU-0"), FakeGpu("GPU-1"), FakeGpu("GPU-2")])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-0")
    m = Metrics(["cuda:0", "cuda:1"], nvml_interval_s=60, nvml=fake)
    m.start()
    exp = scrape(m)
    m.stop()
    assert {ls["device"]: ls["gpu_uuid"] for n, ls, _ in exp.samples
            if n == "sensevoice_gpu_memory_used_bytes"} == {"cuda:0": "GPU-2", "cuda:1": "GPU-0"}


def test_sampler_updates_and_skips_unsupported_readings(no_visible_env):
    gpu = FakeGpu("GPU-x", no_power=True)
    m = Metrics(["cuda:0"], nvml_interval_s=0.01, nvml=FakeNvml([gpu]))
    m.start()
    try:
        exp = scrape(m)
        assert "sensevoice_gpu_power_watts" not in gpu_names(exp)
        assert exp.one("sensevoice_gpu_temperature_celsius") == 41
        gpu.temp = 77
        deadline = time.monotonic() + 5
        while scrape(m).one("sensevoice_gpu_temperature_celsius") != 77:
            assert time.monotonic() < deadline, "sampler did not pick up the new reading"
            time.sleep(0.01)
    finally:
        m.stop()


def test_a_device_nvml_cannot_find_is_skipped(no_visible_env):
    m = Metrics(["cuda:0", "cuda:3"], nvml_interval_s=60, nvml=FakeNvml([FakeGpu("GPU-only")]))
    m.start()
    exp = scrape(m)
    m.stop()
    assert [ls["device"] for n, ls, _ in exp.samples if n == "sensevoice_gpu_sm_clock_hertz"] == ["cuda:0"]


def test_nvml_ids_maps_cuda_ordinals():
    assert nvml_ids(["cuda", "cpu"], None) == [("cuda", 0)]
    assert nvml_ids(["cuda:0", "cuda:2"], None) == [("cuda:0", 0), ("cuda:2", 2)]
    assert nvml_ids(["cuda:0", "cuda:1"], "3, GPU-abc") == [("cuda:0", 3), ("cuda:1", "GPU-abc")]
    assert nvml_ids(["cuda:1"], "0") == []
    assert nvml_ids(["cuda:0"], "") == []


def test_gpu_collector_parses_with_prometheus_client(no_visible_env):
    m = Metrics(["cuda:0"], nvml=FakeNvml([FakeGpu("GPU-p")]))
    m.start()
    text = m.render()
    m.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    clock = families["sensevoice_gpu_sm_clock_hertz"]
    assert clock.type == "gauge" and clock.samples[0].labels == {"device": "cuda:0",
                                                                   "gpu_uuid": "GPU-p"}


# ---------------------------------------------------------------------- over real HTTP
@pytest.fixture(scope="module")
def metrics_server(demo_dir, tmp_path_factory):
    from tests.conftest import LiveServer, make_settings

    server = LiveServer(make_settings(demo_dir, tmp_path_factory.mktemp("metrics"),
                                      max_upload_bytes=8_000_000)).start()
    yield server
    server.stop()


def http_scrape(server) -> Exposition:
    r = httpx.get(server.url + "/metrics", timeout=10)
    assert r.status_code == 200 and r.headers["content-type"] == CONTENT_TYPE
    return parse(r.text)


def _value(exp: Exposition, name: str, **labels: str) -> float:
    return sum(exp.get(name, **labels))


def test_a_long_recording_is_counted_and_logged_once(metrics_server, long_call, caplog):
    before = http_scrape(metrics_server)
    with caplog.at_level(logging.DEBUG, logger="sensevoice"):
        r = submit(metrics_server, long_call, language="en", split_channels="true")
        assert r.status_code == 202, r.text
        job_id = r.json()["id"]
        done = wait_done(metrics_server, job_id, timeout=120.0)
    assert done["status"] == "done", done
    after = http_scrape(metrics_server)
    pieces = int(_value(after, "sensevoice_inference_count_total", device="cpu")
                 - _value(before, "sensevoice_inference_count_total", device="cpu"))
    assert pieces > 2, "the call was not split into pieces"
    assert (_value(after, "sensevoice_request_success_total")
            - _value(before, "sensevoice_request_success_total")) == 1
    assert (_value(after, "sensevoice_audio_seconds_total")
            - _value(before, "sensevoice_audio_seconds_total")) == pytest.approx(48, abs=0.5)
    done_lines = [rec.getMessage() for rec in caplog.records
                  if rec.getMessage().startswith("job done") and job_id in rec.getMessage()]
    assert len(done_lines) == 1, done_lines
    assert f"pieces={pieces} " in done_lines[0]
    piece_lines = [rec for rec in caplog.records
                   if rec.getMessage().startswith("piece done") and job_id in rec.getMessage()]
    assert len(piece_lines) == pieces and all(rec.levelno == logging.DEBUG for rec in piece_lines)


def test_refusals_are_counted_by_code_and_routes_by_template(metrics_server, clip_factory):
    url = metrics_server.url
    ids = [uuid.uuid4() for _ in range(3)]
    for jid in ids:
        assert httpx.get(f"{url}/api/jobs/{jid}").status_code == 404
    bad_language = submit(metrics_server, clip_factory("wav", 16000, 1), language="klingon")
    assert bad_language.status_code == 400
    no_file = httpx.post(url + "/api/jobs", data={"language": "en"})
    assert no_file.status_code == 400 and no_file.json()["error"]["code"] == "invalid_request"
    big = httpx.post(url + "/api/jobs", files={"file": ("big.wav", b"\0" * 9_000_000)})
    assert big.status_code == 413 and big.json()["error"]["code"] == "upload_too_large"
    assert httpx.get(f"{url}/no/such/{uuid.uuid4()}").status_code == 404
    exp = http_scrape(metrics_server)

    routes = {ls["route"] for n, ls, _ in exp.samples if n == "sensevoice_http_requests_total"}
    assert not any(str(jid) in r for jid in ids for r in routes), routes  # no raw paths
    assert exp.one("sensevoice_http_requests_total", method="GET", route="/api/jobs/{job_id}",
                   status="404") == 3
    assert exp.one("sensevoice_http_refusals_total", route="/api/jobs/{job_id}", status="404",
                   code="job_not_found") == 3
    bad_code = bad_language.json()["error"]["code"]
    assert exp.one("sensevoice_http_refusals_total", route="/api/jobs", status="400",
                   code=bad_code) >= 1
    assert exp.one("sensevoice_http_refusals_total", route="/api/jobs", status="400",
                   code="invalid_request") >= 1
    assert exp.one("sensevoice_http_refusals_total", route="/api/jobs", status="413",
                   code="upload_too_large") == 1
    assert exp.one("sensevoice_http_refusals_total", route="unmatched", status="404",
                   code="not_found") == 1
    assert exp.one("sensevoice_http_request_duration_seconds_count", method="GET",
                   route="/api/jobs/{job_id}") == sum(exp.get(  # polls of other tests included
                       "sensevoice_http_requests_total", method="GET", route="/api/jobs/{job_id}"))
    assert exp.one("sensevoice_http_requests_total", method="GET", route="/readyz",
                   status="200") >= 1
    assert exp.families["sensevoice_build_info"].samples[0].labels["device"] == "cpu"
    assert exp.one("process_resident_memory_bytes") > 0
    assert exp.one("process_cpu_seconds_total") > 0


def test_event_loop_lag_and_broker_state():
    m = Metrics([])
    assert "sensevoice_broker_up" not in scrape(m).type  # embedded: no broker, no gauge
    up = [True]
    m.set_broker_up_fn(lambda: up[0])
    for lag in (0.001, 0.3, 2.0, -0.01):
        m.observe_loop_lag(lag)
    exp = scrape(m)
    assert exp.one("sensevoice_broker_up") == 1
    assert exp.one("sensevoice_event_loop_lag_seconds_count") == 4
    assert exp.one("sensevoice_event_loop_lag_seconds_bucket", le="0.25") == 2  # the negative is 0
    assert exp.one("sensevoice_event_loop_lag_seconds_bucket", le="2.5") == 4
    up[0] = False
    assert scrape(m).one("sensevoice_broker_up") == 0


def test_job_time_per_lane():
    m = Metrics([])
    m.observe_job(0.2, "interactive")
    m.observe_job(40.0, "bulk")
    exp = scrape(m)
    assert exp.one("sensevoice_job_duration_seconds_bucket", lane="interactive", le="0.25") == 1
    assert exp.one("sensevoice_job_duration_seconds_bucket", lane="bulk", le="30.0") == 0
    assert exp.one("sensevoice_job_duration_seconds_count", lane="bulk") == 1


def test_route_templates_are_remembered_per_path_and_forgotten_when_routes_change():
    """HttpMetrics matches a (method, path) against the routes once; a route added later (or more
    paths than it remembers) makes it match again, so a label is never stale."""
    from fastapi import FastAPI

    from pipeline.web.http_metrics import HttpMetrics

    app = FastAPI()
    app.get("/api/jobs/{job_id}")(lambda job_id: None)
    mw = HttpMetrics(app, Metrics([]), routes_of=app)
    scope = {"type": "http", "method": "GET", "path": "/api/jobs/abc"}
    assert mw._template(scope) == mw._template(dict(scope)) == "/api/jobs/{job_id}"
    late = {"type": "http", "method": "GET", "path": "/late"}
    assert mw._template(late) == "unmatched"
    app.get("/late")(lambda: None)
    assert mw._template(late) == "/late"
    for i in range(HttpMetrics.MAX_REMEMBERED + 10):
        mw._template({"type": "http", "method": "GET", "path": f"/api/jobs/{i}"})
    assert len(mw._templates) <= HttpMetrics.MAX_REMEMBERED


SIBLING_SCRIPT = """
from pipeline.serving.metrics import Metrics
m = Metrics(["cpu"])
m.observe_http("POST", "/api/jobs", 202, 0.01)
m.observe_http("POST", "/api/jobs", 202, 0.02)
m.observe_http("GET", "/api/jobs/{job_id}", 404, 0.001, "job_not_found")
m.rejected("queue_full")
m.request_success("bulk", 3.0)  # not one of SIBLING_FAMILIES: a sibling finishes no job
m.observe_loop_lag(0.003)
print("ok", flush=True)
"""


def test_an_owner_adds_what_its_siblings_count_through_prometheus_multiprocess(tmp_path):
    """A sibling web process (here: a python process with PROMETHEUS_MULTIPROC_DIR set, as
    ``WebSiblings.sibling_env`` sets it) counts in its memory-mapped files; the owner's render adds
    the SIBLING_FAMILIES to its own series (one family each, the same series summed), leaves the
    rest (build info, jobs) its own, and a dead sibling's live gauge goes (mark_process_dead)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    folder = tmp_path / "metrics"
    folder.mkdir(mode=0o700)
    sib = subprocess.run([sys.executable, "-c", SIBLING_SCRIPT], cwd=root, capture_output=True, text=True,
                         env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(folder)}, timeout=120)
    assert sib.stdout.strip() == "ok", sib.stderr
    owner = Metrics(["cpu"])
    owner.observe_http("POST", "/api/jobs", 202, 0.01)
    owner.count_siblings(str(folder))
    text = owner.render()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert sum(line.startswith("# TYPE sensevoice_http_requests_total ") for line in text.splitlines()) == 1

    def value(family: str, sample: str, **labels) -> float:
        found = [s.value for s in families[family].samples if s.name == sample and s.labels == labels]
        assert len(found) == 1, (sample, labels, families[family].samples)
        return found[0]

    assert value("sensevoice_http_requests", "sensevoice_http_requests_total",
                 method="POST", route="/api/jobs", status="202") == 3  # 1 here + 2 there
    assert value("sensevoice_http_requests", "sensevoice_http_requests_total",
                 method="GET", route="/api/jobs/{job_id}", status="404") == 1  # the sibling's only
    assert value("sensevoice_http_refusals", "sensevoice_http_refusals_total",
                 route="/api/jobs/{job_id}", status="404", code="job_not_found") == 1
    assert value("sensevoice_http_request_duration_seconds", "sensevoice_http_request_duration_seconds_count",
                 method="POST", route="/api/jobs") == 3
    assert value("sensevoice_http_request_duration_seconds", "sensevoice_http_request_duration_seconds_bucket",
                 method="POST", route="/api/jobs", le="+Inf") == 3
    assert value("sensevoice_request_rejected", "sensevoice_request_rejected_total", reason="queue_full") == 1
    assert value("sensevoice_event_loop_lag_seconds", "sensevoice_event_loop_lag_seconds_count") == 1
    assert not families["sensevoice_request_success"].samples  # its own: the sibling's success is not added
    assert len(families["sensevoice_build_info"].samples) == 1  # the owner's, no pid label
    gauges = list(folder.glob("gauge_liveall_*.db"))
    assert gauges, sorted(p.name for p in folder.iterdir())  # the sibling's build info, live
    owner.sibling_gone(int(gauges[0].stem.rsplit("_", 1)[1]))
    assert not list(folder.glob("gauge_liveall_*.db"))
    assert "sensevoice_http_requests_total" in owner.render()  # its counters stay counted
    assert value("sensevoice_http_requests", "sensevoice_http_requests_total",
                 method="POST", route="/api/jobs", status="202") == 3


def test_an_owner_whose_siblings_folder_is_gone_renders_its_own(tmp_path, caplog):
    owner = Metrics(["cpu"])
    owner.observe_http("POST", "/api/jobs", 202, 0.01)
    owner.count_siblings(str(tmp_path / "gone"))
    with caplog.at_level(logging.WARNING, logger="sensevoice.metrics"):
        text = owner.render()
    assert 'sensevoice_http_requests_total{method="POST",route="/api/jobs",status="202"} 1.0' in text
    assert "could not be read" in caplog.text
