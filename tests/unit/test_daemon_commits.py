"""Group commit (loop/commits.py, Store.commit_each) on a real store in a temporary dir.

A batch is made deterministic by its leader: the first caller's work waits inside the
transaction until the test has seen every other caller queued behind it; those then make
the next batch together. What a caller was told is checked against the database file read
through a second connection, as another process would see it after a crash."""

import sqlite3
import threading
import time

import pytest

from xhagent.daemon.loop.commits import Commits
from xhagent.daemon.store import Conflict, Store, StoreError, TaskSummary

SUMMARY = TaskSummary(document=0, task_class="batch", priority=None, device_type="cpu")
DOC = "apiVersion: xh.scheduling/v1\nkind: Task\nmetadata: {name: %s}\nspec: {deviceType: cpu}\n"


def submit(store, name, key=None, doc=None):
    return store.submit(
        name=name,
        kind="cpu",
        source=doc or DOC % name,
        source_file=f"{name}.yaml",
        summary=SUMMARY,
        idempotency_key=key,
    )


@pytest.fixture
def store(tmp_path):
    s = Store.open(tmp_path / "state")
    yield s
    s.close()


def committed(store) -> dict[str, str]:
    """name -> id of the tasks on disk, read by a connection of its own."""
    with sqlite3.connect(store.path) as c:
        return dict(c.execute("SELECT name, id FROM tasks").fetchall())


def add_sql(store, sql: str) -> None:
    """A trigger or table added beside the store's schema, as another process could."""
    with sqlite3.connect(store.path) as c:
        c.executescript(sql)


class Batch:
    """Callers of `commits.run` on threads of their own, the first leading a batch alone
    while the others queue behind it; `release()` lets the rest commit as one batch."""

    def __init__(self, commits: Commits, store: Store):
        self.commits, self.store = commits, store
        self.results: dict[str, object] = {}
        self.seen: dict[str, dict[str, str]] = {}  # what was on disk when each returned
        self._gate, self._leading = threading.Event(), threading.Event()
        self._threads: list[threading.Thread] = []

    def _call(self, label: str, work) -> None:
        try:
            self.results[label] = self.commits.run(work, 100)
        except Exception as exc:
            self.results[label] = exc
        self.seen[label] = committed(self.store)

    def _start(self, label, work) -> None:
        t = threading.Thread(target=self._call, args=(label, work))
        t.start()
        self._threads.append(t)

    def lead(self, name: str) -> None:
        def work():
            self._leading.set()
            assert self._gate.wait(30)
            return submit(self.store, name)

        self._start(name, work)
        assert self._leading.wait(30)

    def queue(self, works: dict) -> None:
        for label, work in works.items():
            self._start(label, work)
        deadline = time.monotonic() + 30
        while self.commits.queued < len(works):
            assert time.monotonic() < deadline, f"{self.commits.queued} queued"
            time.sleep(0.01)

    def release(self) -> None:
        self._gate.set()
        for t in self._threads:
            t.join(30)
            assert not t.is_alive()


def test_submissions_queued_together_share_one_commit_each_acknowledged_after_it(store):
    commits, before = Commits(store), store.commits
    batch = Batch(commits, store)
    batch.lead("leader")
    names = [f"s{i}" for i in range(20)]
    batch.queue({n: (lambda n=n: submit(store, n)) for n in names})
    assert committed(store) == {}  # nothing acknowledged yet, nothing on disk
    batch.release()
    assert store.commits - before == 2  # 21 submissions, two transactions
    for label, rec in batch.results.items():
        assert rec.name == label
        assert batch.seen[label][label] == rec.id  # on disk when its caller was told
    assert len({r.id for r in batch.results.values()}) == 21


def test_one_submissions_failure_leaves_the_others_of_its_batch_committed(store):
    used = submit(store, "used", key="k1")
    seen = []
    store.on_commit = lambda written: seen.extend(e.task_id for e, _ in written)
    commits, before = Commits(store), store.commits
    batch = Batch(commits, store)
    batch.lead("leader")

    def half_then_conflict():  # a file of two tasks whose second is refused: neither stays
        submit(store, "half")
        return submit(store, "again", key="k1")

    def bug():
        submit(store, "buggy")
        raise RuntimeError("a bad row")

    batch.queue(
        {
            "a": lambda: submit(store, "a"),
            "conflict": half_then_conflict,
            "bug": bug,
            "bad": lambda: submit(store, ""),  # refused by the store's checks
            "b": lambda: submit(store, "b"),
        }
    )
    batch.release()
    assert store.commits - before == 2
    assert isinstance(batch.results["conflict"], Conflict)
    assert isinstance(batch.results["bug"], RuntimeError)
    assert isinstance(batch.results["bad"], StoreError)
    on_disk = committed(store)
    assert set(on_disk) == {"used", "leader", "a", "b"}
    assert used.id == on_disk["used"]
    # the observers hear of what was committed only: not of the undone submissions
    assert sorted(seen) == sorted(on_disk[n] for n in ("leader", "a", "b"))


