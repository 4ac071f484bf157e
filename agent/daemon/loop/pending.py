"""The Pending window: the oldest Pending tasks (at most `limit`, one page of the store),
parsed and in the order of their standing, kept from one step to the next.

The store is the truth and the window what a step would read from it: kept, a step with
nothing new reads no row and sorts nothing. The window holds every Pending task up to the
last one it read (`_after`, in submission order); what follows is read when there is room:
submissions, and the tasks the limit left out. A task that enters or leaves Pending in a
way the window did not make itself (a requeue after a backoff, a preemption, a move, a
restart of the agent) moves the store's `pending_moves`, and the next step reads the
window again in full. A change of the policies in force orders it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from ...policy.task import Task
from ..store import Store, TaskRecord, TaskState
from .ranking import Ranking
from .submission import InvalidTask


@dataclass(eq=False)  # one entry per task: compared by identity
class Entry:
    """A Pending task as the window holds it; `derived` is the scheduler's, per policies."""

    rec: TaskRecord
    task: Task
    key: tuple
    derived: object = field(default=None)
    said: tuple | None = None  # its reasons as the store holds them, once compared (shared)
    # the placement state (Cluster.version) the scheduler found it waiting in: the same
    # answer as long as that state and the policies stay; None: to be decided
    settled: int | None = None


class PendingWindow:
    def __init__(
        self,
        store: Store,
        read_spec: Callable[[TaskRecord], Task],
        failed: Callable[[TaskRecord, InvalidTask], None],
        offers: int = 1000,
        ranking: Callable[[Sequence], Ranking] = Ranking,
    ):
        self._store = store
        self._make_ranking = ranking  # the order under given policies
        self._read_spec = read_spec  # raises InvalidTask for a document this version cannot read
        self._failed = failed  # what becomes of such a task (it leaves Pending)
        self._entries: dict[str, Entry] = {}
        self._order: list[Entry] = []
        self._sorted = True
        self._after: str | None = None  # the last task read; those after it are not held
        self._seen: int | None = None  # the store's pending_moves it agrees with; None: none
        self._policies: Sequence | None = None
        self._ranking: Ranking | None = None  # the order under _policies
        self._shared: dict = {}
        # specs parsed by their submission, taken when their task is read into the window so
        # that no document is parsed twice; at most `offers`, the oldest kept (the window
        # reads the oldest first), offered from the API's threads
        self._offers: dict[str, Task] = {}
        self._offers_max = offers
        self._offers_lock = threading.Lock()

    def tasks(self, policies: Sequence, limit: int) -> list[Entry]:
        """The window in scheduling order, brought up to date with the store."""
        parsed: dict[str, Entry] = {}
        if self._seen != self._store.pending_moves:  # read again; the documents parsed kept
            parsed, self._entries, self._order, self._after = self._entries, {}, [], None
            self._seen = self._store.pending_moves
        if not _same(policies, self._policies):
            self._policies = policies
            self._ranking = self._make_ranking(policies)
            self._shared = {}
            for entry in self._order:
                entry.key = self._ranking.key(entry.rec.id, entry.task, entry.rec.created_ns)
                entry.derived = entry.settled = None
            self._sorted = False
        room = limit - len(self._entries)
        if room > 0:
            page = self._store.list_tasks([TaskState.PENDING], after=self._after, limit=room)
            for rec in page:
                self._after = rec.id
                self._add(rec, parsed.get(rec.id))
        if not self._sorted:
            self._order.sort(key=lambda e: e.key)
            self._sorted = True
        return list(self._order)

    def shared(self, key, make: Callable[[], object]):
        """The one object made for `key` under the policies in force: the entries that
        derive equal keys share it, so a step tells them apart by identity."""
        got = self._shared.get(key)
        if got is None:
            if len(self._shared) > 2 * len(self._entries) + 16:  # kept bounded by the window
                self._shared = {}
                for entry in self._order:  # derived again when next asked, sharing again
                    entry.derived = None
            got = self._shared[key] = make()
        return got

    def offer(self, task_id: str, task: Task) -> None:
        """`task_id`'s spec as its submission parsed it (any thread)."""
        with self._offers_lock:
            if len(self._offers) < self._offers_max:
                self._offers[task_id] = task

    def _offered(self, task_id: str) -> Task | None:
        with self._offers_lock:
            return self._offers.pop(task_id, None)

    def get(self, task_id: str) -> Entry | None:
        return self._entries.get(task_id)

    def __len__(self) -> int:
        return len(self._entries)

    def updated(self, entry: Entry, rec: TaskRecord, said: tuple) -> None:
        """`rec` is still Pending, as the store now has it: with the reasons `said`."""
        entry.rec, entry.said = rec, said

    @contextmanager
    def leaving(self, *task_ids: str) -> Iterator[None]:
        """Around a change of the caller's that takes `task_ids` out of Pending (starts, a
        cancel): the window drops them and still agrees with the store, unless something
        else moved meanwhile or the change did not complete (then it is read again). The
        change is one move per task; any other (a start also commits the ends it finds,
        and an end may requeue its task) is one the window has not made."""
        before = self._store.pending_moves
        agreed = self._seen == before
        try:
            yield
        except BaseException:
            self.invalidate()
            raise
        for task_id in task_ids:
            self._drop(task_id)
        if agreed and self._store.pending_moves <= before + len(task_ids):
            self._seen = self._store.pending_moves

    def invalidate(self) -> None:
        """Read in full by the next step."""
        self._seen = None

    def _add(self, rec: TaskRecord, held: Entry | None) -> None:
        try:
            task = held.task if held is not None else self._offered(rec.id)
            if task is None:
                task = self._read_spec(rec)
        except InvalidTask as exc:
            with self.leaving(rec.id):
                self._failed(rec, exc)
            return
        assert self._ranking is not None  # (tasks() sets it before it reads)
        entry = Entry(rec, task, self._ranking.key(rec.id, task, rec.created_ns))
        self._entries[rec.id] = entry
        if self._sorted and self._order and entry.key < self._order[-1].key:
            self._sorted = False
        self._order.append(entry)

    def _drop(self, task_id: str) -> None:
        self._offered(task_id)  # (a task that left before the window read it)
        entry = self._entries.pop(task_id, None)
        if entry is not None:
            self._order.remove(entry)


def _same(a: Sequence, b: Sequence | None) -> bool:
    """The same policies (a reload makes new objects: then it is not the same)."""
    return b is not None and len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
