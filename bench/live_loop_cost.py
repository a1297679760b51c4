#!/usr/bin/env python3
"""The event loop's cost of live streams (issue 38): WebSocket framing, the JSON of captions and
each frame's hand-over to the speech detector, for N streams in one web process, with a model
that answers at once (bench/noop_server.py), so what is measured is the process around it.

    python bench/live_loop_cost.py --streams 1000 --client-processes 4 --seconds 20

N streams (opened over --ramp-s) each send the live test's speech in 100 ms frames at real time;
once all are open, the server's threads' CPU time is read from /proc over --seconds, and the
clients count the frames they sent and the captions they got in that window. Prints (and writes
``$OUT/live_loop_cost.json`` where OUT is set):

* the event loop's (the process's main thread) CPU per frame received and per caption sent;
* the streams one loop carries: one core over the loop's CPU per stream-second;
* the speech detector's thread and the whole process, per stream-second, beside it.

The client processes run on the same machine: where they and the server together want more than
its cores, frames arrive late and fewer per second, but each one's CPU is still what it costs
(the per-frame figures hold; the stream-seconds are counted as sent).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.live_load import FRAME_S, speech  # noqa: E402
from pipeline.domain.tags import SAMPLE_RATE_HZ  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (user + system) of each thread of ``pid``, by thread id."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / TICKS
    return out


def thread_names(pid: int) -> dict[int, str]:
    """Python thread names by thread id (py-spy's dump), where py-spy is at hand."""
    spy = Path(sys.executable).parent / "py-spy"
    try:
        text = subprocess.run([str(spy), "dump", "-p", str(pid)], capture_output=True, text=True,
                              timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    names = {}
    for line in text.splitlines():
        if line.startswith("Thread "):
            tid, _, rest = line[len("Thread "):].partition(" ")
            name = rest.split('"')[1] if '"' in rest else rest
            try:
                names[int(tid, 0)] = name
            except ValueError:
                continue
    return names


async def _stream(url: str, pcm: bytes, delay: float, stop_at: float, window: tuple[float, float],
                  counts: dict, compression: str | None) -> None:
    import websockets

    await asyncio.sleep(delay)
    frame = int(FRAME_S * SAMPLE_RATE_HZ) * 2
    try:
        async with websockets.connect(url, proxy=None, max_size=None, open_timeout=120,
                                      compression=compression) as ws:
            async def read():
                try:
                    async for _ in ws:
                        if window[0] <= time.monotonic() < window[1]:
                            counts["messages"] += 1
                except websockets.ConnectionClosed:
                    pass

            reader = asyncio.create_task(read())
            t0, k = time.monotonic(), 0
            counts["open"] += 1
            while time.monotonic() < stop_at:
                i = (k * frame) % (len(pcm) - frame)
                k += 1
                await asyncio.sleep(max(0.0, t0 + k * FRAME_S - time.monotonic()))
                await ws.send(pcm[i:i + frame])
                if window[0] <= time.monotonic() < window[1]:
                    counts["frames"] += 1
            await ws.close()
            await asyncio.wait_for(reader, 30)
    except Exception as e:  # refused or failed: counted
        counts["errors"] += 1
        counts["error"] = repr(e)[:200]


def _client(args) -> dict:
    url, pcm, ks, n, ramp_s, stop_at, window, compression = args
    counts = {"frames": 0, "messages": 0, "open": 0, "errors": 0, "error": ""}

    async def main():
        await asyncio.gather(*(_stream(url, pcm, ramp_s * k / n, stop_at, window, counts, compression)
                               for k in ks))

    asyncio.run(main())
    return counts


def start_server(port: int, work: str, n: int) -> subprocess.Popen:
    import httpx

    env = {**os.environ, "SENSEVOICE_MAX_LIVE_STREAMS": str(n + 1),
           "SENSEVOICE_MAX_LIVE_STREAMS_PER_CLIENT": "0", "SENSEVOICE_MAX_CONNECTIONS_PER_CLIENT": "0"}
    log = open(Path(work) / "server.log", "wb")
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "noop_server.py"), "--demo", "--device",
                             "cpu", "--api-only", "--port", str(port), "--data-dir", work],
                            stdout=log, stderr=log, env=env)
    for _ in range(1500):
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}; see {log.name}")
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
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--client-processes", type=int, default=4)
    ap.add_argument("--ramp-s", type=float, default=15.0, help="the streams open over this long")
    ap.add_argument("--seconds", type=float, default=20.0, help="the measured window")
    ap.add_argument("--compression", choices=("deflate", "none"), default="deflate",
                    help="permessage-deflate as browsers negotiate it, or none")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as work:
        pcm, _ = speech(Path(work))
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        proc = start_server(port, work, args.streams)
        try:
            names = thread_names(proc.pid)
            n, p = args.streams, args.client_processes
            start = time.monotonic()
            window = (start + args.ramp_s + 3.0, start + args.ramp_s + 3.0 + args.seconds)
            stop_at = window[1] + 1.0
            shares = [(f"ws://127.0.0.1:{port}/api/stream", pcm, range(k, n, p), n, args.ramp_s,
                       stop_at, window, None if args.compression == "none" else "deflate")
                      for k in range(p)]
            with ProcessPoolExecutor(p) as pool:
                running = pool.map(_client, shares)
                time.sleep(max(0.0, window[0] - time.monotonic()))
                before, t0 = thread_cpu(proc.pid), time.monotonic()
                time.sleep(max(0.0, window[1] - time.monotonic()))
                after, t1 = thread_cpu(proc.pid), time.monotonic()
                names.update(thread_names(proc.pid))
                parts = list(running)
        finally:
            proc.terminate()
            proc.wait(30)
    spent = {tid: after[tid] - before.get(tid, 0.0) for tid in after}
    loop_s = spent.get(proc.pid, 0.0)
    vad_s = sum(v for tid, v in spent.items() if names.get(tid) == "sensevoice-live-vad")
    total_s = sum(spent.values())
    frames = sum(c["frames"] for c in parts)
    messages = sum(c["messages"] for c in parts)
    stream_s = frames * FRAME_S  # stream-seconds of audio sent in the window
    wall = t1 - t0
    row = {"streams": n, "open": sum(c["open"] for c in parts), "errors": sum(c["errors"] for c in parts),
           "error": next((c["error"] for c in parts if c["error"]), ""), "window_s": round(wall, 1),
           "compression": args.compression, "frames": frames, "captions": messages,
           "frames_per_s": round(frames / wall), "loop_cpu_s": round(loop_s, 2),
           "loop_busy": round(loop_s / wall, 2),
           "loop_us_per_frame": round(loop_s / max(frames, 1) * 1e6, 1),
           "loop_ms_per_stream_s": round(loop_s / max(stream_s, 1e-9) * 1e3, 3),
           "streams_one_loop_carries": int(1.0 / max(loop_s / max(stream_s, 1e-9), 1e-9)),
           "vad_ms_per_stream_s": round(vad_s / max(stream_s, 1e-9) * 1e3, 3),
           "process_ms_per_stream_s": round(total_s / max(stream_s, 1e-9) * 1e3, 3),
           "process_cores": round(total_s / wall, 2),
           "by_thread_cpu_s": {f"{names.get(tid, '?')} ({tid})": round(v, 2)
                               for tid, v in sorted(spent.items(), key=lambda x: -x[1]) if v >= 0.05}}
    print(json.dumps(row, indent=1))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "live_loop_cost.json").write_text(json.dumps(row, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
