"""Preemption decisions committed against a versioned snapshot (seed 000 4.1, seed 003 4.3).

Deciding takes time and reads a lot of state; committing must not. A decision is computed
on a snapshot taken at version V and committed with `commit(decision, V)`: it applies
only if the node is still at V (compare-and-set), and then the version moves to V+1. A
decision computed on a stale version is rejected and, in `decide_and_commit`, computed
again on fresh state, so two deciders can never both evict the same victim or hand out
the same slot.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType


@dataclass(frozen=True)
class PreemptionDecision:
    """Slot changes: `evict` names jobs to take off their slots, `place` maps slot -> job."""

    evict: tuple[str, ...] = ()
    place: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    version: int
    slots: Mapping[str, str | None]  # slot -> job running there (None: free)


class StaleSnapshot(Exception):
    def __init__(self, expected: int, current: int):
        super().__init__(f"decision made on version {expected}, node is at {current}")
        self.expected, self.current = expected, current


class InvalidDecision(ValueError):
    pass


class VersionedSlots:
    """A node's slots (slot -> job) under a version that every commit moves on."""

    def __init__(self, slots: Mapping[str, str | None]):
        self._slots = dict(slots)
        self._slot_of = {job: slot for slot, job in self._slots.items() if job is not None}
        self._version = 0
        self._lock = threading.Lock()

    def snapshot(self) -> Snapshot:
        with self._lock:
            return Snapshot(self._version, MappingProxyType(dict(self._slots)))

    @property
    def version(self) -> int:
        return self._version

    def commit(self, decision: PreemptionDecision, expected_version: int) -> int:
        """Apply `decision` if the node is still at `expected_version`; the new version.
        Raises StaleSnapshot (nothing applied) otherwise, InvalidDecision if it does not fit.
        Costs the size of the decision, not of the node: the simulator commits every start
        and stop, on thousands of slots."""
        with self._lock:
            if expected_version != self._version:
                raise StaleSnapshot(expected_version, self._version)
            changed: dict[
                str, str | None
            ] = {}  # slot -> job after the decision; applied only if all fits
            for job in decision.evict:
                if job not in self._slot_of:
                    raise InvalidDecision(f"cannot evict {job}: not running")
                changed[self._slot_of[job]] = None
            for slot, job in decision.place.items():
                if slot not in self._slots:
                    raise InvalidDecision(f"no slot {slot}")
                taken = changed[slot] if slot in changed else self._slots[slot]
                if taken is not None:
                    raise InvalidDecision(f"slot {slot} is taken by {taken}")
                changed[slot] = job
            for slot, job in changed.items():
                old = self._slots[slot]
                if old is not None and self._slot_of.get(old) == slot:
                    del self._slot_of[old]
                self._slots[slot] = job
            self._slot_of.update((job, slot) for slot, job in changed.items() if job is not None)
            self._version += 1
            return self._version


def decide_and_commit(
    state: VersionedSlots, decide: Callable[[Snapshot], PreemptionDecision], attempts: int = 8
) -> tuple[PreemptionDecision, int]:
    """Compute on a snapshot and commit; recompute on a fresh one when it went stale."""
    for _ in range(attempts):
        snap = state.snapshot()
        decision = decide(snap)
        try:
            return decision, state.commit(decision, snap.version)
        except StaleSnapshot:
            continue
    raise StaleSnapshot(snap.version, state.version)
