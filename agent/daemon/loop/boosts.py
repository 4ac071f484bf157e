"""Priority-inversion compensation enacted: the leaves of resource holders boosted and
restored (which ones, and to what, is resources.py's).

Each step under `edf-pic` the holders that an earlier-deadline waiter lends to run with
the weights `boosted_weights` gives; every other holder runs with its class's own. A
change is written to the leaf (`cpu.weight`, `io.weight`; a controller the node lacks
is not written, and the event says so) and recorded as an event, `Boosted` or
`BoostEnded`, which the metrics count. A boost ends when no such waiter is left, when the
holder ends (its leaf goes with it), or when the policies in force stop being edf-pic.
After a restart the first step writes every holder's weights again, so that no leaf
stays boosted for a waiter the agent no longer knows of.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from ...cgroups import CgroupError
from ...policy.task import Task
from ...sched.job import Job
from ..store import TaskRecord
from .lifecycle import Lifecycle
from .resources import Lent, Weights, blocker, boosted_weights, holders

log = logging.getLogger("xhagent")

PIC = "edf-pic"


class Boosts:
    def __init__(self, lc: Lifecycle):
        self._lc = lc
        self._lent: dict[str, Lent] = {}  # holders running boosted now
        self._fresh = True  # no step yet: the leaves' weights are not known

    def inherited(self, task_id: str) -> int | None:
        """The deadline a holder stands by for its earlier-deadline waiters (None: none
        waits): what preemption weighs it by."""
        lent = self._lent.get(task_id)
        return None if lent is None else lent.deadline_ns

    def step(self, algorithm: str, waiting: Iterable[tuple[TaskRecord, Task]]) -> None:
        """`waiting`: the Pending tasks looked at (those needing nothing held are passed
        over)."""
        lc = self._lc
        holding = lc.holding()
        if not holding and not self._lent:
            self._fresh = False
            return
        targets: dict[str, Lent] = {}
        if algorithm == PIC and holding:
            targets = self._targets(holding, waiting)
        own = {tid: lc.weights_of(task) for tid, task in holding}
        changes: list[tuple[str, str, str, dict]] = []
        for tid, lent in targets.items():
            before = self._lent.get(tid)
            applied = before.weights if before is not None else own[tid]
            if applied != lent.weights:
                changes.append(
                    self._boost(tid, applied, lent)
                    if lent.boosted
                    else self._restore(tid, applied, own[tid])
                )
            self._lent[tid] = lent
        for tid in [t for t in self._lent if t not in targets]:
            before = self._lent.pop(tid)
            if before.boosted:
                changes.append(self._restore(tid, before.weights, own.get(tid)))
        if self._fresh:  # after a restart: what a leaf was given before it is set again
            for tid, weights in own.items():
                self._write(tid, targets[tid].weights if tid in targets else weights)
            self._fresh = False
        if changes:
            with lc.store.atomic():
                for kind, tid, message, detail in changes:
                    lc.store.add_event(kind, message, task_id=tid, detail=detail)

    def _targets(self, holding, waiting) -> dict[str, Lent]:
        lc = self._lc
        held = holders((tid, task.resources) for tid, task in holding)
        waiters = [
            (rec, task)
            for rec, task in waiting
            if task.resources and blocker(task.resources, held, rec.id) is not None
        ]
        if not waiters:
            return {}
        weights = {tid: lc.weights_of(task) for tid, task in holding}
        weights |= {rec.id: lc.weights_of(task) for rec, task in waiters}
        return boosted_weights(
            [Job(tid, deadline_ns=lc.deadlines.due(tid), holds=frozenset(t.resources))
             for tid, t in holding],
            [Job(rec.id, deadline_ns=task.deadline.at(rec.created_ns) if task.deadline else None,
                 holds=frozenset(task.resources))
             for rec, task in waiters],
            weights.__getitem__,
        )  # fmt: skip

    def _boost(self, tid: str, before: Weights, lent: Lent) -> tuple[str, str, str, dict]:
        unenforced = self._write(tid, lent.weights)
        message = (
            f"{_weights(before, lent.weights)}: {', '.join(lent.lenders)} "
            f"(an earlier deadline) waits for what it holds{_unenforced(unenforced)}"
        )
        detail = _detail(before, lent.weights, unenforced) | {"lenders": list(lent.lenders)}
        return "Boosted", tid, message, detail

    def _restore(
        self, tid: str, applied: Weights, own: Weights | None
    ) -> tuple[str, str, str, dict]:
        if own is None:  # it ended or was stopped: its leaf and the boost went with it
            message = "stopped while boosted: its leaf went, and the boost with it"
            return "BoostEnded", tid, message, _detail(applied, None, [])
        unenforced = self._write(tid, own)
        message = (
            f"{_weights(applied, own)}: no earlier-deadline task of a weightier class waits "
            f"for what it holds now{_unenforced(unenforced)}"
        )
        return "BoostEnded", tid, message, _detail(applied, own, unenforced)

    def _write(self, tid: str, weights: Weights) -> list[str]:
        """The weights written; what could not be, as "controller: why"."""
        missing = self._lc.executor.missing
        unenforced = [f"{c}: {missing[c]}" for c in ("cpu", "io") if c in missing]
        try:
            self._lc.executor.set_weights(tid, *weights)
        except (OSError, CgroupError) as exc:  # the leaf went meanwhile (its end is collected)
            log.debug("task %s: weights not written: %s", tid, exc)
            unenforced.append(f"leaf: {exc}")
        return unenforced


def _weights(before: Weights, after: Weights) -> str:
    return f"cpu.weight {before[0]} -> {after[0]}, io.weight {before[1]} -> {after[1]}"


def _unenforced(unenforced: list[str]) -> str:
    return f"; not enforced: {'; '.join(unenforced)}" if unenforced else ""


def _detail(before: Weights, after: Weights | None, unenforced: list[str]) -> dict:
    out: dict = {"from": list(before), "unenforced": unenforced}
    if after is not None:
        out["to"] = list(after)
    return out


__all__ = ["PIC", "Boosts"]
