"""The state store on a plain directory: no root needed. Kill -9 is real (a child process
SIGKILLed at a random moment); the disk-full case needs a tmpfs and lives in tests/host."""

import hashlib
import math
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from xhagent.daemon.store import (
    Conflict,
    NotFound,
    Owner,
    Placement,
    Store,
    StoreError,
    TaskSummary,
    WaitReason,
    format_task_id,
    parse_task_id,
    schema,
)
from xhagent.daemon.store.states import IllegalTransition, TaskState
from xhagent.daemon.store.store import page_query

N1, N2 = Placement("n1", (), False), Placement("n2", (), False)
SUMMARY = TaskSummary(document=0, task_class="batch", priority=None, device_type="cpu")
DOC = "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: %s}\nspec: {deviceType: cpu}\n"


def submit(store, name="job", key=None, **kw):
    return store.submit(
        name=name,
        kind="cpu",
        source=DOC % name,
        source_file=f"{name}.yaml",
        summary=SUMMARY,
        idempotency_key=key,
        **kw,
    )


def labelled(labels) -> TaskSummary:
    return TaskSummary(document=0, task_class="batch", priority=None, labels=labels)


def digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "state")
    yield s
    s.close()


def test_create_and_reopen_keeps_the_data(tmp_path):
    d = tmp_path / "state"
    with Store.open(d) as s:
        a, b = submit(s, "a"), submit(s, "b")
        s.transition(a.id, TaskState.STARTING, placement=Placement("n1", (2, 3), exclusive=True))
    assert d.stat().st_mode & 0o777 == 0o700
    with Store.open(d) as s:
        got = s.get(a.id)
        assert got.state is TaskState.STARTING and got.placement == Placement("n1", (2, 3), True)
        assert got.attempt == 1 and got.source == DOC % "a" and got.summary == SUMMARY
        assert [t.id for t in s.list_tasks()] == [a.id, b.id]
        assert submit(s, "c").id > b.id  # ids keep sorting by submission after a reopen
        with sqlite3.connect(d / "state.db") as c:
            assert c.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert c.execute("PRAGMA user_version").fetchone()[0] == schema.latest()


def test_ids_are_decimal_sortable_and_parse_back():
    numbers = [1, 9, 10, 1000, 10**10 - 1]
    ids = [format_task_id(n) for n in numbers]
    assert ids[:3] == ["t0000000001", "t0000000009", "t0000000010"]
    assert ids == sorted(ids) and all(len(i) == 11 for i in ids)
    assert [parse_task_id(i) for i in ids] == numbers
    assert parse_task_id(format_task_id(10**10)) == 10**10  # one digit more, still an id
    for bad in ("", "t", "x0000000001", "t000000001a", "t" + "0" * 19, "t٠٠٠٠٠٠٠٠٠١", " t1"):
        with pytest.raises(ValueError, match="not a task id"):
            parse_task_id(bad)


def test_ids_given_before_the_decimal_ones_still_parse():
    # seven base32 digits (no i, l, o, u): the tasks submitted then keep them
    assert [parse_task_id(i) for i in ("t0000001", "t000000a", "t0000010", "tzzzzzzz")] == [
        1,
        10,
        32,
        32**7 - 1,
    ]
    for bad in ("t000000i", "t000000u", "t00000a", "t1"):  # not base32, or too short
        with pytest.raises(ValueError):
            parse_task_id(bad)


def test_a_repeated_idempotency_key_gets_the_same_task(store):
    first = submit(store, "a", key="client-1/42")
    again = submit(store, "a", key="client-1/42")
    assert again == first and len(store.list_tasks()) == 1
    assert [e.kind for e in store.events()] == ["Submitted"]
    with pytest.raises(Conflict, match="was used for task t0000000001 with another document"):
        submit(store, "other", key="client-1/42")
    assert submit(store, "a", key="client-1/43").id != first.id


