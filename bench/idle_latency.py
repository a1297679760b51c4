#!/usr/bin/env python3
"""Idle latency over HTTP: one client, one 10 s WAV at a time, submit -> done seen by a tight poll.

    python bench/idle_latency.py --url http://127.0.0.1:7860 [--runs 50] [--seconds 10]
    python bench/idle_latency.py --url http://A,http://B     # submit on A, poll on B (distributed)

For each run: the submit's own time (upload, decode, store, enqueue: until the 202 arrives), then
GET /api/jobs/{id} every ``--poll-ms`` (1 ms) until done. Prints p50/p95 of both and of the rest
(queue + GPU + result store + the poll that sees it); writes $OUT/idle_latency.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from bench.load_test import wav_bytes  # noqa: E402


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--poll-ms", type=float, default=1.0)
    ap.add_argument("--name", default="idle")
    args = ap.parse_args()
    urls = args.url.split(",")
    clip = wav_bytes(args.seconds, 7)
    submit_c, poll_c = httpx.Client(base_url=urls[0], timeout=30), httpx.Client(base_url=urls[-1], timeout=30)
    totals, submits = [], []
    for k in range(args.warmup + args.runs):
        t0 = time.perf_counter()
        r = submit_c.post("/api/jobs", files={"file": ("clip.wav", clip)})
        t1 = time.perf_counter()
        if r.status_code != 202:
            print(f"submit answered {r.status_code}: {r.text[:200]}", file=sys.stderr)
            return 1
        jid = r.json()["id"]
        while True:
            body = poll_c.get(f"/api/jobs/{jid}").json()
            if body["status"] in ("done", "failed"):
                break
            time.sleep(args.poll_ms / 1e3)
        t2 = time.perf_counter()
        if body["status"] != "done":
            print(f"job failed: {body}", file=sys.stderr)
            return 1
        if k >= args.warmup:
            totals.append((t2 - t0) * 1e3)
            submits.append((t1 - t0) * 1e3)
        time.sleep(0.05)  # idle between jobs: no batching with the previous one
    rest = [t - s for t, s in zip(totals, submits)]
    res = {"name": args.name, "runs": args.runs, "clip_s": args.seconds,
           "total_p50_ms": round(statistics.median(totals), 2), "total_p95_ms": round(pct(totals, 95), 2),
           "submit_p50_ms": round(statistics.median(submits), 2), "submit_p95_ms": round(pct(submits, 95), 2),
           "rest_p50_ms": round(statistics.median(rest), 2)}
    print(f"| {args.name} | {res['total_p50_ms']} / {res['total_p95_ms']} | "
          f"{res['submit_p50_ms']} / {res['submit_p95_ms']} | {res['rest_p50_ms']} |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], f"idle-{args.name}.json").write_text(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
