"""Group commit: rows written by many threads at once share one transaction (one fsync).

The embedded store answers a submit only after its row is durable (SQLite WAL, synchronous=FULL).
One autocommit INSERT per submit made every submit thread queue on SQLite's write lock for its own
fsync (the busy handler sleeps between tries), so the submits of a busy server waited in line for
the disk one at a time. Here the first caller that finds no commit under way becomes the leader: it
takes every row queued so far (its own and those that arrived while the previous group committed),
writes them in one transaction, and wakes their callers; each caller returns only once its own row
is committed, or raises the group's error. No thread of its own: an idle store costs nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")


class _Entry(Generic[T]):
    __slots__ = ("item", "done", "error")

    def __init__(self, item: T):
        self.item = item
        self.done = False
        self.error: BaseException | None = None


class GroupCommit(Generic[T]):
    """``commit(item)`` returns once ``write`` has committed ``item`` (with whatever else was
    queued at the time); ``write(items)`` raising fails every caller of that group with it."""

    def __init__(self, write: Callable[[Sequence[T]], None], max_group: int = 256):
        self._write = write
        self._max_group = max_group
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[_Entry[T]] = []
        self._busy = False  # a leader is writing a group
        self.groups = 0  # groups written (a count for tests and benchmarks)

    def __call__(self, item: T) -> None:
        error = self.many([item])[0]
        if error is not None:
            raise error

    def many(self, items: Sequence[T]) -> list[BaseException | None]:
        """Commit ``items`` (one caller's rows: they join the groups in order); for each, None
        or the error of the group that wrote it."""
        entries = [_Entry(item) for item in items]
        if not entries:
            return []
        with self._cond:
            self._pending.extend(entries)
            while not entries[-1].done:
                if self._busy:
                    self._cond.wait()
                    continue
                self._busy = True  # lead: write what is queued now, oldest first
                group, self._pending = self._pending[:self._max_group], self._pending[self._max_group:]
                error = None
                self._cond.release()
                try:
                    self._write([e.item for e in group])
                except BaseException as e:  # noqa: BLE001 - handed to every caller of the group
                    error = e
                finally:
                    self._cond.acquire()
                for e in group:
                    e.done, e.error = True, error
                self.groups += 1
                self._busy = False
                self._cond.notify_all()
        return [e.error for e in entries]
