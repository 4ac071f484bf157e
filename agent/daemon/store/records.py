"""The records that cross the store's boundary, typed: what a task holds (`Placement`), why it
waits (`WaitReason`), what is known of it without reading its document (`TaskSummary`), the
task row itself, events, intents and policy versions.

Each JSON column has one reader (`from_json`) and one writer (`to_json`); rows written by an
older xhagent read through the same reader, whose defaults are the only place a missing key
is filled in.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
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


def _loads(text: str | None) -> Any:
    return None if text is None else json.loads(text)


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
    exit_code: int | None
    signal: int | None
    error: str | None
    created_ns: int
    started_ns: int | None
    ended_ns: int | None
    updated_ns: int
    idempotency_key: str | None
    source: str
    source_file: str
    summary: TaskSummary

    COLUMNS = (
        "id, name, kind, state, reasons, placement, cgroup, attempt, preempted, migrated, "
        "exit_code, signal, error, "
        "created_ns, started_ns, ended_ns, updated_ns, idempotency_key, source, source_file, spec"
    )

    @classmethod
    def from_row(cls, row: Sequence) -> TaskRecord:
        (id_, name, kind, state, reasons, placement, *rest) = row
        *middle, source, source_file, spec = rest
        placed = _loads(placement)
        return cls(
            id_,
            name,
            kind,
            TaskState(state),
            tuple(WaitReason.from_json(r) for r in json.loads(reasons)),
            None if placed is None else Placement.from_json(placed),
            *middle,
            source,
            source_file,
            TaskSummary.from_json(json.loads(spec)),
        )

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

    COLUMNS = "seq, ts_ns, task_id, kind, message, detail"

    @classmethod
    def from_row(cls, row: Sequence) -> Event:
        return cls(*row[:5], json.loads(row[5]))

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

    COLUMNS = "id, task_id, action, args, created_ns, done_ns, outcome"

    @classmethod
    def from_row(cls, row: Sequence) -> Intent:
        return cls(row[0], row[1], row[2], json.loads(row[3]), *row[4:])

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

    COLUMNS = "kind, name, version, source, file, applied_ns, removed_ns"

    @classmethod
    def from_row(cls, row: Sequence) -> PolicyRecord:
        return cls(*row)

    def to_json(self) -> dict:
        return asdict(self)
