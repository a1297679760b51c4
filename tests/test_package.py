"""`pip install .` gives the whole package: every module of pipeline/, the UI's static files (found
by the installed UI), app_sensevoice, the `sensevoice` command, requirements.txt's pins.

The wheel is built from a copy of the sources (a build writes build/ and *.egg-info beside them),
with this venv's setuptools (no download), then installed with --target and run from elsewhere."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

SOURCES = ("pyproject.toml", "setup.py", "README.md", "requirements.txt", "app_sensevoice.py",
           "pipeline", "static")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(ROOT / name, src / name)
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation",
                    "--no-index", "-q", "-w", str(dist)], check=True, timeout=120)
    return next(dist.glob("*.whl"))


def test_wheel_holds_every_module_the_static_files_and_the_command(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "pipeline").rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules - names == set()  # every module, new sub-packages included
    static = {f"pipeline/static/{p.name}" for p in (ROOT / "static").iterdir() if p.is_file()}
    assert static and static - names == set()
    assert "app_sensevoice.py" in names
    assert not [n for n in names if n.startswith(("tests/", "bench/", "static/"))]
    info = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    entry_points = zipfile.ZipFile(wheel).read(info).decode()
    assert re.search(r"^sensevoice = pipeline\.entry:main$", entry_points, flags=re.M)


def test_dependencies_are_requirements_txt(wheel):
    meta = zipfile.ZipFile(wheel).read(next(n for n in zipfile.ZipFile(wheel).namelist()
                                            if n.endswith(".dist-info/METADATA"))).decode()
    requires = {line.split(": ", 1)[1] for line in meta.splitlines() if line.startswith("Requires-Dist: ")}
    pins = {line.strip() for line in (ROOT / "requirements.txt").read_text().splitlines()
            if line.strip() and not line.startswith("#")}
    assert requires == pins


def test_installed_package_runs_from_anywhere_and_finds_its_static_files(wheel, tmp_path):
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--target", str(target), str(wheel)], check=True, timeout=120)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {**os.environ, "PYTHONPATH": str(target)}
    r = subprocess.run([str(target / "bin" / "sensevoice"), "--help"], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "serve" in r.stdout and "transcribe" in r.stdout and "doctor" in r.stdout
    probe = ("import pipeline, app_sensevoice, pipeline.web.ui as ui; "
             "print(pipeline.__file__); print(app_sensevoice.__file__); print(ui.STATIC)")
    r = subprocess.run([sys.executable, "-c", probe], cwd=elsewhere, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    package, app, static = map(Path, r.stdout.split())
    assert package.is_relative_to(target) and app.is_relative_to(target)
    assert static == target / "pipeline" / "static" and (static / "richtext.js").is_file()
