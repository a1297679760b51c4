"""`make run` (issue 23): ARGS="--port N" used to replace the default --demo silently; the demo model
is now kept unless ARGS names a model (or --demo itself)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def run_line(args: str | None) -> str:
    cmd = ["make", "-n", "-C", str(ROOT), "run"] + ([f"ARGS={args}"] if args is not None else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return [ln for ln in out.splitlines() if "app_sensevoice.py" in ln][-1].split()[1:]


@pytest.mark.skipif(not shutil.which("make"), reason="make not installed")
@pytest.mark.parametrize("args,expected", [
    (None, ["--demo"]),
    ("--port 9000", ["--demo", "--port", "9000"]),
    ("--model /models/sv", ["--model", "/models/sv"]),
    ("--model=iic/SenseVoiceSmall --port 1", ["--model=iic/SenseVoiceSmall", "--port", "1"]),
    ("--demo --port 2", ["--demo", "--port", "2"]),
])
def test_make_run_keeps_the_demo_unless_a_model_is_named(args, expected):
    assert run_line(args)[1:] == expected
