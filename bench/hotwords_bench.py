#!/usr/bin/env python3
"""Hotwords (issue 41): what they cost and what they buy.

    python bench/hotwords_bench.py throughput [--device cpu|cuda] [--batch 8] [--seconds 10]
                                              [--hotwords 100] [--batches 6] [--model-dir DIR]
    python bench/hotwords_bench.py recall [--model-dir DIR]     (or SENSEVOICE_MODEL=DIR)

``throughput``: batches of ``--batch`` clips of ``--seconds`` s through the engine, launched as
the worker launches them (the next batch queued before the previous one's result is read), every
clip without hotwords, then every clip with its own list of ``--hotwords`` terms (a different
list per clip: spellable terms of 1-3 word pieces drawn from the model's vocabulary; each list
spelt once, as the service's cache does for a list it sees again). Prints clips/s both ways and
the ratio. On CUDA the engine is compiled and its graphs captured for the batch size first.
The H200 row of docs/BENCHMARKS.md: ``--device cuda --batch 512 --seconds 10 --hotwords 100``.

``recall``: sentences spoken by espeak-ng, each holding a term that a general model tends to
miss (product and place names); every clip decoded without hotwords and with the whole term list
(plus distractor terms that no clip says). Prints the boosted terms' recall both ways, the word
error rate on the other words both ways, and how often a distractor was written. Needs the real
model (``--model-dir`` or ``SENSEVOICE_MODEL``): the demo model cannot recognise speech, and its
figures say only that the script runs.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pipeline.domain.hotwords import Hotword  # noqa: E402
from pipeline.domain.types import TranscribeOptions  # noqa: E402
from pipeline.model.loading import load_engine  # noqa: E402

SENTENCES = [  # (sentence, the term in it)
    ("Please deploy the new service on Kubernetes before Friday.", "Kubernetes"),
    ("The dashboard in Grafana shows the error rate going up.", "Grafana"),
    ("We moved the customer database to PostgreSQL last month.", "PostgreSQL"),
    ("Our office in Shenzhen opens at nine in the morning.", "Shenzhen"),
    ("The invoice from Anthropic arrived this afternoon.", "Anthropic"),
    ("Restart the Nginx proxy and check the logs again.", "Nginx"),
    ("The new phone from Xiaomi has a larger battery.", "Xiaomi"),
    ("Send the quarterly report to Siobhan before lunch.", "Siobhan"),
    ("The flight to Reykjavik was delayed by two hours.", "Reykjavik"),
    ("Our team uses Terraform to manage the cloud accounts.", "Terraform"),
]
DISTRACTORS = ["Kafka", "Hadoop", "Zanzibar", "Bratislava", "Jupyter", "Cassandra"]


def _engine(args):
    model_dir = args.model_dir or os.environ.get("SENSEVOICE_MODEL")
    if not model_dir:
        from pipeline.model.demo import ensure_model_dir

        model_dir = ensure_model_dir("demo", cache_root=ROOT / ".cache" / "test-models")
        print(f"(no --model-dir / SENSEVOICE_MODEL: the demo model, {model_dir})")
    dtype = "float16" if args.device.startswith("cuda") else "float32"
    return load_engine(model_dir, args.device, dtype, cache_dir=ROOT / ".cache")


# ---------------------------------------------------------------------- throughput
def _term_pool(engine, rng, size: int) -> list[str]:
    sp = engine.hotword_tables.sp
    words = [p[1:] for p in (sp.id_to_piece(i) for i in range(sp.get_piece_size()))
             if p.startswith("\u2581") and p[1:].isascii() and p[1:].isalpha() and len(p) > 3]
    pool = set()
    while len(pool) < size:
        pool.add(" ".join(rng.choice(words, size=int(rng.integers(1, 4)))))
    return sorted(pool)


def throughput(args) -> None:
    engine = _engine(args)
    rng = np.random.default_rng(0)
    n = int(args.seconds * 16000)
    t = np.arange(n) / 16000
    waves = [torch.from_numpy((0.05 * rng.standard_normal(n) + 0.1 * np.sin(2 * np.pi * (150 + 10 * k) * t))
                              .astype(np.float32)).to(args.device) for k in range(args.batch)]
    pool = _term_pool(engine, rng, max(args.hotwords * 4, 400))
    lists = [tuple(Hotword(w, float(rng.uniform(1.0, 4.0))) for w in rng.choice(pool, args.hotwords, replace=False))
             for _ in range(args.batch)]
    plain = [TranscribeOptions("en")] * args.batch
    boosted = [TranscribeOptions("en", hotwords=h) for h in lists]
    if engine.device.type == "cuda":
        secs = engine.capture_graphs([args.batch], args.seconds)
        print(f"compiled and captured in {secs:.1f} s")
    t0 = time.perf_counter()
    for h in lists:
        engine.hotword_tables.get(h)
    print(f"spelt {args.batch} lists of {args.hotwords} terms in {time.perf_counter() - t0:.2f} s (once per list)")

    def run(options) -> tuple[float, float]:
        """(clips per wall second, clips per CPU second of this process: on a shared host the
        second is the fairer figure of what the work itself costs)."""
        engine.transcribe(waves, options)  # warm
        if engine.device.type == "cuda":
            torch.cuda.synchronize()
        t0, c0 = time.perf_counter(), time.process_time()
        pending = None
        for _ in range(args.batches):
            nxt = engine.transcribe_async(waves, options)
            if pending is not None:
                pending.result()
            pending = nxt
        pending.result()
        clips = args.batch * args.batches
        return clips / (time.perf_counter() - t0), clips / (time.process_time() - c0)

    rows = []
    for _ in range(args.rounds):  # interleaved: a loaded machine's drift hits both alike
        rows.append((run(plain), run(boosted)))
    print(f"device {engine.device}, batch {args.batch} x {args.seconds:g} s, {args.hotwords} hotwords per clip "
          f"(a different list each), {args.batches} batches x {args.rounds} rounds (best)")
    for k, unit in ((0, "clips/s (wall)"), (1, "clips per CPU second")):
        without = max(r[0][k] for r in rows)
        with_ = max(r[1][k] for r in rows)
        print(f"without hotwords: {without:8.1f} {unit}")
        print(f"with hotwords:    {with_:8.1f} {unit}   ({100 * with_ / without:.1f} % of without)")


# ---------------------------------------------------------------------- recall
def _words(text: str) -> list[str]:
    return re.findall(r"[a-z0-9']+", text.lower())


def _edits(a: list[str], b: list[str]) -> int:
    d = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        prev, d[0] = d[0], i
        for j, y in enumerate(b, 1):
            prev, d[j] = d[j], min(d[j] + 1, d[j - 1] + 1, prev + (x != y))
    return d[len(b)]


def _speak(text: str, path: Path) -> torch.Tensor:
    from pipeline.audio.decode import decode_audio

    subprocess.run(["espeak-ng", "-w", str(path), text], check=True, capture_output=True)
    audio = decode_audio(path.read_bytes())
    return torch.from_numpy(np.ascontiguousarray(audio.samples, dtype=np.float32))


def recall(args) -> None:
    engine = _engine(args)
    with tempfile.TemporaryDirectory() as tmp:
        waves = [_speak(s, Path(tmp) / f"{k}.wav") for k, (s, _) in enumerate(SENTENCES)]
    terms = [t for _, t in SENTENCES] + DISTRACTORS
    hot = tuple(Hotword(t, args.weight) for t in terms)
    found = {}
    for label, options in (("without", TranscribeOptions("en")), ("with", TranscribeOptions("en", hotwords=hot))):
        outs = engine.transcribe([w.to(engine.device) for w in waves], [options] * len(waves))
        hits = errors = ref_words = false = 0
        for (sentence, term), out in zip(SENTENCES, outs):
            text = re.sub(r"<\|[^|]*\|>", "", out.raw_text)
            hyp, ref, tw = _words(text), _words(sentence), _words(term)
            hits += " ".join(tw) in " ".join(hyp)
            others_ref = [w for w in ref if w not in tw]
            others_hyp = [w for w in hyp if w not in tw]
            errors += _edits(others_ref, others_hyp)
            ref_words += len(others_ref)
            false += sum(" ".join(_words(d)) in " ".join(hyp) for d in DISTRACTORS)
            if args.verbose:
                print(f"  [{label}] {text.strip()}")
        found[label] = (hits / len(SENTENCES), errors / max(ref_words, 1), false)
    print(f"{len(SENTENCES)} espeak-ng sentences, {len(SENTENCES)} terms + {len(DISTRACTORS)} distractors, "
          f"weight {args.weight:g} per piece, model {engine.device}")
    print(f"{'':10s} {'term recall':>12s} {'other-word WER':>15s} {'distractors written':>20s}")
    for label, (r, wer, false) in found.items():
        print(f"{label:10s} {100 * r:11.0f}% {100 * wer:14.1f}% {false:20d}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("mode", choices=("throughput", "recall"))
    ap.add_argument("--model-dir")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--hotwords", type=int, default=100)
    ap.add_argument("--batches", type=int, default=6)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--weight", type=float, default=2.0)
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(os.cpu_count() or 1, 16)))
    (throughput if args.mode == "throughput" else recall)(args)


if __name__ == "__main__":
    main()
