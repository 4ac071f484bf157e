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


# -- events and intents: a row that cannot be read is that row's alone as well ----------------


def corrupt_row(store, table, key, at, column, value):
    with sqlite3.connect(store.path) as db:
        db.execute(f"UPDATE {table} SET {column} = ? WHERE {key} = ?", (value, at))


def test_an_unreadable_event_is_shown_in_its_place_and_the_stream_goes_on(store, caplog):
    task = submit(store, "watched")
    added = [store.add_event("Noted", f"note {i}", task_id=task.id) for i in range(4)]
    seqs = [e.seq for e in added]
    corrupt_row(store, "events", "seq", seqs[1], "detail", "{not json")
    corrupt_row(store, "events", "seq", seqs[2], "ts_ns", "yesterday")

    with caplog.at_level(logging.ERROR, "xhagent"):
        for _ in range(3):  # read as every follower of the stream reads it
            got = store.events(seqs[0] - 1)
    assert [e.seq for e in got] == seqs
    assert [e.kind for e in got] == ["Noted", "Unreadable", "Unreadable", "Noted"]
    bad_detail, bad_time = got[1], got[2]
    assert bad_detail.message.startswith(
        f"event {seqs[1]}: its stored row is unreadable: column detail: not JSON ("
    )
    assert bad_time.message == (
        f"event {seqs[2]}: its stored row is unreadable: column ts_ns: 'yesterday' is not an "
        "integer"
    )
    assert (bad_detail.task_id, bad_detail.detail) == (task.id, {})
    assert bad_detail.ts_ns == added[1].ts_ns and bad_time.ts_ns == 0  # kept where it reads
    assert (got[0], got[3]) == (added[0], added[3])  # the others read as they always did
    reports = [r.getMessage() for r in caplog.records]
    assert len(reports) == 2, reports  # once each, however often it is read
    assert reports[1].endswith("; it is shown as an Unreadable event until the row is repaired")


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        ("detail", "[1, 2]", "'[1, 2]' is not a JSON object"),
        ("kind", b"", "b'' is not text"),
        ("message", b"\xff", "b'\\xff' is not text"),
        ("task_id", b"\xff", "b'\\xff' is not text or NULL"),
    ],
)
def test_every_column_of_an_event_is_read_as_what_it_holds(store, column, value, said):
    task = submit(store, "watched")
    event = store.add_event("Noted", "a note", task_id=task.id, detail={"k": 1})
    corrupt_row(store, "events", "seq", event.seq, column, value)
    (got,) = store.events(event.seq - 1)
    assert got.kind == "Unreadable"
    assert got.message == f"event {got.seq}: its stored row is unreadable: column {column}: {said}"
    assert got.task_id == (None if column == "task_id" else task.id)


def test_an_event_whose_task_cannot_be_read_is_for_admins_alone(store):
    from xhagent.daemon.store import Owner

    mine = store.submit(
        name="mine",
        kind="cpu",
        source=DOC % "mine",
        source_file="m.yaml",
        summary=SUMMARY,
        owner=Owner(1000, 1000, 1000),
    )
    unreadable_detail = store.add_event("Noted", "its detail is lost", task_id=mine.id).seq
    lost_task = store.add_event("Noted", "its task is lost", task_id=mine.id).seq
    corrupt_row(store, "events", "seq", unreadable_detail, "detail", "{")
    corrupt_row(store, "events", "seq", lost_task, "task_id", b"\x01")

    owners = store.events(0, owner_uid=1000)
    assert [e.seq for e in owners if e.kind == "Unreadable"] == [unreadable_detail]
    assert all(e.task_id == mine.id for e in owners)
    admins = {e.seq: e for e in store.events(0)}
    assert admins[lost_task].kind == "Unreadable" and admins[lost_task].task_id is None
    assert store.events(0, owner_uid=1001) == []