def test_transition_compare_and_set_conflict_changes_nothing(store):
    t = submit(store)
    seq = store.last_event_seq()
    with pytest.raises(Conflict, match=f"task {t.id} is Pending, expected Running"):
        store.transition(t.id, TaskState.FROZEN, expect=TaskState.RUNNING)
    with pytest.raises(Conflict, match="expected Frozen or Running"):
        store.transition(t.id, TaskState.CANCELLED, expect=[TaskState.RUNNING, TaskState.FROZEN])
    assert store.get(t.id) == t and store.last_event_seq() == seq
    done = store.transition(t.id, TaskState.CANCELLED, expect=TaskState.PENDING, note="by the user")
    assert done.state is TaskState.CANCELLED and done.ended_ns is not None
    (ev,) = store.events(seq)
    assert (ev.kind, ev.message, ev.detail) == (
        "Transition",
        "Pending -> Cancelled: by the user",
        {"from": "Pending", "to": "Cancelled"},
    )


def test_illegal_transition_raises_and_changes_nothing(store):
    t = submit(store)
    seq = store.last_event_seq()
    with pytest.raises(IllegalTransition, match=f"task {t.id}: Pending -> Running"):
        store.transition(t.id, TaskState.RUNNING, placement=N1)
    with pytest.raises(StoreError, match="Starting needs a placement"):
        store.transition(t.id, TaskState.STARTING)
    with pytest.raises(NotFound, match="no task t0000999"):
        store.transition("t0000999", TaskState.CANCELLED)
    with pytest.raises(TypeError, match="unknown fields: colour"):
        store.transition(t.id, TaskState.CANCELLED, colour="red")
    assert store.get(t.id) == t and store.last_event_seq() == seq


def test_a_run_records_fields_and_a_restart_goes_back_to_pending(store):
    t = submit(store)
    store.transition(t.id, TaskState.STARTING, placement=N1)
    run = store.transition(t.id, TaskState.RUNNING, cgroup="/sys/fs/cgroup/xhagent.slice/t1")
    assert run.started_ns and run.cgroup.endswith("/t1")
    back = store.transition(
        t.id,
        TaskState.PENDING,
        exit_code=1,
        reasons=[WaitReason("BackOff", "", "restart 2 after exit code 1")],
    )
    assert back.placement is None and back.cgroup is None and back.exit_code == 1
    assert back.reasons == (WaitReason("BackOff", "", "restart 2 after exit code 1"),)
    again = store.transition(t.id, TaskState.STARTING, placement=N2)
    assert again.attempt == 2 and again.reasons == () and again.exit_code is None
    assert again.started_ns is None and again.placement == N2
    last = store.events(task_id=t.id)[-2:]
    assert last[0].detail == {"from": "Running", "to": "Pending", "exit_code": 1}
    assert last[1].detail == {"from": "Pending", "to": "Starting", "node": "n2"}
    with pytest.raises(StoreError, match="a WaitReason with a kind"):
        store.transition(t.id, TaskState.PENDING, reasons=[WaitReason("", "", "no kind")])
    with pytest.raises(StoreError, match="a WaitReason with a kind"):  # typed, not a dict
        store.transition(t.id, TaskState.PENDING, reasons=[{"kind": "BackOff"}])
    with pytest.raises(StoreError, match="a placement is a Placement, not dict"):
        store.transition(t.id, TaskState.STARTING, placement={"node": "n1"})


def test_pending_reasons_from_placement(store):
    from xhagent.policy.placement import Reason

    r = Reason("InsufficientGPUHardware", "node-03", "node-03 lacks CUDA 12.2 runtime")
    t = submit(store, reasons=[WaitReason(r.kind, r.node, str(r))])
    assert t.reasons == (WaitReason("InsufficientGPUHardware", "node-03", str(r)),)
    with pytest.raises(StoreError, match="a WaitReason"):  # the placement's own type is not
        submit(store, "other", reasons=[r])


