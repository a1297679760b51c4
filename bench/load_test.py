#!/usr/bin/env python3
"""Bounded load test over loopback HTTP: N concurrent submitters with mixed clip lengths for T
seconds, plus P pollers at 2 Hz; then every accepted job is awaited. Reports accepted, rejected,
completed, failed, lost (accepted but never finished, or 404), submit-to-done latency percentiles and
poll latency percentiles.

A server that goes away mid-run (killed, restarting) is part of the report, never a crash: a submit
that cannot connect is rejected (``connection_refused``), one whose connection broke after it was
sent is a transport error (outcome unknown), an accepted job whose state the server no longer
answers for ``--gone-after`` seconds is ``unknown``, and a poll that cannot connect is a poll
error; the table and the JSON are written all the same, and the exit code is 1.

    python bench/load_test.py --url http://127.0.0.1:7860 [--submitters 8] [--seconds 20] [--pollers 200]
    python bench/load_test.py --demo ...      # starts its own server with the demo model (CPU)
    python bench/load_test.py --demo --noop   # ... whose engine answers at once (the ceiling)
    python bench/load_test.py --serve "--model DIR --device cuda --api-only" ...   # any server args
    python bench/load_test.py --url http://127.0.0.1:7001,http://127.0.0.1:7002 --client-processes 4 ...
A comma-separated --url spreads submitters and pollers over several api processes (a client-side
balancer); --client-processes runs the submitters in that many processes (one event loop each), so
that the load generator is not the limit. Prints a table last; writes $OUT/load.json (or a temp dir).
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import random
import sys
import tempfile
import time
import wave
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CLIP_SECONDS = (1.0, 3.0, 7.0, 15.0)  # mixed lengths (--clips changes them)


def wav_bytes(seconds: float, seed: int) -> bytes:
    """A voiced, syllable-modulated 16 kHz clip as WAV bytes."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * 16000)) / 16000
    sig = sum(np.sin(2 * np.pi * k * (120 + 20 * rng.random()) * t) / k for k in range(1, 8))
    sig *= np.clip(np.sin(2 * np.pi * 3.5 * t), 0, None)
    pcm = (0.25 * sig / np.abs(sig).max() * 32767).astype(np.int16)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm.tobytes())
    return buf.getvalue()


def pct(xs: list[float], p: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, math.ceil(p / 100 * len(xs)) - 1)] * 1e3, 2)


class PollerProcess:
    """P pollers at 2 Hz in a process of their own, on raw keep-alive HTTP/1.1 connections (about as
    cheap per request as wrk), so that the client's own cost does not show up as server latency.
    Job ids arrive over a queue as they are accepted; ``join`` returns the poll latencies (seconds)."""

    def __init__(self, url: list[str], pollers: int, seconds: float):
        import multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.ids, self.results = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=_poll_main, args=(url, pollers, seconds, self.ids, self.results),
                                daemon=True)
        self.proc.start()

    def add(self, job_id: str) -> None:
        self.ids.put(job_id)

    def join(self, timeout: float = 60.0) -> tuple[list[float], int, str]:
        """(poll latencies, polls that could not connect or broke, why the pollers failed or "")."""
        import queue

        self.ids.put(None)
        try:
            result = self.results.get(timeout=timeout)
        except queue.Empty:
            result = f"no result within {timeout:g} s (exit code {self.proc.exitcode})"
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
        if isinstance(result, str):
            return [], 0, f"poller process failed: {result}"
        return result[0], result[1], ""


