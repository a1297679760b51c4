"""Admission of long recordings: a bounded backlog of jobs waiting to be split and run.

Long recordings are accepted, then split by VAD in the background and run as pieces. Without a
bound, 42 uploads of 30 min of silence (14 KB FLACs each) in 45 s took the server from 2.4 to
6.7 GB while the queue depth said 0: the jobs waited in an unbounded executor holding their audio.
Now each long job counts (one job, its audio seconds) from acceptance until it is finished, a long
upload beyond either bound is refused at once (503 backlog_full + Retry-After), and the waiting
audio lives on disk (the service memory-maps it), not in memory.

Per-client limits count a client by :func:`client_key`: its address, or (where the operator asks)
the network it is in -- one host of a /24 gets as many as the whole /24 when counted by /24, so
eight addresses of one network no longer hold eight clients' share (issue 36).
"""

from __future__ import annotations

import ipaddress
import threading

from pipeline.domain.errors import BacklogFull


class Backlog:
    """Long jobs accepted and not yet finished: how many, and how many audio seconds."""

    def __init__(self, max_jobs: int, max_seconds: float, retry_after_s: int = 30):
        self.max_jobs = max_jobs
        self.max_seconds = max_seconds  # s of audio
        self.retry_after_s = retry_after_s
        self._jobs: dict[str, float] = {}  # job id -> audio seconds
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise BacklogFull now if no job could be admitted (a cheap answer before decoding)."""
        with self._lock:
            self._check(0.0)

    def admit(self, job_id: str, seconds: float, force: bool = False) -> None:
        """Count a long job in, or raise BacklogFull. ``force`` admits recovered jobs beyond the
        bounds (an accepted job is never dropped)."""
        with self._lock:
            if not force:
                self._check(seconds)
            self._jobs[job_id] = seconds

    def release(self, job_id: str) -> bool:
        """The job finished (or was never stored): it no longer counts. True if it did."""
        with self._lock:
            return self._jobs.pop(job_id, None) is not None

    def __contains__(self, job_id: str) -> bool:
        with self._lock:
            return job_id in self._jobs

    def snapshot(self) -> tuple[int, float]:
        """(jobs, audio seconds) in the backlog, for the metrics."""
        with self._lock:
            return len(self._jobs), sum(self._jobs.values())

    def _check(self, seconds: float) -> None:
        jobs, total = len(self._jobs), sum(self._jobs.values())
        if jobs >= self.max_jobs:
            raise BacklogFull(f"{jobs} long recordings are waiting to be transcribed, the most this "
                              f"server holds; try again in {self.retry_after_s} s",
                              retry_after=self.retry_after_s)
        if total + seconds > self.max_seconds:
            raise BacklogFull(f"{total / 3600:.1f} h of long recordings are waiting to be "
                              f"transcribed (the limit is {self.max_seconds / 3600:g} h); try again "
                              f"in {self.retry_after_s} s", retry_after=self.retry_after_s)


def client_key(address: str, prefix_v4: int = 32, prefix_v6: int = 128) -> str:
    """The name a per-client limit counts ``address`` under: the address itself, or with a
    prefix shorter than the full address its network (``"192.0.2.0/24"``). An IPv4 address
    mapped into IPv6 (``::ffff:192.0.2.7``, a dual-stack socket) counts as the IPv4 one. What
    is not an IP address (a test client's name, a Unix socket's '') is its own key, unchanged."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])  # a zone (fe80::1%eth0) is no part
    except ValueError:
        return address
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    prefix = prefix_v4 if ip.version == 4 else prefix_v6
    if prefix >= ip.max_prefixlen:
        return str(ip)
    return str(ipaddress.ip_network(f"{ip}/{prefix}", strict=False))