def test_events_come_in_order_after_since_seq(store):
    a, b = submit(store, "a"), submit(store, "b")
    store.add_event("NodeLabels", "rack changed", detail={"rack": "r2"})
    store.transition(a.id, TaskState.CANCELLED)
    all_ = store.events()
    assert [e.seq for e in all_] == sorted(e.seq for e in all_) and len(all_) == 4
    assert [e.kind for e in store.events(all_[1].seq)] == ["NodeLabels", "Transition"]
    assert [e.task_id for e in store.events(task_id=a.id)] == [a.id, a.id]
    assert [e.task_id for e in store.events(task_id=b.id)] == [b.id]
    assert len(store.events(limit=2)) == 2 and store.events(since_seq=all_[-1].seq) == []
    assert all_[2].to_json()["detail"] == {"rack": "r2"}


def test_retention_prunes_the_oldest_events(tmp_path):
    with Store.open(tmp_path / "s", keep_events=10) as s:
        for i in range(25):
            s.add_event("Tick", f"tick {i}")
        got = s.events()
        assert [e.message for e in got] == [f"tick {i}" for i in range(15, 25)]


def test_intents_open_and_finished_survive_a_reopen(tmp_path):
    d = tmp_path / "s"
    with Store.open(d) as s:
        t = submit(s)
        with s.atomic():
            s.transition(t.id, TaskState.STARTING, placement=N1)
            start = s.begin_intent(t.id, "start", {"cgroup": "/x/t1"})
        freeze = s.begin_intent(t.id, "freeze")
        s.finish_intent(freeze, "ok: frozen 1")
        with pytest.raises(Conflict, match="already finished"):
            s.finish_intent(freeze, "again")
        with pytest.raises(StoreError, match="unknown intent 'explode'"):
            s.begin_intent(t.id, "explode")
        with pytest.raises(NotFound):
            s.begin_intent("t0000999", "kill")
    with Store.open(d) as s:
        (left,) = s.open_intents()
        assert (left.id, left.action, left.args, left.done_ns) == (
            start,
            "start",
            {"cgroup": "/x/t1"},
            None,
        )
        done = s.finish_intent(start, "rolled back: the shim never came up")
        assert done.outcome.startswith("rolled back") and done.done_ns
        assert s.open_intents() == []


def test_atomic_rolls_back_everything_inside(store):
    t = submit(store)
    seq = store.last_event_seq()
    with pytest.raises(RuntimeError), store.atomic():
        store.transition(t.id, TaskState.STARTING, placement=N1)
        store.begin_intent(t.id, "start")
        raise RuntimeError("the shim failed before the commit")
    assert store.get(t.id) == t and store.open_intents() == [] and store.last_event_seq() == seq


def test_after_commit_runs_once_the_outermost_transaction_commits_and_never_on_rollback(store):
    t = submit(store)
    seen: list[str] = []
    store.after_commit(lambda: seen.append("no transaction: at once"))
    assert seen == ["no transaction: at once"]
    with store.atomic():
        with store.atomic():  # a part of a larger one: after the larger one's commit
            store.add_event("Note", "inner", task_id=t.id)
            store.after_commit(lambda: seen.append(f"inner, committed: {store.last_event_seq()}"))
        assert seen == ["no transaction: at once"]
        store.add_event("Note", "outer", task_id=t.id)
        store.after_commit(lambda: seen.append("outer"))
    assert seen[1:] == [f"inner, committed: {store.last_event_seq()}", "outer"]
    with pytest.raises(RuntimeError), store.atomic():
        store.after_commit(lambda: seen.append("rolled back"))
        raise RuntimeError("before the commit")
    with store.atomic():  # nothing of the rolled-back one is left to run later
        store.add_event("Note", "again", task_id=t.id)
    assert seen[-1] == "outer" and len(seen) == 3
    works = [  # one work undone to its savepoint: its own callback goes with it
        lambda: store.after_commit(lambda: seen.append("kept")),
        lambda: (store.after_commit(lambda: seen.append("undone")), 1 / 0),
    ]
    out = store.commit_each(works)
    assert isinstance(out[1], ZeroDivisionError) and seen[-1] == "kept" and len(seen) == 4


