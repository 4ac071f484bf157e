"""The state database's tables, their migrations, and the records read from them.

`PRAGMA user_version` is the schema version: the number of `MIGRATIONS` steps applied.
Version N+1 is one more function appended to the list; the store applies each missing step
in its own transaction, so a migration interrupted by kill -9 leaves the previous version
whole. Steps are never edited once released: a database in the field has run them.

`PRAGMA application_id` marks the file as ours, so that another program's SQLite file left
in the state dir is refused instead of being taken over. The records read from the tables
are in records.py.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable

APPLICATION_ID = 0x78686167  # "xhag"

Step = Callable[[sqlite3.Connection], None]


def sql(*statements: str) -> Step:
    """A step made of plain statements (executescript would commit; these run in the step's
    transaction)."""

    def step(conn: sqlite3.Connection) -> None:
        for s in statements:
            conn.execute(s)

    return step


V1 = sql(
    """CREATE TABLE tasks (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,  -- submission order; never reused
        id TEXT NOT NULL UNIQUE,
        name TEXT NOT NULL,
        kind TEXT NOT NULL,
        source TEXT NOT NULL,
        source_file TEXT NOT NULL,
        spec TEXT NOT NULL,                     -- JSON
        state TEXT NOT NULL,
        reasons TEXT NOT NULL DEFAULT '[]',     -- JSON: [{kind, node, detail, ...}]
        placement TEXT,                         -- JSON: {node, cpus, gpus, ...}
        cgroup TEXT,
        attempt INTEGER NOT NULL DEFAULT 0,
        exit_code INTEGER,
        signal INTEGER,
        error TEXT,
        created_ns INTEGER NOT NULL,
        started_ns INTEGER,
        ended_ns INTEGER,
        updated_ns INTEGER NOT NULL,
        idempotency_key TEXT UNIQUE
    )""",
    "CREATE INDEX tasks_state ON tasks (state, seq)",
    "CREATE INDEX tasks_name ON tasks (name)",
    """CREATE TABLE events (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        ts_ns INTEGER NOT NULL,
        task_id TEXT REFERENCES tasks (id) ON DELETE CASCADE,
        kind TEXT NOT NULL,
        message TEXT NOT NULL,
        detail TEXT NOT NULL DEFAULT '{}'
    )""",
    "CREATE INDEX events_task ON events (task_id, seq)",
    """CREATE TABLE policies (
        kind TEXT NOT NULL,
        name TEXT NOT NULL,
        version INTEGER NOT NULL,
        source TEXT NOT NULL,
        file TEXT NOT NULL,
        applied_ns INTEGER NOT NULL,
        removed_ns INTEGER,
        PRIMARY KEY (kind, name, version)
    )""",
    """CREATE TABLE intents (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        task_id TEXT NOT NULL REFERENCES tasks (id) ON DELETE CASCADE,
        action TEXT NOT NULL,
        args TEXT NOT NULL DEFAULT '{}',
        created_ns INTEGER NOT NULL,
        done_ns INTEGER,
        outcome TEXT
    )""",
    # Only the open ones are looked up after a restart; the finished ones stay for history.
    "CREATE INDEX intents_open ON intents (id) WHERE done_ns IS NULL",
)

# How many of a task's attempts a preemption ended (killed and requeued): those are not
# restarts, and do not use up its restart policy's budget.
V2 = sql("ALTER TABLE tasks ADD COLUMN preempted INTEGER NOT NULL DEFAULT 0")

# How many of a task's attempts a migration ended (stopped to start again on another
# device, xhagent.daemon.loop.migration): not restarts either.
V3 = sql("ALTER TABLE tasks ADD COLUMN migrated INTEGER NOT NULL DEFAULT 0")

# Who submitted each task (the caller's uid as the kernel gave it) and, for a caller that
# is no admin, whom the task runs as: decided at submission, so a name that changes owner
# later cannot change it. NULL owner: a task from before (the agent's user's).
V4 = sql(
    "ALTER TABLE tasks ADD COLUMN owner_uid INTEGER",
    "ALTER TABLE tasks ADD COLUMN run_uid INTEGER",
    "ALTER TABLE tasks ADD COLUMN run_gid INTEGER",
    "CREATE INDEX tasks_owner ON tasks (owner_uid, seq)",
)

# Bytes of the task's last attempt's output that the shim dropped (its cap reached, or a
# write that failed), stdout and stderr together.
V5 = sql("ALTER TABLE tasks ADD COLUMN output_dropped INTEGER NOT NULL DEFAULT 0")

# A caller's tasks in some states (a user's `ps` of what is Pending or Running) without a walk
# over every task that caller ever submitted.
V6 = sql("CREATE INDEX tasks_owner_state ON tasks (owner_uid, state, seq)")

# CPU time (user and system, µs) the last attempt's leaf used, read from its cpu.stat before
# the leaf was removed; NULL while it runs, or where the leaf could not be read.
V7 = sql("ALTER TABLE tasks ADD COLUMN cpu_usec INTEGER")

MIGRATIONS: list[Step] = [V1, V2, V3, V4, V5, V6, V7]


def latest() -> int:
    return len(MIGRATIONS)


def migrate(conn: sqlite3.Connection, have: int) -> None:
    """Apply each step past `have`, one transaction each (the caller's connection is in
    autocommit mode)."""
    for version in range(have + 1, latest() + 1):
        conn.execute("BEGIN IMMEDIATE")
        try:
            MIGRATIONS[version - 1](conn)
            conn.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            conn.execute(f"PRAGMA user_version = {version}")
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
