"""`bench cgroup-io`'s readers on this host: each starts inside its own group (no
start-then-move), and they read for real. The io controller itself is the guest's."""

import os
from pathlib import Path

import pytest

from xhagent.cgroups import Cgroup
from xhagent.cgroups import bench as cgroup_bench
from xhagent.cgroups.mounts import discover_hierarchy

pytestmark = pytest.mark.host

# Before its "go", a reader notes the group it is in at that moment, under dev.<pid>.
WHERE = (
    "import os, sys\nwhere = [l for l in open('/proc/self/cgroup') if l.startswith('0::')][0]\n"
    "open(sys.argv[1] + '.' + str(os.getpid()), 'w').write(where)\nsys.stdin.readline()\n"
    "print(0, 0)\n"
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
