"""The records that cross the store's boundary, typed: what a task holds (`Placement`), why it
waits (`WaitReason`), what is known of it without reading its document (`TaskSummary`), the
task row itself, events, intents and policy versions.

Each JSON column has one reader (`from_json`) and one writer (`to_json`); rows written by an
older xhagent read through the same reader, whose defaults are the only place a missing key
is filled in. Task, event, intent and policy rows are read through their table's `Columns`: a
column that does not hold what the agent writes there (a row edited by hand, a disk that
lost bits) is a `BadColumn` naming it, for that row alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from .states import TaskState


@dataclass(frozen=True)
class Unenforced:
    """A limit the task would have had and runs without, and why."""

    controller: str
    setting: str  # the file and value, e.g. "io.weight=1000"
    reason: str

    def __str__(self) -> str:
        return f"{self.setting}: {self.reason}"

    def to_json(self) -> dict[str, str]:
        return {"controller": self.controller, "setting": self.setting, "reason": self.reason}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Unenforced:
        return cls(d.get("controller", ""), d.get("setting", ""), d.get("reason", ""))


@dataclass(frozen=True)
class HeldGpu:
    """A GPU a placed task holds: whole, or a share of its memory (bytes)."""

    index: int
    memory: int
    whole: bool
    uuid: str  # what CUDA_VISIBLE_DEVICES names; the index where the GPU has no UUID


@dataclass(frozen=True)
class Placement:
    """Where a task in Starting, Running or Frozen runs and what it holds there."""

    node: str
    cpus: tuple[int, ...]  # its cpuset: its own CPUs, or the shared ones
    exclusive: bool  # the CPUs are its alone (a frozen task gives them back meanwhile)
    memory: int = 0  # bytes reserved
    gpus: tuple[HeldGpu, ...] = ()
    tpus: tuple[int, ...] = ()
    unenforced: tuple[Unenforced, ...] = ()

    @property
    def gpu_uuids(self) -> list[str]:
        return [g.uuid for g in self.gpus]

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "cpus": list(self.cpus),
            "exclusive": self.exclusive,
            "memory": self.memory,
            "gpus": self.gpu_uuids,
            "gpu_shares": [[g.index, g.memory, g.whole] for g in self.gpus],
            "tpus": list(self.tpus),
            "unenforced": [u.to_json() for u in self.unenforced],
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Placement:
        uuids = list(d.get("gpus", ()))
        shares = list(d.get("gpu_shares", ()))
        gpus = tuple(
            HeldGpu(int(i), int(m), bool(w), str(uuids[k]) if k < len(uuids) else str(i))
            for k, (i, m, w) in enumerate(shares)
        )
        return cls(
            node=d.get("node", ""),
            cpus=tuple(d.get("cpus", ())),
            exclusive=bool(d.get("exclusive")),
            memory=int(d.get("memory") or 0),
            gpus=gpus,
            tpus=tuple(d.get("tpus", ())),
            unenforced=tuple(Unenforced.from_json(u) for u in d.get("unenforced", ())),
        )


@dataclass(frozen=True)
class WaitReason:
    """Why a Pending task waits: a typed kind (`InsufficientGPUHardware`, `BackOff`, ...), the
    node it concerns ("" for none) and the sentence a user reads."""

    kind: str
    node: str = ""
    detail: str = ""

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "node": self.node, "detail": self.detail}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> WaitReason:
        return cls(str(d.get("kind", "")), str(d.get("node", "")), str(d.get("detail", "")))


@dataclass(frozen=True)
class TaskSummary:
    """What `get`, `ps` and a restarted agent know of a task without parsing its document;
    the document (`document`: its index in the task's `source`) stays the truth. A task's
    source is its own document (index 0); a row an older xhagent wrote holds the whole file
    it was submitted in, and the index of its document there.

    `priority` is the task's own (`spec.priority`), None when it takes its policy's: the
    policy in force decides, now, not at submission. A row an older xhagent wrote kept the
    priority in force at submission instead (`legacy`): its own is read from the document.
    """

    document: int
    task_class: str
    priority: int | None
    device_type: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    deadline: tuple[int, bool] | None = None  # (ns, relative to the submission)
    legacy: bool = False

    def to_json(self) -> dict[str, Any]:
        return {
            "document": self.document,
            "class": self.task_class,
            "task_priority": self.priority,
            "device_type": self.device_type,
            "labels": dict(self.labels),
            "deadline": list(self.deadline) if self.deadline else None,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TaskSummary:
        legacy = "task_priority" not in d
        deadline = d.get("deadline")
        return cls(
            document=int(d.get("document", 0)),
            task_class=d.get("class") or "",
            priority=None if legacy else d["task_priority"],
            device_type=d.get("device_type") or "",
            labels=dict(d.get("labels") or {}),
            deadline=(int(deadline[0]), bool(deadline[1])) if deadline else None,
            legacy=legacy or "deadline" not in d,
        )


@dataclass(frozen=True)
class Owner:
    """Who submitted a task (the uid the kernel vouched for), and whom it runs as when the
    submitter is no admin: its own uid and a group of its own, decided at submission.
    `run_uid` None: as its document's `user` says, else as the agent's own user."""

    uid: int
    run_uid: int | None = None
    run_gid: int | None = None

    def to_json(self) -> dict:
        return asdict(self)


class BadColumn(ValueError):
    """A stored column that does not read as what its row keeps there: which, and why."""

    def __init__(self, column: str, problem: str):
        super().__init__(f"column {column}: {problem}")
        self.column, self.problem = column, problem


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# A shared column's values, kept by the text they were read from: texts of at most
# SHARED_TEXT bytes, SHARED_BYTES of them in all (then the memo starts over).
SHARED_TEXT = 1024
SHARED_BYTES = 256 * 1024


class SharedJson:
    """A JSON column's reader for values nobody changes: a text read once is not read
    again, and every row holding it gets the same value. Many rows hold the same text (the
    tasks of one submission share a summary, the tasks waiting for one thing share their
    reasons), and a page of a thousand rows is read on every List."""

    def __init__(self, read: Callable[[Any], Any], *, nullable: bool = False):
        self._read, self._nullable = read, nullable
        self._memo: dict[str, Any] = {}
        self.held = 0  # bytes of text kept

    def __call__(self, value: Any) -> Any:
        if value is None and self._nullable:
            return None
        if not isinstance(value, str):
            raise ValueError
        out = self._memo.get(value)
        if out is not None:
            return out
        out = self._read(json.loads(value))
        if len(value) <= SHARED_TEXT:
            if self.held + len(value) > SHARED_BYTES:
                self._memo, self.held = {}, 0
            self._memo[value] = out
            self.held += len(value)
        return out


def _json(read: Callable[[Any], Any], *, nullable: bool = False) -> Callable[[Any], Any]:
    def column(value: Any) -> Any:
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            raise ValueError
        return read(json.loads(value))

    return column


def _text(*, nullable: bool = False) -> Callable[[Any], Any]:
    def column(value: Any) -> Any:
        if isinstance(value, str) or (value is None and nullable):
            return value
        raise ValueError

    return column


def _integer(low: int, high: int, *, nullable: bool = False) -> Callable[[Any], Any]:
    def column(value: Any) -> Any:
        if value is None and nullable:
            return None
        if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
            return value
        raise ValueError

    return column


def _object(doc: Any) -> dict:
    if not isinstance(doc, dict):
        raise ValueError
    return doc


def _action(value: Any) -> str:
    if value not in ACTIONS:
        raise ValueError
    return value


def _state(value: Any) -> TaskState:
    if value not in STATE_NAMES:
        raise BadColumn("state", f"{_shown(value)} is not a task state")
    return TaskState(value)


def _reasons(doc: Any) -> tuple[WaitReason, ...]:
    if not isinstance(doc, list):
        raise ValueError
    return tuple(WaitReason.from_json(r) for r in doc)


def _placement(doc: Any) -> Placement:
    placed = Placement.from_json(doc)
    if not (
        isinstance(placed.node, str)
        and all(_is_index(c) for c in (*placed.cpus, *placed.tpus))
        and all(isinstance(u.setting, str) and isinstance(u.reason, str) for u in placed.unenforced)
    ):
        raise ValueError
    return placed


def _summary(doc: Any) -> TaskSummary:
    if not isinstance(doc, dict):
        raise ValueError
    summary = TaskSummary.from_json(doc)
    own = summary.priority
    if not (
        isinstance(summary.task_class, str)
        and isinstance(summary.device_type, str)
        and all(isinstance(x, str) for kv in summary.labels.items() for x in kv)
        and (own is None or (_is_index(own) and own <= 100))
    ):
        raise ValueError
    return summary


def _is_index(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


# What a column's reader raises for a value it does not hold (json's errors are ValueErrors).
_UNREAD = (ValueError, TypeError, KeyError, IndexError, AttributeError)


def _column(name: str, read: Callable[[Any], Any], holds: str, value: Any) -> Any:
    """`read(value)`, else BadColumn saying what the column holds instead of `holds`."""
    try:
        return read(value)
    except BadColumn:
        raise
    except json.JSONDecodeError as exc:
        raise BadColumn(name, f"not JSON ({exc.msg} at character {exc.pos})") from None
    except _UNREAD:
        raise BadColumn(name, f"{_shown(value)} is not {holds}") from None


class Columns:
    """A table's columns in its record's field order: each one's name, how it reads, and
    what it must hold. `names` is what a SELECT of the record's row lists."""

    def __init__(self, *columns: tuple[str, Callable[[Any], Any], str]):
        self.columns = columns
        self.names = ", ".join(name for name, _, _ in columns)
        self._readers = tuple(read for _, read, _ in columns)
        self._at = {name: i for i, (name, _, _) in enumerate(columns)}

    def index(self, name: str) -> int:
        return self._at[name]

    def read(self, row: Sequence) -> list:
        """The row's values, each read; BadColumn for the first column that does not read
        as what it keeps."""
        try:  # a page of a thousand rows is read on every List and Watch: no wrapper per column
            return [read(v) for read, v in zip(self._readers, row, strict=True)]
        except _UNREAD:  # read again, column by column, for the one to name
            return [_column(*c, v) for c, v in zip(self.columns, row, strict=True)]

    def readable(self, row: Sequence, name: str) -> Any:
        """Column `name` of a row that does not read as a whole, where that column reads;
        None where it does not either."""
        at = self._at[name]
        try:
            return self._readers[at](row[at])
        except _UNREAD:
            return None


STATE_NAMES = frozenset(s.value for s in TaskState)
# What an intent records before it is acted on (store.begin_intent).
ACTIONS = frozenset({"start", "freeze", "thaw", "signal", "kill", "remove_leaf", "migrate"})
INT64 = (-(2**63), 2**63 - 1)
INT32 = (-(2**31), 2**31 - 1)
# A task row's columns in TaskRecord's field order (owner_uid, run_uid and run_gid make its
# `owner`).
TASK_COLUMNS = Columns(
    ("id", _text(), "text"),
    ("name", _text(), "text"),
    ("kind", _text(), "text"),
    ("state", _state, "a task state"),
    ("reasons", SharedJson(_reasons), "a JSON list of reasons"),
    ("placement", SharedJson(_placement, nullable=True), "a JSON placement or NULL"),
    ("cgroup", _text(nullable=True), "text or NULL"),
    ("attempt", _integer(0, 2**32 - 1), "a count"),
    ("preempted", _integer(0, 2**32 - 1), "a count"),
    ("migrated", _integer(0, 2**32 - 1), "a count"),
    ("output_dropped", _integer(0, 2**63 - 1), "a count of bytes"),
    ("cpu_usec", _integer(0, 2**63 - 1, nullable=True), "a count of µs or NULL"),
    ("exit_code", _integer(*INT32, nullable=True), "a 32-bit integer or NULL"),
    ("signal", _integer(*INT32, nullable=True), "a 32-bit integer or NULL"),
    ("error", _text(nullable=True), "text or NULL"),
    ("created_ns", _integer(*INT64), "an integer"),
    ("started_ns", _integer(*INT64, nullable=True), "an integer or NULL"),
    ("ended_ns", _integer(*INT64, nullable=True), "an integer or NULL"),
    ("updated_ns", _integer(*INT64), "an integer"),
    ("idempotency_key", _text(nullable=True), "text or NULL"),
    ("owner_uid", _integer(0, 2**32 - 1, nullable=True), "a uid or NULL"),
    ("run_uid", _integer(0, 2**32 - 1, nullable=True), "a uid or NULL"),
    ("run_gid", _integer(0, 2**32 - 1, nullable=True), "a gid or NULL"),
    ("source", _text(), "text"),
    ("source_file", _text(), "text"),
    ("spec", SharedJson(_summary), "a JSON task summary"),
)
# seq and id are each table's rowid: SQLite keeps them integers whatever is written there.
EVENT_COLUMNS = Columns(
    ("seq", _integer(*INT64), "an integer"),
    ("ts_ns", _integer(*INT64), "an integer"),
    ("task_id", _text(nullable=True), "text or NULL"),
    ("kind", _text(), "text"),
    ("message", _text(), "text"),
    ("detail", _json(_object), "a JSON object"),
)
INTENT_COLUMNS = Columns(
    ("id", _integer(*INT64), "an integer"),
    ("task_id", _text(), "text"),
    ("action", _action, "an intent action"),
    ("args", _json(_object), "a JSON object"),
    ("created_ns", _integer(*INT64), "an integer"),
    ("done_ns", _integer(*INT64, nullable=True), "an integer or NULL"),
    ("outcome", _text(nullable=True), "text or NULL"),
)
POLICY_COLUMNS = Columns(
    ("kind", _text(), "text"),
    ("name", _text(), "text"),
    ("version", _integer(1, INT64[1]), "a version (1 or more)"),
    ("source", _text(), "text"),
    ("file", _text(), "text"),
    ("applied_ns", _integer(*INT64), "an integer"),
    ("removed_ns", _integer(*INT64, nullable=True), "an integer or NULL"),
)
_OWNER_AT = TASK_COLUMNS.index("owner_uid")
# The kind of the event shown in place of one whose row cannot be read.
UNREADABLE = "Unreadable"


@dataclass(frozen=True)
class TaskRecord:
    id: str
    name: str
    kind: str
    state: TaskState
    reasons: tuple[WaitReason, ...]
    placement: Placement | None
    cgroup: str | None
    attempt: int
    preempted: int
    migrated: int
    output_dropped: int  # bytes of the last attempt's output the shim dropped
    cpu_usec: int | None  # CPU time its last attempt's leaf used; None: running, or not read
    exit_code: int | None
    signal: int | None
    error: str | None
    created_ns: int
    started_ns: int | None
    ended_ns: int | None
    updated_ns: int
    idempotency_key: str | None
    owner: Owner | None  # None: a task from before owners were kept (the agent's user's)
    source: str
    source_file: str
    summary: TaskSummary

    COLUMNS = TASK_COLUMNS.names

    @classmethod
    def from_row(cls, row: Sequence) -> TaskRecord:
        """The record of a row read with COLUMNS; BadColumn for the first column that does
        not read as what it keeps."""
        values = TASK_COLUMNS.read(row)
        uid, run_uid, run_gid = values[_OWNER_AT : _OWNER_AT + 3]
        values[_OWNER_AT : _OWNER_AT + 3] = [None if uid is None else Owner(uid, run_uid, run_gid)]
        return cls(*values)

    @property
    def first_reason(self) -> str:
        """The kind of the first reason it waits for; "" for none."""
        return self.reasons[0].kind if self.reasons else ""

    def to_json(self, source: bool = True) -> dict:
        """snake_case keys, JSON values; without the document text when `source` is false."""
        d = asdict(self)
        d["state"] = self.state.value
        d["reasons"] = [r.to_json() for r in self.reasons]
        d["placement"] = self.placement.to_json() if self.placement else None
        d["owner"] = self.owner.to_json() if self.owner else None
        d["spec"] = self.summary.to_json()
        del d["summary"]
        if not source:
            del d["source"]
        return d


@dataclass(frozen=True)
class Event:
    seq: int
    ts_ns: int
    task_id: str | None
    kind: str
    message: str
    detail: dict

    COLUMNS = EVENT_COLUMNS.names

    @classmethod
    def from_row(cls, row: Sequence) -> Event:
        """The event of a row read with COLUMNS; BadColumn for the first column that does
        not read as what it keeps."""
        return cls(*EVENT_COLUMNS.read(row))

    @classmethod
    def in_place_of(cls, row: Sequence, message: str) -> Event:
        """What is shown of a row that does not read: an `Unreadable` event with its seq,
        and its time and task where those read (0 and None where they do not)."""
        ts_ns, task_id = (EVENT_COLUMNS.readable(row, c) for c in ("ts_ns", "task_id"))
        return cls(row[0], ts_ns or 0, task_id, UNREADABLE, message, {})

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Intent:
    id: int
    task_id: str
    action: str
    args: dict
    created_ns: int
    done_ns: int | None
    outcome: str | None

    COLUMNS = INTENT_COLUMNS.names

    @classmethod
    def from_row(cls, row: Sequence) -> Intent:
        """The intent of a row read with COLUMNS; BadColumn for the first column that does
        not read as what it keeps."""
        return cls(*INTENT_COLUMNS.read(row))

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class PolicyRecord:
    kind: str
    name: str
    version: int
    source: str
    file: str
    applied_ns: int
    removed_ns: int | None

    COLUMNS = POLICY_COLUMNS.names

    @classmethod
    def from_row(cls, row: Sequence) -> PolicyRecord:
        """BadColumn for the first column that does not read as what it keeps."""
        return cls(*POLICY_COLUMNS.read(row))

    def to_json(self) -> dict:
        return asdict(self)