def test_an_error_inside_atomic_ends_the_whole_update(store, monkeypatch):
    from xhagent.daemon.store import TaskRecord

    t = submit(store)
    seq = store.last_event_seq()
    with pytest.raises(StoreError, match="an error inside ended this update"), store.atomic():
        store.add_event("Note", "before", task_id=t.id)
        with monkeypatch.context() as m:
            m.setattr(TaskRecord, "COLUMNS", "no_such_column")
            with pytest.raises(StoreError, match="no such column"):
                submit(store, "x")  # SQLite may have ended the transaction here
        with pytest.raises(StoreError, match="an earlier error ended this update"):
            store.add_event("Note", "after", task_id=t.id)
    assert store.last_event_seq() == seq and len(store.list_tasks()) == 1
    with pytest.raises(NotFound, match="no task t0000999"):
        store.add_event("Note", "for no one", task_id="t0000999")
    with pytest.raises(StoreError, match="event detail must be a mapping, not list"):
        store.add_event("Note", "odd", detail=[1])
    with pytest.raises(StoreError, match="kill arguments must be a mapping, not str"):
        store.begin_intent(t.id, "kill", "9")
    with pytest.raises(StoreError, match="'bogus' is not a task id"):
        store.list_tasks(after="bogus")


def test_policy_versions_and_removal(store):
    assert store.put_policy("SchedulingPolicy", "gpu", "v: 1", "gpu.yaml") == 1
    assert store.put_policy("SchedulingPolicy", "gpu", "v: 1", "gpu.yaml") == 1  # unchanged
    assert store.put_policy("SchedulingPolicy", "gpu", "v: 2", "gpu.yaml") == 2
    assert store.put_policy("CgroupPolicy", "io", "g: 1", "io.yaml") == 1
    active = store.active_policies()
    assert [(p.kind, p.name, p.version, p.source) for p in active] == [
        ("CgroupPolicy", "io", 1, "g: 1"),
        ("SchedulingPolicy", "gpu", 2, "v: 2"),
    ]
    assert store.remove_policy("SchedulingPolicy", "gpu") == 2
    assert [p.name for p in store.active_policies()] == ["io"]
    assert [p.name for p in store.active_policies("SchedulingPolicy")] == []
    with pytest.raises(NotFound, match="no active SchedulingPolicy gpu"):
        store.remove_policy("SchedulingPolicy", "gpu")
    assert store.put_policy("SchedulingPolicy", "gpu", "v: 1", "gpu.yaml") == 3  # never reused
    assert store.active_policies("SchedulingPolicy")[0].version == 3
    # the event that says so is the policy set's, in its transaction: none of the store's
    assert [e.kind for e in store.events()] == []


def test_inputs_are_bounded(store):
    with pytest.raises(StoreError, match="its document is 1048577 bytes, more than the limit"):
        store.submit(
            name="big", kind="cpu", source="x" * ((1 << 20) + 1), source_file="b", summary=SUMMARY
        )
    with pytest.raises(StoreError, match="cannot be stored as JSON"):
        store.submit(
            name="nan", kind="cpu", source="x", source_file="n", summary=labelled({"x": math.nan})
        )
    with pytest.raises(StoreError, match="task name must be a non-empty string"):
        store.submit(name="", kind="cpu", source="x", source_file="n", summary=SUMMARY)
    with pytest.raises(StoreError, match="task name is not valid UTF-8"):
        store.submit(name="\udc80", kind="cpu", source="x", source_file="n", summary=SUMMARY)
    with pytest.raises(StoreError, match="its summary is not valid UTF-8"):
        store.submit(
            name="s", kind="cpu", source="x", source_file="n", summary=labelled({"\udc80": "1"})
        )
    t = submit(store)
    with pytest.raises(StoreError, match="exit_code must be a 64-bit integer or None, not 1844"):
        store.transition(t.id, TaskState.FAILED, exit_code=2**64)
    with pytest.raises(StoreError, match="attempt must be a 64-bit integer or None, not '1'"):
        store.transition(t.id, TaskState.FAILED, attempt="1")
    long = store.transition(t.id, TaskState.FAILED, error="e" * 100_000).error
    assert len(long.encode()) <= 4096 and long.endswith("…")
    assert store.list_tasks() == [store.get(t.id)]


