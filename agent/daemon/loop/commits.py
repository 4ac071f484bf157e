"""Group commit: submissions that arrive together share one transaction, and so one fsync.

    commits = Commits(store, "submissions")
    records = commits.run(lambda: [store.submit(...), ...], size=len(source))

`run` queues the work and returns its value once the transaction holding it is committed
(or raises what the work raised, or what failed the commit): never before. The first caller
with nobody committing leads: it takes every work queued so far (at most `max_batch` of
them, `max_bytes` of submitted text) and commits them with `Store.commit_each`, each work in
a savepoint of its own, so that one work's failure undoes that work alone. Callers arriving
meanwhile queue behind it, and one of them leads the next batch when it is done. The works
run on the leader's thread: no thread is made here, and a caller waits in its own.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ..store import Store

T = TypeVar("T")
# 32 API threads submit at most 32 files at once; a batch holds all of them unless they are
# big: a Submit is at most 4 MiB, and a batch's documents are held in memory until it ends.
MAX_BATCH = 64
MAX_BATCH_BYTES = 8 << 20


@dataclass(eq=False)
class _Queued:
    work: Callable[[], Any]
    size: int
    done: bool = False
    result: Any = None  # the work's value, or the exception that is its caller's

    def outcome(self) -> Any:
        if isinstance(self.result, BaseException):
            raise self.result
        return self.result


class Commits:
    def __init__(
        self,
        store: Store,
        what: str = "updates",
        max_batch: int = MAX_BATCH,
        max_bytes: int = MAX_BATCH_BYTES,
    ):
        if max_batch < 1 or max_bytes < 1:
            raise ValueError("max_batch and max_bytes must be at least 1")
        self.store, self.what = store, what
        self.max_batch, self.max_bytes = max_batch, max_bytes
        self._cv = threading.Condition()
        self._queue: list[_Queued] = []
        self._bytes = 0  # of the queue
        self._leading = False  # a batch is being committed

    @property
    def queued(self) -> int:
        """Works waiting for the next batch."""
        with self._cv:
            return len(self._queue)

    def run(self, work: Callable[[], T], size: int = 0) -> T:
        """`work()` (store calls) committed; its value, or what it or the commit raised."""
        me = _Queued(work, max(0, size))
        with self._cv:
            while self._queue and (
                len(self._queue) >= self.max_batch or self._bytes + me.size > self.max_bytes
            ):
                self._cv.wait()  # the next batch is full: the one after it
            self._queue.append(me)
            self._bytes += me.size
            while self._leading and not me.done:
                self._cv.wait()
            if me.done:  # a leader committed it (or failed to)
                return me.outcome()
            # nobody commits and this caller's work is queued: it leads the batch
            self._leading = True
            batch, self._queue, self._bytes = self._queue, [], 0
            self._cv.notify_all()  # room in the queue again
        results: list[Any] = []
        try:
            results = self.store.commit_each(
                [q.work for q in batch], f"committing {self.what} ({len(batch)} together)"
            )
        except BaseException as exc:  # not a work's, not the commit's: every caller's
            results = [exc] * len(batch)
            raise
        finally:
            with self._cv:
                for q, result in zip(batch, results, strict=True):
                    q.result, q.done = result, True
                self._leading = False
                self._cv.notify_all()
        return me.outcome()


__all__ = ["MAX_BATCH", "MAX_BATCH_BYTES", "Commits"]
