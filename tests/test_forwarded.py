"""Forwarded client addresses and the proxies in front of the app (issue 19 rows 3 and 10):
X-Forwarded-For is believed only from SENSEVOICE_TRUSTED_PROXIES (none by default, loopback
included), the deployment files name their proxy, a NetworkPolicy keeps every other pod away from
the api, and the proxies wait longer than the app's longest wait."""

from __future__ import annotations

import re

import httpx
import pytest
from pydantic import ValidationError

from pipeline.config import Settings
from tests.conftest import LiveServer, make_settings
from tests.test_deploy import NGINX, by_kind, compose, container_env, containers, interpolate

TOKEN = "s3cret-token"


def client(source: str, **kw) -> httpx.Client:
    return httpx.Client(transport=httpx.HTTPTransport(local_address=source), timeout=10, **kw)


def wrong_tokens(server, source: str, n: int, xff=None) -> list[int]:
    """``n`` requests with a wrong token from ``source``, each with the X-Forwarded-For
    ``xff(k)`` (None: no header); their statuses."""
    out = []
    with client(source) as c:
        for k in range(n):
            headers = {"Authorization": "Bearer wrong"}
            if xff is not None:
                headers["X-Forwarded-For"] = xff(k)
            out.append(c.get(server.url + "/api/jobs/x", headers=headers).status_code)
    return out


@pytest.fixture
def untrusting(demo_dir, tmp_path):
    srv = LiveServer(make_settings(demo_dir, tmp_path / "data", api_token=TOKEN)).start()
    yield srv
    srv.stop()


def test_forwarded_for_from_an_untrusted_peer_is_ignored(untrusting):
    # 300 wrong tokens, each "from" another address: counted on the real peer, 429 after 20
    statuses = wrong_tokens(untrusting, "127.0.0.1", 30, xff=lambda k: f"198.51.100.{k + 1}")
    assert statuses[:20] == [401] * 20 and set(statuses[20:]) == {429}


