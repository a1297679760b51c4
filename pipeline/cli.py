"""Batch CLI: transcribe files through the same service (decode, queue, batched engine, store).

    python -m pipeline.cli FILE... [--model DIR|NAME | --demo] [--device cpu] [--format txt|json|srt|vtt]
                           [--out DIR] [--language auto] [--no-itn] [--split-channels]
Writes one export per input into --out (or prints txt to stdout); exits non-zero if any file failed.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
from pathlib import Path

from pipeline.config import Settings
from pipeline.domain.errors import SenseVoiceError
from pipeline.domain.exports import FORMATS, export
from pipeline.serving.runtime import build_runtime
from pipeline.domain.types import JobState, Lane, TranscribeOptions

logger = logging.getLogger("sensevoice.cli")


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m pipeline.cli", description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--model")
    ap.add_argument("--demo", action="store_true")
    ap.add_argument("--device")
    ap.add_argument("--format", choices=FORMATS, default="txt")
    ap.add_argument("--out", type=Path, help="directory for the exports (default: print to stdout)")
    ap.add_argument("--language", default="auto")
    ap.add_argument("--no-itn", action="store_true")
    ap.add_argument("--split-channels", action="store_true")
    ap.add_argument("--data-dir", type=Path, help="job store (default: a temporary directory)")
    return ap.parse_args(argv)


def main(argv=None) -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    overrides = {k: v for k, v in {"model": args.model, "device": args.device}.items() if v}
    settings = Settings(demo=args.demo, data_dir=args.data_dir or Path(tempfile.mkdtemp(prefix="sv-cli-")),
                        cuda_graphs=False, **overrides)
    options = TranscribeOptions(language=args.language, use_itn=not args.no_itn,
                                split_channels=args.split_channels)
    service = build_runtime(settings).service
    try:
        service.start()
    except SenseVoiceError as e:
        print(f"error: {e.message}", file=sys.stderr)
        return 2
    failures = 0
    try:
        jobs = []
        for path in args.files:  # submit everything first: the worker batches across files
            try:
                jobs.append((path, service.submit(path.read_bytes(), filename=path.name,
                                                  options=options, lane=Lane.BULK)))
            except (OSError, SenseVoiceError) as e:
                print(f"{path}: {getattr(e, 'message', e)}", file=sys.stderr)
                failures += 1
        for path, job in jobs:
            done = service.wait(job.id, timeout=24 * 3600)
            if done.state is not JobState.DONE or done.result is None:
                print(f"{path}: {done.error.message if done.error else done.state.value}", file=sys.stderr)
                failures += 1
                continue
            body, _ = export(done.result, args.format)
            if args.out:
                args.out.mkdir(parents=True, exist_ok=True)
                (args.out / f"{path.stem}.{args.format}").write_bytes(body)
            else:
                sys.stdout.write(f"== {path}\n{body.decode('utf-8')}\n")
    finally:
        service.stop()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
