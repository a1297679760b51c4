#!/usr/bin/env python3
"""SenseVoiceSmall serving benchmark and GPU fidelity check, in one run, on one machine.

Builds the full-size model (random weights: speed does not depend on weight values), then measures
on the same synthetic audio:
  baseline A  funasr AutoModel.generate, one request at a time, fp32 (the blog recipe)
  baseline B  funasr generate(list of 64, batch_size=64)
  engine      this project's engine through the real Worker + Scheduler + JobStore:
              start-up (incl. CUDA-graph capture), idle latency, 512 concurrent clips,
              batch-size sweep, length sweep
and the fidelity guarantees on the full-size model (features, fp32 tokens, fp16 vs fp32,
batch independence). Writes $OUT/results.json after every section; prints the table last.

    python bench/gpu_bench.py [--variant full] [--device cuda] [--quick]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pipeline.domain.tags import SAMPLE_RATE_HZ  # noqa: E402

T0 = time.perf_counter()
R: dict = {"meta": {}, "errors": {}, "sections_s": {}}


def log(*a):
    print(f"[{time.perf_counter() - T0:7.1f}s]", *a, flush=True)


def save(out: Path):
    (out / "results.json").write_text(json.dumps(R, indent=1, default=str))


def stats_ms(ts: list[float]) -> dict:
    ts = sorted(ts)
    n = len(ts)
    return {"n": n, "p50_ms": round(statistics.median(ts) * 1e3, 3),
            "p95_ms": round(ts[min(n - 1, math.ceil(0.95 * n) - 1)] * 1e3, 3),
            "min_ms": round(ts[0] * 1e3, 3)}


def speechlike(seconds: float, seed: int) -> np.ndarray:
    """Voiced harmonic signal with a pitch contour, a moving formant, syllables, pauses and noise."""
    rng = np.random.default_rng(seed)
    n = int(seconds * SAMPLE_RATE_HZ)
    t = np.arange(n) / SAMPLE_RATE_HZ
    f0 = 110 + 50 * rng.random() + 40 * np.sin(2 * np.pi * 0.3 * t + rng.uniform(0, 6))
    phase = 2 * np.pi * np.cumsum(f0) / SAMPLE_RATE_HZ
    formant = 700 + 500 * np.sin(2 * np.pi * 3.0 * t + rng.uniform(0, 6))
    sig = np.zeros(n)
    for k in range(1, 16):
        sig += (np.exp(-((k * f0 - formant) / 400.0) ** 2) + 0.3 / k) * np.sin(k * phase)
    syll = np.clip(np.sin(2 * np.pi * (3.0 + 2 * rng.random()) * t + rng.uniform(0, 6)), 0, None) ** 0.5
    words = (np.sin(2 * np.pi * 0.45 * t + rng.uniform(0, 6)) > -0.6).astype(float)
    sig = sig * syll * words
    sig = 0.3 * sig / (np.abs(sig).max() + 1e-9) + 0.003 * rng.standard_normal(n)
    return sig.astype(np.float32)


class Bench:
    def __init__(self, args):
        self.args = args
        self.out = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="svbench-"))
        self.out.mkdir(parents=True, exist_ok=True)
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def timeit(self, fn, n: int, warm: int = 3) -> list[float]:
        for _ in range(warm):
            fn()
        self.sync()
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            fn()
            self.sync()
            ts.append(time.perf_counter() - t)
        return ts

    def section(self, name, fn):
        if name in self.args.skip.split(","):
            return
        if time.perf_counter() - T0 > self.args.budget_s:
            R["errors"][name] = "skipped: time budget"
            log("skip", name, "(budget)")
            return
        log("===", name)
        t = time.perf_counter()
        try:
            fn()
        except Exception as e:
            R["errors"][name] = traceback.format_exc()[-4000:]
            log(f"!!! {name}: {type(e).__name__}: {str(e)[:400]}")
        R["sections_s"][name] = round(time.perf_counter() - t, 1)
        save(self.out)

    # ------------------------------------------------------------------ set-up
    def setup(self):
        from pipeline.model.demo import build_model_dir

        m = R["meta"]
        m.update(torch=torch.__version__, python=sys.version.split()[0], argv=sys.argv,
                 device=str(self.dev), cpu_count=os.cpu_count())
        if self.cuda:
            p = torch.cuda.get_device_properties(self.dev)
            m.update(gpu=p.name, gpu_mem_gib=round(p.total_memory / 2**30, 1), cuda=torch.version.cuda)
        model_dir = Path(self.args.model_dir)
        if not (model_dir / "model.pt").exists():
            info = build_model_dir(model_dir, variant=self.args.variant)
            m["build_s"] = round(info.seconds, 1)
            m["params"] = info.params
        t = time.perf_counter()
        from pipeline.model.loading import load_automodel

        self.am = load_automodel(model_dir, str(self.dev))
        m["automodel_load_s"] = round(time.perf_counter() - t, 1)
        self.model_dir = model_dir
        self.clips10 = [speechlike(10.0, s) for s in range(8)]
        self.clips3 = [speechlike(3.0, 100 + s) for s in range(8)]
        self.clips30 = [speechlike(30.0, 200 + s) for s in range(8)]
        log("setup done", m)

    def engine(self, dtype: str, graphs: bool, batches=(1, 2, 4, 8, 16, 32, 64, 128),
               fp32_residual: bool = False, fused: bool | None = None, prefill_batch: int = 1):
        """An engine as the service builds it; fused (compiled) by default on CUDA. Compiles in
        this thread (timed), then captures the prefill graphs (a batch of one, every length)."""
        from pipeline.model.engine import SenseVoiceEngine

        fused = self.cuda and not self.args.eager if fused is None else fused
        t = time.perf_counter()
        e = SenseVoiceEngine.from_automodel(self.am, str(self.dev), dtype, fp32_residual=fp32_residual,
                                            fused=fused, cache_dir=Path(self.args.cache_dir))
        build = time.perf_counter() - t
        if graphs and self.cuda:
            e.plan_graphs(list(batches), self.args.graph_max_seconds, prefill_batch=prefill_batch)
        comp = e.compile()
        t = time.perf_counter()
        settle(e)
        cap = time.perf_counter() - t
        warm = e.warmup()
        return e, {"engine_build_s": round(build, 2), "compile_s": round(comp, 2), "fused": fused,
                   "prefill_graph_capture_s": round(cap, 2), "warmup_s": round(warm, 3),
                   "graphs": len(e._graphs)}

    def want_graphs(self, e, shapes) -> float:
        """Capture the graphs for these (batch, clip) shapes as the worker would (on first use,
        then idle): one untimed run each, then the wanted captures. Seconds spent capturing."""
        from pipeline.domain.types import TranscribeOptions as O

        for b, clip in shapes:
            e.transcribe([torch.from_numpy(clip).to(self.dev)] * b, [O("auto", True)] * b)
        t = time.perf_counter()
        settle(e)
        return time.perf_counter() - t

    # ------------------------------------------------------------------ eager vs fused, engine alone
    def engines(self):
        """Today's eager kernels (captured) vs the fused ones (captured), same process, 10 s clips."""
        from pipeline.domain.types import TranscribeOptions as O

        E = R.setdefault("engines", {})
        batches = (1, 8, 64, 128)
        opts = O("auto", True)
        for name, fused in (("eager", False), ("fused", True)):
            t = time.perf_counter()
            eng, st = self.engine(self.args.dtype, graphs=True, batches=batches, fused=fused,
                                  fp32_residual=bool(self.args.fp32_residual), prefill_batch=0)
            st["capture_10s_buckets_s"] = round(self.want_graphs(
                eng, [(b, self.clips10[0]) for b in batches]), 2)
            st["total_s"] = round(time.perf_counter() - t, 2)
            E[f"{name}_startup"] = st
            for b in batches:
                waves = [torch.from_numpy(self.clips10[i % 8]).to(self.dev) for i in range(b)]
                r = stats_ms(self.timeit(lambda: eng.transcribe(waves, [opts] * b), self.args.n))  # noqa: F821 (called here, before the del below)
                r["clips_per_s"] = round(b * 1e3 / r["p50_ms"], 1)
                E[f"{name}_b{b}_10s"] = r
            log(name, {k: v for k, v in E.items() if k.startswith(name)})
            if fused:
                waves = [torch.from_numpy(self.clips10[i % 8]).to(self.dev) for i in range(64)]
                E["fused_profile_b64_10s"] = self.profile(eng, waves, opts)
                E["fused_op_profile_b64_10s"], E["fused_kernel_shares_b64_10s"] = \
                    self.op_profile(eng, waves, opts)
                print(E["fused_op_profile_b64_10s"], flush=True)
                log("fused kernel shares", E["fused_kernel_shares_b64_10s"])
            else:
                waves = [torch.from_numpy(self.clips10[i % 8]).to(self.dev) for i in range(64)]
                _, E["eager_kernel_shares_b64_10s"] = self.op_profile(eng, waves, opts)
                log("eager kernel shares", E["eager_kernel_shares_b64_10s"])
            del eng
            torch.cuda.empty_cache()
        for b in batches:
            e_, f_ = E.get(f"eager_b{b}_10s", {}), E.get(f"fused_b{b}_10s", {})
            if e_ and f_:
                E[f"speedup_b{b}"] = round(e_["p50_ms"] / f_["p50_ms"], 2)

    # ------------------------------------------------------------------ fidelity
    def fidelity(self):
        from pipeline.model.engine import N_QUERIES
        from pipeline.domain.types import TranscribeOptions as O

        F = R.setdefault("fidelity", {})
        am, m = self.am, self.am.model
        fe = am.kwargs["frontend"]
        e32, _ = self.engine("float32", graphs=False, fused=False)  # the eager reference
        e16, _ = self.engine("float16", graphs=False, fused=False)  # plain fp16, eager
        rng = np.random.default_rng(1)
        n_clips = self.args.fidelity_clips
        clips = [speechlike(float(rng.uniform(1.5, 12.0)), 1000 + i) for i in range(n_clips)]
        # (a) features
        worst = 0.0
        for i in range(0, 32, 8):
            group = clips[i:i + 8]
            mine, _, frames = e32.features([torch.from_numpy(c) for c in group])
            for j, c in enumerate(group):
                ref, _ = fe(torch.from_numpy(c)[None], torch.tensor([len(c)]))
                worst = max(worst, float((mine[j, :frames[j]].cpu() - ref[0]).abs().max()))
        F["features_max_abs_diff_vs_funasr"] = worst
        log("features", worst)

        # (b) fp32, same (funasr) features: our core vs funasr's encoder, single and mixed batch
        opts = [O(lang, itn) for lang in ("auto", "zh", "en", "ja") for itn in (True, False)]

        def funasr_ref(c, o):
            feats, lens = fe(torch.from_numpy(c)[None], torch.tensor([len(c)]))
            q = m.embed(torch.tensor([[m.lid_dict[o.language], 1, 2,
                                       m.textnorm_dict["withitn" if o.use_itn else "woitn"]]], device=self.dev))
            x = torch.cat([q, feats.to(self.dev)], 1)
            with torch.inference_mode():
                enc, el = m.encoder(x.clone(), (lens + N_QUERIES).to(self.dev))
                logp = m.ctc.log_softmax(enc)[0, : int(el[0])]
            return feats, logp

        same, total = 0, 0
        for k in range(16):
            c, o = clips[k], opts[k % len(opts)]
            feats, logp = funasr_ref(c, o)
            with torch.inference_mode():
                x, lens, ban = e32.encoder_inputs(feats.to(self.dev), [feats.shape[1]], [o])
                ids = e32.core(x, lens, ban)[0, : logp.shape[0]]
            same += int(torch.equal(ids, logp.argmax(-1)))
            total += 1
        F["fp32_same_features_single_identical"] = f"{same}/{total}"
        # mixed batch: one padded batch of 16 with different lengths, languages and itn
        feats_l, refs = [], []
        for k in range(16):
            feats, logp = funasr_ref(clips[k], opts[k % len(opts)])
            feats_l.append(feats[0])
            refs.append(logp.argmax(-1))
        padded = torch.nn.utils.rnn.pad_sequence(feats_l, batch_first=True).to(self.dev)
        with torch.inference_mode():
            x, lens, ban = e32.encoder_inputs(padded, [f.shape[0] for f in feats_l],
                                              [opts[k % len(opts)] for k in range(16)])
            ids = e32.core(x, lens, ban)
        ok = sum(int(torch.equal(ids[k, : refs[k].shape[0]], refs[k])) for k in range(16))
        F["fp32_same_features_mixed_batch_identical"] = f"{ok}/16"
        log("fp32 same features", F)

        # (c) fp32 end to end vs AutoModel.generate, with logit margins of any disagreement
        from pipeline.model.loading import reference_generate

        n_e2e = min(64, n_clips)
        agree, margins = [], []
        o = O("auto", True)
        mine = e32.transcribe([torch.from_numpy(c) for c in clips[:n_e2e]], [o] * n_e2e)
        refs_txt = reference_generate(am, clips[:n_e2e], o)
        if self.cuda:  # the fast path itself, fp32: the fused blocks, compiled
            e32f, _ = self.engine("float32", graphs=False, fused=True)
            fused_txt = [r.raw_text for r in e32f.transcribe([torch.from_numpy(c) for c in clips[:n_e2e]],
                                                            [o] * n_e2e)]
            F["fp32_fused_e2e_vs_generate_identical"] = f"{sum(a == b for a, b in zip(fused_txt, refs_txt))}/{n_e2e}"
            log("fp32 fused vs generate", F["fp32_fused_e2e_vs_generate_identical"])
            del e32f
        for k in range(n_e2e):
            agree.append(token_agreement(text_units(mine[k].raw_text), text_units(refs_txt[k])))
            if mine[k].raw_text != refs_txt[k]:
                _, logp = funasr_ref(clips[k], o)
                feats, _, frames = e32.features([torch.from_numpy(clips[k])])
                x, lens, ban = e32.encoder_inputs(feats, frames, [o])
                with torch.inference_mode():
                    my_ids = e32.core(x, lens, ban)[0, : logp.shape[0]]
                diff = (my_ids != logp.argmax(-1)).nonzero().flatten()
                top2 = logp[diff].topk(2, dim=-1).values
                margins += (top2[:, 0] - top2[:, 1]).tolist()
        F["fp32_e2e_vs_generate"] = {
            "clips": n_e2e, "identical_text": sum(mine[k].raw_text == refs_txt[k] for k in range(n_e2e)),
            "token_agreement_mean": round(float(np.mean(agree)), 5),
            "token_agreement_min": round(float(np.min(agree)), 5),
            "disagreeing_frames": len(margins),
            "max_logit_margin_at_disagreement": round(max(margins), 5) if margins else None}
        log("fp32 e2e", F["fp32_e2e_vs_generate"])

        # (d) fp16 (and fp16 with an fp32 residual stream) vs fp32 over many clips
        e16r, _ = self.engine("float16", graphs=False, fp32_residual=True)  # the default: fused on CUDA
        for name, eng in (("fp16_vs_fp32", e16), ("fp16_fp32residual_vs_fp32", e16r)):
            agree16, rel, frame_agree, margins = [], [], [], []
            for i in range(0, n_clips, 32):
                group = [torch.from_numpy(c) for c in clips[i:i + 32]]
                go = [opts[(i + j) % len(opts)] for j in range(len(group))]
                with torch.inference_mode():
                    f, _, frames = e32.features(group)
                    x32, lens, ban = e32.encoder_inputs(f, frames, go)
                    l32 = e32.core(x32, lens, ban, return_logits=True).float()
                    x16, _, _ = eng.encoder_inputs(f, frames, go)
                    l16 = eng.core(x16, lens, ban, return_logits=True).float()
                a32, a16 = l32.argmax(-1), l16.argmax(-1)
                o32, o16 = e32.decode(a32, lens), eng.decode(a16, lens)
                for j in range(len(group)):
                    n = int(lens[j])
                    rel.append(float((l16[j, :n] - l32[j, :n]).norm() / l32[j, :n].norm()))
                    agree16.append(token_agreement(list(o16[j].token_ids), list(o32[j].token_ids)))
                    frame_agree.append(float((a16[j, :n] == a32[j, :n]).float().mean()))
                    diff = (a16[j, :n] != a32[j, :n]).nonzero().flatten()
                    if len(diff):
                        top2 = torch.log_softmax(l32[j, diff], -1).topk(2, dim=-1).values
                        margins += (top2[:, 0] - top2[:, 1]).tolist()
            F[name] = {"clips": len(agree16), "token_agreement_mean": round(float(np.mean(agree16)), 5),
                       "token_agreement_min": round(float(np.min(agree16)), 5),
                       "frame_argmax_agreement": round(float(np.mean(frame_agree)), 5),
                       "rel_logit_err_mean": round(float(np.mean(rel)), 6),
                       "rel_logit_err_max": round(float(np.max(rel)), 6),
                       "fp32_logprob_margin_at_flips_p50": round(float(np.median(margins)), 5) if margins else None,
                       "fp32_logprob_margin_at_flips_max": round(float(np.max(margins)), 5) if margins else None}
            log(name, F[name])
        if self.cuda:  # what the fp32 residual stream costs, eager, B=64 x 10 s
            waves = [torch.from_numpy(self.clips10[i % 8]).to(self.dev) for i in range(64)]
            for name, eng in (("fp16", e16), ("fp16_fp32residual", e16r)):
                st = stats_ms(self.timeit(lambda: eng.transcribe(waves, [opts[0]] * 64), 10))
                F[f"eager_b64_10s_{name}_p50_ms"] = st["p50_ms"]
            log("eager cost", {k: v for k, v in F.items() if k.startswith("eager")})
        del e16r
        # (e) batch independence (fp32): alone vs inside a busy padded batch
        target = torch.from_numpy(clips[3])
        alone = e32.transcribe([target], [O("en", False)])[0]
        mates = [torch.from_numpy(clips[k % n_clips]) for k in range(47)]
        busy = e32.transcribe(mates + [target],
                              [opts[k % len(opts)] for k in range(47)] + [O("en", False)])[-1]
        F["fp32_batch_independent"] = alone.token_ids == busy.token_ids
        log("batch independence", F["fp32_batch_independent"])
        del e32, e16
        torch.cuda.empty_cache() if self.cuda else None

    # ------------------------------------------------------------------ baselines
    def baselines(self):
        B = R.setdefault("baseline", {})
        am = self.am
        gen = dict(language="auto", use_itn=True, batch_size=1)
        for name, clip in (("A_generate_1x10s", self.clips10[0]), ("A_generate_1x3s", self.clips3[0])):
            st = stats_ms(self.timeit(lambda: am.generate(input=clip, **gen), self.args.n))
            st["clips_per_s"] = round(1e3 / st["p50_ms"], 1)
            B[name] = st
            log(name, st)
        clips64 = [self.clips10[i % 8] for i in range(64)]
        st = stats_ms(self.timeit(lambda: am.generate(input=clips64, language="auto", use_itn=True,
                                                      batch_size=64), max(3, self.args.n // 4), warm=1))
        st["clips_per_s"] = round(64e3 / st["p50_ms"], 1)
        B["B_generate_list64_bs64"] = st
        log("B", st)

    # ------------------------------------------------------------------ engine through the worker
    def serving(self):
        from pipeline.serving.broker_sqlite import JobStore
        from pipeline.serving.scheduler import Scheduler, WorkItem
        from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
        from pipeline.serving.worker import Worker

        S = R.setdefault("engine", {})
        t = time.perf_counter()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        eng, st = self.engine(self.args.dtype, graphs=self.cuda, fp32_residual=bool(self.args.fp32_residual))
        st["fp32_residual"] = bool(self.args.fp32_residual)
        if self.cuda:  # the shapes the runs below use, captured the way the worker does
            bmax = self.args.max_batch
            st["capture_used_buckets_s"] = round(self.want_graphs(eng, [
                (b, c) for c in (self.clips3[0], self.clips10[0], self.clips30[0])
                for b in (1, bmax // 2, bmax)]), 2)
            st["graphs"] = len(eng._graphs)
        self.serving_engine = eng  # reused by the long-audio section
        st["startup_total_s"] = round(time.perf_counter() - t, 2)
        S["startup"] = st
        log("engine start-up", st)
        if self.cuda:  # captured graphs must give what the same code gives eagerly
            from pipeline.domain.types import TranscribeOptions as O

            waves = [torch.from_numpy(c).to(self.dev) for c in self.clips10[:5] + self.clips3[:2]]
            o = [O("auto", True)] * len(waves)
            with torch.inference_mode():
                f, _, frames = eng.features(waves)
                x, lens, ban = eng.encoder_inputs(f, frames, o)
                g = eng.forward_ids(x, lens, ban)
                e = eng.core(x, lens, ban)
            valid = torch.arange(x.shape[1], device=self.dev)[None] < lens[:, None]
            S["graph_vs_eager_argmax_agreement"] = float((g == e)[valid].float().mean())
            log("graph vs eager", S["graph_vs_eager_argmax_agreement"])
        store = JobStore(tempfile.mkdtemp(prefix="svstore-"))
        sched = Scheduler(100_000, max_batch=self.args.max_batch, max_wait_s=self.args.max_wait_ms / 1e3)
        done_at: dict[str, float] = {}
        cv = threading.Condition()

        def on_done(jid):
            with cv:
                done_at[jid] = time.perf_counter()
                cv.notify_all()

        store.feed.on_finished(on_done)
        worker = Worker("bench-worker", eng, sched, store)
        worker.start()
        S["sqlite_journal_mode"] = store._conn().execute("PRAGMA journal_mode").fetchone()[0]
        log("store", S["sqlite_journal_mode"], store.db_path)
        opts = TranscribeOptions("auto", True)
        counter = [0]

        def make_job(wave) -> str:
            counter[0] += 1
            jid = f"bench-{counter[0]}"
            store.create(Job(jid, JobState.QUEUED, opts, Lane.BULK, time.time(), wave.shape[0] / SAMPLE_RATE_HZ), b"")
            return jid

        def submit(wave, jid=None) -> tuple[str, float]:
            t = time.perf_counter()
            jid = jid or make_job(wave)
            sched.put(WorkItem(jid, Lane.INTERACTIVE, opts, int(wave.shape[0]), audio=wave))
            return jid, t

        def wait_all(ids, timeout=60.0):
            deadline = time.monotonic() + timeout
            with cv:
                while not all(j in done_at for j in ids):
                    if time.monotonic() > deadline:
                        missing = [j for j in ids if j not in done_at][:3]
                        raise TimeoutError(
                            f"jobs not done: {missing} states={[store.get(j).state for j in missing]} "
                            f"worker_alive={worker.is_alive()} fatal={worker.fatal} queued={len(sched)}")
                    cv.wait(1.0)

        gpu = lambda clips: [torch.from_numpy(c).to(self.dev) for c in clips]  # noqa: E731
        # (1) idle latency, submit (incl. the durable store write) -> result
        for secs, clips in (("3s", self.clips3), ("10s", self.clips10), ("30s", self.clips30)):
            waves = gpu(clips)
            lat = []
            for i in range(self.args.n + 5):
                jid, t = submit(waves[i % len(waves)])
                wait_all([jid])
                if i >= 5:
                    lat.append(done_at[jid] - t)
            S[f"idle_latency_{secs}"] = stats_ms(lat)
            log("idle", secs, S[f"idle_latency_{secs}"])
        # store write alone (what a submit pays for durability)
        S["store_create_ms"] = stats_ms(self.timeit(lambda: make_job(waves[0]), 50, warm=2))
        # (2) throughput: N concurrent clips of each length (store rows made before the clock starts)
        for secs, clips in (("10s", self.clips10), ("3s", self.clips3), ("30s", self.clips30)):
            n = self.args.concurrent if secs != "30s" else self.args.concurrent // 2
            waves = gpu(clips)
            for rep in range(2):  # first rep warms, second is reported
                ids = [make_job(waves[i % 8]) for i in range(n)]
                t = time.perf_counter()
                starts = [submit(waves[i % 8], ids[i])[1] for i in range(n)]
                wait_all(ids)
                wall = time.perf_counter() - t
            lat = [done_at[j] - s for j, s in zip(ids, starts)]
            audio_s = n * float(secs[:-1])
            S[f"throughput_{secs}"] = {"clips": n, "wall_s": round(wall, 3),
                                       "clips_per_s": round(n / wall, 1),
                                       "x_realtime": round(audio_s / wall, 1),
                                       "latency": stats_ms(lat)}
            log("throughput", secs, S[f"throughput_{secs}"])
        # the full submit path with concurrency: 16 threads creating store rows + enqueueing
        waves = gpu(self.clips10)
        n = self.args.concurrent
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(16) as ex:
            t = time.perf_counter()
            subs = list(ex.map(lambda i: submit(waves[i % 8]), range(n)))
            wait_all([j for j, _ in subs])
            wall = time.perf_counter() - t
        S["throughput_10s_with_durable_submit"] = {"clips": n, "wall_s": round(wall, 3),
                                                   "clips_per_s": round(n / wall, 1)}
        log("with submit", S["throughput_10s_with_durable_submit"])
        worker.stop()
        worker.join(5)
        S["worker_batches"] = worker.batches
        if self.cuda:
            S["peak_gpu_mem_gib"] = round(torch.cuda.max_memory_allocated(self.dev) / 2**30, 2)
        # (3) batch-size sweep, engine alone (features + encoder + CTC + decode, waves on device)
        sweep = S.setdefault("batch_sweep_10s", {})
        for b in (1, 2, 4, 8, 16, 32, 64, 128):
            if self.cuda:  # captured as the worker would after the first such batch
                self.want_graphs(eng, [(b, self.clips10[0])])
            waves = gpu([self.clips10[i % 8] for i in range(b)])
            ts = self.timeit(lambda: eng.transcribe(waves, [opts] * b), self.args.n)
            st = stats_ms(ts)
            st["clips_per_s"] = round(b * 1e3 / st["p50_ms"], 1)
            sweep[str(b)] = st
            log("sweep", b, st)
        # (4) length sweep at batch 1 and 64
        ls = S.setdefault("length_sweep", {})
        for secs, clips in (("3s", self.clips3), ("10s", self.clips10), ("30s", self.clips30)):
            for b in (1, 64):
                waves = gpu([clips[i % 8] for i in range(b)])
                st = stats_ms(self.timeit(lambda: eng.transcribe(waves, [opts] * b), self.args.n))
                st["clips_per_s"] = round(b * 1e3 / st["p50_ms"], 1)
                ls[f"{secs}_b{b}"] = st
        log("length sweep", ls)
        # where the time goes for one batch of 64 (CUDA events)
        if self.cuda:
            S["profile_b64_10s"] = self.profile(eng, gpu([self.clips10[i % 8] for i in range(64)]), opts)
            S["profile_b1_10s"] = self.profile(eng, gpu(self.clips10[:1]), opts)
            log("profile", S["profile_b64_10s"], S["profile_b1_10s"])

    def op_profile(self, eng, waves, opts) -> tuple[str, dict]:
        """torch.profiler over one uncaptured B=64 forward: the op table, and GPU kernel time by
        kind (GEMM, attention, inductor's fused kernels, the rest) with shares."""
        from torch.profiler import ProfilerActivity, profile

        with torch.inference_mode():
            f, _, frames = eng.features(waves)
            x, lens, ban = eng.encoder_inputs(f, frames, [opts] * len(waves))
            eng.core(x, lens, ban)
            self.sync()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                eng.core(x, lens, ban)
                self.sync()
        kinds: dict[str, float] = {}
        for ev in prof.key_averages():
            if str(getattr(ev, "device_type", "")).split(".")[-1] != "CUDA":
                continue
            us = float(getattr(ev, "device_time_total", 0) or getattr(ev, "cuda_time_total", 0))
            name = ev.key.lower()
            kind = ("gemm" if any(k in name for k in ("gemm", "cutlass", "xmma", "sm90", "cublas"))
                    else "attention" if any(k in name for k in ("fmha", "flash", "attention", "cudnn"))
                    else "triton_fused" if name.startswith("triton") else "other")
            kinds[kind] = kinds.get(kind, 0.0) + us
        total = sum(kinds.values()) or 1.0
        shares = {k: {"ms": round(v / 1e3, 3), "share": round(v / total, 3)} for k, v in kinds.items()}
        shares["total_ms"] = round(total / 1e3, 3)
        table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=25, max_name_column_width=60)
        return table, shares

    def profile(self, eng, waves, opts) -> dict:
        def ev():
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e

        res: dict[str, list[float]] = {}
        for _ in range(self.args.n):
            t0 = time.perf_counter()
            e0 = ev()
            f, _, frames = eng.features(waves)
            e1 = ev()
            x, lens, ban = eng.encoder_inputs(f, frames, [opts] * len(waves))
            e2 = ev()
            ids = eng.forward_ids(x, lens, ban)
            e3 = ev()
            eng.decode(ids, lens)
            e4 = ev()
            self.sync()
            wall = time.perf_counter() - t0
            for k, (a, b) in {"features": (e0, e1), "queries+pad": (e1, e2), "encoder_ctc_graph": (e2, e3),
                              "greedy+d2h+detok": (e3, e4)}.items():
                res.setdefault(k, []).append(a.elapsed_time(b))
            res.setdefault("wall", []).append(wall * 1e3)
        return {k: round(statistics.median(v), 3) for k, v in res.items()}

    # ------------------------------------------------------------------ one-hour recording
    def long_audio(self):
        """A 1-hour recording: silero-vad segments (CPU, then GPU) -> pieces through the real worker."""
        from pipeline.serving.broker_sqlite import JobStore
        from pipeline.serving.scheduler import Scheduler, WorkItem
        from pipeline.domain.types import Job, JobState, Lane, TranscribeOptions
        from pipeline.audio.vad import Segmenter
        from pipeline.serving.worker import Worker

        L = R.setdefault("long_audio", {})
        minutes = self.args.long_minutes
        rng = np.random.default_rng(7)
        parts = []
        for i in range(minutes * 6):  # 10 s blocks: speech of 4..9 s, then silence
            speech = speechlike(float(rng.uniform(4, 9)), 5000 + i)
            parts += [speech, np.zeros(int(SAMPLE_RATE_HZ * 10) - len(speech), np.float32)]
        wave = np.concatenate(parts)
        L["audio_seconds"] = round(len(wave) / SAMPLE_RATE_HZ, 1)
        seg = Segmenter(max_segment_s=30.0).load()
        t = time.perf_counter()
        cpu_spans = seg.split(torch.from_numpy(wave))
        L["vad_cpu_s"] = round(time.perf_counter() - t, 2)
        L["segments_cpu"] = len(cpu_spans)
        spans = cpu_spans
        if self.cuda:
            gseg = Segmenter(max_segment_s=30.0, device=str(self.dev)).load()
            gseg.split(torch.from_numpy(wave[: SAMPLE_RATE_HZ * 60]))  # warm-up: kernels, allocator
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                spans = gseg.split(torch.from_numpy(wave))
                ts.append(time.perf_counter() - t)
            L["vad_gpu_s"] = round(min(ts), 3)
            L["vad_gpu_runs_s"] = [round(x, 3) for x in ts]
            L["segments_gpu"] = len(spans)
            cover = lambda sp: sum(x.end - x.start for x in sp)  # noqa: E731
            mask = np.zeros(len(wave), bool)
            for x in cpu_spans:
                mask[x.start:x.end] = True
            other = np.zeros(len(wave), bool)
            for x in spans:
                other[x.start:x.end] = True
            L["vad_gpu_vs_cpu_coverage_disagreement"] = round(float((mask ^ other).sum() / max(cover(cpu_spans), 1)), 5)
            p_cpu, p_gpu = seg.speech_probs(wave), gseg.speech_probs(wave)
            L["vad_gpu_vs_cpu_window_flips"] = int(((p_cpu > 0.5) != (p_gpu > 0.5)).sum())
            L["vad_windows"] = len(p_cpu)
            gseg.close()
        L["vad_s"] = L.get("vad_gpu_s", L["vad_cpu_s"])
        L["segments"] = len(spans)
        eng = getattr(self, "serving_engine", None) or self.engine(
            self.args.dtype, graphs=self.cuda, fp32_residual=bool(self.args.fp32_residual))[0]
        store = JobStore(tempfile.mkdtemp(prefix="svlong-"))
        sched = Scheduler(100_000, max_batch=self.args.max_batch, max_wait_s=self.args.max_wait_ms / 1e3)
        finished = threading.Event()
        opts = TranscribeOptions("auto", True)
        jid = "long-1"
        store.create(Job(jid, JobState.QUEUED, opts, Lane.BULK, time.time(), len(wave) / SAMPLE_RATE_HZ), b"")
        store.feed.on_finished(lambda j: finished.set() if store.get(j).state is JobState.DONE else None)
        worker = Worker("long-worker", eng, sched, store)
        worker.start()
        gpu_wave = torch.from_numpy(wave).to(self.dev)
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.dev)
        t = time.perf_counter()
        for n, sp in enumerate(spans):
            sched.put(WorkItem(jid, Lane.BULK, opts, sp.end - sp.start, audio=gpu_wave[sp.start:sp.end],
                               piece=n, pieces=len(spans), start_s=sp.start / SAMPLE_RATE_HZ))
        ok = finished.wait(300)
        L["engine_s"] = round(time.perf_counter() - t, 3)
        worker.stop()
        worker.join(5)
        job = store.get(jid)
        L["done"] = ok and job.state is JobState.DONE
        L["result_segments"] = len(job.result.segments) if job.result else 0
        L["engine_audio_s_per_s"] = round(L["audio_seconds"] / L["engine_s"], 1)
        L["end_to_end_audio_s_per_s"] = round(L["audio_seconds"] / (L["engine_s"] + L["vad_s"]), 1)
        if self.cuda:
            L["peak_gpu_mem_gib"] = round(torch.cuda.max_memory_allocated(self.dev) / 2**30, 2)
        log("long audio", L)

    # ------------------------------------------------------------------ report
    def table(self):
        B, S = R.get("baseline", {}), R.get("engine", {})
        a = B.get("A_generate_1x10s", {})
        b = B.get("B_generate_list64_bs64", {})
        lines = ["", "| measure | baseline A (generate, 1 req) | baseline B (generate, list 64) | engine | engine / A | engine / B |",
                 "|---|---|---|---|---|---|"]

        def ratio(x, y):
            return f"{x / y:.1f}x" if x and y else "-"

        il = S.get("idle_latency_10s", {})
        lines.append(f"| 10 s clip, idle, p50 latency | {a.get('p50_ms')} ms | - | {il.get('p50_ms')} ms | "
                     f"{ratio(a.get('p50_ms'), il.get('p50_ms'))} lower | - |")
        lines.append(f"| 10 s clip, idle, p95 latency | {a.get('p95_ms')} ms | - | {il.get('p95_ms')} ms | - | - |")
        tp = S.get("throughput_10s", {})
        lines.append(f"| 512 x 10 s concurrent: clips/s | {a.get('clips_per_s')} | {b.get('clips_per_s')} | "
                     f"{tp.get('clips_per_s')} | {ratio(tp.get('clips_per_s'), a.get('clips_per_s'))} | "
                     f"{ratio(tp.get('clips_per_s'), b.get('clips_per_s'))} |")
        lines.append(f"| 512 x 10 s: x real time | {ratio(10e3, a.get('p50_ms')) if a else '-'} | "
                     f"{round(b.get('clips_per_s', 0) * 10)}x | {tp.get('x_realtime')}x | - | - |")
        lines.append(f"| 512 x 10 s: p95 latency under load | - | - | {tp.get('latency', {}).get('p95_ms')} ms | - | - |")
        st = S.get("startup", {})
        lines.append(f"| start-up (engine + graph capture + warm-up) | - | - | {st.get('startup_total_s')} s "
                     f"({st.get('graphs')} graphs, capture {st.get('graph_capture_s')} s) | - | - |")
        lines += ["", "| batch | p50 ms | clips/s |", "|---|---|---|"]
        for k, v in S.get("batch_sweep_10s", {}).items():
            lines.append(f"| {k} | {v['p50_ms']} | {v['clips_per_s']} |")
        lines += ["", "| length x batch | p50 ms | clips/s |", "|---|---|---|"]
        for k, v in S.get("length_sweep", {}).items():
            lines.append(f"| {k} | {v['p50_ms']} | {v['clips_per_s']} |")
        lines += ["", "engines (eager vs fused): " + json.dumps(
            {k: v for k, v in R.get("engines", {}).items() if "op_profile" not in k}),
            "", "long audio: " + json.dumps(R.get("long_audio", {})),
                  "fidelity: " + json.dumps(R.get("fidelity", {})),
                  "errors: " + json.dumps({k: v[-300:] for k, v in R["errors"].items()})]
        text = "\n".join(lines)
        (self.out / "table.md").write_text(text)
        print(text, flush=True)


def settle(engine, timeout_s: float = 600.0) -> None:
    """Run the engine's background work (compile, wanted graph captures) to the end, here."""
    deadline = time.monotonic() + timeout_s
    while engine.has_idle_work and time.monotonic() < deadline:
        if not engine.idle_step():
            time.sleep(0.01)


def text_units(text: str) -> list[str]:
    """Tags and single characters: comparable units of two transcripts."""
    import re

    return re.findall(r"<\|[^|]*\|>|\S", text)


def token_agreement(a: list, b: list) -> float:
    """1 - normalised edit distance between two token sequences."""
    if a == b:
        return 1.0
    prev = list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1]))
        prev = cur
    return 1.0 - prev[-1] / max(len(a), len(b), 1)


def main():
    import faulthandler
    import logging

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("sensevoice.engine").setLevel(logging.INFO)
    faulthandler.dump_traceback_later(float(os.environ.get("BENCH_STACKS_AFTER_S", "400")), exit=False)
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="full")
    ap.add_argument("--model-dir", default="/tmp/sensevoice-full")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float16")
    ap.add_argument("--fp32-residual", type=int, default=1)
    ap.add_argument("--n", type=int, default=30, help="timed repetitions")
    ap.add_argument("--concurrent", type=int, default=512)
    ap.add_argument("--max-batch", type=int, default=128)
    ap.add_argument("--max-wait-ms", type=float, default=2.0)
    ap.add_argument("--graph-max-seconds", type=float, default=30.0)
    ap.add_argument("--fidelity-clips", type=int, default=256)
    ap.add_argument("--long-minutes", type=int, default=60)
    ap.add_argument("--skip", default="")
    ap.add_argument("--eager", action="store_true", help="serve the eager reference, not the fused blocks")
    ap.add_argument("--cache-dir", default="/tmp/sv-cache", help="compiled kernels (inductor) go here")
    ap.add_argument("--budget-s", type=float, default=560.0, help="skip sections started after this")
    args = ap.parse_args()
    b = Bench(args)
    b.section("setup", b.setup)
    b.section("engines", b.engines)
    b.section("serving", b.serving)
    b.section("fidelity", b.fidelity)
    b.section("long_audio", b.long_audio)
    b.section("baselines", b.baselines)
    b.table()
    save(b.out)


if __name__ == "__main__":
    main()
