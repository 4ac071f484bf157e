"""Rows of the events table that cannot be read back (edited by hand, bits lost on disk) are
those rows' alone: a Watch stream (`xhagent events`) shows an unreadable event in its place
and goes on past it. The scheduler loop over the fakes of test_daemon_loop; rows corrupted
with sqlite3 directly, on the real file the store has open.
"""

import sqlite3
import subprocess
import sys

import pytest
from test_daemon_loop import Clock, Loop, node, task

from xhagent.daemon.api.client import connect
from xhagent.daemon.api.service import AgentService
from xhagent.daemon.api.transport import bind
from xhagent.daemon.api.v1 import agent_pb2 as pb
from xhagent.daemon.loop.faults import Faults


@pytest.fixture
def loop(tmp_path):
    made = Loop(tmp_path, node(), Clock())
    yield made
    made.close()


def corrupt(loop, table, key, at, column, value):
    with sqlite3.connect(loop.store.path) as db:  # foreign keys off, as a hand edit has them
        db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (value, at))


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
