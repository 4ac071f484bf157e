"""A task row that cannot be read back (edited by hand, bits lost on disk) is that task's
problem alone: lists carry on past it, `get` names the task and the column, and the agent's
own scans leave it out with one report. Rows are corrupted with sqlite3 directly, on the
real file the store has open."""

import logging
import sqlite3

import pytest

from xhagent.daemon.store import CorruptTask, Store, TaskState, TaskSummary

SUMMARY = TaskSummary(document=0, task_class="batch", priority=None, device_type="cpu")
DOC = "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: %s}\nspec: {deviceType: cpu}\n"

# (column, the value written there, the start of what is said of it)
CORRUPTIONS = [
    ("spec", "{not json", "column spec: not JSON (Expecting property name"),
    ("spec", "[1, 2]", "column spec: '[1, 2]' is not a JSON task summary"),
    ("spec", '{"class": 5, "task_priority": null}', "column spec: "),
    ("reasons", '"text"', "column reasons: '\"text\"' is not a JSON list of reasons"),
    ("placement", '{"cpus": ["a"]}', "column placement: "),
    ("state", "Exploded", "column state: 'Exploded' is not a task state"),
    ("attempt", "three", "column attempt: 'three' is not a count"),
    ("exit_code", 2**40, "column exit_code: 1099511627776 is not a 32-bit integer or NULL"),
    ("name", b"\xff\x00", "column name: b'\\xff\\x00' is not text"),
]


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "state")
    yield s
    s.close()


def submit(store, name):
    return store.submit(
        name=name, kind="cpu", source=DOC % name, source_file=f"{name}.yaml", summary=SUMMARY
    )


def corrupt(store, task_id, column, value):
    with sqlite3.connect(store.path) as db:
        db.execute(f"UPDATE tasks SET {column} = ? WHERE id = ?", (value, task_id))


@pytest.mark.parametrize(("column", "value", "said"), CORRUPTIONS)
def test_a_corrupt_row_is_its_task_s_alone(store, column, value, said, caplog):
    first, bad, last = (submit(store, n).id for n in ("first", "bad", "last"))
    corrupt(store, bad, column, value)

    with pytest.raises(CorruptTask) as err:
        store.get(bad, unreadable=True)
    assert str(err.value).startswith(f"task {bad}: its stored row is unreadable: {said}")
    assert (err.value.task_id, err.value.column) == (bad, column)
    assert "Error" not in str(err.value) and "<class" not in str(err.value)

    listed = store.list_tasks(None, unreadable=True)
    assert [getattr(t, "id", None) or t.task_id for t in listed] == [first, bad, last]
    assert isinstance(listed[1], CorruptTask)
    # the agent's own scans leave it out, and say so once however often they look
    with caplog.at_level(logging.ERROR, "xhagent"):
        for _ in range(5):
            assert [t.id for t in store.list_tasks(None)] == [first, last]
            assert [t.id for t in store.each_task(list(TaskState))] == [first, last]
            assert store.get(bad) is None and store.get(first).id == first
    reports = [r for r in caplog.records if bad in r.getMessage()]
    assert len(reports) == 1 and not reports[0].exc_info, caplog.text
    store.census()  # metrics read every row's JSON: a bad one must not stop them


def test_repairing_the_row_makes_the_task_readable_again(store):
    task = submit(store, "mended")
    corrupt(store, task.id, "spec", "{")
    with pytest.raises(CorruptTask):
        store.get(task.id, unreadable=True)
    store.add_event("Noted", "an event of a task whose row is unreadable", task_id=task.id)
    corrupt(store, task.id, "spec", '{"document": 0, "class": "batch", "task_priority": null}')
    assert store.get(task.id).summary.task_class == "batch"
