"""A full state disk as one condition (loop.diskfull), a start whose outcome it refused
committed later, the dropped-output count the store keeps with a task (schema V4), and how
a dropped count is said."""

import errno
import logging
import sqlite3

import pytest
from test_daemon_loop import Clock, Loop, node, task

from xhagent.daemon.exec.shim import ShimExit, dropped_message
from xhagent.daemon.loop.diskfull import DiskFull
from xhagent.daemon.store import Placement, Store, StoreFull, TaskState, schema


def test_a_full_disk_is_one_line_when_it_starts_and_one_when_it_clears(tmp_path, caplog):
    room = {"free": False}
    disk = DiskFull(tmp_path, room=lambda path: room["free"])
    caplog.set_level(logging.INFO, logger="xhagent")
    assert not disk.full and disk.check() is False and disk.health() is None
    disk.failed("start", "t1: no space left on device (ENOSPC): /s/tasks/t1/1")
    for _ in range(5):
        disk.failed("write", "/s is full: task t2 -> Pending was refused")
        assert disk.check() is True  # no room yet
    assert disk.full and disk.totals() == {"start": 1, "write": 5}
    assert disk.health().startswith("state disk full since ")
    assert "1 start(s) refused, 5 write(s) failed" in disk.health()
    room["free"] = True
    assert disk.check() is False and not disk.full and disk.health() is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2, lines
    assert lines[0].startswith("state disk full: t1: no space left on device (ENOSPC)")
    assert "1 start(s) refused, 5 write(s) failed meanwhile" in lines[1]
    assert all(r.exc_info is None for r in caplog.records)  # a known condition: no traceback
    # a second spell is counted on its own; the totals go on
    disk.failed("write", "again")
    room["free"] = True
    disk.check()
    assert "0 start(s) refused, 1 write(s) failed" in caplog.records[-1].getMessage()
    assert disk.totals() == {"start": 1, "write": 6}


def test_a_version_3_database_gains_the_dropped_count_and_a_new_attempt_clears_it(
    tmp_path, monkeypatch
):
    d = tmp_path / "s"
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:3])
        Store.open(d).close()
    with sqlite3.connect(d / "state.db") as c:  # a task as version 3 kept it
        assert "output_dropped" not in [r[1] for r in c.execute("PRAGMA table_info(tasks)")]
        c.execute(
            "INSERT INTO tasks (id, name, kind, source, source_file, spec, state, "
            "created_ns, updated_ns) VALUES "
            "('t0000001', 'old', 'Task', 'doc', '-', '{}', 'Pending', 1, 1)"
        )
    task_id = "t0000001"
    placed = Placement(node="n", cpus=(0,), exclusive=False)
    with Store.open(d) as s:  # migrated on open: the old task reads as having dropped nothing
        assert s.get(task_id).output_dropped == 0
        s.transition(task_id, TaskState.STARTING, placement=placed)
        s.transition(task_id, TaskState.RUNNING)
        backoff = s.transition(task_id, TaskState.PENDING, exit_code=1, output_dropped=4096)
        assert backoff.output_dropped == 4096  # the attempt's outcome, kept while it waits
        assert s.transition(task_id, TaskState.STARTING, placement=placed).output_dropped == 0
        s.transition(task_id, TaskState.RUNNING)
        assert s.transition(task_id, TaskState.FAILED, output_dropped=7).output_dropped == 7
    with Store.open(d) as s:  # durable
        assert s.get(task_id).output_dropped == 7


def test_the_dropped_message_says_how_much_of_which_stream_and_why():
    capped = ShimExit(exit_code=0, stdout_dropped=4 << 20, stderr_dropped=10)
    assert dropped_message(capped, 16 << 20) == (
        "4194314 bytes of output dropped (stdout 4194304, stderr 10): each stream is capped "
        "at 16 MiB"
    )
    full = ShimExit(exit_code=0, stdout_dropped=5, output_errno=errno.ENOSPC)
    assert dropped_message(full, 1000).endswith(
        "stderr 0): cap 1000, and the disk had no room for more (ENOSPC)"
    )
    broken = ShimExit(exit_code=0, stderr_dropped=1, output_errno=errno.EIO)
    assert dropped_message(broken, 1 << 20).endswith(
        "capped at 1 MiB; a write failed: input/output error (EIO)"
    )


def test_a_start_whose_outcome_a_full_disk_refused_is_committed_by_a_later_step(
    tmp_path, monkeypatch
):
    loop = Loop(tmp_path, node(), Clock())
    real = loop.store.transition

    def refuse_outcomes(task_id, to, **kw):  # what a full disk does to a start's outcome
        if to in (TaskState.RUNNING, TaskState.FAILED):
            raise StoreFull(f"{tmp_path} is full: task {task_id} -> {to} was refused")
        return real(task_id, to, **kw)

    try:
        (bad,) = loop.submit(task("bad", command="[no-such-program]"))
        monkeypatch.setattr(loop.store, "transition", refuse_outcomes)
        with pytest.raises(StoreFull):
            loop.step()
        assert loop.state(bad) == TaskState.STARTING  # not committed, and not forgotten
        monkeypatch.setattr(loop.store, "transition", real)
        loop.step()
        rec = loop.store.get(bad)
        assert rec.state == TaskState.FAILED and "no such file" in rec.error

        (good,) = loop.submit(task("good"))
        monkeypatch.setattr(loop.store, "transition", refuse_outcomes)
        with pytest.raises(StoreFull):
            loop.step()
        assert loop.state(good) == TaskState.STARTING
        loop.executor.exit(good, 0)  # its workload ends before its Running is committed
        monkeypatch.setattr(loop.store, "transition", real)
        loop.step()
        assert loop.state(good) == TaskState.SUCCEEDED
        assert loop.store.open_intents() == []
    finally:
        loop.close()
