"""The worker pool under a full cgroup2 tree: two pools, one per class, whose subtrees
carry cpu.weight 400 and 100, each with its one worker pinned to the same CPU and kept
busy; the kernel splits that CPU between them 4:1 (within 20%), read from cpu.stat."""

import time
import uuid

import pytest

from xhagent.cgroups import Cgroup
from xhagent.cgroups.subtree import locate
from xhagent.runtime.pool import Pool

pytestmark = pytest.mark.kernel
RUN_S = 4.0


def burn(seconds):
    """Pure-Python work until `seconds` of wall time pass: what it got is what the kernel
    gave its worker."""
    end = time.monotonic() + seconds
    n = 0
    while time.monotonic() < end:
        n += 1
    return n


def usage_us(group: Cgroup) -> int:
    stat = dict(line.split() for line in group.read("cpu.stat").splitlines())
    return int(stat["usage_usec"])


def test_two_classes_share_one_cpu_by_their_cpu_weight(cpu_root):
    tag = uuid.uuid4().hex[:8]
    names = {"latency": f"xh-pool-latency-{tag}", "batch": f"xh-pool-batch-{tag}"}
    weights = {"latency": 400, "batch": 100}
    pools = {}
    try:
        for cls, name in names.items():
            pools[cls] = Pool([0], subtree=name, preempt="off")
            Cgroup(locate(name).path).write("cpu.weight", str(weights[cls]))
        groups = {cls: Cgroup(locate(name).path) for cls, name in names.items()}
        # each worker imports this module (by reference) at its first task: slow under
        # emulation, and not what is measured
        assert all(pool.submit(burn, 0).result(300) >= 0 for pool in pools.values())
        before = {cls: usage_us(g) for cls, g in groups.items()}
        futures = {cls: pool.submit(burn, RUN_S) for cls, pool in pools.items()}
        loops = {cls: f.result(120) for cls, f in futures.items()}
        used = {cls: usage_us(g) - before[cls] for cls, g in groups.items()}
    finally:
        for pool in pools.values():
            pool.close()
        for name in names.values():
            path = locate(name).path
            if path.exists():  # the pools removed their own groups
                Cgroup(path).remove(kill_first=True)
    ratio = used["latency"] / used["batch"]
    print(f"cpu.stat usage: {used}, ratio {ratio:.2f}; loops {loops}")
    assert 4 * 0.8 <= ratio <= 4 * 1.2, used
    # the work done leans the same way (by more: the smaller share runs in colder caches)
    assert loops["latency"] > 2 * loops["batch"], loops
