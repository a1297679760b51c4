"""Group commit (pipeline/serving/group_commit.py): rows from many threads share a transaction, each
caller returns only once its own row is written, and a failed write fails exactly its group."""

from __future__ import annotations

import threading
import time

import pytest

from pipeline.serving.broker_sqlite import JobStore
from pipeline.serving.group_commit import GroupCommit


def test_concurrent_callers_share_groups_and_each_returns_after_its_write():
    written: list[int] = []
    first_in = threading.Event()
    release = threading.Event()

    def write(items):
        if not written and not first_in.is_set():
            first_in.set()
            release.wait(10)  # hold the first group so that the others queue behind it
        written.extend(items)

    commit = GroupCommit(write)
    returned: list[int] = []

    def call(i):
        commit(i)
        assert i in written  # never before its own row is written
        returned.append(i)

    threads = [threading.Thread(target=call, args=(0,))]
    threads[0].start()
    assert first_in.wait(10)
    threads += [threading.Thread(target=call, args=(i,)) for i in range(1, 21)]
    for t in threads[1:]:
        t.start()
    deadline = time.monotonic() + 10  # all 20 queued behind the first (a loaded machine starts
    while len(commit._pending) < 20 and time.monotonic() < deadline:  # threads late)
        time.sleep(0.001)
    release.set()
    for t in threads:
        t.join(10)
    assert sorted(written) == list(range(21)) and sorted(returned) == list(range(21))
    assert commit.groups < 21  # the 20 that queued behind the first did not write one by one


def test_a_failed_group_fails_its_callers_and_the_next_group_still_writes():
    calls = []

    def write(items):
        calls.append(list(items))
        if len(calls) == 1:
            raise OSError("disk on fire")

    commit = GroupCommit(write)
    with pytest.raises(OSError, match="disk on fire"):
        commit("a")
    commit("b")
    assert calls == [["a"], ["b"]]


def test_a_group_is_bounded_and_the_leader_still_waits_for_its_own_row():
    sizes = []
    commit = GroupCommit(lambda items: sizes.append(len(items)), max_group=2)
    threads = [threading.Thread(target=commit, args=(i,)) for i in range(9)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert sum(sizes) == 9 and max(sizes) <= 2


def test_the_store_stores_every_one_of_concurrent_submits(tmp_path):
    """JobStore.create from 16 threads at once: every job is stored, with its spool file."""
    from tests.test_storage import _job

    store = JobStore(tmp_path / "data")
    jobs = [_job() for _ in range(16)]
    threads = [threading.Thread(target=store.create, args=(j, b"x" * 1000)) for j in jobs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert all(store.get(j.id).state.value == "queued" for j in jobs)
    assert len(list((tmp_path / "data" / "spool").glob("*.upload"))) == 16


def test_many_threads_many_rows_each_written_once_and_every_caller_returns():
    written: list[int] = []
    commit = GroupCommit(written.extend, max_group=3)

    def caller(base):
        for k in range(20):
            commit(base * 100 + k)

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not any(t.is_alive() for t in threads)
    assert sorted(written) == sorted(i * 100 + k for i in range(24) for k in range(20))
