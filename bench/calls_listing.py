#!/usr/bin/env python3
"""The calls table with 10,000 jobs: how long one listing takes (issue 23: <= 300 ms).

    python bench/calls_listing.py [--jobs 10000] [--runs 20] [--redis redis://127.0.0.1:6379/15]

Fills a fresh job store (SQLite in a temporary directory; with ``--redis``, that Redis database,
flushed first) with ``--jobs`` finished calls: realistic transcripts of 24 segments (two speakers,
emotions, events, ~1.5 KB of text each), summarised at finish as the worker's finish does. Then
times, over real HTTP on loopback against the real app (its POST /api/calls route: the body naming
every job, as a browser sends them), each of these listings ``--runs`` times: the first page by
date, a sort by an emotion share, the filters "customer angry > 20 %" + "has crying", a text
search, and the whole table as CSV. Prints p50 / p95 / max per listing; writes
$OUT/calls_listing.json when OUT is set.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pipeline.domain.types import Job, JobState, Lane, Segment, TranscribeOptions, Transcript  # noqa: E402

WORDS = ("order refund delivery account please thank you waiting week problem card number "
         "address manager sorry help today store parcel label tracking bank charge").split()
EMOS = ("NEUTRAL", "NEUTRAL", "NEUTRAL", "HAPPY", "ANGRY", "SAD")
EVENTS = ((), (), (), ("Laughter",), ("Cough",), ("Cry",), ("Applause",))


def transcript(rng: random.Random) -> Transcript:
    segs, t = [], 0.0
    for k in range(24):
        n = rng.randint(6, 14)
        text = " ".join(rng.choice(WORDS) for _ in range(n)) + "."
        d = n * 0.4
        segs.append(Segment(rng.choice(("en", "en", "yue")), rng.choice(EMOS),
                            ("Speech", *rng.choice(EVENTS)), "withitn", text, t, t + d,
                            ("left", "right")[k % 2]))
        t += d + 0.3
    return Transcript(" ".join(s.text for s in segs), "", tuple(segs))


def fill(store, n: int, seed: int = 7) -> list[str]:
    rng = random.Random(seed)
    ids, batch = [], []
    now = time.time()
    for i in range(n):
        job = Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK,
                  now - (n - i) * 30, 300.0, filename=f"call-{i:05d}.wav")
        store.create(job, b"")
        ids.append(job.id)
        batch.append((job.id, transcript(rng)))
        if len(batch) == 200:
            store.mark_running([j for j, _ in batch])
            store.finish_many(batch)
            batch = []
    if batch:
        store.mark_running([j for j, _ in batch])
        store.finish_many(batch)
    return ids


QUERIES = {
    "first page by date": {},
    "sort by customer angry share": {"sort": "emotion:right:ANGRY"},
    "customer angry > 20 % and has crying": {
        "emotions": [{"speaker": "right", "emotion": "ANGRY", "op": ">", "share": 0.2}],
        "events": [{"event": "Cry", "min": 1}]},
    "text search": {"q": "refund manager"},
}


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--jobs", type=int, default=10_000)
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--redis", default="")
    args = ap.parse_args()

    import uvicorn

    from pipeline.config import Settings
    from pipeline.web.app import create_app

    data = Path(tempfile.mkdtemp(prefix="calls-bench-"))
    settings = Settings(device="cpu", data_dir=data, ui=False, broker=args.redis,
                        role="api" if args.redis else "all", port=0)
    if args.redis:
        import redis

        redis.Redis.from_url(args.redis).flushdb()
    app = create_app(settings, start=False)
    t0 = time.perf_counter()
    ids = fill(app.state.runtime.broker, args.jobs)
    fill_s = time.perf_counter() - t0
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
    jobs = [{"id": i} for i in ids]
    out = {"jobs": args.jobs, "store": "redis" if args.redis else "sqlite", "fill_s": fill_s,
           "listings": {}}
    cases = [(name, {"jobs": jobs, "query": q}) for name, q in QUERIES.items()]
    cases.append(("whole table as CSV", {"jobs": jobs, "format": "csv"}))
    cases.append(("all jobs (token scope), first page", {"all": True}))
    for name, body in cases:
        times = []
        for k in range(args.runs + 2):
            t = time.perf_counter()
            r = client.post("/api/calls", json=body)
            dt = (time.perf_counter() - t) * 1000
            assert r.status_code == 200, r.text
            if k >= 2:  # the first two warm the caches
                times.append(dt)
        total = r.json()["total"] if body.get("format") != "csv" else r.text.count("\n") - 1
        out["listings"][name] = {"matches": total, "p50_ms": statistics.median(times),
                                 "p95_ms": pct(times, 95), "max_ms": max(times)}
        print(f"{name:40s} matches {total:6d}  p50 {statistics.median(times):6.1f} ms  "
              f"p95 {pct(times, 95):6.1f} ms  max {max(times):6.1f} ms", flush=True)
    server.should_exit = True
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "calls_listing.json").write_text(json.dumps(out, indent=2))
    shutil.rmtree(data, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
