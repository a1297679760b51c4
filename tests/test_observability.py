"""deploy/observability/, checked offline with Debian's promtool and a real Prometheus:

* the generated files (scrape configurations, alert unit tests, the Grafana dashboard JSON) equal a
  fresh run of deploy/observability/build.py;
* ``promtool check config`` passes for every scrape configuration, ``promtool check rules`` for
  the alert rules, ``promtool test rules`` for their unit tests, which hold a firing and a quiet
  case for every alert and fail when an alert is broken (never fires, or fires without waiting);
* every alert has a summary, a description and a runbook line;
* the Kubernetes scrape jobs find the pods of deploy/k8s/ by their labels and annotations: a
  real Prometheus runs their relabelling on the targets those pods would be (Debian's Prometheus
  is built without the Kubernetes service discovery, so the pods' metadata come from a file);
* every expression of the rules and the dashboard names only metrics of ``METRIC_LABELS`` with
  the labels listed there (tests/test_observability_live.py finds those on real servers).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.prometheus_server import PrometheusServer, promtool

ROOT = Path(__file__).resolve().parent.parent
OBS = ROOT / "deploy" / "observability"
K8S = ROOT / "deploy" / "k8s"


def load_build():
    """deploy/observability/build.py (a script, not a package module), imported once."""
    name = "sensevoice_observability_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, OBS / "build.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # (dataclasses look their module up there)
        spec.loader.exec_module(module)
    return sys.modules[name]


build = load_build()


def test_generated_files_are_what_build_py_makes():
    fresh = build.generated()
    assert {"prometheus.k8s.yml", "prometheus.compose.yml", "prometheus.single.yml",
            "alerts.test.yml", "grafana/dashboards/sensevoice.json"} <= set(fresh)
    for name, text in fresh.items():
        assert (OBS / name).read_text() == text, \
            f"{name} is stale: run python deploy/observability/build.py"
    assert build.main(["--check"]) == 0


def _checkable(tmp_path: Path, name: str) -> Path:
    """A copy of a scrape configuration beside the rules, its token file present (compose
    writes it when the container starts; k8s mounts a Secret), and for Kubernetes the pod
    discovery replaced by a file of targets (Debian's Prometheus has no Kubernetes discovery)."""
    doc = yaml.safe_load((OBS / name).read_text())
    token = tmp_path / "token"
    token.write_text("t0ken")
    (tmp_path / "targets.json").write_text("[]")
    for job in doc["scrape_configs"]:
        if "authorization" in job:
            job["authorization"]["credentials_file"] = str(token)
        if job.pop("kubernetes_sd_configs", None) is not None:
            job["file_sd_configs"] = [{"files": [str(tmp_path / "targets.json")]}]
    for rules in doc["rule_files"]:
        (tmp_path / rules).write_text((OBS / rules).read_text())
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.mark.parametrize("name", ["prometheus.k8s.yml", "prometheus.compose.yml", "prometheus.single.yml"])
def test_promtool_checks_the_scrape_configurations(name, tmp_path):
    out = promtool("check", "config", str(_checkable(tmp_path, name)))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout and "9 rules found" in out.stdout


def test_promtool_checks_and_tests_the_rules():
    out = promtool("check", "rules", "alerts.yml", cwd=OBS)
    assert out.returncode == 0 and "SUCCESS: 9 rules found" in out.stdout, out.stdout + out.stderr
    out = promtool("test", "rules", "alerts.test.yml", cwd=OBS)
    assert out.returncode == 0 and "SUCCESS" in out.stdout, out.stdout + out.stderr


REQUIRED_ALERTS = {"SenseVoiceGpuHot", "SenseVoiceGpuMemoryLow", "SenseVoiceNoWorker",
                   "SenseVoiceBrokerUnavailable", "SenseVoiceQueueWaitSlow",
                   "SenseVoiceLiveStreamsRefused", "SenseVoiceHttp5xx", "SenseVoiceJobFailures",
                   "SenseVoiceEventLoopStalled"}


def test_every_alert_has_a_runbook_and_a_firing_and_a_quiet_case():
    rules = build.alert_rules()
    assert set(rules) == REQUIRED_ALERTS
    for name, rule in rules.items():
        assert {"summary", "description", "runbook"} <= set(rule["annotations"]), name
        assert rule["labels"]["severity"] in ("warning", "critical"), name
        expectations = [fired for case in build.ALERT_CASES if case.alert == name
                        for _, fired in case.expect]
        assert any(expectations), f"{name}: no case where it fires"
        assert any(not f for f in expectations), f"{name}: no case where it stays quiet"
    assert "83" in rules["SenseVoiceGpuHot"]["expr"] and rules["SenseVoiceGpuHot"]["for"] == "2m"
    assert "0.15" in rules["SenseVoiceGpuMemoryLow"]["expr"]


def _mutated(tmp_path: Path, alert: str, change) -> Path:
    doc = yaml.safe_load((OBS / "alerts.yml").read_text())
    for group in doc["groups"]:
        for rule in group["rules"]:
            if rule.get("alert") == alert:
                change(rule)
    (tmp_path / "alerts.yml").write_text(yaml.safe_dump(doc, sort_keys=False))
    (tmp_path / "alerts.test.yml").write_text((OBS / "alerts.test.yml").read_text())
    return tmp_path


@pytest.mark.parametrize("alert", sorted(REQUIRED_ALERTS))
def test_the_rule_tests_fail_for_a_broken_alert(alert, tmp_path):
    """The unit tests are not vacuous: an alert that never fires, or fires at once instead of
    after its ``for``, fails them."""
    def never(rule):
        rule["expr"] = f"({rule['expr']}) and on () (vector(0) > 1)"

    def at_once(rule):
        rule.pop("for")

    for change, name in ((never, "never"), (at_once, "at-once")):
        (tmp_path / name).mkdir()
        out = promtool("test", "rules", "alerts.test.yml", cwd=_mutated(tmp_path / name, alert, change))
        text = out.stdout + out.stderr
        assert out.returncode != 0 and "FAILED" in text and f"alertname: {alert}," in text, \
            f"{alert} {name}: {text}"


# ---------------------------------------------------------------------- expressions and metrics
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_SELECTOR = re.compile(r"\{([^}]*)\}")
_MATCHER = re.compile(r"([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)")


def labels_in(expr: str) -> set[str]:
    """The labels an expression groups or selects by (``by (...)``, ``{l="v"}``)."""
    names = {n.strip() for m in _BY.finditer(expr) for n in m.group(1).split(",") if n.strip()}
    names |= {m for sel in _SELECTOR.finditer(expr) for m in _MATCHER.findall(sel.group(1))}
    return names


def all_exprs() -> list[tuple[str, str]]:
    rules = [(f"alert {n}", r["expr"]) for n, r in build.alert_rules().items()]
    dash = json.loads((OBS / "grafana/dashboards/sensevoice.json").read_text())
    return rules + [("dashboard", e) for e in build.dashboard_exprs(dash)]


def test_every_expression_names_known_metrics_and_their_labels():
    used = set()
    for where, expr in all_exprs():
        expr = expr.replace("$__rate_interval", "5m")
        metrics = build.metrics_in(expr)
        assert metrics, f"{where}: {expr} reads no sensevoice metric"
        unknown = metrics - set(build.METRIC_LABELS)
        assert not unknown, f"{where}: {sorted(unknown)} not in METRIC_LABELS"
        allowed = set().union(*(build.METRIC_LABELS[m] for m in metrics)) | build.TARGET_LABELS
        assert labels_in(expr) <= allowed, f"{where}: {expr} uses {labels_in(expr) - allowed}"
        used |= metrics
    assert used == set(build.METRIC_LABELS), f"listed and never read: {set(build.METRIC_LABELS) - used}"


def test_the_dashboard_has_the_panels_operators_need():
    dash = json.loads((OBS / "grafana/dashboards/sensevoice.json").read_text())
    panels = {p["title"]: p for p in dash["panels"] if p["type"] == "timeseries"}
    assert {"Throughput", "Audio seconds per second", "Job latency", "Queue depth", "Queue wait",
            "Workers alive", "GPU utilisation", "GPU memory used", "GPU temperature", "GPU power",
            "Live streams", "Errors by code", "Backlog of long recordings"} <= set(panels)
    latency = [t["expr"] for t in panels["Job latency"]["targets"]]
    assert [e.split(",")[0] for e in latency] == [f"histogram_quantile({q}" for q in (0.5, 0.95, 0.99)]
    assert all("by (lane, le)" in e for e in latency)
    temp = panels["GPU temperature"]["fieldConfig"]["defaults"]
    assert [s["value"] for s in temp["thresholds"]["steps"]] == [None, 83]
    assert temp["custom"]["thresholdsStyle"]["mode"] != "off"
    assert len({p["id"] for p in dash["panels"]}) == len(dash["panels"])
    assert all(p["datasource"]["uid"] == "${datasource}" for p in panels.values())


# ---------------------------------------------------------------------- k8s discovery, for real
def k8s_pods() -> list[dict]:
    docs = [d for p in sorted(K8S.glob("*.yaml")) if p.name != "kustomization.yaml"
            for d in yaml.safe_load_all(p.read_text()) if d]
    return [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]


def meta_labels(workload: dict, ip: str) -> dict[str, str]:
    """The __meta_kubernetes_pod_* labels Prometheus's pod discovery gives one of its pods."""
    tpl = workload["spec"]["template"]
    out = {"__meta_kubernetes_namespace": "sensevoice",
           "__meta_kubernetes_pod_name": workload["metadata"]["name"] + "-0"}
    for kind, values in (("label", tpl["metadata"].get("labels", {})),
                         ("annotation", tpl["metadata"].get("annotations", {}))):
        for k, v in values.items():
            out[f"__meta_kubernetes_pod_{kind}_" + re.sub(r"[^a-zA-Z0-9_]", "_", k)] = str(v)
    return out


def test_the_kubernetes_jobs_find_the_pods_of_the_manifests(tmp_path):
    """A real Prometheus with prometheus.k8s.yml's jobs, fed the pods of deploy/k8s/ (each
    workload's pod labels and annotations, its first container port on a made-up pod IP): the api
    pods go to sensevoice-api with the token, the workers to sensevoice-worker, at the port and
    path of their annotations; Redis is dropped."""
    doc = yaml.safe_load(_checkable(tmp_path, "prometheus.k8s.yml").read_text())
    targets, ips = [], {}
    for n, w in enumerate(k8s_pods()):
        ip = f"10.9.0.{n + 1}"
        ips[w["metadata"]["name"]] = ip
        port = w["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"]
        targets.append({"targets": [f"{ip}:{port}"], "labels": meta_labels(w, ip)})
    (tmp_path / "targets.json").write_text(json.dumps(targets))
    for job in doc["scrape_configs"]:
        job["scrape_interval"] = "1h"  # nothing listens there: the discovery is what is tested
    prom = PrometheusServer(tmp_path / "prom", doc).start()
    try:
        deadline = time.monotonic() + 30
        while True:
            data = prom.api("targets")
            if len(data["activeTargets"]) >= 2 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
    finally:
        prom.stop()
    active = {t["labels"]["job"]: t for t in data["activeTargets"]}
    assert set(active) == {"sensevoice-api", "sensevoice-worker"}, data
    api, worker = active["sensevoice-api"], active["sensevoice-worker"]
    assert api["scrapeUrl"] == f"http://{ips['sensevoice-api']}:7860/metrics"
    assert worker["scrapeUrl"] == f"http://{ips['sensevoice-worker']}:9000/metrics"
    assert api["labels"]["component"] == "api" and worker["labels"]["component"] == "worker"
    assert api["labels"]["namespace"] == "sensevoice" and api["labels"]["pod"] == "sensevoice-api-0"
    dropped = {t["discoveredLabels"]["__address__"].split(":")[0] for t in data["droppedTargets"]}
    assert ips["redis"] in dropped


# ---------------------------------------------------------------------- the compose profile
COMPOSE_FILES = {"compose.yaml": "prometheus.compose.yml", "compose.single.yaml": "prometheus.single.yml"}


def _service_of(target: str, doc: dict) -> tuple[str, int]:
    """The compose service a static target names (its service name, or a replica's container
    name <project>-<service>-<n>) and the target's port."""
    host, port = target.rsplit(":", 1)
    if host in doc["services"]:
        return host, int(port)
    m = re.fullmatch(re.escape(doc["name"]) + r"-(.+)-(\d+)", host)
    assert m and m.group(1) in doc["services"], f"{target} names no service of {doc['name']}"
    return m.group(1), int(port)


@pytest.mark.parametrize("compose_file", sorted(COMPOSE_FILES))
def test_the_compose_observability_profile_scrapes_what_runs(compose_file):
    from app_sensevoice import parse_args
    from pipeline.config import Settings
    from pipeline.web.edge import allowed_hosts, host_allowed
    from tests.test_deploy import interpolate

    doc = yaml.safe_load((ROOT / "deploy" / compose_file).read_text())
    config_name = COMPOSE_FILES[compose_file]
    prom, grafana = doc["services"]["prometheus"], doc["services"]["grafana"]
    assert prom["profiles"] == grafana["profiles"] == ["observability"]
    mounts = {v.split(":")[1]: v.split(":")[0] for s in (prom, grafana) for v in s["volumes"]}
    for target, source in mounts.items():
        if source.startswith("./"):
            assert (ROOT / "deploy" / source).exists(), source
    assert mounts["/etc/prometheus/prometheus.yml"] == f"./observability/{config_name}"
    config = yaml.safe_load((OBS / config_name).read_text())
    for rules in config["rule_files"]:  # relative to the configuration's directory
        assert mounts[f"/etc/prometheus/{rules}"] == f"./observability/{rules}"
    token_files = {j["authorization"]["credentials_file"] for j in config["scrape_configs"]
                   if "authorization" in j}
    assert token_files and all(f"> {f} &&" in " ".join(prom["entrypoint"]) for f in token_files)
    replicas = {}
    for job in config["scrape_configs"]:
        for target in job["static_configs"][0]["targets"]:
            name, port = _service_of(target, doc)
            replicas[name] = replicas.get(name, 0) + 1
            service = doc["services"][name]
            assert parse_args(service["command"]).port == port, target
            env = {k[len("SENSEVOICE_"):].lower(): interpolate(str(v))
                   for k, v in service["environment"].items() if k.startswith("SENSEVOICE_")}
            settings = Settings(**env)
            assert host_allowed(target.rsplit(":", 1)[0], allowed_hosts(settings)), \
                f"{name} would refuse Prometheus's Host {target}"
            assert job["static_configs"][0]["labels"]["component"] == settings.server.role
    for name, n in replicas.items():  # every replica is a target
        assert n == doc["services"][name].get("deploy", {}).get("replicas", 1), name
    # Grafana: the datasource is this Prometheus, the dashboard is the generated one
    provisioning = ROOT / "deploy" / mounts["/etc/grafana/provisioning"]
    (ds,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    assert ds["url"] == "http://prometheus:9090" and ds["type"] == "prometheus"
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "sensevoice.yml").read_text())["providers"]
    dashboards = ROOT / "deploy" / mounts[provider["options"]["path"]]
    assert (dashboards / "sensevoice.json").read_text() == build.generated()["grafana/dashboards/sensevoice.json"]
