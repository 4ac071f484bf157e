"""The agent's durable state: tasks, events, policy versions and intents in one SQLite file.

    store = Store.open(Path("/var/lib/xhagent"))
    task = store.submit(name="infer-1", kind="gpu", source=text, source_file="t.yaml",
                        spec=spec, idempotency_key=key)
    with store.atomic():                     # intent, committed before it is acted on
        store.transition(task.id, TaskState.STARTING, expect=TaskState.PENDING, placement=p)
        intent = store.begin_intent(task.id, "start", {"cgroup": leaf})
    ...start the shim...                     # effect
    with store.atomic():                     # outcome
        store.finish_intent(intent, "ok")
        store.transition(task.id, TaskState.RUNNING, expect=TaskState.STARTING, cgroup=leaf)

After a restart, `open_intents()` is what was begun and not known to be finished: the agent
completes or rolls back each one from what the kernel shows (the leaf, its processes).

One agent per state dir: an exclusive flock on `STATE_DIR/lock` (the holder's pid inside),
dropped by the kernel however the holder exits. Every method is one transaction; `atomic()`
makes several one, and `commit_each()` several apart in one (a savepoint each: group
commit). A file that is not ours, fails its quick check or comes from a newer xhagent is
refused and left as it is. When the disk is full the transaction is rolled back and
`StoreFull` raised: nothing committed before is lost and the next call works once there is
space again.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from . import schema
from .checks import (
    DB_NAME,
    KEEP_EVENTS,
    KEEP_INTENTS,
    MAX_ACTIVE_POLICIES,
    MAX_DOCUMENT,
    MAX_EVENTS_PAGE,
    MAX_NAME,
    MAX_PAGE_BYTES,
    MAX_SHORT,
    MAX_SOURCE,
    MAX_TASKS_PAGE,
    Conflict,
    CorruptIntent,
    CorruptPolicy,
    CorruptRow,
    CorruptTask,
    NotFound,
    StoreError,
    StoreFull,
    existing_version,
    field_values,
    format_task_id,
    json_text,
    lock_state_dir,
    parse_task_id,
    reasons_of,
    store_error,
    text,
)
from .records import (
    ACTIONS,
    INTENT_COLUMNS,
    POLICY_COLUMNS,
    TASK_COLUMNS,
    BadColumn,
    Event,
    Intent,
    Owner,
    Placement,
    PolicyRecord,
    TaskRecord,
    TaskSummary,
    WaitReason,
)
from .states import NEEDS_PLACEMENT, TERMINAL, TaskState, check_transition

log = logging.getLogger("xhagent")
T = TypeVar("T")
LEFT_OUT = "it is left out of scheduling"  # what becomes of a task whose row cannot be read

__all__ = [
    "ACTIONS",
    "Conflict",
    "CorruptIntent",
    "CorruptTask",
    "NotFound",
    "Store",
    "StoreError",
    "StoreFull",
    "format_task_id",
    "parse_task_id",
]


class Store:
    """Open with `Store.open(state_dir)`; `close()` (or `with`) releases the file and lock."""

    def __init__(
        self,
        state_dir: Path,
        conn: sqlite3.Connection,
        lock_fd: int,
        *,
        keep_events: int = KEEP_EVENTS,
        keep_intents: int = KEEP_INTENTS,
        clock: Callable[[], int] | None = None,
    ):
        if keep_events < 1 or keep_intents < 1:
            raise ValueError("keep_events and keep_intents must be at least 1")
        self.state_dir, self.path = state_dir, state_dir / DB_NAME
        self._conn: sqlite3.Connection | None = conn
        self._lock_fd = lock_fd
        self._clock: Callable[[], int] = clock or time.time_ns
        self.keep_events, self.keep_intents = keep_events, keep_intents
        self._mutex = threading.RLock()  # the daemon's threads share one connection
        self._depth = 0
        self._doomed = False  # a statement failed inside atomic(): only a rollback is left
        # Observers of what was committed (metrics): called with [(event, task record or
        # None)] after each commit, in commit order, by the committing thread.
        self.on_commit: Callable[[list[tuple[Event, TaskRecord | None]]], None] | None = None
        self._written: list[tuple[Event, TaskRecord | None]] = []
        self._after: list[Callable[[], None]] = []  # after_commit's, for the open transaction
        self._reported: set[str] = set()  # corrupt rows already logged (bounded)
        self.commits = 0  # transactions committed since open (each one fsync of the WAL)
        self._pending_moves = 0

    @classmethod
    def open(
        cls,
        state_dir: Path,
        *,
        keep_events: int = KEEP_EVENTS,
        keep_intents: int = KEEP_INTENTS,
        clock: Callable[[], int] | None = None,
    ) -> Store:
        state_dir = Path(state_dir)
        try:
            state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"state dir {state_dir}: {exc.strerror}") from None
        fd = lock_state_dir(state_dir)
        db = state_dir / DB_NAME
        conn = None
        try:
            version = existing_version(db)
            conn = sqlite3.connect(db, timeout=10.0, isolation_level=None, check_same_thread=False)
            if conn.execute("PRAGMA journal_mode = WAL").fetchone()[0] != "wal":
                raise StoreError(f"{db}: this file system cannot hold a WAL-mode database")
            # FULL: WAL's NORMAL survives kill -9 (the OS has the write), but power loss
            # could undo the last commits, and a submission acknowledged must outlive that.
            conn.execute("PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
            # Each commit appends ~10 pages to the WAL, and the default checkpoint waits for
            # 1000 (4 MiB): a small state dir would fill with stale copies of pages long
            # before the data itself fills it. Checkpoint every 64 pages, and give a WAL
            # that a big transaction grew back down to 1 MiB after it.
            conn.execute("PRAGMA wal_autocheckpoint = 64")
            conn.execute(f"PRAGMA journal_size_limit = {1 << 20}")
            # 1 MiB of page cache (SQLite's default is 2 MiB): the hot rows are few (the
            # tasks not yet ended), and the daemon's resident size is a figure it is held to
            conn.execute("PRAGMA cache_size = -1024")
            schema.migrate(conn, version)
            return cls(
                state_dir, conn, fd, clock=clock, keep_events=keep_events, keep_intents=keep_intents
            )
        except BaseException as exc:
            if conn is not None:
                conn.close()
            os.close(fd)
            if isinstance(exc, sqlite3.Error):
                raise store_error(exc, db, state_dir, "opening the state database") from None
            raise

    def close(self) -> None:
        with self._mutex:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
                os.close(self._lock_fd)  # drops the flock: the next agent may start

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def pending_moves(self) -> int:
        """A count that moves with every transition into or out of Pending (not with a
        submission, which adds a row after the others): whoever keeps Pending tasks in
        memory knows by it whether the set changed behind it. It may move for a transition
        that was rolled back: only ever a change too many."""
        return self._pending_moves

    # -- transactions ---------------------------------------------------------------------

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """One transaction for every method called inside: all of it is committed, or
        none of it when anything raises."""
        with self._tx("update"):
            yield

    def after_commit(self, fn: Callable[[], None]) -> None:
        """`fn()` once the transaction open now is committed (at once where none is open),
        never when it is rolled back: what a caller keeps in memory of its writes follows
        the commit, also when its atomic() was one part of a larger one."""
        with self._mutex:
            if not self._depth:
                fn()
                return
            self._after.append(fn)

    @contextmanager
    def _tx(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            conn = self._conn
            if conn is None:
                raise StoreError(f"{self.path}: the store is closed")
            if self._depth:
                # SQLite may end the whole transaction on an error (SQLITE_FULL does): a
                # caller that caught it inside atomic() must not go on in autocommit mode.
                if self._doomed:
                    raise StoreError(f"{self.path}: {what}: an earlier error ended this update")
                self._depth += 1
                try:
                    yield conn
                except sqlite3.Error as exc:
                    self._doomed = True
                    raise store_error(exc, self.path, self.state_dir, what) from None
                finally:
                    self._depth -= 1
                return
            self._depth, self._doomed = 1, False
            self._written, self._after = [], []
            try:
                conn.execute("BEGIN IMMEDIATE")
                yield conn
                if self._doomed:
                    raise StoreError(f"{self.path}: {what}: an error inside ended this update")
                conn.execute("COMMIT")
                self.commits += 1
                self._tell(self._written)
                after, self._after = self._after, []
                for fn in after:
                    fn()
            except BaseException as exc:
                if conn.in_transaction:
                    try:
                        conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # the connection drops the transaction when it cannot go on
                if isinstance(exc, sqlite3.Error):
                    raise store_error(exc, self.path, self.state_dir, what) from None
                raise
            finally:
                self._depth, self._doomed, self._written, self._after = 0, False, [], []

    def commit_each(
        self, works: Sequence[Callable[[], T]], what: str = "updating"
    ) -> list[T | Exception]:
        """Every `works[i]()` in one transaction (one commit, one fsync), each in a savepoint
        of its own: what one raises is undone alone and is its result, the others' stand.
        The results come back in order, each the work's value or the exception it raised.
        When SQLite ends the whole transaction under a work (a full disk may), that work
        fails and the others run again in a new one; when BEGIN or COMMIT fails, every work
        not failed already fails with it: nothing of them is committed."""
        out: list[Any] = [None] * len(works)
        todo = list(range(len(works)))
        with self._mutex:
            if self._depth:  # its commit would be the caller's: the works' own is this one's
                raise StoreError(f"{self.path}: {what}: commit_each inside atomic()")
            while todo:
                ended = None
                try:
                    with self._tx(what) as c:
                        for n, i in enumerate(todo):
                            out[i] = self._apart(c, works[i], what)
                            if self._doomed:
                                ended = n
                                raise _Ended
                    return out
                except _Ended:
                    del todo[ended]  # its own error stays its result; the rest run again
                except Exception as exc:  # a StoreError of _tx: BEGIN or COMMIT failed
                    for i in todo:
                        if not isinstance(out[i], Exception):
                            out[i] = exc
                    return out
        return out

    def _apart(self, c: sqlite3.Connection, work: Callable[[], T], what: str) -> T | Exception:
        """`work()` inside a savepoint; what it raised, undone, is its result. Leaves
        `_doomed` set when the transaction itself could not be kept."""
        mark, after = len(self._written), len(self._after)
        c.execute("SAVEPOINT apart")
        try:
            value = work()
            if self._doomed:  # it caught a statement's error and went on
                raise StoreError(f"{self.path}: {what}: an error inside ended this update")
        except Exception as exc:
            try:
                if c.in_transaction:
                    c.execute("ROLLBACK TO apart")
                    c.execute("RELEASE apart")
                    del self._written[mark:]  # undone: no on_commit observer hears of it
                    del self._after[after:]
                    self._doomed = False
                else:
                    self._doomed = True
            except sqlite3.Error:
                self._doomed = True
            return exc
        c.execute("RELEASE apart")
        return value

    def _tell(self, written: list) -> None:
        if written and self.on_commit is not None:
            try:
                self.on_commit(written)
            except Exception:  # an observer's fault is not the store's: the commit stands
                log.exception("store: an on_commit observer failed")

    @contextmanager
    def _read(self) -> Iterator[sqlite3.Connection]:
        with self._mutex:
            if self._conn is None:
                raise StoreError(f"{self.path}: the store is closed")
            try:
                yield self._conn
            except sqlite3.Error as exc:
                raise store_error(exc, self.path, self.state_dir, "reading") from None

    def _event(self, c: sqlite3.Connection, task_id, kind, message, detail=None, now=None) -> Event:
        now = now or self._clock()
        if detail is not None and not isinstance(detail, Mapping):
            raise StoreError(f"event detail must be a mapping, not {type(detail).__name__}")
        message = text(message, "event message", MAX_SHORT, cut=True, empty=True)
        args = (now, task_id, text(kind, "event kind", MAX_NAME), message)
        cur = c.execute(
            "INSERT INTO events (ts_ns, task_id, kind, message, detail) VALUES (?, ?, ?, ?, ?)",
            (*args, json_text(detail or {}, "event detail")),
        )
        seq = cur.lastrowid
        event = Event(seq, *args, detail or {})
        self._written.append((event, None))
        # Pruning every 1% of the window keeps each insert's cost flat: the window may
        # hold up to 1% more than keep_events between two prunes.
        if seq > self.keep_events and seq % max(1, min(1000, self.keep_events // 100)) == 0:
            c.execute("DELETE FROM events WHERE seq <= ?", (seq - self.keep_events,))
        return event

    def _task(self, c: sqlite3.Connection, task_id: str) -> TaskRecord | None:
        row = c.execute(
            f"SELECT {TaskRecord.COLUMNS} FROM tasks WHERE id = ?", (task_id,)
        ).fetchone()
        return None if row is None else self._record(row)

    def _record(self, row) -> TaskRecord:
        try:
            return TaskRecord.from_row(row)
        except BadColumn as exc:
            task_id = TASK_COLUMNS.readable(row, "id")
            owner = TASK_COLUMNS.readable(row, "owner_uid")
            task_id = repr(row[0]) if task_id is None else task_id
            raise CorruptTask(task_id, exc.column, exc.problem, owner) from None

    def _report(self, corrupt: CorruptRow, then: str) -> None:
        """Once per row and problem: a corrupt row met again at every step, or by every
        reader of the events, is not logged again each time. `then`: what becomes of it."""
        key = str(corrupt)
        with self._mutex:
            if key in self._reported or len(self._reported) >= MAX_TASKS_PAGE:
                return
            self._reported.add(key)
        log.error("%s; %s until the row is repaired", corrupt, then)

    # -- tasks ----------------------------------------------------------------------------

    def submit(
        self,
        *,
        name: str,
        kind: str,
        source: str,
        source_file: str,
        summary: TaskSummary,
        idempotency_key: str | None = None,
        reasons: Collection[WaitReason] = (),
        owner: Owner | None = None,
    ) -> TaskRecord:
        """A new Pending task and its Submitted event. The same idempotency key again gets
        the task it first made (a client retrying after a lost reply), or Conflict when it
        comes with another document or from another owner (who may not see that task)."""
        name = text(name, "task name", MAX_NAME)
        row = (
            name,
            text(kind, "task kind", MAX_NAME),
            text(source, f"task {name}: its document", MAX_DOCUMENT),
            text(source_file, "task file name", MAX_SHORT, cut=True),
            json_text(summary.to_json(), f"task {name}: its summary", MAX_DOCUMENT),
            json_text(reasons_of(reasons), "reasons"),
        )
        if idempotency_key is not None:
            idempotency_key = text(idempotency_key, "idempotency key", MAX_NAME)
        with self._tx(f"submitting task {name}") as c:
            if idempotency_key is not None:
                got = c.execute(
                    f"SELECT {TaskRecord.COLUMNS} FROM tasks WHERE idempotency_key = ?",
                    (idempotency_key,),
                ).fetchone()
                if got is not None:
                    task = self._record(got)
                    if _uid(task.owner) != _uid(owner):
                        raise Conflict(f"idempotency key {idempotency_key!r} is another's")
                    if task.source != source:
                        raise Conflict(
                            f"idempotency key {idempotency_key!r} was used for task {task.id} "
                            "with another document"
                        )
                    return task
            last = c.execute("SELECT seq FROM sqlite_sequence WHERE name = 'tasks'").fetchone()
            seq = (last[0] if last else 0) + 1
            task_id, now = format_task_id(seq), self._clock()
            c.execute(
                "INSERT INTO tasks (seq, id, name, kind, source, source_file, spec, reasons, "
                "state, created_ns, updated_ns, idempotency_key, owner_uid, run_uid, run_gid) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    seq,
                    task_id,
                    *row,
                    TaskState.PENDING.value,
                    now,
                    now,
                    idempotency_key,
                    *((owner.uid, owner.run_uid, owner.run_gid) if owner else (None,) * 3),
                ),
            )
            self._event(c, task_id, "Submitted", f"{name} from {row[3]}", now=now)
            return self._task(c, task_id)

    def get(self, task_id: str, *, unreadable: bool = False) -> TaskRecord | None:
        """The task; None when there is none. A row that cannot be read is None as well
        (reported once: the agent's own work passes it by), or with `unreadable` raised as
        its CorruptTask (a client asking for that task is told why)."""
        try:
            with self._read() as c:
                return self._task(c, task_id)
        except CorruptTask as corrupt:
            if unreadable:
                raise
            self._report(corrupt, LEFT_OUT)
            return None

    def list_tasks(
        self,
        states: Collection[TaskState] | None = None,
        *,
        after: str | None = None,
        limit: int = 100,
        newest_first: bool = False,
        unreadable: bool = False,
        owner_uid: int | None = None,
    ) -> list[TaskRecord]:
        """One page of tasks (see task_page)."""
        return self.task_page(
            states,
            after=after,
            limit=limit,
            newest_first=newest_first,
            unreadable=unreadable,
            owner_uid=owner_uid,
        )[0]

    def task_page(
        self,
        states: Collection[TaskState] | None = None,
        *,
        after: str | None = None,
        limit: int = 100,
        newest_first: bool = False,
        unreadable: bool = False,
        owner_uid: int | None = None,
    ) -> tuple[list[TaskRecord], bool]:
        """(tasks, whether more follow): in submission order, or newest first, those past the
        id `after` in that order; at most `limit` (at most MAX_TASKS_PAGE) and MAX_PAGE_BYTES
        of documents. The next page starts after the last id of this one. With `owner_uid`,
        only the tasks that uid submitted.

        A row that cannot be read is reported once (logged) and left out, or, with
        `unreadable`, listed in its place as its CorruptTask: one bad row hides no other."""
        try:
            cut = parse_task_id(after) if after else None
        except ValueError as exc:
            raise StoreError(str(exc)) from None
        limit = max(1, min(limit, MAX_TASKS_PAGE))
        order = "DESC" if newest_first else "ASC"
        chosen, args = page_query(
            cut,
            newest_first,
            owner_uid,
            None if states is None else {TaskState(s).value for s in states},
            limit,
        )
        out, size, fetched = [], 0, 0
        with self._read() as c:
            for row in c.execute(
                f"SELECT {TaskRecord.COLUMNS} FROM tasks WHERE seq IN ({chosen}) "
                f"ORDER BY seq {order}",
                args,
            ):
                fetched += 1
                size += _length(row[-3]) + _length(row[-1])  # its document and its summary
                if fetched > limit or (out and size > MAX_PAGE_BYTES):
                    return out, True
                try:
                    out.append(self._record(row))
                except CorruptTask as corrupt:
                    self._report(corrupt, LEFT_OUT)
                    out += [corrupt] if unreadable else []
        return out, False

    def count_tasks(
        self, states: Collection[TaskState] | None = None, owner_uid: int | None = None
    ) -> int:
        where, args = [], []
        if states is not None:
            args = [TaskState(s).value for s in states]
            where.append(f"state IN ({', '.join('?' * len(args))})")
        if owner_uid is not None:
            where.append("owner_uid = ?")
            args.append(owner_uid)
        clause = f"WHERE {' AND '.join(where)}" if where else ""
        with self._read() as c:
            return c.execute(f"SELECT count(*) FROM tasks {clause}", args).fetchone()[0]

    def each_task(self, states: Collection[TaskState]) -> Iterator[TaskRecord]:
        """Every task in `states`, in submission order, read a page at a time."""
        after = None
        while True:
            page, more = self.task_page(states, after=after, limit=MAX_TASKS_PAGE, unreadable=True)
            yield from (t for t in page if isinstance(t, TaskRecord))
            if not more or not page:
                return
            after = page[-1].id if isinstance(page[-1], TaskRecord) else page[-1].task_id

    def census(self) -> tuple[dict[tuple[str, str], int], dict[str, int]]:
        """(tasks by (state, class), Pending tasks by the kind of their reasons): metrics."""
        with self._read() as c:
            by_state = {
                (state, cls or ""): n
                for state, cls, n in c.execute(
                    "SELECT state, iif(json_valid(spec), json_extract(spec, '$.class'), NULL), "
                    "count(*) FROM tasks GROUP BY 1, 2"
                )
            }
            # a row corrupt by hand or by the disk must not stop the count: JSON read only
            # where it is JSON of the shape written
            pending = dict(
                c.execute(
                    "SELECT iif(r.type = 'object', json_extract(r.value, '$.kind'), NULL), "
                    "count(DISTINCT tasks.seq) FROM tasks, json_each(iif(json_valid(reasons), "
                    "iif(json_type(reasons) = 'array', reasons, '[]'), '[]')) AS r "
                    "WHERE state = 'Pending' GROUP BY 1"
                ).fetchall()
            )
        return by_state, pending

    def transition(
        self,
        task_id: str,
        to: TaskState,
        *,
        expect: TaskState | Collection[TaskState] | None = None,
        note: str = "",
        **fields: Any,
    ) -> TaskRecord:
        """Compare-and-set: moves the task to `to` when it is in `expect` (any state when
        None) and the lifecycle allows it, sets `fields`, and records the transition as an
        event, all in one transaction. Unless `fields` says otherwise: entering Pending gives
        the placement and cgroup back, leaving it clears the reasons, Starting counts an
        attempt and clears the last one's outcome, Running stamps started_ns, an end
        ended_ns."""
        to = TaskState(to)
        values = field_values(fields)
        with self._tx(f"task {task_id} -> {to}") as c:
            row = c.execute(
                "SELECT state, placement, attempt FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no task {task_id}")
            old = TaskState(row[0])
            if expect is not None:
                allowed = (
                    {TaskState(expect)} if isinstance(expect, str) else set(map(TaskState, expect))
                )
                if old not in allowed:
                    want = " or ".join(sorted(s.value for s in allowed))
                    raise Conflict(f"task {task_id} is {old}, expected {want}")
            check_transition(old, to, task_id)
            if (old is TaskState.PENDING) != (to is TaskState.PENDING):
                self._pending_moves += 1
            now = self._clock()
            if to is TaskState.PENDING:
                values.setdefault("placement", None)
                values.setdefault("cgroup", None)
            else:
                values.setdefault("reasons", "[]")  # they say why a task waits; it no longer does
            if to is TaskState.STARTING:  # a new attempt: the last one's end is in the events
                values.setdefault("attempt", row[2] + 1)
                for key in ("exit_code", "signal", "error", "started_ns", "ended_ns", "cpu_usec"):
                    values.setdefault(key, None)
                values.setdefault("output_dropped", 0)
            if to is TaskState.RUNNING and old is TaskState.STARTING:
                values.setdefault("started_ns", now)
            if to in TERMINAL:
                values.setdefault("ended_ns", now)
            if to in NEEDS_PLACEMENT and values.get("placement", row[1]) is None:
                raise StoreError(f"task {task_id}: {to} needs a placement")
            values |= {"state": to.value, "updated_ns": now}
            c.execute(
                f"UPDATE tasks SET {', '.join(f'{k} = ?' for k in values)} WHERE id = ?",
                (*values.values(), task_id),
            )
            kind = "Transition"
            message = f"{old} -> {to}" + (f": {note}" if note else "")
            detail = {"from": old.value, "to": to.value}
            if old is to:  # Pending's only self-loop: what it waits for changed, not its state
                kind, message = "Waiting", _waiting(fields.get("reasons"), note)
            detail |= {k: fields[k] for k in ("exit_code", "signal", "attempt") if k in fields}
            if "error" in fields:
                detail["error"] = values["error"]
            if isinstance(fields.get("placement"), Placement):
                detail["node"] = fields["placement"].node
            event = self._event(c, task_id, kind, message, detail, now=now)
            rec = self._task(c, task_id)
            self._written[-1] = (event, rec)
            return rec

    # -- events ---------------------------------------------------------------------------

    def add_event(
        self, kind: str, message: str, *, task_id: str | None = None, detail: Any = None
    ) -> Event:
        with self._tx(f"recording event {kind}") as c:
            known = "SELECT 1 FROM tasks WHERE id = ?"
            if task_id is not None and c.execute(known, (task_id,)).fetchone() is None:
                raise NotFound(f"no task {task_id}")
            return self._event(c, task_id, kind, message, detail)

    def events(
        self,
        since_seq: int = 0,
        *,
        task_id: str | None = None,
        limit: int = 1000,
        owner_uid: int | None = None,
    ) -> list[Event]:
        """Events after `since_seq`, oldest first; at most `limit` (at most MAX_EVENTS_PAGE).
        With `owner_uid`, only events of the tasks that uid submitted: an event whose task id,
        or whose task's owner, cannot be read is no one's, and shown to admins only.

        A row that cannot be read is an `Unreadable` event in its place, its message naming
        its seq, the column and what is wrong (logged once): a stream goes on past it."""
        where, args = "seq > ?", [since_seq]
        if task_id is not None:
            where, args = where + " AND task_id = ?", [*args, task_id]
        if owner_uid is not None:
            where += " AND task_id IN (SELECT id FROM tasks WHERE owner_uid = ?)"
            args.append(owner_uid)
        limit = max(1, min(limit, MAX_EVENTS_PAGE))
        with self._read() as c:
            rows = c.execute(
                f"SELECT {Event.COLUMNS} FROM events WHERE {where} ORDER BY seq LIMIT ?",
                (*args, limit),
            ).fetchall()
        return [self._event_of(r) for r in rows]

    def _event_of(self, row) -> Event:
        try:
            return Event.from_row(row)
        except BadColumn as exc:
            corrupt = CorruptRow(f"event {row[0]}", exc.column, exc.problem)
            self._report(corrupt, "it is shown as an Unreadable event")
            return Event.in_place_of(row, str(corrupt))

    def last_event_seq(self) -> int:
        """Where a watcher that wants only what happens from now on starts."""
        with self._read() as c:
            return c.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0]

    # -- intents: what was begun, so that a restarted agent can finish or undo it ---------

    def begin_intent(self, task_id: str, action: str, args: Any = None) -> int:
        if action not in ACTIONS:
            raise StoreError(f"unknown intent {action!r} (one of {', '.join(sorted(ACTIONS))})")
        if args is not None and not isinstance(args, Mapping):
            raise StoreError(f"{action} arguments must be a mapping, not {type(args).__name__}")
        encoded = json_text(args or {}, f"{action} arguments")
        with self._tx(f"recording {action} of task {task_id}") as c:
            if c.execute("SELECT 1 FROM tasks WHERE id = ?", (task_id,)).fetchone() is None:
                raise NotFound(f"no task {task_id}")
            return c.execute(
                "INSERT INTO intents (task_id, action, args, created_ns) VALUES (?, ?, ?, ?)",
                (task_id, action, encoded, self._clock()),
            ).lastrowid

    def finish_intent(self, intent_id: int, outcome: str) -> Intent | CorruptIntent:
        """The intent, finished with `outcome`; one whose row cannot be read back is finished
        all the same, and returned as its CorruptIntent."""
        outcome = text(outcome, "intent outcome", MAX_SHORT, cut=True)
        with self._tx(f"finishing intent {intent_id}") as c:
            done = c.execute(
                "UPDATE intents SET done_ns = ?, outcome = ? WHERE id = ? AND done_ns IS NULL",
                (self._clock(), outcome, intent_id),
            ).rowcount
            row = c.execute(
                f"SELECT {Intent.COLUMNS} FROM intents WHERE id = ?", (intent_id,)
            ).fetchone()
            if row is None:
                raise NotFound(f"no intent {intent_id}")
            if not done:
                was = INTENT_COLUMNS.readable(row, "outcome")
                was = "" if was is None else f": {was}"
                raise Conflict(f"intent {intent_id} was already finished{was}")
            if intent_id > self.keep_intents and intent_id % 100 == 0:
                c.execute(
                    "DELETE FROM intents WHERE done_ns IS NOT NULL AND id <= ?",
                    (intent_id - self.keep_intents,),
                )
            return self._intent(row)

    def open_intents(self, limit: int = 1000) -> list[Intent | CorruptIntent]:
        """Begun, not finished, oldest first: what a restarted agent completes or undoes. A
        row that cannot be read is its CorruptIntent in its place, for the caller to report
        and finish: one bad row stops no other."""
        with self._read() as c:
            rows = c.execute(
                f"SELECT {Intent.COLUMNS} FROM intents WHERE done_ns IS NULL ORDER BY id LIMIT ?",
                (max(1, limit),),
            ).fetchall()
        return [self._intent(r) for r in rows]

    def _intent(self, row) -> Intent | CorruptIntent:
        try:
            return Intent.from_row(row)
        except BadColumn as exc:
            task_id = INTENT_COLUMNS.readable(row, "task_id")
            return CorruptIntent(row[0], task_id, exc.column, exc.problem)

    # -- policies: every applied version kept; the active one is the newest not removed ---

    def put_policy(self, kind: str, name: str, source: str, file: str) -> int:
        """The version now active: a new one, or the active one when `source` is unchanged
        (applying the same file twice is not a change). The event that says so is the
        caller's, in the same transaction (`atomic()`)."""
        kind, name = text(kind, "policy kind", MAX_NAME), text(name, "policy name", MAX_NAME)
        source = text(source, f"{kind} {name}: its file", MAX_SOURCE)
        file = text(file, "policy file name", MAX_SHORT, cut=True)
        with self._tx(f"applying {kind} {name}") as c:
            active = c.execute(
                "SELECT version, source FROM policies WHERE kind = ? AND name = ? "
                "AND removed_ns IS NULL ORDER BY version DESC LIMIT 1",
                (kind, name),
            ).fetchone()
            if active and active[1] == source:
                return active[0]
            if active is None and self._active_count(c) >= MAX_ACTIVE_POLICIES:
                raise StoreError(f"{kind} {name} refused: {MAX_ACTIVE_POLICIES} policies active")
            (last,) = c.execute(
                "SELECT coalesce(max(version), 0) FROM policies WHERE kind = ? AND name = ?",
                (kind, name),
            ).fetchone()
            c.execute(
                "INSERT INTO policies (kind, name, version, source, file, applied_ns) "
                "VALUES (?, ?, ?, ?, ?, ?)",
                (kind, name, last + 1, source, file, self._clock()),
            )
            return last + 1

    def remove_policy(self, kind: str, name: str) -> int:
        """Removes the active version (and any older one with it); returns its number."""
        with self._tx(f"removing {kind} {name}") as c:
            (version,) = c.execute(
                "SELECT max(version) FROM policies WHERE kind = ? AND name = ? "
                "AND removed_ns IS NULL",
                (kind, name),
            ).fetchone()
            if version is None:
                raise NotFound(f"no active {kind} {name}")
            c.execute(
                "UPDATE policies SET removed_ns = ? WHERE kind = ? AND name = ? "
                "AND removed_ns IS NULL",
                (self._clock(), kind, name),
            )
            return version

    def active_policies(self, kind: str | None = None) -> list[PolicyRecord | CorruptPolicy]:
        """The version in force of each policy applied through the API; a row that cannot
        be read is its CorruptPolicy in its place (for the caller to say): one bad row
        keeps no other out of force."""
        where, args = ("AND p.kind = ?", (kind,)) if kind else ("", ())
        with self._read() as c:
            rows = c.execute(
                f"SELECT {', '.join('p.' + col for col in PolicyRecord.COLUMNS.split(', '))} "
                "FROM policies p WHERE p.removed_ns IS NULL "
                f"{where} AND p.version = (SELECT max(version) FROM policies q "
                "WHERE q.kind = p.kind AND q.name = p.name) ORDER BY p.kind, p.name",
                args,
            ).fetchall()
        return [self._policy(r) for r in rows]

    @staticmethod
    def _policy(row) -> PolicyRecord | CorruptPolicy:
        try:
            return PolicyRecord.from_row(row)
        except BadColumn as exc:
            kind, name = (POLICY_COLUMNS.readable(row, c) for c in ("kind", "name"))
            return CorruptPolicy(kind, name, exc.column, exc.problem)

    def _active_count(self, c: sqlite3.Connection) -> int:
        return c.execute(
            "SELECT count(DISTINCT kind || '/' || name) FROM policies WHERE removed_ns IS NULL"
        ).fetchone()[0]


def page_query(
    cut: int | None,
    newest_first: bool,
    owner_uid: int | None,
    states: set[str] | None,
    limit: int,
) -> tuple[str, list]:
    """The query choosing a page's seqs, and its arguments: `limit` + 1 of them (the one
    more says whether another page follows).

    The page is chosen on an index alone (seq is in every index), and only its rows are
    read whole: states in any order would have SQLite sort every matching row, documents
    included. A caller's tasks in some states are one range of (owner_uid, state, seq) per
    state, merged: with IN, SQLite walks every task the caller ever submitted instead."""
    order = "DESC" if newest_first else "ASC"
    where, args = [], []
    if cut is not None:
        where.append("seq < ?" if newest_first else "seq > ?")
        args.append(cut)
    if owner_uid is not None:
        where.append("owner_uid = ?")
        args.append(owner_uid)
    if owner_uid is not None and states:
        ranges = " UNION ALL ".join(
            f"SELECT seq FROM (SELECT seq FROM tasks WHERE {' AND '.join(where)} AND state = ? "
            f"ORDER BY seq {order} LIMIT ?)"
            for _ in states
        )
        each = [[*args, state, limit + 1] for state in sorted(states)]
        return f"SELECT seq FROM ({ranges}) ORDER BY seq {order} LIMIT ?", [
            *(a for one in each for a in one),
            limit + 1,
        ]
    if states is not None:
        where.append(f"state IN ({', '.join('?' * len(states))})")
        args += sorted(states)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return f"SELECT seq FROM tasks {clause} ORDER BY seq {order} LIMIT ?", [*args, limit + 1]


class _Ended(Exception):
    """SQLite ended the transaction of a commit_each under one of its works."""


def _waiting(reasons: Any, note: str) -> str:
    """A Waiting event's line: the first reason a Pending task now waits for, and how many
    more (one per node that refused it)."""
    reasons = list(reasons or ())
    if not reasons or not isinstance(reasons[0], WaitReason):
        return note or "waiting"
    first = reasons[0]
    where = f" on {first.node}" if first.node else ""
    more = f" (and {len(reasons) - 1} more)" if len(reasons) > 1 else ""
    return f"{first.kind}{where}: {first.detail}{more}" if first.detail else first.kind + more


def _uid(owner: Owner | None) -> int | None:
    return None if owner is None else owner.uid


def _length(value) -> int:
    """A stored text's length; 0 for what is not text (a corrupt row's column)."""
    return len(value) if isinstance(value, str | bytes) else 0
