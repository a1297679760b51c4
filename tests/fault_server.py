"""The real server (``app_sensevoice.main``) with a device fault injected into its engine, once.

    python tests/fault_server.py {fatal|hang|freeze} MARKER_FILE [app_sensevoice args...]

If MARKER_FILE does not exist it is created and the engine's batches in the worker raise a fatal CUDA error
("illegal memory access", which poisons a real CUDA context) or hangs forever. When the supervisor
restarts this script the marker exists and the server runs clean, as a restarted process would.
``freeze`` blocks the event loop instead (as a blocking read on the loop would) on a GET /freeze.
The server runs without its UI unless SENSEVOICE_UI says otherwise: the faults are the engine's and
the event loop's, and gradio's import and UI build were several seconds of every (re)start.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import app_sensevoice  # noqa: E402
from pipeline.model.engine import SenseVoiceEngine  # noqa: E402


def freeze_on_request() -> None:
    from pipeline.web.middleware import FastPolls

    clean = FastPolls.__call__

    async def call(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/freeze":
            time.sleep(3600)  # blocks the event loop: nothing else is served
        await clean(self, scope, receive, send)

    FastPolls.__call__ = call


def inject(fault: str) -> None:
    if fault == "freeze":
        freeze_on_request()
        return
    clean = SenseVoiceEngine.transcribe_async

    class Faulty:
        """A batch the device never completes: its result hangs or raises, as a real GPU fault
        surfaces when the finisher thread waits for the batch."""

        def result(self):
            time.sleep(3600 if fault == "hang" else 1.0)  # long enough for more jobs to queue behind
            raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")

    def transcribe_async(self, waves, options):
        if not threading.current_thread().name.startswith("sensevoice-worker"):
            return clean(self, waves, options)  # start-up warm-up runs clean
        return Faulty()

    SenseVoiceEngine.transcribe_async = transcribe_async


if __name__ == "__main__":
    os.environ.setdefault("SENSEVOICE_UI", "false")
    fault, marker, *args = sys.argv[1:]
    if not Path(marker).exists():
        Path(marker).touch()
        inject(fault)
    sys.exit(app_sensevoice.main(args))