def test_the_same_key_twice_in_one_batch_gives_the_second_the_first_task(store):
    commits = Commits(store)
    batch = Batch(commits, store)
    batch.lead("leader")
    batch.queue({k: (lambda: submit(store, "same", key="retry")) for k in ("first", "second")})
    batch.release()
    assert batch.results["first"].id == batch.results["second"].id
    assert list(committed(store)).count("same") == 1


def test_a_work_under_which_sqlite_ends_the_transaction_fails_alone(store):
    # RAISE(ROLLBACK) ends the whole transaction, as SQLITE_FULL may: the works before it
    # in the batch are run again in a new one, the ones after it run there too
    add_sql(
        store,
        "CREATE TRIGGER ender BEFORE INSERT ON tasks WHEN NEW.name = 'ender' "
        "BEGIN SELECT RAISE(ROLLBACK, 'ended by the test'); END;",
    )
    before = store.commits
    out = store.commit_each([lambda n=n: submit(store, n) for n in ("a", "ender", "b")])
    assert isinstance(out[1], StoreError) and "ended by the test" in str(out[1])
    assert [r.name for r in (out[0], out[2])] == ["a", "b"]
    assert store.commits - before == 1  # the second try; the first was rolled back
    assert set(committed(store)) == {"a", "b"}
    assert submit(store, "after").name == "after"  # the store goes on


def test_a_failed_commit_fails_every_submission_of_its_batch(store):
    # a deferred foreign key is checked at COMMIT: one submission makes the commit fail
    add_sql(
        store,
        "CREATE TABLE gate (task TEXT REFERENCES tasks(id) DEFERRABLE INITIALLY DEFERRED);"
        "CREATE TRIGGER poison AFTER INSERT ON tasks WHEN NEW.name = 'poison' "
        "BEGIN INSERT INTO gate VALUES ('no such task'); END;",
    )
    commits, before = Commits(store), store.commits
    batch = Batch(commits, store)
    batch.lead("leader")
    batch.queue({n: (lambda n=n: submit(store, n)) for n in ("a", "poison", "b")})
    batch.release()
    assert batch.results["leader"].name == "leader"  # its own batch, committed before
    for n in ("a", "poison", "b"):
        assert isinstance(batch.results[n], StoreError), batch.results[n]
        assert "FOREIGN KEY" in str(batch.results[n])
    assert set(committed(store)) == {"leader"}
    assert store.commits - before == 1
    assert submit(store, "after").name == "after"


def test_a_batch_is_capped_by_count_and_by_size(store):
    commits = Commits(store, max_batch=3, max_bytes=10**6)
    batch = Batch(commits, store)
    batch.lead("leader")
    batch.queue({n: (lambda n=n: submit(store, n)) for n in ("a", "b", "c")})
    # a fourth waits for room: it is not queued while the next batch is full
    late = threading.Thread(target=batch._call, args=("d", lambda: submit(store, "d")))
    late.start()
    time.sleep(0.2)
    assert commits.queued == 3
    before = store.commits
    batch.release()
    late.join(30)
    assert store.commits - before == 3  # leader, then a-c, then d
    assert set(committed(store)) == {"leader", "a", "b", "c", "d"}


def test_commit_each_inside_atomic_is_refused(store):
    with store.atomic():
        with pytest.raises(StoreError, match="inside atomic"):
            store.commit_each([lambda: submit(store, "a")])
    assert committed(store) == {}


def test_many_concurrent_submitters_each_see_their_task_on_disk_when_told(store):
    commits = Commits(store)
    told: dict[str, str] = {}
    missing: list[str] = []

    def submitter(k: int) -> None:
        with sqlite3.connect(store.path) as c:
            for i in range(25):
                rec = commits.run(lambda n=f"c{k}-{i}": submit(store, n))
                row = c.execute("SELECT name FROM tasks WHERE id = ?", (rec.id,)).fetchone()
                if row != (rec.name,):
                    missing.append(rec.id)
                told[rec.name] = rec.id

    threads = [threading.Thread(target=submitter, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert missing == [] and len(told) == 200 and len(set(told.values())) == 200
    assert committed(store) == told
