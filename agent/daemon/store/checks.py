"""What the store checks before it trusts anything: the caller's values (bounded, JSON, one
clear line each), the state dir's lock, and the file it finds there. Also the store's errors
and its task ids.
"""

from __future__ import annotations

import fcntl
import json
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

from ...spec import MAX_BYTES, MAX_DOCUMENT_BYTES
from . import schema
from .records import Placement, WaitReason

DB_NAME, LOCK_NAME = "state.db", "lock"
# The input limits are the readers' (xhagent.spec), so that what `policy validate` accepts
# is stored: a task keeps its own document, an applied policy its own (a CgroupPolicy: its file).
MAX_DOCUMENT = MAX_DOCUMENT_BYTES  # bytes of one Task document, and of its summary as JSON
MAX_SOURCE = MAX_BYTES  # bytes of a policy file
MAX_JSON = 1 << 20  # bytes of reasons, placement, args, detail as JSON
MAX_NAME = 253  # task and policy names (a DNS name's length, as Kubernetes has it)
MAX_SHORT = 4096  # file names, messages, errors, outcomes: cut beyond this (display only)
MAX_TASKS_PAGE, MAX_PAGE_BYTES = 1000, 16 << 20  # list_tasks: rows, and bytes of documents
MAX_EVENTS_PAGE = 10_000
MAX_ACTIVE_POLICIES = 1000  # the scheduler holds all of them in memory
KEEP_EVENTS, KEEP_INTENTS = 100_000, 10_000
TASK_FIELDS = frozenset(
    {"reasons", "placement", "cgroup", "attempt", "preempted", "migrated", "exit_code", "signal"}
    | {"error", "started_ns", "ended_ns", "output_dropped", "cpu_usec"}
)
INTEGER_FIELDS = (
    "attempt",
    "preempted",
    "migrated",
    "output_dropped",
    "cpu_usec",
    "exit_code",
    "signal",
    "started_ns",
    "ended_ns",
)
# A task id is `t` and its submission number in decimal, ten digits: ids sort as they were
# submitted (ten billion submissions before one grows a digit) and read as the number.
ID_DIGITS = 10
MAX_ID_DIGITS = 18  # (a number SQLite's INTEGER holds)
# Ids given before these were `t` and seven digits of Crockford's base32, lower case: a task
# submitted then keeps its id (its leaf, run directory and events are named by it). The two
# kinds never meet: those have seven digits (nine at most), these at least ten.
LEGACY_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
LEGACY_DIGITS = (7, 9)


class StoreError(Exception):
    """One line naming the file or the task; never a traceback for an expected failure."""


class StoreFull(StoreError):
    """The state dir has no space: the change was rolled back, the store remains usable."""


class Conflict(StoreError):
    """A compare-and-set lost: the task is not in the state the caller expected."""


class NotFound(StoreError):
    pass


class CorruptRow(StoreError):
    """A stored row that cannot be read back (edited by hand, damaged on disk): which row,
    the column and what is wrong."""

    def __init__(self, row: str, column: str, problem: str):
        super().__init__(f"{row}: its stored row is unreadable: column {column}: {problem}")
        self.column, self.problem = column, problem


class CorruptTask(CorruptRow):
    """A task row that cannot be read back: the task's id, the column and what is wrong."""

    def __init__(self, task_id: str, column: str, problem: str, owner_uid: int | None = None):
        super().__init__(f"task {task_id}", column, problem)
        self.task_id = task_id
        # whose task it is, where the row still says (None: the agent's own, or not known):
        # the API tells only its owner and admins that it exists
        self.owner_uid = owner_uid


class CorruptIntent(CorruptRow):
    """An intent row that cannot be read back: its id (always readable: the table's rowid),
    its task's where that column reads (else None), the column and what is wrong."""

    def __init__(self, intent_id: int, task_id: str | None, column: str, problem: str):
        of = f" of task {task_id}" if task_id is not None else ""
        super().__init__(f"intent {intent_id}{of}", column, problem)
        self.intent_id, self.task_id = intent_id, task_id


class CorruptPolicy(CorruptRow):
    """An applied policy's row that cannot be read back: its kind and name where those
    columns read (else None), the column and what is wrong."""

    def __init__(self, kind: str | None, name: str | None, column: str, problem: str):
        super().__init__(f"{kind or 'policy'} {name or '(name unreadable)'}", column, problem)
        self.kind, self.name = kind, name


def format_task_id(seq: int) -> str:
    return f"t{seq:0{ID_DIGITS}d}"


def parse_task_id(task_id: str) -> int:
    """The submission number of an id (of either kind); ValueError for a string no id has."""
    digits = task_id[1:]
    if task_id[:1] == "t" and digits.isascii():
        if ID_DIGITS <= len(digits) <= MAX_ID_DIGITS and digits.isdigit():
            return int(digits)
        low, high = LEGACY_DIGITS
        if low <= len(digits) <= high and set(digits) <= set(LEGACY_ALPHABET):
            seq = 0
            for c in digits:
                seq = seq * 32 + LEGACY_ALPHABET.index(c)
            return seq
    raise ValueError(f"{task_id!r} is not a task id (t and {ID_DIGITS} decimal digits)")


# -- checks on what callers hand in: bounded, JSON, one clear line each ----------------------


def _utf8(value: str, what: str) -> int:
    """Its length in bytes; SQLite stores UTF-8, which a lone surrogate cannot be."""
    try:
        return len(value.encode())
    except UnicodeEncodeError:
        raise StoreError(f"{what} is not valid UTF-8 text") from None