def test_list_tasks_filters_and_pages(store):
    ids = [submit(store, f"j{i}").id for i in range(5)]
    store.transition(ids[1], TaskState.CANCELLED)
    assert [t.id for t in store.list_tasks([TaskState.PENDING])] == ids[:1] + ids[2:]
    assert [t.id for t in store.list_tasks(limit=2)] == ids[:2]
    assert [t.id for t in store.list_tasks(after=ids[2])] == ids[3:]
    assert [t.id for t in store.list_tasks(["Cancelled"])] == [ids[1]]


def test_a_callers_tasks_in_some_states_page_in_order_on_one_index_range_each(store):
    owners = [Owner(1000, 1000, 1000), Owner(1001, 1001, 1001)]
    states = [TaskState.PENDING, TaskState.CANCELLED, TaskState.PENDING, TaskState.FAILED]
    made = []  # (id, owner uid, state)
    for i in range(40):
        owner, state = owners[i % 3 == 0], states[i % 4]
        rec = submit(store, f"j{i}", owner=owner)
        if state is TaskState.FAILED:
            store.transition(rec.id, TaskState.STARTING, placement=N1)
            store.transition(rec.id, TaskState.FAILED, error="x")
        elif state is not TaskState.PENDING:
            store.transition(rec.id, state)
        made.append((rec.id, owner.uid, state))
    wanted = {TaskState.PENDING, TaskState.FAILED}
    for newest_first in (False, True):
        expect = [i for i, uid, st in made if uid == 1000 and st in wanted]
        expect = expect[::-1] if newest_first else expect
        got, after = [], None
        while True:  # pages of 4, across states
            page, more = store.task_page(
                wanted, after=after, limit=4, newest_first=newest_first, owner_uid=1000
            )
            got += [t.id for t in page]
            if not more:
                break
            after = page[-1].id
        assert got == expect and len(expect) > 8
    assert store.count_tasks(wanted, owner_uid=1000) == len(expect)
    query, args = page_query(7, True, 1000, {"Pending", "Running"}, 10)
    with sqlite3.connect(store.path) as c:
        plan = [r[-1] for r in c.execute(f"EXPLAIN QUERY PLAN {query}", args)]
    ranges = [p for p in plan if p.startswith("SEARCH tasks")]
    one = "SEARCH tasks USING COVERING INDEX tasks_owner_state (owner_uid=? AND state=? AND seq<?)"
    assert ranges == [one] * 2, plan


