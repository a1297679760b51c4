"""The batch CLI on the GPU exits 0 after a clean run (issue 42: two runs on an H200 wrote all their
outputs and then died with status 139 and 134). Runs with the other ``requires_cuda`` tests
(bench/gpu_engine.sh startup); the CPU test of the threads left is tests/test_cli_threads.py."""

from __future__ import annotations

import pytest

from tests.test_cli_threads import run_cli, write_clips


@pytest.mark.requires_cuda
@pytest.mark.parametrize("background_compile", [False, True])
def test_the_cli_on_100_files_on_the_gpu_exits_0(tiny_dir, tmp_path, monkeypatch, background_compile):
    """100 files through the local mode on CUDA (fp16, graphs as the CLI plans them): status 0, every
    output written, no thread of the run left after main, no abort message from C++ at exit. With
    the background compile asked for too: the compile is joined or cancelled before exit."""
    if background_compile:
        monkeypatch.setenv("SENSEVOICE_BACKGROUND_COMPILE", "true")
    write_clips(tmp_path / "in", 100, seconds=2.0)
    rc, left, err = run_cli([str(tmp_path / "in"), "--output-dir", str(tmp_path / "out"), "--format",
                             "txt,srt", "--device", "cuda", "--model", str(tiny_dir), "--quiet"],
                            background_compile=background_compile)
    assert rc == 0, err[-3000:]
    assert len(list((tmp_path / "out").glob("*.txt"))) == 100
    assert len(list((tmp_path / "out").glob("*.srt"))) == 100
    assert "terminate called" not in err and "Segmentation fault" not in err, err[-3000:]
    assert left == [], f"threads still running after main returned: {left}"
