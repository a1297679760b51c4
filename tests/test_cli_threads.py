"""The batch CLI ends every thread it starts (issue 42): a run on the GPU crashed at exit (status
139 / 134) with threads of its own still in CUDA or the compiler. Here, on the CPU, the threads left
after ``main`` returns are listed in a fresh interpreter; the CUDA test of the same run is
tests/test_cli_cuda.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import wave
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

PROBE = """
import json, sys, threading
from pipeline.cli import main
rc = main(sys.argv[1:])
left = [t.name for t in threading.enumerate() if t is not threading.main_thread() and t.is_alive()]
print("THREADS " + json.dumps(left), flush=True)
sys.exit(rc)
"""


def write_clips(folder: Path, n: int, seconds: float = 1.0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    noise = (np.random.default_rng(0).standard_normal(int(16000 * seconds)) * 3000).astype("<i2")
    for i in range(n):
        with wave.open(str(folder / f"c{i:03d}.wav"), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(16000)
            w.writeframes(noise.tobytes())


def run_cli(args: list[str], timeout: float = 300, background_compile: bool = False
            ) -> tuple[int, list[str], str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if not background_compile:
        env.pop("SENSEVOICE_BACKGROUND_COMPILE", None)
    proc = subprocess.run([sys.executable, "-c", PROBE, *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT, env=env)
    line = next((x for x in proc.stdout.splitlines() if x.startswith("THREADS ")), None)
    assert line is not None, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.returncode, json.loads(line[len("THREADS "):]), proc.stderr


def test_a_local_run_leaves_no_thread_behind(tiny_dir, tmp_path):
    write_clips(tmp_path / "in", 12)
    rc, left, err = run_cli([str(tmp_path / "in"), "--output-dir", str(tmp_path / "out"), "--format",
                             "txt,srt", "--device", "cpu", "--model", str(tiny_dir)])
    assert rc == 0, err[-2000:]
    assert len(list((tmp_path / "out").glob("*.txt"))) == 12
    assert left == [], f"threads still running after main returned: {left}"


def test_a_run_with_a_failed_file_leaves_no_thread_behind(tiny_dir, tmp_path):
    write_clips(tmp_path / "in", 4)
    (tmp_path / "in" / "broken.wav").write_bytes(b"RIFF\x00\x00\x00\x00WAVEnot audio")
    rc, left, err = run_cli([str(tmp_path / "in"), "--output-dir", str(tmp_path / "out"), "--format",
                             "txt", "--device", "cpu", "--model", str(tiny_dir), "--quiet"])
    assert rc != 0 and "broken.wav" in err, err[-2000:]
    assert len(list((tmp_path / "out").glob("*.txt"))) == 4
    assert left == [], f"threads still running after main returned: {left}"
