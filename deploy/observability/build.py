"""The observability files of deploy/observability/, built as code: Prometheus's scrape
configurations (Kubernetes, and the two compose files) and the Grafana dashboard.

    python deploy/observability/build.py           # (re)writes the generated files
    python deploy/observability/build.py --check   # exit 1 if a checked-in file is not fresh

The alert rules (alerts.yml) and their unit tests (alerts.test.yml) are hand-written YAML:
``promtool test rules`` reads them as they are. ``METRIC_LABELS`` is the one list of the metrics
that the rules and the dashboard read, with the labels they read them by; tests/test_observability.py
checks that every expression names only these, and tests/test_observability_live.py that a real
Prometheus scraping a real server (both topologies) finds each one with those labels.

The dashboard is built with ``grafana-foundation-sdk`` (Grafana's own typed builders); the
scrape configurations are plain dictionaries dumped as YAML, so that a test can build the same
configuration for loopback targets (``static_config``).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
SCRAPE_INTERVAL = "15s"
RULE_FILES = ("alerts.yml",)
API_TOKEN_FILE = "/etc/prometheus/sensevoice/api-token"  # the api pods' token (a Secret's key)
GPU_TEMPERATURE_LIMIT_C = 83  # the alert's threshold, drawn on the temperature panel
COMPOSE_API_REPLICAS = 2  # deploy/compose.yaml's api replicas: each is a static target
# job name per role; the ``component`` label says the role as the k8s pods' label does
JOBS = {"api": "sensevoice-api", "worker": "sensevoice-worker", "all": "sensevoice"}

# Every metric the rules and the dashboard read, with the labels they group or select by (a
# histogram's series are named here by their family name + _bucket). Series on a GPU only are
# marked in GPU_ONLY: they come from NVML, which a CPU machine has not.
METRIC_LABELS: dict[str, frozenset[str]] = {k: frozenset(v) for k, v in {
    "sensevoice_request_success_total": {"lane"},
    "sensevoice_request_failure_total": {"lane", "code"},
    "sensevoice_request_rejected_total": {"reason"},
    "sensevoice_audio_seconds_total": {"lane"},
    "sensevoice_job_duration_seconds_bucket": {"lane", "le"},
    "sensevoice_queue_duration_seconds_bucket": {"lane", "le"},
    "sensevoice_queue_depth_lane": {"lane"},
    "sensevoice_workers_alive": set(),
    "sensevoice_broker_up": set(),
    "sensevoice_backlog_jobs": set(),
    "sensevoice_backlog_audio_seconds": set(),
    "sensevoice_http_requests_total": {"status"},
    "sensevoice_http_refusals_total": {"code", "status"},
    "sensevoice_live_streams": set(),
    "sensevoice_live_streams_admitted_total": set(),
    "sensevoice_live_streams_refused_total": {"code"},
    "sensevoice_event_loop_lag_seconds_bucket": {"le"},
    "sensevoice_gpu_utilization_ratio": {"device", "gpu_uuid"},
    "sensevoice_gpu_memory_used_bytes": {"device", "gpu_uuid"},
    "sensevoice_gpu_memory_free_bytes": {"device", "gpu_uuid"},
    "sensevoice_gpu_memory_total_bytes": {"device", "gpu_uuid"},
    "sensevoice_gpu_temperature_celsius": {"device", "gpu_uuid"},
    "sensevoice_gpu_power_watts": {"device", "gpu_uuid"},
}.items()}
GPU_ONLY = frozenset(m for m in METRIC_LABELS if m.startswith("sensevoice_gpu_"))
# labels Prometheus itself (and the scrape configuration) puts on every series
TARGET_LABELS = frozenset({"job", "instance", "component", "namespace", "pod"})
_METRIC_RE = re.compile(r"\bsensevoice_[a-z0-9_]+")


def metrics_in(expr: str) -> set[str]:
    """The sensevoice_* series an expression reads."""
    return set(_METRIC_RE.findall(expr))


# ---------------------------------------------------------------------- Prometheus
def _rule_files() -> list[str]:
    return list(RULE_FILES)


def static_config(targets: dict[str, list[str]], *, interval: str = SCRAPE_INTERVAL,
                  token_file: str | None = None, rule_dir: str = "") -> dict:
    """A Prometheus configuration scraping fixed ``host:port`` targets per role (``api``,
    ``worker``, ``all``): compose, and the tests' loopback servers. The api role's /metrics wants
    the API token when one is set: ``token_file`` holds it (an empty file: no token)."""
    jobs = []
    for role, hosts in targets.items():
        job = {"job_name": JOBS[role], "scrape_interval": interval, "metrics_path": "/metrics",
               "static_configs": [{"targets": list(hosts), "labels": {"component": role}}]}
        if token_file and role in ("api", "all"):
            job["authorization"] = {"type": "Bearer", "credentials_file": token_file}
        jobs.append(job)
    return {"global": {"scrape_interval": interval, "evaluation_interval": interval},
            "rule_files": [rule_dir + f for f in _rule_files()], "scrape_configs": jobs}


def kubernetes_config() -> dict:
    """Prometheus in the cluster: the SenseVoice pods found by their labels
    (app.kubernetes.io/name=sensevoice, app.kubernetes.io/component=api|worker, deploy/k8s/), at
    the port and path of their prometheus.io/* annotations; the api pods with the API token (mount
    the Secret's key at API_TOKEN_FILE). Not-ready pods are scraped too (a loading worker)."""

    def job(role: str) -> dict:
        out = {"job_name": JOBS[role], "scrape_interval": SCRAPE_INTERVAL,
               "kubernetes_sd_configs": [{"role": "pod"}],
               "relabel_configs": [
                   {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_name",
                                      "__meta_kubernetes_pod_label_app_kubernetes_io_component",
                                      "__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                    "regex": f"sensevoice;{role};true", "action": "keep"},
                   {"source_labels": ["__address__",
                                      "__meta_kubernetes_pod_annotation_prometheus_io_port"],
                    "regex": r"([^:]+)(?::\d+)?;(\d+)", "replacement": "$1:$2",
                    "target_label": "__address__"},
                   {"source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                    "regex": "(.+)", "target_label": "__metrics_path__"},
                   {"source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                    "target_label": "component"},
                   {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
                   {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
               ]}
        if role == "api":
            out["authorization"] = {"type": "Bearer", "credentials_file": API_TOKEN_FILE}
        return out

    return {"global": {"scrape_interval": SCRAPE_INTERVAL, "evaluation_interval": SCRAPE_INTERVAL},
            "rule_files": _rule_files(), "scrape_configs": [job("api"), job("worker")]}


def compose_config() -> dict:
    """deploy/compose.yaml (profile observability): the api replicas by their container names
    (``sensevoice-api-N``: the same Host each one answers, SENSEVOICE_ALLOWED_HOSTS) and the
    worker by its service name."""
    apis = [f"sensevoice-api-{n}:7860" for n in range(1, COMPOSE_API_REPLICAS + 1)]
    return static_config({"api": apis, "worker": ["worker:9000"]},
                         token_file="/prometheus/api-token")


def compose_single_config() -> dict:
    """deploy/compose.single.yaml (profile observability): the one embedded process."""
    return static_config({"all": ["sensevoice:7860"]}, token_file="/prometheus/api-token")


# ---------------------------------------------------------------------- Grafana
@dataclass(frozen=True)
class Query:
    expr: str
    legend: str


@dataclass(frozen=True)
class PanelSpec:
    title: str
    unit: str
    queries: tuple[Query, ...]
    description: str = ""
    threshold: float | None = None  # drawn as a dashed red line
    width: int = 12


RATE = "[$__rate_interval]"


def _quantiles(metric: str, by: str, what: str) -> tuple[Query, ...]:
    return tuple(Query(f"histogram_quantile({q}, sum by ({by}, le) (rate({metric}{RATE})))",
                       f"p{int(q * 100)} {{{{{by}}}}}") for q in (0.5, 0.95, 0.99))


ROWS: tuple[tuple[str, tuple[PanelSpec, ...]], ...] = (
    ("Traffic", (
        PanelSpec("Throughput", "reqps", (
            Query(f"sum by (lane) (rate(sensevoice_request_success_total{RATE}))", "done {{lane}}"),
            Query(f"sum by (lane) (rate(sensevoice_request_failure_total{RATE}))", "failed {{lane}}"),
        ), "Jobs finished per second, by lane."),
        PanelSpec("Audio seconds per second", "s", (
            Query(f"sum by (lane) (rate(sensevoice_audio_seconds_total{RATE}))", "{{lane}}"),
        ), "Seconds of audio transcribed per second of wall time, by lane."),
        PanelSpec("Job latency", "s", _quantiles("sensevoice_job_duration_seconds_bucket", "lane", ""),
                  "From a job's entry into the queue to its result stored: p50, p95, p99 per lane.",
                  width=24),
    )),
    ("Queue and workers", (
        PanelSpec("Queue depth", "short", (
            Query("max by (lane) (sensevoice_queue_depth_lane)", "{{lane}}"),
        ), "Items waiting, by lane (cluster-wide: every process reports the same count)."),
        PanelSpec("Queue wait", "s", _quantiles("sensevoice_queue_duration_seconds_bucket", "lane", ""),
                  "Time from queue entry to the batch start, by lane."),
        PanelSpec("Workers alive", "short", (
            Query("max(sensevoice_workers_alive)", "workers"),
            Query("min(sensevoice_broker_up)", "broker up"),
        ), "Worker processes (threads, embedded) that claimed work recently; broker up = 1."),
        PanelSpec("Backlog of long recordings", "short", (
            Query("sum(sensevoice_backlog_jobs)", "jobs"),
            Query("sum(sensevoice_backlog_audio_seconds) / 3600", "audio hours"),
        ), "Long recordings accepted and not yet finished (splitting or running)."),
    )),
    ("GPU", (
        PanelSpec("GPU utilisation", "percentunit", (
            Query("sensevoice_gpu_utilization_ratio", "{{instance}} {{device}}"),
        )),
        PanelSpec("GPU memory used", "percentunit", (
            Query("sensevoice_gpu_memory_used_bytes / sensevoice_gpu_memory_total_bytes",
                  "{{instance}} {{device}}"),
        ), "Admission refuses new jobs while less than 15 % is free."),
        PanelSpec("GPU temperature", "celsius", (
            Query("sensevoice_gpu_temperature_celsius", "{{instance}} {{device}}"),
        ), f"The alert fires at {GPU_TEMPERATURE_LIMIT_C} °C held for 2 min.",
            threshold=GPU_TEMPERATURE_LIMIT_C),
        PanelSpec("GPU power", "watt", (
            Query("sensevoice_gpu_power_watts", "{{instance}} {{device}}"),
        )),
    )),
    ("Live captions and errors", (
        PanelSpec("Live streams", "short", (
            Query("sum(sensevoice_live_streams)", "open"),
            Query(f"sum(rate(sensevoice_live_streams_admitted_total{RATE})) * 60", "admitted / min"),
            Query(f"sum by (code) (rate(sensevoice_live_streams_refused_total{RATE})) * 60",
                  "refused / min {{code}}"),
        ), "Streams open, admitted and refused (too_many_streams, not_ready) per minute."),
        PanelSpec("Errors by code", "reqps", (
            Query(f"sum by (code) (rate(sensevoice_http_refusals_total{{status=~\"5..\"}}{RATE}))",
                  "HTTP 5xx {{code}}"),
            Query(f"sum by (code) (rate(sensevoice_http_refusals_total{{status=~\"4..\"}}{RATE}))",
                  "HTTP 4xx {{code}}"),
            Query(f"sum by (code) (rate(sensevoice_request_failure_total{RATE}))", "job failed {{code}}"),
            Query(f"sum by (reason) (rate(sensevoice_request_rejected_total{RATE}))",
                  "refused {{reason}}"),
        ), "HTTP error answers by the code of their body, failed jobs and refused submissions."),
        PanelSpec("Event loop lag", "s", (
            Query("histogram_quantile(0.99, sum by (instance, le) "
                  f"(rate(sensevoice_event_loop_lag_seconds_bucket{RATE})))", "p99 {{instance}}"),
        ), "How late the once-a-second heartbeat of each process's event loop wakes."),
        PanelSpec("5xx ratio", "percentunit", (
            Query(f"sum(rate(sensevoice_http_requests_total{{status=~\"5..\"}}{RATE})) / "
                  f"sum(rate(sensevoice_http_requests_total{RATE}))", "5xx / all"),
        )),
    )),
)


def panels() -> list[PanelSpec]:
    return [p for _, row in ROWS for p in row]


def dashboard() -> dict:
    """The dashboard as Grafana's JSON model, built with grafana-foundation-sdk."""
    from grafana_foundation_sdk.builders import common as cb
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.builders import prometheus, timeseries
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common
    from grafana_foundation_sdk.models.dashboard import (DataSourceRef, Threshold,
                                                         ThresholdsMode)

    ds = DataSourceRef(type_val="prometheus", uid="${datasource}")
    board = (db.Dashboard("SenseVoice").uid("sensevoice").tags(["sensevoice"])
             .description("Throughput, latency, queue, workers, GPU, live captions and errors of "
                          "SenseVoice (deploy/observability/build.py; do not edit the JSON)")
             .refresh("30s").time("now-3h", "now").timezone("browser")
             .with_variable(db.DatasourceVariable("datasource").label("Prometheus")
                            .type("prometheus")))
    ids = iter(range(1, 1000))
    for row_title, specs in ROWS:
        board = board.with_row(db.Row(row_title).id(next(ids)))
        for spec in specs:
            panel = (timeseries.Panel().id(next(ids)).title(spec.title).description(spec.description)
                     .datasource(ds).unit(spec.unit).span(spec.width).height(8)
                     .legend(cb.VizLegendOptions().display_mode(common.LegendDisplayMode.LIST)
                             .placement(common.LegendPlacement.BOTTOM).show_legend(True)))
            for n, q in enumerate(spec.queries):
                panel = panel.with_target(prometheus.Dataquery().expr(q.expr)
                                          .legend_format(q.legend).ref_id("ABCDEFGH"[n]))
            if spec.threshold is not None:
                panel = (panel.thresholds(db.ThresholdsConfig().mode(ThresholdsMode.ABSOLUTE).steps(
                    [Threshold(value=None, color="green"), Threshold(value=spec.threshold, color="red")]))
                    .thresholds_style(cb.GraphThresholdsStyleConfig()
                                      .mode(common.GraphThresholdsStyleMode.DASHED)))
            board = board.with_panel(panel)
    return json.loads(json.dumps(board.build(), cls=JSONEncoder))


def dashboard_exprs(doc: dict) -> list[str]:
    """Every query expression of a dashboard JSON."""
    return [t["expr"] for p in doc.get("panels", []) for t in p.get("targets", []) if "expr" in t]


# ---------------------------------------------------------------------- alert unit tests
Labels = dict[str, str]


@dataclass(frozen=True)
class AlertCase:
    """One ``promtool test rules`` group: input series (one sample a minute), then, at each
    evaluation time, the alerts of ``alert`` that fire: (their labels beside alertname and
    severity, their summary). An empty tuple: none fires."""
    alert: str
    series: tuple[tuple[str, str], ...]
    expect: tuple[tuple[str, tuple[tuple[Labels, str], ...]], ...]


def _sel(labels: Labels) -> str:
    return ",".join(f'{k}="{v}"' for k, v in labels.items())


def _hist(name: str, labels: Labels, per_min: dict[str, int]) -> tuple[tuple[str, str], ...]:
    """The bucket series of a histogram that gets ``per_min[le]`` observations at or under each
    ``le`` every minute (cumulative, as Prometheus stores them)."""
    return tuple((f'{name}_bucket{{{_sel({**labels, "le": le})}}}', f"0+{n}x30")
                 for le, n in per_min.items())


W1 = {"job": "sensevoice-worker", "instance": "w1:9000", "device": "cuda:0", "gpu_uuid": "GPU-a"}
W2 = {**W1, "instance": "w2:9000", "gpu_uuid": "GPU-b"}
W3 = {**W1, "instance": "w3:9000", "gpu_uuid": "GPU-c"}
A1 = {"job": "sensevoice-api", "instance": "a1:7860"}
A2 = {**A1, "instance": "a2:7860"}
TEMP, FREE, TOTAL = ("sensevoice_gpu_temperature_celsius", "sensevoice_gpu_memory_free_bytes",
                     "sensevoice_gpu_memory_total_bytes")
DEPTH, ALIVE, UP = "sensevoice_queue_depth_lane", "sensevoice_workers_alive", "sensevoice_broker_up"
QWAIT, LAG = "sensevoice_queue_duration_seconds", "sensevoice_event_loop_lag_seconds"
REFUSED, HTTP = "sensevoice_live_streams_refused_total", "sensevoice_http_requests_total"
OK, FAILED = "sensevoice_request_success_total", "sensevoice_request_failure_total"

ALERT_CASES: tuple[AlertCase, ...] = (
    AlertCase("SenseVoiceGpuHot", (
        (f"{TEMP}{{{_sel(W1)}}}", "85x10"),  # hot, held
        (f"{TEMP}{{{_sel(W2)}}}", "82x10"),  # just under the limit
        (f"{TEMP}{{{_sel(W3)}}}", "70 90 70x8"),  # a one-minute spike
    ), (("1m", ()),  # over the limit for less than 2 minutes
        ("5m", ((W1, "GPU cuda:0 on w1:9000 at 85 °C"),)))),
    AlertCase("SenseVoiceGpuMemoryLow", (
        (f"{FREE}{{{_sel(W1)}}}", "10x10"), (f"{TOTAL}{{{_sel(W1)}}}", "100x10"),  # 10 % free
        (f"{FREE}{{{_sel(W2)}}}", "20x10"), (f"{TOTAL}{{{_sel(W2)}}}", "100x10"),  # 20 % free
        (f"{FREE}{{{_sel(W3)}}}", "500 10 500x8"), (f"{TOTAL}{{{_sel(W3)}}}", "1000x10"),  # a dip
    ), (("1m", ()),
        ("5m", ((W1, "GPU cuda:0 on w1:9000: 10% memory free"),)))),
    AlertCase("SenseVoiceNoWorker", (
        (f'{DEPTH}{{{_sel(A1)},lane="bulk"}}', "0 0 5x10"),
        (f'{DEPTH}{{{_sel(A2)},lane="bulk"}}', "0 0 5x10"),  # every process reports the cluster's
        (f'{DEPTH}{{{_sel(A1)},lane="interactive"}}', "0x12"),  # nothing waits here
        (f"{ALIVE}{{{_sel(A1)}}}", "1 1 0x10"), (f"{ALIVE}{{{_sel(A2)}}}", "1 1 0x10"),
    ), (("2m", ()),  # queued and no worker, for less than a minute
        ("5m", (({"lane": "bulk"}, "5 items wait in lane bulk and no worker is alive"),)))),
    AlertCase("SenseVoiceNoWorker", (  # queued work with a live worker is just work
        (f'{DEPTH}{{{_sel(A1)},lane="bulk"}}', "50x10"), (f"{ALIVE}{{{_sel(A1)}}}", "1x10"),
    ), (("5m", ()),)),
    AlertCase("SenseVoiceBrokerUnavailable", (
        (f"{UP}{{{_sel(A1)}}}", "1 0x10"),  # down from the first minute
        (f"{UP}{{{_sel(A2)}}}", "1 0 1x9"),  # a blip
    ), (("1m", ()),
        ("5m", ((A1, "a1:7860 cannot reach the broker (Redis)"),)))),
    AlertCase("SenseVoiceQueueWaitSlow", (
        # interactive: every wait in (2.5, 5] s (objective 2 s); bulk: every wait in (10, 30] s
        # (objective 60 s)
        *_hist(QWAIT, {"lane": "interactive"}, {"1.0": 0, "2.5": 0, "5.0": 10, "+Inf": 10}),
        *_hist(QWAIT, {"lane": "bulk"}, {"10.0": 0, "30.0": 10, "60.0": 10, "+Inf": 10}),
    ), (("8m", ()),  # slow for less than 10 minutes
        ("15m", (({"lane": "interactive"}, "p95 queue wait of lane interactive is 4.875s"),)))),
    AlertCase("SenseVoiceQueueWaitSlow", (  # bulk over its objective too
        *_hist(QWAIT, {"lane": "bulk"}, {"30.0": 0, "60.0": 0, "120.0": 10, "+Inf": 10}),
    ), (("15m", (({"lane": "bulk"}, "p95 queue wait of lane bulk is 1m 57s"),)),)),
    AlertCase("SenseVoiceLiveStreamsRefused", (
        (f'{REFUSED}{{{_sel(A1)},code="too_many_streams"}}', "0+1x20"),  # refusing, all along
        (f'{REFUSED}{{{_sel(A1)},code="not_ready"}}', "0 1x20"),  # one refusal, then none
    ), (("3m", ()),
        ("10m", (({"code": "too_many_streams"}, "Live caption streams refused (too_many_streams)"),)))),
    AlertCase("SenseVoiceHttp5xx", (
        (f'{HTTP}{{{_sel(A1)},status="200"}}', "0+100x20"),
        (f'{HTTP}{{{_sel(A1)},status="503"}}', "0+10x20"),  # 10 of 110: 9 %
    ), (("3m", ()),
        ("10m", (({}, "9.091% of HTTP answers are 5xx"),)))),
    AlertCase("SenseVoiceHttp5xx", (
        (f'{HTTP}{{{_sel(A1)},status="200"}}', "0+100x20"),
        (f'{HTTP}{{{_sel(A2)},status="500"}}', "0+2x20"),  # 2 of 102: under 5 %
    ), (("10m", ()),)),
    AlertCase("SenseVoiceJobFailures", (
        (f'{OK}{{{_sel(W1)},lane="bulk"}}', "0+90x30"),
        (f'{FAILED}{{{_sel(W1)},lane="bulk",code="out_of_memory"}}', "0+10x30"),  # 10 %
        (f'{OK}{{{_sel(W1)},lane="interactive"}}', "0+100x30"),
        (f'{FAILED}{{{_sel(W1)},lane="interactive",code="queue_timeout"}}', "0+1x30"),  # 1 %
    ), (("5m", ()),
        ("20m", (({"lane": "bulk"}, "10% of accepted jobs in lane bulk fail"),)))),
    AlertCase("SenseVoiceEventLoopStalled", (
        # a1: every beat 0.5-1 s late; a2: every beat within 5 ms
        *_hist(LAG, A1, {"0.005": 0, "0.5": 0, "1.0": 60, "+Inf": 60}),
        *_hist(LAG, A2, {"0.005": 60, "0.5": 60, "1.0": 60, "+Inf": 60}),
    ), (("3m", ()),
        ("10m", (({"instance": "a1:7860"}, "The event loop of a1:7860 wakes 995ms late (p99)"),)))),
)


def alert_rules() -> dict[str, dict]:
    """alerts.yml's rules by name."""
    doc = yaml.safe_load((HERE / "alerts.yml").read_text())
    return {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}


def alert_tests() -> dict:
    """alerts.test.yml: ALERT_CASES for promtool; the expected annotations are the rule's own,
    with the summary written out (so the summary's template is tested)."""
    rules, tests = alert_rules(), []
    for case in ALERT_CASES:
        rule = rules[case.alert]
        static = {k: v for k, v in rule["annotations"].items() if k != "summary"}
        tests.append({"interval": "1m",
                      "input_series": [{"series": s, "values": v} for s, v in case.series],
                      "alert_rule_test": [
                          {"eval_time": at, "alertname": case.alert,
                           "exp_alerts": [{"exp_labels": {**labels, **rule["labels"]},
                                           "exp_annotations": {**static, "summary": summary}}
                                          for labels, summary in fired]}
                          for at, fired in case.expect]})
    return {"rule_files": ["alerts.yml"], "evaluation_interval": "1m", "tests": tests}


# ---------------------------------------------------------------------- files
HEADER = "# Generated by deploy/observability/build.py: edit that, then run it.\n"


def _yaml(doc: dict) -> str:
    return HEADER + yaml.safe_dump(doc, sort_keys=False, width=100, allow_unicode=True)


def generated() -> dict[str, str]:
    """File name (under deploy/observability/) -> its content."""
    return {
        "prometheus.k8s.yml": _yaml(kubernetes_config()),
        "prometheus.compose.yml": _yaml(compose_config()),
        "prometheus.single.yml": _yaml(compose_single_config()),
        "alerts.test.yml": _yaml(alert_tests()),
        "grafana/dashboards/sensevoice.json": json.dumps(dashboard(), indent=2, sort_keys=True) + "\n",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args(argv)
    stale = []
    for name, text in generated().items():
        path = HERE / name
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    for name in stale:
        print(f"{name} is not what build.py generates: run python deploy/observability/build.py",
              file=sys.stderr)
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
