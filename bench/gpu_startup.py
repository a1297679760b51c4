#!/usr/bin/env python3
"""Start-up of the real server on a GPU: process start -> /readyz 200 -> fused encoder compiled ->
prefill CUDA graphs captured, with a cold compile cache and then a warm one (the same directory).

    python bench/gpu_startup.py --model-dir /tmp/sensevoice-full [--runs cold,warm]

Each run starts ``app_sensevoice.py --api-only --device cuda`` in a fresh process (a fresh data
directory; the cache directory of the first run is reused by the second), polls /readyz every
20 ms, reads the server's log lines as they come, sends one 10 s clip right after ready (eager
until compiled) and one after the graphs, then stops it. Writes $OUT/startup.json; prints a table.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
MARKS = {"compiled": "fused encoder compiled", "graphs": "CUDA graphs:", "ready_log": "ready ("}


def wav_bytes(seconds: float) -> bytes:
    rng = np.random.default_rng(0)
    x = (0.1 * rng.standard_normal(int(16000 * seconds))).clip(-1, 1)
    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes((x * 32767).astype("<i2").tobytes())
    return buf.getvalue()


def post_wait(url: str, body: bytes) -> float:
    boundary = "svbench"
    data = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n"
            f"Content-Type: audio/wav\r\n\r\n").encode() + body + f"\r\n--{boundary}--\r\n".encode()
    req = urllib.request.Request(f"{url}/api/jobs?wait=60", data=data, method="POST",
                                 headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    t = time.perf_counter()
    with urllib.request.urlopen(req, timeout=90) as r:
        r.read()
    return time.perf_counter() - t


def one_run(args, name: str, cache_dir: str, port: int) -> dict:
    env = dict(os.environ, SENSEVOICE_CACHE_DIR=cache_dir, PYTHONUNBUFFERED="1")
    cmd = [sys.executable, str(ROOT / "app_sensevoice.py"), "--model", args.model_dir, "--device", args.device,
           "--api-only", "--port", str(port), "--data-dir", tempfile.mkdtemp(prefix="svstart-")]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    seen: dict[str, float] = {}
    lines: list[str] = []

    def read():
        for line in proc.stdout:
            lines.append(line.rstrip())
            for key, mark in MARKS.items():
                if mark in line and key not in seen:
                    seen[key] = time.perf_counter() - t0

    threading.Thread(target=read, daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    res: dict = {"run": name}
    try:
        while time.perf_counter() - t0 < args.timeout_s:
            try:
                with urllib.request.urlopen(f"{url}/readyz", timeout=2) as r:
                    if r.status == 200:
                        res["ready_s"] = round(time.perf_counter() - t0, 2)
                        break
            except Exception:
                pass
            if proc.poll() is not None:
                raise RuntimeError("server exited:\n" + "\n".join(lines[-30:]))
            time.sleep(0.02)
        clip = wav_bytes(10.0)
        res["first_clip_after_ready_s"] = round(post_wait(url, clip), 3)
        while "graphs" not in seen and time.perf_counter() - t0 < args.timeout_s:
            time.sleep(0.05)
        time.sleep(0.2)
        res["clip_after_graphs_s"] = round(min(post_wait(url, clip) for _ in range(5)), 4)
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
    res.update({f"{k}_s": round(v, 2) for k, v in seen.items()})
    res["log_tail"] = [ln for ln in lines if "sensevoice" in ln][-12:]
    return res


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", default="/tmp/sensevoice-full")
    ap.add_argument("--runs", default="cold,warm")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timeout-s", type=float, default=400)
    args = ap.parse_args()
    out = Path(os.environ.get("OUT") or tempfile.mkdtemp())
    res: dict = {"imports": {}}
    for mod in ("torch", "funasr", "pipeline.web.app"):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-c", f"import {mod}"], cwd=ROOT, capture_output=True)
        res["imports"][mod] = round(time.perf_counter() - t, 2)
    cache = tempfile.mkdtemp(prefix="svcache-")
    for i, name in enumerate(args.runs.split(",")):
        res[name] = one_run(args, name, cache, 7880 + i)
        print(json.dumps(res[name], indent=1), flush=True)
        (out / "startup.json").write_text(json.dumps(res, indent=1))
    print("| run | ready (s) | compiled (s) | prefill graphs (s) | first 10 s clip after ready (s) | "
          "clip after graphs (s) |\n|---|---|---|---|---|---|")
    for name in args.runs.split(","):
        r = res[name]
        print(f"| {name} | {r.get('ready_s')} | {r.get('compiled_s')} | {r.get('graphs_s')} | "
              f"{r.get('first_clip_after_ready_s')} | {r.get('clip_after_graphs_s')} |")
    print("imports (fresh process, s):", res["imports"])


if __name__ == "__main__":
    main()