def test_a_second_agent_on_the_same_dir_is_refused(tmp_path):
    d = tmp_path / "s"
    code = (
        "import sys; from pathlib import Path; from xhagent.daemon.store import Store, StoreError\n"
        "try: Store.open(Path(sys.argv[1]))\n"
        "except StoreError as e: print(e); sys.exit(1)\n"
    )
    with Store.open(d):
        res = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True)
        assert res.returncode == 1, res.stderr
        assert res.stdout.strip() == f"state dir {d} is in use by pid {os.getpid()} (lock {d}/lock)"
    res = subprocess.run([sys.executable, "-c", code, str(d)], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == "", res.stdout + res.stderr


def test_a_newer_schema_is_refused_and_left_as_it_is(tmp_path):
    d = tmp_path / "s"
    Store.open(d).close()
    with sqlite3.connect(d / "state.db") as c:
        c.execute(f"PRAGMA user_version = {schema.latest() + 1}")
    before = digest(d / "state.db")
    with pytest.raises(StoreError) as err:
        Store.open(d)
    assert str(err.value) == (
        f"{d}/state.db has schema version {schema.latest() + 1}, newer than this "
        f"xhagent's {schema.latest()}: run a newer xhagent, or move the file away"
    )
    assert digest(d / "state.db") == before
    with pytest.raises(StoreError, match="newer"):  # the lock was released on the way out
        Store.open(d)


@pytest.mark.parametrize(
    "content,why",
    [
        (b"not a database at all\n" * 300, "file is not a database"),
        (None, "another program's tables"),
        ("corrupt", "quick_check|malformed"),
    ],
)
def test_a_file_that_is_not_ours_is_refused_and_left_as_it_is(tmp_path, content, why):
    d = tmp_path / "s"
    d.mkdir()
    db = d / "state.db"
    if content is None:
        with sqlite3.connect(db) as c:
            c.execute("CREATE TABLE photos (x)")
    elif content == "corrupt":
        with Store.open(d) as s:
            for i in range(200):
                submit(s, f"j{i}")
        data = bytearray(db.read_bytes())
        data[4096 * 3 : 4096 * 3 + 512] = os.urandom(512)  # a b-tree page, not the header
        db.write_bytes(bytes(data))
    else:
        db.write_bytes(content)
    before = digest(db)
    with pytest.raises(StoreError, match=why) as err:
        Store.open(d)
    msg = str(err.value)
    assert msg.startswith(f"{db} is not an xhagent state database (") and "\n" not in msg
    assert msg.endswith("): move it away or restore a backup")
    assert digest(db) == before


def test_a_migration_keeps_the_rows(tmp_path, monkeypatch):
    d = tmp_path / "s"
    now = schema.latest()
    with Store.open(d) as s:  # a database as the released agent made it
        t = submit(s, "kept")
        s.put_policy("CgroupPolicy", "io", "g: 1", "io.yaml")
    with sqlite3.connect(d / "state.db") as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == now
    step = schema.sql("ALTER TABLE tasks ADD COLUMN priority INTEGER NOT NULL DEFAULT 50")
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, step])
    with Store.open(d) as s:
        assert s.get(t.id) == t and s.active_policies()[0].source == "g: 1"
        assert submit(s, "new").id == "t0000000002"
    with sqlite3.connect(d / "state.db") as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == now + 1
        assert c.execute("SELECT name, priority FROM tasks ORDER BY seq").fetchall() == [
            ("kept", 50),
            ("new", 50),
        ]


def test_a_version_1_database_gains_the_preemption_count(tmp_path, monkeypatch):
    d = tmp_path / "s"
    with monkeypatch.context() as m:
        m.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:1])
        Store.open(d).close()
    with sqlite3.connect(d / "state.db") as c:  # a task as version 1 kept it
        c.execute(
            "INSERT INTO tasks (id, name, kind, source, source_file, spec, state, attempt, "
            "placement, created_ns, updated_ns) VALUES "
            "('t0000001', 'old', 'cpu', 'doc', '-', '{}', 'Running', 1, '{}', 1, 1)"
        )
    with Store.open(d) as s:  # migrated to the latest on open
        assert (s.get("t0000001").attempt, s.get("t0000001").preempted) == (1, 0)
        rec = s.transition(
            "t0000001", TaskState.PENDING, reasons=[WaitReason("Preempted")], preempted=1
        )
        assert (rec.attempt, rec.preempted) == (1, 1)


