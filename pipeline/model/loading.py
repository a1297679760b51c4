"""Load SenseVoiceSmall: resolve the model directory (local, demo, or hub), build an engine from it
(:func:`load_engine`: the project's own loader, :mod:`pipeline.model.fast_load`, wherever it knows
the directory; funasr otherwise), and keep funasr's own ``AutoModel.generate`` as the reference path
for equivalence tests.

Nothing here runs at import time; funasr is imported lazily, and only when it is needed: its import
and ``AutoModel`` took ~12-20 s of a server's start-up on a CPU, where the own loader takes ~0.1 s.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

from pipeline.domain.errors import ModelUnavailable
from pipeline.model.model_files import REQUIRED_FILES, read_state_dict

if TYPE_CHECKING:
    import numpy as np

    from pipeline.config import Settings
    from pipeline.model.engine import SenseVoiceEngine
    from pipeline.domain.types import TranscribeOptions

logger = logging.getLogger("sensevoice.model")

HUB_HOST = "www.modelscope.cn"  # where funasr downloads iic/SenseVoiceSmall
HUB_PORT = 443


@dataclass(frozen=True)
class ModelSource:
    """A resolved, local model directory and what it is."""

    path: Path
    name: str  # what the user asked for
    is_demo: bool


DEMO_NAME = "demo (hand-set weights, not a real model)"


def describe_model(source: ModelSource | None, settings: "Settings") -> tuple[str, bool]:
    """(name, is_demo) of the model a process serves, as /readyz and the UI say it: its resolved
    model, or (no model here: an api process) the settings it was started with (``--demo``),
    which its workers share."""
    demo = source.is_demo if source is not None else settings.engine.demo
    if demo:
        return DEMO_NAME, True
    return (source.name if source is not None else settings.engine.model), False


def _looks_like_model_dir(path: Path) -> bool:
    return path.is_dir() and all((path / f).exists() for f in REQUIRED_FILES)


def _hub_cache_candidates(name: str) -> list[Path]:
    root = Path(os.environ.get("MODELSCOPE_CACHE", Path.home() / ".cache" / "modelscope" / "hub"))
    return [root / "models" / name, root / name]


def hub_reachable(timeout_s: float) -> bool:
    """A TCP connect to the hub, bounded by ``timeout_s`` (modelscope itself retries ~22 s)."""
    try:
        with socket.create_connection((HUB_HOST, HUB_PORT), timeout=timeout_s):
            return True
    except OSError:
        return False


def resolve_model(settings: "Settings") -> ModelSource:
    """Turn ``--model``/``--demo`` into a local directory, failing fast with a clear message."""
    if settings.engine.demo:
        from pipeline.model.demo import ensure_model_dir

        path = ensure_model_dir("demo", cache_root=Path(settings.server.cache_dir) / "models")
        return ModelSource(path=Path(path), name="demo", is_demo=True)
    path = Path(settings.engine.model).expanduser()
    if path.exists():
        if not _looks_like_model_dir(path):
            missing = [f for f in REQUIRED_FILES if not (path / f).exists()]
            raise ModelUnavailable(
                f"{path} is not a SenseVoiceSmall model directory (missing: {', '.join(missing)})"
            )
        from pipeline.model.demo import is_demo_model

        return ModelSource(path=path, name=settings.engine.model, is_demo=is_demo_model(path))
    for cached in _hub_cache_candidates(settings.engine.model):
        if _looks_like_model_dir(cached):
            logger.info("using cached hub model %s", cached)
            return ModelSource(path=cached, name=settings.engine.model, is_demo=False)
    if "/" not in settings.engine.model:
        raise ModelUnavailable(f"model {settings.engine.model!r}: no such directory and not a hub name")
    if not hub_reachable(settings.engine.hub_timeout_s):
        raise ModelUnavailable(
            f"cannot reach the model hub ({HUB_HOST}) to download {settings.engine.model!r} and it is "
            "not in the local cache. Connect to the internet once, or pass a local model "
            "directory with --model DIR (SENSEVOICE_MODEL=DIR), or try the app offline with --demo."
        )
    return ModelSource(path=_download(settings.engine.model), name=settings.engine.model, is_demo=False)


def hotword_checker(settings: "Settings") -> Callable[[tuple], None]:
    """A check of a hotword list against the model's vocabulary (raises InvalidOption naming a
    term it cannot spell), read from the model directory on first use; a no-op where this
    process cannot read it (an api-only host: the engine leaves such terms out)."""
    lock = threading.Lock()
    held: list = []

    def check(hotwords: tuple) -> None:
        with lock:
            if not held:
                held.append(_speller(settings))
        if held[0] is not None:
            held[0].check(hotwords)

    return check


def _speller(settings: "Settings"):
    """The configured model's vocabulary when it is on this machine (never the network)."""
    from pipeline.model.hotwords import BPE_FILE, Speller

    try:
        if settings.engine.demo:
            path = resolve_model(settings).path / BPE_FILE
        else:
            path = Path(settings.engine.model).expanduser() / BPE_FILE
        return Speller(path) if path.is_file() else None
    except Exception as e:  # no vocabulary here: the engine's lenient spelling is the net
        logger.info("hotwords are not checked against the vocabulary here: %s", e)
        return None


