"""One JSON view of a job for REST, the UI, the event streams and exports, and the encoded bodies of
finished jobs that repeated polls reuse."""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from dataclasses import dataclass, replace

import orjson

from pipeline.config import Settings
from pipeline.domain.redaction import redactions_of
from pipeline.domain.review import result_with_review, review_json
from pipeline.domain.types import Job, JobState
from pipeline.serving.health import Health
from pipeline.serving.job_view import JobView
from pipeline.web.links import expiry, job_links, link_key, sign

SEGMENTING = re.compile(r"^segmenting(?: (\d+)%)?$")
PIECES = re.compile(r"^segment (\d+) of (\d+)$")
FINAL = (JobState.DONE, JobState.FAILED, JobState.PURGED)


def job_json(job: Job, retention_hours: float | None = None) -> dict:
    """A job's JSON; with ``retention_hours``, a finished job's ``expires_at`` (unix s: when its
    audio, result and review are deleted, its keep included; null until it ends)."""
    expires = expiry(job, retention_hours) if retention_hours is not None and job.state in FINAL else None
    return {
        "id": job.id,
        "status": job.state.value,
        "position": job.position,
        "filename": job.filename,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        **({"expires_at": expires} if retention_hours is not None else {}),
        "duration_s": job.duration_s,
        "audio_seconds": job.audio_seconds,
        "options": {"language": job.options.language, "use_itn": job.options.use_itn,
                    "ban_emo_unk": job.options.ban_emo_unk,
                    "split_channels": job.options.split_channels,
                    "word_timestamps": job.options.word_timestamps,
                    # the allow-list as it was sent ("zh,en"), only when one was
                    **({"languages": ",".join(job.options.languages)} if job.options.languages else {}),
                    # the hotwords one a line ("term" or "term:weight"), only when there are some
                    **({"hotwords": "\n".join(h.to_text() for h in job.options.hotwords)}
                       if job.options.hotwords else {}),
                    # the kinds of personal data masked ("card,phone"), only when asked for
                    **({"redact": ",".join(job.options.redact)} if job.options.redact else {}),
                    **({"redact_audio": job.options.redact_audio} if job.options.redact_audio else {}),
                    # speakers asked for on a mono recording (the count, its bounds), only when asked
                    **{k: getattr(job.options, k) for k in ("diarize", "speakers", "min_speakers",
                                                            "max_speakers") if getattr(job.options, k)}},
        "progress": job.meta.get("progress"),
        # the reviewer's text where corrected, the model's kept beside it (pipeline/domain/review.py)
        "result": result_with_review(job.result, job.meta.get("review")) if job.result else None,
        "review": review_json(job.meta.get("review")) if job.result else None,
        "error": {"code": job.error.code, "message": job.error.message} if job.error else None,
        # what was masked: each item's kind and time, never its value (only when asked for)
        **({"redactions": [r.to_dict() for r in redactions_of(job.result)] if job.result else None}
           if job.options.redact else {}),
    }


def job_body(job: Job, retention_hours: float | None = None) -> bytes:
    """The JSON of a job, as GET /api/jobs/{id} answers it (orjson: no framework encoder)."""
    return orjson.dumps(job_json(job, retention_hours))


