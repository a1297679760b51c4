"""The deployment files under deploy/ (docker compose, Kubernetes, nginx), checked offline:

* every YAML file parses;
* every Kubernetes manifest validates against the official API schemas (kubernetes-validate bundles
  them, strict: an unknown field is an error), for the oldest and the newest Kubernetes we target;
* compose.yaml and compose.single.yaml validate against the Compose Specification's JSON schema
  (the copy that check-jsonschema vendors) with jsonschema;
* the Dockerfile runs as a non-root user that owns the image's volumes, and .dockerignore keeps
  local state (.venv, .git, data) out of the build context (docker itself is not needed: text);
* the files agree with the code and with each other: every SENSEVOICE_* name is a Settings field
  and every value is one Settings accepts, the container arguments parse with the app's own CLI,
  the probe and scrape paths are routes of the app and answer the Host the kubelet and Prometheus
  send, ports, Service selectors, Ingress backends, Secret keys and the broker URL resolve.

Nothing here skips: a missing validator package fails the test (requirements-dev.txt pins them).
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.redis_server import redis_server, redis_url  # noqa: F401  (fixtures: a real redis-server)

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
COMPOSE_SINGLE = DEPLOY / "compose.single.yaml"  # the embedded topology, one service
COMPOSE_FILES = [COMPOSE, COMPOSE_SINGLE]
DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
NGINX = DEPLOY / "nginx" / "nginx.conf"

PINS = {"kubernetes_validate": "kubernetes-validate==1.37.0",
        "check_jsonschema": "check-jsonschema==0.39.0", "jsonschema": "jsonschema==4.26.0"}
# Kubernetes versions the manifests must be valid for: the oldest we support and the newest that
# the pinned kubernetes-validate bundles (1.25 ... 1.37 for 1.37.0)
K8S_MIN_VERSION = "1.29"
# manifests kept beside kustomization.yaml that it does not apply, on purpose
NOT_APPLIED = {"secret.example.yaml", "model-cache-pvc.yaml"}
# environment variables that are not SenseVoice settings but are set on purpose
OTHER_ENV = {"FORWARDED_ALLOW_IPS", "POD_IP"}
PROBE_PATHS = {"readinessProbe": "/readyz", "livenessProbe": "/healthz"}
POD_IP = "10.1.2.3"  # stands for $(POD_IP) when values are checked


def need(module: str):
    """Import a validator or fail (never skip): CI must not pass by validating nothing."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.fail(f"{module} is not installed ({e}); pip install {PINS[module]} "
                    "(requirements-dev.txt). These checks never skip.")


def load_all(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def manifests(applied_only: bool = False) -> list[dict]:
    docs = []
    for path in manifest_files():
        if applied_only and path.name in NOT_APPLIED:
            continue
        docs += load_all(path)
    return docs


def by_kind(kind: str, docs=None) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in (docs or manifests()) if d["kind"] == kind}


def workloads() -> dict[str, dict]:
    return {**by_kind("Deployment"), **by_kind("StatefulSet")}


def containers():
    for name, w in workloads().items():
        for c in w["spec"]["template"]["spec"]["containers"]:
            yield name, w, c


def compose(path: Path = COMPOSE) -> dict:
    return yaml.safe_load(path.read_text())


OBSERVABILITY = "observability"  # the compose profile of Prometheus and Grafana (off by default)


def app_services(path: Path = COMPOSE) -> dict[str, dict]:
    """The services `docker compose up` starts without a profile (SenseVoice and its helpers)."""
    return {n: s for n, s in compose(path)["services"].items() if OBSERVABILITY not in s.get("profiles", [])}


def interpolate(value: str) -> str:
    """Compose's ${VAR:-default} / ${VAR} with the variables unset: what `up` gets by default."""
    return re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*(?::?-([^}]*))?\}", lambda m: m.group(1) or "", value)


def settings_fields() -> set[str]:
    from pipeline.config import GROUP_OF

    return set(GROUP_OF)


def settings_from_env(env: dict[str, str]):
    """Settings built from these SENSEVOICE_* values: raises if one is not a valid value."""
    from pipeline.config import Settings

    return Settings(**{k[len("SENSEVOICE_"):].lower(): v for k, v in env.items()
                       if k.startswith("SENSEVOICE_")})


def example_secret() -> dict[str, str]:
    (secret,) = load_all(K8S / "secret.example.yaml")
    return secret["stringData"]


def container_env(c: dict) -> dict[str, str]:
    """A container's environment as the kubelet builds it: envFrom ConfigMaps first, then env
    (values from the example Secret, $(VAR) expanded, the pod IP stood in for)."""
    configmaps = by_kind("ConfigMap")
    env: dict[str, str] = {}
    for source in c.get("envFrom", []):
        env.update(configmaps[source["configMapRef"]["name"]]["data"])
    for var in c.get("env", []):
        if "value" in var:
            value = re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)),
                           var["value"])
        elif "secretKeyRef" in var["valueFrom"]:
            value = example_secret()[var["valueFrom"]["secretKeyRef"]["key"]]
        elif var["valueFrom"].get("fieldRef", {}).get("fieldPath") == "status.podIP":
            value = POD_IP
        else:
            raise AssertionError(f"unexpected env source {var}")
        env[var["name"]] = value
    return env


def cli_port(args: list[str]) -> int:
    from app_sensevoice import parse_args

    try:
        parsed = parse_args(args)
    except SystemExit:  # argparse: an unknown flag or a bad value
        pytest.fail(f"the app's CLI refuses {args}")
    assert parsed.port is not None, f"{args}: pass --port explicitly (the probes depend on it)"
    return parsed.port


def pod_labels(workload: dict) -> dict:
    return workload["spec"]["template"]["metadata"]["labels"]


def matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# ------------------------------------------------------------------------------------- parsing
def test_every_yaml_file_parses():
    files = sorted(DEPLOY.rglob("*.yaml")) + sorted(DEPLOY.rglob("*.yml"))
    names = {p.relative_to(DEPLOY).as_posix() for p in files}
    assert {"compose.yaml", "compose.single.yaml", "k8s/kustomization.yaml", "k8s/api.yaml", "k8s/worker.yaml",
            "k8s/redis.yaml", "k8s/ingress.yaml", "k8s/configmap.yaml"} <= names
    for path in files:
        docs = load_all(path)
        assert docs and all(isinstance(d, dict) for d in docs), path