def test_tasks_keep_ids_of_the_earlier_kind_beside_the_decimal_ones(tmp_path):
    d = tmp_path / "s"
    Store.open(d).close()
    with sqlite3.connect(d / "state.db") as c:  # as an agent giving base32 ids left them
        for seq, task_id in ((31, "t000000z"), (32, "t0000010")):
            c.execute(
                "INSERT INTO tasks (seq, id, name, kind, source, source_file, spec, state, "
                "created_ns, updated_ns) VALUES (?, ?, 'old', 'cpu', 'doc', '-', '{}', "
                "'Pending', 1, 1)",
                (seq, task_id),
            )
    with Store.open(d) as s:
        assert submit(s, "new").id == "t0000000033"  # the numbering goes on
        assert [r.id for r in s.list_tasks()] == ["t000000z", "t0000010", "t0000000033"]
        assert [r.id for r in s.list_tasks(after="t000000z")] == ["t0000010", "t0000000033"]
        assert [r.id for r in s.list_tasks(after="t0000000033", newest_first=True)] == [
            "t0000010",
            "t000000z",
        ]
        assert s.get("t0000010").name == "old"


def test_a_failing_migration_leaves_the_previous_version(tmp_path, monkeypatch):
    d = tmp_path / "s"
    with Store.open(d) as s:
        submit(s)
    now = schema.latest()
    bad = schema.sql("ALTER TABLE tasks ADD COLUMN x INTEGER", "SELECT * FROM nowhere")
    monkeypatch.setattr(schema, "MIGRATIONS", [*schema.MIGRATIONS, bad])
    with pytest.raises(StoreError, match="no such table: nowhere"):
        Store.open(d)
    with sqlite3.connect(d / "state.db") as c:
        assert c.execute("PRAGMA user_version").fetchone()[0] == now
        assert "x" not in [r[1] for r in c.execute("PRAGMA table_info(tasks)")]


SUBMITTER = """
import sys
from pathlib import Path
from xhagent.daemon.store import Store, TaskSummary
store = Store.open(Path(sys.argv[1]))
i = int(sys.argv[2])
while True:
    t = store.submit(name=f"j{i}", kind="cpu", source=f"doc {i}", source_file="-",
                     summary=TaskSummary(i, "batch", None), idempotency_key=f"k{i}")
    if i % 3 == 0 and t.state == "Pending":  # a retry may find it cancelled already
        store.transition(t.id, "Cancelled")
    print(i, t.id, flush=True)  # acknowledged: the commit returned
    i += 1
"""


def test_kill_9_at_any_moment_loses_and_duplicates_nothing(tmp_path):
    d, rng = tmp_path / "s", random.Random(os.getpid())
    acked: dict[int, str] = {}
    for _ in range(10):
        # The child resumes at the first submission it never acknowledged, as a client
        # retrying with the same key would: it may or may not have been committed.
        start = max(acked, default=-1) + 1
        child = subprocess.Popen(
            [sys.executable, "-c", SUBMITTER, str(d), str(start)],
            stdout=subprocess.PIPE,
            text=True,
        )
        first = child.stdout.readline()  # it is in its loop: kill it somewhere in there
        time.sleep(rng.random() * 0.3)
        os.kill(child.pid, signal.SIGKILL)
        out = first + child.communicate()[0]
        for line in out.split("\n")[:-1]:  # whole lines only: the last may be cut short
            i, tid = line.split()
            assert acked.setdefault(int(i), tid) == tid
    assert len(acked) > 10
    with Store.open(d) as s:
        tasks, page = [], s.list_tasks(limit=1000)
        while page:  # pages of at most 1000
            tasks += page
            page = s.list_tasks(after=page[-1].id, limit=1000)
        by_key = {}
        for t in tasks:
            assert t.idempotency_key not in by_key, f"duplicate {t.idempotency_key}"
            by_key[t.idempotency_key] = t
        for i, tid in acked.items():
            assert by_key[f"k{i}"].id == tid
            assert by_key[f"k{i}"].state is (
                TaskState.CANCELLED if i % 3 == 0 else TaskState.PENDING
            )
        # Nothing beyond one possibly committed but unacknowledged submission per kill.
        assert set(by_key) <= {f"k{i}" for i in range(max(acked) + 2)}
    with sqlite3.connect(d / "state.db") as c:
        assert c.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