def _poll_main(urls: list[str], pollers: int, seconds: float, ids_q, out_q) -> None:
    import threading
    from urllib.parse import urlsplit

    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    ids: list[str] = []

    def feed():
        while (job_id := ids_q.get()) is not None:
            ids.append(job_id)

    threading.Thread(target=feed, daemon=True).start()
    targets = [(urlsplit(u).hostname, urlsplit(u).port or 80) for u in urls]
    latencies: list[float] = []
    errors = [0]  # polls that could not connect, or whose connection broke
    stop = time.monotonic() + seconds

    async def poller(k: int):
        target = k
        conn = None  # (reader, writer), opened on the first tick with a job to poll
        await asyncio.sleep(k * 0.5 / max(pollers, 1))  # spread the 2 Hz ticks
        tick = time.monotonic()
        while tick < stop:
            if ids:
                host, port = targets[target % len(targets)]
                job_id = ids[-1] if k % 2 else ids[k % len(ids)]  # the newest job, or any
                t = time.monotonic()
                try:
                    if conn is None:
                        conn = await asyncio.open_connection(host, port)
                    reader, writer = conn
                    writer.write(f"GET /api/jobs/{job_id} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                    head = await reader.readuntil(b"\r\n\r\n")
                    status = head.split(b" ", 2)[1]
                    length = int(head.lower().split(b"content-length:", 1)[1].split(b"\r\n", 1)[0])
                    await reader.readexactly(length)
                except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
                    # that api process died or is gone: the next one (or the same, later)
                    errors[0] += 1
                    if conn is not None:
                        conn[1].close()
                        conn = None
                    target += 1
                else:
                    latencies.append(time.monotonic() - t)
                    if status != b"200":
                        raise RuntimeError(f"poll of {job_id} answered {status.decode()}")
            tick += 0.5
            await asyncio.sleep(max(0.0, tick - time.monotonic()))
        if conn is not None:
            conn[1].close()

    async def all_pollers():
        await asyncio.gather(*[poller(k) for k in range(pollers)])

    try:
        asyncio.run(all_pollers())
        out_q.put((latencies, errors[0]))
    except Exception as e:  # noqa: BLE001 - reported to the parent
        out_q.put(f"{type(e).__name__}: {e}")


@dataclass
class Report:
    submitters: int
    pollers: int
    seconds: float
    accepted: int = 0
    rejected: int = 0
    rejected_codes: dict = field(default_factory=dict)
    completed: int = 0
    failed: int = 0
    lost: int = 0
    latency_ms: dict = field(default_factory=dict)
    poll_latency_ms: dict = field(default_factory=dict)
    polls: int = 0
    transport_errors: int = 0  # submits whose connection broke before an answer (outcome unknown)
    unknown: int = 0  # accepted jobs whose end the server could no longer be asked about (it went away)
    poll_errors: int = 0  # polls that could not connect or whose connection broke
    errors: list = field(default_factory=list)  # what went wrong in the load generator itself
    throughput_jobs_per_s: float = 0.0


def merge(parts: list[tuple[Report, list[float], list[float]]], seconds: float) -> Report:
    """One report from the parts run by several client processes (percentiles of all samples)."""
    rep = Report(sum(p[0].submitters for p in parts), sum(p[0].pollers for p in parts), seconds)
    for part, _, _ in parts:
        for name in ("accepted", "rejected", "completed", "failed", "lost", "polls", "transport_errors",
                     "unknown", "poll_errors"):
            setattr(rep, name, getattr(rep, name) + getattr(part, name))
        rep.errors += part.errors
        for code, n in part.rejected_codes.items():
            rep.rejected_codes[code] = rep.rejected_codes.get(code, 0) + n
    lat = [x for _, xs, _ in parts for x in xs]
    poll_lat = [x for _, _, xs in parts for x in xs]
    rep.latency_ms = {"p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99),
                      "max": max(lat) if lat else None}
    rep.poll_latency_ms = {"p50": pct(poll_lat, 50), "p95": pct(poll_lat, 95), "p99": pct(poll_lat, 99)}
    rep.throughput_jobs_per_s = round(rep.completed / seconds, 1)
    return rep


def _run_part(urls: list[str], submitters: int, seconds: float, pollers: int,
              finish_timeout: float, offset: int, clip_s: tuple[float, ...], gone_after: float = 10.0):
    """One client process's share (spawned by --client-processes)."""
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
    return asyncio.run(run(urls, submitters, seconds, pollers, finish_timeout, offset, clip_s, gone_after))


def error_code(r: httpx.Response) -> str:
    """The app's error code of a refusal, or the status (a proxy's or a dying server's plain
    answer is no JSON)."""
    try:
        error = r.json().get("error")
        return str(error.get("code") or r.status_code) if isinstance(error, dict) else str(r.status_code)
    except (ValueError, AttributeError):
        return str(r.status_code)


async def run(urls: list[str], submitters: int, seconds: float, pollers: int,
              finish_timeout: float, offset: int = 0, clip_s: tuple[float, ...] = CLIP_SECONDS,
              gone_after: float = 10.0) -> tuple[Report, list[float], list[float]]:
    rep = Report(submitters, pollers, seconds)
    clips = {s: wav_bytes(s, i) for i, s in enumerate(clip_s)}
    submitted: dict[str, float] = {}
    done_at: dict[str, float] = {}
    stop = time.monotonic() + seconds
    limits = httpx.Limits(max_connections=submitters + pollers + 8)
    clients = [httpx.AsyncClient(base_url=u, timeout=60, limits=limits) for u in urls]
    asked = [0]  # which client the final polls use: any api process answers any job
    try:

        async def submitter(k: int):
            client = clients[(offset + k) % len(clients)]
            rng = random.Random(offset + k)
            while time.monotonic() < stop:
                secs = rng.choice(clip_s)
                t = time.monotonic()
                try:
                    r = await client.post("/api/jobs", files={"file": (f"c{secs}.wav", clips[secs])})
                except httpx.ConnectError:  # nothing reached a server: no job, a refused submit
                    rep.rejected += 1
                    rep.rejected_codes["connection_refused"] = rep.rejected_codes.get("connection_refused", 0) + 1
                    await asyncio.sleep(0.05)  # e.g. its api process died: no busy loop
                    continue
                except httpx.TransportError:  # sent, then the connection broke: outcome unknown
                    rep.transport_errors += 1
                    await asyncio.sleep(0.05)
                    continue
                job_id = None
                if r.status_code == 202:
                    try:
                        job_id = r.json()["id"]
                    except (ValueError, KeyError, TypeError):
                        rep.errors.append(f"a 202 without a job id: {r.text[:100]!r}")
                if job_id is not None:
                    submitted[job_id] = t
                    if polling is not None:
                        polling.add(job_id)
                    rep.accepted += 1
                else:
                    rep.rejected += 1
                    code = error_code(r)
                    rep.rejected_codes[code] = rep.rejected_codes.get(code, 0) + 1
                    try:
                        wait = float(r.headers.get("retry-after", "0.2"))
                    except ValueError:
                        wait = 0.2
                    await asyncio.sleep(min(max(wait, 0.05), 5.0))

        # (no poller process without pollers: ids it never reads would fill its queue's pipe, and
        # this process would hang at exit flushing them)
        polling = PollerProcess(urls, pollers, seconds) if pollers > 0 else None
        poll_lat: list[float] = []
        try:
            await asyncio.gather(*[submitter(k) for k in range(submitters)])
        finally:
            if polling is not None:
                poll_lat, rep.poll_errors, why = await asyncio.to_thread(polling.join)
                if why:
                    rep.errors.append(why)
        deadline = time.monotonic() + finish_timeout
        pending = set(submitted)
        unreachable = set()  # pending jobs whose last poll got no answer (connection errors)
        answered_at = time.monotonic()  # the last time any server answered a poll
        while pending and time.monotonic() < deadline:
            for jid in list(pending):
                try:
                    r = await clients[asked[0] % len(clients)].get(f"/api/jobs/{jid}")
                except httpx.TransportError:  # a keep-alive connection closed under us, or that
                    unreachable.add(jid)  # server is gone: ask the next (until --gone-after)
                    asked[0] += 1
                    continue
                answered_at = time.monotonic()
                unreachable.discard(jid)
                if r.status_code != 200:
                    continue  # counted as lost if it never comes back
                body = r.json()
                if body["status"] in ("done", "failed"):
                    pending.discard(jid)
                    done_at[jid] = body["finished_at"]
                    if body["status"] == "done":
                        rep.completed += 1
                    else:
                        rep.failed += 1
            if pending and time.monotonic() - answered_at > gone_after:
                rep.errors.append(f"no server answered for {gone_after:g} s: "
                                  f"{len(pending)} accepted jobs not followed to their end")
                break
            if pending:
                await asyncio.sleep(0.2)
        rep.unknown = len(pending & unreachable)
        rep.lost = len(pending) - rep.unknown
    finally:
        for c in clients:
            await c.aclose()
    # latency: submit (client clock) to finished_at (server clock, same host)
    wall_offset = time.time() - time.monotonic()
    lat = [done_at[j] - (submitted[j] + wall_offset) for j in done_at]
    rep.polls = len(poll_lat)
    return rep, lat, list(poll_lat)


def start_server(args: list[str], port: int, data_dir: str, log_path: Path, noop: bool = False):
    import subprocess

    script = ROOT / ("bench/noop_server.py" if noop else "app_sensevoice.py")
    cmd = [sys.executable, str(script), *args, "--port", str(port), "--data-dir", data_dir]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    for _ in range(3000):  # a GPU server captures its CUDA graphs first
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log_path}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("server did not start")