def test_kustomization_applies_every_manifest_but_the_examples():
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kust["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and kust["kind"] == "Kustomization"
    assert "namespace" not in kust  # namespace-less: chosen with kubectl -n
    resources = kust["resources"]
    assert len(resources) == len(set(resources))
    for name in resources:
        assert (K8S / name).is_file(), f"kustomization.yaml lists a missing file {name}"
    files = {p.name for p in manifest_files()}
    assert set(resources) | NOT_APPLIED == files and not set(resources) & NOT_APPLIED
    images = {i["name"] for i in kust["images"]}
    assert {c["image"].split(":")[0] for _, _, c in containers() if "redis" not in c["image"]} <= images


# ------------------------------------------------------------------------ schema validation
def k8s_versions() -> list[str]:
    kv = need("kubernetes_validate")
    return [K8S_MIN_VERSION, kv.latest_version()]


@pytest.mark.parametrize("which", ["oldest", "newest"])
def test_kubernetes_manifests_validate_against_the_api_schemas(which):
    kv = need("kubernetes_validate")
    version = k8s_versions()[0 if which == "oldest" else 1]
    assert any(v == version or v.startswith(version + ".") for v in kv.utils.all_versions()), \
        f"kubernetes-validate {kv.__version__} bundles no Kubernetes {version} schemas"
    docs = manifests()
    assert len(docs) >= 12
    errors = []
    for doc in docs:
        name = f"{doc.get('kind')}/{doc.get('metadata', {}).get('name')}"
        if doc.get("apiVersion", "").split("/")[0] in CRD_SCHEMAS:  # not Kubernetes' own: below
            continue
        try:
            kv.validate(doc, version, strict=True)
        except kv.ValidationError as e:
            errors.append(f"{name}: {'.'.join(map(str, e.path))}: {e.message}")
        except kv.SchemaNotFoundError as e:  # an unknown kind or apiVersion is an error too
            errors.append(f"{name}: {e.message}")
    assert not errors, f"Kubernetes {version}:\n" + "\n".join(errors)


# ------------------------------------------------------------------ KEDA (a custom resource)
# API groups of custom resources -> the vendored openAPI schema of their CRD (kubernetes-validate
# knows only Kubernetes' own kinds)
CRD_SCHEMAS = {"keda.sh": ROOT / "tests" / "schemas" / "keda-scaledobject.json"}


def strict(schema: dict) -> dict:
    """A CRD's structural schema as the API server applies it with strict field validation
    (kubectl --validate=strict): an object with declared properties takes no others, unless it
    says it keeps unknown fields. ``metadata`` is the ObjectMeta, which the CRD leaves open."""
    schema = json.loads(json.dumps(schema))

    def walk(node: dict, path: str) -> None:
        if not isinstance(node, dict):
            return
        props = node.get("properties")
        if props and "additionalProperties" not in node and \
                not node.get("x-kubernetes-preserve-unknown-fields") and path != "metadata":
            node["additionalProperties"] = False
        for key, child in (props or {}).items():
            walk(child, key if not path else f"{path}.{key}")
        for key in ("items", "additionalProperties"):
            if isinstance(node.get(key), dict):
                walk(node[key], path)

    walk(schema, "")
    return schema


def crd_validator(group: str):
    jsonschema = need("jsonschema")
    schema = json.loads(CRD_SCHEMAS[group].read_text())
    assert "kedacore/keda" in schema["$comment"] and schema["x-source"]["tag"].startswith("v2.")
    cls = jsonschema.validators.Draft7Validator
    cls.check_schema(schema)
    return cls(strict(schema))


def scaled_object() -> dict:
    (so,) = [d for d in manifests() if d["kind"] == "ScaledObject"]
    return so


def test_the_worker_scaledobject_validates_against_kedas_crd_schema():
    so = scaled_object()
    assert so["apiVersion"] == "keda.sh/v1alpha1"
    assert "worker-autoscaler.yaml" in yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in crd_validator("keda.sh").iter_errors(so)]
    assert not errors, "\n".join(errors)
    for bad in ({**so, "spec": {**so["spec"], "minReplicas": 1}},  # the HPA's spelling
                {**so, "spec": {**so["spec"], "minReplicaCount": "1"}},
                {**so, "spec": {k: v for k, v in so["spec"].items() if k != "scaleTargetRef"}},
                {**so, "spec": {**so["spec"], "triggers": [{"metadata": {"stream": "x"}}]}}):
        assert list(crd_validator("keda.sh").iter_errors(bad)), bad["spec"]


def test_the_workers_scale_on_the_lag_of_the_job_lanes_with_a_floor_of_one():
    from urllib.parse import urlsplit

    from pipeline.domain.types import Lane
    from pipeline.serving.broker_redis import GROUP

    so = scaled_object()
    spec = so["spec"]
    target = spec["scaleTargetRef"]
    assert (target.get("kind", "Deployment"), target["name"]) == ("Deployment", "sensevoice-worker")
    assert target["name"] in by_kind("Deployment")
    assert spec["minReplicaCount"] == 1 and spec["maxReplicaCount"] >= 1
    assert "idleReplicaCount" not in spec  # never to zero: the first job would wait for a load
    broker = urlsplit(by_kind("ConfigMap")["sensevoice-config"]["data"]["SENSEVOICE_BROKER"])
    streams = set()
    for trigger in spec["triggers"]:
        meta = trigger["metadata"]
        assert trigger["type"] == "redis-streams"
        assert meta["consumerGroup"] == GROUP and int(meta["lagCount"]) > 0
        host, port = meta["address"].rsplit(":", 1)
        # the broker's Service, by its full name (KEDA's operator resolves it from its namespace)
        assert host.split(".")[0] == broker.hostname and host.endswith(".svc.cluster.local")
        assert int(port) == (broker.port or 6379) and meta["databaseIndex"] == broker.path.strip("/")
        streams.add(meta["stream"])
    assert streams == {f"sv:queue:{lane.name.lower()}" for lane in Lane}  # every job lane
    # the api keeps its CPU autoscaler; the worker has no HPA of its own (KEDA makes one)
    hpas = by_kind("HorizontalPodAutoscaler")
    assert [h["spec"]["scaleTargetRef"]["name"] for h in hpas.values()] == ["sensevoice-api"]
    # XINFO GROUPS reports the lag from Redis 7 on
    (redis_image,) = [c["image"] for _, _, c in containers() if c["image"].startswith("redis:")]
    assert int(redis_image.split(":")[1].split(".")[0]) >= 7
    # KEDA's operator may reach Redis
    policy = by_kind("NetworkPolicy")["redis"]["spec"]["ingress"][0]["from"]
    assert any(p.get("podSelector", {}).get("matchLabels") == {"app": "keda-operator"} for p in policy)


