"""The state store on a real, small tmpfs that fills up: submissions are refused with a clear
error, nothing acknowledged is lost, and the store works again once there is space."""

import subprocess

import pytest

from xhagent.daemon.store import Store, StoreFull, TaskState, TaskSummary

pytestmark = pytest.mark.host


@pytest.fixture
def small_tmpfs(tmp_path):
    d = tmp_path / "tmpfs"
    d.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k,mode=0700", "tmpfs", d], check=True)
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", d], check=False)


def submit(store, i):
    return store.submit(
        name=f"j{i}",
        kind="cpu",
        source=f"kind: Task\nmetadata: {{name: j{i}}}\n# {'x' * 2000}\n",
        source_file=f"j{i}.yaml",
        summary=TaskSummary(document=0, task_class="batch", priority=i),
        idempotency_key=f"k{i}",
    )


def test_a_full_state_dir_refuses_submissions_and_recovers(small_tmpfs):
    state = small_tmpfs / "state"
    store = Store.open(state)
    try:
        acked = []
        with pytest.raises(StoreFull) as err:
            for i in range(10_000):
                acked.append(submit(store, i).id)
        full_at = len(acked)
        assert full_at > 20  # the WAL is checkpointed often enough to leave room for data
        msg = str(err.value)
        assert msg.startswith(f"{state} is full: submitting task j{full_at} was refused")
        assert "nothing recorded before is lost" in msg and "\n" not in msg
        # Still usable while full: what was acknowledged reads back, the refused one is absent.
        assert [t.id for t in store.list_tasks(limit=1000)] == acked
        assert store.get(acked[-1]).state is TaskState.PENDING
        assert all(t.idempotency_key != f"k{full_at}" for t in store.list_tasks(limit=1000))
        last = store.events(store.last_event_seq() - 1)
        assert [(e.kind, e.task_id) for e in last] == [("Submitted", acked[-1])]
        with pytest.raises(StoreFull):
            submit(store, full_at)

        subprocess.run(["mount", "-o", "remount,size=8m", small_tmpfs], check=True)
        again = submit(store, full_at)
        assert again.id not in acked and store.get(again.id) == again
        store.transition(acked[0], TaskState.CANCELLED)
    finally:
        store.close()
    with Store.open(state) as store:  # and all of it survives a reopen
        tasks = store.list_tasks(limit=1000)
        assert [t.id for t in tasks] == [*acked, again.id]
        assert tasks[0].state is TaskState.CANCELLED