def _download(name: str) -> Path:
    from modelscope import snapshot_download

    try:
        return Path(snapshot_download(name))
    except Exception as e:  # modelscope raises many types; all mean "could not download"
        raise ModelUnavailable(f"downloading {name!r} from the model hub failed: {e}") from e


class _NoHubNotice(logging.Filter):
    """Drops funasr's "download models from model hub: ms", which it logs (on the root logger) for
    every model it builds, a local directory too: in demo mode the start-up log said it would
    download. (A real download is :func:`_download`'s, with modelscope's own log.)"""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("download models from model hub")


def load_engine(model_dir: str | Path, device: str, dtype: str = "float16", *, fp32_residual: bool = False,
                fused: bool = True, cache_dir: Path | None = None,
                automodel: Callable[[], object] | None = None) -> "SenseVoiceEngine":
    """One device's engine for ``model_dir``. With ``fused`` (the default) the fused encoder is built
    straight from the directory, without funasr (compiled on CUDA; on a CPU its functions run
    uncompiled: the same tokens as funasr's, ``tests/test_engine.py``); a directory that loader does
    not know, or ``fused=False`` (the eager reference), loads through funasr's ``AutoModel`` --
    ``automodel()`` when given (one AutoModel shared by the devices of a process), else loaded here."""
    from pipeline.model.engine import SenseVoiceEngine

    cuda = device.startswith("cuda")
    if fused:
        engine = SenseVoiceEngine.from_model_dir_fast(model_dir, device, dtype, fp32_residual=fp32_residual,
                                                      cache_dir=cache_dir, compile=cuda)
        if engine is not None:
            return engine
        logger.info("%s: not a directory the own loader knows; loading through funasr", model_dir)
    am = automodel() if automodel is not None else load_automodel(model_dir, device)
    return SenseVoiceEngine.from_automodel(am, device, dtype, fp32_residual=fp32_residual,
                                           fused=cuda and fused, cache_dir=cache_dir)


def load_automodel(model_dir: str | Path, device: str):
    """funasr's AutoModel for a local directory: no hub, no update check, no dither, SenseVoice only."""
    import torch
    from funasr import AutoModel

    threads = torch.get_num_threads()
    quiet = _NoHubNotice()
    logging.getLogger().addFilter(quiet)
    try:
        am = AutoModel(
            model=str(model_dir),
            device=device,
            disable_update=True,
            disable_pbar=True,
            disable_log=True,
            log_level="ERROR",
            ncpu=threads,  # funasr's default of 4 oversubscribes small machines
            frontend_conf={"dither": 0.0},
        )
    finally:
        logging.getLogger().removeFilter(quiet)
    _check_weights_loaded(am.model, Path(model_dir) / "model.pt")
    am.model.eval()
    return am


def _check_weights_loaded(model, weights: Path) -> None:
    """funasr silently keeps random weights on a mismatch; compare one tensor to be sure
    (memory-mapped: only that tensor is read, not the whole file a second time)."""
    import torch

    sd = read_state_dict(weights)
    name = "ctc.ctc_lo.weight"
    if name in sd:
        have = model.state_dict()[name].detach().float().cpu()
        if have.shape != sd[name].shape or not torch.equal(have, sd[name].float()):
            raise ModelUnavailable(f"{weights}: weights did not load into the model (config mismatch)")


def reference_generate(
    am, waves: Sequence["np.ndarray"], options: "TranscribeOptions"
) -> list[str]:
    """funasr's own path, one clip at a time: the baseline and the equivalence oracle."""
    out = []
    for w in waves:
        r = am.generate(
            input=w,
            language=options.language,
            use_itn=options.use_itn,
            ban_emo_unk=options.ban_emo_unk,
            batch_size=1,
        )
        out.append(r[0]["text"])
    return out
