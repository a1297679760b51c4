"""Start-up without a model hub fails fast, with a message that says what to do."""

from __future__ import annotations

import subprocess
import sys
import time

from tests.conftest import ROOT, free_port


def test_unreachable_hub_fails_fast_with_a_clear_message(tmp_path):
    t = time.monotonic()
    r = subprocess.run([sys.executable, str(ROOT / "app_sensevoice.py"), "--model", "iic/SenseVoiceSmall",
                        "--port", str(free_port()), "--data-dir", str(tmp_path)],
                       capture_output=True, text=True, timeout=60,
                       env={"MODELSCOPE_CACHE": str(tmp_path / "empty-cache"), "PATH": "/usr/bin:/bin",
                            "HOME": str(tmp_path), "GRADIO_ANALYTICS_ENABLED": "False"})
    assert r.returncode == 2
    assert time.monotonic() - t < 20  # modelscope alone retries for ~22 s
    assert "cannot reach the model hub" in r.stderr and "--demo" in r.stderr and "--model DIR" in r.stderr


def test_not_a_model_directory(tmp_path):
    r = subprocess.run([sys.executable, str(ROOT / "app_sensevoice.py"), "--model", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not a SenseVoiceSmall model directory" in r.stderr


def test_api_only_serves_the_api_without_importing_gradio(tmp_path):
    """--api-only / SENSEVOICE_UI=false: the REST API and probes, no /ui, and gradio never imported."""
    code = (
        "import sys; from fastapi.testclient import TestClient; from app_sensevoice import create_app;"
        "from pipeline.config import Settings;"
        f"app = create_app(Settings(ui=False, data_dir={str(tmp_path)!r}), start=False);"
        "c = TestClient(app, base_url='http://127.0.0.1');"  # an allowed Host
        "assert c.get('/healthz').status_code == 200;"
        "assert c.get('/ui/').status_code == 404;"
        "assert c.get('/api/jobs/nope').status_code == 404;"
        "assert 'gradio' not in sys.modules, 'gradio imported';"
        "print('ok')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


def test_loading_a_local_model_says_nothing_of_a_download(demo_dir, caplog):
    """Issue 23: in demo mode the start-up log said "download models from model hub: ms" (funasr
    logs it for a local directory too); nothing is downloaded, so nothing says so."""
    import logging

    from pipeline.model.loading import load_automodel

    with caplog.at_level(logging.INFO):
        load_automodel(demo_dir, "cpu")
    said = [r.getMessage() for r in caplog.records]
    assert said and not [m for m in said if "model hub" in m or "download" in m.lower()], said
