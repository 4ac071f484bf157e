"""The shim on a full disk: the task directory on a small tmpfs the test mounts. The space of
its records is secured before the workload starts, so a workload that fills the disk still
has its end recorded (and what it lost counted); with --keep-free the output stops short of
the last bytes of the disk; a shim that finds no space starts nothing and says so (ENOSPC),
leaving no half-made record behind."""

import errno
import os
import time

import pytest
from disks import small_tmpfs, use_up_blocks

from xhagent.daemon.exec.shim import RECORD_SIZE, ShimError, read_status, start_shim

pytestmark = pytest.mark.host
ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin", "LC_ALL": "C"}


@pytest.fixture
def small(tmp_path):
    """A 1 MiB tmpfs, unmounted afterwards."""
    with small_tmpfs(tmp_path / "small", "size=1m") as mnt:
        yield mnt


def test_the_exit_record_is_reserved_before_the_workload_and_survives_a_full_disk(small, leaves):
    task_dir = small / "run"
    task_dir.mkdir()
    # the workload looks at the reservation, then fills the disk and exits 0
    script = "stat -c %s exit.tmp > /dev/stderr; head -c 2000000 /dev/zero; exit 0"
    started = start_shim(task_dir, *leaves, ["sh", "-c", script], ENV, cwd=task_dir)
    deadline = time.monotonic() + 10
    while (end := read_status(task_dir).exit) is None:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert started.process.wait(5) == 0
    assert (end.exit_code, end.error) == (0, None)
    assert (task_dir / "stderr").read_text().split() == [str(RECORD_SIZE)]
    kept = (task_dir / "stdout").stat().st_size
    assert end.stdout_dropped == 2_000_000 - kept > 0 and end.output_errno == errno.ENOSPC
    # the time marks of a stream are there as far as the disk let them be: whole marks
    names = sorted(p.name for p in task_dir.iterdir())
    assert [n for n in names if not n.endswith(".times")] == [
        "exit", "shim.log", "started", "stderr", "stdout"
    ]  # fmt: skip
    assert all((task_dir / n).stat().st_size % 16 == 0 for n in names if n.endswith(".times"))
    assert (task_dir / "exit").read_bytes().endswith(b"}\n")  # cut to the record's length


def test_output_leaves_the_last_keep_free_bytes_of_the_disk(small, leaves):
    task_dir = small / "run"
    task_dir.mkdir()
    keep = 256 << 10
    started = start_shim(
        task_dir, *leaves, ["sh", "-c", "head -c 2000000 /dev/zero"], ENV, keep_free=keep
    )
    assert started.process.wait(10) == 0
    end = read_status(task_dir).exit
    st = os.statvfs(small)
    assert st.f_bavail * st.f_frsize >= keep  # the floor held: the rest is the agent's
    kept = (task_dir / "stdout").stat().st_size
    assert end.exit_code == 0 and end.output_errno == errno.ENOSPC
    assert end.stdout_dropped == 2_000_000 - kept and kept > 512 << 10
    assert (
        "the last 262144 bytes of the disk are the agent's" in (task_dir / "shim.log").read_text()
    )


def test_no_space_for_the_records_starts_nothing_and_names_enospc(small, leaves):
    use_up_blocks(small / "filler")
    task_dir = small / "run"
    task_dir.mkdir()
    marker = small.parent / "ran"
    with pytest.raises(ShimError) as got:
        start_shim(task_dir, *leaves, ["touch", str(marker)], ENV)
    assert got.value.errno == errno.ENOSPC
    assert str(got.value) == f"no space left on device (ENOSPC): {task_dir}"
    assert not marker.exists()
    left = sorted(p.name for p in task_dir.iterdir())
    assert not [n for n in left if n.endswith(".tmp")], left
    assert not leaves[0].events()["populated"]
    os.unlink(small / "filler")
