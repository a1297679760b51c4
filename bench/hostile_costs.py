#!/usr/bin/env python3
"""What hostile uploads cost the server: wall time and peak memory of the server's decode step
(decoder call + resampling to 16 kHz, as ``Intake.decode`` does it) and of the
decoder process, for the inputs of the security review:

* ``flac_3h53_48k``: 3.89 h of silence, FLAC at 48 kHz (160 KB);
* ``flac_30m_48k``: 30 min of silence, FLAC at 48 kHz (26 KB);
* ``wav_1s_8001``: 1 s tone, 16-bit WAV at 8,001 Hz (a rate whose torchaudio kernel is huge);
* ``opus_5h``: 5 h of silence, Ogg/Opus at 6 kb/s (6.7 MB; built once, ~2 min of ffmpeg).

    python bench/hostile_costs.py [--dir /tmp/sensevoice-hostile] [--cases a,b] [--code DIR]

Each case runs in a fresh process (imports torch like the server, then ``Decoder(1)`` with the
server's default caps: 4 h, 200 MiB, 600 s; ``Resampler("cpu")``). Server peak: VmHWM of that
process after the call minus its VmRSS before (the peak is reset through /proc/self/clear_refs
first). Decoder peak: the largest VmHWM (and VmPeak, the address space) of any descendant,
sampled every 5 ms. CPU: user + system seconds of the calling thread (the server's share), and
of the decoder processes over their life (start-up included, ~0.15 s). ``--code DIR`` runs
against another checkout (e.g. ``git archive HEAD``), for before/after figures. Prints a Markdown table; writes JSON to $OUT/hostile_costs.json if set.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import threading
import time
import wave
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = ("flac_3h53_48k", "flac_30m_48k", "wav_1s_8001", "opus_5h")


def _ffmpeg(args: list[str], dst: Path) -> Path:
    if not dst.exists():
        tmp = dst.with_name(f".tmp.{dst.name}")
        subprocess.run(["ffmpeg", "-y", "-nostdin", "-loglevel", "error", *args, str(tmp)],
                       check=True)
        tmp.replace(dst)
    return dst


def build(case: str, media: Path) -> Path:
    """The file of ``case`` in ``media`` (made once)."""
    media.mkdir(parents=True, exist_ok=True)
    silence = ["-f", "lavfi", "-i", "anullsrc=r=48000:cl=mono"]
    if case == "flac_3h53_48k":
        return _ffmpeg([*silence, "-t", "14004", "-c:a", "flac", "-frame_size", "65535"],
                       media / "silence_3h53_48k.flac")
    if case == "flac_30m_48k":
        return _ffmpeg([*silence, "-t", "1800", "-c:a", "flac", "-frame_size", "65535"],
                       media / "silence_30m_48k.flac")
    if case == "opus_5h":
        return _ffmpeg([*silence, "-t", "18000", "-c:a", "libopus", "-b:a", "6k"],
                       media / "silence_5h.opus")
    if case == "wav_1s_8001":
        import numpy as np

        dst = media / "tone_1s_8001.wav"
        if not dst.exists():
            t = np.arange(8001) / 8001
            with wave.open(str(dst), "wb") as out:
                out.setnchannels(1)
                out.setsampwidth(2)
                out.setframerate(8001)
                out.writeframes((np.sin(2 * np.pi * 440 * t) * 16000).astype("<i2").tobytes())
        return dst
    raise ValueError(case)


def _status(pid: int | str) -> dict[str, int]:
    """VmRSS/VmHWM/VmPeak of a process, KiB ({} once it is gone)."""
    try:
        lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    except OSError:
        return {}
    return {k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in lines)
            if k in ("VmRSS", "VmHWM", "VmPeak")}


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def run_one(path: Path) -> dict:
    """In this process: the server's decode step on ``path``; costs as a dict."""
    import torch  # noqa: F401 - the server has it loaded

    from pipeline.audio.decode import Resampler
    from pipeline.audio.decoder_pool import Decoder

    decoder = Decoder(1, timeout_s=600.0)
    resampler = Resampler("cpu")
    decoder.warm_up()
    data = path.read_bytes()
    peaks = {"VmHWM": 0, "VmPeak": 0}
    done = threading.Event()

    def sample() -> None:
        # the decoders by name where the Decoder lists them (cheap), else by walking /proc
        pids = getattr(decoder, "pids", None)
        while not done.is_set():
            for pid in pids() if pids else _descendants(os.getpid()):
                status = _status(pid)
                for key in peaks:
                    peaks[key] = max(peaks[key], status.get(key, 0))
            time.sleep(0.005 if pids else 0.05)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    except OSError:
        pass
    before = _status("self")["VmRSS"]
    children_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu0 = time.thread_time()  # this thread: the call and the resampling, not the sampler
    t0 = time.perf_counter()
    try:
        audio = decoder(data, max_seconds=14400.0, max_bytes=200 * 1024 * 1024)
        wave16k = resampler(audio)
        outcome = (f"ok: {audio.seconds:.0f} s at {audio.sample_rate} Hz -> "
                   f"{wave16k.numel()} samples at 16 kHz")
    except Exception as e:  # noqa: BLE001 - reported
        outcome = f"{type(e).__name__}: {str(e)[:80]}"
    wall = time.perf_counter() - t0
    after = _status("self")["VmHWM"]
    server_cpu = time.thread_time() - cpu0
    time.sleep(0.05)
    done.set()
    sampler.join()
    decoder.close()  # reaps the decoders: their CPU time joins RUSAGE_CHILDREN
    children_after = resource.getrusage(resource.RUSAGE_CHILDREN)

    def cpu(a, b) -> float:
        return round(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime, 2)

    return {"file_bytes": len(data), "outcome": outcome, "wall_s": round(wall, 3),
            "server_cpu_s": round(server_cpu, 2),
            "decoder_cpu_s": cpu(children_before, children_after),
            "server_peak_mb": round((after - before) / 1024, 1),
            "decoder_peak_rss_mb": round(peaks["VmHWM"] / 1024, 1),
            "decoder_vmpeak_mb": round(peaks["VmPeak"] / 1024, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dir", type=Path, default=Path("/tmp/sensevoice-hostile"))
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--code", type=Path, default=ROOT, help="checkout to measure")
    parser.add_argument("--one", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        sys.path.insert(0, str(args.code))
        print(json.dumps(run_one(args.one)))
        return
    rows = {}
    for case in args.cases.split(","):
        path = build(case, args.dir)
        done = subprocess.run([sys.executable, __file__, "--code", str(args.code), "--one",
                               str(path)], capture_output=True, text=True, cwd=args.code)
        if done.returncode:
            rows[case] = {"outcome": f"bench process failed ({done.returncode}): "
                                     f"{done.stderr.strip()[-300:]}"}
        else:
            rows[case] = json.loads(done.stdout.strip().splitlines()[-1])
        print(case, rows[case], file=sys.stderr)
    columns = ("file_bytes", "outcome", "wall_s", "server_cpu_s", "decoder_cpu_s",
               "server_peak_mb", "decoder_peak_rss_mb", "decoder_vmpeak_mb")
    print("| input | " + " | ".join(columns) + " |")
    print("|" + "---|" * (len(columns) + 1))
    for case, row in rows.items():
        print(f"| {case} | " + " | ".join(str(row.get(c, "")) for c in columns) + " |")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "hostile_costs.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