def text(value: Any, what: str, limit: int, *, cut: bool = False, empty: bool = False) -> str:
    if not isinstance(value, str) or (not value and not empty):
        raise StoreError(f"{what} must be a {'' if empty else 'non-empty '}string")
    size = _utf8(value, what)
    if size <= limit:
        return value
    if cut:  # messages are for reading; quoting a workload's whole output helps no one
        return value[: limit // 4 - 1] + "…"
    raise StoreError(f"{what} is {size} bytes, more than the limit of {limit}")


def json_text(value: Any, what: str, limit: int = MAX_JSON) -> str:
    try:
        encoded = json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError) as exc:
        raise StoreError(f"{what} cannot be stored as JSON: {exc}") from None
    size = _utf8(encoded, what)
    if size > limit:
        raise StoreError(f"{what} is {size} bytes of JSON, more than {limit}")
    return encoded


def integer(value: Any, what: str) -> int | None:
    if value is None or (type(value) is int and -(1 << 63) <= value < 1 << 63):
        return value
    raise StoreError(f"{what} must be a 64-bit integer or None, not {value!r:.40}")


def reasons_of(reasons: Any) -> list[dict]:
    """WaitReasons as JSON, each with a kind."""
    out = []
    for r in reasons:
        if not isinstance(r, WaitReason) or not isinstance(r.kind, str) or not r.kind:
            raise StoreError(f"a Pending reason is a WaitReason with a kind: {r!r:.200}")
        out.append(r.to_json())
    return out


def field_values(fields: dict[str, Any]) -> dict[str, Any]:
    unknown = set(fields) - TASK_FIELDS
    if unknown:
        raise TypeError(f"transition() got unknown fields: {', '.join(sorted(unknown))}")
    out = dict(fields)
    if "reasons" in out:
        out["reasons"] = json_text(reasons_of(out["reasons"]), "reasons")
    if out.get("placement") is not None:
        if not isinstance(out["placement"], Placement):
            raise StoreError(f"a placement is a Placement, not {type(out['placement']).__name__}")
        out["placement"] = json_text(out["placement"].to_json(), "placement")
    for key in ("cgroup", "error"):
        if out.get(key) is not None:
            out[key] = text(out[key], key, MAX_SHORT, cut=key == "error")
    for key in INTEGER_FIELDS:
        if key in out:
            out[key] = integer(out[key], key)
    return out


# -- opening: lock, refuse what is not ours, migrate ----------------------------------------


def lock_state_dir(state_dir: Path) -> int:
    path = state_dir / LOCK_NAME
    try:
        # O_CLOEXEC: a workload the agent starts must not inherit the lock and outlive it.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        raise StoreError(f"lock file {path}: {exc.strerror}") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        try:
            pid = os.pread(fd, 32, 0).decode().strip()
        except (OSError, UnicodeDecodeError):
            pid = ""
        os.close(fd)
        who = f"pid {pid}" if pid.isdigit() else "another process"
        raise StoreError(f"state dir {state_dir} is in use by {who} (lock {path})") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # a full disk: the lock holds all the same, only the holder's pid goes unsaid
    return fd


def existing_version(db: Path) -> int:
    """The schema version of an existing file, read without changing a byte of it; 0 when
    there is none yet. Refuses a file that is not ours or that a newer xhagent wrote."""
    try:
        st = os.stat(db)
    except FileNotFoundError:
        return 0
    except OSError as exc:
        raise StoreError(f"{db}: {exc.strerror}") from None
    if not stat.S_ISREG(st.st_mode):
        raise StoreError(f"{db} is not a regular file: move it away")
    if st.st_size == 0:
        return 0

    def not_ours(why: str) -> StoreError:
        return StoreError(
            f"{db} is not an xhagent state database ({why}): move it away or restore a backup"
        )

    try:
        # Read-only: a read-write connection would checkpoint a leftover WAL into the file
        # when it closes, and this file may belong to someone else or to a newer xhagent.
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, isolation_level=None)
    except sqlite3.Error as exc:
        raise StoreError(f"{db}: cannot open: {exc}") from None
    try:
        app_id = conn.execute("PRAGMA application_id").fetchone()[0]
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        tables = conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0]
        if app_id != schema.APPLICATION_ID and (app_id or tables):
            raise not_ours(f"application_id {app_id:#x}" if app_id else "another program's tables")
        if version > schema.latest():
            raise StoreError(
                f"{db} has schema version {version}, newer than this xhagent's "
                f"{schema.latest()}: run a newer xhagent, or move the file away"
            )
        problems = conn.execute("PRAGMA quick_check(3)").fetchall()
        if problems != [("ok",)]:
            found = "; ".join(p[0] for p in problems).replace("*** in database main ***", "")
            raise not_ours("quick_check: " + " ".join(found.split())[:300])
        return version
    except sqlite3.DatabaseError as exc:
        raise not_ours(str(exc)) from None
    finally:
        conn.close()


def is_full(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    # IOERR_SHMSIZE: the WAL index could not grow, which on tmpfs means no space either.
    return code in (sqlite3.SQLITE_FULL, getattr(sqlite3, "SQLITE_IOERR_SHMSIZE", 4874)) or (
        code is None and "full" in str(exc)
    )


def store_error(exc: sqlite3.Error, db: Path, state_dir: Path, what: str) -> StoreError:
    if is_full(exc):
        return StoreFull(
            f"{state_dir} is full: {what} was refused and rolled back; nothing recorded before "
            "is lost (free space there and try again)"
        )
    return StoreError(f"{db}: {what}: {exc}")
