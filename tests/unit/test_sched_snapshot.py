"""Versioned snapshot: a decision made on a stale version never lands."""

import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from xhagent.sched.snapshot import (
    InvalidDecision,
    PreemptionDecision,
    StaleSnapshot,
    VersionedSlots,
    decide_and_commit,
)

SLOTS = ["s0", "s1", "s2"]


@given(st.lists(st.sampled_from(SLOTS), max_size=6), st.integers(-3, 10))
def test_a_commit_against_any_other_version_is_rejected_and_changes_nothing(placements, offset):
    state = VersionedSlots({s: None for s in SLOTS})
    for i, slot in enumerate(dict.fromkeys(placements)):
        state.commit(PreemptionDecision(place={slot: f"j{i}"}), state.version)
    before = state.snapshot()
    stale = before.version + offset
    free = next((s for s in SLOTS if before.slots[s] is None), None)
    decision = (
        PreemptionDecision(place={free: "late"})
        if free
        else PreemptionDecision(evict=(before.slots["s0"],))
    )
    if offset == 0:
        assert state.commit(decision, stale) == before.version + 1
    else:
        with pytest.raises(StaleSnapshot):
            state.commit(decision, stale)
        assert state.snapshot() == before


def test_invalid_decisions_are_refused_whole():
    state = VersionedSlots({"s0": "a", "s1": None})
    with pytest.raises(InvalidDecision, match="taken by a"):
        state.commit(PreemptionDecision(place={"s1": "b", "s0": "c"}), 0)
    with pytest.raises(InvalidDecision, match="not running"):
        state.commit(PreemptionDecision(evict=("zz",)), 0)
    assert state.snapshot().slots == {"s0": "a", "s1": None} and state.version == 0


def test_a_stale_decision_is_recomputed_on_fresh_state():
    state = VersionedSlots({"s0": "low", "s1": None})
    calls = []

    def decide(snap):
        calls.append(snap.version)
        if len(calls) == 1:  # someone else takes the free slot meanwhile
            state.commit(PreemptionDecision(place={"s1": "other"}), snap.version)
        free = [s for s, j in snap.slots.items() if j is None]
        return (
            PreemptionDecision(place={free[0]: "new"})
            if free
            else PreemptionDecision(evict=("low",), place={"s0": "new"})
        )

    decision, version = decide_and_commit(state, decide)
    assert calls == [0, 1] and version == 2
    assert decision == PreemptionDecision(evict=("low",), place={"s0": "new"})
    assert state.snapshot().slots == {"s0": "new", "s1": "other"}


def test_concurrent_deciders_never_share_a_victim():
    state = VersionedSlots({f"s{i}": f"victim{i}" for i in range(4)})
    taken = []

    def preempt_one(name):
        def decide(snap):
            slot, job = next(
                (s, j) for s, j in sorted(snap.slots.items()) if j.startswith("victim")
            )
            return PreemptionDecision(evict=(job,), place={slot: name})

        decision, _ = decide_and_commit(state, decide, attempts=100)
        taken.append(decision.evict[0])

    threads = [threading.Thread(target=preempt_one, args=(f"new{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(taken) == [f"victim{i}" for i in range(4)]
    assert state.version == 4
