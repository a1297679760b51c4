#!/usr/bin/env python3
"""The long-recording flood of issue 9 against a real server (demo model, CPU, REST API only):
N uploads of 30 min of silence (FLAC, ~14 KB each) from 4 clients as fast as accepted. Prints how
many were accepted / refused (503 backlog_full), the server's peak RSS over its idle RSS, and the
backlog the metrics show. Before the bound: 42 uploads in 45 s took RSS from 2.4 to 6.7 GB while
sensevoice_queue_depth said 0.

    python bench/backlog_flood.py [--uploads 42] [--model DIR] [--env SENSEVOICE_X=...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_kb(pid: int, field: str) -> int:
    text = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+)", text, re.M).group(1))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uploads", type=int, default=42)
    ap.add_argument("--minutes", type=float, default=30.0)
    ap.add_argument("--model", help="model dir (default: the demo model, built if needed)")
    ap.add_argument("--env", action="append", default=[])
    args = ap.parse_args()
    from pipeline.model.demo import ensure_model_dir
    from tests.conftest import MODEL_CACHE, free_port
    from tests.media import silence_flac

    model = args.model or ensure_model_dir("demo", cache_root=MODEL_CACHE)
    tmp = Path(tempfile.mkdtemp())
    flac = silence_flac(tmp / "silence.flac", args.minutes * 60, 16000)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, **dict(e.split("=", 1) for e in args.env)}
    server = subprocess.Popen([sys.executable, str(ROOT / "app_sensevoice.py"), "--model", str(model),
                               "--device", "cpu", "--api-only", "--port", str(port), "--data-dir",
                               str(tmp / "data")], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)
    try:
        while True:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        idle = rss_kb(server.pid, "VmRSS")
        Path(f"/proc/{server.pid}/clear_refs").write_text("5")  # reset the peak (VmHWM)
        body = flac.read_bytes()
        codes: list[str] = []
        t0 = time.monotonic()

        def upload(_):
            r = httpx.post(url + "/api/jobs", files={"file": ("s.flac", body)}, timeout=120)
            codes.append(str(r.status_code) if r.status_code == 202 else r.json()["error"]["code"])

        with ThreadPoolExecutor(4) as pool:
            list(pool.map(upload, range(args.uploads)))
        wall = time.monotonic() - t0
        metrics = httpx.get(url + "/metrics").text
        backlog = {m.group(1): float(m.group(2)) for m in re.finditer(
            r"^sensevoice_(backlog_\w+) (\S+)$", metrics, re.M)}
        out = {"uploads": args.uploads, "flac_bytes": len(body), "minutes_each": args.minutes,
               "accepted": codes.count("202"),
               "refused": {c: codes.count(c) for c in sorted(set(codes) - {"202"})},
               "wall_s": round(wall, 1), "idle_rss_mb": round(idle / 1024),
               "peak_rss_over_idle_mb": round((rss_kb(server.pid, "VmHWM") - idle) / 1024),
               "metrics": backlog}
        print(json.dumps(out))
    finally:
        server.terminate()
        server.wait(30)
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
