#!/usr/bin/env python3
"""Live captions under load: N simulated microphones stream speech at real time over
``/api/stream``; prints the latencies a person would see.

    python bench/live_load.py --streams 1,8,32                # starts the demo model on CPU
    python bench/live_load.py --streams 64 --spread-s 10,1    # both arrival patterns (issue 38)
    python bench/live_load.py --url http://127.0.0.1:7860 --streams 100 --token T

The audio: three espeak-ng sentences separated by 1.2 s pauses (the test's recording), repeated
``--repeat`` times, 16 kHz PCM in 100 ms frames, each sent when a microphone would have recorded
it (frame k at k x 100 ms + 100 ms); streams start spread over --spread-s (1 s; a list gives a
row per spread, each on a fresh server where this script starts one). Where each
sentence is voiced is known (10 ms frames above -60 dBFS), and each final is matched to its
sentence, so per utterance:

* **speech start -> first partial**: from the moment the sentence's first voiced sample was
  "spoken" (its place in the real-time clock) to receiving its first non-empty partial: the
  100 ms frame, the speech detector's onset and the decode;
* **pause -> final**: from the moment the pause the server waits for had passed (``live_pause_s``
  after the last voiced sample: before it no server can know the utterance ended) to receiving
  the final; **speech end -> final** adds that pause (what a person waits).

Prints one table row per stream count (p50 / p95 in ms) and writes ``$OUT/live_load.json`` when
OUT is set. A row counts the streams admitted and those refused a slot at once (the server at
capacity: live_at_capacity / too_many_streams, close 1013 -- a clean answer, not a failure), the
admitted streams' utterances whose final was not matched, and streams that ended in error.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.domain.tags import SAMPLE_RATE_HZ  # noqa: E402

SENTENCES = ("hello world, this is the first sentence of the test",
             "the second sentence comes after a clear pause",
             "and this is the last one")
LEAD_S, GAP_S = 0.5, 1.2
FRAME_S = 0.1
VOICED_RMS = 0.001  # a 10 ms frame above -60 dBFS is voiced (espeak's silence is digital zero)


def speech(work: Path) -> tuple[bytes, list[tuple[float, float]]]:
    """The recording (s16le) and the voiced span of each sentence, seconds."""
    parts, spans, pos = [np.zeros(int(LEAD_S * SAMPLE_RATE_HZ), np.int16)], [], int(LEAD_S * SAMPLE_RATE_HZ)
    for k, text in enumerate(SENTENCES):
        cache = os.environ.get("LIVE_SPEECH_DIR")  # made once, carried where espeak-ng is not
        cached = Path(cache) / f"s{k}.s16le" if cache else None
        if cached is not None and cached.exists():
            pcm = cached.read_bytes()
        else:
            raw = work / f"s{k}.wav"
            subprocess.run(["espeak-ng", "-w", str(raw), text], check=True)
            pcm = subprocess.run(["ffmpeg", "-loglevel", "error", "-i", str(raw), "-ar", str(SAMPLE_RATE_HZ),
                                  "-ac", "1", "-f", "s16le", "-"], check=True,
                                 capture_output=True).stdout
            if cached is not None:
                cached.parent.mkdir(parents=True, exist_ok=True)
                cached.write_bytes(pcm)
        x = np.frombuffer(pcm, dtype="<i2")
        frames = x[: len(x) // 160 * 160].astype(np.float64).reshape(-1, 160) / 32768
        loud = np.flatnonzero(np.sqrt((frames ** 2).mean(axis=1)) > VOICED_RMS)
        spans.append(((pos + loud[0] * 160) / SAMPLE_RATE_HZ, (pos + (loud[-1] + 1) * 160) / SAMPLE_RATE_HZ))
        parts += [x, np.zeros(int(GAP_S * SAMPLE_RATE_HZ), np.int16)]
        pos += len(x) + int(GAP_S * SAMPLE_RATE_HZ)
    return np.concatenate(parts).astype("<i2").tobytes(), spans


REFUSALS = ("too_many_streams", "live_at_capacity", "not_ready")  # a slot refused at once


@dataclass
class StreamResult:
    first_partial_ms: list[float] = field(default_factory=list)
    final_ms: list[float] = field(default_factory=list)  # from the pause being complete
    end_final_ms: list[float] = field(default_factory=list)  # from the last voiced sample
    partials: int = 0
    finals: int = 0
    unmatched: int = 0
    error: str | None = None
    refused: bool = False  # refused a slot at once (at capacity, full, no model): not a failure


async def one_stream(url: str, headers: dict, pcm: bytes, spans: list[tuple[float, float]],
                     delay: float, pause_s: float) -> StreamResult:
    import websockets

    res = StreamResult()
    await asyncio.sleep(delay)
    frame = int(FRAME_S * SAMPLE_RATE_HZ) * 2
    t0 = 0.0  # when the first sample was "spoken"; a frame is sent once it has been recorded

    def spoken(seconds: float) -> float:
        return t0 + seconds

    try:
        async with websockets.connect(url, additional_headers=headers, proxy=None,
                                      max_size=None, open_timeout=60) as ws:
            messages: list[tuple[float, dict]] = []

            async def read():
                try:
                    async for m in ws:
                        messages.append((time.monotonic(), json.loads(m)))
                except websockets.ConnectionClosed:
                    pass

            reader = asyncio.create_task(read())
            t0 = time.monotonic()
            try:
                for i in range(0, len(pcm), frame):
                    await asyncio.sleep(max(0.0, t0 + (i + frame) / (2 * SAMPLE_RATE_HZ) - time.monotonic()))
                    await ws.send(pcm[i:i + frame])
                await ws.send(json.dumps({"type": "end"}))
            except websockets.ConnectionClosed:  # refused or ended by the server: its reason below
                pass
            await asyncio.wait_for(reader, 120)
    except Exception as e:  # the row counts it
        res.error = repr(e)
        return res
    for _, m in messages:
        if m.get("type") == "error":
            res.error = m["code"]
    finals = [(t, m) for t, m in messages if m.get("type") == "final"]
    if res.error in REFUSALS and not finals:
        res.refused = True
        return res
    res.partials = sum(1 for _, m in messages if m.get("type") == "partial" and m["text"])
    res.finals = len(finals)
    for a, b in spans:
        final = next(((t, m) for t, m in finals
                      if m["start"] <= a + 0.05 and m["end"] >= b - 0.05), None)
        if final is None:
            res.unmatched += 1
            continue
        t_final, m = final
        partial = next((t for t, p in messages if p.get("type") == "partial" and p["text"]
                        and p["start"] == m["start"]), None)
        if partial is not None:
            res.first_partial_ms.append((partial - spoken(a)) * 1e3)
        res.final_ms.append((t_final - spoken(b + pause_s)) * 1e3)
        res.end_final_ms.append((t_final - spoken(b)) * 1e3)
    return res


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return round(xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))], 1) if xs else float("nan")


async def streams(url: str, headers: dict, pcm: bytes, spans, ks: range, n: int, pause_s: float,
                  spread_s: float) -> list[StreamResult]:
    """Streams number ``ks`` of ``n``, each starting at its place in the spread."""
    return await asyncio.gather(*(one_stream(url, headers, pcm, spans, spread_s * k / max(n, 1),
                                             pause_s) for k in ks))


def _client(args) -> list[StreamResult]:  # one client process's share (--client-processes)
    return asyncio.run(streams(*args))


def level(url: str, headers: dict, pcm: bytes, spans, n: int, pause_s: float,
          spread_s: float = 1.0, processes: int = 1) -> dict:
    """N streams from ``processes`` client processes (one asyncio loop holds ~200 streams of
    100 ms frames before the client, not the server, sets the latencies)."""
    t0 = time.monotonic()
    if processes <= 1:
        results = asyncio.run(streams(url, headers, pcm, spans, range(n), n, pause_s, spread_s))
    else:
        from concurrent.futures import ProcessPoolExecutor

        shares = [range(k, n, processes) for k in range(processes)]
        with ProcessPoolExecutor(processes) as pool:
            results = [r for part in pool.map(_client, [(url, headers, pcm, spans, ks, n, pause_s,
                                                         spread_s) for ks in shares]) for r in part]
    first = [x for r in results for x in r.first_partial_ms]
    final = [x for r in results for x in r.final_ms]
    end = [x for r in results for x in r.end_final_ms]
    return {"streams": n, "seconds": round(time.monotonic() - t0, 1),
            "first_partial_p50_ms": pct(first, 50), "first_partial_p95_ms": pct(first, 95),
            "final_p50_ms": pct(final, 50), "final_p95_ms": pct(final, 95),
            "end_final_p50_ms": pct(end, 50), "end_final_p95_ms": pct(end, 95),
            "utterances": len(final), "unmatched": sum(r.unmatched for r in results),
            "admitted": sum(not r.refused for r in results),
            "refused": sum(r.refused for r in results),
            "partials_per_stream": round(statistics.mean(r.partials for r in results), 1),
            "errors": sorted({r.error for r in results if r.error and not r.refused})}


def start_server(port: int, data_dir: str, env: dict, log: Path) -> subprocess.Popen:
    import httpx

    cmd = [sys.executable, str(ROOT / "app_sensevoice.py"), "--demo", "--device", "cpu",
           "--api-only", "--port", str(port), "--data-dir", data_dir]
    with open(log, "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=out, env={**os.environ, **env})
    for _ in range(1500):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise TimeoutError("server did not start")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", help="a running server (else the demo model is started on CPU)")
    ap.add_argument("--token", default="", help="its API token, if any")
    ap.add_argument("--streams", default="1,8,32", help="stream counts, one row each")
    ap.add_argument("--repeat", type=int, default=2, help="times the 3-sentence recording repeats")
    ap.add_argument("--pause-s", type=float, default=0.7, help="the server's live_pause_s")
    ap.add_argument("--client-processes", type=int, default=1,
                    help="client processes the streams are spread over (use 1 per ~200 streams)")
    ap.add_argument("--spread-s", default="1", help="streams start spread over this many "
                    "seconds; a comma list gives a row per spread (a fresh server each where "
                    "this script starts one: a burst on a cold server is the hard case)")
    args = ap.parse_args()
    counts = [int(n) for n in args.streams.split(",")]
    spreads = [float(x) for x in args.spread_s.split(",")]
    with tempfile.TemporaryDirectory() as work:
        pcm, spans = speech(Path(work))
        one = len(pcm) / 2 / SAMPLE_RATE_HZ
        pcm = pcm * args.repeat
        spans = [(a + k * one, b + k * one) for k in range(args.repeat) for a, b in spans]
        headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
        rows = []
        print(f"{len(pcm) / 2 / SAMPLE_RATE_HZ:.1f} s of audio per stream, {len(spans)} utterances")
        print("| streams | over s | admitted | refused | speech start -> first partial p50 / p95 ms | "
              "pause -> final p50 / p95 ms | speech end -> final p50 / p95 ms | utterances | "
              "unmatched (admitted) | partials per stream | errors |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for spread in spreads:
            proc = None
            url = args.url
            if url is None:
                with socket.socket() as s:
                    s.bind(("127.0.0.1", 0))
                    port = s.getsockname()[1]
                proc = start_server(port, work, {"SENSEVOICE_MAX_LIVE_STREAMS": str(max(counts) + 1),
                                                 # every simulated microphone has this one address
                                                 "SENSEVOICE_MAX_LIVE_STREAMS_PER_CLIENT": "0",
                                                 "SENSEVOICE_LIVE_PAUSE_S": str(args.pause_s)},
                                    Path(work) / f"server-{spread:g}.log")
                url = f"http://127.0.0.1:{port}"
            ws_url = url.replace("http", "ws", 1) + "/api/stream"
            try:
                for n in counts:
                    r = level(ws_url, headers, pcm, spans, n, args.pause_s, spread,
                              args.client_processes)
                    r["spread_s"] = spread
                    rows.append(r)
                    print(f"| {n} | {spread:g} | {r['admitted']} | {r['refused']} | "
                          f"{r['first_partial_p50_ms']} / {r['first_partial_p95_ms']} | "
                          f"{r['final_p50_ms']} / {r['final_p95_ms']} | {r['end_final_p50_ms']} / "
                          f"{r['end_final_p95_ms']} | {r['utterances']} | {r['unmatched']} | "
                          f"{r['partials_per_stream']} | {', '.join(r['errors']) or '-'} |", flush=True)
            finally:
                if proc is not None:
                    proc.terminate()
                    proc.wait(30)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "live_load.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
