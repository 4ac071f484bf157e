"""Rows of the events and intents tables that cannot be read back (edited by hand, bits lost
on disk) are those rows' alone: recovery after a restart reports and finishes an unreadable
intent and goes on with the others, and a Watch stream (`xhagent events`) shows an
unreadable event in its place and goes on past it. The scheduler loop over the fakes of
test_daemon_loop; rows corrupted with sqlite3 directly, on the real file the store has open.
"""

import logging
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from test_daemon_loop import Clock, FakeLeaf, Loop, node, task

from xhagent.daemon.api.client import connect
from xhagent.daemon.api.service import AgentService
from xhagent.daemon.api.transport import bind
from xhagent.daemon.api.v1 import agent_pb2 as pb
from xhagent.daemon.loop.faults import Faults
from xhagent.daemon.store import Placement, TaskState

SHARED = Placement("n1", (0, 1), False)


@pytest.fixture
def loop(tmp_path):
    made = Loop(tmp_path, node(), Clock())
    yield made
    made.close()


def corrupt(loop, table, key, at, column, value):
    with sqlite3.connect(loop.store.path) as db:  # foreign keys off, as a hand edit has them
        db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (value, at))


def starting(loop, task_id) -> int:
    """What a kill -9 between a start's intent and its outcome leaves: the intent's id."""
    with loop.store.atomic():
        intent = loop.store.begin_intent(task_id, "start", {"node": "n1"})
        loop.store.transition(task_id, TaskState.STARTING, placement=SHARED, cgroup="x")
    return intent


def outcomes(loop) -> dict[int, str]:
    with sqlite3.connect(loop.store.path) as db:
        return dict(db.execute("SELECT id, outcome FROM intents WHERE done_ns IS NOT NULL"))


def test_unreadable_intents_are_reported_finished_and_recovery_goes_on(loop, caplog):
    (cancelled,) = loop.submit(task("cancelled"))
    loop.step()
    never, started = loop.submit(task("never"), task("started"))
    never_start, started_start = starting(loop, never), starting(loop, started)
    loop.executor.leaves_[never] = FakeLeaf(Path("x"))  # the shim never answered
    loop.executor.start(started, 1, None, ["sleep", "60"], {}, None, None, None)  # it did
    lost = loop.store.begin_intent(cancelled, "signal")
    kill = loop.store.begin_intent(cancelled, "kill")  # a cancel cut half-way, after them
    corrupt(loop, "intents", "id", never_start, "args", "{not json")
    corrupt(loop, "intents", "id", started_start, "action", "explode")
    corrupt(loop, "intents", "id", lost, "task_id", b"\xff")

    with caplog.at_level(logging.ERROR, "xhagent"):
        counts = loop.restart()
    assert counts["unreadable_intents"] == 3
    assert (counts["rolled_back"], counts["adopted"], counts["ended"]) == (1, 1, 1)
    # each task was looked at by its record and its shim, its intent unread
    assert loop.state(never) == TaskState.PENDING and never not in loop.executor.leaves()
    assert loop.state(started) == TaskState.RUNNING
    assert loop.state(cancelled) == TaskState.CANCELLED  # the readable intent after them
    assert loop.store.open_intents() == []
    done = outcomes(loop)
    assert done[kill] == "recovered"
    assert done[never_start].startswith("unreadable: column args: not JSON (Expecting")
    assert done[started_start] == "unreadable: column action: 'explode' is not an intent action"
    assert done[lost] == "unreadable: column task_id: b'\\xff' is not text"

    said = loop.events("IntentUnreadable")
    assert [(e.task_id, e.detail) for e in said] == [
        (never, {"intent": never_start, "column": "args"}),
        (started, {"intent": started_start, "column": "action"}),
        (None, {"intent": lost, "column": "task_id"}),
    ]
    assert said[0].message.startswith(
        f"intent {never_start} of task {never}: its stored row is unreadable: column args: "
        "not JSON ("
    )
    assert said[2].message == (
        f"intent {lost}: its stored row is unreadable: column task_id: b'\\xff' is not text; "
        "finished as unreadable"
    )
    logged = [r for r in caplog.records if "its stored row is unreadable" in r.getMessage()]
    assert [r.getMessage() for r in logged] == [e.message for e in said]
    assert not any(r.exc_info for r in logged)

    # finished: the next start does not meet them again
    assert loop.restart()["unreadable_intents"] == 0
    assert len(loop.events("IntentUnreadable")) == 3
    assert loop.state(started) == TaskState.RUNNING


@pytest.fixture
def served(loop, tmp_path):
    service = AgentService(loop.scheduler, None, {}, Faults())
    sock = tmp_path / "run" / "agent.sock"
    server = bind(service, sock, group="xhagent-test-no-such-group")
    try:
        yield sock
    finally:
        server.stop(None)
        service.close()


def test_a_watch_goes_on_past_an_unreadable_event(loop, served):
    (first,) = loop.submit(task("first"))
    loop.step()
    stored = loop.store.events(0)
    bad = stored[1].seq
    corrupt(loop, "events", "seq", bad, "detail", "{not json")
    unreadable = f"event {bad}: its stored row is unreadable: column detail: not JSON ("

    with connect(served, timeout=10) as client:
        got = list(client.Watch(pb.WatchRequest(since_seq=0)))
        assert [e.seq for e in got] == [e.seq for e in stored]
        shown = got[1]
        assert (shown.kind, shown.task_id, shown.detail_json) == ("Unreadable", first, "{}")
        assert shown.message.startswith(unreadable) and shown.ts_ns == stored[1].ts_ns

        # a follower reads past it, and on to what happens after
        follow = client.Watch(pb.WatchRequest(since_seq=0, follow=True))
        seen = [next(follow) for _ in stored]
        assert [e.kind for e in seen] == [e.kind for e in got]
        (later,) = loop.submit(task("later"))
        after = next(follow)
        assert (after.task_id, after.kind) == (later, "Submitted")
        follow.close()

    cli = subprocess.run(
        [sys.executable, "-m", "xhagent.cli", "events", "--since", "0", "--socket", str(served)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert cli.returncode == 0, cli.stderr
    lines = cli.stdout.splitlines()
    assert len(lines) == len(stored) + 1, cli.stdout
    assert f" {first} " in lines[1] and f"Unreadable: {unreadable}" in lines[1], lines[1]