def table(rep: Report) -> str:
    return "\n".join([
        "| submitters | pollers (2 Hz) | seconds | accepted | rejected | completed | failed | lost | "
        "unknown | latency p50 / p95 / p99 ms | poll p50 / p95 / p99 ms | polls | poll errors | "
        "broken connections |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        f"| {rep.submitters} | {rep.pollers} | {rep.seconds:g} | {rep.accepted} | {rep.rejected} | "
        f"{rep.completed} | {rep.failed} | **{rep.lost}** | {rep.unknown} | {rep.latency_ms['p50']} / "
        f"{rep.latency_ms['p95']} / {rep.latency_ms['p99']} | {rep.poll_latency_ms['p50']} / "
        f"{rep.poll_latency_ms['p95']} / {rep.poll_latency_ms['p99']} | {rep.polls} | {rep.poll_errors} | "
        f"{rep.transport_errors} |"])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url")
    ap.add_argument("--demo", action="store_true", help="start a demo-model server on CPU")
    ap.add_argument("--serve", help="start app_sensevoice.py with these arguments")
    ap.add_argument("--noop", action="store_true", help="the started server's engine answers at "
                    "once (bench/noop_server.py): the ceiling of everything but the model")
    ap.add_argument("--port", type=int, default=7871)
    ap.add_argument("--submitters", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--pollers", type=int, default=200)
    ap.add_argument("--finish-timeout", type=float, default=300)
    ap.add_argument("--gone-after", type=float, default=10, help="seconds without any answer "
                    "after which the jobs still being followed are reported as unknown")
    ap.add_argument("--clips", default="1,3,7,15", help="clip lengths in seconds, mixed")
    ap.add_argument("--client-processes", type=int, default=1,
                    help="processes the submitters (and pollers) are split over")
    args = ap.parse_args()
    proc = None
    url = args.url
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="load-"))
    out.mkdir(parents=True, exist_ok=True)
    serve = "--demo --device cpu" if args.demo else args.serve
    if serve:
        proc, url = start_server(serve.split(), args.port, tempfile.mkdtemp(prefix="load-"),
                                 out / "server.log", noop=args.noop)
    urls = url.split(",")
    n = max(1, args.client_processes)
    clip_s = tuple(float(c) for c in args.clips.split(","))
    try:
        if n == 1:
            parts = [asyncio.run(run(urls, args.submitters, args.seconds, args.pollers,
                                     args.finish_timeout, 0, clip_s, args.gone_after))]
        else:
            import multiprocessing as mp
            from concurrent.futures import ProcessPoolExecutor

            with ProcessPoolExecutor(n, mp_context=mp.get_context("spawn")) as pool:
                futures = [pool.submit(_run_part, urls, args.submitters // n + (k < args.submitters % n),
                                       args.seconds, args.pollers // n + (k < args.pollers % n),
                                       args.finish_timeout, k * 1000, clip_s, args.gone_after)
                           for k in range(n)]
                parts = [f.result() for f in futures]
        rep = merge(parts, args.seconds)
    finally:
        if proc:
            proc.terminate()
            proc.wait(10)
    (out / "load.json").write_text(json.dumps(asdict(rep), indent=1))
    print(json.dumps(asdict(rep)))
    print(table(rep))
    return 0 if rep.lost == rep.unknown == 0 and not rep.errors else 1


if __name__ == "__main__":
    sys.exit(main())
