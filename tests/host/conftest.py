import os

import pytest

from xhagent.cgroups import Cgroup
from xhagent.cgroups.mounts import discover_hierarchy


def pytest_collection_modifyitems(config, items):
    # Host tests drive this kernel for real (cgroup writes, BPF, polled I/O): root only.
    if os.geteuid() != 0:
        skip = pytest.mark.skip(reason="host tests need root (cgroup writes, BPF loading)")
        for item in items:
            if "host" in item.keywords:
                item.add_marker(skip)


@pytest.fixture
def group():
    """A fresh group in this host's cgroup2 tree; thawed, emptied and removed afterwards."""
    root = discover_hierarchy().unified
    assert root is not None, "this host has a cgroup2 mount"
    cg = Cgroup(os.path.join(root.path, f"xhagent-test-{os.getpid()}")).create()
    yield cg
    if cg.path.exists():
        cg.write("cgroup.freeze", "0")  # never left frozen, whatever a test did
        if cg.events()["populated"]:
            cg.kill()
        cg.remove()
