"""Cgroup.spawn on Debian's 6.1 guest kernel with every controller: clone3 into a group is
available there, the child is charged to its group from the start (memory.max OOM-kills it
inside), and the no-internal-processes rule comes back as a clear EBUSY, by both ways."""

import errno
import sys

import pytest

from xhagent.cgroups import Cgroup, CgroupError, spawn_method

pytestmark = pytest.mark.kernel
METHODS = ["clone3", "fork"]


def test_the_guest_kernel_takes_clone3_into_cgroup():
    assert spawn_method() == "clone3"


@pytest.mark.parametrize("method", METHODS)
def test_memory_max_holds_the_child_from_its_start(memory_root, cgroup, method):
    cg = Cgroup(cgroup)
    cg.write("memory.max", str(32 << 20))
    cg.write("memory.swap.max", "0")
    child = cg.spawn(
        [sys.executable, "-c", "b = bytearray(256 << 20); b[::4096] = b'x' * len(b[::4096])"],
        method=method,
    )
    assert child.wait(timeout=120) == -9
    assert dict(line.split() for line in cg.read("memory.events").splitlines())["oom_kill"] != "0"


@pytest.mark.parametrize("method", METHODS)
def test_a_group_with_domain_controllers_for_its_children_refuses_a_process(
    memory_root, cgroup, method
):
    cg = Cgroup(cgroup)
    cg.write("cgroup.subtree_control", "+memory")
    try:
        with pytest.raises(CgroupError) as info:
            cg.spawn(["true"], method=method)
        assert info.value.errno == errno.EBUSY and str(cgroup) in str(info.value), str(info.value)
        assert "[Errno" not in str(info.value)
        assert cg.procs() == [] and cg.events()["populated"] == 0
    finally:
        cg.write("cgroup.subtree_control", "-memory")
