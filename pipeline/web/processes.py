"""How many web processes the embedded server runs, decided before anything heavy is imported.

``app_sensevoice.main`` asks this first: one process serves at once through
:class:`pipeline.web.early.EarlyApp` (torch and the UI imported while it answers), several are
pipeline/web/siblings.py's. On a host with no GPU driver the answer needs no torch import
(:func:`pipeline.config.default_device`)."""

from __future__ import annotations

import os
import socket

from pipeline.config import gpu_driver_present

AUTO_ON_GPU = 3  # web processes on a CUDA host: the owner (GPU loop, store) + 2 siblings (all public HTTP)


def web_processes(settings) -> int:
    """How many HTTP processes the embedded server runs (``web_processes``; 0 = auto: 3 on a CUDA
    host with 2 cores or more -- the GPU waits on the HTTP work there (H200, docs/BENCHMARKS.md:
    3 with the public connections on the two siblings only served 818 jobs/s, 2 served 508, 1
    about 200) -- else 1: on a CPU host the model needs the cores). Only the embedded topology's
    ``all`` role has siblings."""
    if settings.server.role != "all" or settings.broker.url or not hasattr(socket, "AF_UNIX"):
        return 1  # (siblings need Unix sockets and inherited descriptors: POSIX)
    if settings.server.web_processes > 0:
        return settings.server.web_processes
    # a host with a GPU driver counts as a CUDA host here, decided without importing torch (the
    # port answers while torch loads: pipeline/web/early.py); a set device is taken as it is
    device = settings.engine.device or ("cuda" if gpu_driver_present() else "cpu")
    if not device.startswith("cuda") or (os.cpu_count() or 1) < 2:
        return 1
    return AUTO_ON_GPU


def owner_accepts(settings, processes: int) -> bool:
    """Whether the owner accepts public connections beside its siblings (``web_owner_accepts``;
    auto: only when it has a single sibling -- with two or more, the GPU loop and the store's
    writer keep the owner's GIL to themselves: 818 jobs/s on the H200 against 508 for 2
    processes, and on two CPU cores 15,092 jobs in 20 s against 12,771 with the owner accepting)."""
    choice = settings.server.web_owner_accepts
    return choice if choice is not None else processes <= 2


SHARED_LIMITS = ("auth_failures_per_client",)  # per server, but counted by each process


def share_limits(settings, processes: int) -> None:
    """Make the per-server limits each web process counts on its own (a client's failed sign-ins)
    its share of the configured whole, so that ``processes`` processes bound a guessing client as
    configured, not ``processes`` times over (0 = no limit stays 0). The siblings get the owner's
    shares (``WebSiblings``' environment). Upload slots stay per process: each has its own GIL
    and memory (``max_concurrent_uploads``)."""
    if processes <= 1:
        return
    for name in SHARED_LIMITS:
        whole = getattr(settings.limits, name)
        if whole > 0:
            setattr(settings.limits, name, -(-whole // processes))