def test_the_lag_keda_reads_counts_the_unclaimed_items(redis_url):  # noqa: F811
    """On a real Redis 7 with the real broker: XINFO GROUPS' lag (what KEDA's redis-streams
    scaler reads with lagCount) of each lane's stream is the items no worker has claimed, and it
    stays a number after finished jobs' entries are deleted (XACK + XDEL)."""
    import time
    import uuid

    import redis
    import torch

    from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions, Transcript
    from pipeline.serving.broker_redis import GROUP, RedisBroker
    from pipeline.serving.scheduler import WorkItem

    streams = {t["metadata"]["stream"]: t for t in scaled_object()["spec"]["triggers"]}
    broker = RedisBroker(redis_url, retention_s=60, queue_size=100)
    admin = redis.Redis.from_url(redis_url)

    def lag(stream: str):
        """As KEDA v2.20's redis-streams scaler reads it (lagCount): the group's lag; XLEN while
        no worker has created the group yet."""
        groups = [g for g in admin.xinfo_groups(stream) if g["name"].decode() == GROUP]
        return groups[0]["lag"] if groups else admin.xlen(stream)

    try:
        for lane in [Lane.BULK] * 5 + [Lane.INTERACTIVE] * 2:
            job = Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), lane, time.time(), 0.1)
            broker.create(job, b"upload")
            broker.enqueue(WorkItem(job.id, lane, job.options, 1600, audio=torch.zeros(1600)))
        assert set(streams) <= {s.decode() for s in admin.scan_iter("sv:queue:*")}
        assert (lag("sv:queue:bulk"), lag("sv:queue:interactive")) == (5, 2)
        claimed = broker.claim("w1", 3)  # (the first claim creates the group)
        assert len(claimed) == 3 and all(lag(s) is not None for s in streams)
        assert lag("sv:queue:bulk") + lag("sv:queue:interactive") == 4
        broker.mark_running([i.job_id for i in claimed])
        assert broker.finish_many([(i.job_id, Transcript("hi", "hi")) for i in claimed])
        assert (lag("sv:queue:bulk"), lag("sv:queue:interactive")) == (4, 0)
        for item in broker.claim("w1", 10):
            broker.mark_running([item.job_id])
            broker.fail(item.job_id, "internal_error", "test")
        assert (lag("sv:queue:bulk"), lag("sv:queue:interactive")) == (0, 0)
    finally:
        broker.close()