class PollBodies:
    """Encoded JSON of finished jobs (it never changes again), so that repeated polls of a done job
    are a dictionary lookup. Keyed by the job snapshot itself: a new snapshot is encoded anew.

    A sibling web process also keeps the bodies its owner sends as jobs finish (``pushed``,
    pipeline/web/siblings.py): its polls of a finished job then read neither SQLite nor a thread.
    They come in order with the owner's changes of those jobs (a reviewer's edit sends the new
    body) and its purges (``forget``); bounded in count and bytes."""

    PUSHED_BYTES = 64 << 20  # a sibling's pushed bodies, at most (long calls' transcripts are large)

    def __init__(self, size: int = 2048, pushed_size: int = 8192, retention_hours: float | None = None):
        self.size, self.pushed_size = size, pushed_size
        self.retention_hours = retention_hours  # the bodies carry expires_at (None: they do not)
        self._bodies: OrderedDict[str, tuple[Job, bytes]] = OrderedDict()
        self._pushed: OrderedDict[str, bytes] = OrderedDict()
        self._pushed_bytes = 0
        self._lock = threading.Lock()

    def pushed(self, job_id: str) -> bytes | None:
        """A finished job's body as its owner sent it, or None (not sent, or dropped)."""
        return self._pushed.get(job_id)  # (one lookup: atomic under the GIL, no lock on the loop)

    def push(self, bodies: list[tuple[str, bytes]]) -> None:
        """Keep the bodies the owner sent (the newest of a job replaces the one before)."""
        with self._lock:
            for jid, body in bodies:
                old = self._pushed.pop(jid, None)
                self._pushed_bytes += len(body) - (len(old) if old is not None else 0)
                self._pushed[jid] = body
            while self._pushed and (len(self._pushed) > self.pushed_size
                                    or self._pushed_bytes > self.PUSHED_BYTES):
                self._pushed_bytes -= len(self._pushed.popitem(last=False)[1])

    def body(self, job: Job) -> bytes:
        if job.state not in (JobState.DONE, JobState.FAILED):
            return job_body(job, self.retention_hours)  # small, and its position/progress change
        with self._lock:
            hit = self._bodies.get(job.id)
            if hit is not None and hit[0] is job:
                self._bodies.move_to_end(job.id)
                return hit[1]
        body = job_body(job, self.retention_hours)
        with self._lock:
            self._bodies[job.id] = (job, body)
            while len(self._bodies) > self.size:
                self._bodies.popitem(last=False)
        return body

    def forget(self, job_ids) -> None:
        """Drop purged jobs: their transcripts must not outlive retention, not even in memory."""
        with self._lock:
            for jid in job_ids:
                self._bodies.pop(jid, None)
                old = self._pushed.pop(jid, None)
                if old is not None:
                    self._pushed_bytes -= len(old)


def stage_of(job: Job, model_state: str) -> dict:
    """The state a screen shows, from the job and the service's progress note."""
    progress = str(job.meta.get("progress") or "")
    out: dict = {"stage": job.state.value, "percent": None, "pieces_done": None, "pieces": None}
    if job.state in FINAL:
        return out
    seg = SEGMENTING.match(progress)
    pieces = PIECES.match(progress)
    if seg:
        out.update(stage="segmenting", percent=int(seg.group(1) or 0))
    elif pieces:  # a long recording's pieces: queued behind other work, or being transcribed
        out.update(pieces_done=int(pieces.group(1)), pieces=int(pieces.group(2)))
        waiting = job.state is JobState.QUEUED and (job.position or 0) > 1
        out["stage"] = "queued" if waiting else "transcribing"
    elif job.state is JobState.RUNNING:
        out["stage"] = "transcribing"
    if out["stage"] == "queued" and model_state in ("starting", "loading"):
        out["stage"] = "loading"
    return out


def page_query(job: Job, token: str, retention_hours: float) -> str:
    """``exp=...&sig=...`` for the page's own URL (``?job=ID&exp=...&sig=...``: a reload follows
    the job again), empty without a token. Until the job ends it expires a retention period after
    the job was accepted (a fixed value: the view does not change on every read); then as the
    job's other links do, when its retention ends."""
    key = link_key(token, "page")
    if not key:
        return ""
    if job.finished_at is not None:
        exp = expiry(job, retention_hours)
    else:
        exp = expiry(replace(job, finished_at=job.created_at), retention_hours)
    return f"exp={exp}&sig={sign(key, job.id, exp)}"


@dataclass(frozen=True)
class JobPages:
    """What a page shows of jobs (the UI, a job's event stream): the job view, the model's state and
    the signed links of a job."""

    settings: Settings
    view: JobView
    health: Health

    def live_view(self, job: Job) -> dict:
        """The job as the page shows it: the REST JSON, its stage, the model state, signed links."""
        settings = self.settings
        body = job_json(job, settings.limits.retention_hours)
        body.update(stage_of(job, self.health.state))
        body["model"] = self.health.state
        # the player and download links once there is something to play or download (their expiry
        # counts from the job's end)
        body["links"] = (job_links(job, settings.server.token, settings.limits.retention_hours,
                                   review=True) if job.state in FINAL else {})
        query = page_query(job, settings.server.token, settings.limits.retention_hours)
        body["links"]["events"] = f"/api/jobs/{job.id}/events" + (f"?{query}" if query else "")
        body["links"]["page"] = query
        return body
