#!/usr/bin/env python3
"""The batch CLI's local mode with an engine that answers at once: the ceiling of everything but the
model (reading, decoding, batching, exporting, writing), against the way local mode ran before
(each file a job of the one-process server: stored, spooled with an fsync, waited for), in the
same process, on the same files.

    python bench/cli_local.py [--files 1000] [--seconds 10] [--formats txt,srt]

Prints a table and the ratio. The model is the demo one (its warm-up runs the real model).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
import wave
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.noop_server import _Done  # noqa: E402
from pipeline import cli  # noqa: E402
from pipeline.config import Settings  # noqa: E402
from pipeline.domain.exports import export  # noqa: E402
from pipeline.domain.types import Lane, TranscribeOptions  # noqa: E402
from pipeline.model.engine import SenseVoiceEngine  # noqa: E402


def no_op_engine() -> None:
    clean = SenseVoiceEngine.transcribe_async

    def transcribe_async(self, waves, options):
        if not threading.current_thread().name.startswith("sensevoice-worker"):
            return clean(self, waves, options)  # the warm-up runs the real model
        return _Done(len(waves))

    SenseVoiceEngine.transcribe_async = transcribe_async


def make_files(folder: Path, n: int, seconds: float) -> list[Path]:
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    pcm = (rng.standard_normal(int(16000 * seconds)) * 3000).astype("<i2").tobytes()
    first = folder / "call0000.wav"
    with wave.open(str(first), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(pcm)
    paths = [first]
    for k in range(1, n):
        paths.append(folder / f"call{k:04d}.wav")
        shutil.copyfile(first, paths[-1])
    os.sync()  # the inputs at rest, as a user's recordings are: no timed run flushes them
    return paths


def file_create_us(folder: Path, n: int = 500) -> float:
    """CPU microseconds to create, write and close one small file in a new folder: ~10-20 on
    most file systems, 120-300 on an ext4 without a journal whose inode groups saw deletions in the
    last minutes (each free inode is checked for a recent deletion): the outputs' share of a run."""
    folder.mkdir(parents=True)
    t0 = time.process_time()
    for k in range(n):
        (folder / f"f{k}.txt").write_bytes(b"x" * 200)
    return (time.process_time() - t0) / n * 1e6


def direct(src: Path, out: Path, settings: Settings, formats: tuple[str, ...]) -> tuple[float, float, int]:
    """Local mode as it is now: (start-up s, work s, files)."""
    t0 = time.perf_counter()
    plan = cli.make_plan([str(src)], out, formats)
    options = TranscribeOptions(language="en")
    with cli.LocalBackend(settings, options, formats) as backend:
        t1 = time.perf_counter()
        tally = cli.LocalRunner(backend, formats, cli.LOCAL_JOBS, progress=False,
                                output_dir=out).run(plan.todo, cli.Tally())
        t2 = time.perf_counter()
    assert not tally.failures, tally.failures[:3]
    return t1 - t0, t2 - t1, tally.transcribed


def as_jobs(src: Path, out: Path, settings: Settings, formats: tuple[str, ...]) -> tuple[float, float, int]:
    """Local mode as it was: each file a job of the one-process server (16 files in flight)."""
    from pipeline.serving.runtime import build_runtime

    t0 = time.perf_counter()
    plan = cli.make_plan([str(src)], out, formats)
    runtime = build_runtime(settings.updated(delete_audio_when_done=True))
    runtime.start()
    t1 = time.perf_counter()
    options = TranscribeOptions(language="en")

    def one(task):
        job = runtime.intake.submit(task.path.read_bytes(), filename=task.path.name,
                                    options=options, lane=Lane.BULK)
        done = runtime.view.wait(job.id, timeout=600)
        meta = {"id": done.id, "audio_seconds": done.audio_seconds}
        for f in formats:
            cli.write_atomic(cli.output_path(task.out, f), export(done.result, f, job_meta=meta)[0], out)

    with ThreadPoolExecutor(cli.DEFAULT_JOBS) as pool:
        list(pool.map(one, plan.todo))
    t2 = time.perf_counter()
    runtime.stop()
    return t1 - t0, t2 - t1, len(plan.todo)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--formats", default="txt,srt")
    ap.add_argument("--only-now", action="store_true", help="skip the baseline (for profiling)")
    args = ap.parse_args()
    formats = tuple(args.formats.split(","))
    no_op_engine()
    from pipeline.model.demo import ensure_model_dir

    tmp = Path(tempfile.mkdtemp(prefix="cli-bench-"))
    try:
        src = tmp / "in"
        make_files(src, args.files, args.seconds)
        model = ensure_model_dir("demo")
        settings = Settings(model=str(model), device="cpu", data_dir=tmp / "data")
        rows = []
        runs = (("before: each file a job (store, spool, fsync)", as_jobs),
                ("now: straight into the batches", direct))
        for name, run in runs[1:] if args.only_now else runs:
            out = tmp / f"out-{len(rows)}"
            start, work, n = run(src, out, settings, formats)
            rows.append((name, start, work, n))
        print(f"\n{args.files} x {args.seconds:g} s WAV, formats {','.join(formats)}, no-op engine, "
              f"this machine (a new file costs {file_create_us(tmp / 'probe'):.0f} us of CPU here: "
              "each input makes one per format)")
        print("| local mode | start-up s | work s | files/s of work |")
        print("|---|---|---|---|")
        for name, start, work, n in rows:
            print(f"| {name} | {start:.1f} | {work:.2f} | {n / work:.0f} |")
        if len(rows) == 2:
            print(f"ratio now / before (files/s of work): {rows[0][2] / rows[1][2]:.1f}x")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
