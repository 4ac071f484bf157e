"""Every pair of task states against the lifecycle table, written out here a second time so
that a change to the table is a change to this test too."""

import itertools

import pytest

from xhagent.daemon.store.states import (
    NEEDS_PLACEMENT,
    TERMINAL,
    TRANSITIONS,
    IllegalTransition,
    TaskState,
    check_transition,
    is_legal,
)

# row: from; columns: to, in the order Pending Starting Running Frozen Succeeded Failed Cancelled
TABLE = """
Pending    x x . . . x x
Starting   x . x . x x x
Running    x . . x x x x
Frozen     x . x . . x x
Succeeded  . . . . . . .
Failed     . . . . . . .
Cancelled  . . . . . . .
"""
ORDER = list(TaskState)
LEGAL = {
    (TaskState(row.split()[0]), ORDER[i])
    for row in TABLE.strip().splitlines()
    for i, mark in enumerate(row.split()[1:])
    if mark == "x"
}


@pytest.mark.parametrize("old,new", list(itertools.product(TaskState, TaskState)))
def test_every_pair_follows_the_table(old, new):
    assert is_legal(old, new) == ((old, new) in LEGAL)
    if (old, new) in LEGAL:
        check_transition(old, new)
    else:
        with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value} is not a legal"):
            check_transition(old, new, "t0000001")


def test_the_table_covers_every_state_and_terminal_states_lead_nowhere():
    assert set(TRANSITIONS) == set(TaskState)
    assert TERMINAL == {TaskState.SUCCEEDED, TaskState.FAILED, TaskState.CANCELLED}
    assert all(not TRANSITIONS[s] for s in TERMINAL)
    assert not NEEDS_PLACEMENT & TERMINAL and TaskState.PENDING not in NEEDS_PLACEMENT


def test_states_read_as_ps_shows_them_and_accept_their_text():
    assert [str(s) for s in TaskState] == [
        "Pending",
        "Starting",
        "Running",
        "Frozen",
        "Succeeded",
        "Failed",
        "Cancelled",
    ]
    check_transition("Pending", "Starting")
    err = pytest.raises(IllegalTransition, check_transition, "Failed", "Running", "t0000002")
    assert str(err.value) == "task t0000002: Failed -> Running is not a legal transition"
    assert (err.value.old, err.value.new) == (TaskState.FAILED, TaskState.RUNNING)
