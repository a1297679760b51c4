#!/usr/bin/env python3
"""What slow and idle clients cost the server (pipeline/web/edge.py, UploadLimit): starts the real app
(``app_sensevoice.py``, uvloop + the edge protocol, the demo model on CPU) on loopback, runs one
attack at a time with raw sockets from several loopback source addresses (127.0.x.y stand for
distinct clients), and reports for each:

* how long the server keeps an attacking connection (connect -> closed by the server) and what it
  answered (408, 431, nothing);
* the server process's RSS before and at its peak during the attack (VmRSS sampled every 50 ms);
* whether a normal client is still served meanwhile (a probe every 0.2 s from its own address:
  GET /healthz, or for the body attack a 160 kB upload), with its latency.

    python bench/slow_clients.py                    # every attack, default settings
    python bench/slow_clients.py --attack headers --connections 2000 --sources 10
    python bench/slow_clients.py --attack flood     # max_connections + 500 idle connections
    python bench/slow_clients.py --attack bodies    # 8 uploads trickling 2 B/s (10 MB declared)
    python bench/slow_clients.py --env SENSEVOICE_HEADER_TIMEOUT_S=5 ...

Prints one JSON object per attack.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
import wave
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HOST = "127.0.0.1"


# ---------------------------------------------------------------------------- the server
def demo_model() -> str:
    from pipeline.model.demo import ensure_model_dir

    cache = Path(os.environ.get("SENSEVOICE_TEST_CACHE", ROOT / ".cache" / "test-models"))
    return str(ensure_model_dir("demo", cache_root=cache))


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def start_server(model: str, env: dict[str, str], data_dir: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    url = f"http://{HOST}:{port}"
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "app_sensevoice.py"), "--model", model, "--device", "cpu",
         "--port", str(port), "--data-dir", data_dir],
        env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", **env},
        stdout=subprocess.DEVNULL, stderr=open(Path(data_dir) / "server.log", "wb"))
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        time.sleep(0.3)
    proc.kill()
    raise TimeoutError("server not ready")


class RssSampler(threading.Thread):
    def __init__(self, pid: int):
        super().__init__(daemon=True)
        self.pid, self.peak, self.stop_event = pid, 0, threading.Event()
        self.baseline = self.rss()

    def rss(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def run(self):
        while not self.stop_event.wait(0.05):
            try:
                self.peak = max(self.peak, self.rss())
            except OSError:
                return

    def stop(self) -> dict:
        self.stop_event.set()
        self.join()
        return {"rss_before_mib": round(self.baseline / 2**20, 1),
                "rss_peak_mib": round(max(self.peak, self.baseline) / 2**20, 1)}


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


# ---------------------------------------------------------------------------- helpers
def wav_bytes(seconds: float) -> bytes:
    t = np.arange(int(seconds * 16000)) / 16000
    pcm = (8000 * np.sin(2 * np.pi * 220 * t) * np.clip(np.sin(2 * np.pi * 3 * t), 0, None))
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.astype(np.int16).tobytes())
    return buf.getvalue()


def stats(xs: list[float]) -> dict:
    if not xs:
        return {"n": 0}
    xs = sorted(xs)
    q = lambda p: round(xs[min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1)], 3)  # noqa: E731
    return {"n": len(xs), "min": round(xs[0], 3), "p50": q(50), "p99": q(99), "max": round(xs[-1], 3)}


async def connect(port: int, source: str):
    return await asyncio.open_connection(HOST, port, local_addr=(source, 0))


async def held_until_closed(port: int, source: str, opening: bytes, trickle: bytes,
                            every: float, limit: float) -> tuple[float, bytes] | None:
    """Connect, send ``opening``, then ``trickle`` every ``every`` s until the server closes (or
    ``limit`` s pass). Returns (seconds held, what the server sent), None if connect failed."""
    try:
        reader, writer = await connect(port, source)
    except OSError:
        return None
    t0 = time.monotonic()
    answer = b""
    try:
        if opening:
            writer.write(opening)
        while time.monotonic() - t0 < limit:
            try:
                part = await asyncio.wait_for(reader.read(65536), every)
            except asyncio.TimeoutError:
                if trickle:
                    writer.write(trickle)
                continue
            if not part:
                break
            answer += part
    except (ConnectionError, OSError):
        pass
    finally:
        writer.transport.abort()
    return time.monotonic() - t0, answer


async def probe(url: str, stop: asyncio.Event, upload: bytes | None = None) -> dict:
    """A normal client, every 0.2 s (every 1 s for uploads), from its own address."""
    transport = httpx.AsyncHTTPTransport(local_address="127.0.0.250")
    ok, failed, latencies, codes = 0, 0, [], {}
    async with httpx.AsyncClient(transport=transport, timeout=10) as client:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                if upload is None:
                    r = await client.get(url + "/healthz", headers={"Connection": "close"})
                else:
                    r = await client.post(url + "/api/jobs", files={"file": ("a.wav", upload)},
                                          headers={"Connection": "close"})
                codes[r.status_code] = codes.get(r.status_code, 0) + 1
                if r.status_code in (200, 202):
                    ok += 1
                    latencies.append(time.monotonic() - t0)
                else:
                    failed += 1
            except httpx.HTTPError:
                failed += 1
                codes["error"] = codes.get("error", 0) + 1
            try:
                await asyncio.wait_for(stop.wait(), 1.0 if upload else 0.2)
            except asyncio.TimeoutError:
                pass
    return {"served": ok, "not_served": failed, "codes": codes,
            "latency_s": stats(latencies)}


def answers(results) -> dict:
    kinds: dict[str, int] = {}
    for r in results:
        if r is None:
            k = "connect failed"
        elif not r[1]:
            k = "closed, no answer"
        else:
            k = r[1].split(b"\r\n", 1)[0].decode(errors="replace")
        kinds[k] = kinds.get(k, 0) + 1
    return kinds


# ---------------------------------------------------------------------------- attacks
async def attack_headers(proc, url, n: int, n_sources: int) -> dict:
    """``n`` connections (from ``n_sources`` addresses) send a request line and then one header
    byte per second, never finishing their headers."""
    port = int(url.rsplit(":", 1)[1])
    srcs = [f"127.0.6.{i + 1}" for i in range(n_sources)]
    rss = RssSampler(proc.pid)
    rss.start()
    stop = asyncio.Event()
    prober = asyncio.create_task(probe(url, stop))
    opening = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: "
    tasks = []
    fds_peak = 0
    for i in range(n):  # in bursts of 200, under the listen backlog
        tasks.append(asyncio.create_task(held_until_closed(port, srcs[i % n_sources], opening, b"a",
                                                           1.0, 120)))
        if i % 200 == 199:
            await asyncio.sleep(0.05)
    t_open = time.monotonic()
    while not all(t.done() for t in tasks):
        fds_peak = max(fds_peak, open_fds(proc.pid))
        await asyncio.sleep(0.1)
    results = [t.result() for t in tasks]
    stop.set()
    return {"attack": f"{n} slow-header connections from {n_sources} address(es), 1 byte/s",
            "held_s": stats([r[0] for r in results if r]), "answers": answers(results),
            "all_closed_after_s": round(time.monotonic() - t_open, 2),
            "server_fds_peak": fds_peak, **rss.stop(), "normal_client": await prober}


async def attack_flood(proc, url, n: int, per_source: int, header_timeout: float) -> dict:
    """``n`` idle connections (nothing sent) from n / per_source addresses: beyond max_connections
    the longest-waiting ones are closed to make room."""
    port = int(url.rsplit(":", 1)[1])
    srcs = [f"127.{10 + i // 250}.0.{i % 250 + 1}" for i in range(math.ceil(n / per_source))]
    rss = RssSampler(proc.pid)
    rss.start()
    stop = asyncio.Event()
    prober = asyncio.create_task(probe(url, stop))
    tasks = []
    fds_peak = 0
    t0 = time.monotonic()
    for i in range(n):
        tasks.append(asyncio.create_task(held_until_closed(port, srcs[i // per_source], b"", b"",
                                                           1.0, 180)))
        if i % 250 == 249:
            await asyncio.sleep(0.05)
            fds_peak = max(fds_peak, open_fds(proc.pid))
    opened_s = time.monotonic() - t0
    while not all(t.done() for t in tasks):
        fds_peak = max(fds_peak, open_fds(proc.pid))
        await asyncio.sleep(0.1)
    results = [t.result() for t in tasks]
    stop.set()
    held = [r[0] for r in results if r]
    return {"attack": f"{n} idle connections from {len(srcs)} addresses",
            "opened_in_s": round(opened_s, 2), "held_s": stats(held),
            "closed_within_1s": sum(h < 1 for h in held),
            "closed_before_the_header_deadline": sum(h < header_timeout - 0.5 for h in held),
            "answers": answers(results),
            "server_fds_peak": fds_peak, **rss.stop(), "normal_client": await prober}


async def attack_bodies(proc, url, n: int, per_source: int, declared: int) -> dict:
    """``n`` uploads declare ``declared`` bytes and send 2 bytes a second; ``per_source`` per
    address. A normal client uploads a 160 kB clip every second meanwhile."""
    port = int(url.rsplit(":", 1)[1])
    srcs = [f"127.0.7.{i // per_source + 1}" for i in range(n)]
    rss = RssSampler(proc.pid)
    rss.start()
    opening = (b"POST /api/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
               b"Content-Type: multipart/form-data; boundary=x\r\nContent-Length: %d\r\n\r\n"
               b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n'
               b"Content-Type: audio/wav\r\n\r\n" % declared)
    tasks = [asyncio.create_task(held_until_closed(port, s, opening, b"ab", 1.0, 1000)) for s in srcs]
    await asyncio.sleep(0.5)
    # one more from an address that already has per_source uploads going
    extra = asyncio.create_task(held_until_closed(port, srcs[0], opening, b"", 1.0, 3))
    stop = asyncio.Event()
    t_probe = time.monotonic()
    timeline: list[tuple[float, int | str]] = []

    async def uploads():
        transport = httpx.AsyncHTTPTransport(local_address="127.0.0.250")
        clip = wav_bytes(5.0)
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            while not stop.is_set():
                try:
                    r = await client.post(url + "/api/jobs", files={"file": ("a.wav", clip)})
                    code: int | str = r.status_code
                except httpx.HTTPError:
                    code = "error"
                timeline.append((round(time.monotonic() - t_probe, 1), code))
                await asyncio.sleep(1.0)

    prober = asyncio.create_task(uploads())
    results = await asyncio.gather(*tasks)
    await asyncio.sleep(2.0)
    stop.set()
    await prober
    first_202 = next((t for t, c in timeline if c == 202), None)
    return {"attack": f"{n} uploads declaring {declared} bytes, sent at 2 B/s, {per_source} per address",
            "held_s": stats([r[0] for r in results if r]), "answers": answers(results),
            "one_more_from_the_same_address": answers([await extra]),
            **rss.stop(),
            "normal_upload_timeline": timeline,
            "normal_upload_first_accepted_after_s": first_202}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--attack", choices=["headers", "headers-one-client", "flood", "bodies", "all"],
                    default="all")
    ap.add_argument("--connections", type=int, default=2000)
    ap.add_argument("--sources", type=int, default=10)
    ap.add_argument("--model", help="model directory (default: the demo model, built once)")
    ap.add_argument("--env", action="append", default=[], help="KEY=VALUE for the server")
    args = ap.parse_args()

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    env = dict(kv.split("=", 1) for kv in args.env)
    model = args.model or demo_model()
    attacks = ["headers", "headers-one-client", "bodies", "flood"] if args.attack == "all" else [args.attack]
    for attack in attacks:
        with tempfile.TemporaryDirectory() as data:
            proc, url = start_server(model, env, data)
            try:
                if attack == "headers":
                    out = asyncio.run(attack_headers(proc, url, args.connections, args.sources))
                elif attack == "headers-one-client":
                    out = asyncio.run(attack_headers(proc, url, args.connections, 1))
                elif attack == "flood":
                    from pipeline.config import Settings
                    from pipeline.web.edge import connection_limit

                    settings = Settings(**{k[len("SENSEVOICE_"):].lower(): v
                                           for k, v in env.items() if k.startswith("SENSEVOICE_")})
                    limit = connection_limit(settings)
                    out = asyncio.run(attack_flood(proc, url, limit + 500, 200,
                                                   settings.limits.header_timeout_s))
                    out["max_connections"] = limit
                else:
                    out = asyncio.run(attack_bodies(proc, url, 8, 4, 10_000_000))
                out["server_alive"] = proc.poll() is None
            finally:
                proc.terminate()
                proc.wait(30)
            log = (Path(data) / "server.log").read_text(errors="replace").splitlines()
            out["server_log_edge"] = [line for line in log if "sensevoice.edge" in line][-3:]
            print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