def test_an_unreadable_intent_is_listed_in_its_place_and_can_be_finished(store):
    from xhagent.daemon.store import Conflict, CorruptIntent

    task = submit(store, "acted-on")
    first, bad, last = (store.begin_intent(task.id, a) for a in ("freeze", "thaw", "kill"))
    corrupt_row(store, "intents", "id", bad, "created_ns", "noon")

    listed = store.open_intents()
    assert [getattr(i, "id", None) or i.intent_id for i in listed] == [first, bad, last]
    corrupt = listed[1]
    assert isinstance(corrupt, CorruptIntent)
    assert (corrupt.intent_id, corrupt.task_id, corrupt.column) == (bad, task.id, "created_ns")
    assert str(corrupt) == (
        f"intent {bad} of task {task.id}: its stored row is unreadable: column created_ns: "
        "'noon' is not an integer"
    )
    # finished all the same: it is not met again
    assert isinstance(store.finish_intent(bad, "unreadable: column created_ns"), CorruptIntent)
    assert [i.id for i in store.open_intents()] == [first, last]
    with pytest.raises(Conflict, match=r"already finished: unreadable: column created_ns$"):
        store.finish_intent(bad, "again")


@pytest.mark.parametrize(
    ("column", "value", "task_known", "said"),
    [
        ("args", "{not json", True, "not JSON (Expecting property name"),
        ("args", "[]", True, "'[]' is not a JSON object"),
        ("action", "explode", True, "'explode' is not an intent action"),
        ("task_id", b"\xff", False, "b'\\xff' is not text"),
        ("outcome", b"\x00", True, "b'\\x00' is not text or NULL"),
    ],
)
def test_every_column_of_an_intent_is_read_as_what_it_holds(store, column, value, task_known, said):
    task = submit(store, "acted-on")
    intent = store.begin_intent(task.id, "start", {"node": "n1"})
    with sqlite3.connect(store.path) as db:  # a hand edit with foreign keys off
        db.execute(f"UPDATE intents SET {column} = ? WHERE id = ?", (value, intent))
    (corrupt,) = store.open_intents()
    of = f" of task {task.id}" if task_known else ""
    assert str(corrupt).startswith(
        f"intent {intent}{of}: its stored row is unreadable: column {column}: {said}"
    ), str(corrupt)


POLICY = (
    "apiVersion: xh.scheduling/v1\nkind: SchedulingPolicy\nmetadata: {{name: {name}}}\n"
    "spec:\n  priority: {priority}\n  matchRules:\n    - selector: {{matchLabels: {{app: x}}}}\n"
)


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        ("version", "two", "SchedulingPolicy b: its stored row is unreadable: column version: "
         "'two' is not a version (1 or more)"),
        ("source", b"\x00\xff", "SchedulingPolicy b: its stored row is unreadable: column source: "
         "b'\\x00\\xff' is not text"),
        ("kind", b"\x07", "policy b: its stored row is unreadable: column kind: "
         "b'\\x07' is not text"),
    ],
)  # fmt: skip
def test_an_unreadable_policy_row_keeps_only_itself_out_of_force(tmp_path, column, value, said):
    from xhagent.daemon.policies.policy_set import PolicySet
    from xhagent.daemon.store import CorruptPolicy

    store = Store.open(tmp_path / "state")
    for name in ("a", "b", "c"):
        store.put_policy("SchedulingPolicy", name, POLICY.format(name=name, priority=5), "f")
    with sqlite3.connect(store.path) as db:
        db.execute(f"UPDATE policies SET {column} = ? WHERE name = 'b'", (value,))
    active = store.active_policies()
    bad = [p for p in active if isinstance(p, CorruptPolicy)]
    assert len(active) == 3 and len(bad) == 1 and str(bad[0]) == said
    seen: list[tuple[str, str]] = []
    ps = PolicySet(None, store, lambda: 1, lambda k, m: seen.append((k, m)))
    assert [p.name for p in ps.scheduling()] == ["a", "c"]
    assert seen == [("PolicyRejected", f"{said}; applied through the API, it is not in force")]
    store.close()