def test_the_throttle_cannot_be_aimed_at_another_address(untrusting):
    # 20 wrong tokens sent "as" the victim do not lock the victim out: they lock out the sender
    wrong_tokens(untrusting, "127.0.0.1", 21, xff=lambda k: "127.0.9.9")
    with client("127.0.9.9") as victim:
        r = victim.get(untrusting.url + "/api/jobs/x", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "job_not_found"


def test_a_trusted_proxy_sets_the_client_address_and_nobody_else_does(demo_dir, tmp_path):
    settings = make_settings(demo_dir, tmp_path / "data", api_token=TOKEN,
                             trusted_proxies="127.0.5.0/24")
    server = LiveServer(settings).start()
    try:
        # the proxy (127.0.5.1) relays 25 clients' wrong tokens: each counted on its own client
        statuses = wrong_tokens(server, "127.0.5.1", 25, xff=lambda k: f"198.51.100.{k + 1}")
        assert statuses == [401] * 25
        # ... and one guessing client's: 429 after 20, whichever proxy connection it came on
        statuses = wrong_tokens(server, "127.0.5.1", 22, xff=lambda k: "203.0.113.7")
        assert statuses[:20] == [401] * 20 and statuses[20:] == [429, 429]
        # a peer outside the proxies cannot use the header: counted on its own address
        statuses = wrong_tokens(server, "127.0.6.1", 21, xff=lambda k: f"198.51.100.{k + 100}")
        assert statuses[-1] == 429
    finally:
        server.stop()


def test_live_streams_of_one_host_are_counted_on_it_whatever_it_forwards(demo_dir, tmp_path):
    """The report: 12 of 12 live streams from one host (limit 8), each "from" another address."""
    import asyncio
    import json

    import websockets

    server = LiveServer(make_settings(demo_dir, tmp_path / "data", ui=False,
                                      max_live_streams=16)).start()
    url = server.url.replace("http://", "ws://") + "/api/stream"

    async def main():
        held, first_messages = [], []
        try:
            for k in range(12):
                ws = await websockets.connect(
                    url, proxy=None, additional_headers={"X-Forwarded-For": f"198.51.100.{k + 1}"})
                held.append(ws)
                try:
                    first_messages.append(json.loads(await asyncio.wait_for(ws.recv(), 1.0)))
                except TimeoutError:
                    first_messages.append(None)  # open and waiting for audio: accepted
                except websockets.ConnectionClosed:
                    first_messages.append({"type": "closed"})
        finally:
            for ws in held:
                await ws.close()
        return first_messages

    try:
        messages = asyncio.run(main())
    finally:
        server.stop()
    assert messages[:8] == [None] * 8
    assert all(m and m.get("code") == "too_many_streams" for m in messages[8:]), messages[8:]


@pytest.mark.parametrize("value", ["*", "nginx", "10.0.0.0/33", "127.0.0.1,*"])
def test_trusted_proxies_must_name_addresses(value):
    with pytest.raises(ValidationError, match="never '\\*'"):
        Settings(trusted_proxies=value)


def test_trusted_proxies_default_is_nobody():
    from pipeline.web.edge import proxy_options

    assert Settings().server.trusted_proxies == ""
    assert proxy_options(Settings()) == {"proxy_headers": False, "forwarded_allow_ips": None}
    assert proxy_options(Settings(trusted_proxies="10.0.0.5, 10.1.0.0/16")) == {
        "proxy_headers": True, "forwarded_allow_ips": ["10.0.0.5", "10.1.0.0/16"]}


# ---------------------------------------------------------------------------- the deployment files


def test_compose_names_its_proxy_and_trusts_only_it():
    doc = compose()
    env = {k: interpolate(str(v)) for k, v in doc["services"]["api"]["environment"].items()}
    proxy_net = doc["services"]["proxy"]["networks"]["default"]
    address = interpolate(proxy_net["ipv4_address"])
    assert env["SENSEVOICE_TRUSTED_PROXIES"] == address
    subnet = interpolate(doc["networks"]["default"]["ipam"]["config"][0]["subnet"])
    import ipaddress

    assert ipaddress.ip_address(address) in ipaddress.ip_network(subnet)
    assert "FORWARDED_ALLOW_IPS" not in env and "ports" not in doc["services"]["api"]


def test_k8s_trusts_the_ingress_network_and_only_the_ingress_reaches_the_api():
    (c,) = [c for n, _, c in containers() if n == "sensevoice-api"]
    trusted = container_env(c)["SENSEVOICE_TRUSTED_PROXIES"]
    assert trusted and "*" not in trusted
    policy = by_kind("NetworkPolicy")["sensevoice-api-ingress-only"]
    (api,) = [d for d in by_kind("Deployment").values() if d["metadata"]["name"] == "sensevoice-api"]
    pod_labels = api["spec"]["template"]["metadata"]["labels"]
    selector = policy["spec"]["podSelector"]["matchLabels"]
    assert selector.items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    sources = [peer for rule in policy["spec"]["ingress"] for peer in rule["from"]]
    assert sources and all("ipBlock" not in p for p in sources)  # named peers only, no "any"
    assert any(p.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/name")
               == "ingress-nginx" for p in sources)


def seconds(value: str) -> float:
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", value.strip())
    assert m, value
    return int(m.group(1)) * {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[m.group(2)]


def test_the_proxies_wait_longer_than_the_app():
    # nginx's 504 would replace the app's JSON (which names the job) for ?wait= and /v1 waits
    from pipeline.web.routes.events import STREAM_MAX_S

    longest = max(Settings().limits.request_wait_s, STREAM_MAX_S)
    conf = NGINX.read_text()
    locations = dict(re.findall(r"location\s+([^{]+?)\s*\{([^}]*)\}", conf))
    for path in ("/", "/ui"):
        (read,) = re.findall(r"proxy_read_timeout\s+(\S+);", locations[path])
        assert seconds(read) > longest, (path, read)
        (send,) = re.findall(r"proxy_send_timeout\s+(\S+);", locations[path])
        assert seconds(send) > longest, (path, send)
    for ingress in by_kind("Ingress").values():
        notes = ingress["metadata"]["annotations"]
        assert seconds(notes["nginx.ingress.kubernetes.io/proxy-read-timeout"]) > longest
        assert seconds(notes["nginx.ingress.kubernetes.io/proxy-send-timeout"]) > longest
