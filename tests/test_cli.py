"""The batch CLI runs the same pipeline: real files in, exports out, failures reported."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


def test_cli_transcribes_files_to_srt(demo_dir, clip_factory, tmp_path):
    good = clip_factory("mp3", 44100, 2)
    bad = tmp_path / "notes.wav"
    bad.write_text("not audio")
    out = tmp_path / "subs"
    r = subprocess.run([sys.executable, "-m", "pipeline.cli", str(good), str(bad), "--model", str(demo_dir),
                        "--device", "cpu", "--format", "srt", "--out", str(out), "--language", "en"],
                       cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1  # one input failed, and says so
    assert "notes.wav" in r.stderr
    srt = (out / f"{good.stem}.srt").read_text()
    assert srt.startswith("1\n00:00:00,000 --> ") and "speech" in srt
