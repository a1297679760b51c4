"""The service's snapshot of a job (what polls read from memory) after each committed change of
the embedded store: the store's own record, without reading it back after a finish."""

from __future__ import annotations

import time
import uuid

from pipeline.domain.types import Job, JobState, Lane, Segment, TranscribeOptions, Transcript
from pipeline.serving.broker import EmbeddedBroker
from pipeline.serving.job_view import JobView
from pipeline.serving.scheduler import Scheduler


def _transcript() -> Transcript:
    seg = Segment(language="en", emotion="HAPPY", events=("Laughter",), itn=True, text="Hi, there.",
                  start=0.0, end=1.25)
    return Transcript(text="Hi, there.", raw_text="<|en|><|HAPPY|><|Laughter|><|withitn|>Hi, there.",
                      segments=(seg,))


def test_a_finished_jobs_snapshot_is_the_stores_record_without_reading_it_back(tmp_path, monkeypatch):
    broker = EmbeddedBroker(tmp_path, Scheduler(10))
    view = JobView(broker)
    job = Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(), 1.25,
              filename="call.wav")
    broker.create(job, b"\0" * 100)
    view.remember(job)
    broker.mark_running([job.id])
    assert view.get_cached(job.id) == broker.get(job.id)  # started_at and attempts as stored
    reads = []
    real_get = broker.get
    monkeypatch.setattr(broker, "get", lambda jid: reads.append(jid) or real_get(jid))
    broker.finish_many([(job.id, _transcript())])
    assert reads == []  # the finish event carried what was written
    snapshot = view.get_cached(job.id)
    assert snapshot.state is JobState.DONE and snapshot == real_get(job.id)


def test_a_job_the_view_never_saw_is_read_from_the_store_when_it_finishes(tmp_path):
    """A recovered job (queued by an earlier process) is not in memory: its snapshot is read."""
    broker = EmbeddedBroker(tmp_path, Scheduler(10))
    view = JobView(broker)
    job = Job(str(uuid.uuid4()), JobState.QUEUED, TranscribeOptions(), Lane.BULK, time.time(), 1.25)
    broker.create(job, b"\0" * 100)
    broker.mark_running([job.id])
    broker.finish_many([(job.id, _transcript())])
    assert view.get_cached(job.id) == broker.get(job.id)
