"""Task rows that hold the same summary or reasons text are read once: every row holding the
text gets the same value, a row with another text its own, and the texts kept are bounded."""

import json

import pytest

from xhagent.daemon.store import Store, TaskState, TaskSummary, WaitReason
from xhagent.daemon.store.records import SHARED_BYTES, SHARED_TEXT, SharedJson

DOC = "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: %s}\nspec: {deviceType: cpu}\n"


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "state")
    yield s
    s.close()


def submit(store, name, labels):
    summary = TaskSummary(0, "batch", None, "cpu", labels=labels)
    return store.submit(name=name, kind="cpu", source=DOC % name, source_file="-", summary=summary)


def test_rows_with_one_text_share_its_value_and_others_keep_theirs(store):
    a, b = (submit(store, n, {"app": "web"}).id for n in ("a", "b"))
    c = submit(store, "c", {"app": "db"}).id
    waiting = (WaitReason("InsufficientCPU", "n1", "2 CPUs free of 4"),)
    for task_id in (a, c):
        store.transition(task_id, TaskState.PENDING, reasons=waiting)

    got = {t.id: t for t in store.list_tasks(None)}
    assert got[a].summary is got[b].summary
    assert dict(got[c].summary.labels) == {"app": "db"}
    assert dict(got[a].summary.labels) == {"app": "web"}
    assert got[a].reasons == got[c].reasons == waiting
    assert got[b].reasons == ()


def test_the_kept_texts_are_bounded_and_a_long_text_is_not_kept():
    column = SharedJson(lambda doc: doc)
    for i in range(4 * SHARED_BYTES // 64):
        assert column(json.dumps({"n": i, "pad": "x" * 40})) == {"n": i, "pad": "x" * 40}
    assert 0 < column.held <= SHARED_BYTES

    held = column.held
    long = json.dumps(["y" * SHARED_TEXT])
    assert column(long) == ["y" * SHARED_TEXT]
    assert column.held == held


def test_a_text_that_does_not_read_is_refused_every_time():
    column = SharedJson(lambda doc: doc["kind"])
    for _ in range(2):
        with pytest.raises(ValueError):
            column("{not json")
        with pytest.raises(KeyError):
            column("{}")
    assert column.held == 0
