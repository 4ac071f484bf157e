"""`bench cgroup-io`'s readers on this host: each starts inside its own group (no
start-then-move), and they read for real. The io controller itself is the guest's."""

import os
from pathlib import Path

import pytest

from xhagent.bench import cgroup_io as cgroup_bench
from xhagent.cgroups import Cgroup
from xhagent.cgroups.mounts import discover_hierarchy

pytestmark = pytest.mark.host

# Before its "go", a reader notes the group it is in at that moment, under dev.<pid>.
WHERE = (
    "import os, sys\nwhere = [l for l in open('/proc/self/cgroup') if l.startswith('0::')][0]\n"
    "open(sys.argv[1] + '.' + str(os.getpid()), 'w').write(where)\nprint('ready', flush=True)\n"
    "sys.stdin.readline()\nprint(0, 0, -1.0)\n"
)


@pytest.fixture
def groups():
    root = Path(discover_hierarchy().unified.path)
    made = [Cgroup(root / f"xhagent-bench-test-{os.getpid()}-{i}").create() for i in range(2)]
    yield made
    for cg in made:
        if cg.path.exists():
            cg.remove(kill_first=True)


def test_each_reader_is_in_its_group_before_it_is_told_to_go(groups, tmp_path, monkeypatch):
    monkeypatch.setattr(cgroup_bench, "READER", WHERE)
    base = tmp_path / "notes"
    assert cgroup_bench._readers(groups, str(base), 4096, 512, 1, 1.0) == [(0, 0), (0, 0)]
    seen = sorted(p.read_text().strip() for p in tmp_path.glob("notes.*"))
    unified = discover_hierarchy().unified.path
    assert seen == sorted(f"0::/{cg.path.relative_to(unified)}" for cg in groups)
    assert all(cg.events()["populated"] == 0 for cg in groups)


def test_readers_read_o_direct_and_a_failing_one_is_reported(groups, monkeypatch):
    data = Path("/var/tmp") / f"xhagent-bench-test-{os.getpid()}"
    data.write_bytes(os.urandom(1 << 20))
    try:
        done = cgroup_bench._readers(groups, str(data), 1 << 20, 4096, 8, 0.5)
        assert len(done) == 2 and all(ops > 0 and nbytes == ops * 4096 for ops, nbytes in done)
        monkeypatch.setattr(cgroup_bench, "READER", "import sys; sys.exit(3)")  # gone before its go
        with pytest.raises(RuntimeError, match=r"a reader failed: exit statuses \[3, 3\]"):
            cgroup_bench._readers(groups, str(data), 1 << 20, 4096, 1, 0.5)
    finally:
        data.unlink()
    assert all(cg.events()["populated"] == 0 for cg in groups)


def test_a_reader_that_began_after_the_window_opened_fails_the_run(groups, tmp_path, monkeypatch):
    """Its count would include time the others read alone: the run is refused, not reported."""
    late = "import sys\nprint('ready', flush=True)\nsys.stdin.readline()\nprint(5, 20480, 0.25)\n"
    monkeypatch.setattr(cgroup_bench, "READER", late)
    with pytest.raises(RuntimeError, match=r"began 250 ms after the measured window opened"):
        cgroup_bench._readers(groups, str(tmp_path / "dev"), 4096, 512, 1, 0.5)
    assert all(cg.events()["populated"] == 0 for cg in groups)