def test_kubernetes_validation_catches_mistakes():
    """The validator is not vacuous: a misspelt field, a wrong type, an unknown kind fail."""
    kv = need("kubernetes_validate")
    version = kv.latest_version()
    deployment = by_kind("Deployment")["sensevoice-api"]
    typo = json.loads(json.dumps(deployment))
    typo["spec"]["replica"] = 2
    wrong_type = json.loads(json.dumps(deployment))
    wrong_type["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    for bad in (typo, wrong_type):
        with pytest.raises(kv.ValidationError):
            kv.validate(bad, version, strict=True)
    with pytest.raises(kv.SchemaNotFoundError):
        kv.validate({**deployment, "apiVersion": "apps/v1", "kind": "Deploymint"}, version, strict=True)


def compose_validator():
    jsonschema = need("jsonschema")
    need("check_jsonschema")
    from importlib.resources import files

    schema = json.loads((files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json").read_text())
    assert schema.get("title") == "Compose Specification"
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_compose_file_validates_against_the_compose_specification(path):
    validator = compose_validator()
    errors = [f"{'.'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(compose(path))]
    assert not errors, "\n".join(errors)


def test_compose_validation_catches_mistakes():
    validator = compose_validator()
    for path, value in ((("services", "api", "replica"), 2),
                        (("services", "worker", "deploy", "resources", "reservations", "gpus"), 1),
                        (("services", "redis", "healthcheck", "intervall"), "5s")):
        doc = compose()
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        assert list(validator.iter_errors(doc)), f"{'.'.join(path)} was accepted"
    for path, value in ((("services", "sensevoice", "ports"), 7860),
                        (("services", "sensevoice", "healthcheck", "start_periods"), "15m")):
        doc = compose(COMPOSE_SINGLE)
        node = doc
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = value
        assert list(validator.iter_errors(doc)), f"compose.single.yaml: {'.'.join(path)} was accepted"


# ----------------------------------------------------------------------- agreement with the code
def test_every_sensevoice_name_is_a_setting():
    fields = settings_fields()
    seen = set()
    for path in sorted(p for p in DEPLOY.rglob("*") if p.is_file()):
        for name in re.findall(r"\bSENSEVOICE_[A-Z0-9_]+\b", path.read_text()):
            seen.add(name)
            assert name[len("SENSEVOICE_"):].lower() in fields, \
                f"{path.relative_to(ROOT)} names {name}, which is no field of pipeline.config.Settings"
    assert {"SENSEVOICE_ROLE", "SENSEVOICE_BROKER", "SENSEVOICE_API_TOKEN",
            "SENSEVOICE_ALLOWED_HOSTS"} <= seen


def test_kubernetes_environments_are_valid_settings():
    roles = {}
    for name, _, c in containers():
        env = container_env(c)
        if c["image"].startswith("redis"):
            assert not env
            continue
        for key in env:
            assert key.startswith("SENSEVOICE_") or key in OTHER_ENV, f"{name}: unexpected variable {key}"
        settings = settings_from_env(env)  # a bad value (role, a number) raises here
        roles[name] = settings.server.role
        assert settings.broker.url.startswith("redis://"), name
    assert roles == {"sensevoice-api": "api", "sensevoice-worker": "worker"}


def test_compose_environments_are_valid_settings():
    roles = {}
    for name, service in app_services().items():
        env = {k: interpolate(str(v)) for k, v in (service.get("environment") or {}).items()}
        if name in ("redis", "proxy"):
            assert not env
            continue
        for key in env:
            assert key.startswith("SENSEVOICE_") or key in OTHER_ENV, f"{name}: unexpected variable {key}"
        roles[name] = settings_from_env(env).server.role
    assert roles == {"api": "api", "worker": "worker"}


def test_container_arguments_parse_with_the_app_cli_and_match_the_ports():
    for name, _, c in containers():
        if c["image"].startswith("redis"):
            continue
        assert "command" not in c, f"{name}: keep the image's entrypoint (python app_sensevoice.py)"
        port = cli_port(c["args"])
        assert [p["containerPort"] for p in c["ports"]] == [port], name
    for name in ("api", "worker"):
        service = compose()["services"][name]
        port = cli_port(service["command"])
        assert f"127.0.0.1:{port}/readyz" in " ".join(service["healthcheck"]["test"]), name
    api_port = cli_port(compose()["services"]["api"]["command"])
    upstreams = re.findall(r"server\s+api:(\d+)\s+resolve;", NGINX.read_text())
    assert upstreams and {int(p) for p in upstreams} == {api_port}
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"SENSEVOICE_PORT={api_port}" in dockerfile and f"EXPOSE {api_port}" in dockerfile


def test_api_and_worker_are_one_image_and_role_apart():
    k8s_images = {c["image"] for n, _, c in containers() if n.startswith("sensevoice")}
    assert len(k8s_images) == 1
    services = compose()["services"]
    assert services["api"]["image"] == services["worker"]["image"]
    build = services["api"]["build"]
    assert build == services["worker"]["build"] == {"context": "..", "dockerfile": "Dockerfile"}
    assert (COMPOSE.parent / build["context"] / build["dockerfile"]).resolve() == ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def api_client(tmp_path_factory):
    """The app built with the api pods' own settings (from api.yaml and the example Secret), on
    the embedded broker: this test has no Redis, and the probes' routes are the same."""
    from fastapi.testclient import TestClient

    from app_sensevoice import create_app

    (c,) = [c for n, _, c in containers() if n == "sensevoice-api"]
    settings = settings_from_env(container_env(c)).updated(**{
        "role": "all", "broker": "", "ui": False, "device": "cpu",
        "data_dir": tmp_path_factory.mktemp("data")})
    return TestClient(create_app(settings, start=False)), settings


def test_probe_and_scrape_paths_are_routes_that_answer_the_hosts_they_are_sent(api_client):
    from pipeline.web.edge import allowed_hosts, host_allowed

    client, settings = api_client
    token = {"Authorization": f"Bearer {settings.server.token}"}
    paths = set()
    for name, w, c in containers():
        if c["image"].startswith("redis"):
            continue
        port_names = {p["name"]: p["containerPort"] for p in c["ports"]}
        for probe, path in PROBE_PATHS.items():
            assert c[probe]["httpGet"]["path"] == path, f"{name}: {probe}"
        assert c["startupProbe"]["httpGet"]["path"] in ("/readyz", "/healthz"), name
        for probe in ("startupProbe", *PROBE_PATHS):
            get = c[probe]["httpGet"]
            assert get["port"] in port_names or get["port"] in port_names.values(), f"{name}: {probe}"
            paths.add((get["path"], f"{POD_IP}:{port_names.get(get['port'], get['port'])}"))
        annotations = w["spec"]["template"]["metadata"].get("annotations", {})
        if annotations.get("prometheus.io/scrape") == "true":
            assert int(annotations["prometheus.io/port"]) in port_names.values(), name
            paths.add((annotations["prometheus.io/path"], f"{POD_IP}:{annotations['prometheus.io/port']}"))
            # /metrics is behind the Host allow-list (the probes are not): this pod's own
            # settings must admit its IP, which Prometheus sends as Host
            own = settings_from_env(container_env(c)).updated(**{"host": "0.0.0.0"})
            assert host_allowed(POD_IP, allowed_hosts(own)), f"{name}: Prometheus would get 400"
    assert {p for p, _ in paths} == {"/healthz", "/readyz", "/metrics"}
    # the same through the app built with the api pods' settings: a route that does not exist
    # (404) or that the Host guard refuses (400) would keep a pod unready or unscraped
    for path, host in sorted(paths):
        r = client.get(path, headers={"Host": host, **token})
        assert r.status_code in (200, 503), (path, host, r.status_code, r.text[:200])
        if path != "/readyz":  # not ready: no model loaded in this test
            assert r.status_code == 200, (path, host, r.text[:200])


def test_the_public_host_is_allowed_and_the_limits_fit_the_app():
    from pipeline.config import Settings
    from pipeline.web.edge import allowed_hosts, host_allowed

    (c,) = [c for n, _, c in containers() if n == "sensevoice-api"]
    api = settings_from_env(container_env(c)).updated(**{"host": "0.0.0.0"})
    ingresses = by_kind("Ingress")
    hosts = {rule["host"] for i in ingresses.values() for rule in i["spec"]["rules"]}
    assert hosts and all(host_allowed(h, allowed_hosts(api)) for h in hosts), hosts
    for ingress in ingresses.values():
        assert {h for t in ingress["spec"]["tls"] for h in t["hosts"]} == hosts

    # every proxy in front of the app lets the largest allowed upload through (the app's own cap,
    # 413, is max_upload_bytes plus 64 KiB for the multipart envelope)
    need_bytes = Settings().limits.max_upload_bytes + 64 * 1024

    def mib(value: str) -> int:
        assert value.endswith("m"), value
        return int(value[:-1]) * 1024 * 1024

    for ingress in ingresses.values():
        annotations = ingress["metadata"]["annotations"]
        assert mib(annotations["nginx.ingress.kubernetes.io/proxy-body-size"]) >= need_bytes
    conf = NGINX.read_text()
    (body,) = re.findall(r"client_max_body_size\s+(\S+);", conf)
    assert mib(body) >= need_bytes

    # behind a proxy every connection comes from the proxy: no per-address connection cap
    assert api.limits.max_connections_per_client == 0
    for name in ("api",):
        env = {k: interpolate(str(v)) for k, v in compose()["services"][name]["environment"].items()}
        settings = settings_from_env(env).updated(**{"host": "0.0.0.0"})
        assert settings.limits.max_connections_per_client == 0
        # X-Forwarded-For believed from the proxy alone (tests/test_forwarded.py), never any peer
        assert "FORWARDED_ALLOW_IPS" not in env and settings.server.trusted_proxies
        assert host_allowed("localhost", allowed_hosts(settings))
    assert "FORWARDED_ALLOW_IPS" not in container_env(c)
    assert settings_from_env(container_env(c)).server.trusted_proxies


def test_services_ingresses_and_autoscaler_point_at_what_exists():
    docs = manifests(applied_only=True)
    wl = {n: w for n, w in workloads().items()}
    services = by_kind("Service", docs)
    for name, w in wl.items():
        assert matches(w["spec"]["selector"]["matchLabels"], pod_labels(w)), name
    for name, svc in services.items():
        targets = [w for w in wl.values() if matches(svc["spec"]["selector"], pod_labels(w))]
        assert len(targets) == 1, f"Service {name} selects {len(targets)} workloads"
        ports = {p.get("name"): p["containerPort"]
                 for c in targets[0]["spec"]["template"]["spec"]["containers"] for p in c["ports"]}
        for port in svc["spec"]["ports"]:
            t = port["targetPort"]
            assert t in ports or t in ports.values(), f"Service {name}: targetPort {t}"
    assert services["sensevoice-worker"]["spec"]["clusterIP"] == "None"  # headless, for scraping
    assert wl["redis"]["spec"]["serviceName"] in services
    assert services[wl["redis"]["spec"]["serviceName"]]["spec"]["clusterIP"] == "None"
    for name, ingress in by_kind("Ingress", docs).items():
        for rule in ingress["spec"]["rules"]:
            for p in rule["http"]["paths"]:
                backend = p["backend"]["service"]
                assert backend["name"] in services, f"Ingress {name}: no Service {backend['name']}"
                svc = services[backend["name"]]
                assert backend["port"].get("name") in {sp.get("name") for sp in svc["spec"]["ports"]} \
                    or backend["port"].get("number") in {sp["port"] for sp in svc["spec"]["ports"]}, name
    (hpa,) = by_kind("HorizontalPodAutoscaler", docs).values()
    assert hpa["spec"]["scaleTargetRef"]["name"] in by_kind("Deployment", docs)
    assert hpa["spec"]["metrics"][0]["resource"]["name"] == "cpu"
    for pdb in by_kind("PodDisruptionBudget", docs).values():
        assert any(matches(pdb["spec"]["selector"]["matchLabels"], pod_labels(w)) for w in wl.values())
    policies = by_kind("NetworkPolicy", docs)
    assert set(policies) == {"redis", "sensevoice-api-ingress-only"}
    api_policy = policies["sensevoice-api-ingress-only"]["spec"]["podSelector"]["matchLabels"]
    assert [n for n in wl if matches(api_policy, pod_labels(wl[n]))] == ["sensevoice-api"]
    policy = policies["redis"]
    assert matches(policy["spec"]["podSelector"]["matchLabels"], pod_labels(wl["redis"]))
    allowed_from = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    for name in ("sensevoice-api", "sensevoice-worker"):
        assert matches(allowed_from, pod_labels(wl[name])), name
    # env sources exist: the ConfigMap here, the Secret's keys in its example
    configmaps = by_kind("ConfigMap", docs)
    secret = by_kind("Secret")["sensevoice-secrets"]
    for name, _, c in containers():
        for source in c.get("envFrom", []):
            assert source["configMapRef"]["name"] in configmaps, name
        for var in c.get("env", []):
            ref = var.get("valueFrom", {}).get("secretKeyRef")
            if ref:
                assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"], name
    assert "sensevoice-secrets" not in by_kind("Secret", docs)  # never applied from git


def test_the_broker_url_names_the_redis_service_and_port():
    from urllib.parse import urlsplit

    url = urlsplit(by_kind("ConfigMap")["sensevoice-config"]["data"]["SENSEVOICE_BROKER"])
    svc = by_kind("Service")[url.hostname]
    (port,) = [p for p in svc["spec"]["ports"] if p["port"] == url.port]
    redis = workloads()["redis"]["spec"]["template"]["spec"]["containers"][0]
    assert port["targetPort"] in {p["name"] for p in redis["ports"]}
    assert {p["containerPort"] for p in redis["ports"]} == {url.port}

    services = compose()["services"]
    url = urlsplit(interpolate(services["api"]["environment"]["SENSEVOICE_BROKER"]))
    assert url.scheme == "redis" and url.hostname in services and url.port == 6379
    assert interpolate(services["worker"]["environment"]["SENSEVOICE_BROKER"]) == url.geturl()


def test_redis_keeps_an_append_only_file_and_never_evicts():
    def flags(args: list[str]) -> dict[str, str]:
        return {a[2:]: b for a, b in zip(args, args[1:]) if a.startswith("--")}

    redis = compose()["services"]["redis"]
    assert redis["image"] == "redis:7"
    k8s_redis = workloads()["redis"]["spec"]["template"]["spec"]["containers"][0]
    for args in (redis["command"][1:], k8s_redis["args"][1:]):
        f = flags(args)
        assert f["appendonly"] == "yes" and f["appendfsync"] in ("everysec", "always"), f
        assert f["maxmemory-policy"] == "noeviction", f
    assert any(v.endswith(":/data") for v in redis["volumes"])
    assert "redis-cli ping" in " ".join(redis["healthcheck"]["test"])
    sts = workloads()["redis"]
    assert sts["spec"]["template"]["spec"]["containers"][0]["image"] == "redis:7"
    assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] in {
        m["name"] for m in sts["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]}


def test_workers_get_one_gpu_and_time_to_load():
    (_, _, c) = [x for x in containers() if x[0] == "sensevoice-worker"][0]
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert c["resources"]["requests"].get("nvidia.com/gpu", 1) == 1
    startup = c["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 600  # minutes to load
    args = c["args"]
    assert args[args.index("--device") + 1] == "cuda:0"
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/root/.cache" in mounts

    worker = compose()["services"]["worker"]
    (device,) = worker["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    assert any(v.endswith(":/root/.cache") for v in worker["volumes"])
    assert worker["healthcheck"]["start_period"].endswith("m")
    for name, service in compose()["services"].items():
        assert service["restart"] == "unless-stopped", name
        assert "healthcheck" in service, name
    assert compose()["services"]["api"]["deploy"]["replicas"] >= 2


def test_nginx_makes_the_ui_sticky_and_the_api_round_robin():
    conf = NGINX.read_text()
    upstreams = dict(re.findall(r"upstream\s+(\w+)\s*\{([^}]*)\}", conf))
    locations = dict(re.findall(r"location\s+([^{]+?)\s*\{([^}]*)\}", conf))
    ui_upstream = re.search(r"proxy_pass\s+http://(\w+);", locations["/ui"]).group(1)
    rr_upstream = re.search(r"proxy_pass\s+http://(\w+);", locations["/"]).group(1)
    assert "hash $ui_affinity consistent;" in upstreams[ui_upstream]
    assert "Set-Cookie" in locations["/ui"] and "proxy_buffering off;" in locations["/ui"]
    assert not re.search(r"\b(hash|ip_hash|sticky)\b", upstreams[rr_upstream])
    from pipeline.web.ui_guard import UI_PATH

    assert UI_PATH == "/ui"
    # the Host with its port and the client's address, overwritten (the app trusts both)
    assert "proxy_set_header Host $http_host;" in conf
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in conf
    assert compose()["services"]["proxy"]["volumes"][0].split(":")[0] == "./nginx/nginx.conf"
    (ui,) = [i for i in by_kind("Ingress").values() if any(
        p["path"] == UI_PATH for r in i["spec"]["rules"] for p in r["http"]["paths"])]
    assert ui["metadata"]["annotations"]["nginx.ingress.kubernetes.io/affinity"] == "cookie"
    for other in by_kind("Ingress").values():
        if other["metadata"]["name"] != ui["metadata"]["name"]:
            assert "nginx.ingress.kubernetes.io/affinity" not in other["metadata"].get("annotations", {})


NGINX_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}


def nginx_seconds(value: str) -> float:
    """An nginx time ("660s", "1h", "4h15m", "90" = seconds) in seconds."""
    parts = re.findall(r"(\d+)(ms|s|m|h|d|w)?", value)
    assert parts and "".join(n + u for n, u in parts) == value, f"not an nginx time: {value!r}"
    return sum(int(n) * NGINX_UNITS[u or "s"] for n, u in parts)


def nginx_locations() -> dict[str, str]:
    """location (with its modifier: "= /metrics", "~ ^/...", "/ui") -> its body, in file order."""
    return dict(re.findall(r"location\s+([^{]+?)\s*\{([^}]*)\}", NGINX.read_text()))


def nginx_location_for(path: str) -> str:
    """The location nginx chooses for ``path``: an exact match, else the longest prefix unless a
    regular expression (first in file order) matches and that prefix is not ^~."""
    locations = nginx_locations()
    for key in locations:
        if key.startswith("=") and key[1:].strip() == path:
            return key
    prefixes = [k for k in locations if not k.startswith(("=", "~"))
                and path.startswith(k.removeprefix("^~").strip())]
    best = max(prefixes, key=lambda k: len(k.removeprefix("^~").strip()), default=None)
    if best is not None and best.startswith("^~"):
        return best
    for key in locations:
        if key.startswith("~"):
            modifier, pattern = key.split(None, 1)
            if re.search(pattern, path, re.I if modifier == "~*" else 0):
                return key
    assert best is not None, f"no nginx location for {path}"
    return best


def nginx_headers(location: str) -> dict[str, str]:
    """The headers nginx sets on the way to the app in ``location``: its own proxy_set_header
    lines, or (only when it has none) the server block's."""
    own = dict(re.findall(r"proxy_set_header\s+(\S+)\s+([^;]+);", nginx_locations()[location]))
    if own:
        return own
    server = re.sub(r"location\s+[^{]+\{[^}]*\}", "", NGINX.read_text())
    return dict(re.findall(r"proxy_set_header\s+(\S+)\s+([^;]+);", server))


def test_nginx_names_only_settings_the_app_reads():
    """Issue 36: nginx.conf said the app trusts X-Forwarded-For through FORWARDED_ALLOW_IPS, which
    it no longer reads (SENSEVOICE_TRUSTED_PROXIES does that). Every variable-like name in the file
    is a setting of the app, and the one that decides whom the forwarded headers are believed from
    is named where they are set."""
    conf = NGINX.read_text()
    fields = settings_fields()
    names = set(re.findall(r"\b[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+\b", conf))
    assert names, "nginx.conf names no setting"
    for name in names:
        assert name.startswith("SENSEVOICE_") and name[len("SENSEVOICE_"):].lower() in fields, \
            f"nginx.conf names {name}, which is no setting of the app"
    assert "SENSEVOICE_TRUSTED_PROXIES" in names
    # and the proxy's own address (compose.yaml pins it) is one the api believes them from
    import ipaddress

    api_env = {k: interpolate(str(v)) for k, v in compose()["services"]["api"]["environment"].items()}
    trusted = [ipaddress.ip_network(t.strip(), strict=False)
               for t in settings_from_env(api_env).server.trusted_proxies.split(",") if t.strip()]
    networks = compose()["services"]["proxy"]["networks"]
    addresses = [ipaddress.ip_address(interpolate(n["ipv4_address"])) for n in networks.values()]
    assert addresses and all(any(a in t for t in trusted) for a in addresses), (addresses, trusted)


def test_nginx_keeps_a_live_stream_open_for_its_whole_life():
    """Issue 36: the live WebSocket went through "location /" (proxy_read_timeout 660 s), so nginx
    closed a stream whose server sent no frame for 11 minutes (a client sending silence gets no
    caption). Each WebSocket route of the app (read from its router, not listed here) is proxied
    with the upgrade headers and timeouts longer than a stream may live (live_max_stream_wall_s,
    as the default and as the deploy files set it)."""
    from fastapi.routing import APIWebSocketRoute

    from pipeline.config import Settings
    from pipeline.web.routes.live import build_live_router

    paths = [r.path for r in build_live_router(None).routes if isinstance(r, APIWebSocketRoute)]
    assert {"/api/stream", "/api/stream/funasr", "/v1/realtime"} <= set(paths), paths
    caps = [Settings().live.max_stream_wall_s]
    api_env = {k: interpolate(str(v)) for k, v in compose()["services"]["api"]["environment"].items()}
    caps.append(settings_from_env(api_env).live.max_stream_wall_s)
    caps += [settings_from_env(container_env(c)).live.max_stream_wall_s
             for n, _, c in containers() if n == "sensevoice-api"]
    cap = max(caps)
    for path in paths:
        location = nginx_location_for(path)
        body = nginx_locations()[location]
        assert re.search(r"proxy_pass\s+http://api_rr;", body), (path, location)  # any api replica
        headers = nginx_headers(location)
        assert headers.get("Upgrade") == "$http_upgrade", (path, location, headers)
        assert headers.get("Connection") == "$connection_upgrade", (path, location, headers)
        # a location with headers of its own inherits none: the ones the app needs are all there
        assert headers.get("Host") == "$http_host" and headers.get("X-Forwarded-For") == "$remote_addr"
        for directive in ("proxy_read_timeout", "proxy_send_timeout"):
            (value,) = re.findall(rf"{directive}\s+(\S+);", body) or [None]
            assert value is not None, f"{location}: no {directive} (nginx's 60 s default)"
            assert nginx_seconds(value) > cap, (path, location, directive, value, cap)
    # the rest of the API keeps its bounded timeouts (a stuck request is not held for hours)
    assert nginx_location_for("/api/jobs") == "/"
    assert nginx_seconds(re.search(r"proxy_read_timeout\s+(\S+);", nginx_locations()["/"]).group(1)) < 3600
    assert nginx_location_for("/ui/") == "/ui" and nginx_location_for("/metrics") == "= /metrics"


# ------------------------------------------------------------------ the single-host compose file
def test_single_host_compose_is_the_embedded_topology_on_one_gpu():
    doc = compose(COMPOSE_SINGLE)
    (name,) = app_services(COMPOSE_SINGLE)
    service = doc["services"][name]
    # the same image as the distributed file, built from the repository's Dockerfile
    assert service["build"] == compose()["services"]["api"]["build"]
    assert service["image"] == compose()["services"]["api"]["image"]
    assert (COMPOSE_SINGLE.parent / service["build"]["context"] / service["build"]["dockerfile"]
            ).resolve() == DOCKERFILE
    # embedded: no broker (SQLite store, in-process queue), both roles in one process, valid values
    env = {k: interpolate(str(v)) for k, v in (service.get("environment") or {}).items()}
    for key in env:
        assert key.startswith("SENSEVOICE_"), f"unexpected variable {key}"
    settings = settings_from_env(env)
    assert settings.server.role == "all" and not settings.broker.url
    # the port: the app's CLI, the published port, the healthcheck and the app's default agree
    from pipeline.config import Settings

    port = cli_port(service["command"])
    assert port == Settings().server.port
    assert [interpolate(p).rsplit(":", 1)[1] for p in service["ports"]] == [str(port)]
    assert interpolate(service["ports"][0]).startswith("127.0.0.1:")  # loopback unless PUBLISH says
    assert f"127.0.0.1:{port}/readyz" in " ".join(service["healthcheck"]["test"])
    assert service["healthcheck"]["start_period"].endswith("m")  # minutes to download and load
    assert service["restart"] == "unless-stopped"
    # one GPU, the model loaded on it
    (device,) = service["deploy"]["resources"]["reservations"]["devices"]
    assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}
    args = service["command"]
    assert args[args.index("--device") + 1] == "cuda:0"
    # named volumes for the job store and for the model cache, at the image's volume paths
    mounts = {v.split(":")[1]: v.split(":")[0] for v in service["volumes"]}
    # (the data dir is the image's SENSEVOICE_DATA_DIR, which this file leaves as it is)
    assert "SENSEVOICE_DATA_DIR" not in env
    assert set(mounts) == set(dockerfile_volumes()) == {dockerfile_env()["SENSEVOICE_DATA_DIR"],
                                                        "/root/.cache"}
    observability = {v.split(":")[0] for s in doc["services"].values() if s is not service
                     for v in s.get("volumes", []) if not v.startswith("./")}
    assert set(mounts.values()) == set(doc["volumes"]) - observability  # named, declared


# ------------------------------------------------------------------ the Dockerfile, .dockerignore
def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in DOCKERFILE.read_text().splitlines() if not line.lstrip().startswith("#")))
    out = []
    for line in text.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def dockerfile_volumes() -> list[str]:
    volumes = []
    for word, args in dockerfile_instructions():
        if word == "VOLUME":
            volumes += json.loads(args) if args.startswith("[") else args.split()
    return volumes


def dockerfile_env() -> dict[str, str]:
    env = {}
    for word, args in dockerfile_instructions():
        if word == "ENV":
            env.update(re.findall(r"(\w+)=(\S+)", args))
    return env


def test_the_image_runs_as_a_non_root_user_that_owns_its_volumes():
    users = [args for word, args in dockerfile_instructions() if word == "USER"]
    assert users, "the Dockerfile declares no USER: the container would run as root"
    user, _, group = users[-1].partition(":")
    assert user not in ("root", "0") and group not in ("root", "0"), users[-1]
    uid = user
    assert uid.isdigit() and int(uid) >= 1000, "a fixed numeric uid (Kubernetes runAsNonRoot checks it)"
    instructions = dockerfile_instructions()
    # USER comes before the ENTRYPOINT it applies to
    words = [w for w, _ in instructions]
    assert max(i for i, w in enumerate(words) if w == "USER") < words.index("ENTRYPOINT")
    # every volume directory is created in the image and handed to that uid (a new named volume
    # takes the ownership of the image's directory), the data dir among them
    runs = " ".join(args for word, args in instructions if word == "RUN")
    volumes = dockerfile_volumes()
    assert dockerfile_env()["SENSEVOICE_DATA_DIR"] in volumes
    for volume in volumes:
        assert re.search(rf"mkdir -p [^&;]*{re.escape(volume)}\b", runs), volume
        assert re.search(rf"chown {uid}:{group or uid} [^&;]*{re.escape(volume)}\b", runs), volume
    # the model cache: the user's ~/.cache (funasr/modelscope, Hugging Face, torch hub, the demo
    # model) is the cache volume, and every deploy file mounts the model cache there
    home = dockerfile_env()["HOME"]
    assert re.search(rf"ln -s /root/\.cache {re.escape(home)}/\.cache\b", runs)
    assert "/root/.cache" in volumes
    worker = workloads()["sensevoice-worker"]["spec"]["template"]["spec"]["containers"][0]
    assert {m["mountPath"] for m in worker["volumeMounts"]} & set(volumes) == {"/root/.cache"}
    assert any(v.endswith(":/root/.cache") for v in compose()["services"]["worker"]["volumes"])
    # the UI's sample recordings need espeak-ng; the default command is the real model
    assert "espeak-ng" in runs
    ([entrypoint], [cmd]) = ([a for w, a in instructions if w == "ENTRYPOINT"],
                             [a for w, a in instructions if w == "CMD"])
    assert json.loads(entrypoint) == ["python", "app_sensevoice.py"]
    assert json.loads(cmd) == ["--model", "iic/SenseVoiceSmall"]
    (healthcheck,) = [a for w, a in instructions if w == "HEALTHCHECK"]
    assert f"127.0.0.1:{dockerfile_env()['SENSEVOICE_PORT']}/readyz" in healthcheck


def dockerignored(path: str) -> bool:
    """Whether `docker build` leaves this path (relative to the context) out, by .dockerignore's
    rules: Go filepath.Match patterns plus '**', a leading '!' re-includes, the last match wins,
    and a pattern that matches a directory excludes what is under it."""
    def regex(pattern: str) -> re.Pattern:
        out, i = "", 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                out, i = out + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                out, i = out + ".*", i + 2
            elif pattern[i] == "*":
                out, i = out + "[^/]*", i + 1
            elif pattern[i] == "?":
                out, i = out + "[^/]", i + 1
            elif pattern[i] == "[":
                j = pattern.index("]", i)
                out, i = out + pattern[i:j + 1], j + 1
            else:
                out, i = out + re.escape(pattern[i]), i + 1
        return re.compile(out + r"\Z")

    parts = path.split("/")
    prefixes = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]
    ignored = False
    for line in DOCKERIGNORE.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        if any(regex(pattern).match(p) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_local_state_out_and_what_the_image_copies_in():
    assert DOCKERIGNORE.is_file()
    for path in (".venv", ".venv/bin/python", ".git", ".git/HEAD", "data", "data/jobs.db",
                 ".cache/x", ".pytest_cache", "pipeline/__pycache__/app.cpython-311.pyc",
                 ".whl-gpu/torch.whl", ".deb/espeak.deb", ".snap/x", "docs/results/run.json",
                 "build/lib/pipeline/app.py", "sensevoice_app.egg-info/PKG-INFO"):
        assert dockerignored(path), f".dockerignore lets {path} into the build context"
    copied = [args.split()[:-1] for word, args in dockerfile_instructions() if word == "COPY"]
    assert copied
    for sources in copied:
        for source in sources:
            source = source.rstrip("/")
            assert (ROOT / source).exists(), source
            files = [source] if (ROOT / source).is_file() else [
                p.relative_to(ROOT).as_posix() for p in (ROOT / source).rglob("*")
                if p.is_file() and "__pycache__" not in p.parts]
            assert files, source
            for f in files:
                assert not dockerignored(f), f".dockerignore leaves out {f}, which the Dockerfile COPYs"


def test_sensevoice_pods_run_as_the_images_non_root_user():
    """The api and worker pods run as the image's uid 10001 (never root) and own their volumes
    through fsGroup (a ReadWriteMany model cache is otherwise root-owned and unwritable)."""
    deployments = by_kind("Deployment")
    for name in ("sensevoice-api", "sensevoice-worker"):
        pod = deployments[name]["spec"]["template"]["spec"]
        sc = pod["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 10001, name
        assert sc["runAsGroup"] == 10001 and sc["fsGroup"] == 10001, name


def test_the_ingress_keeps_a_live_stream_open_for_its_whole_life():
    """Issue 36: on Kubernetes the live WebSocket went through the /api Ingress (660 s), the same
    11-minute cut-off nginx.conf had. For each WebSocket route of the app (read from its router), the
    Ingress path that ingress-nginx picks (the longest matching prefix of the host) waits longer than
    a stream may live, as the api pods set it; the rest of /api keeps its bounded wait."""
    from fastapi.routing import APIWebSocketRoute

    from pipeline.web.routes.live import build_live_router

    (c,) = [c for n, _, c in containers() if n == "sensevoice-api"]
    from pipeline.config import Settings

    cap = max(Settings().live.max_stream_wall_s, settings_from_env(container_env(c)).live.max_stream_wall_s)

    def ingress_for(path: str) -> dict:
        best, best_len = None, -1
        for ingress in by_kind("Ingress").values():
            for rule in ingress["spec"]["rules"]:
                for p in rule["http"]["paths"]:
                    prefix, kind = p["path"], p["pathType"]
                    hit = (path == prefix if kind == "Exact"
                           else path == prefix or path.startswith(prefix.rstrip("/") + "/"))
                    if hit and len(prefix) > best_len:
                        best, best_len = ingress, len(prefix)
        assert best is not None, path
        return best["metadata"]["annotations"]

    paths = [r.path for r in build_live_router(None).routes if isinstance(r, APIWebSocketRoute)]
    assert {"/api/stream", "/api/stream/funasr", "/v1/realtime"} <= set(paths), paths
    for path in paths:
        annotations = ingress_for(path)
        for key in ("proxy-read-timeout", "proxy-send-timeout"):
            assert float(annotations[f"nginx.ingress.kubernetes.io/{key}"]) > cap, (path, key, cap)
    assert float(ingress_for("/api/jobs")["nginx.ingress.kubernetes.io/proxy-read-timeout"]) < 3600


def test_the_ingress_publishes_every_public_route_of_the_api():
    """Every public HTTP route of the app (the REST API, the OpenAI-compatible /v1, the docs) is
    reachable through some Ingress path: /v1/audio/transcriptions was not (only /v1/realtime was)."""
    paths = [p for i in by_kind("Ingress").values() for rule in i["spec"]["rules"]
             for p in rule["http"]["paths"]]

    def published(path: str) -> bool:
        return any(path == p["path"] if p["pathType"] == "Exact"
                   else path == p["path"] or path.startswith(p["path"].rstrip("/") + "/") for p in paths)

    for path in ("/api/jobs", "/api/batches", "/api/calls", "/v1/audio/transcriptions", "/v1/models",
                 "/v1/realtime", "/api/stream", "/ui/", "/docs", "/openapi.json"):
        assert published(path), path
